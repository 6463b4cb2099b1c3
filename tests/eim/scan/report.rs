//! What the summary says of the files it did not load: files eim does not
//! extract (32-bit, big-endian, another machine, not ELF) are one
//! "unsupported" line per reason with a count, never failures; files
//! failing the same way are one line with a count. The files are made
//! here and mapped by a process that does nothing else.

use super::*;
use eim_test_support::elf::{Header, CLASS32, MSB};

/// A 64-byte ELF header (no sections unless `shnum` says so): enough
/// for eim to judge the file.
fn elf_header(header: Header) -> Vec<u8> {
    header.bytes().to_vec()
}

/// `head` padded to 4 KiB, ending in `tag` (so that every file has its
/// own file id, and files of one kind all have the same size).
fn page_file(head: &[u8], tag: &str) -> Vec<u8> {
    let mut bytes = head.to_vec();
    bytes.resize(4096 - tag.len(), 0);
    bytes.extend_from_slice(tag.as_bytes());
    bytes
}

/// A directory for the test's files where they may be mapped executable
/// (`/tmp` may be `noexec`): under the build's own temporary directory.
fn exec_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    dir
}

/// A python3 that maps `paths` read and execute (as a loader maps code)
/// and sleeps.
fn spawn_mapper(paths: &[PathBuf]) -> Running {
    let script = "import mmap, sys, time\n\
                  keep = []\n\
                  for p in sys.argv[1:]:\n\
                  \x20   with open(p, 'rb') as f:\n\
                  \x20       keep.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC))\n\
                  print('ready', flush=True)\n\
                  time.sleep(300)\n";
    spawn_python_script(script, paths, "python3 could not map the files")
}

const ELF32: &str = "a 32-bit ELF file: only 64-bit little-endian ELF files are supported";
const BIG_ENDIAN: &str = "a big-endian ELF file: only 64-bit little-endian ELF files are supported";
const RISCV: &str = "unsupported machine 0xf3: only x86-64 and arm64 ELF files are supported";
const NOT_ELF: &str = "not an ELF file";

/// The files of the test, by the reason each must be reported with.
struct Made {
    unsupported: BTreeMap<&'static str, Vec<PathBuf>>,
    /// 64-bit x86-64 files whose section header table ends past their end:
    /// real failures, all with the same reason.
    truncated: Vec<PathBuf>,
}

impl Made {
    fn all(&self) -> Vec<PathBuf> {
        self.unsupported
            .values()
            .flatten()
            .chain(&self.truncated)
            .cloned()
            .collect()
    }
}

fn make_files(dir: &Path) -> Made {
    let mut unsupported: BTreeMap<&'static str, Vec<PathBuf>> = BTreeMap::new();
    let write = |name: String, bytes: Vec<u8>| -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    let kinds: [(&'static str, usize, Vec<u8>); 4] = [
        // EM_386 and EM_ARM: what a 32-bit library of either is.
        (
            ELF32,
            17,
            elf_header(Header {
                class: CLASS32,
                machine: 3,
                ..Header::default()
            }),
        ),
        (
            BIG_ENDIAN,
            2,
            elf_header(Header {
                data: MSB,
                ..Header::default()
            }),
        ),
        // EM_RISCV.
        (
            RISCV,
            3,
            elf_header(Header {
                machine: 243,
                ..Header::default()
            }),
        ),
        (
            NOT_ELF,
            2,
            b"MZ\x90\x00 a PE file, as Wine or .NET map them".to_vec(),
        ),
    ];
    for (k, (reason, count, head)) in kinds.into_iter().enumerate() {
        for i in 0..count {
            let tag = format!("{reason}-{i}");
            let path = write(format!("u{k}-{i}.so"), page_file(&head, &tag));
            unsupported.entry(reason).or_default().push(path);
        }
    }
    // EM_X86_64; 9 section headers at offset 4000 end past the 4 KiB.
    let broken = elf_header(Header {
        shoff: 4000,
        shnum: 9,
        ..Header::default()
    });
    let truncated = (0..4)
        .map(|i| write(format!("t-{i}.so"), page_file(&broken, &format!("t{i}"))))
        .collect();
    Made {
        unsupported,
        truncated,
    }
}

fn paths_of(v: &Value) -> BTreeSet<PathBuf> {
    v.as_array()
        .expect("paths")
        .iter()
        .map(|p| PathBuf::from(p.as_str().expect("a path")))
        .collect()
}

#[test]
fn unsupported_files_are_one_line_per_reason_and_not_failures() {
    let dir = exec_dir("unsupported");
    let made = make_files(&dir);
    let mapper = spawn_mapper(&made.all());
    let pid = mapper.pid().to_string();
    let json: Value =
        serde_json::from_str(&run_ok(eim().args(["scan", "--json", "--pid", &pid]))).expect("JSON");
    let unsupported_count: usize = made.unsupported.values().map(Vec::len).sum();
    assert_eq!(
        json["files"]["unsupported"], unsupported_count,
        "{}",
        json["files"]
    );
    assert_eq!(
        json["files"]["failed"],
        made.truncated.len(),
        "{}",
        json["files"]
    );

    // One group per reason, with exactly the files made for it.
    let groups = json["unsupported"].as_array().expect("unsupported");
    assert_eq!(groups.len(), made.unsupported.len(), "{groups:?}");
    for g in groups {
        let reason = g["reason"].as_str().expect("reason");
        let want: BTreeSet<PathBuf> = made
            .unsupported
            .get(reason)
            .unwrap_or_else(|| panic!("unexpected reason {reason}"))
            .iter()
            .cloned()
            .collect();
        assert_eq!(g["count"], want.len(), "{reason}");
        assert_eq!(paths_of(&g["paths"]), want, "{reason}");
    }
    // `problems` holds the failures only: the truncated files, nothing
    // unsupported.
    let problems = json["problems"].as_array().expect("problems");
    let failed: BTreeSet<PathBuf> = problems
        .iter()
        .map(|p| PathBuf::from(p["path"].as_str().expect("path")))
        .collect();
    assert_eq!(
        failed,
        made.truncated.iter().cloned().collect(),
        "{problems:?}"
    );
    assert!(
        problems.iter().all(|p| p["kind"] == "failed"),
        "{problems:?}"
    );

    // The text: one line per reason with its count, a few examples each.
    let text = run_ok(eim().args(["scan", "--pid", &pid]));
    assert_eq!(text_number(&text, "unsupported"), unsupported_count as u64);
    for (reason, paths) in &made.unsupported {
        let lines: Vec<&str> = text.lines().filter(|l| l.ends_with(reason)).collect();
        assert_eq!(lines.len(), 1, "{reason}:\n{text}");
        let words: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            words[..2],
            ["unsupported", &paths.len().to_string()],
            "{text}"
        );
    }
    let truncated: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("truncated ELF file"))
        .collect();
    assert_eq!(
        truncated.len(),
        1,
        "identical failures are one line:\n{text}"
    );
    assert!(truncated[0].trim_start().starts_with("failed "), "{text}");
    assert!(truncated[0].contains(" 4  "), "{text}");
    let listed = |text: &str| {
        made.unsupported[ELF32]
            .iter()
            .filter(|p| text.lines().any(|l| l.trim() == p.to_string_lossy()))
            .count()
    };
    assert_eq!(listed(&text), problems_examples());
    assert!(
        text.contains("... and 14 more (--files lists them all)"),
        "{text}"
    );
    // `--files` lists every path.
    let all = run_ok(eim().args(["scan", "--files", "--pid", &pid]));
    assert_eq!(listed(&all), made.unsupported[ELF32].len(), "{all}");
    drop(mapper);
    let _ = std::fs::remove_dir_all(&dir);
}

/// How many example paths a group shows without `--files`.
fn problems_examples() -> usize {
    eim::report::problems::EXAMPLES
}

/// Each `# file:` section of a command's output over several files, by
/// the path it names: the `# key: value` lines of its header.
fn sections(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current = None;
    for line in text.lines() {
        let Some((key, value)) = line.strip_prefix("# ").and_then(|l| l.split_once(": ")) else {
            continue;
        };
        if key == "file" {
            current = Some(value.to_string());
        }
        if let Some(file) = &current {
            out.entry(file.clone())
                .or_default()
                .insert(key.to_string(), value.to_string());
        }
    }
    out
}

#[test]
fn the_json_lists_every_loaded_file_as_fileid_deltas_and_tables_see_it() {
    let (sleep, py, pids) = sleep_and_python();
    let json: Value =
        serde_json::from_str(&run_ok(eim().args(["scan", "--json"]).args(&pids))).expect("JSON");
    // Which processes map each file, and where the test reads it.
    let mut mappers: BTreeMap<FileId, Vec<i32>> = BTreeMap::new();
    let mut where_: BTreeMap<FileId, (PathBuf, PathBuf)> = BTreeMap::new();
    for pid in [sleep.pid(), py.pid()] {
        for (id, path) in expected_ids(pid) {
            mappers.entry(id).or_default().push(pid);
            if where_.contains_key(&id) {
                continue;
            }
            let real = if path == Path::new("[vdso]") {
                // Loaded from the process's memory: the commands read the
                // image from a file of its bytes.
                let image = vdso_image(pid).expect("a vDSO");
                let at = exec_dir("vdso").join("vdso.so");
                std::fs::write(&at, image).expect("write the vDSO image");
                at
            } else {
                PathBuf::from(format!("/proc/{pid}/root"))
                    .join(path.strip_prefix("/").unwrap_or(&path))
            };
            where_.insert(id, (path, real));
        }
    }
    let reals: Vec<&PathBuf> = where_.values().map(|(_, real)| real).collect();
    let fileids: BTreeMap<String, (String, String)> = run_ok(eim().arg("fileid").args(&reals))
        .lines()
        .map(|l| {
            let mut w = l.splitn(3, ' ');
            let (long, host, path) = (w.next(), w.next(), w.next());
            (
                path.expect("path").to_string(),
                (
                    long.expect("id").to_string(),
                    host.expect("host id").to_string(),
                ),
            )
        })
        .collect();
    let deltas = sections(&run_ok(eim().arg("deltas").args(&reals)));
    let tables = sections(&run_ok(eim().arg("tables").args(&reals)));

    let listed = json["loaded_files"].as_array().expect("loaded_files");
    assert_eq!(listed.len(), mappers.len(), "{listed:?}");
    assert_eq!(json["files"]["loaded"], mappers.len());
    let mut seen = BTreeSet::new();
    for f in listed {
        let host = f["host_file_id"].as_str().expect("host id");
        let id = FileId(u64::from_str_radix(host, 16).expect("hex"));
        assert!(seen.insert(id), "{host} listed twice");
        let (path, real) = where_
            .get(&id)
            .unwrap_or_else(|| panic!("{f}: not a file of the processes"));
        let real = real.display().to_string();
        assert!(paths_of(&f["paths"]).contains(path), "{f}");
        let (long, short) = &fileids[&real];
        assert_eq!(
            (f["file_id"].as_str(), Some(host)),
            (Some(long.as_str()), Some(short.as_str())),
            "{real}"
        );
        let count = |v: &BTreeMap<String, String>, key: &str| -> u64 {
            v[key]
                .parse()
                .unwrap_or_else(|e| panic!("{real} {key}: {e}"))
        };
        assert_eq!(
            f["deltas"].as_u64(),
            Some(count(&deltas[&real], "deltas")),
            "{real}"
        );
        let t = &tables[&real];
        let table = &f["table"];
        for (field, key) in [
            ("size_class", "mapid"),
            ("kernel_deltas", "kernel_deltas"),
            ("page_entries", "pages"),
            ("unwind_slots", "unwind_infos"),
        ] {
            assert_eq!(
                table[field].as_u64(),
                Some(count(t, key)),
                "{real} {field}: {f}"
            );
        }
        let mut holders = mappers[&id].clone();
        holders.sort_unstable();
        assert_eq!(f["references"], holders.len(), "{real}");
        let processes: Vec<i64> = f["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter_map(Value::as_i64)
            .collect();
        assert_eq!(
            processes,
            holders.iter().map(|&p| i64::from(p)).collect::<Vec<_>>()
        );
        if real.contains("libc.so") {
            assert!(
                f["c_library"]["tsd"]["multiplier"].as_u64() > Some(0),
                "{f}"
            );
        }
    }
    // Python's interpreter (the executable, or libpython when it has one)
    // is listed with its version.
    assert!(
        listed
            .iter()
            .any(|f| f["interpreters"].as_array().is_some_and(|i| i
                .iter()
                .any(|i| i["loader"] == "python" && i["version"].is_string()))),
        "{listed:?}"
    );
    // `--files` shows every loaded file in the text.
    let text = run_ok(eim().args(["scan", "--files"]).args(&pids));
    for (path, _) in where_.values() {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&*path.to_string_lossy())),
            "{} not listed:\n{text}",
            path.display()
        );
    }
}

/// Two copies of one file are one file (the id is the content's): one
/// entry, both paths, one reference from the one process mapping both.
#[test]
fn a_file_seen_under_two_paths_is_listed_once_with_both() {
    let dir = exec_dir("two-paths");
    let bytes = std::fs::read("/usr/bin/true").expect("/usr/bin/true");
    let copies: Vec<PathBuf> = ["a-true", "b-true"]
        .iter()
        .map(|name| {
            let path = dir.join(name);
            std::fs::write(&path, &bytes).expect("copy");
            path
        })
        .collect();
    let mapper = spawn_mapper(&copies);
    let json: Value = serde_json::from_str(&run_ok(eim().args([
        "scan",
        "--json",
        "--pid",
        &mapper.pid().to_string(),
    ])))
    .expect("JSON");
    let id = file_id_of(&bytes).host().to_string();
    let entries: Vec<&Value> = json["loaded_files"]
        .as_array()
        .expect("loaded_files")
        .iter()
        .filter(|f| f["host_file_id"] == id.as_str())
        .collect();
    assert_eq!(entries.len(), 1, "{}", json["loaded_files"]);
    assert_eq!(
        paths_of(&entries[0]["paths"]),
        copies.iter().cloned().collect(),
        "{}",
        entries[0]
    );
    assert_eq!(entries[0]["references"], 1);
    drop(mapper);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The summary's unwind slots in use are the `UnwindInfoArraySize` metric;
/// the slots that keep the rules of a file unloaded since are counted
/// apart, and together they are every non-zero slot of the maps.
#[test]
fn the_unwind_slots_in_use_are_the_metric_and_kept_rules_are_apart() {
    let go = testdata().join("oracle/bin/gocorpus-go1.19-amd64");
    let gop = spawn_stopped(&go);
    let sleep = spawn(Command::new("sleep").arg("300"));
    wait_for_mapping(gop.pid(), "gocorpus-go1.19-amd64");
    wait_for_mapping(sleep.pid(), "libc.so.6");
    let mut host = host_of(&[gop.pid(), sleep.pid()], None);
    step(&mut host);
    let check = |host: &mut Host<SimMaps>| -> (usize, usize) {
        let summary = Summary::of(host).expect("summary");
        let metric = summary
            .metrics
            .iter()
            .find(|m| m.name == "UnwindInfoArraySize")
            .expect("the metric")
            .value;
        let k = &summary.kernel;
        assert_eq!(k.unwind_infos as u64, metric);
        assert_eq!(k.bytes.unwind_infos, metric * 16);
        // Counted here from the maps, not through the summary's code.
        let non_zero = host.with_backend(|m| {
            m.unwind_infos()
                .iter()
                .filter(|u| **u != Default::default())
                .count()
        });
        assert_eq!(k.unwind_slots_holding_rules, non_zero);
        let text = summary.render_text();
        assert_eq!(
            text_number(&text, "unwind slots in use (UnwindInfoArraySize)"),
            k.bytes.unwind_infos
        );
        assert_eq!(
            text_number(&text, "slots keeping an unloaded table's rule"),
            (non_zero - k.unwind_infos) as u64,
            "{text}"
        );
        (k.unwind_infos, non_zero)
    };
    let (in_use, holding) = check(&mut host);
    assert!(in_use > 0);
    assert_eq!(in_use, holding, "nothing unloaded yet");
    // The Go binary's table goes; the rules only it used stay in their
    // slots, no longer in use.
    gop.stop();
    step(&mut host);
    let (after, still) = check(&mut host);
    assert!(
        after < in_use,
        "{after} in use after the unload, {in_use} before"
    );
    assert_eq!(still, holding, "unloading writes no slot");
}
