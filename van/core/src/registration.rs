//! The scheduler's check of registrations, as a state machine with no
//! sockets and no clock: an ADD_NODE from a process without an id names the
//! address where the scheduler is to reach it, and anyone can send one. A
//! registration counts only once something at that address completed a
//! ZeroMQ handshake with the scheduler (with `PS_AUTH_TOKEN`, a PLAIN one
//! with the token): frames forged by a stranger, naming addresses where no
//! node listens or host names that do not resolve, cannot take a member's
//! place. They are refused, logged once each and named in the scheduler's
//! start error.
//!
//! The core opens a connection without an identity (nothing collides with
//! it, and a C++ node ignores it) to each address registrations name,
//! holds the registrations until [`Registrations::link_up`] and drops the
//! connection then; [`Registrations::tick`] refuses those still unchecked
//! after their deadline: [`REGISTRATION_CHECK`], plus [`PER_CHECK`] for
//! each check already under way when it began (up to [`MAX_CHECK`]). A
//! hundred nodes registering at once on a loaded machine all complete their
//! handshakes, but not within one fixed 5 s: each waits behind the others,
//! in the scheduler's ZeroMQ I/O thread and in theirs.
//!
//! At most [`MAX_CHECKS`] checks run at once (each costs the scheduler a
//! connection and three sockets); the registrations of other processes
//! wait in line ([`Offered::Queued`], up to [`MAX_QUEUED`]) and their check
//! starts when one ends ([`Registrations::start_queued`]), its deadline
//! counted from then: a thousand nodes registering within a second all get
//! in. What the registrations held take counts in the budget of everything
//! the node holds for peers (`PS_HOLD_LIMIT`, [`registration_bytes`]): one
//! beyond it is refused at once.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use log::{debug, warn};
use pslite_proto::{Message, Node, NodeId};

use crate::component::{Component, Cx};
use crate::effects::LinkEvent;
use crate::effects::{Effect, Event};

/// How long an address a registration names may take to complete a
/// handshake (a node listens before it registers; a dropped SYN costs
/// ZeroMQ 0.5 s plus 0.1 s before it retries).
pub const REGISTRATION_CHECK: Duration = Duration::from_secs(5);

/// What each check already under way adds to a new check's deadline.
pub const PER_CHECK: Duration = Duration::from_millis(100);

/// The longest a check may take, however many are under way.
pub const MAX_CHECK: Duration = Duration::from_secs(60);

/// Addresses checked at once; registrations beyond wait in line.
pub const MAX_CHECKS: usize = 256;
/// Processes whose registrations wait for a check to start; beyond, they
/// are refused at once.
pub const MAX_QUEUED: usize = 16_384;
/// Registrations held per address (a process's customers, resends).
const MAX_HELD: usize = 64;
/// Refused registrations remembered for the start error.
const MAX_REMEMBERED: usize = 16;

/// The links of checks have ids below this (no node has a negative id).
const FIRST_LINK: NodeId = -1_000_000;

struct Check {
    link: NodeId,
    node: Node,
    since: Instant,
    /// When it is refused if its address has not answered.
    deadline: Instant,
    held: Vec<Message>,
}

/// What to do with a registration.
#[derive(Debug, PartialEq, Eq)]
pub enum Offered {
    /// Connect (no identity) to this node, whose id is the check's link.
    Check(Node),
    /// It waits for a check of its address already under way.
    Held,
    /// It waits for its check to start (too many under way).
    Queued,
    /// Refused now (too many checks under way), with why.
    Refused(String),
}

/// Registrations waiting for their address to be checked.
#[derive(Default)]
pub struct Registrations {
    checks: Vec<Check>,
    /// Registrations of processes whose check has not started, in order of
    /// arrival (one entry per process; `since` and `deadline` unused until it
    /// starts).
    queued: std::collections::VecDeque<Check>,
    next_link: NodeId,
    refused: Vec<String>,
    /// Refused registration addresses logged at warning level.
    logged: HashSet<String>,
    /// Bytes of the registrations held (see [`registration_bytes`]).
    bytes: usize,
    /// The budget of everything the node holds for peers (`PS_HOLD_LIMIT`;
    /// `None`: no bound) and what it holds elsewhere, as the core last said.
    limit: Option<usize>,
    elsewhere: usize,
}

/// What a held registration counts in the budget of everything held for
/// peers: its data and body, its node entries and a fixed overhead.
pub fn registration_bytes(msg: &Message) -> usize {
    let nodes: usize = msg
        .meta
        .control
        .node
        .iter()
        .map(|n| 64 + n.hostname.len())
        .sum();
    crate::hold::message_bytes(msg) + nodes + crate::hold::HoldQueue::<()>::OVERHEAD
}

impl Registrations {
    /// Registrations held within `limit` bytes (`PS_HOLD_LIMIT`) together
    /// with what the node holds elsewhere
    /// ([`Registrations::set_held_elsewhere`]).
    pub fn with_limit(limit: usize) -> Registrations {
        Registrations {
            limit: Some(limit),
            ..Registrations::default()
        }
    }

    /// What the node holds for peers beyond the registrations: they are
    /// held only within what is left of the budget.
    pub fn set_held_elsewhere(&mut self, bytes: usize) {
        self.elsewhere = bytes;
    }

    /// Bytes of the registrations held ([`registration_bytes`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes registration `msg` (an ADD_NODE naming `node`) at `now`.
    pub fn offer(&mut self, msg: Message, node: &Node, now: Instant) -> Offered {
        let size = registration_bytes(&msg);
        let in_use = self.bytes.saturating_add(self.elsewhere);
        if self.limit.is_some_and(|l| in_use.saturating_add(size) > l) {
            return Offered::Refused(format!(
                "holding its {size} bytes would pass the budget of everything the scheduler \
                 holds for peers (PS_HOLD_LIMIT, {in_use} bytes in use)"
            ));
        }
        if let Some(check) = self.checks.iter_mut().find(|c| c.node.same_process(node)) {
            if check.held.len() < MAX_HELD {
                check.held.push(msg);
                self.bytes += size;
            }
            return Offered::Held;
        }
        if let Some(check) = self.queued.iter_mut().find(|c| c.node.same_process(node)) {
            if check.held.len() < MAX_HELD {
                check.held.push(msg);
                self.bytes += size;
            }
            return Offered::Queued;
        }
        self.bytes += size;
        if self.checks.len() >= MAX_CHECKS {
            if self.queued.len() >= MAX_QUEUED {
                self.bytes -= size;
                return Offered::Refused(format!(
                    "{MAX_CHECKS} registrations are being checked and {MAX_QUEUED} more wait"
                ));
            }
            self.queued.push_back(Check {
                link: 0,
                node: node.clone(),
                since: now,
                deadline: now,
                held: vec![msg],
            });
            return Offered::Queued;
        }
        Offered::Check(self.start(node.clone(), vec![msg], now))
    }

    /// Starts the checks of queued registrations while fewer than
    /// [`MAX_CHECKS`] run: the nodes to connect to (see [`Offered::Check`]).
    /// Call when a check ended.
    pub fn start_queued(&mut self, now: Instant) -> Vec<Node> {
        let mut started = Vec::new();
        while self.checks.len() < MAX_CHECKS {
            let Some(check) = self.queued.pop_front() else {
                break;
            };
            started.push(self.start(check.node, check.held, now));
        }
        started
    }

    /// Starts checking `node`'s address for registrations `held`: the node
    /// to connect to, whose id is the check's link.
    fn start(&mut self, node: Node, held: Vec<Message>, now: Instant) -> Node {
        if self.next_link >= 0 || self.next_link < FIRST_LINK - 1_000_000 {
            self.next_link = FIRST_LINK;
        }
        let link = self.next_link;
        self.next_link -= 1;
        let mut target = Node::new(node.role, node.hostname.clone(), node.port);
        target.id = link;
        let wait = (REGISTRATION_CHECK + PER_CHECK * self.checks.len() as u32).min(MAX_CHECK);
        self.checks.push(Check {
            link,
            node,
            since: now,
            deadline: now + wait,
            held,
        });
        target
    }

    /// Whether `link` is a check's connection.
    pub fn is_check(&self, link: NodeId) -> bool {
        self.checks.iter().any(|c| c.link == link)
    }

    /// The check's connection is up: its registrations count.
    pub fn link_up(&mut self, link: NodeId) -> Vec<Message> {
        match self.checks.iter().position(|c| c.link == link) {
            Some(i) => {
                let check = self.checks.remove(i);
                self.release(check).held
            }
            None => Vec::new(),
        }
    }

    /// Takes an ended check's registrations off the bytes held.
    fn release(&mut self, check: Check) -> Check {
        let held: usize = check.held.iter().map(registration_bytes).sum();
        self.bytes = self.bytes.saturating_sub(held);
        check
    }

    /// The check's address refused the handshake: its registrations are
    /// refused; returns the node and why.
    pub fn link_refused(&mut self, link: NodeId, why: &str) -> Option<(Node, String)> {
        let i = self.checks.iter().position(|c| c.link == link)?;
        let check = self.checks.remove(i);
        let check = self.release(check);
        let why = why.to_string();
        self.remember(&check.node, &why);
        Some((check.node, why))
    }

    /// Refuses the registrations whose address has not completed a
    /// handshake within [`REGISTRATION_CHECK`]: their links, nodes and why.
    pub fn tick(&mut self, now: Instant) -> Vec<(NodeId, Node, String)> {
        let (late, keep): (Vec<Check>, Vec<Check>) = std::mem::take(&mut self.checks)
            .into_iter()
            .partition(|c| now >= c.deadline);
        self.checks = keep;
        late.into_iter()
            .map(|c| {
                let c = self.release(c);
                let why = format!(
                    "nothing at {} completed a ZeroMQ handshake within {:.1} s",
                    c.node.address(),
                    c.deadline.saturating_duration_since(c.since).as_secs_f64()
                );
                self.remember(&c.node, &why);
                (c.link, c.node, why)
            })
            .collect()
    }

    /// When [`Registrations::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.checks.iter().map(|c| c.deadline).min()
    }

    /// Refused registrations (the latest few), for the start error.
    pub fn refused(&self) -> &[String] {
        &self.refused
    }

    fn remember(&mut self, node: &Node, why: &str) {
        if self.refused.len() >= MAX_REMEMBERED {
            self.refused.remove(0);
        }
        self.refused.push(format!("{node}: {why}"));
    }
}

impl Registrations {
    /// The check's connection `link` came up (its registrations count: the
    /// scheduler takes them) or was refused (they are refused); either way
    /// it closes.
    pub fn link_event(&mut self, link: NodeId, event: &LinkEvent, now: Instant, cx: &mut Cx<'_>) {
        match event {
            LinkEvent::Up => {
                for msg in self.link_up(link) {
                    cx.event(Event::Registered(Box::new(msg)));
                }
            }
            LinkEvent::Refused(why) => {
                if let Some((node, why)) = self.link_refused(link, why) {
                    self.log_refusal(&node, &why);
                }
            }
            // ZeroMQ tries again until the check's deadline.
            LinkEvent::Down | LinkEvent::Unreachable => return,
        }
        self.end_check(link, now, cx);
    }

    /// Closes the connection of check `link`, which ended, and starts the
    /// checks waiting in line for its place.
    fn end_check(&mut self, link: NodeId, now: Instant, cx: &mut Cx<'_>) {
        cx.fx.push(Effect::Disconnect(link));
        for target in self.start_queued(now) {
            cx.fx.push(Effect::ConnectAnonymous(target));
        }
    }

    fn log_refusal(&mut self, node: &Node, why: &str) {
        let line = format!(
            "scheduler: refusing the registration of {node}: {why} (a forged registration, or \
             a node the scheduler cannot reach at the address it advertises: check \
             DMLC_NODE_HOST)"
        );
        if self.logged.len() < 256 && self.logged.insert(node.address()) {
            warn!("{line}");
        } else {
            debug!("{line}");
        }
    }
}

impl Component for Registrations {
    /// On the scheduler, a registration (ADD_NODE from a process without an
    /// id): it counts once its address completed a handshake; one naming no
    /// usable address goes to the scheduler at once, which says why it
    /// drops it.
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        let node = match msg.meta.control.node.as_slice() {
            [node] if !node.hostname.is_empty() && (1..=65535).contains(&node.port) => node.clone(),
            _ => return cx.event(Event::Registered(Box::new(msg))),
        };
        match self.offer(msg, &node, now) {
            Offered::Check(target) => cx.fx.push(Effect::ConnectAnonymous(target)),
            Offered::Held | Offered::Queued => {}
            Offered::Refused(why) => self.log_refusal(&node, &why),
        }
    }

    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        for (link, node, why) in Registrations::tick(self, now) {
            self.log_refusal(&node, &why);
            self.end_check(link, now, cx);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Registrations::poll_timeout(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pslite_proto::{Command, Role};

    fn reg(port: i32) -> (Message, Node) {
        let node = Node::new(Role::Server, "127.0.0.1", port);
        let mut msg = Message::control(Command::AddNode, 1);
        msg.meta.control.node = vec![node.clone()];
        (msg, node)
    }

    #[test]
    fn a_registration_counts_once_its_address_answers() {
        let mut r = Registrations::default();
        let now = Instant::now();
        let (msg, node) = reg(9100);
        let Offered::Check(target) = r.offer(msg.clone(), &node, now) else {
            panic!("expected a check");
        };
        assert!(target.id < 0 && target.same_process(&node));
        // Another customer of the same process waits for the same check.
        assert_eq!(r.offer(msg, &node, now), Offered::Held);
        assert_eq!(r.link_up(target.id).len(), 2);
        assert!(!r.is_check(target.id));
        assert!(r.refused().is_empty());
    }

    /// Registrations held count in the budget of everything held for
    /// peers, with what the node holds elsewhere: one beyond it is refused
    /// at once, and an ended check gives its bytes back.
    #[test]
    fn registrations_held_stay_within_the_budget() {
        let (msg, _) = reg(9100);
        let size = registration_bytes(&msg);
        let mut r = Registrations::with_limit(3 * size);
        let now = Instant::now();
        let mut links = Vec::new();
        for port in 9100..9103 {
            let (msg, node) = reg(port);
            let Offered::Check(target) = r.offer(msg, &node, now) else {
                panic!("expected a check");
            };
            links.push(target.id);
        }
        assert_eq!(r.bytes(), 3 * size);
        let (mut big, node) = reg(9103);
        big.data = vec![vec![0u8; 1 << 20].into()];
        let Offered::Refused(why) = r.offer(big, &node, now) else {
            panic!("beyond the budget");
        };
        assert!(why.contains("PS_HOLD_LIMIT"), "{why}");
        assert_eq!(r.link_up(links[0]).len(), 1);
        assert_eq!(r.bytes(), 2 * size);
        r.set_held_elsewhere(size);
        let (msg, node) = reg(9104);
        assert!(matches!(r.offer(msg, &node, now), Offered::Refused(_)));
        r.set_held_elsewhere(0);
        let (msg, node) = reg(9104);
        assert!(matches!(r.offer(msg, &node, now), Offered::Check(_)));
        assert!(r.link_refused(links[1], "no").is_some());
        assert_eq!(r.tick(now + MAX_CHECK).len(), 2);
        assert_eq!(r.bytes(), 0);
    }

    #[test]
    fn a_silent_address_is_refused_after_the_check_and_remembered() {
        let mut r = Registrations::default();
        let now = Instant::now();
        let (msg, node) = reg(4);
        let Offered::Check(target) = r.offer(msg, &node, now) else {
            panic!("expected a check");
        };
        assert!(r.tick(now + REGISTRATION_CHECK / 2).is_empty());
        assert_eq!(r.poll_timeout(), Some(now + REGISTRATION_CHECK));
        let late = r.tick(now + REGISTRATION_CHECK);
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].0, target.id);
        assert!(r.refused()[0].contains("127.0.0.1:4"), "{:?}", r.refused());
        assert!(r.link_up(target.id).is_empty(), "too late");
    }

    #[test]
    fn a_check_waits_longer_behind_the_checks_under_way() {
        let mut r = Registrations::default();
        let now = Instant::now();
        let mut links = Vec::new();
        for port in 0..200 {
            let (msg, node) = reg(20_000 + port);
            let Offered::Check(target) = r.offer(msg, &node, now) else {
                panic!("expected a check");
            };
            links.push(target.id);
        }
        // The first had the base deadline; the last waits behind 199 others.
        let first_refused = r.tick(now + REGISTRATION_CHECK);
        assert_eq!(first_refused.len(), 1, "only the first is due");
        let last = now + REGISTRATION_CHECK + PER_CHECK * 199;
        assert!(r.tick(last - Duration::from_millis(1)).len() < 199);
        assert!(!r.link_up(links[199]).is_empty(), "still waited for");
        // However many are under way, a check ends within MAX_CHECK.
        let mut r = Registrations::default();
        for port in 0..MAX_CHECKS as i32 {
            let (msg, node) = reg(30_000 + port);
            r.offer(msg, &node, now);
        }
        assert!(r.poll_timeout().is_some());
        assert_eq!(r.tick(now + MAX_CHECK).len(), MAX_CHECKS);
    }

    #[test]
    fn checks_are_bounded_and_the_others_wait_in_line() {
        let mut r = Registrations::default();
        let now = Instant::now();
        let mut links = Vec::new();
        for port in 0..MAX_CHECKS as i32 {
            let (msg, node) = reg(10_000 + port);
            let Offered::Check(target) = r.offer(msg, &node, now) else {
                panic!("expected a check");
            };
            links.push(target.id);
        }
        // A thousand more processes register at once: they wait in line,
        // another customer of a waiting process with them.
        for port in 0..1000 {
            let (msg, node) = reg(20_000 + port);
            assert_eq!(r.offer(msg, &node, now), Offered::Queued);
        }
        let (msg, node) = reg(20_000);
        assert_eq!(r.offer(msg, &node, now), Offered::Queued);
        assert!(r.start_queued(now).is_empty(), "no check ended");
        // Each check that ends lets one more start, in order of arrival,
        // with its own deadline.
        let later = now + REGISTRATION_CHECK / 2;
        assert_eq!(r.link_up(links[0]).len(), 1);
        let started = r.start_queued(later);
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].port, 20_000);
        assert_eq!(r.link_up(started[0].id).len(), 2, "both customers count");
        // The earliest deadline is the second check's (one under way before
        // it); by MAX_CHECK every first check is late.
        assert_eq!(r.poll_timeout(), Some(now + REGISTRATION_CHECK + PER_CHECK));
        let late = r.tick(now + MAX_CHECK);
        assert_eq!(late.len(), MAX_CHECKS - 1, "the first checks, late");
        let started = r.start_queued(now + MAX_CHECK);
        assert_eq!(started.len(), MAX_CHECKS);
        assert_eq!(started[0].port, 20_001);
        // Beyond the line, refused at once.
        let mut r = Registrations::default();
        for port in 0..(MAX_CHECKS + MAX_QUEUED) as i32 {
            let (msg, node) = reg(port);
            assert!(!matches!(r.offer(msg, &node, now), Offered::Refused(_)));
        }
        let (msg, node) = reg(-1);
        assert!(matches!(r.offer(msg, &node, now), Offered::Refused(_)));
    }
}
