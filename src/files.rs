//! The file provider: reading the ELF files a host maps, safely. A file is
//! opened as a regular file only, and a process's files through root's
//! links only and inside its root ([`opener`], [`regular`]), read on demand and never
//! mapped ([`elf_file::ElfFileRef`], with its separate debug file), and
//! handed to the core's extraction and interpreter loaders through the
//! stack-delta provider ([`elf_provider::ElfProvider`], [`loaders`]);
//! [`counting`] measures how often and how long.

pub mod counting;
pub mod elf_file;
pub mod elf_provider;
pub mod loaders;
pub mod opener;
pub mod regular;
pub mod segments;
pub mod trust;
