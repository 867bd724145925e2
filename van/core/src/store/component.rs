//! The store as a component of the core: on the scheduler the host
//! ([`StoreHost`]) answering members and admin clients (within the budget
//! of unread answers) and forgetting the waits and watches of nodes that
//! died or were replaced; on every node the client ([`StoreClient`]): its
//! requests and its watchers.

use std::collections::BTreeSet;
use std::time::Instant;

use log::{debug, info, warn};
use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::store::{OverLimit, StoreLimit, StoreMsg, StoreOp};
use pslite_proto::{Command, Message, Role, K_EMPTY};

use super::{ClientInput, Requester, StoreClient, StoreHost, StoreReply};
use crate::component::{Component, Cx};
use crate::config::VanConfig;
use crate::effects::{Event, Output};
use crate::error::VanError;
use crate::log_once::LogOnce;
use crate::reply::{reply_size, Replies};

/// A node's store.
pub struct Store {
    /// On the scheduler: the key-value store it hosts.
    host: Option<StoreHost>,
    /// This node's requests and watches.
    client: StoreClient,
    /// On the scheduler: the nodes dead at the last tick, whose waits and
    /// watches the host has dropped.
    dead: BTreeSet<NodeId>,
    /// The budget of answers to admin clients.
    replies: Replies,
    /// The largest answer's budget, for a refusal's size (`PS_STORE_MAX_BYTES`).
    max_total: usize,
    /// Drops already warned about, by sender and cause.
    dropped: LogOnce<(NodeId, &'static str)>,
}

impl Store {
    /// The store of the node `cfg` describes (hosted on the scheduler).
    pub fn new(cfg: &VanConfig, replies: Replies) -> Store {
        Store {
            host: (cfg.role == Role::Scheduler).then(|| StoreHost::new(cfg.store_limits)),
            client: StoreClient::default(),
            dead: BTreeSet::new(),
            replies,
            max_total: cfg.store_limits.max_total,
            dropped: LogOnce::new(log::Level::Warn),
        }
    }

    /// Sends store request `req` to the scheduler (see `Call::Store`);
    /// returns its id.
    pub fn request(&mut self, mut req: StoreMsg, cx: &mut Cx<'_>) -> Result<u64, VanError> {
        if let Some(f) = cx.facts.failure() {
            return Err(f.clone().into());
        }
        if !cx.facts.is_joined() {
            return Err(VanError::NotReady);
        }
        let pslite = self.host.is_some() || cx.facts.node(SCHEDULER).is_some_and(|n| n.pslite);
        if !pslite {
            return Err(VanError::StoreUnsupported);
        }
        let id = self.client.start(&mut req);
        send(req, cx);
        Ok(id)
    }

    /// The answer to store request `id`, once here.
    pub fn answer(&self, id: u64) -> Option<&StoreMsg> {
        self.client.answer(id)
    }

    /// On the scheduler: how many store requests wait for keys (0 elsewhere).
    pub fn waiting(&self) -> usize {
        self.host.as_ref().map_or(0, StoreHost::waiting)
    }

    /// On the scheduler: how many store watches there are (0 elsewhere).
    pub fn watch_count(&self) -> usize {
        self.host.as_ref().map_or(0, StoreHost::watch_count)
    }

    /// This node is leaving: its watches end (see `Core::store_leave`).
    pub fn leave(&mut self, cx: &mut Cx<'_>) {
        if !self.client.is_watching() || !cx.facts.is_joined() {
            return;
        }
        if let Some(host) = &mut self.host {
            host.forget(&Requester::Member(cx.facts.me().id));
            return;
        }
        let mut req = StoreMsg::request(StoreOp::Unwatch, Vec::new());
        self.client.fresh_id(&mut req);
        send(req, cx);
    }

    /// Forgets store request `id` (its waiter returned).
    pub fn end(&mut self, id: u64) {
        self.client.end(id);
    }

    /// A new watcher of `key` in this process.
    pub fn watch(&mut self, key: &str) -> u64 {
        self.client.watch(key)
    }

    /// Watcher `watcher` is gone: if nobody in this process watches its key
    /// any more, the scheduler is told.
    pub fn watcher_gone(&mut self, watcher: u64, cx: &mut Cx<'_>) {
        if let Some(key) = self.client.unwatch(watcher) {
            self.unwatch(key, cx);
        }
    }

    fn unwatch(&mut self, key: String, cx: &mut Cx<'_>) {
        let mut req = StoreMsg::request(StoreOp::Unwatch, vec![key]);
        self.client.fresh_id(&mut req);
        send(req, cx);
    }

    /// The host's clock alone (a stopping node: its own requests are over).
    pub fn tick_host(&mut self, now: Instant, cx: &mut Cx<'_>) {
        if let Some(host) = &mut self.host {
            let replies = host.tick(now);
            self.send_replies(replies, cx);
        }
    }

    /// On the scheduler: drops node `id`'s store waits and watches.
    fn forget(&mut self, id: NodeId, why: &str) {
        let Some(host) = &mut self.host else {
            return;
        };
        let gone = host.forget(&Requester::Member(id));
        if gone.waits + gone.watches > 0 {
            info!(
                "scheduler: node {id} {why}: the store dropped its {} watches and {} waiting \
                 requests",
                gone.watches, gone.waits
            );
        }
    }

    /// On the scheduler: drops the waits and watches of nodes declared dead
    /// since the last tick (their answers and events would go nowhere, or
    /// to the process that takes over the id).
    fn forget_dead(&mut self, now: Instant, cx: &mut Cx<'_>) {
        if self.host.is_none() || cx.facts.config().role != Role::Scheduler {
            return;
        }
        let dead: BTreeSet<NodeId> = cx.facts.dead_nodes(now).into_iter().collect();
        let newly: Vec<NodeId> = dead.difference(&self.dead).copied().collect();
        for id in newly {
            self.forget(id, "is dead");
        }
        self.dead = dead;
    }

    /// A store request that reached the scheduler.
    fn run(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        let sender = msg.meta.sender;
        let Some(req) = msg.meta.store else {
            warn!("scheduler: dropping a STORE request from node {sender} without a request");
            return;
        };
        let from = if sender == K_EMPTY {
            // An admin client: answered on its connection, whatever
            // address its request names.
            match msg.meta.route {
                Some(route) => Requester::Admin(route),
                None => {
                    debug!("scheduler: dropping a STORE request from an unknown peer");
                    return;
                }
            }
        } else if sender == SCHEDULER || cx.facts.node(sender).is_some() {
            Requester::Member(sender)
        } else {
            warn!("scheduler: dropping a STORE request from node {sender}: not a cluster member");
            return;
        };
        let Some(host) = &mut self.host else {
            return;
        };
        let replies = host.handle(from, *req, now);
        self.send_replies(replies, cx);
    }

    fn send_replies(&mut self, replies: Vec<StoreReply>, cx: &mut Cx<'_>) {
        for StoreReply { to, msg: store } in replies {
            match to {
                Requester::Member(id) => {
                    let mut msg = Message::control(Command::Store, id);
                    msg.meta.store = Some(Box::new(store));
                    cx.send(msg);
                }
                Requester::Admin(route) => {
                    let mut msg = Message::control(Command::Store, K_EMPTY);
                    // The admin client pairs answers by timestamp: its
                    // requests carry it as their id.
                    msg.meta.timestamp = (store.id & i32::MAX as u64) as i32;
                    msg.meta.sender = SCHEDULER;
                    let event = store.op == StoreOp::Event;
                    let over = OverLimit {
                        which: StoreLimit::Bytes,
                        size: reply_size(&store) as u64,
                        limit: self.max_total as u64,
                    };
                    let refusal = (!event).then(|| store.over_limit(over));
                    msg.meta.store = Some(Box::new(store));
                    if let Some(out) = self.replies.reply(route.clone(), msg.clone()) {
                        cx.out(out);
                        continue;
                    }
                    // Over the budget of unread answers: an answer becomes
                    // its refusal; a client too slow for its events loses
                    // its watches (it is told nothing more).
                    match refusal {
                        Some(refusal) => {
                            msg.meta.store = Some(Box::new(refusal));
                            cx.out(Replies::unbudgeted(route, msg));
                        }
                        None => {
                            if let Some(host) = &mut self.host {
                                host.forget(&Requester::Admin(route));
                            }
                            debug!("scheduler: an admin client reads its events too slowly: its watches end");
                        }
                    }
                }
            }
        }
    }

    /// A store answer or event from the scheduler.
    fn on_message(&mut self, msg: Message, cx: &mut Cx<'_>) {
        let sender = msg.meta.sender;
        if sender != SCHEDULER || msg.meta.request {
            self.drop_logged(sender, "a STORE message", "only the scheduler answers them");
            return;
        }
        let Some(store) = msg.meta.store else {
            self.drop_logged(sender, "a STORE answer", "it has no store part");
            return;
        };
        match self.client.on_message(*store) {
            ClientInput::Answer => cx.changed(),
            ClientInput::Event { watchers, event } => {
                cx.out(Output::StoreEvent { watchers, event })
            }
            ClientInput::Unwatched(key) => self.unwatch(key, cx),
            ClientInput::Nothing => {}
        }
    }
}

impl Store {
    /// Logs a dropped STORE message: a warning the first time `sender`
    /// sends one for `why`, at debug level after that.
    fn drop_logged(&mut self, sender: NodeId, what: &str, why: &'static str) {
        self.dropped.log((sender, why), || {
            format!("dropping {what} from node {sender}: {why}")
        });
    }
}

/// Sends store request `req` to the scheduler.
fn send(req: StoreMsg, cx: &mut Cx<'_>) {
    let mut msg = Message::control(Command::Store, SCHEDULER);
    msg.meta.request = true;
    msg.meta.store = Some(Box::new(req));
    cx.send(msg);
}

impl Component for Store {
    /// A request to the store this scheduler hosts, or an answer or event
    /// for this node's requests and watchers.
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        if self.host.is_some() && msg.meta.request {
            self.run(msg, now, cx);
        } else {
            self.on_message(msg, cx);
        }
    }

    /// The host forgets the dead (while this node listens: a deaf node
    /// hears from nobody) and waits past their deadline are answered.
    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        if cx.facts.is_listening() {
            self.forget_dead(now, cx);
        }
        self.tick_host(now, cx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.host.as_ref().and_then(StoreHost::poll_timeout)
    }

    /// A node replaced by a restarted process loses its waits and watches.
    fn on_event(&mut self, event: &Event, _now: Instant, _cx: &mut Cx<'_>) {
        if let Event::PeerReplaced(id) = event {
            self.forget(*id, "was replaced by a restarted process");
        }
    }
}
