//! The launching process of `pslite demo`: starts the cluster with the
//! [launcher](crate::launcher), prints its progress from the nodes'
//! reports, adds and kills workers for `--elastic`, and sums up.

use std::net::TcpListener;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, RecvTimeoutError};
use pslite::Error;

use super::args::DemoArgs;
use super::churn::{Elastic, Failover};
use super::plot;
use super::progress::Progress;
use super::report::{self, group, megabytes, plural, Report};
use crate::launcher::{
    launch_with, status_command, Control, LaunchError, LaunchOptions, Outcome, PortReservation,
};

/// What the launching process hears while the cluster runs.
enum Event {
    Report(Report),
    Done(Result<Outcome, LaunchError>),
}

impl From<Report> for Event {
    fn from(report: Report) -> Event {
        Event::Report(report)
    }
}

/// With `--checkpoint-dir DIR`: the epoch the checkpoint the job resumes
/// (the one `DIR/LATEST` names) was written after, with `--resume` (said on
/// stdout; none is an error), else 0 (and `dir` must hold none: the job
/// would resume it).
fn resume_epoch(dir: &std::path::Path, resume: bool) -> Result<usize, Error> {
    use pslite::checkpoint::{disk, format};
    let found = disk::scan(dir).map_err(Error::App)?;
    let latest = disk::read_latest(dir).map_err(Error::App)?;
    let Some((_, id)) = latest else {
        if resume {
            return Err(Error::App(format!(
                "--resume: {} holds no complete checkpoint (no {})",
                dir.display(),
                disk::LATEST
            )));
        }
        if let Some(f) = found.first() {
            return Err(Error::App(format!(
                "{} holds checkpoint {} but none to resume: use another --checkpoint-dir",
                dir.display(),
                f.id
            )));
        }
        return Ok(0);
    };
    if !resume {
        return Err(Error::App(format!(
            "{} holds checkpoint {id}: add --resume to start from it, or use another \
             --checkpoint-dir",
            dir.display()
        )));
    }
    let path = disk::checkpoint_dir(dir, id).join(disk::MANIFEST);
    let shown = path.display();
    let manifest = match found
        .iter()
        .find(|f| f.id == id)
        .and_then(|f| f.manifest.clone())
    {
        Some(Ok(bytes)) => format::decode_manifest(&bytes)
            .map_err(|e| Error::App(format!("--resume: {shown}: {e}")))?,
        Some(Err(e)) => return Err(Error::App(format!("--resume: {shown}: {e}"))),
        None => return Err(Error::App(format!("--resume: {shown} is missing"))),
    };
    let epoch = super::node::label_epoch(&manifest.label).ok_or_else(|| {
        Error::App(format!(
            "--resume: checkpoint {} in {} ({:?}) was not written by pslite demo",
            manifest.id,
            dir.display(),
            manifest.label
        ))
    })?;
    println!(
        "resuming from checkpoint {} (written after epoch {epoch}) in {}",
        manifest.id,
        dir.display()
    );
    Ok(epoch)
}

/// Runs the cluster, prints its progress and summary; the exit code says
/// whether training reached the threshold.
pub fn run_cluster(args: &DemoArgs) -> Result<ExitCode, Error> {
    let mut program = crate::self_program()
        .map_err(|e| Error::App(format!("cannot find this program to launch it: {e}")))?
        .into_iter();
    let program_name = program.next().unwrap_or_default();
    let leading: Vec<std::ffi::OsString> = program.collect();
    let host = "127.0.0.1";
    let listener = TcpListener::bind((host, 0))
        .map_err(|e| Error::App(format!("cannot listen for reports on {host}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::App(format!("cannot listen for reports on {host}: {e}")))?;
    let mut env = Vec::new();
    let mut args = args.clone();
    if let Some(dir) = &args.checkpoint_dir {
        args.resume_epoch = resume_epoch(dir, args.resume)?;
        env.push(("PS_CHECKPOINT_DIR".to_string(), dir.display().to_string()));
    }
    let args = &args;
    if args.replicas >= 2 {
        env.push(("PS_REPLICAS".to_string(), args.replicas.to_string()));
    }
    if args.elastic || args.kill_server.is_some() {
        // A killed worker is noticed by its missing heartbeats: soon.
        use pslite::settings::{environment, PS_HEARTBEAT_INTERVAL, PS_HEARTBEAT_TIMEOUT};
        for (var, value) in [(PS_HEARTBEAT_INTERVAL, "1"), (PS_HEARTBEAT_TIMEOUT, "3")] {
            if !var.is_set(&environment()) {
                env.push((var.name.to_string(), value.to_string()));
            }
        }
    }
    // The scheduler's port, held until the job ends (see PortReservation),
    // so that the address is known before anything starts.
    let (port, reservation) = match args.port {
        Some(port) => (port, None),
        None => {
            let held = PortReservation::new(host)
                .map_err(|e| Error::App(format!("cannot find a free port on {host}: {e}")))?;
            (held.port(), Some(held))
        }
    };
    println!(
        "scheduler at {host}:{port}; see the job with: {}",
        status_command(host, port, &env)
    );
    let opts = LaunchOptions {
        servers: args.servers,
        workers: args.workers,
        elastic: args.elastic.then_some((args.workers, args.workers + 2)),
        env,
        worker_procs: None,
        host: host.into(),
        port: Some(port),
        timeout: Some(Duration::from_secs_f64(args.timeout)),
        program: program_name,
        args: leading
            .into_iter()
            .chain(args.node_args(&addr.to_string()))
            .collect(),
        announce: false,
        ..LaunchOptions::default()
    };
    print_header(args);

    let (tx, rx) = unbounded();
    {
        let tx = tx.clone();
        std::thread::spawn(move || report::collect(listener, tx));
    }
    let started = Instant::now();
    let (control, requests) = unbounded();
    std::thread::spawn(move || {
        let _ = tx.send(Event::Done(launch_with(&opts, &requests)));
    });
    let mut elastic = Elastic::new(args);
    let mut failover = Failover::new(args);

    let mut epochs: Vec<(usize, f64, f64, f64)> = Vec::new();
    let mut progress = Progress::new(args.epochs);
    let mut workers: Vec<(u64, u64, u64)> = Vec::new();
    let mut servers: Vec<(usize, usize)> = Vec::new();
    let mut wire_bytes = 0u64;
    // --staleness: pulls held, the largest gap, worker 0's time.
    let mut stale = (0u64, 0u64, None::<Option<f64>>);
    let mut outcome = None;
    let mut linger = None;
    loop {
        // After the cluster is done, wait briefly for the last reports.
        let event = match linger {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(deadline) => rx.recv_deadline(deadline),
        };
        let event = match event {
            Ok(event) => event,
            Err(_) => break,
        };
        match event {
            Event::Report(report) => {
                match &report {
                    Report::Epoch {
                        epoch,
                        loss,
                        accuracy,
                        secs,
                    } => {
                        progress.println(report.human(args.epochs));
                        epochs.push((*epoch, *loss, *accuracy, *secs));
                        elastic.epoch_done(*epoch);
                        if let Some(line) = failover.epoch_done(*epoch) {
                            progress.println(line);
                        }
                    }
                    Report::Ranges {
                        seen_by,
                        version,
                        at_ms,
                        replicas,
                    } => {
                        for line in failover.ranges(seen_by, *version, *at_ms, replicas) {
                            progress.println(line);
                        }
                    }
                    Report::Round {
                        round,
                        after_epoch,
                        workers,
                    } => {
                        if elastic.round_began(*round, *after_epoch, workers) {
                            progress.println(report.human(args.epochs));
                        }
                    }
                    Report::Progress { epoch, done, total } => {
                        progress.update(*epoch, *done, *total);
                    }
                    Report::Worker {
                        requests,
                        pushed,
                        pulled,
                        wire,
                        ..
                    } => {
                        workers.push((*requests, *pushed, *pulled));
                        wire_bytes += wire;
                    }
                    Report::Server {
                        rank,
                        keys,
                        stale_held,
                        stale_max_gap,
                        ..
                    } => {
                        servers.push((*rank, *keys));
                        stale.0 += stale_held;
                        stale.1 = stale.1.max(*stale_max_gap);
                    }
                    Report::Staleness {
                        time_to_threshold_s,
                    } => stale.2 = Some(*time_to_threshold_s),
                }
                for request in elastic.requests() {
                    match request {
                        Control::AddWorker => {
                            progress.println("adding a worker (it joins at the next round)")
                        }
                        Control::SignalNode { id, .. } => {
                            let rank = elastic.members.iter().position(|&m| m == id);
                            progress.println(format!(
                                "killing worker {} (node {id}) with SIGKILL",
                                rank.map_or_else(|| "?".into(), |r| r.to_string())
                            ))
                        }
                    }
                    let _ = control.send(request);
                }
                for request in failover.requests() {
                    let _ = control.send(request);
                }
                if linger.is_some()
                    && workers.len() == elastic.workers_expected()
                    && servers.len() == args.servers - failover.killed()
                {
                    break;
                }
            }
            Event::Done(result) => {
                let wall = started.elapsed();
                let complete = workers.len() == elastic.workers_expected()
                    && servers.len() == args.servers - failover.killed();
                let failed = !matches!(result, Ok(Outcome::Success));
                outcome = Some((result, wall));
                if complete || failed {
                    break;
                }
                linger = Some(Instant::now() + Duration::from_secs(2));
            }
        }
    }
    drop(reservation);
    let Some((result, wall)) = outcome else {
        return Err(Error::App("the launcher stopped without a result".into()));
    };
    match result {
        Ok(Outcome::Success) => {}
        Ok(outcome) => {
            for line in outcome.lines() {
                eprintln!("pslite demo: {line}");
            }
            return Ok(ExitCode::from(outcome.exit_code()));
        }
        Err(e) => {
            eprintln!("pslite demo: {e}");
            return Ok(ExitCode::from(pslite::EXIT_CONFIG));
        }
    }

    progress.finish();
    if let Some(path) = &args.plot {
        let points: Vec<plot::Point> = epochs
            .iter()
            .map(|&(epoch, loss, accuracy, _)| plot::Point {
                epoch,
                loss,
                accuracy,
            })
            .collect();
        let title = format!(
            "pslite demo: {} servers, {} workers{}, {} (learning rate {})",
            args.servers,
            args.workers,
            if args.elastic { " (elastic)" } else { "" },
            args.optimizer.title(),
            args.learning_rate()
        );
        match plot::write_chart(path, &title, &points, &elastic.rounds) {
            Ok(()) => println!("chart of loss and accuracy per epoch: {}", path.display()),
            Err(e) => {
                eprintln!("pslite demo: {e}");
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    servers.sort_unstable();
    let keys: Vec<String> = servers.iter().map(|&(_, k)| group(k as u64)).collect();
    let (requests, pushed, pulled) = workers.iter().fold((0, 0, 0), |(r, a, b), &(r2, a2, b2)| {
        (r + r2, a + a2, b + b2)
    });
    let training: f64 = epochs.iter().map(|e| e.3).sum();
    if args.replicas >= 2 {
        let held: Vec<String> = servers
            .iter()
            .map(|&(rank, k)| format!("server {rank}: {}", group(k as u64)))
            .collect();
        println!(
            "model: {} copies of each key range; keys with a weight held at the end by {} \
             server{} ({}){}",
            args.replicas,
            servers.len(),
            plural(servers.len()),
            held.join(", "),
            match (args.kill_server, failover.killed()) {
                (Some(rank), 1) => format!("; server {rank} was killed"),
                _ => String::new(),
            }
        );
    } else {
        println!(
            "model: {} keys with a weight, held by {} server{} ({})",
            group(servers.iter().map(|&(_, k)| k as u64).sum()),
            args.servers,
            plural(args.servers),
            keys.join(" + ")
        );
    }
    println!(
        "moved {} of keys and values: pushes {}, pulls {} ({} requests from {} worker{}{})",
        megabytes(pushed + pulled),
        megabytes(pushed),
        megabytes(pulled),
        group(requests),
        workers.len(),
        plural(workers.len()),
        if elastic.killed {
            ", not counting the killed one"
        } else {
            ""
        }
    );
    if let Some(c) = &args.compression {
        println!(
            "gradients compressed with {c}: {} on the wire between workers and servers",
            megabytes(wire_bytes)
        );
    }
    println!(
        "wall time {:.1} s (training and evaluation {training:.1} s)",
        wall.as_secs_f64()
    );
    let Some(&(epoch, _, final_accuracy, _)) = epochs.last() else {
        eprintln!("pslite demo: worker 0 reported no accuracy");
        return Ok(ExitCode::FAILURE);
    };
    if epoch != args.epochs {
        eprintln!(
            "pslite demo: worker 0 reported epoch {epoch} last, not {}",
            args.epochs
        );
        return Ok(ExitCode::FAILURE);
    }
    if args.staleness_mode() && !staleness_result(args, stale, final_accuracy) {
        return Ok(ExitCode::FAILURE);
    }
    if final_accuracy < args.threshold {
        println!(
            "FAILED: final test accuracy {final_accuracy:.4} is below the threshold {} (random guessing gets about 0.5)",
            args.threshold
        );
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "final test accuracy {final_accuracy:.4} (threshold {}): ok",
        args.threshold
    );
    Ok(ExitCode::SUCCESS)
}

/// `--staleness`/`--slow-worker`: the bound held, the straggler, and the
/// `RESULT staleness` line; false if the bound was exceeded or worker 0
/// reported no time.
fn staleness_result(
    args: &DemoArgs,
    (held, max_gap, time): (u64, u64, Option<Option<f64>>),
    final_accuracy: f64,
) -> bool {
    let bound = args.staleness.and_then(|b| b.0);
    let mut slow = match args.slow_worker {
        Some(r) => format!("worker {r} slowed by {} ms per iteration", args.slow_ms),
        None => "no worker slowed".into(),
    };
    if args.jitter_ms > 0 {
        slow += &format!(
            ", every worker {} ms of jitter per iteration (mean)",
            args.jitter_ms
        );
    }
    match bound {
        Some(s) => println!(
            "bounded staleness s = {s}, {slow}: the servers held {} pull{} back; the largest \
             clock gap a pull was answered with: {max_gap} (bound {s})",
            group(held),
            plural(held as usize)
        ),
        None => println!("no staleness bound (asynchronous), {slow}"),
    }
    let Some(time) = time else {
        eprintln!("pslite demo: worker 0 reported no time to the threshold");
        return false;
    };
    println!(
        "RESULT staleness s={} time_to_threshold_s={} final_accuracy={final_accuracy:.4} \
         max_gap={}",
        bound.map_or_else(|| "none".into(), |s| s.to_string()),
        time.map_or_else(|| "never".into(), |t| format!("{t:.2}")),
        bound.map_or_else(|| "unmeasured".into(), |_| max_gap.to_string())
    );
    if bound.is_some_and(|s| max_gap > s) {
        println!("FAILED: a pull was answered {max_gap} clocks ahead of the slowest worker");
        return false;
    }
    true
}

fn print_header(args: &DemoArgs) {
    let spec = args.data_spec();
    let train = spec.train_len();
    println!(
        "pslite demo: sparse logistic regression by data-parallel {} (learning rate {})",
        args.optimizer.title(),
        args.learning_rate()
    );
    println!(
        "data: {} samples ({} to train, {} held out), {} features, {} non-zeros each, \
         {}% of labels flipped, seed {}",
        group(spec.samples as u64),
        group(train as u64),
        group((spec.samples - train) as u64),
        group(spec.features),
        spec.nnz,
        spec.label_noise * 100.0,
        spec.seed
    );
    let mut elastic = if args.elastic {
        format!(" (elastic, {}:{})", args.workers, args.workers + 2)
    } else {
        String::new()
    };
    if args.replicas >= 2 {
        elastic.push_str(&format!(", {} copies of each key range", args.replicas));
    }
    println!(
        "cluster: 1 scheduler, {} server{}, {} worker{}{elastic} on this machine; \
         minibatches of {} samples per worker, {} epoch{}",
        args.servers,
        plural(args.servers),
        args.workers,
        plural(args.workers),
        group(args.batch as u64),
        args.epochs,
        plural(args.epochs)
    );
}
