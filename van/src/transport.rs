//! The ZeroMQ layer: endpoints, identities, and moving frames in and out of
//! sockets without copying payloads.
//!
//! Every node binds one ROUTER. To reach a peer it opens its own DEALER
//! connected to that peer's ROUTER, with identity `ps<id>`; the ROUTER hands
//! that identity over as the first frame of each message, which is how the
//! receiver learns who sent it. A message is `[meta][data 0]..[data n-1]`.

use std::os::raw::c_void;

use bytes::Bytes;
use pslite_proto::NodeId;
pub use pslite_van_core::address::{
    identity, keyed_identity, local_endpoint, parse_identity, parse_keyed_identity, Transport,
};

/// Turns a ZeroMQ error into the Van's, saying what it was doing.
pub(crate) fn zmq_err(context: impl Into<String>) -> impl FnOnce(zmq::Error) -> crate::VanError {
    let context = context.into();
    move |source| crate::VanError::Zmq {
        context,
        source: std::sync::Arc::new(source),
    }
}

/// Frames at most this long are copied into ZeroMQ's inline storage instead
/// of being handed over by reference (a reference costs an allocation too).
const COPY_LIMIT: usize = 64;

/// Whether something listens on abstract Unix socket `endpoint`
/// (`ipc://@name`). A peer that runs with `PS_IPC=0` binds none, and is
/// then reached over TCP. `quietly`: without a connection the peer would
/// see, from the kernel's table of Unix sockets (`/proc/net/unix`, this
/// network namespace's): a probe that closes at once looks like a port
/// scan to a peer that authenticates (`PS_AUTH_TOKEN`). Otherwise a
/// non-blocking connect, closed at once: far cheaper than reading the
/// table, whose size grows with the sockets of the host (200 nodes on one
/// host reading it for each peer took seconds of start-up).
pub fn local_listening(endpoint: &str, quietly: bool) -> bool {
    let Some(name) = endpoint.strip_prefix("ipc://@") else {
        return false;
    };
    if name.is_empty() {
        return false;
    }
    if quietly {
        LISTENING.listening(name)
    } else {
        probe_listening(name)
    }
}

/// Whether a connect to abstract name `name` goes through (or would, but
/// for a full backlog).
fn probe_listening(name: &str) -> bool {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    // The leading NUL of `sun_path` makes the name abstract.
    if name.is_empty() || name.len() + 1 > addr.sun_path.len() {
        return false;
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (slot, &b) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *slot = b as libc::c_char;
    }
    // ZeroMQ's length: the name without a trailing NUL, as here.
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    // SAFETY: socket has no preconditions.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes and
    // `fd` is the socket just opened.
    let r = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    // EAGAIN: the listener's backlog is full, but it listens.
    let listening = r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    listening
}

/// A look at `/proc/net/unix` older than this is taken again before a name
/// counts as missing (a peer may have bound its socket since).
const UNIX_TABLE_FRESH: std::time::Duration = std::time::Duration::from_millis(10);
/// A name found in a look older than this is looked up again (its process
/// may be gone).
const UNIX_TABLE_TRUSTED: std::time::Duration = std::time::Duration::from_secs(1);

/// The abstract names with a listening socket, as last read from
/// `/proc/net/unix`: reading the table costs time in the number of Unix
/// sockets of the namespace, so a scheduler that connects to 200 nodes at
/// once reads it once, not 200 times. A name found in a look under
/// [`UNIX_TABLE_TRUSTED`] old is taken; a missing one is looked up again if
/// the look is over [`UNIX_TABLE_FRESH`] old.
static LISTENING: UnixTable = UnixTable(std::sync::Mutex::new(None));

struct UnixTable(std::sync::Mutex<Option<(std::time::Instant, std::collections::HashSet<String>)>>);

impl UnixTable {
    /// Whether `name` listens, from a look fresh enough for the answer.
    fn listening(&self, name: &str) -> bool {
        let mut table = pslite_proto::lock(&self.0);
        if let Some((at, names)) = table.as_ref() {
            let (age, hit) = (at.elapsed(), names.contains(name));
            if (hit && age < UNIX_TABLE_TRUSTED) || (!hit && age < UNIX_TABLE_FRESH) {
                return hit;
            }
        }
        let names = read_unix_table();
        let hit = names.contains(name);
        *table = Some((std::time::Instant::now(), names));
        hit
    }
}

/// The abstract names of listening Unix sockets in this network namespace.
fn read_unix_table() -> std::collections::HashSet<String> {
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return Default::default();
    };
    // "Num RefCount Protocol Flags Type St Inode Path": a listening socket
    // has __SO_ACCEPTCON (0x10000) in its flags; an abstract name is
    // written with a leading '@'.
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let listening = fields
                .get(3)
                .and_then(|f| u32::from_str_radix(f, 16).ok())
                .is_some_and(|flags| flags & 0x10000 != 0);
            let name = fields.get(7)?.strip_prefix('@')?;
            listening.then(|| name.to_string())
        })
        .collect()
}

/// Where a received frame's connection comes from, for log lines: the
/// peer's `ip:port` for TCP, its process for a Unix socket (ZeroMQ's
/// message properties give the connection's file descriptor).
pub fn peer_address(frame: &mut zmq::Message) -> String {
    let fd = frame.gets("__fd").and_then(|s| s.parse::<i32>().ok());
    if let Some(address) = fd.and_then(describe_connection) {
        return address;
    }
    frame
        .gets("Peer-Address")
        .map_or_else(|| "an unknown address".to_string(), str::to_string)
}

/// The peer of connected socket `fd`: `ip:port`, or the process on the
/// other end of a Unix socket.
fn describe_connection(fd: i32) -> Option<String> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `storage` has room for `len` bytes; a bad fd only fails.
    let r = unsafe {
        libc::getpeername(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: libc::sockaddr_in =
                unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(a.sin_port))).to_string())
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: libc::sockaddr_in6 =
                unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::from((ip, u16::from_be(a.sin6_port))).to_string())
        }
        libc::AF_UNIX => {
            // SAFETY: ucred is plain data; getsockopt writes at most `len`.
            let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
            // SAFETY: as above.
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_PEERCRED,
                    (&mut cred as *mut libc::ucred).cast(),
                    &mut len,
                )
            };
            Some(if r == 0 {
                format!("process {} of this host (Unix socket)", cred.pid)
            } else {
                "a process of this host (Unix socket)".to_string()
            })
        }
        _ => None,
    }
}

/// A received frame kept in ZeroMQ's own buffer; `Bytes` points into it.
struct ZmqFrame(zmq::Message);

impl AsRef<[u8]> for ZmqFrame {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Turns a received ZeroMQ frame into `Bytes` without copying large payloads.
pub fn frame_to_bytes(msg: zmq::Message) -> Bytes {
    if msg.len() <= COPY_LIMIT {
        Bytes::copy_from_slice(&msg)
    } else {
        Bytes::from_owner(ZmqFrame(msg))
    }
}

unsafe extern "C" fn release_bytes(_data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Box<Bytes>` leaked in `send_frame`; ZeroMQ calls
    // this exactly once, when it no longer needs the data.
    drop(unsafe { Box::from_raw(hint as *mut Bytes) });
}

/// Sends one frame (`flags`: 0 or `zmq::DONTWAIT`, with `SNDMORE` added
/// when `more`). Large frames are handed to ZeroMQ by reference: the
/// `Bytes` stays alive until ZeroMQ has written it, with no copy.
pub fn send_frame(
    socket: &mut zmq::Socket,
    frame: &Bytes,
    more: bool,
    flags: i32,
) -> zmq::Result<()> {
    let flags = if more { flags | zmq::SNDMORE } else { flags };
    if frame.len() <= COPY_LIMIT {
        return socket.send(&frame[..], flags);
    }
    let owner = Box::new(frame.clone());
    let data = owner.as_ptr() as *mut c_void;
    let len = owner.len();
    let hint = Box::into_raw(owner) as *mut c_void;
    let mut msg = zmq_sys::zmq_msg_t { __: [0; 64] };
    // SAFETY: `data` stays valid until `release_bytes` frees its owner, which
    // ZeroMQ calls once it is done with the message (also on failure, via
    // zmq_msg_close). The socket pointer is live for the borrow of `socket`.
    unsafe {
        if zmq_sys::zmq_msg_init_data(&mut msg, data, len, Some(release_bytes), hint) != 0 {
            drop(Box::from_raw(hint as *mut Bytes));
            return Err(zmq::Error::from_raw(zmq_sys::zmq_errno()));
        }
        if zmq_sys::zmq_msg_send(&mut msg, socket.as_mut_ptr(), flags) < 0 {
            let err = zmq::Error::from_raw(zmq_sys::zmq_errno());
            zmq_sys::zmq_msg_close(&mut msg);
            return Err(err);
        }
    }
    Ok(())
}

/// Sends a whole message: the encoded meta, then each data frame (waiting
/// while the peer is at its high-water mark).
pub fn send_message(socket: &mut zmq::Socket, meta: &[u8], data: &[Bytes]) -> zmq::Result<usize> {
    send_message_with(socket, meta, data, 0)
}

/// [`send_message`] with `flags`: with `zmq::DONTWAIT`, a peer at its
/// high-water mark makes it fail with `EAGAIN` before anything is sent
/// (ZeroMQ takes the rest of a multipart message once it took the first
/// part).
pub fn send_message_with(
    socket: &mut zmq::Socket,
    meta: &[u8],
    data: &[Bytes],
    flags: i32,
) -> zmq::Result<usize> {
    let more = if data.is_empty() { 0 } else { zmq::SNDMORE };
    socket.send(meta, flags | more)?;
    let mut sent = meta.len();
    for (i, frame) in data.iter().enumerate() {
        send_frame(socket, frame, i + 1 < data.len(), flags)?;
        sent += frame.len();
    }
    Ok(sent)
}

/// One message as read from a ROUTER: the sender identity and the rest.
pub struct RawMessage {
    /// The sender id from the identity frame (`K_EMPTY` if not `ps<id>`).
    pub sender: NodeId,
    /// The key the identity carried (`ps<id>/<key>`), if any.
    pub key: Option<u64>,
    /// The identity frame as received (for logs).
    pub identity: Vec<u8>,
    /// The meta frame, if the message had one.
    pub meta: Option<zmq::Message>,
    /// The data frames.
    pub data: Vec<Bytes>,
}

impl RawMessage {
    /// Bytes in the meta and data frames (the identity not counted).
    pub fn size(&self) -> usize {
        self.meta.as_ref().map_or(0, |m| m.len()) + self.data.iter().map(Bytes::len).sum::<usize>()
    }
}

/// Receives one whole multipart message from a ROUTER (blocking, honouring
/// the socket's receive timeout).
pub fn recv_message(router: &zmq::Socket) -> zmq::Result<RawMessage> {
    let identity = router.recv_msg(0)?;
    let (sender, key) = parse_keyed_identity(&identity);
    let mut raw = RawMessage {
        sender,
        key,
        identity: identity.to_vec(),
        meta: None,
        data: Vec::new(),
    };
    let mut more = identity.get_more();
    while more {
        // The rest of a multipart message is already here; a signal must not
        // cut it in two (the tail would be read as a message of its own).
        let frame = loop {
            match router.recv_msg(0) {
                Err(zmq::Error::EINTR) => continue,
                other => break other?,
            }
        };
        more = frame.get_more();
        if raw.meta.is_none() {
            raw.meta = Some(frame);
        } else {
            raw.data.push(frame_to_bytes(frame));
        }
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Whether `cond` holds within 2 s (a quiet look may be up to
    /// [`UNIX_TABLE_FRESH`] or [`UNIX_TABLE_TRUSTED`] old).
    fn soon(cond: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if cond() {
                return true;
            }
            std::thread::yield_now();
        }
        cond()
    }

    #[test]
    fn local_endpoint_probe() {
        for (n, quietly) in [false, true].into_iter().enumerate() {
            let port = 4242 + n as i32;
            let endpoint = local_endpoint("0123456789abcdef", std::process::id(), port);
            assert!(endpoint.starts_with("ipc://@pslite-0123456789abcdef-"));
            assert!(!local_listening(&endpoint, quietly), "nothing bound yet");
            assert!(!local_listening("tcp://127.0.0.1:1", quietly));
            assert!(!local_listening("ipc://@", quietly));
            let ctx = zmq::Context::new();
            let router = ctx.socket(zmq::ROUTER).unwrap();
            router.bind(&endpoint).unwrap();
            assert!(soon(|| local_listening(&endpoint, quietly)));
            // A probe leaves the socket usable.
            let mut dealer = ctx.socket(zmq::DEALER).unwrap();
            dealer.set_identity(b"ps9").unwrap();
            dealer.connect(&endpoint).unwrap();
            send_message(&mut dealer, b"meta", &[]).unwrap();
            let raw = recv_message(&router).unwrap();
            assert_eq!(raw.sender, 9);
            drop((dealer, router));
            // Terminating the context closes the listener: the name is gone.
            drop(ctx);
            assert!(soon(|| !local_listening(&endpoint, quietly)));
        }
    }

    #[test]
    fn zero_copy_round_trip() {
        let ctx = zmq::Context::new();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.bind("inproc://t").unwrap();
        let mut dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_identity(b"ps9").unwrap();
        dealer.connect("inproc://t").unwrap();
        let big = Bytes::from(vec![7u8; 100_000]);
        let small = Bytes::from_static(b"abc");
        send_message(&mut dealer, b"meta", &[big.clone(), Bytes::new(), small]).unwrap();
        let raw = recv_message(&router).unwrap();
        assert_eq!(raw.sender, 9);
        assert_eq!(&raw.meta.unwrap()[..], b"meta");
        assert_eq!(raw.data.len(), 3);
        assert_eq!(raw.data[0], big);
        assert!(raw.data[1].is_empty());
        assert_eq!(&raw.data[2][..], b"abc");
    }
}
