//! Request handles that run on a server's engine threads
//! ([`KVServer::set_concurrent_handle`]): the [`ConcurrentHandle`] trait
//! (a handle and its check), a closure without a check, and the handle as
//! the engine runs it, answering through its server.

use std::sync::Weak;

use log::warn;
use pslite_proto::refusal::Refusal;

use super::{request_meta, Inner, KVServer};
use crate::customer::Customer;
use crate::kv_pairs::{KVMeta, KVPairs, Val};
use crate::DefaultHandle;

/// A request handle that runs on engine threads
/// ([`KVServer::set_concurrent_handle`]): `handle` as a concurrent closure
/// would, and `check`, which says whether the handle would take a request
/// or part without applying anything of it. On a push cut over threads,
/// every part is checked before any is handled, so a refused push applies
/// nothing. A handle must then refuse exactly what its check refuses.
pub trait ConcurrentHandle<V: Val>: Send + Sync + 'static {
    /// Whether the handle takes `req` (the keys of one thread, or a whole
    /// request); runs on the thread that owns the keys. By default, every
    /// request.
    fn check(&self, _meta: &KVMeta, _req: &KVPairs<V>) -> Result<(), Refusal> {
        Ok(())
    }

    /// Handles `req` and answers it ([`KVServer::answer`]).
    fn handle(&self, meta: &KVMeta, req: KVPairs<V>, server: &KVServer<V>);
}

/// A concurrent closure: no check.
pub(super) struct Unchecked<F>(pub(super) F);

impl<V: Val, F> ConcurrentHandle<V> for Unchecked<F>
where
    F: Fn(&KVMeta, KVPairs<V>, &KVServer<V>) + Send + Sync + 'static,
{
    fn handle(&self, meta: &KVMeta, req: KVPairs<V>, server: &KVServer<V>) {
        (self.0)(meta, req, server)
    }
}

/// A concurrent handle on a server's engine threads.
pub(super) struct OnEngine<V: Val, H> {
    pub(super) customer: Weak<Customer<Inner<V>>>,
    pub(super) handle: H,
}

impl<V: Val, H: ConcurrentHandle<V>> crate::engine::Runs<V> for OnEngine<V, H> {
    fn check(&self, meta: &KVMeta, part: &KVPairs<V>) -> Result<(), Refusal> {
        self.handle.check(meta, part)
    }

    fn run(&self, meta: &KVMeta, part: KVPairs<V>) {
        let Some(customer) = self.customer.upgrade() else {
            return; // the server is gone
        };
        let server = KVServer { customer };
        let po = &server.inner().po;
        crate::simple_app::contain_panic(
            po,
            || {
                if let Some(engine) = server.inner().engine.get() {
                    engine.part_failed(meta);
                }
                server.response_message(meta, KVPairs::default())
            },
            || self.handle.handle(meta, part, &server),
        );
    }

    fn refuse(&self, meta: &KVMeta, refusal: Refusal) {
        if let Some(customer) = self.customer.upgrade() {
            crate::refusal::refuse(&customer.handler().po, &request_meta(meta), refusal);
        }
    }
}

impl<V: Val> ConcurrentHandle<V> for DefaultHandle<V> {
    fn check(&self, meta: &KVMeta, req: &KVPairs<V>) -> Result<(), Refusal> {
        self.check_lengths(meta, req)
    }

    fn handle(&self, meta: &KVMeta, req: KVPairs<V>, server: &KVServer<V>) {
        let res = self.apply(meta, &req);
        if let Err(e) = server.answer(meta, res) {
            warn!("cannot answer node {}: {e}", meta.sender);
        }
    }
}
