//! What every ELF file eim reads begins with: the magic, the
//! identification bytes of a 64-bit little-endian file, the header's size.
//! A leaf, so that every reader of headers (the parse, the header check,
//! the program-header reader) can name them without depending on another.

/// The first four bytes of every ELF file.
pub(crate) const MAGIC: &[u8; 4] = b"\x7fELF";
/// `EI_CLASS` (byte 4) of a 64-bit file.
pub(crate) const ELFCLASS64: u8 = 2;
/// `EI_DATA` (byte 5) of a little-endian file.
pub(crate) const ELFDATA2LSB: u8 = 1;
/// The size of an ELF64 file header.
pub const EHDR64_SIZE: u64 = 64;
