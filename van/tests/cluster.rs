//! Several Vans in one process forming a real cluster over loopback TCP and
//! IPC: joining, ids, barriers, data delivery, lazy connections.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use pslite_proto::ids;
use pslite_proto::{Message, Role};
use pslite_van::{Call, Dispatch, Transport, Van, VanConfig, VanError};

struct ToChannel(Sender<Message>);

impl Dispatch for ToChannel {
    fn deliver(&self, msg: Message) {
        let _ = self.0.send(msg);
    }
}

struct Cluster {
    scheduler: Arc<Van>,
    servers: Vec<Arc<Van>>,
    workers: Vec<Arc<Van>>,
    inboxes: Vec<Receiver<Message>>,
}

fn config(role: Role, s: i32, w: i32, port: i32, transport: Transport) -> VanConfig {
    let mut c = VanConfig::local(role, s, w, port);
    c.transport = transport;
    c.start_timeout = Duration::from_secs(20);
    c
}

fn start(role: Role, s: i32, w: i32, port: i32, t: Transport) -> (Arc<Van>, Receiver<Message>) {
    let (tx, rx) = unbounded();
    let van = Van::start(config(role, s, w, port, t), Arc::new(ToChannel(tx))).unwrap();
    (Arc::new(van), rx)
}

fn form(s: i32, w: i32, transport: Transport) -> Cluster {
    let port = if transport == Transport::Ipc {
        rand_port()
    } else {
        0
    };
    let (scheduler, rx) = start(Role::Scheduler, s, w, port, transport);
    let port = scheduler.my_node().port;
    let mut inboxes = vec![rx];
    let mut servers = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..s {
        let (van, rx) = start(Role::Server, s, w, port, transport);
        servers.push(van);
        inboxes.push(rx);
    }
    for _ in 0..w {
        let (van, rx) = start(Role::Worker, s, w, port, transport);
        workers.push(van);
        inboxes.push(rx);
    }
    let all: Vec<Arc<Van>> = std::iter::once(scheduler.clone())
        .chain(servers.iter().cloned())
        .chain(workers.iter().cloned())
        .collect();
    let joins: Vec<_> = all
        .iter()
        .cloned()
        .map(|van| thread::spawn(move || van.call(Call::Join { customer: 0 }, None)))
        .collect();
    for j in joins {
        j.join().unwrap().unwrap();
    }
    Cluster {
        scheduler,
        servers,
        workers,
        inboxes,
    }
}

fn rand_port() -> i32 {
    30_000 + (std::process::id() as i32 % 20_000)
}

impl Cluster {
    fn all(&self) -> Vec<Arc<Van>> {
        std::iter::once(self.scheduler.clone())
            .chain(self.servers.iter().cloned())
            .chain(self.workers.iter().cloned())
            .collect()
    }

    /// Every node of `group` runs a barrier over it, `rounds` times.
    fn barrier(&self, group: i32, rounds: usize) {
        let members: Vec<_> = self
            .all()
            .into_iter()
            .filter(|v| ids::group_contains(group, v.my_node().id))
            .collect();
        let joins: Vec<_> = members
            .into_iter()
            .map(|van| {
                thread::spawn(move || {
                    for _ in 0..rounds {
                        van.call(
                            Call::Barrier { customer: 0, group },
                            Some(Duration::from_secs(20)),
                        )?;
                    }
                    Ok::<(), VanError>(())
                })
            })
            .collect();
        for j in joins {
            j.join().unwrap().unwrap();
        }
    }
}

#[test]
fn nodes_get_ids_by_role_and_address() {
    let c = form(2, 3, Transport::Tcp);
    assert_eq!(c.scheduler.my_node().id, 1);
    let mut server_ids: Vec<_> = c.servers.iter().map(|v| v.my_node().id).collect();
    let mut worker_ids: Vec<_> = c.workers.iter().map(|v| v.my_node().id).collect();
    server_ids.sort();
    worker_ids.sort();
    assert_eq!(server_ids, vec![8, 10]);
    assert_eq!(worker_ids, vec![9, 11, 13]);
    // Ids follow the port order (all on 127.0.0.1).
    let mut by_port: Vec<_> = c.workers.iter().map(|v| v.my_node()).collect();
    by_port.sort_by_key(|n| n.port);
    assert_eq!(
        by_port.iter().map(|n| n.id).collect::<Vec<_>>(),
        vec![9, 11, 13]
    );
    // Servers and the scheduler know the whole table; a worker the
    // servers, the scheduler and itself (it talks to no other worker).
    for van in c.all() {
        let entries = if van.my_node().role == Role::Worker {
            4
        } else {
            6
        };
        assert_eq!(van.nodes().len(), entries);
    }
}

#[test]
fn barriers_over_every_group() {
    let c = form(2, 2, Transport::Tcp);
    for group in 1..=7 {
        c.barrier(group, 3);
    }
}

#[test]
fn barrier_rejects_groups_without_this_node() {
    let c = form(1, 1, Transport::Tcp);
    let worker = &c.workers[0];
    for group in [0, 1, 2, 3, 8, 9, -4] {
        assert!(matches!(
            worker.call(
                Call::Barrier { customer: 0, group },
                Some(Duration::from_secs(1))
            ),
            Err(VanError::InvalidGroup(_))
        ));
    }
}

#[test]
fn data_reaches_the_receiver_with_sender_id() {
    let c = form(1, 2, Transport::Tcp);
    let worker = &c.workers[0];
    let server_id = c.servers[0].my_node().id;
    let mut msg = Message::default();
    msg.meta.recver = server_id;
    msg.meta.app_id = 0;
    msg.meta.customer_id = 0;
    msg.meta.timestamp = 42;
    msg.meta.request = true;
    msg.meta.push = true;
    msg.data = vec![bytes::Bytes::from(vec![1u8; 1 << 20]), bytes::Bytes::new()];
    msg.meta.data_type = vec![
        pslite_proto::DataType::UInt64,
        pslite_proto::DataType::Float,
    ];
    worker.send(msg).unwrap();
    let got = c.inboxes[1].recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(got.meta.sender, worker.my_node().id);
    assert_eq!(got.meta.recver, server_id);
    assert_eq!(got.meta.timestamp, 42);
    assert_eq!(got.data[0].len(), 1 << 20);
    assert!(got.data[1].is_empty());
    // A worker holds no other worker (as in C++ ps-lite, workers talk to
    // servers and the scheduler only): sending to one is an error.
    let other = c.workers[1].my_node().id;
    let mut msg = Message::default();
    msg.meta.recver = other;
    msg.meta.app_id = 0;
    msg.meta.simple_app = true;
    assert!(matches!(worker.send(msg), Err(VanError::UnknownPeer(id)) if id == other));
    // Unknown peers are an error, not a panic.
    let mut msg = Message::default();
    msg.meta.recver = 99;
    assert!(matches!(worker.send(msg), Err(VanError::UnknownPeer(99))));
}

#[test]
fn ipc_transport_forms_a_cluster() {
    let c = form(1, 1, Transport::Ipc);
    c.barrier(7, 2);
}

#[test]
fn a_missing_node_times_out_with_the_count() {
    let (tx, _rx) = unbounded();
    let mut cfg = config(Role::Scheduler, 2, 1, 0, Transport::Tcp);
    cfg.start_timeout = Duration::from_millis(500);
    let scheduler = Van::start(cfg, Arc::new(ToChannel(tx))).unwrap();
    let port = scheduler.my_node().port;
    let (tx, _rx) = unbounded();
    let mut cfg = config(Role::Worker, 2, 1, port, Transport::Tcp);
    cfg.start_timeout = Duration::from_millis(800);
    let w = Van::start(cfg, Arc::new(ToChannel(tx))).unwrap();
    let join = thread::spawn(move || w.call(Call::Join { customer: 0 }, None));
    match scheduler
        .call(Call::Join { customer: 0 }, None)
        .unwrap_err()
    {
        VanError::StartTimeout(t) => {
            assert_eq!((t.missing_servers, t.missing_workers), (Some(2), Some(0)));
            assert!(
                t.to_string().contains("2 of 2 servers and 0 of 1 workers"),
                "{t}"
            );
        }
        other => panic!("expected a start timeout, got {other}"),
    }
    match join.join().unwrap().unwrap_err() {
        VanError::StartTimeout(t) => assert_eq!(t.missing_servers, None),
        other => panic!("expected a start timeout, got {other}"),
    }
}

#[test]
fn an_unreachable_scheduler_times_out() {
    let mut cfg = config(Role::Worker, 1, 1, 1, Transport::Tcp);
    cfg.start_timeout = Duration::from_millis(300);
    let (tx, _rx) = unbounded();
    let worker = Van::start(cfg, Arc::new(ToChannel(tx))).unwrap();
    let err = worker.call(Call::Join { customer: 0 }, None).unwrap_err();
    assert!(matches!(err, VanError::StartTimeout(_)), "{err}");
}

/// Panics on the first data message it is given.
struct Exploding;

impl Dispatch for Exploding {
    fn deliver(&self, _msg: Message) {
        panic!("the dispatch exploded on purpose");
    }
}

#[test]
fn if_the_receive_thread_dies_every_wait_fails_at_once() {
    // A 1 + 1 cluster whose server's dispatch explodes on its first message.
    let (scheduler, _rx) = start(Role::Scheduler, 1, 1, 0, Transport::Tcp);
    let port = scheduler.my_node().port;
    let server = Arc::new(
        Van::start(
            config(Role::Server, 1, 1, port, Transport::Tcp),
            Arc::new(Exploding),
        )
        .unwrap(),
    );
    let (worker, _wrx) = start(Role::Worker, 1, 1, port, Transport::Tcp);
    let joins: Vec<_> = [scheduler.clone(), server.clone(), worker.clone()]
        .into_iter()
        .map(|van| thread::spawn(move || van.call(Call::Join { customer: 0 }, None)))
        .collect();
    for j in joins {
        j.join().unwrap().unwrap();
    }
    // The server waits on a barrier nobody else joins; the worker's data
    // message kills its receive thread, which must end that wait.
    let waiter = {
        let server = server.clone();
        thread::spawn(move || {
            server.call(
                Call::Barrier {
                    customer: 0,
                    group: ids::ALL_GROUP,
                },
                Some(Duration::from_secs(60)),
            )
        })
    };
    let mut msg = Message::default();
    msg.meta.app_id = 0;
    msg.meta.customer_id = 0;
    msg.meta.request = true;
    msg.meta.timestamp = 0;
    msg.meta.recver = server.my_node().id;
    worker.send(msg).unwrap();
    let err = waiter.join().unwrap().unwrap_err();
    assert!(
        matches!(
            err.failure(),
            Some(pslite_van::Failure::ReceiveThreadDied { .. })
        ),
        "{err}"
    );
    // Later calls fail at once too.
    let err = server
        .call(
            Call::Barrier {
                customer: 0,
                group: ids::ALL_GROUP,
            },
            None,
        )
        .unwrap_err();
    assert!(matches!(
        err.failure(),
        Some(pslite_van::Failure::ReceiveThreadDied { .. })
    ));
}
