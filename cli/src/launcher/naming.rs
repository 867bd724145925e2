//! Which node id each process got: the launcher asks the scheduler.
//!
//! A node's id (and so its rank) is assigned by the scheduler, not by the
//! launcher. The launcher finds it from what each node advertises in the
//! scheduler's node table (the admin STATUS request of `pslite status`):
//!
//! - a process hosting one server or worker was given its `PORT` by the
//!   launcher ([`NodeSpec::own_port`](super::plan::NodeSpec::own_port)), and
//!   the row with that port and role is its node;
//! - a pslite node that uses shared memory also advertises its process id:
//!   a row whose process is in the launched process's group is one of its
//!   nodes (this names the processes of `--worker-procs`, which host several
//!   workers and get no `PORT`).
//!
//! The namer thread asks while some started process has no id yet; each
//! answer that names one is sent to the launch loop as a [`Named`]. It asks
//! only a scheduler that showed it is pslite's by writing its
//! [`SchedulerMark`] (a C++ ps-lite scheduler does not know the request: it
//! logs "Drop unknown typed message", and some versions crash on it). Under
//! a C++ scheduler, or a program that is no node at all, the namer sends
//! nothing and the nodes keep their launch-order names; it gives up after
//! [`GIVE_UP`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use pslite_proto::stats::NodeStatus;
use pslite_proto::{NodeId, Role, K_EMPTY};

use super::plan::NodeSpec;
use super::{admin_client, admin_settings};

/// How often the namer asks the scheduler while processes are unnamed.
const PERIOD: Duration = Duration::from_millis(100);

/// How long the namer asks a scheduler that has never answered.
pub const GIVE_UP: Duration = Duration::from_secs(30);

/// The file a pslite scheduler started by the launcher writes once it
/// listens ([`pslite::launched`]); removed when dropped.
#[derive(Debug)]
pub struct SchedulerMark {
    path: PathBuf,
}

impl SchedulerMark {
    /// A mark for the launch whose scheduler listens on `port` (in the
    /// temporary directory; a stale one of the same name is removed).
    pub fn new(port: u16) -> SchedulerMark {
        let path = std::env::temp_dir().join(format!(
            "pslite-launch-{}-{port}.scheduler",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        SchedulerMark { path }
    }

    /// Where the scheduler writes it.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SchedulerMark {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether the scheduler may be asked: no mark to wait for, or the mark
/// written by a pslite scheduler.
pub fn scheduler_is_pslite(mark: Option<&Path>) -> bool {
    mark.is_none_or(|path| {
        std::fs::read_to_string(path).is_ok_and(|text| text.starts_with("pslite scheduler "))
    })
}

/// A started process whose node id is not known yet.
#[derive(Clone, Debug)]
pub struct Unnamed {
    /// Its index in the launch.
    pub index: usize,
    /// Its process id (also its process group's).
    pub pid: u32,
    /// Its role.
    pub role: Role,
    /// The `PORT` it was given, if any.
    pub port: Option<u16>,
}

/// The nodes a started process turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// Its index in the launch.
    pub index: usize,
    /// Its process id (a restarted node is a new process).
    pub pid: u32,
    /// Its nodes, by id: one, or several for `--worker-procs`.
    pub ids: Vec<NodeId>,
    /// The nodes' ranks, in the order of `ids` (the round rank for an
    /// elastic worker in a round; `None` for one waiting for a round).
    pub ranks: Vec<Option<u32>>,
}

/// The rows of `table` that are `process`'s nodes (see the module docs);
/// `group_of` gives a process's group.
pub fn find(
    table: &[NodeStatus],
    process: &Unnamed,
    group_of: impl Fn(u32) -> Option<u32>,
) -> Option<Named> {
    let rows: Vec<&NodeStatus> = table
        .iter()
        .filter(|row| {
            let node = &row.node;
            node.role == process.role
                && node.id != K_EMPTY
                && match process.port {
                    Some(port) => node.port == i32::from(port),
                    None => node.pid != 0 && group_of(node.pid) == Some(process.pid),
                }
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(Named {
        index: process.index,
        pid: process.pid,
        ids: rows.iter().map(|r| r.node.id).collect(),
        ranks: rows.iter().map(|r| rank(r)).collect(),
    })
}

/// The rank a person reads for `row`: its round rank (elastic workers), else
/// the one its id encodes.
fn rank(row: &NodeStatus) -> Option<u32> {
    if row.waiting {
        return None;
    }
    row.round_rank
        .or_else(|| u32::try_from(pslite_proto::ids::id_to_rank(row.node.id)).ok())
}

/// What a person reads for process `pid` of `spec`, and the stem of its log
/// file: by role and rank with the node id in parentheses once `named`
/// (`worker 1 (node 11)`, `worker-1`), else by launch order, which is the
/// rank a ps-lite scheduler gives nodes whose ports increase in that order
/// (`worker 1`). Elastic workers change rank with every round, so they go by
/// node id alone (`worker (node 13)`); elastic nodes get ids in the order
/// they register, so until then they go by process id (`worker (pid 4242)`).
pub fn names(spec: &NodeSpec, pid: u32, named: Option<&Named>, elastic: bool) -> (String, String) {
    let role = spec.role.as_str();
    if spec.role == Role::Scheduler {
        return (role.into(), role.into());
    }
    let stem = |name: &str| name.replace([' ', ','], "-").replace("--", "-");
    let Some(named) = named.filter(|n| !n.ids.is_empty()) else {
        if elastic {
            let name = format!("{role} (pid {pid})");
            return (name, format!("{role}-pid-{pid}"));
        }
        return (spec.name.clone(), stem(&spec.name));
    };
    let ids: Vec<String> = named.ids.iter().map(NodeId::to_string).collect();
    let ranks: Option<Vec<String>> = named
        .ranks
        .iter()
        .map(|r| r.map(|r| r.to_string()))
        .collect();
    match (ids.as_slice(), ranks) {
        ([id], _) if elastic && spec.role == Role::Worker => {
            (format!("{role} (node {id})"), format!("{role}-node-{id}"))
        }
        ([id], Some(ranks)) => (
            format!("{role} {} (node {id})", ranks[0]),
            format!("{role}-{}", ranks[0]),
        ),
        ([id], None) => (format!("{role} (node {id})"), format!("{role}-node-{id}")),
        (ids, Some(ranks)) => (
            format!("{role}s {} (nodes {})", ranks.join(", "), ids.join(", ")),
            format!("{role}s-{}", ranks.join("-")),
        ),
        (ids, None) => (
            format!("{role}s (nodes {})", ids.join(", ")),
            format!("{role}s-node-{}", ids.join("-")),
        ),
    }
}

/// The process group of process `pid`, if it exists.
fn process_group(pid: u32) -> Option<u32> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: getpgid(2) only reads the kernel's process table.
    let group = unsafe { libc::getpgid(pid) };
    u32::try_from(group).ok()
}

/// Asks the scheduler at `host`:`port` for its table while processes sent
/// on `started` are unnamed, and sends each one found to `named`, once the
/// scheduler wrote `mark` (if given: see [`SchedulerMark`]). Ends when
/// `started` is closed.
pub fn name_nodes(
    host: &str,
    port: u16,
    env: &[(String, String)],
    mark: Option<&Path>,
    started: &Receiver<Unnamed>,
    named: &Sender<Named>,
) {
    let (local, token) = admin_settings(env);
    let mut client = None;
    let mut unnamed: Vec<Unnamed> = Vec::new();
    let since = Instant::now();
    let mut answered = false;
    loop {
        let next = if unnamed.is_empty() {
            started.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            started.recv_timeout(PERIOD)
        };
        match next {
            Ok(process) => {
                unnamed.retain(|u| u.index != process.index);
                unnamed.push(process);
                while let Ok(process) = started.try_recv() {
                    unnamed.retain(|u| u.index != process.index);
                    unnamed.push(process);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if !answered && since.elapsed() > GIVE_UP {
            // Not a pslite scheduler: drain `started` until the job ends.
            while started.recv().is_ok() {}
            return;
        }
        if !answered && !scheduler_is_pslite(mark) {
            continue;
        }
        if client.is_none() {
            client = admin_client(host, port, local, token.as_deref(), None).ok();
        }
        let Some(c) = client.as_mut() else { continue };
        let Ok(table) = c.status(PERIOD) else {
            continue;
        };
        answered = true;
        unnamed.retain(|process| match find(&table, process, process_group) {
            Some(found) => {
                let _ = named.send(found);
                false
            }
            None => true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(role: Role, id: NodeId, port: i32, pid: u32) -> NodeStatus {
        let mut row = crate::status::tests::row(role, id, port);
        row.node.pid = pid;
        row
    }

    #[test]
    fn a_process_is_the_node_that_advertises_its_port_or_a_pid_of_its_group() {
        let table = [
            row(Role::Scheduler, 1, 9000, 100),
            row(Role::Server, 8, 9001, 101),
            row(Role::Worker, 9, 9003, 0),
            row(Role::Worker, 11, 9002, 0),
            // Two workers of one --worker-procs process (pid 200, a child of 150).
            row(Role::Worker, 13, 9100, 200),
            row(Role::Worker, 15, 9101, 200),
        ];
        let groups = |pid| match pid {
            200 => Some(150),
            pid => Some(pid),
        };
        let process = |index, role, port, pid| Unnamed {
            index,
            pid,
            role,
            port,
        };
        let found = find(&table, &process(2, Role::Worker, Some(9002), 50), groups).unwrap();
        assert_eq!((found.ids, found.ranks), (vec![11], vec![Some(1)]));
        let found = find(&table, &process(1, Role::Server, Some(9001), 51), groups).unwrap();
        assert_eq!((found.ids, found.ranks), (vec![8], vec![Some(0)]));
        // The role must agree; an unknown port is no one.
        assert!(find(&table, &process(1, Role::Server, Some(9002), 51), groups).is_none());
        assert!(find(&table, &process(1, Role::Worker, Some(9999), 51), groups).is_none());
        // By process group, for processes without a PORT of their own.
        let found = find(&table, &process(3, Role::Worker, None, 150), groups).unwrap();
        assert_eq!(
            (found.ids, found.ranks),
            (vec![13, 15], vec![Some(2), Some(3)])
        );
        assert!(find(&table, &process(3, Role::Worker, None, 151), groups).is_none());
    }

    #[test]
    fn elastic_workers_take_their_round_rank_and_registered_nodes_wait_for_an_id() {
        let mut in_round = row(Role::Worker, 13, 9004, 0);
        in_round.round_rank = Some(0);
        let mut waiting = row(Role::Worker, 15, 9005, 0);
        waiting.waiting = true;
        let unassigned = row(Role::Worker, K_EMPTY, 9006, 0);
        let table = [in_round, waiting, unassigned];
        let process = |port| Unnamed {
            index: 4,
            pid: 60,
            role: Role::Worker,
            port: Some(port),
        };
        let ranks = |port| find(&table, &process(port), Some).map(|f| f.ranks);
        assert_eq!(ranks(9004), Some(vec![Some(0)]));
        assert_eq!(ranks(9005), Some(vec![None]));
        assert_eq!(ranks(9006), None);
    }

    #[test]
    fn names_go_by_role_and_rank_with_the_node_id() {
        let spec = |name: &str, role| NodeSpec {
            name: name.into(),
            role,
            program: "true".into(),
            args: Vec::new(),
            env: Vec::new(),
            own_port: true,
            expected_rank: None,
        };
        let named = |ids: Vec<NodeId>, ranks: Vec<Option<u32>>| Named {
            index: 1,
            pid: 40,
            ids,
            ranks,
        };
        let worker = spec("worker 1", Role::Worker);
        let names_of = |spec: &NodeSpec, found: Option<Named>, elastic| {
            names(spec, 40, found.as_ref(), elastic)
        };
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            names_of(&spec("scheduler", Role::Scheduler), None, false),
            pair("scheduler", "scheduler")
        );
        assert_eq!(names_of(&worker, None, false), pair("worker 1", "worker-1"));
        assert_eq!(
            names_of(&worker, Some(named(vec![11], vec![Some(1)])), false),
            pair("worker 1 (node 11)", "worker-1")
        );
        // Elastic: by process until registered, then by node id.
        assert_eq!(
            names_of(&worker, None, true),
            pair("worker (pid 40)", "worker-pid-40")
        );
        assert_eq!(
            names_of(&worker, Some(named(vec![13], vec![Some(0)])), true),
            pair("worker (node 13)", "worker-node-13")
        );
        assert_eq!(
            names_of(
                &spec("server 0", Role::Server),
                Some(named(vec![10], vec![Some(1)])),
                true
            ),
            pair("server 1 (node 10)", "server-1")
        );
        // A process of several workers.
        let procs = spec("worker process 0", Role::Worker);
        assert_eq!(
            names_of(&procs, None, false),
            pair("worker process 0", "worker-process-0")
        );
        assert_eq!(
            names_of(
                &procs,
                Some(named(vec![9, 13], vec![Some(0), Some(2)])),
                false
            ),
            pair("workers 0, 2 (nodes 9, 13)", "workers-0-2")
        );
    }

    #[test]
    fn only_a_scheduler_that_wrote_its_mark_is_asked() {
        let mark = SchedulerMark::new(0);
        assert!(scheduler_is_pslite(None));
        assert!(!scheduler_is_pslite(Some(mark.path())));
        std::fs::write(mark.path(), "garbage").unwrap();
        assert!(!scheduler_is_pslite(Some(mark.path())));
        std::fs::write(mark.path(), pslite::launched::mark_text(9091)).unwrap();
        assert!(scheduler_is_pslite(Some(mark.path())));
        let path = mark.path().to_path_buf();
        drop(mark);
        assert!(!path.exists());
    }

    #[test]
    fn a_process_group_is_read_from_the_kernel() {
        let me = std::process::id();
        // SAFETY: getpgrp(2) has no preconditions.
        let group = unsafe { libc::getpgrp() };
        assert_eq!(process_group(me), u32::try_from(group).ok());
        assert_eq!(process_group(u32::MAX), None);
    }
}
