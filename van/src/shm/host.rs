//! Which processes can share memory: this process's host identity, and
//! whether another process can be reached (or is gone).

use super::mapping::MAGIC;
use super::ShmError;

/// This process's host identity: equal for two processes iff each can map
/// the other's segments. It is a 64-bit FNV-1a digest (16 hex digits, so
/// that node tables stay small at hundreds of nodes) of the boot id, the
/// effective uid, the network, pid, mount, user and IPC namespaces, and the
/// segment layout (nodes of builds with another layout count as another
/// host and keep ZeroMQ). `Err` says why shared memory is off.
pub fn host_identity() -> Result<String, ShmError> {
    let read_err = |path: &str| {
        let path = path.to_string();
        move |source| ShmError::HostIdentity { path, source }
    };
    let boot_path = "/proc/sys/kernel/random/boot_id";
    let boot = std::fs::read_to_string(boot_path).map_err(read_err(boot_path))?;
    let mut id = boot.trim().to_string();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    id += &format!("/uid{uid}");
    for ns in ["net", "pid", "mnt", "user", "ipc"] {
        let path = format!("/proc/self/ns/{ns}");
        let link = std::fs::read_link(&path).map_err(read_err(&path))?;
        id += "/";
        id += &link.to_string_lossy();
    }
    id += &format!("/layout{MAGIC:x}");
    log::debug!("shared memory: host identity {id}");
    Ok(format!("{:016x}", fnv1a(id.as_bytes())))
}

/// 64-bit FNV-1a (stable across builds and platforms).
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether this process may open `pid`'s file descriptors (the test a peer's
/// receiver will face on ours: same user, not hidden by `/proc` options).
pub fn can_reach(pid: u32) -> bool {
    pid != 0 && std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok()
}

/// Whether process `pid` is gone.
pub(super) fn is_gone(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Whether process `pid` has exited: gone, or a zombie its parent has not
/// reaped yet (its descriptors are closed either way).
pub fn has_exited(pid: u32) -> bool {
    if is_gone(pid) {
        return true;
    }
    // /proc/<pid>/stat: "pid (comm) S ...", the state after the last ')'.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

/// This process's soft limit on open file descriptors (`RLIMIT_NOFILE`,
/// `ulimit -n`), or `None` if it cannot be read or is unlimited.
pub(super) fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `limit` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}
