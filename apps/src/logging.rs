//! Logging for ps-lite programs: a small `log::Log` that writes to stderr.
//!
//! The level comes from `RUST_LOG` when it is set (a bare level, `warn`, or
//! a comma-separated list of `target=level` entries, `pslite_van=trace,info`;
//! the longest matching target prefix wins), else from `PS_VERBOSE` as in
//! ps-lite: 0 (or unset) warnings and errors, 1 connections (`debug`), 2 or
//! more every message (`trace`; old ps-lite scripts set 3).
//!
//! Each record is one line: `2026-11-23T09:05:45.123Z WARN  message`.

use std::io::Write;
use std::sync::OnceLock;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Which records pass: a default level and per-target levels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Filter {
    /// The level of targets no directive names.
    default: LevelFilter,
    /// `(target prefix, level)`, longest prefix first.
    targets: Vec<(String, LevelFilter)>,
}

impl Filter {
    /// The filter `PS_VERBOSE` asks for (`None`: unset): 0 warn, 1 debug,
    /// 2 or more trace. A value that is not a whole number counts as 0 (the
    /// node's configuration reports it).
    pub(crate) fn from_verbose(verbose: Option<&str>) -> Filter {
        let default = match verbose.map(str::trim).map(str::parse::<u64>) {
            Some(Ok(0)) | None | Some(Err(_)) => LevelFilter::Warn,
            Some(Ok(1)) => LevelFilter::Debug,
            Some(Ok(_)) => LevelFilter::Trace,
        };
        Filter {
            default,
            targets: Vec::new(),
        }
    }

    /// Parses a `RUST_LOG` value on top of `base` (which gives the default
    /// level when no bare level is listed). Returns the filter and the
    /// entries that could not be read.
    pub(crate) fn parse_rust_log(spec: &str, base: Filter) -> (Filter, Vec<String>) {
        let mut filter = base;
        let mut bad = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match entry.split_once('=') {
                None => match parse_level(entry) {
                    Some(level) => filter.default = level,
                    // A bare name is a target at every level, as env_logger reads it.
                    None if is_target(entry) => {
                        filter.targets.push((entry.to_string(), LevelFilter::Trace))
                    }
                    None => bad.push(entry.to_string()),
                },
                Some((target, level)) => match parse_level(level.trim()) {
                    Some(level) if is_target(target.trim()) => {
                        filter.targets.push((target.trim().to_string(), level))
                    }
                    _ => bad.push(entry.to_string()),
                },
            }
        }
        filter
            .targets
            .sort_by_key(|(target, _)| std::cmp::Reverse(target.len()));
        (filter, bad)
    }

    /// The level for records of `target`.
    pub(crate) fn level_for(&self, target: &str) -> LevelFilter {
        self.targets
            .iter()
            .find(|(prefix, _)| target.starts_with(prefix.as_str()))
            .map_or(self.default, |(_, level)| *level)
    }

    /// The most verbose level any target gets.
    pub(crate) fn max_level(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, level)| *level)
            .fold(self.default, Ord::max)
    }
}

fn parse_level(text: &str) -> Option<LevelFilter> {
    text.parse().ok()
}

fn is_target(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-')
}

/// Writes records to stderr, one line each.
struct StderrLogger {
    filter: Filter,
}

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.filter.level_for(metadata.target())
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format_line(std::time::SystemTime::now(), record.level(), record.args());
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// One log line: UTC time to the millisecond, the level padded to 5, the text.
fn format_line(now: std::time::SystemTime, level: Level, text: &std::fmt::Arguments) -> String {
    let since = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z {level:<5} {text}\n",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Eras of 400 years (146 097 days), counted from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The filter this process's environment asks for, and the `RUST_LOG`
/// entries it could not read.
fn filter_from_env() -> (Filter, Vec<String>) {
    let verbose = Filter::from_verbose(std::env::var("PS_VERBOSE").ok().as_deref());
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => Filter::parse_rust_log(&spec, verbose),
        _ => (verbose, Vec::new()),
    }
}

/// Sends the `log` records of this process to stderr, filtered by
/// `RUST_LOG` if set, else by `PS_VERBOSE` (0 warnings, 1 connections,
/// 2 or more every message). Safe to call more than once: only the first
/// call installs the logger.
pub fn init_logging() {
    static LOGGER: OnceLock<StderrLogger> = OnceLock::new();
    let mut first = false;
    let logger = LOGGER.get_or_init(|| {
        first = true;
        let (filter, bad) = filter_from_env();
        for entry in bad {
            eprintln!("pslite: ignoring RUST_LOG entry {entry:?} (expected LEVEL or TARGET=LEVEL, LEVEL one of off, error, warn, info, debug, trace)");
        }
        StderrLogger { filter }
    });
    if first && log::set_logger(logger).is_ok() {
        log::set_max_level(logger.filter.max_level());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verbose(v: Option<&str>) -> LevelFilter {
        Filter::from_verbose(v).max_level()
    }

    #[test]
    fn ps_verbose_maps_to_levels_as_in_ps_lite() {
        assert_eq!(verbose(None), LevelFilter::Warn);
        assert_eq!(verbose(Some("")), LevelFilter::Warn);
        assert_eq!(verbose(Some("0")), LevelFilter::Warn);
        assert_eq!(verbose(Some("1")), LevelFilter::Debug);
        assert_eq!(verbose(Some(" 1 ")), LevelFilter::Debug);
        assert_eq!(verbose(Some("2")), LevelFilter::Trace);
        // Old ps-lite scripts set 3: everything.
        assert_eq!(verbose(Some("3")), LevelFilter::Trace);
        assert_eq!(verbose(Some("99")), LevelFilter::Trace);
        assert_eq!(verbose(Some("x")), LevelFilter::Warn);
    }

    #[test]
    fn rust_log_bare_level_overrides_ps_verbose() {
        let (f, bad) = Filter::parse_rust_log("info", Filter::from_verbose(Some("2")));
        assert!(bad.is_empty());
        assert_eq!(f.level_for("pslite_van::van"), LevelFilter::Info);
        assert_eq!(f.max_level(), LevelFilter::Info);
    }

    #[test]
    fn rust_log_target_lists_pick_the_longest_prefix() {
        let (f, bad) = Filter::parse_rust_log(
            "pslite_van=debug, pslite_van::transport=trace,error",
            Filter::from_verbose(None),
        );
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(f.level_for("pslite_van::transport"), LevelFilter::Trace);
        assert_eq!(f.level_for("pslite_van::van"), LevelFilter::Debug);
        assert_eq!(f.level_for("pslite::kv_worker"), LevelFilter::Error);
        assert_eq!(f.max_level(), LevelFilter::Trace);
        // Without a bare level, other targets keep PS_VERBOSE's.
        let (f, _) = Filter::parse_rust_log("pslite_van=off", Filter::from_verbose(Some("1")));
        assert_eq!(f.level_for("pslite_van"), LevelFilter::Off);
        assert_eq!(f.level_for("pslite"), LevelFilter::Debug);
    }

    #[test]
    fn rust_log_reports_what_it_cannot_read() {
        let (f, bad) = Filter::parse_rust_log("pslite=loud,warn,a b", Filter::from_verbose(None));
        assert_eq!(bad, ["pslite=loud", "a b"]);
        assert_eq!(f.level_for("pslite"), LevelFilter::Warn);
    }

    #[test]
    fn lines_have_the_usual_format() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_795_424_745_123);
        let line = format_line(at, Level::Warn, &format_args!("lost node {}", 9));
        assert_eq!(line, "2026-11-23T09:05:45.123Z WARN  lost node 9\n");
        let line = format_line(std::time::UNIX_EPOCH, Level::Trace, &format_args!("x"));
        assert_eq!(line, "1970-01-01T00:00:00.000Z TRACE x\n");
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }
}
