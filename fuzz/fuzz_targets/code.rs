//! The machine-code analyses on arbitrary code: the TSD and DTV analyses
//! of the C libraries, PHP's VM-kind, JIT-return and JIT-buffer scans, for
//! both architectures, and golabels' reading of Go's `runtime.stackcheck`
//! (x86-64) and `runtime.load_g` (arm64). A hostile library or interpreter decides these
//! bytes; each analysis must end with a result or an error, bounded by the
//! slice, never a panic or a hang.
#![no_main]

use arbitrary::Arbitrary;
use eim_analysis::elf::Arch;
use eim_analysis::interp::go::{load_g, stackcheck};
use eim_analysis::interp::php_code::{jit_buffer_pointers, jit_return_address, vm_kind};
use eim_analysis::tsd::{analyse_dtv, analyse_tsd};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    arm64: bool,
    /// Where the code is mapped (PC-relative results wrap, never panic).
    address: u64,
    code: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let arch = if input.arm64 {
        Arch::Aarch64
    } else {
        Arch::X86_64
    };
    // The loaders never pass more than 2 KiB.
    let code = &input.code[..input.code.len().min(2048)];
    let _ = analyse_tsd(arch, code);
    let _ = analyse_dtv(arch, code);
    let _ = vm_kind(arch, code);
    let _ = jit_return_address(arch, code, input.address);
    let _ = jit_buffer_pointers(arch, code, input.address);
    match arch {
        Arch::X86_64 => {
            let _ = stackcheck::decode(&code[..code.len().min(stackcheck::MAX_BYTES)]);
        }
        Arch::Aarch64 => {
            let _ = load_g::decode(&code[..code.len().min(load_g::MAX_BYTES)], input.address);
        }
    }
});
