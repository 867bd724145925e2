//! Opening one peer's DEALER: its identity, linger, connect timeout,
//! high-water mark, token and IPv6, set before it connects.

use pslite_proto::{NodeId, K_EMPTY};

use crate::context::{Context, Socket};
use crate::transport::{self, zmq_err};
use crate::VanConfig;
use crate::VanError;

/// How long DEALERs keep unsent messages when closed.
const LINGER_MS: i32 = 1000;
/// How long a DEALER waits for its TCP connection to be accepted before
/// ZeroMQ abandons the attempt and retries (after `ZMQ_RECONNECT_IVL`,
/// 100 ms by default). Loopback and LAN connections take well under a
/// millisecond; a longer wait means the SYN was dropped.
const CONNECT_TIMEOUT_MS: i32 = 500;

/// Opens a DEALER connected to `endpoint` as `ps<identity>` or
/// `ps<identity>/<key>` (anonymous for [`K_EMPTY`]), with `config`'s linger,
/// high-water mark and token; `before_connect` runs on it just before it
/// connects (to watch it from its first event).
pub(super) fn open_dealer(
    ctx: &Context,
    config: &VanConfig,
    identity: NodeId,
    key: Option<u64>,
    endpoint: &str,
    before_connect: impl FnOnce(&zmq::Socket) -> Result<(), VanError>,
) -> Result<Socket, VanError> {
    let socket = ctx
        .socket(zmq::DEALER)
        .map_err(zmq_err("creating a DEALER"))?;
    if identity != K_EMPTY {
        socket
            .set_identity(transport::keyed_identity(identity, key).as_bytes())
            .map_err(zmq_err("setting the identity"))?;
    }
    socket
        .set_linger(LINGER_MS)
        .map_err(zmq_err("setting LINGER"))?;
    // A SYN lost to a full listen queue is otherwise retried by TCP after
    // 1 s (then 3 s, 7 s ...): give up on the attempt sooner and let
    // ZeroMQ reconnect after its interval.
    socket
        .set_connect_timeout(CONNECT_TIMEOUT_MS)
        .map_err(zmq_err("setting CONNECT_TIMEOUT"))?;
    crate::auth::secure_dealer(&socket, config.auth_token.as_ref())?;
    if let Some(hwm) = config.water_mark {
        socket
            .set_sndhwm(hwm)
            .map_err(zmq_err("setting the send high-water mark"))?;
    }
    if endpoint.starts_with("tcp://[") {
        socket
            .set_ipv6(true)
            .map_err(zmq_err("enabling IPv6 on a DEALER"))?;
    }
    before_connect(&socket)?;
    socket
        .connect(endpoint)
        .map_err(zmq_err(format!("connecting to {endpoint}")))?;
    Ok(socket)
}
