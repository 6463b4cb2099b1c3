use std::os::unix::fs::symlink;

use super::*;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("path")
}

/// Gives a link to `nobody`, as if that user had planted it (as root;
/// a link a non-root test makes is its user's already).
fn plant_as_nobody(link: &Path) {
    if is_root() {
        // SAFETY: a valid path; the result is checked.
        assert_eq!(unsafe { libc::lchown(c(link).as_ptr(), 65534, 65534) }, 0);
    }
}

fn mkfifo(path: &Path) {
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c(path).as_ptr(), 0o600) }, 0);
}

/// Both ways a root resolves: `openat2` where the kernel has it, and the
/// component walk of kernels without.
fn both(root: &Root, inner: &str) -> [Result<Located, OpenerError>; 2] {
    [
        root.locate(Path::new(inner)),
        root.locate_by_walk(Path::new(inner)),
    ]
}

/// An inotify descriptor watching `path` for `IN_OPEN`.
struct OpenWatch(OwnedFd);

impl OpenWatch {
    fn new(path: &Path) -> Self {
        // SAFETY: plain syscalls; results checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a valid descriptor and path.
        let wd =
            unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c(path).as_ptr(), libc::IN_OPEN) };
        assert!(wd >= 0, "{}", io::Error::last_os_error());
        Self(fd)
    }

    fn opened(&self) -> bool {
        let mut buf = [0u8; 4096];
        // SAFETY: a valid descriptor and buffer.
        let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        n > 0
    }
}

#[test]
fn a_regular_file_opens_and_is_the_file_located() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("usr/lib")).expect("mkdir");
    let file = dir.path().join("usr/lib/libx.so");
    std::fs::write(&file, b"contents").expect("write");
    let on_disk = std::fs::metadata(&file).expect("stat");
    let root = Root::open(dir.path()).expect("root");
    for (how, located) in both(&root, "/usr/lib/libx.so").into_iter().enumerate() {
        let located = located.unwrap_or_else(|e| panic!("way {how}: {e}"));
        assert_eq!(located.metadata().ino(), on_disk.ino());
        let (f, meta) = located.open().expect("opens");
        assert_eq!((meta.dev(), meta.ino()), (on_disk.dev(), on_disk.ino()));
        let mut buf = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 0).expect("read");
        assert_eq!(&buf, b"contents");
    }
    let (_, meta) = locate(&file)
        .expect("as the operator's")
        .open()
        .expect("opens");
    assert_eq!(meta.ino(), on_disk.ino());
}

#[test]
fn fifos_devices_and_directories_are_refused_without_being_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let watch = OpenWatch::new(&fifo);
    let root = Root::open(dir.path()).expect("root");
    for e in both(&root, "fifo") {
        let e = e.expect_err("a FIFO");
        assert!(
            matches!(e, OpenerError::NotRegular { kind: "a FIFO", .. }),
            "{e}"
        );
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
    let e = locate(&fifo).expect_err("a FIFO, as the operator's");
    assert_eq!(e.reason(), "not a regular file: a FIFO");
    assert!(!watch.opened(), "the FIFO was opened");
    for e in both(&root, "/") {
        assert_eq!(
            e.expect_err("the root").reason(),
            "not a regular file: a directory"
        );
    }
    let e = locate(Path::new("/dev/zero")).expect_err("a device");
    assert_eq!(e.reason(), "not a regular file: a character device");
    if is_root() {
        // A copy of /dev/null: its open would be seen.
        let dev = dir.path().join("null");
        // SAFETY: a valid path; the result is checked.
        let made =
            unsafe { libc::mknod(c(&dev).as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
        assert_eq!(made, 0, "{}", io::Error::last_os_error());
        let watch = OpenWatch::new(&dev);
        for e in both(&root, "null") {
            assert_eq!(
                e.expect_err("a device").reason(),
                "not a regular file: a character device"
            );
        }
        assert!(!watch.opened(), "the device was opened");
    } else {
        eim_test_support::skip::skip_unless_required(
            "EIM_REQUIRE_BPF",
            "mknod of a device node needs root",
        );
    }
}

#[test]
fn dot_dot_and_absolute_links_stay_inside_the_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), b"outside").expect("write");
    let inside = dir.path().join("root");
    std::fs::create_dir_all(inside.join("a/b")).expect("mkdir");
    let root = Root::open(&inside).expect("root");
    for e in both(&root, "../secret") {
        assert!(e.expect_err("above the root").is_not_found());
    }
    for e in both(&root, "/a/b/../../../../secret") {
        assert!(e.expect_err("above the root").is_not_found());
    }
    std::fs::write(inside.join("secret"), b"inside").expect("write");
    for located in both(&root, "/a/b/../../../../secret") {
        let (_, meta) = located.expect("the root's own").open().expect("opens");
        assert_eq!(meta.len(), 6, "the file inside the root");
    }
    if is_root() {
        // Root's links, absolute and relative, resolve inside the root too.
        symlink("/secret", inside.join("a/abs")).expect("link");
        symlink("../../../../secret", inside.join("a/b/rel")).expect("link");
        for inner in ["/a/abs", "/a/b/rel"] {
            for located in both(&root, inner) {
                let (_, meta) = located.expect(inner).open().expect("opens");
                assert_eq!(meta.len(), 6, "{inner}: the file inside the root");
            }
        }
    } else {
        eim_test_support::skip::skip_unless_required(
            "EIM_REQUIRE_BPF",
            "root-owned links need root",
        );
    }
}

#[test]
fn a_link_a_user_planted_is_never_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("target");
    std::fs::write(&target, b"root's").expect("write");
    let inside = dir.path().join("root");
    std::fs::create_dir_all(inside.join("home/user/real")).expect("mkdir");
    std::fs::write(inside.join("home/user/real/f"), b"x").expect("write");
    // In the middle of the path, and at its end.
    let middle = inside.join("home/user/dir");
    symlink("real", &middle).expect("link");
    plant_as_nobody(&middle);
    let last = inside.join("home/user/shadowlink");
    symlink(&target, &last).expect("link");
    plant_as_nobody(&last);
    let watch = OpenWatch::new(&target);
    let root = Root::open(&inside).expect("root");
    for inner in ["/home/user/dir/f", "/home/user/shadowlink"] {
        for e in both(&root, inner) {
            let e = e.expect_err(inner);
            assert!(
                matches!(e, OpenerError::UntrustedLink { .. }),
                "{inner}: {e}"
            );
            assert!(
                e.to_string().contains("only root's links are followed"),
                "{e}"
            );
        }
    }
    assert!(!watch.opened(), "the link's target was opened");
    // The same link followed for the operator, who is trusted.
    locate(&last)
        .expect("the operator's path")
        .open()
        .expect("opens");
    if is_root() {
        // Root's own link in the middle is followed.
        let ok = inside.join("home/user/roots");
        symlink("real", &ok).expect("link");
        for located in both(&root, "/home/user/roots/f") {
            located.expect("root's link").open().expect("opens");
        }
    }
}

#[test]
fn magic_links_of_proc_are_refused() {
    let root = Root::open(Path::new("/")).expect("root");
    let me = std::process::id();
    for inner in [
        "/proc/self/exe".to_string(),
        format!("/proc/{me}/exe"),
        format!("/proc/{me}/root/etc/hostname"),
        format!("/proc/{me}/cwd/Cargo.toml"),
    ] {
        for (how, e) in both(&root, &inner).into_iter().enumerate() {
            let e = e.expect_err(&inner);
            assert!(
                matches!(e, OpenerError::MagicLink { .. }),
                "way {how}, {inner}: {e}"
            );
        }
    }
    // The kernel's link itself, as eim's own path, is followed.
    locate(Path::new("/proc/self/exe"))
        .expect("eim's own path")
        .open()
        .expect("opens");
}

#[test]
fn link_loops_end() {
    if !is_root() {
        eim_test_support::skip::skip_unless_required(
            "EIM_REQUIRE_BPF",
            "link_loops_end: root-owned links need root",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    symlink("b", dir.path().join("a")).expect("link");
    symlink("a", dir.path().join("b")).expect("link");
    let root = Root::open(dir.path()).expect("root");
    for e in both(&root, "a") {
        assert!(matches!(e, Err(OpenerError::TooManyLinks { .. })), "{e:?}");
    }
}
