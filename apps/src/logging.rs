//! Logging for ps-lite programs: `env_logger`, configured the ps-lite way.
//!
//! The level comes from `PS_VERBOSE` as in ps-lite: 0 (or unset) warnings
//! and errors, 1 connections (`debug`), 2 or more every message (`trace`;
//! old ps-lite scripts set 3). `RUST_LOG`, when set, is read on top of it
//! with env_logger's usual syntax: a bare level (`info`) replaces
//! `PS_VERBOSE`'s, `target=level` entries (`pslite_van=trace`) set the
//! level of a target and its children, the longest matching target wins;
//! env_logger names the entries it cannot read on stderr.
//!
//! Each record is one line on stderr: `2026-11-23T09:05:45.123Z WARN  message`
//! (UTC to the millisecond, the level padded to 5), never coloured.

use std::io::Write;

use log::LevelFilter;

/// The level `PS_VERBOSE` asks for (`None`: unset): 0 warn, 1 debug, 2 or
/// more trace. A value that is not a whole number counts as 0 (the node's
/// configuration reports it).
fn verbose_level(verbose: Option<&str>) -> LevelFilter {
    match verbose.map(str::trim).map(str::parse::<u64>) {
        Some(Ok(0)) | None | Some(Err(_)) => LevelFilter::Warn,
        Some(Ok(1)) => LevelFilter::Debug,
        Some(Ok(_)) => LevelFilter::Trace,
    }
}

/// The logger `PS_VERBOSE` (`verbose`) and `RUST_LOG` (`rust_log`) ask for.
fn builder(verbose: Option<&str>, rust_log: Option<&str>) -> env_logger::Builder {
    let mut builder = env_logger::Builder::new();
    builder
        .filter_level(verbose_level(verbose))
        .write_style(env_logger::WriteStyle::Never)
        .target(env_logger::Target::Stderr)
        .format(|buf, record| {
            writeln!(
                buf,
                "{} {:<5} {}",
                buf.timestamp_millis(),
                record.level(),
                record.args()
            )
        });
    if let Some(spec) = rust_log.filter(|s| !s.trim().is_empty()) {
        builder.parse_filters(spec);
    }
    builder
}

/// Sends the `log` records of this process to stderr, filtered by
/// `PS_VERBOSE` (0 warnings, 1 connections, 2 or more every message) and
/// `RUST_LOG` on top of it. Safe to call more than once: only the first
/// call installs the logger.
pub fn init_logging() {
    use pslite_postoffice::settings::{foreign, PS_VERBOSE};
    // A bad PS_VERBOSE is the node's configuration's to report.
    let verbose = PS_VERBOSE.get().ok().map(|v| v.to_string());
    let rust_log = foreign("RUST_LOG").and_then(|v| v.into_string().ok());
    // Err: a logger is installed already (an earlier call, or the program's own).
    let _ = builder(verbose.as_deref(), rust_log.as_deref()).try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::{Level, Log, Metadata};

    fn enabled(logger: &env_logger::Logger, target: &str, level: Level) -> bool {
        logger.enabled(&Metadata::builder().target(target).level(level).build())
    }

    #[test]
    fn ps_verbose_maps_to_levels_as_in_ps_lite() {
        let max = |v: Option<&str>| builder(v, None).build().filter();
        assert_eq!(max(None), LevelFilter::Warn);
        assert_eq!(max(Some("")), LevelFilter::Warn);
        assert_eq!(max(Some("0")), LevelFilter::Warn);
        assert_eq!(max(Some("1")), LevelFilter::Debug);
        assert_eq!(max(Some(" 1 ")), LevelFilter::Debug);
        assert_eq!(max(Some("2")), LevelFilter::Trace);
        // Old ps-lite scripts set 3: everything.
        assert_eq!(max(Some("3")), LevelFilter::Trace);
        assert_eq!(max(Some("99")), LevelFilter::Trace);
        assert_eq!(max(Some("x")), LevelFilter::Warn);
    }

    #[test]
    fn rust_log_bare_level_overrides_ps_verbose() {
        let logger = builder(Some("2"), Some("info")).build();
        assert!(enabled(&logger, "pslite_van::van", Level::Info));
        assert!(!enabled(&logger, "pslite_van::van", Level::Debug));
        assert_eq!(logger.filter(), LevelFilter::Info);
    }

    #[test]
    fn rust_log_target_lists_pick_the_longest_prefix() {
        let logger = builder(
            None,
            Some("pslite_van=debug, pslite_van::transport=trace,error"),
        )
        .build();
        assert!(enabled(&logger, "pslite_van::transport", Level::Trace));
        assert!(enabled(&logger, "pslite_van::van", Level::Debug));
        assert!(!enabled(&logger, "pslite_van::van", Level::Trace));
        assert!(enabled(&logger, "pslite::kv_worker", Level::Error));
        assert!(!enabled(&logger, "pslite::kv_worker", Level::Warn));
        assert_eq!(logger.filter(), LevelFilter::Trace);
        // Without a bare level, other targets keep PS_VERBOSE's.
        let logger = builder(Some("1"), Some("pslite_van=off")).build();
        assert!(!enabled(&logger, "pslite_van", Level::Error));
        assert!(enabled(&logger, "pslite", Level::Debug));
        // A bare target name is that target at every level.
        let logger = builder(None, Some("pslite_van")).build();
        assert!(enabled(&logger, "pslite_van::van", Level::Trace));
        assert!(!enabled(&logger, "pslite", Level::Info));
    }

    /// Writes that land in a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_have_the_usual_format() {
        let out = Captured::default();
        let logger = builder(Some("2"), None)
            .target(env_logger::Target::Pipe(Box::new(out.clone())))
            .build();
        for (level, text) in [(Level::Warn, "lost node 9"), (Level::Trace, "x")] {
            logger.log(
                &log::Record::builder()
                    .level(level)
                    .target("pslite_van")
                    .args(format_args!("{text}"))
                    .build(),
            );
        }
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text:?}");
        for (line, rest) in lines.iter().zip(["WARN  lost node 9", "TRACE x"]) {
            // 2026-11-23T09:05:45.123Z, then the level padded to 5 and the text.
            let (stamp, tail) = line.split_at(24);
            assert_eq!(tail, format!(" {rest}"), "{line:?}");
            let shape: String = stamp
                .chars()
                .map(|c| if c.is_ascii_digit() { '0' } else { c })
                .collect();
            assert_eq!(shape, "0000-00-00T00:00:00.000Z", "{line:?}");
        }
    }

    #[test]
    fn unreadable_rust_log_entries_leave_the_others_in_force() {
        let logger = builder(None, Some("pslite=loud,info")).build();
        assert!(enabled(&logger, "pslite", Level::Info));
        assert!(!enabled(&logger, "pslite", Level::Debug));
    }
}
