//! Nodes die with the launcher, even when it is killed with SIGKILL.
//!
//! The launcher forks a small watchdog process before it starts any node
//! and tells it, through a pipe, the process group of every node it starts
//! (each node leads a group of its own, with whatever it starts). The
//! watchdog only reads the pipe. When the launcher ends, however it ends,
//! the kernel closes the pipe's write end; the watchdog then kills every
//! group it still watches with SIGKILL and exits. It sits in a process group
//! of its own and ignores the stop signals, so Ctrl-C or a signal to the
//! launcher's group does not take it first.
//!
//! The launcher forgets a group once its node has exited and the group's
//! leftover processes were killed ([`Watchdog::forget`]), so a group id the
//! kernel may hand out again is never signalled.
//!
//! A parent-death signal (`PR_SET_PDEATHSIG`, set on every node as a second
//! line) would stop the node itself but not its children, and fires when the
//! *thread* that forked the node ends, not the process.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// At most this many groups are watched at once (the watchdog cannot
/// allocate once forked; the launcher checks before it starts a node).
pub const CAPACITY: usize = 16_384;

/// A message on the pipe: `+` or `-`, then the group id (native order).
const MESSAGE: usize = 5;

/// The launcher's end of the watchdog (see the module docs).
pub struct Watchdog {
    pipe: Option<OwnedFd>,
    pid: libc::pid_t,
    watched: usize,
}

impl Watchdog {
    /// Forks the watchdog.
    pub fn start() -> io::Result<Watchdog> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors that we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just opened and are owned here alone.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // Allocated before the fork: the child must not allocate.
        let mut groups: Vec<libc::pid_t> = Vec::with_capacity(CAPACITY);
        // SAFETY: fork(2); the child runs only async-signal-safe calls and
        // never returns (see `watch`).
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                // SAFETY: in the forked child, as `watch` requires.
                unsafe { watch(read.as_raw_fd(), &mut groups) }
            }
            pid => {
                drop(read);
                Ok(Watchdog {
                    pipe: Some(write),
                    pid,
                    watched: 0,
                })
            }
        }
    }

    /// Whether another group can be watched.
    pub fn has_room(&self) -> bool {
        self.watched < CAPACITY
    }

    /// Watch process group `group` (a node just started).
    pub fn watch(&mut self, group: u32) {
        self.watched += 1;
        self.send(b'+', group);
    }

    /// Stop watching `group` (its node exited and its leftovers were killed).
    pub fn forget(&mut self, group: u32) {
        self.watched = self.watched.saturating_sub(1);
        self.send(b'-', group);
    }

    fn send(&self, op: u8, group: u32) {
        let Some(pipe) = &self.pipe else { return };
        let mut message = [op, 0, 0, 0, 0];
        message[1..].copy_from_slice(&group.to_ne_bytes());
        // SAFETY: write(2) of a 5-byte buffer on our descriptor; a write of
        // at most PIPE_BUF bytes to a pipe is atomic.
        unsafe {
            libc::write(pipe.as_raw_fd(), message.as_ptr().cast(), MESSAGE);
        }
    }
}

impl Drop for Watchdog {
    /// Closes the pipe (the watchdog kills what it still watches and exits)
    /// and reaps the watchdog.
    fn drop(&mut self) {
        self.pipe = None;
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child.
        unsafe {
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}

/// The watchdog process: reads `+group`/`-group` messages from `read` into
/// `groups` (within its capacity) until the pipe closes, then kills every
/// group left and exits.
///
/// # Safety
/// Only in the child of a fork: it calls nothing but async-signal-safe
/// functions, allocates nothing (`groups` has its capacity already) and
/// never returns.
unsafe fn watch(read: libc::c_int, groups: &mut Vec<libc::pid_t>) -> ! {
    // SAFETY (whole body): async-signal-safe calls on descriptors and
    // memory of this process only.
    unsafe {
        // Out of the launcher's group and deaf to the stop signals.
        libc::setpgid(0, 0);
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Keep only the pipe (as descriptor 3) and /dev/null as stdio, so
        // the watchdog holds none of the launcher's sockets or pipes (a
        // reader of the launcher's output sees its end when it ends).
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
        }
        let read = if read == 3 { read } else { libc::dup2(read, 3) };
        if libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0 {
            for fd in 4..4096 {
                libc::close(fd);
            }
        }
        let mut message = [0u8; MESSAGE];
        let mut have = 0;
        loop {
            let n = libc::read(read, message[have..].as_mut_ptr().cast(), MESSAGE - have);
            if n == 0 {
                break;
            }
            if n < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                break;
            }
            have += n as usize;
            if have < MESSAGE {
                continue;
            }
            have = 0;
            let group =
                libc::pid_t::from_ne_bytes([message[1], message[2], message[3], message[4]]);
            match message[0] {
                b'+' if groups.len() < groups.capacity() && group > 0 => groups.push(group),
                b'-' => {
                    if let Some(i) = groups.iter().position(|&g| g == group) {
                        groups.swap_remove(i);
                    }
                }
                _ => {}
            }
        }
        for &group in groups.iter() {
            libc::kill(-group, libc::SIGKILL);
        }
        libc::_exit(0)
    }
}
