//! A cursor over CFI bytes with upstream's overread rule: a read past the
//! current end yields zeros and moves the position past the end, and the
//! caller checks [`Reader::is_valid`] where upstream does. Matching that
//! rule (rather than failing at the first short read) is what makes eim
//! accept and reject exactly the inputs upstream accepts and rejects.
//!
//! Positions are `u64` offsets into `data`; `end <= data.len()` always
//! holds, so an in-bounds read never indexes outside `data`. Every read
//! consumes at least one byte or fails, so loops over a reader end.

use super::EntryError;

/// DWARF pointer encodings (`DW_EH_PE_*`).
pub(super) mod pe {
    pub(crate) const ABSPTR: u8 = 0x00;
    pub(crate) const UDATA2: u8 = 0x02;
    pub(crate) const UDATA4: u8 = 0x03;
    pub(crate) const UDATA8: u8 = 0x04;
    pub(crate) const SDATA2: u8 = 0x0a;
    pub(crate) const SDATA4: u8 = 0x0b;
    pub(crate) const SDATA8: u8 = 0x0c;
    /// Format and sign bits.
    pub(crate) const FORMAT_MASK: u8 = 0x0f;
    pub(crate) const PCREL: u8 = 0x10;
    pub(crate) const DATAREL: u8 = 0x30;
    pub(crate) const ADJUST_MASK: u8 = 0x70;
    pub(crate) const INDIRECT: u8 = 0x80;
    pub(crate) const OMIT: u8 = 0xff;
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Reader<'a> {
    /// The whole section (pointers and strings are relative to it).
    pub(crate) data: &'a [u8],
    /// `data[..end]`: what reads may return.
    window: &'a [u8],
    pub(crate) pos: u64,
    /// Virtual address of `data[0]`, for pc- and data-relative pointers.
    pub(crate) vaddr: u64,
    /// `.debug_frame` rules for CIE ids and CIE pointers.
    pub(crate) debug_frame: bool,
}

impl<'a> Reader<'a> {
    pub(super) fn new(data: &'a [u8], pos: u64, vaddr: u64, debug_frame: bool) -> Self {
        Self {
            data,
            window: data,
            pos,
            vaddr,
            debug_frame,
        }
    }

    /// The end of the readable bytes (a section offset).
    #[inline]
    pub(super) fn end(&self) -> u64 {
        self.window.len() as u64
    }

    /// Limits reads to `data[..end]`; `false` (and no change) if `end`
    /// is beyond the data.
    #[inline]
    pub(super) fn set_end(&mut self, end: u64) -> bool {
        match usize::try_from(end).ok().and_then(|e| self.data.get(..e)) {
            Some(window) => {
                self.window = window;
                true
            }
            None => false,
        }
    }

    #[inline]
    pub(super) fn has_data(&self) -> bool {
        self.pos < self.end()
    }

    #[inline]
    pub(super) fn is_valid(&self) -> bool {
        self.pos <= self.end()
    }

    #[inline]
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let start = self.pos;
        if let Some(bytes) = usize::try_from(start)
            .ok()
            .and_then(|s| self.window.get(s..))
            .and_then(|s| s.first_chunk::<N>())
        {
            self.pos = start + N as u64;
            return *bytes;
        }
        self.pos = start.saturating_add(N as u64);
        [0; N]
    }

    /// Runs `f` (an out-of-line slow path) on a copy of the reader and
    /// takes its position back: the reader itself never has its address
    /// taken, so the hot loops keep it in registers.
    #[inline(always)]
    pub(super) fn detached<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let mut copy = *self;
        let value = f(&mut copy);
        self.pos = copy.pos;
        value
    }

    /// The next byte, or `None` (with the position moved past the end) at
    /// the end.
    #[inline(always)]
    pub(super) fn next(&mut self) -> Option<u8> {
        match usize::try_from(self.pos)
            .ok()
            .and_then(|p| self.window.get(p))
        {
            Some(&b) => {
                self.pos += 1;
                Some(b)
            }
            None => {
                self.pos = self.pos.saturating_add(1);
                None
            }
        }
    }

    /// The next byte if there is one; at the end the position stays.
    #[inline(always)]
    pub(super) fn next_if_any(&mut self) -> Option<u8> {
        let b = usize::try_from(self.pos)
            .ok()
            .and_then(|p| self.window.get(p))
            .copied()?;
        self.pos += 1;
        Some(b)
    }

    #[inline(always)]
    pub(super) fn u8(&mut self) -> u8 {
        self.next().unwrap_or(0)
    }

    #[inline]
    pub(super) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }

    #[inline]
    pub(super) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    #[inline]
    pub(super) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }

    /// Unsigned LEB128; bits beyond 64 are dropped.
    #[inline(always)]
    pub(super) fn uleb(&mut self) -> u64 {
        match self.next() {
            Some(b) if b < 0x80 => u64::from(b),
            Some(b) => self.detached(|r| r.uleb_rest(u64::from(b & 0x7f))),
            None => 0,
        }
    }

    #[inline(never)]
    fn uleb_rest(&mut self, mut val: u64) -> u64 {
        let mut shift = 7u32;
        loop {
            let b = self.u8();
            if shift < 64 {
                val |= u64::from(b & 0x7f) << shift;
            }
            shift = shift.saturating_add(7);
            if b & 0x80 == 0 {
                return val;
            }
        }
    }

    /// Skips an unsigned LEB128.
    #[inline(always)]
    pub(super) fn skip_uleb(&mut self) {
        while let Some(b) = self.next() {
            if b < 0x80 {
                return;
            }
        }
    }

    /// Signed LEB128; bits beyond 64 are dropped.
    #[inline(always)]
    pub(super) fn sleb(&mut self) -> i64 {
        match self.next() {
            // One byte: bit 6 is the sign.
            Some(b) if b < 0x80 => (i64::from(b) << 57) >> 57,
            Some(b) => self.detached(|r| r.sleb_rest(i64::from(b & 0x7f))),
            None => 0,
        }
    }

    #[inline(never)]
    fn sleb_rest(&mut self, mut val: i64) -> i64 {
        let mut shift = 7u32;
        loop {
            let b = self.u8();
            if shift < 64 {
                val |= i64::from(b & 0x7f) << shift;
            }
            shift = shift.saturating_add(7);
            if b & 0x80 == 0 {
                if b & 0x40 != 0 && shift < 64 {
                    val |= -1i64 << shift;
                }
                return val;
            }
        }
    }

    /// Moves the position forward by `n` (an operand length).
    #[inline]
    pub(super) fn skip(&mut self, n: u64) {
        self.pos = self.pos.saturating_add(n);
    }

    /// The next `n` bytes, or `None` (with the position past the end) if
    /// they run past the end.
    pub(super) fn bytes(&mut self, n: u64) -> Option<&'a [u8]> {
        let start = self.pos;
        self.skip(n);
        if !self.is_valid() {
            return None;
        }
        self.window.get(start as usize..self.pos as usize)
    }

    /// A NUL-terminated string. Like upstream, the terminator is searched
    /// in the whole data, not only up to `end`; unlike upstream (which
    /// indexes out of range), a missing terminator is `None`.
    pub(super) fn cstr(&mut self) -> Option<&'a [u8]> {
        let rest = self.data.get(usize::try_from(self.pos).ok()?..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        self.pos += len as u64 + 1;
        rest.get(..len)
    }

    /// A pointer in encoding `enc` (`DW_EH_PE_omit` reads nothing and
    /// gives 0).
    #[inline(always)]
    pub(super) fn ptr(&mut self, enc: u8) -> Result<u64, EntryError> {
        // The encodings real files use, inline.
        const PCREL_SDATA4: u8 = pe::PCREL | pe::SDATA4;
        const DATAREL_SDATA4: u8 = pe::DATAREL | pe::SDATA4;
        match enc {
            PCREL_SDATA4 => {
                let pos = self.pos;
                let val = self.u32() as i32 as u64;
                Ok(val.wrapping_add(pos).wrapping_add(self.vaddr))
            }
            DATAREL_SDATA4 => {
                let val = self.u32() as i32 as u64;
                Ok(val.wrapping_add(self.vaddr))
            }
            pe::SDATA4 => Ok(self.u32() as i32 as u64),
            _ => self.detached(|r| r.ptr_any(enc)),
        }
    }

    #[inline(never)]
    fn ptr_any(&mut self, enc: u8) -> Result<u64, EntryError> {
        if enc == pe::OMIT {
            return Ok(0);
        }
        let pos = self.pos;
        let mut val = match enc & pe::FORMAT_MASK {
            pe::UDATA2 => u64::from(self.u16()),
            pe::UDATA4 => u64::from(self.u32()),
            pe::ABSPTR | pe::UDATA8 | pe::SDATA8 => self.u64(),
            pe::SDATA2 => self.u16() as i16 as u64,
            pe::SDATA4 => self.u32() as i32 as u64,
            _ => return Err(EntryError::PointerFormat(enc)),
        };
        match enc & pe::ADJUST_MASK {
            pe::ABSPTR => {}
            pe::PCREL => val = val.wrapping_add(pos).wrapping_add(self.vaddr),
            pe::DATAREL => val = val.wrapping_add(self.vaddr),
            _ => return Err(EntryError::PointerAdjust(enc)),
        }
        if enc & pe::INDIRECT != 0 {
            return Err(EntryError::PointerIndirect(enc));
        }
        Ok(val)
    }
}

/// Bytes one field in encoding `enc` takes (0 for unsupported formats).
pub(super) fn format_len(enc: u8) -> u64 {
    match enc & 0x07 {
        pe::UDATA2 => 2,
        pe::UDATA4 => 4,
        pe::ABSPTR | pe::UDATA8 => 8,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_past_the_end_give_zeros_and_invalidate() {
        let mut r = Reader::new(&[1, 2, 3], 0, 0, false);
        assert_eq!(r.u16(), 0x0201);
        assert!(r.is_valid());
        assert_eq!(r.u16(), 0);
        assert!(!r.is_valid());
        assert!(!r.has_data());
    }

    #[test]
    fn leb128_values() {
        let mut r = Reader::new(&[0xe5, 0x8e, 0x26, 0x7f, 0x80, 0x7f], 0, 0, false);
        assert_eq!(r.uleb(), 624_485);
        assert_eq!(r.sleb(), -1);
        assert_eq!(r.sleb(), -128);
        assert!(r.is_valid());
    }

    #[test]
    fn an_unterminated_leb_stops_at_the_end() {
        let mut r = Reader::new(&[0xff; 20], 0, 0, false);
        let _ = r.uleb();
        assert!(!r.is_valid());
    }

    #[test]
    fn pointer_encodings() {
        let data = [0xfe, 0xff, 0xff, 0xff, 0x10, 0x00];
        let mut r = Reader::new(&data, 0, 0x1000, false);
        assert_eq!(r.ptr(pe::SDATA4 | pe::PCREL), Ok(0x1000 - 2));
        assert_eq!(r.ptr(pe::UDATA2 | pe::DATAREL), Ok(0x1010));
        let mut r = Reader::new(&data, 0, 0, false);
        assert_eq!(r.ptr(pe::OMIT), Ok(0));
        assert_eq!(r.pos, 0);
        assert_eq!(r.ptr(0x01), Err(EntryError::PointerFormat(0x01)));
        assert_eq!(
            r.ptr(0x20 | pe::UDATA2),
            Err(EntryError::PointerAdjust(0x22))
        );
        assert_eq!(
            r.ptr(pe::INDIRECT | pe::UDATA2),
            Err(EntryError::PointerIndirect(0x82))
        );
    }

    #[test]
    fn unterminated_strings_are_rejected() {
        let mut r = Reader::new(b"zR", 0, 0, false);
        assert_eq!(r.cstr(), None);
        let mut r = Reader::new(b"zR\0x", 0, 0, false);
        assert_eq!(r.cstr(), Some(&b"zR"[..]));
        assert_eq!(r.pos, 3);
    }
}
