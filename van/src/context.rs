//! The ZeroMQ context of a node, sized for its job, and the process's
//! descriptor limit.
//!
//! A ZeroMQ context holds 1 023 sockets unless told otherwise
//! (`ZMQ_MAX_SOCKETS`), and every socket costs two file descriptors (the
//! bundled libzmq wakes a socket's mailbox through a socket pair) besides
//! its connections. The scheduler holds a DEALER per node, each watched by
//! a socket monitor (a pair of sockets: ZeroMQ's stable API has no monitor
//! shared between sockets), so a job of a few hundred nodes ran out of
//! sockets: the scheduler logged "Too many open files" and every node
//! waited for its start timeout. Here the context's limit follows the job
//! ([`needed_descriptors`]), the soft `RLIMIT_NOFILE` is raised towards the
//! hard one when the job needs more than it allows (logged), and a
//! connection that still cannot be opened fails the node with
//! [`Failure::Resources`](crate::Failure::Resources), naming the limit to
//! raise.
//!
//! Running out inside ZeroMQ's I/O thread is worse than running out here:
//! a TCP connection it cannot open is retried silently (its messages wait),
//! and libzmq 4.3.4 aborts the process when it cannot accept a connection
//! on an `ipc://` listener (`ipc_listener.cpp`: `EMFILE` is not among the
//! errors it expects). So the estimate errs high, and the limit is raised
//! to twice it.
//!
//! The `zmq` crate cannot set a context option other than its I/O threads,
//! so [`Context`] owns the libzmq context itself and hands out
//! [`Socket`]s that keep it alive, as the crate's own sockets do (a context
//! terminates only once its last socket is closed).

use std::ops::{Deref, DerefMut};
use std::os::raw::c_void;
use std::sync::Arc;

use pslite_proto::Role;

use crate::VanConfig;
use crate::VanError;

/// ZeroMQ's default `ZMQ_MAX_SOCKETS`: a context never gets fewer.
pub const DEFAULT_MAX_SOCKETS: u64 = 1023;

/// Descriptors a node needs besides its peers' (the ROUTER, the wake-up
/// sockets, the monitor and auth threads, logs, the metrics endpoint, the
/// shared-memory path's first segments).
const BASE_DESCRIPTORS: u64 = 128;

/// Descriptors of one ZeroMQ socket (its mailbox's socket pair).
const PER_SOCKET: u64 = 2;

/// A DEALER watched by a socket monitor: three sockets.
const WATCHED_DEALER: u64 = 3 * PER_SOCKET;

/// Registration checks the scheduler runs at once (see
/// `crate::registration`), each a watched DEALER and its connection.
const CHECK_DESCRIPTORS: u64 = (WATCHED_DEALER + 1) * pslite_van_core::MAX_CHECKS as u64;

/// The descriptors a node of the job `config` describes may need at once
/// (measured: a scheduler of 1+250+250 held 4 036, 8 per node):
///
/// - the scheduler, per node: a watched DEALER (6), the connection it
///   opens and the one the node opens to it (2), plus the registration
///   checks under way;
/// - a server or worker, per peer it may talk to (every node of the job:
///   workers reach servers, servers reach workers and, with replicated key
///   ranges, servers): a DEALER (2), its connection and the peer's
///   connection to it (2); only its connection to the scheduler is watched.
///
/// Elastic jobs count their MAX.
pub fn needed_descriptors(config: &VanConfig) -> u64 {
    let nodes = config.num_servers.max(0) as u64 + config.num_workers.max(0) as u64;
    match config.role {
        Role::Scheduler => {
            (WATCHED_DEALER + 2) * (nodes + 1) + CHECK_DESCRIPTORS + BASE_DESCRIPTORS
        }
        _ => (PER_SOCKET + 2) * (nodes + 1) + WATCHED_DEALER + BASE_DESCRIPTORS,
    }
}

/// The sockets the ZeroMQ context of such a node may need: half its
/// descriptors (each socket takes two), which bounds them anyway.
pub fn needed_sockets(config: &VanConfig) -> u64 {
    needed_descriptors(config) / PER_SOCKET
}

/// The process's descriptor limits (`RLIMIT_NOFILE`): soft and hard, `None`
/// for unlimited.
fn descriptor_limits() -> Option<(Option<u64>, Option<u64>)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `limit` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    let finite = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    Some((finite(limit.rlim_cur), finite(limit.rlim_max)))
}

/// The soft descriptor limit (`ulimit -n`), `None` if unlimited or unknown.
pub fn descriptor_limit() -> Option<u64> {
    descriptor_limits().and_then(|(soft, _)| soft)
}

/// What [`fit_descriptor_limit`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DescriptorFit {
    /// The soft limit already allows the job.
    Enough,
    /// The soft limit was raised from `from` to `to`.
    Raised {
        /// The soft limit before.
        from: u64,
        /// The soft limit now.
        to: u64,
    },
    /// The hard limit is below what the job may need: the soft limit was
    /// raised to it (`raised`), and the node may run out of descriptors.
    Short {
        /// The soft limit now.
        limit: u64,
        /// Whether it was raised.
        raised: bool,
    },
}

/// Raises the soft `RLIMIT_NOFILE` towards `need` (twice it, for margin),
/// never above the hard limit; a process that may already open `need`
/// descriptors is left alone.
pub fn fit_descriptor_limit(need: u64) -> DescriptorFit {
    let Some((Some(soft), hard)) = descriptor_limits() else {
        return DescriptorFit::Enough; // unlimited, or unknown
    };
    if soft >= need {
        return DescriptorFit::Enough;
    }
    let want = need.saturating_mul(2);
    let to = hard.map_or(want, |hard| want.min(hard));
    let raised = to > soft && set_soft_limit(to);
    let limit = if raised { to } else { soft };
    if limit >= need {
        DescriptorFit::Raised { from: soft, to }
    } else {
        DescriptorFit::Short { limit, raised }
    }
}

fn set_soft_limit(to: u64) -> bool {
    let Some((_, hard)) = descriptor_limits() else {
        return false;
    };
    let limit = libc::rlimit {
        rlim_cur: to as libc::rlim_t,
        rlim_max: hard.map_or(libc::RLIM_INFINITY, |h| h as libc::rlim_t),
    };
    // SAFETY: setrlimit reads one rlimit, which `limit` is.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 }
}

/// Whether a ZeroMQ error means the process or the system ran out of
/// something a limit bounds (descriptors, sockets of the context, memory),
/// rather than a bad address or a closed context.
pub fn is_exhaustion(e: zmq::Error) -> bool {
    matches!(
        e,
        zmq::Error::EMFILE | zmq::Error::ENOMEM | zmq::Error::ENOBUFS
    )
}

/// What to raise when opening a connection failed for want of `e`: the line
/// a node fails with.
pub fn exhaustion_advice(e: zmq::Error, max_sockets: u64) -> String {
    if matches!(e, zmq::Error::ENOMEM | zmq::Error::ENOBUFS) {
        return format!("{e}: the machine is out of memory for sockets");
    }
    let limit = descriptor_limit().map_or_else(|| "unlimited".to_string(), |l| l.to_string());
    format!(
        "{e}: this process may open {limit} file descriptors (ulimit -n; raise the hard limit: \
         `ulimit -Hn`, LimitNOFILE= in systemd, --ulimit nofile= in Docker; or the system's \
         fs.file-max is reached) and its ZeroMQ context {max_sockets} sockets (sized for the \
         job's DMLC_NUM_SERVER and DMLC_NUM_WORKER)"
    )
}

/// libzmq's last error as a `zmq::Error`, without the `zmq` crate's panic on
/// numbers it does not know: a socket that cannot get an eventfd fails with
/// `ENFILE` when the system's table is full (read here as `EMFILE`).
fn last_error() -> zmq::Error {
    // SAFETY: no preconditions.
    let raw = unsafe { zmq_sys::zmq_errno() };
    match raw {
        libc::EMFILE | libc::ENFILE => zmq::Error::EMFILE,
        libc::ENOMEM => zmq::Error::ENOMEM,
        libc::ENOBUFS => zmq::Error::ENOBUFS,
        libc::EFAULT => zmq::Error::EFAULT,
        libc::EINTR => zmq::Error::EINTR,
        x if x == zmq::Error::ETERM.to_raw() => zmq::Error::ETERM,
        _ => zmq::Error::EINVAL,
    }
}

/// A libzmq context (see the module docs).
#[derive(Clone)]
pub struct Context {
    raw: Arc<RawContext>,
    max_sockets: u64,
}

struct RawContext(*mut c_void);

// SAFETY: a libzmq context is thread-safe (its API may be called from any
// thread); the pointer is only passed to libzmq.
unsafe impl Send for RawContext {}
// SAFETY: as above.
unsafe impl Sync for RawContext {}

impl Drop for RawContext {
    fn drop(&mut self) {
        // SAFETY: the context is live until this call; it blocks until
        // every socket of the context is closed (none is left: each keeps
        // an `Arc` of this), and is retried if a signal interrupts it.
        while unsafe { zmq_sys::zmq_ctx_term(self.0) } != 0 {
            // SAFETY: no preconditions.
            if unsafe { zmq_sys::zmq_errno() } != libc::EINTR {
                break;
            }
        }
    }
}

impl Context {
    /// A context that holds up to `max_sockets` sockets (at least
    /// ZeroMQ's default, 1 023).
    pub fn new(max_sockets: u64) -> Result<Context, VanError> {
        // SAFETY: no preconditions; NULL on failure.
        let ctx = unsafe { zmq_sys::zmq_ctx_new() };
        if ctx.is_null() {
            return Err(VanError::Setup {
                what: "create the ZeroMQ context",
                detail: std::io::Error::last_os_error().to_string(),
            });
        }
        let raw = RawContext(ctx);
        let max_sockets = max_sockets.max(DEFAULT_MAX_SOCKETS).min(i32::MAX as u64);
        // SAFETY: `ctx` is live; ZMQ_MAX_SOCKETS takes an int, set before
        // the first socket.
        let r =
            unsafe { zmq_sys::zmq_ctx_set(ctx, zmq_sys::ZMQ_MAX_SOCKETS as _, max_sockets as i32) };
        if r != 0 {
            return Err(VanError::Setup {
                what: "size the ZeroMQ context (ZMQ_MAX_SOCKETS)",
                detail: last_error().to_string(),
            });
        }
        Ok(Context {
            raw: Arc::new(raw),
            max_sockets,
        })
    }

    /// The most sockets this context holds.
    pub fn max_sockets(&self) -> u64 {
        self.max_sockets
    }

    /// A new socket, keeping the context alive while it lives.
    pub fn socket(&self, kind: zmq::SocketType) -> zmq::Result<Socket> {
        Ok(Socket {
            socket: self.detached(kind)?,
            _context: Arc::clone(&self.raw),
        })
    }

    /// A new socket that does not keep the context alive: once the last
    /// [`Context`] and [`Socket`] are dropped, calls on it fail with
    /// `ETERM` (for the threads that poll until then).
    pub fn detached(&self, kind: zmq::SocketType) -> zmq::Result<zmq::Socket> {
        // SAFETY: the context is live (`self` holds it).
        let sock = unsafe { zmq_sys::zmq_socket(self.raw.0, socket_type(kind)) };
        if sock.is_null() {
            return Err(last_error());
        }
        // SAFETY: `sock` is a socket just created, owned by nothing else.
        Ok(unsafe { zmq::Socket::from_raw(sock) })
    }
}

/// libzmq's number of a socket type.
fn socket_type(kind: zmq::SocketType) -> i32 {
    use zmq::SocketType as T;
    match kind {
        T::PAIR => zmq_sys::ZMQ_PAIR as i32,
        T::PUB => zmq_sys::ZMQ_PUB as i32,
        T::SUB => zmq_sys::ZMQ_SUB as i32,
        T::REQ => zmq_sys::ZMQ_REQ as i32,
        T::REP => zmq_sys::ZMQ_REP as i32,
        T::DEALER => zmq_sys::ZMQ_DEALER as i32,
        T::ROUTER => zmq_sys::ZMQ_ROUTER as i32,
        T::PULL => zmq_sys::ZMQ_PULL as i32,
        T::PUSH => zmq_sys::ZMQ_PUSH as i32,
        T::XPUB => zmq_sys::ZMQ_XPUB as i32,
        T::XSUB => zmq_sys::ZMQ_XSUB as i32,
        T::STREAM => zmq_sys::ZMQ_STREAM as i32,
    }
}

/// A socket of a [`Context`], which it keeps alive; it is a `zmq::Socket`
/// for everything else.
pub struct Socket {
    // Dropped before the context: fields drop in order.
    socket: zmq::Socket,
    _context: Arc<RawContext>,
}

impl Deref for Socket {
    type Target = zmq::Socket;
    fn deref(&self) -> &zmq::Socket {
        &self.socket
    }
}

impl DerefMut for Socket {
    fn deref_mut(&mut self) -> &mut zmq::Socket {
        &mut self.socket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_holds_as_many_sockets_as_it_is_sized_for() {
        // Each socket takes a descriptor: the context's limit must be what
        // stops here, not the process's.
        if let DescriptorFit::Short { limit, .. } =
            fit_descriptor_limit(2 * DEFAULT_MAX_SOCKETS + 500)
        {
            eprintln!("skipped: this process may open only {limit} descriptors");
            return;
        }
        let ctx = Context::new(DEFAULT_MAX_SOCKETS + 500).unwrap();
        let mut sockets = Vec::new();
        let failed = loop {
            match ctx.socket(zmq::DEALER) {
                Ok(s) => sockets.push(s),
                Err(e) => break e,
            }
            if sockets.len() > 2000 {
                panic!("more sockets than the context was sized for");
            }
        };
        assert!(sockets.len() >= 1500, "{} sockets", sockets.len());
        assert!(is_exhaustion(failed), "{failed}");
        assert!(exhaustion_advice(failed, ctx.max_sockets()).contains("ulimit -n"));
        // The sockets keep the context alive: dropping it first is fine.
        drop(ctx);
        let (a, b) = (sockets.pop().unwrap(), sockets.pop().unwrap());
        a.bind("inproc://pslite-context-test").unwrap();
        b.connect("inproc://pslite-context-test").unwrap();
        b.send(&b"x"[..], 0).unwrap();
        assert_eq!(a.recv_bytes(0).unwrap(), b"x");
    }

    #[test]
    fn the_scheduler_needs_more_than_the_others_and_both_follow_the_job() {
        let cfg = |role, n| VanConfig::local(role, n, n, 9091);
        let s = needed_descriptors(&cfg(Role::Scheduler, 500));
        let w = needed_descriptors(&cfg(Role::Worker, 500));
        assert!(s > 8 * 1000 && w > 4 * 1000 && s > w, "{s} {w}");
        assert!(needed_descriptors(&cfg(Role::Scheduler, 1)) < 2000);
    }

    #[test]
    fn a_limit_that_allows_the_job_is_left_alone() {
        assert_eq!(fit_descriptor_limit(16), DescriptorFit::Enough);
    }
}
