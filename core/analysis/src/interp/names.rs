//! The file-name patterns of spec 8.2 (SEED). They are RE2 patterns and
//! searches (unanchored unless written with `^`/`$`), so they are compiled
//! with the `regex` crate, whose syntax and leftmost-first semantics are
//! RE2's. Go's `\d` and `\w` are ASCII-only, so they are written here as
//! explicit ASCII classes.

use std::sync::LazyLock;

use regex::Regex;

fn compile(pattern: &str) -> Regex {
    // The patterns are constants checked by the tests below.
    Regex::new(pattern).unwrap_or_else(|e| unreachable!("pattern {pattern}: {e}"))
}

pub(crate) static PERL_LIB: LazyLock<Regex> =
    LazyLock::new(|| compile(r"^(?:.*/)?libperl\.so[^/]*$"));
pub(crate) static PERL_EXE: LazyLock<Regex> = LazyLock::new(|| compile(r"^(?:.*/)?perl$"));
pub(crate) static PYTHON_LIB: LazyLock<Regex> =
    LazyLock::new(|| compile(r"^(?:.*/)?libpython([0-9])\.([0-9]+)[^/]*"));
pub(crate) static PYTHON_EXE: LazyLock<Regex> =
    LazyLock::new(|| compile(r"^(?:.*/)?python([0-9])\.([0-9]+)(d|m|dm)?$"));
pub(crate) static PHP: LazyLock<Regex> = LazyLock::new(|| {
    compile(r".*/php(-cgi|-fpm)?[0-9.]*$|^php(-cgi|-fpm)?[0-9.]*$|.*/libphp.*\.so$")
});
pub(crate) static OPCACHE: LazyLock<Regex> = LazyLock::new(|| compile(r"^(?:.*/)?opcache\.so$"));
pub(crate) static HOTSPOT: LazyLock<Regex> = LazyLock::new(|| compile(r".*/libjvm\.so"));
pub(crate) static RUBY: LazyLock<Regex> =
    LazyLock::new(|| compile(r"^(?:.*/)?libruby(?:-.*)?\.so\.([0-9])\.([0-9])\.([0-9])$"));
pub(crate) static V8: LazyLock<Regex> = LazyLock::new(|| {
    compile(r"^(?:.*/)?(?:node|nsolid)([0-9]+)?$|^(?:.*/)libnode\.so(\.[0-9]+)?$")
});
pub(crate) static DOTNET: LazyLock<Regex> =
    LazyLock::new(|| compile(r"/([0-9]+)\.([0-9]+).([0-9]+)/libcoreclr.so$"));
pub(crate) static APM: LazyLock<Regex> =
    LazyLock::new(|| compile(r".*/elastic-jvmti-linux-([0-9A-Za-z_-]*)\.so"));

#[cfg(test)]
mod tests {
    use super::*;

    fn check(re: &Regex, yes: &[&str], no: &[&str]) {
        for name in yes {
            assert!(re.is_match(name), "{} should match {name}", re.as_str());
        }
        for name in no {
            assert!(
                !re.is_match(name),
                "{} should not match {name}",
                re.as_str()
            );
        }
    }

    #[test]
    fn php_names_of_upstreams_test() {
        check(
            &PHP,
            &[
                "php",
                "php-fpm",
                "php-cgi7",
                "php8.2",
                "/usr/bin/php8.2",
                "/usr/sbin/php-fpm8.2",
                "/usr/lib/apache2/modules/libphp8.1.so",
            ],
            &[
                "foophp",
                "php-bar",
                "/libphp.soap",
                "libphp-so",
                "/usr/bin/phpize",
                "/usr/bin/foophp",
            ],
        );
    }

    #[test]
    fn python_names() {
        check(
            &PYTHON_EXE,
            &[
                "python3.11",
                "/usr/bin/python3.11",
                "python3.6m",
                "python3.8dm",
            ],
            &[
                "python3",
                "/usr/bin/python",
                "python3.11-config",
                "mypython3.11",
                "python3.x",
            ],
        );
        check(
            &PYTHON_LIB,
            &[
                "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
                "libpython3.9.so",
                "/x/libpython3.12d.so",
            ],
            &["/usr/lib/libpython.so", "/usr/lib/notlibpython3.11.so"],
        );
        let caps = PYTHON_LIB
            .captures("/opt/libpython2.7/libpython3.11.so.1.0")
            .expect("matches");
        assert_eq!(
            (&caps[1], &caps[2]),
            ("3", "11"),
            "the last one, as RE2's greedy prefix"
        );
    }

    #[test]
    fn perl_ruby_v8_dotnet_hotspot_apm_opcache_names() {
        check(
            &PERL_LIB,
            &["/usr/lib/x86_64-linux-gnu/libperl.so.5.36.0", "libperl.so"],
            &["/usr/lib/libperl.so.5/x", "libperl.a"],
        );
        check(
            &PERL_EXE,
            &["/usr/bin/perl", "perl"],
            &["/usr/bin/perl5.36.0", "superperl"],
        );
        check(
            &RUBY,
            &[
                "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2",
                "libruby.so.2.7.1",
            ],
            &[
                "/usr/lib/libruby-3.1.so.3.1",
                "/usr/bin/ruby3.1",
                "libruby.so.3.10.1",
            ],
        );
        check(
            &V8,
            &[
                "/usr/bin/node",
                "node18",
                "/opt/nsolid",
                "/usr/lib/libnode.so.108",
                "/x/libnode.so",
            ],
            &[
                "nodejs",
                "/usr/bin/node-gyp",
                "libnode.so.108",
                "/x/libnode.so.1.2",
            ],
        );
        check(
            &DOTNET,
            &["/usr/share/dotnet/shared/Microsoft.NETCore.App/8.0.1/libcoreclr.so"],
            &["/usr/lib/libcoreclr.so", "/8.0/libcoreclr.so"],
        );
        check(
            &HOTSPOT,
            &["/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"],
            &["libjvm.so", "/usr/lib/libjvm.sa"],
        );
        check(
            &APM,
            &[
                "/tmp/elastic-jvmti-linux-x86_64.so",
                "/a/elastic-jvmti-linux-.so",
            ],
            &[
                "elastic-jvmti-linux-x86_64.so",
                "/a/elastic-jvmti-linux-x.y.so",
            ],
        );
        check(
            &OPCACHE,
            &["/usr/lib/php/20220829/opcache.so", "opcache.so"],
            &["/x/opcache.so.1"],
        );
    }
}
