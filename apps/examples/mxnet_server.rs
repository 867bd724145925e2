//! A server of MXNet 1.9.1's `dist_sync` KVStore, in Rust: MXNet workers (or
//! `mxnet_worker`) use it exactly like MXNet's `KVStoreDistServer` without an
//! updater (`kvstore_dist_server.h`, `DataHandleDefault` + `CommandHandle`).
//!
//! Semantics (see docs/PROTOCOL.md, "MXNet's KVStore"):
//! - Requests carry exactly one key; values are raw bytes of the dtype the
//!   `head` names (Cantor pair of request type 0 and mshadow dtype: float32 0,
//!   float64 2, float16 5); a push's lens frame is its byte count.
//! - A push to a key with no stored value initialises it and is answered at once.
//! - In sync mode a push is queued: the first of a round is copied, later ones
//!   are added; when `DMLC_NUM_WORKER` pushes of the key have arrived, the
//!   stored value is replaced by the sum and every queued request is answered
//!   (push-pulls with the new value). Unlike MXNet, a push-only request in a
//!   round that also has push-pulls is answered too.
//! - Without sync mode (dist_async) MXNet needs an updater; this server has
//!   none and stores each push as it comes (MXNet aborts there instead).
//! - A pull is answered at once with the stored value: keys echoed, vals, lens =
//!   [byte count], data types [UINT64, OTHER, INT32].
//! - SimpleApp commands on app 0: head 3 sets sync mode, head 2 stops the
//!   server (answered, then the server finalizes); heads 1 (multi-precision)
//!   and 5 (profiler) are accepted and ignored; 0 (Python optimizer) and 4
//!   (gradient compression) are answered but unsupported (logged).
//!
//! It is a `KVServer` on app 0 (customer 0), like MXNet's `KVServer<char>`:
//! the KV requests go to its request handle, the SimpleApp commands to its
//! simple-request handle (`KVServer::set_simple_request_handle`). Values are
//! `MxByte`s, a one-byte value type whose frames are typed OTHER like those of
//! C++ `KVServer<char>`.
//!
//! It is not a scheduler (nor is its counterpart): under `pslite launch`, run
//! pslite's:
//! `pslite launch -s 1 -w 2 --scheduler-program pslite --server-program
//! target/release/examples/mxnet_server -- target/release/examples/mxnet_worker`.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use pslite::{Error, KVMeta, KVPairs, KVServer, Key, Postoffice, SArray, SimpleData};

#[path = "shared/mxnet.rs"]
mod mxnet;
use mxnet::*;

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

/// One round of pushes of a key, waiting for every worker.
#[derive(Default)]
struct Merge {
    sum: Vec<u8>,
    requests: Vec<KVMeta>,
}

/// The state of `KVStoreDistServer` (no updater, no multi-precision copy).
struct MxServer {
    num_workers: usize,
    sync_mode: bool,
    store: HashMap<Key, (Dtype, SArray<MxByte>)>,
    merge: HashMap<Key, Merge>,
    errors: usize,
}

type Server = KVServer<MxByte>;

fn as_bytes(vals: &SArray<MxByte>) -> &[u8] {
    vals.bytes()
}

impl MxServer {
    fn error(&mut self, what: String) {
        eprintln!("mxnet_server: ERROR {what}");
        self.errors += 1;
    }

    /// `KVServer::Response`: a push answer has no data; a pull answer has
    /// keys (echoed), vals and lens = [byte count].
    fn respond(&mut self, server: &Server, req: &KVMeta, data: Option<(Key, SArray<MxByte>)>) {
        let res = match data {
            Some((key, vals)) => {
                let lens = [vals.len() as i32];
                KVPairs::with_lens(vec![key], vals, lens.to_vec())
            }
            None => KVPairs::default(),
        };
        if let Err(e) = server.response(req, res) {
            self.error(format!("cannot answer node {}: {e}", req.sender));
        }
    }

    /// `CommandHandle`: runs a SimpleApp command and answers it (empty body,
    /// head, ts and the requester's customer id echoed). True for "stop server".
    fn on_command(&mut self, server: &Server, req: &SimpleData) -> bool {
        let head = req.head;
        match head {
            CMD_SYNC_MODE => self.sync_mode = true,
            CMD_STOP_SERVER => {}
            CMD_SET_MULTI_PRECISION | CMD_SET_PROFILER_PARAMS => {}
            CMD_CONTROLLER | CMD_SET_GRADIENT_COMPRESSION => self.error(format!(
                "command {head} from node {} is not supported (no optimizer or gradient \
                 compression here); answered without effect",
                req.sender
            )),
            _ => self.error(format!("unknown command {head} from node {}", req.sender)),
        }
        if let Err(e) = server.simple_response(req, b"") {
            self.error(format!(
                "cannot answer command {head} of node {}: {e}",
                req.sender
            ));
        }
        head == CMD_STOP_SERVER
    }

    /// `DataHandleDefault`, the KV request handle.
    fn on_data(&mut self, server: &Server, req: &KVMeta, data: KVPairs<MxByte>) {
        let dtype = match Dtype::of_head(req.cmd) {
            Ok(d) => d,
            Err(e) => return self.error(format!("node {}: {e}; not answered", req.sender)),
        };
        if data.keys.len() != 1 {
            return self.error(format!(
                "node {}: {} keys in one request (MXNet sends exactly 1); not answered",
                req.sender,
                data.keys.len()
            ));
        }
        let key = data.keys[0];
        if req.push {
            if data.lens.len() != 1 || data.lens[0] as usize != data.vals.len() {
                return self.error(format!(
                    "node {}: push of key {key} with lens {:?} for {} bytes; not answered",
                    req.sender,
                    data.lens.as_slice(),
                    data.vals.len()
                ));
            }
            if data.vals.len() % dtype.size() != 0 {
                return self.error(format!(
                    "node {}: {} bytes are not {dtype:?} values; not answered",
                    req.sender,
                    data.vals.len()
                ));
            }
            let vals = data.vals;
            let Some((stored_type, stored)) = self.store.get(&key) else {
                // Initialisation: store and answer at once.
                self.store.insert(key, (dtype, vals));
                return self.respond(server, req, None);
            };
            if *stored_type != dtype || stored.len() != vals.len() {
                let msg = format!(
                    "node {}: push of {} bytes of {dtype:?} to key {key} holding {} bytes of \
                     {stored_type:?}; not answered",
                    req.sender,
                    vals.len(),
                    stored.len()
                );
                return self.error(msg);
            }
            if !self.sync_mode {
                self.store.insert(key, (dtype, vals.clone()));
                let data = req.pull.then_some((key, vals));
                return self.respond(server, req, data);
            }
            let m = self.merge.entry(key).or_default();
            if m.requests.is_empty() {
                m.sum = as_bytes(&vals).to_vec();
            } else {
                dtype.add_into(&mut m.sum, as_bytes(&vals));
            }
            m.requests.push(req.clone());
            if m.requests.len() < self.num_workers {
                return;
            }
            let m = self.merge.remove(&key).unwrap_or_default();
            let merged: SArray<MxByte> = SArray::from_vec(m.sum.into_iter().map(MxByte).collect());
            self.store.insert(key, (dtype, merged.clone()));
            for r in &m.requests {
                let data = r.pull.then(|| (key, merged.clone()));
                self.respond(server, r, data);
            }
        } else if req.pull {
            match self.store.get(&key) {
                Some((_, stored)) => {
                    let stored = stored.clone();
                    self.respond(server, req, Some((key, stored)));
                }
                None => self.error(format!(
                    "node {} pulls key {key} before it was initialised; not answered",
                    req.sender
                )),
            }
        } else {
            self.error(format!(
                "node {}: neither push nor pull; not answered",
                req.sender
            ));
        }
    }
}

fn lock(state: &Mutex<MxServer>) -> MutexGuard<'_, MxServer> {
    pslite::proto::lock(state)
}

fn run() -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    if !po.is_server() {
        return Err(Error::InvalidInput(format!(
            "mxnet_server runs as a server only (DMLC_ROLE={})",
            po.role()
        )));
    }
    // StartAsync(0) + Barrier(0, 7): on the wire the same as start(0, true).
    po.start(0, true)?;
    eprintln!(
        "mxnet_server: server rank {} (node {}) serving {} workers",
        po.my_rank()?,
        po.my_id()?,
        po.num_workers()
    );
    let state = Arc::new(Mutex::new(MxServer {
        num_workers: po.num_workers().max(1) as usize,
        sync_mode: false,
        store: HashMap::new(),
        merge: HashMap::new(),
        errors: 0,
    }));
    // MXNet's KVServer<char>(0): app 0, which a server uses as its customer id too.
    let server = Server::new(&po, 0)?;
    let (stop_tx, stop_rx) = mpsc::channel();
    let commands = Arc::clone(&state);
    server.set_simple_request_handle(move |req, server| {
        if lock(&commands).on_command(server, req) {
            let _ = stop_tx.send(());
        }
    });
    let data = Arc::clone(&state);
    server.set_request_handle(move |req, kvs, server| lock(&data).on_data(server, req, kvs));
    // Serve until a worker sends "stop server" (the executor's Run() returning).
    let stopped = stop_rx.recv().is_ok();
    // Finalize(0, true): barrier 7, then the node stops.
    po.finalize(0, true)?;
    drop(server);
    let s = lock(&state);
    let pending: usize = s.merge.values().map(|m| m.requests.len()).sum();
    eprintln!(
        "mxnet_server: finalized; {} keys stored, {pending} pushes left unmerged, {} errors",
        s.store.len(),
        s.errors
    );
    if !stopped {
        return Err(Error::App("no 'stop server' command arrived".into()));
    }
    if s.errors > 0 || pending > 0 {
        return Err(Error::App(format!(
            "{} errors, {pending} pushes never merged",
            s.errors
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        assert_eq!(Dtype::of_head(0), Ok(Dtype::F32));
        assert_eq!(Dtype::of_head(2), Ok(Dtype::F64));
        assert_eq!(Dtype::of_head(5), Ok(Dtype::F16));
        assert!(Dtype::of_head(1).is_err()); // row-sparse float32
        assert!(Dtype::of_head(3).is_err()); // compressed float32
        assert!(Dtype::of_head(14).is_err()); // int32 (mshadow 4)
    }

    #[test]
    fn half_sums() {
        let mut a = f32_to_f16(3.0).to_le_bytes().to_vec();
        Dtype::F16.add_into(&mut a, &f32_to_f16(4.0).to_le_bytes());
        assert_eq!(f16_to_f32(u16::from_le_bytes([a[0], a[1]])), 7.0);
    }
}
