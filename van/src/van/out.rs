//! The Van's side of `pslite_van_core::carry`: what the core asks for,
//! carried out with sockets, threads and the apps' [`Dispatch`]. The
//! harness implements the same [`Backend`] on its simulated network.

use std::time::Duration;

use bytes::Bytes;
use log::{debug, error, info, warn};
use pslite_proto::replica::RangeMap;
use pslite_proto::store::StoreMsg;
use pslite_proto::{lock, Message, Node, NodeId, Role, K_EMPTY};
use pslite_van_core::carry::Backend;
use pslite_van_core::checkpoint::disk::Io;

use super::Shared;
use crate::context;
use crate::dispatch::Delivered;
use crate::links::Mode;
use crate::transport::Transport;
use crate::{describe, Failure, LinkEvent, Route, VanError, WaitingFor};

/// Carries out a batch of the core's outputs for `shared`: `mode` says
/// whether the calling thread may wait on a peer.
pub(super) struct VanOut<'a> {
    pub(super) shared: &'a Shared,
    pub(super) mode: Mode,
}

impl Backend for VanOut<'_> {
    fn link(&mut self, node: &Node, _identity: NodeId, _key: Option<u64>) {
        self.shared.links.reserve(node.id);
    }

    fn unlink(&mut self, id: NodeId) {
        self.shared.links.remove(id);
    }

    fn connect(&mut self, node: Node, identity: NodeId, key: Option<u64>, route: Route) {
        self.shared.connect(node, identity, key, route, self.mode);
    }

    fn send(&mut self, msg: Message) {
        if let Err(e) = self.shared.links.send(&msg, self.mode) {
            debug!("cannot send {}: {e}", describe(&msg));
        }
    }

    fn deliver(&mut self, msg: Message) -> Result<(), Message> {
        match self.shared.dispatch.offer(msg, &self.shared.room_signal) {
            Delivered::Taken => Ok(()),
            Delivered::Full(msg) => Err(msg),
        }
    }

    fn snapshot(&mut self, app: i32, token: u64, begin: u64, end: u64) {
        self.shared.dispatch.snapshot(app, token, begin, end);
    }

    fn restore(&mut self, app: i32, token: u64, begin: u64, end: u64, data: Bytes) {
        self.shared.dispatch.restore(app, token, begin, end, data);
    }

    fn undeliverable(&mut self, msg: Message, failure: Failure) {
        self.shared.dispatch.undeliverable(msg, failure);
    }

    fn peer_dead(&mut self, id: NodeId, failure: Failure) {
        self.shared.dispatch.peer_dead(id, &failure);
    }

    fn failed(&mut self, failure: Failure) {
        if failure != Failure::Stopped {
            error!("{failure}");
        }
        self.shared.dispatch.failed(&failure);
    }

    fn round_began(&mut self, round: u64, workers: Vec<NodeId>) {
        self.shared.dispatch.membership(round, &workers);
    }

    fn range_map(&mut self, map: RangeMap) {
        self.shared.dispatch.range_map(&map);
    }

    fn checkpoint_io(&mut self, token: u64, io: Io) {
        self.shared.checkpoint_io(token, io);
    }

    fn reply(&mut self, route: Bytes, msg: Message, reserved: usize) {
        lock(&self.shared.replies).push((route, msg, reserved));
        if self.mode == Mode::Wait {
            self.shared.waker.wake();
        }
    }

    fn store_event(&mut self, watchers: Vec<u64>, event: StoreMsg) {
        self.shared.store_event(watchers, event, self.mode);
    }

    fn waiting(&mut self, what: WaitingFor, waited: Duration, limit: Duration) {
        let (secs, limit) = (waited.as_secs(), limit.as_secs());
        if waited.is_zero() {
            info!("{what} (up to {limit} s, PS_START_TIMEOUT)");
        } else {
            warn!("{what}: {secs} s of {limit} (PS_START_TIMEOUT)");
        }
    }
}

impl Shared {
    /// Carries out a checkpoint's file operation in a thread of its own
    /// (writes are fsynced: the receive thread never waits on the disk),
    /// then hands the core its result.
    fn checkpoint_io(&self, token: u64, io: crate::checkpoint::disk::Io) {
        let weak = self.this.clone();
        let spawned = std::thread::Builder::new()
            .name("pslite-checkpoint".into())
            .spawn(move || {
                let result = crate::checkpoint::disk::perform(&io);
                if let Some(shared) = weak.upgrade() {
                    shared.with_core(Mode::Wait, |core, now| {
                        core.checkpoint_io_done(token, result, now)
                    });
                }
            });
        if let Err(e) = spawned {
            let result = crate::checkpoint::disk::IoResult::Failed(format!(
                "cannot start a thread for the checkpoint's files: {e}"
            ));
            self.with_core(Mode::NoWait, |core, now| {
                core.checkpoint_io_done(token, result, now)
            });
        }
    }

    /// Opens the connection the core asked for (see [`Links::open`]). A
    /// registration's check to a host name is looked up first, in a thread
    /// of its own: the name comes from whoever registered, and ZeroMQ would
    /// look it up on its I/O thread, which a name that does not resolve
    /// would stall.
    fn connect(&self, node: Node, identity: NodeId, key: Option<u64>, route: Route, mode: Mode) {
        if node.id < 0 && node.hostname.parse::<std::net::IpAddr>().is_err() {
            self.connect_after_lookup(node);
            return;
        }
        if let Err(e) = self.links.open(&node, identity, key, &route, mode) {
            self.connect_failed(&node, &route, e, mode);
        }
    }

    /// A connection the core asked for could not be opened. Out of
    /// descriptors or sockets (or memory), the node fails naming the limit
    /// to raise; so does the scheduler for any reason (the job cannot form
    /// or go on without its connection to a member). A registration's check
    /// that cannot connect for another reason refuses the registration; a
    /// server or worker fails what it sends to that peer (as to an unknown
    /// one).
    fn connect_failed(&self, node: &Node, route: &Route, e: VanError, mode: Mode) {
        let exhausted = match &e {
            VanError::Zmq { source, .. } => source
                .downcast_ref::<zmq::Error>()
                .copied()
                .filter(|e| context::is_exhaustion(*e)),
            _ => None,
        };
        let failure = match exhausted {
            Some(source) => Failure::Resources {
                peer: if node.id < 0 {
                    format!("{} (to check its registration)", route.endpoint)
                } else {
                    format!("node {} at {}", node.id, route.endpoint)
                },
                detail: context::exhaustion_advice(source, self.links.max_sockets()),
            },
            None if node.id < 0 => {
                let why = e.to_string();
                self.with_core(mode, |core, now| {
                    core.link_event(node.id, LinkEvent::Refused(why), now)
                });
                return;
            }
            None if self.config.role == Role::Scheduler => Failure::SendFailed {
                peer: node.id,
                reason: format!("cannot open a connection to it at {}: {e}", route.endpoint),
            },
            None => {
                error!("cannot connect to {node}: {e} (messages to it fail)");
                return;
            }
        };
        self.with_core(mode, |core, now| core.fail(failure, now));
    }

    /// [`Shared::connect`] for a registration's check whose address is a
    /// host name: a name that does not resolve refuses the check.
    fn connect_after_lookup(&self, node: Node) {
        let weak = self.this.clone();
        let spawned = std::thread::Builder::new()
            .name("pslite-lookup".into())
            .spawn(move || {
                let ip = crate::resolve::bind_ip(&node.hostname);
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                // The check may have ended meanwhile (its deadline passed).
                if !shared.with_core(Mode::Wait, |core, _| core.is_checking(node.id)) {
                    return;
                }
                let result = match ip {
                    Some(ip) => {
                        let route = Route {
                            endpoint: Transport::Tcp.connect_endpoint(&ip, node.port),
                            local: None,
                            shm_pid: None,
                            watch: true,
                        };
                        shared
                            .links
                            .open(&node, K_EMPTY, None, &route, Mode::Wait)
                            .map_err(|e| e.to_string())
                    }
                    None => Err(format!(
                        "its host name {:?} does not resolve",
                        node.hostname
                    )),
                };
                if let Err(why) = result {
                    shared.with_core(Mode::Wait, |core, now| {
                        core.link_event(node.id, LinkEvent::Refused(why), now)
                    });
                }
            });
        if let Err(e) = spawned {
            debug!("cannot start a name lookup: {e}");
        }
    }

    /// Hands a store event to this process's watchers of its key; tells
    /// the core of those that are gone.
    fn store_event(&self, watchers: Vec<u64>, event: StoreMsg, mode: Mode) {
        let gone: Vec<u64> = {
            let mut senders = lock(&self.watchers);
            watchers
                .into_iter()
                .filter(|w| {
                    let sent = senders
                        .get(w)
                        .is_some_and(|tx| tx.send(event.clone()).is_ok());
                    if !sent {
                        senders.remove(w);
                    }
                    !sent
                })
                .collect()
        };
        for watcher in gone {
            self.with_core(mode, |core, now| core.store_watcher_gone(watcher, now));
        }
    }
}
