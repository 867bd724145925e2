//! A link's send window: its queue, and the bytes of its large frames
//! ZeroMQ holds and has not written yet. Each such frame carries a
//! [`Credit`] that ZeroMQ drops once it has written the frame (or failed);
//! dropping it gives the bytes back and, if the link's queue waits, wakes
//! the node's sending thread through the [`Pump`].

use std::sync::{Arc, Condvar, Mutex};

use pslite_proto::{lock, wait_while, NodeId};

use super::outgoing::Outgoing;
use crate::partition::PartialBound;
use crate::schedule::{SendQueue, MAX_WAIT};

/// A link's queue and what ZeroMQ holds of it.
pub(super) struct SchedState {
    pub(super) queue: SendQueue<Outgoing<'static>>,
    /// Bytes of large frames handed to ZeroMQ and not written yet.
    pub(super) in_flight: usize,
    /// Bytes queued by the receive thread (within the budget).
    pub(super) budgeted: usize,
    /// Something waits for a retry (a write that would have blocked, or a
    /// socket another thread held or that is not open yet).
    pub(super) stuck: bool,
    /// The link is gone: nothing more is queued, waiters leave.
    pub(super) closed: bool,
}

/// A link's scheduling, shared with the guards of the frames ZeroMQ holds.
pub(super) struct Sched {
    pub(super) state: Mutex<SchedState>,
    /// An app thread waiting for room in the queue.
    pub(super) room: Condvar,
    /// ZeroMQ may hold this many bytes of the link's large frames.
    pub(super) window: usize,
    /// The node's sending thread, woken when ZeroMQ has room again.
    pump: Arc<Pump>,
    /// This link's peer, for the pump.
    peer: NodeId,
}

impl Sched {
    /// The scheduling of a new link to `peer`: an empty queue within the
    /// peer's `bound` on incomplete messages, and a window of
    /// `partition_bytes` (0: no limit, everything goes to ZeroMQ at once).
    pub(super) fn new(
        partition_bytes: usize,
        bound: PartialBound,
        pump: &Arc<Pump>,
        peer: NodeId,
    ) -> Sched {
        // ZeroMQ holds at most about one part beyond what it writes.
        let window = match partition_bytes {
            0 => usize::MAX,
            n => n,
        };
        Sched {
            state: Mutex::new(SchedState {
                queue: SendQueue::with_bound(MAX_WAIT, bound),
                in_flight: 0,
                budgeted: 0,
                stuck: false,
                closed: false,
            }),
            room: Condvar::new(),
            window,
            pump: Arc::clone(pump),
            peer,
        }
    }

    /// Counts `bytes` of a large frame handed to ZeroMQ against the
    /// window; the guard ZeroMQ drops once it has written them (`None`
    /// without a window).
    pub(super) fn credit(self: &Arc<Self>, bytes: usize) -> Option<Box<dyn Send>> {
        if self.window == usize::MAX {
            return None;
        }
        lock(&self.state).in_flight += bytes;
        Some(Box::new(Credit {
            sched: Arc::clone(self),
            bytes,
        }))
    }
}

/// One large frame ZeroMQ holds: its bytes count against the window until
/// ZeroMQ drops it (it was written, or failed).
struct Credit {
    sched: Arc<Sched>,
    bytes: usize,
}

impl Drop for Credit {
    fn drop(&mut self) {
        // Runs on ZeroMQ's I/O thread (or the sender's, on a failed send):
        // count and wake, never touch a socket.
        let wake = {
            let mut st = lock(&self.sched.state);
            st.in_flight = st.in_flight.saturating_sub(self.bytes);
            !st.queue.is_empty() && st.in_flight < self.sched.window && !st.closed
        };
        if wake {
            self.sched.pump.wake(self.sched.peer);
        }
    }
}

/// The node's sending thread's wake-ups: the links whose ZeroMQ has room
/// and whose queues wait.
#[derive(Default)]
pub(super) struct Pump {
    wanted: Mutex<(bool, Vec<NodeId>)>,
    ready: Condvar,
}

impl Pump {
    pub(super) fn wake(&self, peer: NodeId) {
        let mut w = lock(&self.wanted);
        if !w.1.contains(&peer) {
            w.1.push(peer);
        }
        self.ready.notify_one();
    }

    /// Waits for peers to write to (taken, in the order woken); `None`
    /// once stopped.
    pub(super) fn next(&self) -> Option<Vec<NodeId>> {
        let mut w = wait_while(&self.ready, lock(&self.wanted), |w| !w.0 && w.1.is_empty());
        if w.0 {
            return None;
        }
        Some(std::mem::take(&mut w.1))
    }

    pub(super) fn stop(&self) {
        lock(&self.wanted).0 = true;
        self.ready.notify_all();
    }
}
