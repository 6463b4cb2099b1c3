//! The shell completions and the manual pages (`eim completions`, `eim
//! man`): generated from the command line's definition, checked against
//! what `eim --help` lists and by the tools that read them (bash, groff).

use std::path::Path;
use std::process::Command as Process;

use assert_cmd::Command;
use eim_test_support::skip;

fn eim() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_eim"));
    cmd.env_remove("RUST_LOG");
    cmd
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.assert().success().get_output().stdout.clone();
    String::from_utf8(out).expect("UTF-8 output")
}

/// The commands `eim --help` lists (its "Commands:" section), clap's own
/// `help` left out: the list the generated files must match, read from
/// another of clap's renderers than the ones under test.
fn commands() -> Vec<String> {
    let help = stdout_of(eim().arg("--help"));
    let section = help
        .split("Commands:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no Commands: section in\n{help}"));
    let names: Vec<String> = section
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_owned)
        .collect();
    // A parse that found almost nothing would make the checks below empty.
    assert!(
        names.len() >= 10 && names.iter().any(|n| n == "watch"),
        "{names:?}"
    );
    names
}

/// What bash's completion function of `script` offers for the words
/// `line` (the last one being completed), called as bash's `complete -F`
/// calls it: the command, the word being completed, the word before it.
fn bash_complete(script: &Path, line: &[&str]) -> Vec<String> {
    let words = line
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let program = format!(
        "source '{}'\nCOMP_WORDS=({words})\nCOMP_CWORD={}\nCOMP_LINE='{}'\nCOMP_POINT=${{#COMP_LINE}}\n_eim eim \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script.display(),
        line.len() - 1,
        line.join(" "),
    );
    let out = Process::new("bash")
        .args(["--noprofile", "--norc", "-c", &program])
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "bash: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completion_parses_and_completes_every_command_and_option() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("eim.bash");
    std::fs::write(&script, stdout_of(eim().args(["completions", "bash"]))).expect("write");
    let syntax = Process::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("running bash -n");
    assert!(
        syntax.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    let offered = bash_complete(&script, &["eim", ""]);
    for command in commands() {
        assert!(
            offered.contains(&command),
            "`eim <TAB>` does not offer {command}: {offered:?}"
        );
    }
    // Options of a command, and the values of an enum option.
    let options = bash_complete(&script, &["eim", "watch", "--"]);
    for option in ["--backend", "--pin-dir", "--metrics-addr", "--interval"] {
        assert!(options.iter().any(|o| o == option), "{option}: {options:?}");
    }
    assert!(
        options.iter().all(|o| o.starts_with("--")),
        "`--<TAB>` offers only long options: {options:?}"
    );
    let backends = bash_complete(&script, &["eim", "watch", "--backend", ""]);
    assert_eq!(backends, ["sim", "kernel"]);
}

#[test]
fn every_shell_gets_a_script_naming_every_command() {
    let commands = commands();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout_of(eim().args(["completions", shell]));
        for command in &commands {
            assert!(
                script.contains(command.as_str()),
                "{shell}: no {command} in the script"
            );
        }
    }
    eim()
        .args(["completions", "tcsh"])
        .assert()
        .failure()
        .stderr(predicates::str::contains("invalid value 'tcsh'"));
}

#[test]
fn the_manual_page_heads_itself_and_lists_every_command() {
    let page = stdout_of(eim().arg("man"));
    assert!(
        page.lines().any(|l| l.starts_with(".TH EIM 1 ")),
        "no .TH EIM 1 line:\n{page}"
    );
    let commands_section = page
        .split(".SH SUBCOMMANDS\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no SUBCOMMANDS section:\n{page}"));
    for command in commands() {
        // roff escapes `-` in names: `eim\-scan`.
        assert!(
            commands_section.contains(&format!("eim\\-{command}")),
            "the page does not list {command}"
        );
    }
}

#[test]
fn man_out_writes_one_page_per_command_and_groff_renders_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("man1");
    let listed = stdout_of(eim().arg("man").arg("--out").arg(&out));
    let mut expected = vec![out.join("eim.1")];
    expected.extend(commands().iter().map(|c| out.join(format!("eim-{c}.1"))));
    let written: Vec<_> = listed.lines().map(std::path::PathBuf::from).collect();
    assert_eq!(written, expected);
    let mut on_disk: Vec<_> = std::fs::read_dir(&out)
        .expect("read the directory")
        .map(|e| e.expect("entry").path())
        .collect();
    on_disk.sort();
    let mut sorted = expected.clone();
    sorted.sort();
    assert_eq!(on_disk, sorted, "nothing more, nothing less on disk");
    for command in commands() {
        let page = std::fs::read_to_string(out.join(format!("eim-{command}.1"))).expect("read");
        let head = format!(".TH EIM-{} 1 ", command.to_uppercase());
        assert!(page.contains(&head), "eim-{command}.1: no {head}");
    }

    if !skip::tools_present(&["groff"]) {
        return;
    }
    for path in &expected {
        // -ww: every warning (a page groff complains about is broken);
        // -P-cbu: plain text, no overstrike for bold and underline.
        let rendered = Process::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-P-cbu"])
            .arg(path)
            .output()
            .expect("running groff");
        let stderr = String::from_utf8_lossy(&rendered.stderr);
        assert!(
            rendered.status.success() && stderr.trim().is_empty(),
            "groff on {}: {stderr}",
            path.display()
        );
        let text = String::from_utf8_lossy(&rendered.stdout);
        assert!(
            text.contains("NAME") && text.contains("SYNOPSIS"),
            "{}: rendered without its sections:\n{text}",
            path.display()
        );
    }
}
