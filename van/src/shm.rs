//! The shared-memory data path between pslite nodes of one host.
//!
//! Two pslite nodes share a host when their [`host_identity`] strings are
//! equal: the same boot, the same user and the same network, pid, mount,
//! user and IPC namespaces (nodes in separate network namespaces count as
//! separate hosts, as the multi-host tests want). Each node advertises it in
//! its node-table entry (`PBNode.host`, with `PBNode.pid`) unless
//! `PS_SHM=0`; C++ nodes send neither, so they never see shared memory.
//! Which peers qualify is the core's decision (`Core::shm_peer`); this
//! module moves the bytes.
//!
//! The parts, one file each:
//! - `host.rs`: the host identity, and whether a process may be reached.
//! - `mapping.rs`: one segment mapped, its header read and written with
//!   atomic accesses only (another process writes it too).
//! - `slot.rs`: the slot protocol: who counts what in a segment's header.
//! - `segment.rs`: one segment of a sender: its memfd, what its data area
//!   holds (a frame kept to send again) and its receivers' slots.
//! - `pool.rs`: a sender's segments ([`Pool`]), a message's frames staged
//!   into them ([`Pool::stage`]), the bounds on memory and descriptors.
//! - `receiver.rs`: a receiver's mappings of its peers' segments
//!   ([`Receiver`]) and the descriptor checks.
//! - `track.rs`: the process-wide registries of live buffers
//!   ([`Tracked`]) and of mapped peer segments.
//!
//! **Segments.** A sender keeps a [`Pool`] of segments, each an anonymous
//! `memfd` (named `pslite-shm-<pid>-<n>`, nothing in `/dev/shm`) holding a
//! 4 KiB header and one data area. A data frame of at least [`MIN_FRAME`]
//! bytes to a same-host peer is copied into a free segment (one copy) and
//! the ZeroMQ message carries an empty frame in its place plus a descriptor
//! (`PBMeta.shm`: fd number, token, generation, offset, length). Segments
//! are created on first need (per power-of-two size class) and reused;
//! their pages stay mapped, so a reused segment costs no page faults. A pool
//! holds at most [`DEFAULT_POOL_BYTES`] and at most a quarter of the
//! process's file descriptors (`RLIMIT_NOFILE`) in segments, a peer at most
//! half of those; when none is free the frame goes over ZeroMQ as before:
//! sending never waits for memory, and running out of descriptors never
//! loses a frame.
//!
//! **Send once.** `Bytes` are immutable, so a frame sent again (the same
//! address and length, the buffer alive since) holds the same bytes: the
//! pool remembers which segment holds a copy of which frame and sends such
//! a frame again, to any same-host peer, as a descriptor only (ps-lite
//! programs push the same key arrays every step). It knows the buffer lives
//! when the buffer is a [`Tracked`] (every large `SArray` is one: it
//! registers itself when made and unregisters before its memory is freed),
//! or else by holding a clone of the frame (let go when it is the last one,
//! after [`HELD_IDLE`] unused, or when the pool needs room). A segment's
//! content is overwritten only when its frame is gone and no receiver holds
//! or is about to claim it.
//!
//! **Slots.** Several receivers may hold one content at once: the header
//! has a slot per receiving process (its pid, written by the sender, and a
//! word counting, for the content's generation, descriptors sent but not
//! claimed and views held). The sender counts a descriptor before it
//! leaves; the receiver finds the slot with its own pid and claims by a
//! compare-and-swap (the generation must match and a descriptor must be
//! outstanding, so a replayed or stale descriptor fails); dropping the last
//! reference to the frame releases the claim by another compare-and-swap.
//!
//! **Receiving.** The receiver opens the segment once through
//! `/proc/<pid>/fd/<fd>` (the pid from the sender's node-table entry, never
//! from the descriptor), checks the link names a `pslite-shm-` memfd, maps
//! it, checks the header's magic, token and size, and keeps the mapping
//! (the descriptor it opened is closed at once). Each descriptor is then
//! checked (bounds, slot, generation) and claimed; the frame becomes a
//! [`bytes::Bytes`] over the mapping (zero copies: the app's `SArray` reads the
//! segment in place). A descriptor that fails any check is a [`ShmError`]:
//! the van drops the message with a log line and counts it; nothing is read
//! out of bounds. A receiver short of descriptors or memory
//! ([`ShmError::is_local_shortage`]) is not a bad descriptor: the van keeps
//! the message and tries again.
//!
//! **Crashes.** A memfd lives while a process holds its fd or a mapping of
//! it, so a killed sender's segments vanish once its receivers drop their
//! mappings (the receive loop forgets mappings of dead pids within a
//! second; a pool's held copy of a frame received from a dead sender and
//! sent on is let go at the pool's next send), and a killed receiver's
//! slots are taken back by the sender when it needs the memory (it checks
//! each slot's pid). Descriptors sent but never claimed (the message was
//! lost) are taken back after [`UNCLAIMED_LIMIT`] without a send.
//!
//! Trust: a same-host peer is a process of the same user, which could read
//! this process's memory anyway (ptrace); the checks protect against bugs
//! and forged descriptors, not against that user.

use std::time::Duration;

mod host;
mod mapping;
mod pool;
mod ranges;
mod receiver;
mod segment;
mod slot;
mod track;

pub use host::{can_reach, has_exited, host_identity};
pub use pool::{Pool, Sent, ShmStats, Staged};
pub use receiver::Receiver;
pub use slot::Lease;
pub use track::Tracked;

/// The name prefix of every segment's memfd.
pub const NAME_PREFIX: &str = "pslite-shm-";
/// Data frames at least this long travel through shared memory.
pub const MIN_FRAME: usize = 64 << 10;
/// The most segment memory one node's pool holds.
pub const DEFAULT_POOL_BYTES: usize = 1 << 30;
/// A segment sent but not claimed for this long is taken back.
pub const UNCLAIMED_LIMIT: Duration = Duration::from_secs(60);
/// A cached frame the pool keeps alive itself (one it cannot see die, see
/// [`Pool::send`]) is let go after this long without being sent again.
pub const HELD_IDLE: Duration = Duration::from_secs(10);

/// What went wrong on the shared-memory path: a descriptor that was
/// rejected (the message is dropped), a segment that could not be made
/// (the frame goes over ZeroMQ), or the host identity that could not be
/// read (shared memory is off).
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The sender is not a same-host pslite peer with shared memory on.
    #[error("the sender is not a same-host pslite node with shared memory")]
    NotShmPeer,
    /// The descriptor names a data frame the message does not have, or
    /// one that is not empty, or one twice.
    #[error("it names data frame {0}, which is absent, not empty or named twice")]
    BadIndex(u32),
    /// The descriptor's fd is negative.
    #[error("its segment cannot be used: bad fd {0}")]
    BadFd(i32),
    /// The segment could not be opened, read or mapped.
    #[error("its segment cannot be used: {path}: {source}")]
    Open {
        /// `/proc/<pid>/fd/<fd>`.
        path: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The descriptor's fd is not a pslite segment.
    #[error("its segment cannot be used: {path} is {target:?}, not a pslite segment")]
    NotASegment {
        /// `/proc/<pid>/fd/<fd>`.
        path: String,
        /// What the fd is.
        target: String,
    },
    /// The segment's size is not one a pool makes.
    #[error("its segment cannot be used: {path} has a bad size {len}")]
    BadSize {
        /// `/proc/<pid>/fd/<fd>`.
        path: String,
        /// Its size in bytes.
        len: usize,
    },
    /// The segment carries no pslite header (or one of another layout).
    #[error("its segment cannot be used: {path} has no pslite header")]
    NoHeader {
        /// `/proc/<pid>/fd/<fd>`.
        path: String,
    },
    /// The token does not match the segment's.
    #[error("its token does not match the segment")]
    WrongToken,
    /// Offset and length do not fit the segment.
    #[error("bytes {offset}+{length} lie outside the segment's {capacity} bytes")]
    OutOfBounds {
        /// The descriptor's offset.
        offset: u64,
        /// The descriptor's length.
        length: u64,
        /// The segment's data area.
        capacity: u64,
    },
    /// The segment has no slot for this process (the descriptor was sent
    /// to another process, or forged).
    #[error("its segment was not sent to this process")]
    NotAddressed,
    /// The segment is not in the state the descriptor says (stale, replayed
    /// or forged generation).
    #[error("generation {0} is not the segment's current, unclaimed use")]
    WrongGeneration(u64),
    /// A sender could not make a segment.
    #[error("cannot create a shared-memory segment: {what}: {source}")]
    Create {
        /// The step that failed (`memfd_create`, `ftruncate`, `mmap`).
        what: &'static str,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// This process's host identity could not be read: shared memory is
    /// off.
    #[error("cannot read {path}: {source}")]
    HostIdentity {
        /// The file or link that could not be read.
        path: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

impl ShmError {
    /// Whether this process ran short of file descriptors or memory (too
    /// many open files, out of memory or mappings): a local shortage that
    /// may pass, not a bad descriptor. The message must not be dropped.
    pub fn is_local_shortage(&self) -> bool {
        let source = match self {
            ShmError::Open { source, .. } | ShmError::Create { source, .. } => source,
            _ => return false,
        };
        matches!(
            source.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
        )
    }
}

#[cfg(test)]
mod tests;
