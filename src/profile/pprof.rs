//! The profile as pprof's `profile.proto` (the format of `go tool pprof`,
//! Grafana Pyroscope and others), encoded with the `pprof` crate's
//! protobuf types, uncompressed (pprof's readers take both).

use std::collections::HashMap;

use pprof::protos::{Function, Label, Line, Location, Message as _, Profile, Sample, ValueType};

use super::{Aggregate, NamedFrame};

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

/// `aggregate` sampled at `hz` for `duration_ns`, as a pprof profile: one
/// sample per distinct stack (leaf first) with its count and CPU time,
/// labelled with the process name; one location and function per
/// distinct frame.
pub fn profile(aggregate: &Aggregate, hz: u64, duration_ns: i64) -> Profile {
    let mut strings = Strings::new();
    let mut locations: HashMap<&NamedFrame, u64> = HashMap::new();
    let mut location_list = Vec::new();
    let mut function_list = Vec::new();
    let period = 1_000_000_000 / hz.max(1) as i64;
    let mut samples = Vec::with_capacity(aggregate.stacks.len());
    for (key, count) in &aggregate.stacks {
        let mut ids: Vec<u64> = Vec::with_capacity(key.frames.len() + 1);
        for f in key.frames.iter().rev() {
            let next = locations.len() as u64 + 1;
            let id = *locations.entry(f).or_insert_with(|| {
                function_list.push(Function {
                    id: next,
                    name: strings.id(&f.name),
                    system_name: strings.id(&f.name),
                    filename: strings.id(f.file.as_deref().unwrap_or("")),
                    ..Function::default()
                });
                location_list.push(Location {
                    id: next,
                    address: f.address,
                    line: vec![Line {
                        function_id: next,
                        line: 0,
                    }],
                    ..Location::default()
                });
                next
            });
            ids.push(id);
        }
        let count = *count as i64;
        samples.push(Sample {
            location_id: ids,
            value: vec![count, count.saturating_mul(period)],
            label: vec![Label {
                key: strings.id("process"),
                str: strings.id(&key.comm),
                ..Label::default()
            }],
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
        duration_nanos: duration_ns,
        sample: samples,
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
    use super::*;
    use crate::profile::StackKey;

    #[test]
    fn samples_locations_and_names_survive_a_decode() {
        let frame = |name: &str, address| NamedFrame {
            name: name.into(),
            file: Some("/bin/x".into()),
            address,
        };
        let mut a = Aggregate::default();
        a.stacks.insert(
            StackKey {
                comm: "x".into(),
                frames: vec![frame("main", 0x10), frame("spin", 0x20)],
                incomplete: None,
            },
            7,
        );
        a.stacks.insert(
            StackKey {
                comm: "x".into(),
                frames: vec![frame("main", 0x10)],
                incomplete: None,
            },
            2,
        );
        let bytes = encode(&profile(&a, 100, 1_000_000_000));
        let p = Profile::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.period, 10_000_000);
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, 9);
        assert_eq!(p.location.len(), 2, "main is one location");
        let name_of = |loc: u64| {
            let l = p.location.iter().find(|l| l.id == loc).expect("location");
            let f = p
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .expect("function");
            p.string_table[f.name as usize].clone()
        };
        let deep = p
            .sample
            .iter()
            .find(|s| s.value[0] == 7)
            .expect("the deep stack");
        let names: Vec<String> = deep.location_id.iter().map(|l| name_of(*l)).collect();
        assert_eq!(names, ["spin", "main"], "leaf first");
        assert_eq!(deep.value[1], 70_000_000);
    }
}
