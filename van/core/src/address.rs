//! How nodes name each other on the wire, without touching a socket: the
//! identity a node presents (`ps<id>`, or `ps<id>/<key>` between pslite
//! nodes), the endpoints a peer is reached at (TCP, ps-lite's `DMLC_LOCAL`
//! Unix sockets, and the abstract Unix socket of same-host pslite peers).
//! The driver's `transport` module moves the frames.

use pslite_proto::{NodeId, K_EMPTY};

/// The ZeroMQ identity of node `id`: `ps<id>`, as C++ ps-lite writes it.
pub fn identity(id: NodeId) -> String {
    format!("ps{id}")
}

/// The ZeroMQ identity node `id` presents: `ps<id>`, or, to a pslite peer
/// when both node-table entries carry a key, `ps<id>/<key>` with the key
/// as 16 lower-case hex digits (see `PBNode.key`).
pub fn keyed_identity(id: NodeId, key: Option<u64>) -> String {
    match key {
        Some(key) => format!("ps{id}/{key:016x}"),
        None => identity(id),
    }
}

/// The node id in a ZeroMQ identity, or `K_EMPTY` if it is neither
/// `ps<digits>` nor `ps<digits>/<16 hex digits>`.
pub fn parse_identity(frame: &[u8]) -> NodeId {
    parse_keyed_identity(frame).0
}

/// The node id and the key in a ZeroMQ identity (see [`keyed_identity`]):
/// `(K_EMPTY, None)` if it is neither form.
pub fn parse_keyed_identity(frame: &[u8]) -> (NodeId, Option<u64>) {
    const NONE: (NodeId, Option<u64>) = (K_EMPTY, None);
    let Some(rest) = frame.strip_prefix(b"ps") else {
        return NONE;
    };
    let (digits, key) = match rest.iter().position(|&b| b == b'/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return NONE;
    }
    let key = match key {
        None => None,
        Some(hex)
            if hex.len() == 16
                && hex
                    .iter()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) =>
        {
            match std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                Some(key) => Some(key),
                None => return NONE,
            }
        }
        Some(_) => return NONE,
    };
    let id = std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<i32>().ok())
        .filter(|&id| id != K_EMPTY)
        .unwrap_or(K_EMPTY);
    if id == K_EMPTY {
        return NONE;
    }
    (id, key)
}

/// Where a node's ROUTER listens: TCP, or a Unix socket under `/tmp` when
/// `DMLC_LOCAL=1` (ps-lite names it after the port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `tcp://host:port`.
    Tcp,
    /// `ipc:///tmp/<port>`.
    Ipc,
}

impl Transport {
    /// The endpoint a peer connects to.
    pub fn connect_endpoint(self, hostname: &str, port: i32) -> String {
        match self {
            Transport::Tcp if hostname.contains(':') => format!("tcp://[{hostname}]:{port}"),
            Transport::Tcp => format!("tcp://{hostname}:{port}"),
            Transport::Ipc => format!("ipc:///tmp/{port}"),
        }
    }

    /// The endpoint to bind, on IP `bind_ip` (TCP only).
    pub fn bind_endpoint(self, bind_ip: &str, port: i32) -> String {
        match self {
            Transport::Tcp if bind_ip.contains(':') => format!("tcp://[{bind_ip}]:{port}"),
            Transport::Tcp => format!("tcp://{bind_ip}:{port}"),
            Transport::Ipc => format!("ipc:///tmp/{port}"),
        }
    }
}

/// The extra endpoint a pslite node of host identity `host` (see
/// the driver's `shm::host_identity`), process `pid`, listening on `port`, binds
/// for same-host pslite peers (`PS_IPC`): an abstract Unix socket, so nothing
/// appears on the filesystem, the name is gone when the process dies, and
/// it is visible only inside the node's network namespace.
pub fn local_endpoint(host: &str, pid: u32, port: i32) -> String {
    format!("ipc://@pslite-{host}-{pid}-{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities() {
        assert_eq!(identity(9), "ps9");
        assert_eq!(parse_identity(b"ps9"), 9);
        assert_eq!(parse_identity(b"ps11"), 11);
        assert_eq!(parse_identity(b"ps"), K_EMPTY);
        assert_eq!(parse_identity(b"px9"), K_EMPTY);
        assert_eq!(parse_identity(b"ps-1"), K_EMPTY);
        assert_eq!(parse_identity(b"ps99999999999"), K_EMPTY);
        assert_eq!(parse_identity(b"ps2147483647"), K_EMPTY);
        assert_eq!(parse_identity(&[0, 1, 2, 3, 4]), K_EMPTY);
        let keyed = keyed_identity(9, Some(0xabc));
        assert_eq!(keyed, "ps9/0000000000000abc");
        assert_eq!(parse_keyed_identity(keyed.as_bytes()), (9, Some(0xabc)));
        assert_eq!(parse_keyed_identity(b"ps9"), (9, None));
        assert_eq!(keyed_identity(9, None), "ps9");
        for bad in [
            &b"ps9/"[..],
            b"ps9/abc",
            b"ps9/0000000000000ABC",
            b"ps/0000000000000abc",
        ] {
            assert_eq!(parse_keyed_identity(bad), (K_EMPTY, None), "{bad:?}");
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(Transport::Tcp.connect_endpoint("h", 5), "tcp://h:5");
        assert_eq!(Transport::Tcp.connect_endpoint("::1", 5), "tcp://[::1]:5");
        assert_eq!(Transport::Ipc.connect_endpoint("h", 5), "ipc:///tmp/5");
    }
}
