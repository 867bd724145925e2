//! The raw ZeroMQ baseline: servers and clients (processes of this program with the hidden
//! `--raw-server`/`--raw-client` options, or threads of the driver) that move the same bytes as a
//! pslite cluster, ROUTER to DEALER, with no meta and no bookkeeping.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pslite::Error;

use crate::driver::median;

/// How the raw baseline's nodes run (`--raw-layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RawLayout {
    /// Every server and every client a process of its own, as pslite runs
    /// each node: the same launch shape (S + W processes).
    Processes,
    /// Servers and clients as threads of the driver, each with its own
    /// ZeroMQ context (the layout before 2026-11-23), to compare with.
    Threads,
}

/// What one raw request asks of the servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawRequest {
    /// Servers the request is split over (the first `fanout`).
    fanout: usize,
    /// Bytes sent in all (split evenly over the servers).
    size: usize,
    /// Whether each server sends its share of the request back (zero-copy,
    /// the received frame itself), as a pslite server answers a pull with
    /// the request's keys.
    echo: bool,
    /// Bytes each server's reply carries besides the echo, in all (split
    /// evenly): the values of a pull, a small ack for a push.
    extra: usize,
    /// Timed round trips (after up to 20 untimed ones).
    iters: usize,
}

impl RawRequest {
    /// A request of `size` bytes answered with `reply` bytes.
    fn push(fanout: usize, size: usize, reply: usize, iters: usize) -> RawRequest {
        RawRequest {
            fanout,
            size,
            echo: false,
            extra: reply,
            iters,
        }
    }

    /// The line a client process reads on stdin.
    fn line(&self) -> String {
        format!(
            "RUN {} {} {} {} {}\n",
            self.fanout,
            self.size,
            u8::from(self.echo),
            self.extra,
            self.iters
        )
    }

    fn parse(line: &str) -> Option<RawRequest> {
        let mut words = line.split_whitespace();
        if words.next() != Some("RUN") {
            return None;
        }
        let mut num = || words.next().and_then(|w| w.parse::<usize>().ok());
        let (fanout, size, echo, extra, iters) = (num()?, num()?, num()?, num()?, num()?);
        Some(RawRequest {
            fanout,
            size,
            echo: echo == 1,
            extra,
            iters,
        })
    }
}

/// Raw ZeroMQ clusters of `servers` x `workers`, started on first use.
pub(crate) struct Raw {
    layout: RawLayout,
    clusters: Vec<((usize, usize), RawCluster)>,
    /// Over abstract Unix sockets (`ipc://@`, the path same-host pslite
    /// nodes take) instead of TCP loopback.
    pub(crate) ipc: bool,
}

impl Raw {
    pub(crate) fn new(layout: RawLayout) -> Raw {
        Raw {
            layout,
            clusters: Vec::new(),
            ipc: false,
        }
    }

    /// Median (over workers, of each worker's median) round trip in µs of a
    /// request of `size` bytes answered with `reply` bytes, split over
    /// `fanout` servers like a pslite request (each worker at once).
    pub(crate) fn round_trip_us(
        &mut self,
        servers: usize,
        workers: usize,
        fanout: usize,
        size: usize,
        reply: usize,
        iters: usize,
    ) -> Result<f64, Error> {
        self.run(
            servers,
            workers,
            RawRequest::push(fanout, size, reply, iters),
        )
    }

    /// As `round_trip_us` for a pull: `keys` bytes out, the same keys
    /// (echoed) and `vals` bytes of values back, split over `fanout`
    /// servers.
    pub(crate) fn pull_us(
        &mut self,
        servers: usize,
        workers: usize,
        fanout: usize,
        keys: usize,
        vals: usize,
        iters: usize,
    ) -> Result<f64, Error> {
        let req = RawRequest {
            fanout,
            size: keys,
            echo: true,
            extra: vals,
            iters,
        };
        self.run(servers, workers, req)
    }

    fn run(&mut self, servers: usize, workers: usize, req: RawRequest) -> Result<f64, Error> {
        let key = (servers, workers);
        if !self.clusters.iter().any(|(k, _)| *k == key) {
            let cluster = RawCluster::start(servers, workers, self.layout, self.ipc)?;
            self.clusters.push((key, cluster));
        }
        let cluster = self
            .clusters
            .iter_mut()
            .find(|(k, _)| *k == key)
            .map(|(_, c)| c)
            .ok_or_else(|| Error::App("raw cluster vanished".into()))?;
        // Client processes start together: each is told before any answer
        // is read.
        for client in &mut cluster.clients {
            if let RawClientNode::Process(p) = client {
                p.say(&req.line())?;
            }
        }
        let medians: Vec<Result<f64, Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = cluster
                .clients
                .iter_mut()
                .map(|client| {
                    scope.spawn(move || match client {
                        RawClientNode::Local(c) => Ok(c.round_trip_us(&req)),
                        RawClientNode::Process(p) => {
                            let line = p.read_line()?;
                            line.strip_prefix("MEDIAN ")
                                .and_then(|v| v.trim().parse::<f64>().ok())
                                .ok_or_else(|| Error::App(format!("a raw client said {line:?}")))
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::App("a raw client panicked".into())))
                })
                .collect()
        });
        let mut medians = medians.into_iter().collect::<Result<Vec<f64>, Error>>()?;
        Ok(median(&mut medians))
    }
}

/// Raw ZeroMQ in ps-lite's topology: every node binds a ROUTER and sends
/// through its own DEALER per peer (identities `ps<id>`, servers
/// `ps<8+2s>`, clients `ps<9+2c>`); a client's request is split evenly over
/// the servers, each answers with its share. Frames move as pslite moves
/// them: sent by reference, received into ZeroMQ's buffers, no copies.
pub(crate) struct RawCluster {
    clients: Vec<RawClientNode>,
    servers: Vec<RawServerNode>,
    stop_endpoints: Vec<String>,
    ctx: zmq::Context,
}

pub(crate) enum RawClientNode {
    Local(RawClient),
    Process(RawProcess),
}

pub(crate) enum RawServerNode {
    Thread(std::thread::JoinHandle<()>),
    Process(RawProcess),
}

/// A raw node started as a process of this program: it prints
/// `ENDPOINT <endpoint>` first, then reads commands on its stdin and exits
/// when stdin closes (so also when this process is killed).
pub(crate) struct RawProcess {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    endpoint: String,
}

impl RawProcess {
    fn spawn(role: &[String]) -> Result<RawProcess, Error> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::App(format!("cannot find this program: {e}")))?;
        let mut child = Command::new(&exe)
            .args(role)
            .env_remove("DMLC_ROLE")
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::App(format!("cannot start a raw node: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::App("a raw node has no stdin or stdout".into()));
        };
        let mut p = RawProcess {
            child,
            stdin: Some(stdin),
            stdout: std::io::BufReader::new(stdout),
            endpoint: String::new(),
        };
        let line = p.read_line()?;
        match line.trim().strip_prefix("ENDPOINT ") {
            Some(endpoint) => p.endpoint = endpoint.to_string(),
            None => return Err(Error::App(format!("a raw node said {line:?}"))),
        }
        Ok(p)
    }

    fn say(&mut self, line: &str) -> Result<(), Error> {
        use std::io::Write;
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Error::App("a raw node's stdin is closed".into()))?;
        stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| Error::App(format!("cannot talk to a raw node: {e}")))
    }

    fn read_line(&mut self) -> Result<String, Error> {
        use std::io::BufRead;
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err(Error::App("a raw node exited".into())),
            Ok(_) => Ok(line),
            Err(e) => Err(Error::App(format!("cannot read a raw node: {e}"))),
        }
    }

    /// Closes its stdin and waits for it to exit until `deadline`, then
    /// kills it.
    fn finish(mut self, deadline: Instant) {
        drop(self.stdin.take());
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw client: a DEALER to each server and its own ROUTER for replies.
pub(crate) struct RawClient {
    to_servers: Vec<zmq::Socket>,
    inbox: zmq::Socket,
    /// The request's bytes, kept between runs of the same size.
    payload: Bytes,
    _ctx: zmq::Context,
}

pub(crate) fn raw_err(e: zmq::Error) -> Error {
    Error::App(format!("raw ZeroMQ: {e}"))
}

/// A ROUTER bound to a free loopback port (or a fresh abstract Unix
/// socket), and its endpoint.
pub(crate) fn raw_router(ctx: &zmq::Context, ipc: bool) -> Result<(zmq::Socket, String), Error> {
    let router = ctx.socket(zmq::ROUTER).map_err(raw_err)?;
    if ipc {
        static ROUTERS: AtomicU64 = AtomicU64::new(0);
        let n = ROUTERS.fetch_add(1, Ordering::Relaxed);
        let endpoint = format!("ipc://@kv_bench-raw-{}-{n}", std::process::id());
        router.bind(&endpoint).map_err(raw_err)?;
        return Ok((router, endpoint));
    }
    // KV_BENCH_RAW_HOST: the address to listen on (tests/bench/links.py
    // runs raw nodes in network namespaces of their own); loopback by default.
    let host = std::env::var("KV_BENCH_RAW_HOST").unwrap_or_else(|_| "127.0.0.1".into());
    router.bind(&format!("tcp://{host}:*")).map_err(raw_err)?;
    let endpoint = router
        .get_last_endpoint()
        .map_err(raw_err)?
        .unwrap_or_default();
    Ok((router, endpoint))
}

pub(crate) fn raw_dealer(
    ctx: &zmq::Context,
    identity: &str,
    endpoint: &str,
) -> Result<zmq::Socket, Error> {
    let dealer = ctx.socket(zmq::DEALER).map_err(raw_err)?;
    dealer.set_identity(identity.as_bytes()).map_err(raw_err)?;
    dealer.connect(endpoint).map_err(raw_err)?;
    Ok(dealer)
}

/// DEALERs from node `id` (`ps<id>`: servers 8 + 2r, clients 9 + 2r, as
/// ps-lite numbers them) to each endpoint.
pub(crate) fn raw_dealers(
    ctx: &zmq::Context,
    id: usize,
    endpoints: &[String],
) -> Result<Vec<zmq::Socket>, Error> {
    let identity = format!("ps{id}");
    endpoints
        .iter()
        .map(|ep| raw_dealer(ctx, &identity, ep))
        .collect()
}

impl RawCluster {
    fn start(
        servers: usize,
        workers: usize,
        layout: RawLayout,
        ipc: bool,
    ) -> Result<RawCluster, Error> {
        let mut cluster = RawCluster {
            clients: Vec::new(),
            servers: Vec::new(),
            stop_endpoints: Vec::new(),
            ctx: zmq::Context::new(),
        };
        // Clients first (the servers connect to their ROUTERs), then the
        // servers, then the clients' DEALERs to the servers. One ZeroMQ
        // context (one I/O thread) per node in either layout.
        match layout {
            RawLayout::Processes => {
                let mut procs = Vec::new();
                let ipc_flag: Vec<String> =
                    ipc.then(|| "--raw-ipc".to_string()).into_iter().collect();
                for c in 0..workers {
                    let mut role = vec!["--raw-client".to_string(), c.to_string()];
                    role.extend(ipc_flag.iter().cloned());
                    procs.push(RawProcess::spawn(&role)?);
                }
                let client_eps: Vec<String> = procs.iter().map(|p| p.endpoint.clone()).collect();
                for s in 0..servers {
                    let mut role = vec![
                        "--raw-server".to_string(),
                        s.to_string(),
                        "--raw-clients".to_string(),
                        client_eps.join(","),
                    ];
                    role.extend(ipc_flag.iter().cloned());
                    let p = RawProcess::spawn(&role)?;
                    cluster.stop_endpoints.push(p.endpoint.clone());
                    cluster.servers.push(RawServerNode::Process(p));
                }
                let line = format!("CONNECT {}\n", cluster.stop_endpoints.join(","));
                for mut p in procs {
                    p.say(&line)?;
                    cluster.clients.push(RawClientNode::Process(p));
                }
            }
            RawLayout::Threads => {
                let mut locals = Vec::new();
                for _ in 0..workers {
                    let ctx = zmq::Context::new();
                    let (inbox, endpoint) = raw_router(&ctx, ipc)?;
                    locals.push((ctx, inbox, endpoint));
                }
                let client_eps: Vec<String> = locals.iter().map(|l| l.2.clone()).collect();
                for s in 0..servers {
                    let ctx = zmq::Context::new();
                    let (inbox, endpoint) = raw_router(&ctx, ipc)?;
                    let mut to_clients = raw_dealers(&ctx, 8 + 2 * s, &client_eps)?;
                    cluster.stop_endpoints.push(endpoint);
                    cluster
                        .servers
                        .push(RawServerNode::Thread(std::thread::spawn(move || {
                            let _ctx = ctx;
                            raw_serve(&inbox, &mut to_clients);
                        })));
                }
                for (c, (ctx, inbox, _)) in locals.into_iter().enumerate() {
                    cluster.clients.push(RawClientNode::Local(RawClient {
                        to_servers: raw_dealers(&ctx, 9 + 2 * c, &cluster.stop_endpoints)?,
                        inbox,
                        payload: Bytes::new(),
                        _ctx: ctx,
                    }));
                }
            }
        }
        Ok(cluster)
    }
}

/// A raw server's loop: answers every request as its meta asks, until a
/// `stop` message or a receive error.
pub(crate) fn raw_serve(inbox: &zmq::Socket, to_clients: &mut [zmq::Socket]) {
    // The values a reply carries: one buffer, sent again and again by
    // reference, as pslite's bench server keeps one zero array.
    let mut vals = Bytes::new();
    loop {
        // Received as pslite receives: frames stay in ZeroMQ's buffers.
        let Ok(raw) = pslite_van::transport::recv_message(inbox) else {
            return;
        };
        let Some(meta) = raw.meta else {
            return;
        };
        if &meta[..] == b"stop" {
            return;
        }
        // The meta: echo flag (1 byte), then the extra reply size (u64 LE).
        let echo = meta.first() == Some(&1);
        let extra = meta
            .get(1..9)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0) as usize;
        if extra != vals.len() {
            vals = Bytes::from(vec![0u8; extra]);
        }
        // The sender is ps<9+2c>.
        let Some(out) = usize::try_from((raw.sender - 9) / 2)
            .ok()
            .and_then(|c| to_clients.get_mut(c))
        else {
            continue;
        };
        let _ = match raw.data.first() {
            Some(request) if echo => {
                let frames = [request.clone(), vals.clone()];
                pslite_van::transport::send_message(out, b"reply", &frames)
            }
            _ => pslite_van::transport::send_message(out, b"reply", std::slice::from_ref(&vals)),
        };
    }
}

/// A raw ZeroMQ server process (`--raw-server`): binds a ROUTER, prints
/// `ENDPOINT <endpoint>`, connects a DEALER to each client and answers every
/// request as its meta asks, until told to stop or its stdin closes.
pub(crate) fn raw_server_process(rank: usize, clients: &str, ipc: bool) -> Result<(), Error> {
    let ctx = zmq::Context::new();
    let (inbox, endpoint) = raw_router(&ctx, ipc)?;
    let clients: Vec<String> = clients
        .split(',')
        .filter(|ep| !ep.is_empty())
        .map(str::to_string)
        .collect();
    let mut to_clients = raw_dealers(&ctx, 8 + 2 * rank, &clients)?;
    // Exit with the driver: its end of our stdin closes when it exits,
    // however it exits.
    std::thread::spawn(|| {
        use std::io::Read;
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        std::process::exit(0);
    });
    say_endpoint(&endpoint)?;
    raw_serve(&inbox, &mut to_clients);
    Ok(())
}

pub(crate) fn say_endpoint(endpoint: &str) -> Result<(), Error> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ENDPOINT {endpoint}")
        .and_then(|()| out.flush())
        .map_err(|e| Error::App(format!("cannot write to stdout: {e}")))
}

/// A raw ZeroMQ client process (`--raw-client`): binds a ROUTER, prints
/// `ENDPOINT <endpoint>`, then reads commands on stdin until it closes:
/// `CONNECT <server endpoints>` and `RUN ...` (see [`RawRequest::line`]),
/// answering each run with `MEDIAN <µs>`.
pub(crate) fn raw_client_process(rank: usize, ipc: bool) -> Result<(), Error> {
    use std::io::{BufRead, Write};
    let ctx = zmq::Context::new();
    let (inbox, endpoint) = raw_router(&ctx, ipc)?;
    say_endpoint(&endpoint)?;
    let read_err = |e: std::io::Error| Error::App(format!("cannot read stdin: {e}"));
    let mut lines = std::io::stdin().lock().lines();
    let Some(first) = lines.next() else {
        return Ok(());
    };
    let first = first.map_err(read_err)?;
    let servers: Vec<String> = first
        .strip_prefix("CONNECT ")
        .ok_or_else(|| Error::App(format!("a raw client was told {first:?}")))?
        .split(',')
        .map(str::to_string)
        .collect();
    let mut client = RawClient {
        to_servers: raw_dealers(&ctx, 9 + 2 * rank, &servers)?,
        inbox,
        payload: Bytes::new(),
        _ctx: ctx,
    };
    for line in lines {
        let line = line.map_err(read_err)?;
        let req = RawRequest::parse(&line)
            .ok_or_else(|| Error::App(format!("a raw client was told {line:?}")))?;
        let us = client.round_trip_us(&req);
        let mut out = std::io::stdout().lock();
        if writeln!(out, "MEDIAN {us}")
            .and_then(|()| out.flush())
            .is_err()
        {
            // The driver is gone.
            return Ok(());
        }
    }
    Ok(())
}

impl RawClient {
    /// Median round trip (µs) of `req`: its bytes out, split evenly over
    /// the first `fanout` servers (those a pslite request of that size
    /// reaches), and their replies back.
    fn round_trip_us(&mut self, req: &RawRequest) -> f64 {
        let n = req.fanout.clamp(1, self.to_servers.len().max(1));
        let share = req.size.div_ceil(n);
        if self.payload.len() != share {
            self.payload = Bytes::from(vec![1u8; share]);
        }
        let mut meta = vec![u8::from(req.echo)];
        meta.extend_from_slice(&(req.extra.div_ceil(n) as u64).to_le_bytes());
        meta.extend_from_slice(&[0u8; 12]);
        let warmup = req.iters.min(20);
        let mut samples = Vec::with_capacity(req.iters);
        for i in 0..req.iters + warmup {
            let t = Instant::now();
            for out in &mut self.to_servers[..n] {
                let sent = pslite_van::transport::send_message(
                    out,
                    &meta,
                    std::slice::from_ref(&self.payload),
                );
                if sent.is_err() {
                    return f64::NAN;
                }
            }
            for _ in 0..n {
                if pslite_van::transport::recv_message(&self.inbox).is_err() {
                    return f64::NAN;
                }
            }
            if i >= warmup {
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        median(&mut samples)
    }
}

impl Drop for RawCluster {
    fn drop(&mut self) {
        for endpoint in &self.stop_endpoints {
            if let Ok(s) = self.ctx.socket(zmq::DEALER) {
                let _ = s.set_linger(1000);
                if s.connect(endpoint).is_ok() {
                    let _ = s.send(&b"stop"[..], 0);
                }
            }
        }
        // Processes that miss the stop message (or clients, which get
        // none) exit when their stdin closes; any left at the deadline are
        // killed.
        let deadline = Instant::now() + Duration::from_secs(10);
        for client in self.clients.drain(..) {
            if let RawClientNode::Process(p) = client {
                p.finish(deadline);
            }
        }
        for server in self.servers.drain(..) {
            match server {
                RawServerNode::Process(p) => p.finish(deadline),
                RawServerNode::Thread(t) => {
                    // A thread that missed its stop message is left behind.
                    while !t.is_finished() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if t.is_finished() {
                        let _ = t.join();
                    }
                }
            }
        }
    }
}
