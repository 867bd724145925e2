//! The launcher's stop signals: SIGINT, SIGTERM and SIGHUP, caught while a
//! job runs and handed to the launch loop as channel messages.
//!
//! Nodes run in process groups of their own, so Ctrl-C reaches only the
//! launcher, which stops the nodes and says why (the
//! [`Supervisor`](crate::supervisor::Supervisor) decides how). Outside a
//! job the signals keep their default action: they end the process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Receiver};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

/// The signals that stop a job.
pub const STOP_SIGNALS: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// True outside a job: a stop signal then ends the process as by default.
fn default_action() -> std::io::Result<&'static Arc<AtomicBool>> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    if let Some(flag) = FLAG.get() {
        return Ok(flag);
    }
    let flag = Arc::new(AtomicBool::new(true));
    for sig in STOP_SIGNALS {
        signal_hook::flag::register_conditional_default(sig, Arc::clone(&flag))?;
    }
    Ok(FLAG.get_or_init(|| flag))
}

/// Catches the stop signals while it lives; [`StopSignals::received`] gives
/// them in order of arrival.
pub struct StopSignals {
    received: Receiver<i32>,
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl StopSignals {
    /// Starts catching SIGINT, SIGTERM and SIGHUP.
    pub fn catch() -> std::io::Result<StopSignals> {
        let default = default_action()?;
        let mut signals = Signals::new(STOP_SIGNALS)?;
        default.store(false, Ordering::SeqCst);
        let handle = signals.handle();
        let (tx, received) = unbounded();
        let thread = std::thread::Builder::new()
            .name("launcher signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if tx.send(sig).is_err() {
                        break;
                    }
                }
            })?;
        Ok(StopSignals {
            received,
            handle,
            thread: Some(thread),
        })
    }

    /// The signals received, in order.
    pub fn received(&self) -> &Receiver<i32> {
        &self.received
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Ok(default) = default_action() {
            default.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn caught_signals_arrive_in_order() {
        let caught = StopSignals::catch().unwrap();
        // SAFETY: raise(3) to this process, whose handler only records it.
        unsafe {
            libc::raise(SIGHUP);
            libc::raise(SIGTERM);
        }
        let next = || caught.received().recv_timeout(Duration::from_secs(10));
        assert_eq!(next().ok(), Some(SIGHUP));
        assert_eq!(next().ok(), Some(SIGTERM));
        drop(caught);
        // Outside a job the default action is back (not raised here: it
        // would end the test process).
        assert!(default_action().unwrap().load(Ordering::SeqCst));
    }
}
