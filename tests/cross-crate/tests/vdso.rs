//! The arm64 vDSO: plain extraction finds nothing (it has no unwind
//! sections), the synthesis gives upstream's seven deltas, and they reach
//! the kernel through `add_synth_interval_data` as upstream's seven kernel
//! deltas, answering every address like the synthesized list.

use std::sync::Arc;

use eim_analysis::elf::{extract::extract, vdso, Elf};
use eim_core::provider::MemoryProvider;
use eim_core::{ExecutableInfoManager, Tracers};
use eim_machine::abi::encoded_command;
use eim_machine::deltas::info;
use eim_machine::FileId;
use eim_sim::{SimConfig, SimMaps};
use eim_sim_harness::{check_all, Observed, Sources};
use eim_test_support::testdata;

#[test]
fn the_vdso_is_loaded_through_synthetic_data() {
    let bytes = std::fs::read(testdata().join("upstream/vdso.arch64.withframe")).unwrap();
    let elf = Elf::parse(&bytes).unwrap();
    assert!(
        extract(&elf, None).unwrap().is_empty(),
        "no unwind sections"
    );
    let data = vdso::synthesize(&elf).expect("an arm64 vDSO");
    let f16 = eim_machine::abi::UnwindInfo::new(3, 16, 3, 8);
    let want: Vec<(u64, _)> = vec![
        (0, info::LR),
        (0x7d8, f16),
        (0x7e4, info::LR),
        (0x800, f16),
        (0x80c, info::LR),
        (0x8f8, info::SIGNAL),
        (0x900, info::LR),
    ];
    let got: Vec<(u64, _)> = data.iter().map(|d| (d.address, d.info)).collect();
    assert_eq!(got, want);

    let id = FileId(0x7d50);
    let sources: Arc<Sources> = Arc::new([(id, data.clone())].into_iter().collect());
    let m = ExecutableInfoManager::new(
        MemoryProvider::new(),
        Observed::new(
            SimMaps::new(SimConfig::default()).unwrap(),
            sources.clone(),
            64,
        ),
        Tracers::none(),
    );
    m.add_synth_interval_data(id, &data).unwrap();
    let state = m.state();
    m.with_backend(|b| {
        assert_eq!(b.violation, None);
        check_all(&state, &b.maps, &sources).unwrap();
        let table = b.maps.delta_table(8, id).expect("class 8 table");
        let pairs: Vec<(u16, u16)> = table
            .prefix(7)
            .iter()
            .map(|d| (d.addr_low, d.unwind_info))
            .collect();
        let (a, b2) = (0, 1);
        assert_eq!(
            pairs,
            vec![
                (0, a),
                (0x7d8, b2),
                (0x7e4, a),
                (0x800, b2),
                (0x80c, a),
                (0x8f8, encoded_command::SIGNAL),
                (0x900, a),
            ]
        );
    });
}
