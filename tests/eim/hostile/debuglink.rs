//! Issue 28, item 1: a user's `.gnu_debuglink` cannot make root open a
//! file. A process of `nobody` maps a tiny ELF file without stack deltas
//! whose debug link names `shadowlink`, with the CRC-32 of the link's
//! target, beside `shadowlink -> TARGET` (the link `nobody`'s). Whatever
//! TARGET is (a root-only file, a FIFO, a device node), `eim scan` as root
//! never opens it (fanotify `FAN_OPEN` on the target, by process), and the
//! scan succeeds for the rest.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use eim_test_support::elf;

use crate::support::{eim_bin, root_or_skip};

const NOBODY: u32 = 65534;

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("path")
}

fn chown(path: &Path, uid: u32) {
    // SAFETY: a valid path; the result is checked.
    let rc = unsafe { libc::lchown(c(path).as_ptr(), uid, uid) };
    assert_eq!(
        rc,
        0,
        "chown {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// A 64-bit x86-64 ELF file with no code and no unwind data, only a
/// `.gnu_debuglink` naming `name` with CRC `crc`.
fn elf_linking_to(name: &str, crc: u32) -> Vec<u8> {
    let mut link = name.as_bytes().to_vec();
    link.push(0);
    while !link.len().is_multiple_of(4) {
        link.push(0);
    }
    link.extend_from_slice(&crc.to_le_bytes());
    elf::with_sections(
        elf::EM_X86_64,
        &[(".gnu_debuglink", elf::SHT_PROGBITS, &link)],
    )
}

/// A process (of `nobody`, or of the test's user) that maps `path` read
/// and execute and waits; killed when dropped.
pub(crate) struct Mapper(pub(crate) libc::pid_t);

impl Mapper {
    fn spawn(path: &Path) -> Self {
        Self::spawn_as(path, Some(NOBODY))
    }

    pub(crate) fn spawn_as(path: &Path, uid: Option<u32>) -> Self {
        let path = c(path);
        let mut fds = [0; 2];
        // SAFETY: a valid array of two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the child makes only async-signal-safe calls, then exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: async-signal-safe calls on memory prepared before fork.
            unsafe {
                let ok = match uid {
                    Some(uid) => {
                        libc::setgroups(0, std::ptr::null()) == 0
                            && libc::setgid(uid) == 0
                            && libc::setuid(uid) == 0
                    }
                    None => true,
                };
                let fd = if ok {
                    libc::open(path.as_ptr(), libc::O_RDONLY)
                } else {
                    -1
                };
                let at = if fd >= 0 {
                    libc::mmap(
                        std::ptr::null_mut(),
                        4096,
                        libc::PROT_READ | libc::PROT_EXEC,
                        libc::MAP_PRIVATE,
                        fd,
                        0,
                    )
                } else {
                    libc::MAP_FAILED
                };
                let said: u8 = if at == libc::MAP_FAILED { b'f' } else { b'r' };
                libc::write(fds[1], (&said as *const u8).cast(), 1);
                loop {
                    libc::pause();
                }
            }
        }
        // SAFETY: our end of the pipe, closed once.
        unsafe { libc::close(fds[1]) };
        // SAFETY: the read end is ours.
        let read_end = unsafe { OwnedFd::from_raw_fd(fds[0]) };
        let mut said = [0u8; 1];
        // SAFETY: a valid descriptor and buffer.
        let n = unsafe { libc::read(read_end.as_raw_fd(), said.as_mut_ptr().cast(), 1) };
        let mapper = Self(pid);
        assert_eq!((n, said[0]), (1, b'r'), "nobody could not map the file");
        mapper
    }
}

impl Drop for Mapper {
    fn drop(&mut self) {
        // SAFETY: our child, killed and reaped once.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// A fanotify mark on one file that records which processes open it
/// (`FAN_OPEN`, reported by file id: no descriptor of the file is opened
/// for the event, which for a FIFO could block). By process, because
/// another eim on the same host (an older build's whole-host `watch`) sees
/// the test's process too, and follows its link.
struct OpenWatch(OwnedFd);

impl OpenWatch {
    fn new(path: &Path) -> Self {
        // SAFETY: plain syscalls, results checked.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF
                    | libc::FAN_REPORT_FID
                    | libc::FAN_NONBLOCK
                    | libc::FAN_CLOEXEC,
                libc::O_RDONLY as libc::c_uint,
            )
        };
        assert!(
            fd >= 0,
            "fanotify_init: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a valid descriptor and path.
        let rc = unsafe {
            libc::fanotify_mark(
                fd.as_raw_fd(),
                libc::FAN_MARK_ADD,
                libc::FAN_OPEN,
                libc::AT_FDCWD,
                c(path).as_ptr(),
            )
        };
        assert_eq!(
            rc,
            0,
            "fanotify_mark {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        Self(fd)
    }

    /// The processes that opened the file since the watch began.
    fn openers(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: a valid descriptor and buffer.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(n) = usize::try_from(n) else { break };
            if n == 0 {
                break;
            }
            // struct fanotify_event_metadata: event_len (u32) at 0, pid
            // (i32) at 20.
            let mut at = 0;
            while at + 24 <= n {
                let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4")) as usize;
                pids.push(i32::from_ne_bytes(
                    buf[at + 20..at + 24].try_into().expect("4"),
                ));
                if len == 0 {
                    break;
                }
                at += len;
            }
        }
        pids
    }
}

/// The CRC-32 `.gnu_debuglink` records (IEEE).
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                0xedb8_8320 ^ (crc >> 1)
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// What a target is made as.
enum Target {
    RootOnlyFile,
    Fifo,
    Device,
}

fn make(target: &Target, path: &Path) -> u32 {
    match target {
        Target::RootOnlyFile => {
            let secret = b"root:$6$secret-hash:19000:0:99999:7:::\n";
            std::fs::write(path, secret).expect("write");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            crc32(secret)
        }
        Target::Fifo => {
            // SAFETY: a valid path.
            assert_eq!(unsafe { libc::mkfifo(c(path).as_ptr(), 0o600) }, 0);
            0
        }
        Target::Device => {
            // A copy of /dev/null: harmless, and its open is seen.
            // SAFETY: a valid path; the result is checked.
            let rc = unsafe {
                libc::mknod(c(path).as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3))
            };
            assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
            0
        }
    }
}

/// `eim scan` of `pid`: whether it succeeded, its pid, stdout, stderr.
fn scan(pid: libc::pid_t, extra: &[&str]) -> (bool, i32, String, String) {
    let child = Command::new(eim_bin())
        .args(["-vv", "scan", "--json", "--pid", &pid.to_string()])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("eim scan runs");
    let scanner = child.id() as i32;
    let out = child.wait_with_output().expect("eim scan ends");
    (
        out.status.success(),
        scanner,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn the_debug_link_never_opens(target: Target, what: &str, through_link: bool) {
    // The user's directory, which nobody owns; the target in root's.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let user = dir.path().join("user");
    let roots = dir.path().join("root-only");
    std::fs::create_dir(&user).expect("mkdir");
    std::fs::create_dir(&roots).expect("mkdir");
    chown(&user, NOBODY);
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let link = user.join("shadowlink");
    let target_path = if through_link {
        roots.join("target")
    } else {
        link.clone()
    };
    let crc = make(&target, &target_path);
    let exe = user.join("exe");
    std::fs::write(&exe, elf_linking_to("shadowlink", crc)).expect("write");
    chown(&exe, NOBODY);
    if through_link {
        std::os::unix::fs::symlink(&target_path, &link).expect("link");
    }
    chown(&link, NOBODY);

    let mapper = Mapper::spawn(&exe);
    let watch = OpenWatch::new(&target_path);
    for extra in [&[][..], &["--no-map-files"][..]] {
        let (ok, scanner, stdout, stderr) = scan(mapper.0, extra);
        assert!(ok, "{what} {extra:?}: eim scan failed:\n{stderr}");
        assert!(
            !watch.openers().contains(&scanner),
            "{what} {extra:?}: eim opened {}\n{stderr}",
            target_path.display()
        );
        // The rest of the scan went on: the user's file itself is loaded.
        let json: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
        let text = json.to_string();
        assert!(text.contains(&exe.display().to_string()), "{what}: {text}");
    }
    drop(mapper);
    std::thread::sleep(Duration::from_millis(10));
}

#[test]
fn a_users_debug_link_to_a_root_only_file_never_opens_it() {
    if root_or_skip("a_users_debug_link_to_a_root_only_file_never_opens_it") {
        the_debug_link_never_opens(Target::RootOnlyFile, "a root-only file", true);
    }
}

#[test]
fn a_users_debug_link_to_a_fifo_never_opens_it() {
    if root_or_skip("a_users_debug_link_to_a_fifo_never_opens_it") {
        the_debug_link_never_opens(Target::Fifo, "a FIFO", true);
    }
}

#[test]
fn a_users_debug_link_to_a_device_never_opens_it() {
    if root_or_skip("a_users_debug_link_to_a_device_never_opens_it") {
        the_debug_link_never_opens(Target::Device, "a device", true);
    }
}

/// Without a link: the debug name itself is a FIFO or a device node (the
/// user's FIFO; a device a container's root made): its type is checked on
/// an `O_PATH` descriptor, and it is never opened.
#[test]
fn a_debug_name_that_is_a_fifo_or_a_device_is_never_opened() {
    if root_or_skip("a_debug_name_that_is_a_fifo_or_a_device_is_never_opened") {
        the_debug_link_never_opens(Target::Fifo, "a FIFO itself", false);
        the_debug_link_never_opens(Target::Device, "a device itself", false);
    }
}
