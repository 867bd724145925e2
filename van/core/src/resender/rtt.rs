//! How long to wait for an acknowledgement, from the measured round trip
//! to each peer, the way TCP sets its retransmission timeout (RFC 6298):
//! a smoothed round trip (`srtt`) and its variation (`rttvar`) taken from
//! acknowledgements of messages sent once (a resent message's ACK may
//! answer any of its copies: Karn's rule), and a timeout of
//! `srtt + 4 rttvar`, no less than [`MIN_RTO`] and no more than
//! `PS_RESEND_TIMEOUT`. A peer not measured yet waits twice the timeout of
//! the peer measured last (the links of one cluster are alike), or
//! `PS_RESEND_TIMEOUT` before any sample at all.
//!
//! On a link whose round trip is 35 µs a lost message then costs a few
//! milliseconds, not the second `PS_RESEND_TIMEOUT` defaults to. Only
//! small messages are sampled (their time is the link's and the peer's,
//! not the transfer's), and a large message waits a transfer allowance
//! more ([`Rtt::timeout`]).

use std::collections::HashMap;
use std::time::Duration;

use pslite_proto::NodeId;

/// The shortest wait for an acknowledgement: spares a busy peer (a
/// process not scheduled for a few milliseconds on a loaded machine)
/// needless resends.
pub const MIN_RTO: Duration = Duration::from_millis(5);

/// Messages up to this size give round-trip samples.
const SAMPLED_BYTES: usize = 64 << 10;

/// A large message waits this long more per byte beyond
/// [`SAMPLED_BYTES`]: 1 ms per 100 kB, a link of 100 MB/s.
const ALLOWANCE_NS_PER_BYTE: u64 = 10;

/// One peer's estimate (RFC 6298's state).
#[derive(Clone, Copy, Debug)]
struct Estimate {
    srtt: Duration,
    rttvar: Duration,
}

/// The round-trip estimates of one node's peers.
#[derive(Debug)]
pub struct Rtt {
    /// `PS_RESEND_TIMEOUT`: the wait before a peer's first sample, and
    /// the longest.
    initial: Duration,
    peers: HashMap<NodeId, Estimate>,
    /// The timeout of the peer measured last.
    recent: Option<Duration>,
}

impl Rtt {
    /// Estimates that start at (and never exceed) `initial`.
    pub fn new(initial: Duration) -> Rtt {
        Rtt {
            initial,
            peers: HashMap::new(),
            recent: None,
        }
    }

    /// A message of `bytes` sent once to `peer` was acknowledged `sample`
    /// after it went.
    pub fn sample(&mut self, peer: NodeId, sample: Duration, bytes: usize) {
        if bytes > SAMPLED_BYTES {
            return;
        }
        let Some(e) = self.peers.get_mut(&peer) else {
            let first = Estimate {
                srtt: sample,
                rttvar: sample / 2,
            };
            self.peers.insert(peer, first);
            self.recent = Some(self.timeout(peer, 0));
            return;
        };
        let diff = e.srtt.abs_diff(sample);
        e.rttvar = (e.rttvar * 3 + diff) / 4;
        e.srtt = (e.srtt * 7 + sample) / 8;
        self.recent = Some(self.timeout(peer, 0));
    }

    /// How long to wait for `peer`'s acknowledgement of a message of
    /// `bytes` sent for the first time.
    pub fn timeout(&self, peer: NodeId, bytes: usize) -> Duration {
        let Some(e) = self.peers.get(&peer) else {
            return self
                .recent
                .map_or(self.initial, |t| (t * 2).min(self.initial));
        };
        let beyond = bytes.saturating_sub(SAMPLED_BYTES) as u64;
        let allowance = Duration::from_nanos(beyond.saturating_mul(ALLOWANCE_NS_PER_BYTE));
        (e.srtt + e.rttvar * 4 + allowance)
            .max(MIN_RTO)
            .min(self.initial)
    }

    /// The smoothed round trip to `peer`, once sampled.
    pub fn smoothed(&self, peer: NodeId) -> Option<Duration> {
        self.peers.get(&peer).map(|e| e.srtt)
    }

    /// Forgets `peer`'s estimate (a new process took its id).
    pub fn forget(&mut self, peer: NodeId) {
        self.peers.remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const US: Duration = Duration::from_micros(1);

    #[test]
    fn before_any_sample_the_timeout_is_the_configured_one() {
        let r = Rtt::new(MS * 1000);
        assert_eq!(r.timeout(8, 100), MS * 1000);
    }

    #[test]
    fn a_fast_link_waits_the_floor_and_a_slow_one_its_round_trip() {
        let mut r = Rtt::new(MS * 1000);
        for _ in 0..20 {
            r.sample(8, US * 35, 100);
            r.sample(9, MS * 40, 100);
        }
        assert_eq!(r.timeout(8, 100), MIN_RTO);
        let slow = r.timeout(9, 100);
        assert!(slow >= MS * 40 && slow < MS * 60, "{slow:?}");
        // The first sample alone: srtt + 4 * (srtt / 2) = 3 srtt.
        let mut r = Rtt::new(MS * 1000);
        r.sample(8, MS * 20, 100);
        assert_eq!(r.timeout(8, 100), MS * 60);
    }

    #[test]
    fn a_jittery_peer_waits_longer_than_a_steady_one() {
        let mut steady = Rtt::new(MS * 1000);
        let mut jittery = Rtt::new(MS * 1000);
        for i in 0..50u32 {
            steady.sample(8, MS * 10, 100);
            jittery.sample(8, MS * if i % 2 == 0 { 2 } else { 18 }, 100);
        }
        assert!(jittery.timeout(8, 100) > steady.timeout(8, 100) + MS * 10);
    }

    #[test]
    fn a_peer_not_measured_yet_waits_twice_the_last_measured_one() {
        let mut r = Rtt::new(MS * 1000);
        r.sample(8, MS * 20, 100);
        assert_eq!(r.timeout(9, 100), MS * 120);
        for _ in 0..100 {
            r.sample(8, US * 35, 100);
        }
        assert_eq!(r.timeout(9, 100), MIN_RTO * 2);
    }

    #[test]
    fn the_timeout_never_exceeds_the_configured_one() {
        let mut r = Rtt::new(MS * 100);
        r.sample(8, MS * 500, 100);
        assert_eq!(r.timeout(8, 100), MS * 100);
    }

    #[test]
    fn large_messages_give_no_samples_and_wait_their_transfer_more() {
        let mut r = Rtt::new(MS * 1000);
        r.sample(8, MS * 900, 10 << 20);
        assert_eq!(r.smoothed(8), None);
        for _ in 0..20 {
            r.sample(8, US * 50, 100);
        }
        // 10 MB beyond the sampled size: 100 ms more.
        let big = r.timeout(8, SAMPLED_BYTES + 10_000_000);
        assert!(big >= MS * 100 && big < MS * 110, "{big:?}");
        r.forget(8);
        assert_eq!(r.timeout(8, 100), MIN_RTO * 2);
    }
}
