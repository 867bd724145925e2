//! The key ranges of the servers, as C++ ps-lite cuts the key space.

/// A half-open range of keys `[begin, end)`; the last server's range also
/// holds `u64::MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// First key of the range.
    pub begin: u64,
    /// One past the last key (`u64::MAX` for the last server: it owns all
    /// keys from `begin` on).
    pub end: u64,
}

impl KeyRange {
    /// Whether `key` falls in this range.
    pub fn contains(&self, key: u64) -> bool {
        key >= self.begin && (key < self.end || self.end == u64::MAX)
    }
}

/// The key ranges of `num_servers` servers, as C++ ps-lite computes them:
/// server r owns `[r * (MAX / n), (r + 1) * (MAX / n))`, the division first.
/// The last range is stretched to `u64::MAX` so that every key has a server.
pub fn key_ranges(num_servers: i32) -> Vec<KeyRange> {
    let n = num_servers.max(1) as u64;
    let step = u64::MAX / n;
    (0..n)
        .map(|r| KeyRange {
            begin: step * r,
            end: if r + 1 == n { u64::MAX } else { step * (r + 1) },
        })
        .collect()
}
