//! Ports held for nodes until they bind them.
//!
//! A port found free and released was sometimes taken by another process's
//! `bind(0)` (a node of a concurrent job binding its own port) before the
//! node bound it, and the job failed with "Address already in use". A
//! [`PortReservation`] closes that race: a socket bound to the port with
//! `SO_REUSEADDR` but not listening. While it is held, the kernel gives the
//! port to no other `bind(0)` or outgoing connection, and a plain `bind` to
//! it fails; a ZeroMQ socket, which sets `SO_REUSEADDR` too, binds and
//! listens on it all the same. The launcher holds one for the scheduler's
//! port and one for each server's and worker's `PORT`.

use std::net::{SocketAddr, ToSocketAddrs};

use socket2::{Domain, Socket, Type};

/// A TCP port on a host held for a node; released when dropped.
#[derive(Debug)]
pub struct PortReservation {
    /// Bound, never listening (see the module docs).
    _socket: Socket,
    port: u16,
}

impl PortReservation {
    /// Reserves a free port on `host` (an IP address or a name).
    pub fn new(host: &str) -> std::io::Result<PortReservation> {
        let addr: SocketAddr = (host, 0).to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{host} does not resolve"),
            )
        })?;
        // socket2 opens it with close-on-exec: nodes do not inherit it.
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        let port = socket
            .local_addr()?
            .as_socket()
            .map(|a| a.port())
            .ok_or_else(|| std::io::Error::other("the reserved socket has no port"))?;
        Ok(PortReservation {
            _socket: socket,
            port,
        })
    }

    /// The reserved port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race `PortReservation` closes: a port found free and released is
    /// handed to the next `bind(0)` that lands on it (after a few thousand
    /// binds on this machine). Held, it never is, and the scheduler (whose
    /// ZeroMQ socket sets SO_REUSEADDR, as std's listener does) still binds
    /// and listens on it.
    #[test]
    fn a_reserved_port_goes_to_no_other_bind_but_the_scheduler_can_listen_on_it() {
        let held = PortReservation::new("127.0.0.1").unwrap();
        let port = held.port();
        assert_ne!(port, 0);
        // 20 000 binds of port 0 (more than the odd ports bind(0) picks
        // from): none gets it.
        for _ in 0..20_000 {
            let other = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
            assert_ne!(other.local_addr().unwrap().port(), port);
        }
        let scheduler = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, _) = scheduler.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), client.local_addr().unwrap());
        drop(held);
    }

    #[test]
    fn names_and_ipv6_resolve_and_nonsense_is_an_error() {
        assert_ne!(PortReservation::new("localhost").unwrap().port(), 0);
        if std::net::TcpListener::bind("[::1]:0").is_ok() {
            assert_ne!(PortReservation::new("::1").unwrap().port(), 0);
        }
        assert!(PortReservation::new("no such host.invalid").is_err());
    }
}
