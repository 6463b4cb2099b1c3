//! The profile as pprof's `profile.proto` (the format of `go tool pprof`,
//! Grafana Pyroscope and others), encoded with the `pprof` crate's
//! protobuf types, uncompressed (pprof's readers take both).

use std::collections::{HashMap, HashSet};

use pprof::protos::{
    Function, Label, Line, Location, Mapping, Message as _, Profile, Sample, ValueType,
};

use super::{Aggregate, MappedFile, NamedFrame};

/// The string table: index 0 is the empty string, as the format requires.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Self::default();
        s.id("");
        s
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// How a run sampled: what a profile says besides its samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Samples per second on each CPU.
    pub hz: u64,
    /// When sampling began, in nanoseconds since the Unix epoch.
    pub time_nanos: i64,
    /// How long it sampled.
    pub duration_nanos: i64,
}

/// The profile's mappings: one per mapping of a file (a file once for a
/// process; again for another process that maps it elsewhere), the
/// executables first, since pprof takes the first for the main binary.
fn mappings(
    aggregate: &Aggregate,
    strings: &mut Strings,
) -> (Vec<Mapping>, HashMap<MappedFile, u64>) {
    let mut files: Vec<&MappedFile> = aggregate
        .stacks
        .keys()
        .flat_map(|k| k.frames.iter().filter_map(|f| f.mapping.as_deref()))
        .collect();
    files.sort_by(|a, b| b.main.cmp(&a.main).then_with(|| a.cmp(b)));
    files.dedup();
    let has_lines: HashSet<&MappedFile> = aggregate
        .stacks
        .keys()
        .flat_map(|k| k.frames.iter())
        .filter(|f| f.source.is_some())
        .filter_map(|f| f.mapping.as_deref())
        .collect();
    let mut ids = HashMap::with_capacity(files.len());
    let list = files
        .iter()
        .zip(1u64..)
        .map(|(file, id)| {
            ids.insert((*file).clone(), id);
            let lines = has_lines.contains(file);
            Mapping {
                id,
                memory_start: file.start,
                memory_limit: file.limit,
                file_offset: file.offset,
                filename: strings.id(&file.path),
                build_id: strings.id(file.build_id.as_deref().unwrap_or("")),
                // Every location is named here: pprof need not look again.
                has_functions: true,
                has_filenames: lines,
                has_line_numbers: lines,
                has_inline_frames: false,
            }
        })
        .collect();
    (list, ids)
}

/// `aggregate` as a pprof profile of `run`: one sample per distinct stack
/// (leaf first) with its count and CPU time, labelled with the process
/// name (and, for a walk that stopped early, why); one location per
/// distinct frame at its PC in the process, in its mapping; one function
/// per distinct name.
pub fn profile(aggregate: &Aggregate, run: Run) -> Profile {
    let mut strings = Strings::new();
    let (mapping, mapping_ids) = mappings(aggregate, &mut strings);
    let mut locations: HashMap<&NamedFrame, u64> = HashMap::new();
    let mut functions: HashMap<(i64, i64, i64), u64> = HashMap::new();
    let mut location_list = Vec::new();
    let mut function_list = Vec::new();
    let period = 1_000_000_000 / run.hz.max(1) as i64;
    let mut samples = Vec::with_capacity(aggregate.stacks.len());
    for (key, count) in &aggregate.stacks {
        let mut ids: Vec<u64> = Vec::with_capacity(key.frames.len());
        for f in key.frames.iter().rev() {
            if let Some(id) = locations.get(f) {
                ids.push(*id);
                continue;
            }
            // A source file where the symbolizer gives one, else the binary.
            let filename = match (&f.source, &f.mapping) {
                (Some(source), _) => strings.id(&source.file),
                (None, Some(file)) => strings.id(&file.path),
                (None, None) => 0,
            };
            let name = strings.id(&f.name);
            let system_name = strings.id(f.system_name.as_deref().unwrap_or(&f.name));
            let next = function_list.len() as u64 + 1;
            let function_id = *functions
                .entry((name, system_name, filename))
                .or_insert_with(|| {
                    function_list.push(Function {
                        id: next,
                        name,
                        system_name,
                        filename,
                        start_line: 0,
                    });
                    next
                });
            let id = location_list.len() as u64 + 1;
            location_list.push(Location {
                id,
                mapping_id: f
                    .mapping
                    .as_deref()
                    .and_then(|m| mapping_ids.get(m))
                    .copied()
                    .unwrap_or(0),
                address: f.pc,
                line: vec![Line {
                    function_id,
                    line: f.source.as_ref().map_or(0, |s| i64::from(s.line)),
                }],
                is_folded: false,
            });
            locations.insert(f, id);
            ids.push(id);
        }
        let count = *count as i64;
        let mut label = vec![Label {
            key: strings.id("process"),
            str: strings.id(&key.comm),
            ..Label::default()
        }];
        if let Some(why) = key.incomplete {
            label.push(Label {
                key: strings.id("incomplete"),
                str: strings.id(why),
                ..Label::default()
            });
        }
        samples.push(Sample {
            location_id: ids,
            value: vec![count, count.saturating_mul(period)],
            label,
        });
    }
    let value_type = |strings: &mut Strings, kind: &str, unit: &str| ValueType {
        ty: strings.id(kind),
        unit: strings.id(unit),
    };
    Profile {
        sample_type: vec![
            value_type(&mut strings, "samples", "count"),
            value_type(&mut strings, "cpu", "nanoseconds"),
        ],
        period_type: Some(value_type(&mut strings, "cpu", "nanoseconds")),
        period,
        time_nanos: run.time_nanos,
        duration_nanos: run.duration_nanos,
        sample: samples,
        mapping,
        location: location_list,
        function: function_list,
        string_table: strings.table,
        ..Profile::default()
    }
}

/// The encoded profile.
pub fn encode(profile: &Profile) -> Vec<u8> {
    let mut out = Vec::with_capacity(profile.encoded_len());
    // Encoding into a Vec cannot run out of room.
    if profile.encode(&mut out).is_err() {
        out.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::profile::{StackKey, UNKNOWN};

    fn file(path: &str, start: u64, main: bool) -> Arc<MappedFile> {
        Arc::new(MappedFile {
            start,
            limit: start + 0x1000,
            offset: 0x1000,
            path: path.into(),
            build_id: Some(format!("{:040x}", start)),
            main,
        })
    }

    fn frame(name: &str, mapping: &Arc<MappedFile>, pc: u64) -> NamedFrame {
        NamedFrame {
            name: name.into(),
            system_name: None,
            source: None,
            mapping: Some(mapping.clone()),
            pc,
            address: pc - mapping.start + 0x1000,
        }
    }

    fn run() -> Run {
        Run {
            hz: 100,
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 2_000_000_000,
        }
    }

    /// Two processes of one program (its executable and libc at other
    /// addresses in each), a frame in no file, and a stack that prints
    /// like another but was sampled at other addresses.
    fn aggregate() -> Aggregate {
        let exe1 = file("/bin/x", 0x5000, true);
        let libc1 = file("/lib/libc.so.6", 0x7000, false);
        let exe2 = file("/bin/x", 0x9000, true);
        let libc2 = file("/lib/libc.so.6", 0xb000, false);
        let mut a = Aggregate::default();
        let mut add = |frames: Vec<NamedFrame>, incomplete, count| {
            a.stacks.insert(
                StackKey {
                    comm: "x".into(),
                    frames,
                    incomplete,
                },
                count,
            );
        };
        add(
            vec![
                frame("__libc_start_main", &libc1, 0x7010),
                frame("main", &exe1, 0x5010),
                frame("spin", &exe1, 0x5020),
            ],
            None,
            7,
        );
        add(
            vec![
                frame("__libc_start_main", &libc2, 0xb010),
                frame("main", &exe2, 0x9010),
                frame("spin", &exe2, 0x9024),
            ],
            None,
            3,
        );
        let unknown = NamedFrame {
            name: UNKNOWN.into(),
            system_name: None,
            source: None,
            mapping: None,
            pc: 0x7fff_0000_1234,
            address: 0x7fff_0000_1234,
        };
        add(vec![unknown], Some("no-delta"), 2);
        a
    }

    fn decoded(a: &Aggregate) -> Profile {
        let bytes = encode(&profile(a, run()));
        Profile::decode(bytes.as_slice()).expect("decodes")
    }

    #[test]
    fn every_mapping_names_its_file_and_build_id_and_every_location_its_mapping() {
        let p = decoded(&aggregate());
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(p.mapping.len(), 4, "each file once per process");
        assert!(
            p.mapping[..2].iter().all(|m| s(m.filename) == "/bin/x"),
            "the executables first"
        );
        for m in &p.mapping {
            assert!(
                !s(m.filename).is_empty() && s(m.build_id).len() == 40,
                "{m:?}"
            );
            assert!(m.memory_start < m.memory_limit && m.file_offset == 0x1000);
            assert!(m.has_functions);
        }
        for l in &p.location {
            let name = s(p.function[l.line[0].function_id as usize - 1].name);
            if name == UNKNOWN {
                assert_eq!(l.mapping_id, 0, "in no file");
                assert_eq!(l.address, 0x7fff_0000_1234, "its runtime address");
                continue;
            }
            let m = p
                .mapping
                .iter()
                .find(|m| m.id == l.mapping_id)
                .unwrap_or_else(|| panic!("{name}: no mapping"));
            assert!(
                (m.memory_start..m.memory_limit).contains(&l.address),
                "{name}: the runtime address, inside its mapping"
            );
        }
        for f in &p.function {
            assert!(!s(f.name).is_empty() && !s(f.system_name).is_empty());
        }
        let labels: Vec<&str> = p
            .sample
            .iter()
            .flat_map(|x| x.label.iter().map(|l| s(l.key)))
            .collect();
        assert!(labels.contains(&"incomplete"));
    }

    #[test]
    fn sample_types_period_and_times_are_set_and_functions_shared() {
        let p = decoded(&aggregate());
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(p.string_table[0], "");
        let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (s(t.ty), s(t.unit))).collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let period = p.period_type.as_ref().expect("period type");
        assert_eq!((s(period.ty), s(period.unit)), ("cpu", "nanoseconds"));
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.duration_nanos, 2_000_000_000);
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        let total: i64 = p.sample.iter().map(|x| x.value[0]).sum();
        assert_eq!(total, 12);
        let cpu: i64 = p.sample.iter().map(|x| x.value[1]).sum();
        assert_eq!(cpu, 12 * 10_000_000);
        // 7 locations (3 + 3 at other addresses + 1), 4 functions (spin,
        // main, the two libc ones are one; [unknown]).
        assert_eq!(p.location.len(), 7);
        let mut names: Vec<&str> = p.function.iter().map(|f| s(f.name)).collect();
        names.sort_unstable();
        assert_eq!(names, ["[unknown]", "__libc_start_main", "main", "spin"]);
        let deep = p
            .sample
            .iter()
            .find(|x| x.value[0] == 7)
            .expect("7 samples");
        let leaf = p
            .location
            .iter()
            .find(|l| l.id == deep.location_id[0])
            .expect("leaf");
        assert_eq!(leaf.address, 0x5020, "leaf first, at its PC");
    }
}
