//! The vDSO as a file (spec 6, 9.1): the `[vdso]` mapping of a process has
//! no file behind it, so its image is read from the process's memory
//! (`/proc/PID/mem`, bounded by the mapping and by [`MAX_VDSO_BYTES`]),
//! identified as upstream identifies the vDSO (the file id of the image's
//! bytes) and kept in a sealed memory file, so that the rest of the host
//! opens, identifies, extracts and loads it as any other file.
//!
//! Every process of one kernel maps the same image: [`VdsoImages`] keeps
//! each distinct image once (by its bytes, compared whole), so the manager
//! sees one file id and one file (one device and inode) for all of them,
//! and extracts it once per boot. A process that rewrote its own copy
//! (it may: its vDSO is its memory) presents other bytes, hence another id
//! and another memory file, never the kernel's.
//!
//! **Trust** (issue 28's collision rules): an image is trusted, as a
//! root-owned system file is, only if its bytes are the kernel's, that is
//! equal to eim's own vDSO (the kernel maps the same image into every
//! process of an ABI; eim never writes to its own). A process's own edited
//! copy is untrusted, so a file planted with the vDSO's id never wins the
//! id from the kernel's image, and the kernel's image wins it from such a
//! file.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};

use eim_analysis::elf::fileid::{self, FileId128};

pub use super::procs::VDSO_PATH;

/// The largest vDSO image read: Linux's are a few pages (two on x86-64,
/// up to 64 KiB pages on arm64); a larger `[vdso]` mapping is not read.
pub const MAX_VDSO_BYTES: u64 = 1 << 20;

/// Distinct images kept (the kernel's, and any a process made of its
/// own): past this, the cache starts over.
pub const MAX_IMAGES: usize = 8;

/// Why a process's vDSO image could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum VdsoError {
    #[error("process {pid} exited while its vDSO was being read")]
    Vanished { pid: i32 },
    #[error(
        "process {pid}: its [vdso] mapping is {size} bytes, more than the {limit} bytes eim reads"
    )]
    TooLarge { pid: i32, size: u64, limit: u64 },
    #[error(
        "process {pid}: read {got} of the {size} bytes of its [vdso] mapping from /proc/{pid}/mem"
    )]
    Short { pid: i32, got: u64, size: u64 },
    #[error("process {pid}: cannot read its [vdso] mapping from /proc/{pid}/mem: {cause}")]
    Io { pid: i32, cause: io::Error },
    #[error("cannot keep the vDSO image of process {pid} in a memory file: {cause}")]
    MemoryFile { pid: i32, cause: io::Error },
}

impl VdsoError {
    fn of_io(pid: i32, cause: io::Error) -> Self {
        // ESRCH, or a missing /proc/PID: the process is gone.
        if cause.kind() == io::ErrorKind::NotFound || cause.raw_os_error() == Some(libc::ESRCH) {
            Self::Vanished { pid }
        } else {
            Self::Io { pid, cause }
        }
    }
}

/// Reads at an offset: `/proc/PID/mem` in eim, anything in tests.
pub trait ReadAt {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

/// The image of the mapping `[start, end)` of process `pid`, read from
/// `mem` (the process's memory, addressed by virtual address): all of it,
/// or an error. The allocation is bounded by [`MAX_VDSO_BYTES`] before any
/// read, and each read moves forward, so the loop is bounded too.
pub fn read_image(mem: &dyn ReadAt, pid: i32, start: u64, end: u64) -> Result<Vec<u8>, VdsoError> {
    let size = end.saturating_sub(start);
    if size > MAX_VDSO_BYTES {
        return Err(VdsoError::TooLarge {
            pid,
            size,
            limit: MAX_VDSO_BYTES,
        });
    }
    // Bounded above: size <= MAX_VDSO_BYTES fits a usize.
    let mut image = vec![0; size as usize];
    let mut done = 0;
    while done < image.len() {
        match mem.read_at(&mut image[done..], start + done as u64) {
            // A process that exits while it is read shows no more memory.
            Ok(0) => {
                return Err(VdsoError::Short {
                    pid,
                    got: done as u64,
                    size,
                })
            }
            Ok(n) => done += n.min(image.len() - done),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(VdsoError::of_io(pid, e)),
        }
    }
    Ok(image)
}

/// Reads the `[vdso]` mapping `[start, end)` of process `pid`.
pub fn read_process_image(pid: i32, start: u64, end: u64) -> Result<Vec<u8>, VdsoError> {
    let mem = File::open(format!("/proc/{pid}/mem")).map_err(|e| VdsoError::of_io(pid, e))?;
    read_image(&mem, pid, start, end)
}

/// The kernel's vDSO image: eim's own, read from its memory. `None` if eim
/// maps none, or it cannot be read (then no image is trusted).
fn own_image() -> Option<Vec<u8>> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with(VDSO_PATH))?;
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let mem = File::open("/proc/self/mem").ok()?;
    read_image(&mem, 0, start, end).ok()
}

/// The image of process `pid`'s `[vdso]` mapping `[start, end)` in a
/// sealed memory file of its own (not kept: for a caller that opens one
/// mapping, as the symbolizer does).
pub fn open_process_image(pid: i32, start: u64, end: u64) -> Result<File, VdsoError> {
    let bytes = read_process_image(pid, start, end)?;
    let memory_file = |cause| VdsoError::MemoryFile { pid, cause };
    reopen(&sealed_memory_file(&bytes).map_err(memory_file)?).map_err(memory_file)
}

/// One distinct image: its bytes, its id, the sealed memory file that
/// holds them (device and inode), and whether they are the kernel's.
#[derive(Debug)]
struct Image {
    bytes: Vec<u8>,
    id: FileId128,
    file: File,
    key: (u64, u64),
    trusted: bool,
}

/// A vDSO image as a file: what the host's identification of a mapping
/// gives for any other file.
#[derive(Debug)]
pub struct VdsoFile {
    pub id: FileId128,
    /// A descriptor of the image's memory file, the caller's to close.
    pub file: File,
    /// Whether the image is the kernel's (see the module documentation).
    pub trusted: bool,
}

/// The distinct vDSO images seen, each in one memory file.
#[derive(Debug, Default)]
pub struct VdsoImages {
    images: Vec<Image>,
    made: u64,
    /// The kernel's image (eim's own), read at the first image made.
    kernels: Option<Option<Vec<u8>>>,
}

impl VdsoImages {
    pub fn new() -> Self {
        Self::default()
    }

    /// Images trusted as the kernel's are those equal to `kernels`
    /// (tests; otherwise eim's own vDSO).
    pub fn with_kernel_image(kernels: Option<Vec<u8>>) -> Self {
        Self {
            kernels: Some(kernels),
            ..Self::default()
        }
    }

    /// Whether the memory file with device `dev` and inode `inode` holds
    /// an image kept here that is the kernel's.
    pub fn is_trusted(&self, dev: u64, inode: u64) -> bool {
        self.images
            .iter()
            .any(|i| i.key == (dev, inode) && i.trusted)
    }

    /// The vDSO of process `pid`, mapped at `[start, end)`, as a file.
    pub fn get(&mut self, pid: i32, start: u64, end: u64) -> Result<VdsoFile, VdsoError> {
        let bytes = read_process_image(pid, start, end)?;
        self.file_of(pid, bytes)
    }

    /// The file of an image read from process `pid`: the one kept for
    /// these bytes, or a new one.
    pub fn file_of(&mut self, pid: i32, bytes: Vec<u8>) -> Result<VdsoFile, VdsoError> {
        let memory_file = |cause| VdsoError::MemoryFile { pid, cause };
        let index = match self.images.iter().position(|i| i.bytes == bytes) {
            Some(index) => index,
            None => {
                let file = sealed_memory_file(&bytes).map_err(memory_file)?;
                let meta = file.metadata().map_err(memory_file)?;
                let kernels = self.kernels.get_or_insert_with(own_image);
                let trusted = kernels.as_deref() == Some(&bytes[..]);
                if self.images.len() >= MAX_IMAGES {
                    self.images.clear();
                }
                self.made += 1;
                let id = fileid::file_id_of(&bytes);
                tracing::debug!(pid, file_id = %id, size = bytes.len(), trusted, "new vDSO image");
                self.images.push(Image {
                    bytes,
                    id,
                    file,
                    key: (meta.dev(), meta.ino()),
                    trusted,
                });
                self.images.len() - 1
            }
        };
        let image = &self.images[index];
        Ok(VdsoFile {
            id: image.id,
            file: reopen(&image.file).map_err(memory_file)?,
            trusted: image.trusted,
        })
    }

    /// Distinct images made into memory files so far.
    pub fn made(&self) -> u64 {
        self.made
    }
}

/// A new read-only open of memory file `file`, at offset 0 and with an
/// offset of its own (a duplicated descriptor would share the offset, and
/// one reader's sequential read would leave the next at the end).
fn reopen(file: &File) -> io::Result<File> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    File::open(format!("/proc/self/fd/{fd}"))
}

/// A memory file holding `bytes`, sealed so that nothing writes, grows or
/// shrinks it again: what was identified is what is extracted.
fn sealed_memory_file(bytes: &[u8]) -> io::Result<File> {
    const NAME: &CStr = c"eim-vdso";
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let raw =
        unsafe { libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just created, owned by nothing else.
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    file.write_all(bytes)?;
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own; the result is checked.
    if unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::F_ADD_SEALS,
            seals,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory that gives `limit` bytes at most, `chunk` per read, then
    /// what `after` says.
    struct Fake {
        limit: usize,
        chunk: usize,
        after: fn() -> io::Result<usize>,
    }

    impl ReadAt for Fake {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            let at = offset as usize - 0x1000;
            if at >= self.limit {
                return (self.after)();
            }
            let n = buf.len().min(self.chunk).min(self.limit - at);
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = (at + i) as u8;
            }
            Ok(n)
        }
    }

    #[test]
    fn a_whole_image_is_read_in_pieces() {
        let mem = Fake {
            limit: 8192,
            chunk: 1000,
            after: || Ok(0),
        };
        let image = read_image(&mem, 7, 0x1000, 0x3000).expect("read");
        assert_eq!(image.len(), 8192);
        assert!(image.iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    #[test]
    fn a_short_read_is_an_error() {
        let mem = Fake {
            limit: 5000,
            chunk: 4096,
            after: || Ok(0),
        };
        assert!(matches!(
            read_image(&mem, 7, 0x1000, 0x3000),
            Err(VdsoError::Short {
                pid: 7,
                got: 5000,
                size: 8192
            })
        ));
    }

    #[test]
    fn a_process_gone_while_read_has_vanished() {
        let mem = Fake {
            limit: 4096,
            chunk: 4096,
            after: || Err(io::Error::from_raw_os_error(libc::ESRCH)),
        };
        assert!(matches!(
            read_image(&mem, 7, 0x1000, 0x3000),
            Err(VdsoError::Vanished { pid: 7 })
        ));
        let io = Fake {
            limit: 0,
            chunk: 4096,
            after: || Err(io::Error::from_raw_os_error(libc::EIO)),
        };
        assert!(matches!(
            read_image(&io, 7, 0x1000, 0x3000),
            Err(VdsoError::Io { pid: 7, .. })
        ));
        // A process that does not exist (pid_max is at most 2^22).
        let pid = (1 << 22) + 1;
        assert!(matches!(
            read_process_image(pid, 0x1000, 0x3000),
            Err(VdsoError::Vanished { pid: p }) if p == pid
        ));
    }

    #[test]
    fn a_mapping_over_the_bound_is_not_read() {
        let mem = Fake {
            limit: usize::MAX,
            chunk: 4096,
            after: || panic!("never read"),
        };
        let end = 0x1000 + MAX_VDSO_BYTES + 1;
        assert!(matches!(
            read_image(&mem, 7, 0x1000, end),
            Err(VdsoError::TooLarge { size, .. }) if size == MAX_VDSO_BYTES + 1
        ));
        // An inverted range reads nothing.
        assert_eq!(
            read_image(&mem, 7, 0x3000, 0x1000).expect("empty"),
            Vec::<u8>::new()
        );
    }

    /// The `[vdso]` mapping of process `pid`, from its maps.
    fn vdso_of(pid: u32) -> (u64, u64) {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
        let line = maps
            .lines()
            .find(|l| l.ends_with(VDSO_PATH))
            .expect("a [vdso] mapping");
        let range = line.split_whitespace().next().expect("range");
        let (a, b) = range.split_once('-').expect("start-end");
        (
            u64::from_str_radix(a, 16).expect("start"),
            u64::from_str_radix(b, 16).expect("end"),
        )
    }

    #[test]
    fn the_vdso_of_every_process_is_one_file() {
        let me = std::process::id() as i32;
        let (start, end) = vdso_of(std::process::id());
        let mut images = VdsoImages::new();
        let first = images.get(me, start, end).expect("own vDSO");
        let image = read_process_image(me, start, end).expect("read");
        assert_eq!(&image[..4], b"\x7fELF");
        assert_eq!(first.id, fileid::file_id_of(&image));
        // Another process of this kernel (its vDSO at another address).
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("10")
            .spawn()
            .expect("sleep");
        // Spawned with vfork, the parent runs again before the kernel has
        // mapped the new image's vDSO: wait for it (2 s at most).
        for _ in 0..200 {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id()));
            if maps.is_ok_and(|m| m.contains(VDSO_PATH)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let (cs, ce) = vdso_of(child.id());
        let second = images.get(child.id() as i32, cs, ce).expect("child's vDSO");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(second.id, first.id);
        let inode = |f: &VdsoFile| f.file.metadata().expect("stat").ino();
        assert_eq!(inode(&second), inode(&first));
        assert_eq!(images.made(), 1);
        // Both are the kernel's image: eim's own.
        assert!(first.trusted && second.trusted);
        // The memory file holds the image, each descriptor read as a stream
        // from the start, and refuses writes.
        for file in [&first.file, &second.file] {
            let mut back = Vec::new();
            std::io::Read::read_to_end(&mut &*file, &mut back).expect("read back");
            assert_eq!(back, image);
        }
        assert!(FileExt::write_at(&second.file, b"x", 0).is_err());
        // Other bytes are another image, with another id.
        let mut other = image.clone();
        other[100] ^= 0xff;
        let third = images.file_of(me, other).expect("kept");
        assert_ne!(third.id, first.id);
        assert_ne!(inode(&third), inode(&first));
        assert_eq!(images.made(), 2);
        // A process's edited copy is not the kernel's.
        assert!(!third.trusted);
        let meta = |f: &VdsoFile| f.file.metadata().expect("stat");
        assert!(images.is_trusted(meta(&first).dev(), meta(&first).ino()));
        assert!(!images.is_trusted(meta(&third).dev(), meta(&third).ino()));
    }

    #[test]
    fn only_the_kernels_image_is_trusted() {
        // Whatever eim's own vDSO is, an image equal to the one given as
        // the kernel's is trusted, any other is not, and with no kernel
        // image none is.
        let kernels = b"\x7fELF kernel".to_vec();
        let mut images = VdsoImages::with_kernel_image(Some(kernels.clone()));
        assert!(images.file_of(1, kernels.clone()).expect("kept").trusted);
        assert!(
            !images
                .file_of(1, b"\x7fELF other".to_vec())
                .expect("kept")
                .trusted
        );
        let mut none = VdsoImages::with_kernel_image(None);
        assert!(!none.file_of(1, kernels).expect("kept").trusted);
    }

    #[test]
    fn an_opened_image_is_the_processs() {
        let me = std::process::id() as i32;
        let (start, end) = vdso_of(std::process::id());
        let file = open_process_image(me, start, end).expect("opened");
        let image = read_process_image(me, start, end).expect("read");
        // Read as a stream (the symbolizer's way): from its first byte.
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut back).expect("read back");
        assert_eq!(back, image);
        assert!(matches!(
            open_process_image((1 << 22) + 1, start, end),
            Err(VdsoError::Vanished { .. })
        ));
    }
}
