//! Logging set-up for ps-lite programs: `PS_VERBOSE` as in ps-lite
//! (0 warnings and errors, 1 connections, 2 every message), or `RUST_LOG`.

use std::io::Write;

/// Initialises `env_logger` from `RUST_LOG` if set, else from `PS_VERBOSE`.
/// Safe to call more than once.
pub fn init_logging() {
    let level = match std::env::var("PS_VERBOSE").ok().as_deref().map(str::trim) {
        Some("1") => "debug",
        Some("2") => "trace",
        _ => "warn",
    };
    let env = env_logger::Env::default().default_filter_or(level);
    let _ = env_logger::Builder::from_env(env)
        .format(|buf, record| {
            writeln!(
                buf,
                "{} {:<5} {}",
                buf.timestamp_millis(),
                record.level(),
                record.args()
            )
        })
        .try_init();
}
