//! How a request's keys are split over the servers ([`Slicer`],
//! [`default_slicer`]).

use pslite_postoffice::KeyRange;

use crate::kv_pairs::{KVPairs, Val};
use crate::sarray::SArray;

/// Splits a request over the servers: one entry per server rank, `None` for
/// servers that get nothing.
pub type Slicer<V> = Box<dyn Fn(&KVPairs<V>, &[KeyRange]) -> Vec<Option<KVPairs<V>>> + Send + Sync>;
/// The default slicer: server r gets the keys in its range.
pub fn default_slicer<V: Val>(send: &KVPairs<V>, ranges: &[KeyRange]) -> Vec<Option<KVPairs<V>>> {
    let keys = send.keys.as_slice();
    // Where key i's values start: i * k for uniform values, else prefix sums.
    let uniform = send.lens.is_empty();
    let per_key = send.vals.len().checked_div(keys.len()).unwrap_or(0);
    let prefix: Vec<usize> = if uniform {
        Vec::new()
    } else {
        std::iter::once(0)
            .chain(send.lens.iter().scan(0usize, |acc, &l| {
                *acc += l.max(0) as usize;
                Some(*acc)
            }))
            .collect()
    };
    let offset = |i: usize| if uniform { i * per_key } else { prefix[i] };
    let has_vals = !send.vals.is_empty();
    let mut out = Vec::with_capacity(ranges.len());
    let mut start = 0;
    for (rank, range) in ranges.iter().enumerate() {
        let end = if rank + 1 == ranges.len() {
            keys.len()
        } else {
            start + keys[start..].partition_point(|&k| k < range.end)
        };
        // Keys below this range's start belong to no server (cannot happen
        // with ranges starting at 0); skip them defensively.
        let first = start + keys[start..end].partition_point(|&k| k < range.begin);
        if first == end {
            out.push(None);
        } else {
            out.push(Some(KVPairs {
                keys: send.keys.slice(first..end),
                vals: if has_vals {
                    send.vals.slice(offset(first)..offset(end))
                } else {
                    SArray::new()
                },
                lens: if uniform {
                    SArray::new()
                } else {
                    send.lens.slice(first..end)
                },
            }));
        }
        start = end;
    }
    out
}
