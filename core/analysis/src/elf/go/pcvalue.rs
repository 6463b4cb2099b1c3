//! Go's pc-value tables (spec 5.6): a run of `(value delta, pc delta)`
//! varint pairs, the value delta zig-zag coded, the pc delta in units of the
//! instruction quantum. A zero byte, or the end of the bytes, ends a table.
//!
//! The decoder keeps upstream's edge behaviour exactly:
//! * the value starts at −1 and the first step is decoded on construction;
//! * if that first step fails (empty table, or one starting with a zero
//!   byte) the step's start address stays 0 and the value stays −1;
//! * a varint cut short by the end of the bytes reads as 0 (the bits read so
//!   far are discarded), and bits shifted past 32 are lost.
//!
//! Every step consumes at least one byte, so a walk ends after at most
//! `table.len()` steps.

/// A position in a pc-value table: the value in force on `[pc_start, pc_end)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PcValue<'d> {
    rest: &'d [u8],
    /// Start of the current step's range.
    pub(crate) pc_start: u64,
    /// End (exclusive) of the current step's range.
    pub(crate) pc_end: u64,
    /// The value in force on the range.
    pub(crate) value: i32,
    quantum: u8,
}

impl<'d> PcValue<'d> {
    /// Begins a table for a function starting at `pc` and decodes its first
    /// step (see the module notes for what a failed first step leaves).
    #[inline]
    pub(crate) fn new(table: &'d [u8], pc: u64, quantum: u8) -> Self {
        let mut p = Self {
            rest: table,
            pc_start: 0,
            pc_end: pc,
            value: -1,
            quantum,
        };
        p.step();
        p
    }

    /// An unsigned LEB128 value, truncated to 32 bits; 0 if cut short.
    #[inline(always)]
    fn varint(&mut self) -> u32 {
        // One and two bytes (nearly every value) inline.
        match *self.rest {
            [byte, ref rest @ ..] if byte & 0x80 == 0 => {
                self.rest = rest;
                u32::from(byte)
            }
            [low, high, ref rest @ ..] if high & 0x80 == 0 => {
                self.rest = rest;
                u32::from(low & 0x7f) | (u32::from(high) << 7)
            }
            _ => self.varint_long(),
        }
    }

    #[inline(never)]
    fn varint_long(&mut self) -> u32 {
        let mut value = 0u32;
        let mut shift = 0u32;
        while let Some((&byte, rest)) = self.rest.split_first() {
            self.rest = rest;
            value |= u32::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
            if byte & 0x80 == 0 {
                return value;
            }
            shift = shift.saturating_add(7);
        }
        0
    }

    /// Decodes the next step; false at the end of the table (the position is
    /// then left unchanged).
    #[inline(always)]
    pub(crate) fn step(&mut self) -> bool {
        match self.rest.first() {
            None | Some(0) => return false,
            Some(_) => {}
        }
        self.pc_start = self.pc_end;
        let raw = self.varint();
        let delta = if raw & 1 != 0 { !(raw >> 1) } else { raw >> 1 };
        self.value = self.value.wrapping_add(delta as i32);
        let pc_delta = u64::from(self.varint()) * u64::from(self.quantum);
        self.pc_end = self.pc_end.wrapping_add(pc_delta);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All `(value, pc_end)` positions of a table, the first included.
    fn walk(table: &[u8], pc: u64, quantum: u8) -> Vec<(i32, u64)> {
        let mut p = PcValue::new(table, pc, quantum);
        let mut out = vec![(p.value, p.pc_end)];
        while p.step() {
            out.push((p.value, p.pc_end));
        }
        out
    }

    /// Upstream's `TestPcval`: the example table of the Go 1.2 symbol-table
    /// design document.
    #[test]
    fn pcval_vector() {
        let table = [
            0x02, 0x19, 0x40, 0x52, 0x10, 0x02, 0x10, 0x06, 0x0f, 0x01, 0x0f, 0x27, 0x3f, 0x01,
            0x00,
        ];
        assert_eq!(
            walk(&table, 0x2000, 1),
            vec![
                (0, 0x2019),
                (32, 0x206b),
                (40, 0x206d),
                (48, 0x2073),
                (40, 0x2074),
                (32, 0x209b),
                (0, 0x209c),
            ]
        );
    }

    /// The step ranges chain: each step starts where the previous ended.
    #[test]
    fn steps_chain() {
        let table = [0x02, 0x19, 0x40, 0x52, 0x00];
        let mut p = PcValue::new(&table, 0x2000, 1);
        assert_eq!((p.pc_start, p.pc_end), (0x2000, 0x2019));
        assert!(p.step());
        assert_eq!((p.pc_start, p.pc_end), (0x2019, 0x206b));
        assert!(!p.step());
        assert_eq!((p.pc_start, p.pc_end, p.value), (0x2019, 0x206b, 32));
    }

    /// Upstream's `TestPcvalInvalid`: a table of just 0x81 (a varint cut
    /// short) terminates without a panic. The cut varint reads as 0, so the
    /// one step keeps the initial value.
    #[test]
    fn pcval_invalid_terminates() {
        assert_eq!(walk(&[0x81], 0x2000, 1), vec![(-1, 0x2000)]);
    }

    #[test]
    fn a_failed_first_step_leaves_start_zero() {
        for table in [&[][..], &[0x00, 0x02, 0x04][..]] {
            let p = PcValue::new(table, 0x1234, 4);
            assert_eq!((p.pc_start, p.pc_end, p.value), (0, 0x1234, -1));
        }
    }

    #[test]
    fn quantum_scales_the_pc_delta() {
        assert_eq!(walk(&[0x02, 0x03, 0x00], 0x1000, 4), vec![(0, 0x100c)]);
    }

    #[test]
    fn long_varints_lose_high_bits_and_never_panic() {
        // Eleven continuation bytes, then a terminator: shifts go past 64.
        let mut table = vec![0xffu8; 11];
        table.push(0x01);
        table.push(0x05);
        let p = PcValue::new(&table, 0, 1);
        assert_eq!(p.pc_end, 5);
        // A huge pc delta times the quantum wraps instead of overflowing.
        let table = [0x02, 0xff, 0xff, 0xff, 0xff, 0x0f];
        let p = PcValue::new(&table, u64::MAX - 1, 4);
        assert_eq!(p.pc_end, (u64::MAX - 1).wrapping_add(0xffff_ffff * 4));
    }

    #[test]
    fn every_step_consumes_input() {
        let table = [0x80u8; 64];
        let mut p = PcValue::new(&table, 0, 1);
        let mut steps = 1;
        while p.step() {
            steps += 1;
        }
        assert!(steps <= table.len());
    }
}
