//! One log line per peer and cause: what a hostile or confused peer sends
//! again and again (a malformed frame, a forged descriptor, a refused
//! handshake) is logged at its level the first time, at debug level after
//! that, so it cannot flood the log. The set of keys seen is bounded too.

use std::collections::HashSet;
use std::hash::Hash;

use log::Level;

/// Keys remembered by default: beyond them, lines go to debug level.
pub const DEFAULT_KEYS: usize = 1024;

/// Remembers which keys (a peer, or a peer and a cause) were logged.
///
/// ```
/// use log::Level;
/// use pslite_van_core::LogOnce;
///
/// let mut dropped = LogOnce::new(Level::Warn);
/// assert!(dropped.log(("node 9", "malformed"), || "dropping a malformed frame from node 9".into()));
/// assert!(!dropped.log(("node 9", "malformed"), || "dropping a malformed frame from node 9".into()));
/// ```
#[derive(Debug)]
pub struct LogOnce<K> {
    level: Level,
    seen: HashSet<K>,
    max_keys: usize,
}

impl<K: Hash + Eq> LogOnce<K> {
    /// Logs at `level` once per key, for up to 1024 keys.
    pub fn new(level: Level) -> LogOnce<K> {
        LogOnce::with_max_keys(level, DEFAULT_KEYS)
    }

    /// Logs at `level` once per key, for up to `max_keys` keys.
    pub fn with_max_keys(level: Level, max_keys: usize) -> LogOnce<K> {
        LogOnce {
            level,
            seen: HashSet::new(),
            max_keys,
        }
    }

    /// Whether `key` is new (and now remembered): its line goes at the
    /// level, not at debug.
    pub fn first(&mut self, key: K) -> bool {
        self.seen.len() < self.max_keys && self.seen.insert(key)
    }

    /// Logs `line` at the level if `key` is new, saying that repeats go to
    /// debug level; at debug level otherwise. Returns whether it was new.
    pub fn log(&mut self, key: K, line: impl FnOnce() -> String) -> bool {
        if self.first(key) {
            log::log!(
                self.level,
                "{} (further ones are logged at debug level)",
                line()
            );
            true
        } else {
            log::debug!("{}", line());
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_is_new_once_and_the_keys_are_bounded() {
        let mut once = LogOnce::with_max_keys(Level::Warn, 2);
        assert!(once.first(1));
        assert!(!once.first(1));
        assert!(once.log(2, || "two".into()));
        assert!(!once.log(2, || "two".into()));
        assert!(!once.first(3), "beyond the bound everything is a repeat");
        assert!(!once.first(1));
    }
}
