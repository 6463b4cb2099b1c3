use super::*;

const HEADER: &str = include_str!("../../../bpf/events.h");

fn define(name: &str) -> u64 {
    crate::c_header::define(HEADER, "bpf/events.h", name)
}

fn define_expr(name: &str) -> String {
    crate::c_header::define_text(HEADER, "bpf/events.h", name).to_string()
}

#[test]
fn the_numbers_agree_with_events_h() {
    for (name, value) in [
        ("EIM_EVENT_EXEC", kind::EXEC),
        ("EIM_EVENT_EXIT", kind::EXIT),
        ("EIM_EVENT_FORK", kind::FORK),
        ("EIM_EVENT_MMAP", kind::MMAP),
        ("EIM_EVENT_MPROTECT", kind::MPROTECT),
    ] {
        assert_eq!(define(name), u64::from(value), "{name}");
    }
    assert!(HEADER.contains(&format!("sizeof(EimHostEvent) == {EVENT_SIZE}")));
    assert_eq!(define_expr("EIM_EVENTS_RING_BYTES"), "(1 << 20)");
    assert_eq!(DEFAULT_RING_BYTES, 1 << 20);
}

fn record(kind: u32, pid: u32, parent: u32, addr: u64, len: u64) -> Vec<u8> {
    let mut r = Vec::new();
    for v in [kind, pid, parent, 0] {
        r.extend(v.to_le_bytes());
    }
    r.extend(addr.to_le_bytes());
    r.extend(len.to_le_bytes());
    r.extend(12_345u64.to_le_bytes());
    r
}

fn decode(record: &[u8]) -> Option<HostEvent> {
    let stamped = super::decode(record)?;
    assert_eq!(stamped.at, Duration::from_nanos(12_345));
    Some(stamped.event)
}

#[test]
fn records_decode_by_kind_and_anything_else_is_refused() {
    assert_eq!(
        decode(&record(kind::EXEC, 7, 0, 0, 0)),
        Some(HostEvent::Exec { pid: 7 })
    );
    assert_eq!(
        decode(&record(kind::FORK, 8, 7, 0, 0)),
        Some(HostEvent::Fork { pid: 8, parent: 7 })
    );
    assert_eq!(
        decode(&record(kind::MMAP, 9, 0, 0x7f00_0000_0000, 0x2000)),
        Some(HostEvent::Map {
            pid: 9,
            addr: 0x7f00_0000_0000,
            len: 0x2000
        })
    );
    assert_eq!(
        decode(&record(kind::MPROTECT, 9, 0, 0x1000, 0x1000)),
        Some(HostEvent::Protect {
            pid: 9,
            addr: 0x1000,
            len: 0x1000
        })
    );
    assert_eq!(
        decode(&record(kind::EXIT, 10, 0, 0, 0)).map(|e| e.pid()),
        Some(10)
    );
    // Another kind, no pid, a pid past i32, a short or long record.
    assert_eq!(decode(&record(99, 7, 0, 0, 0)), None);
    assert_eq!(decode(&record(kind::EXEC, 0, 0, 0, 0)), None);
    assert_eq!(decode(&record(kind::EXEC, u32::MAX, 0, 0, 0)), None);
    assert_eq!(decode(&record(kind::EXEC, 7, 0, 0, 0)[..39]), None);
    let mut long = record(kind::EXEC, 7, 0, 0, 0);
    long.push(0);
    assert_eq!(decode(&long), None);
}
