//! `Postoffice`: one node of a cluster (see `pslite::Postoffice`).

use std::sync::mpsc;
use std::time::Duration;

use pslite::{Membership, Postoffice, Role};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::calls::call_python;
use crate::errors::IntoPy;
use crate::store::PyStore;
use crate::wait::{interruptible, seconds};

/// The workers of the current elastic round, in rank order.
#[pyclass(module = "pslite", frozen, get_all, name = "Membership")]
pub struct PyMembership {
    /// The round number: 0 for the first round, then 1, 2, ...
    round: u64,
    /// The round's worker node ids in rank order (a worker's rank is its index).
    workers: Vec<i32>,
}

impl From<Membership> for PyMembership {
    fn from(m: Membership) -> Self {
        PyMembership {
            round: m.round,
            workers: m.workers,
        }
    }
}

#[pymethods]
impl PyMembership {
    fn __repr__(&self) -> String {
        format!(
            "Membership(round={}, workers={:?})",
            self.round, self.workers
        )
    }
}

/// A node of a ps-lite cluster: its role, rank and peers, barriers, the
/// job's key-value store. Made from the `DMLC_*` / `PS_*` environment
/// (`pslite launch` sets it) with `Postoffice.from_env()`.
#[pyclass(module = "pslite", frozen, name = "Postoffice")]
pub struct PyPostoffice {
    pub(crate) po: Postoffice,
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Scheduler => "scheduler",
        Role::Server => "server",
        Role::Worker => "worker",
    }
}

#[pymethods]
impl PyPostoffice {
    /// The node the `DMLC_*` / `PS_*` environment variables describe;
    /// raises `ConfigError` naming the variable to fix.
    #[staticmethod]
    fn from_env() -> PyResult<PyPostoffice> {
        Ok(PyPostoffice {
            po: Postoffice::from_env().py()?,
        })
    }

    /// Starts the node and joins the cluster as `customer_id`; with
    /// `do_barrier`, waits until every node has started.
    #[pyo3(signature = (customer_id = 0, do_barrier = true))]
    fn start(&self, py: Python<'_>, customer_id: i32, do_barrier: bool) -> PyResult<()> {
        let po = self.po.clone();
        interruptible(py, "start", move || po.start(customer_id, do_barrier))?.py()
    }

    /// Leaves the cluster: with `do_barrier`, first waits until every node
    /// is finalizing. Customer 0 then stops the node.
    #[pyo3(signature = (customer_id = 0, do_barrier = true))]
    fn finalize(&self, py: Python<'_>, customer_id: i32, do_barrier: bool) -> PyResult<()> {
        let po = self.po.clone();
        interruptible(py, "finalize", move || po.finalize(customer_id, do_barrier))?.py()
    }

    /// Waits until every node of `group` (a sum of `SCHEDULER_GROUP`,
    /// `SERVER_GROUP`, `WORKER_GROUP`) has called `barrier` for it; with
    /// `timeout` (seconds), raises `Timeout` after it.
    #[pyo3(signature = (group, customer_id = 0, timeout = None))]
    fn barrier(
        &self,
        py: Python<'_>,
        group: i32,
        customer_id: i32,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let timeout = seconds(timeout)?;
        let po = self.po.clone();
        interruptible(py, "barrier", move || {
            po.barrier_with_timeout(customer_id, group, timeout)
        })?
        .py()
    }

    /// Takes a checkpoint of the servers (`PS_CHECKPOINT_DIR`) as a
    /// collective of the workers: every worker calls it at the same point
    /// with no request in flight, exactly one with `ask`; they meet at a
    /// barrier where it is taken, released once it is complete. Returns to
    /// the asker a dict (`id`, `dir`, `files`: names, `bytes`,
    /// `elapsed_ms`), `None` to the others; raises `CheckpointFailed` (the
    /// asker) if it was refused or failed. Each step waits up to `timeout`
    /// seconds. `pslite.torch.checkpoint()` is the way to call it.
    #[pyo3(signature = (label, ask, timeout = 600.0, customer_id = 0))]
    fn checkpoint<'py>(
        &self,
        py: Python<'py>,
        label: String,
        ask: bool,
        timeout: f64,
        customer_id: i32,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let limit = seconds(Some(timeout))?.unwrap_or_default();
        let po = self.po.clone();
        let done = interruptible(py, "checkpoint", move || {
            po.checkpoint(customer_id, &label, ask, limit)
        })?
        .py()?;
        let Some(done) = done else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("id", done.id)?;
        d.set_item("dir", done.dir)?;
        let files: Vec<&str> = done.files.iter().map(|f| f.name.as_str()).collect();
        d.set_item("files", files)?;
        d.set_item("bytes", done.files.iter().map(|f| f.size).sum::<u64>())?;
        d.set_item("elapsed_ms", done.elapsed_ms)?;
        Ok(Some(d))
    }

    /// `"scheduler"`, `"server"` or `"worker"`.
    #[getter]
    fn role(&self) -> &'static str {
        role_name(self.po.role())
    }

    /// Whether this node is a worker.
    #[getter]
    fn is_worker(&self) -> bool {
        self.po.is_worker()
    }

    /// Whether this node is a server.
    #[getter]
    fn is_server(&self) -> bool {
        self.po.is_server()
    }

    /// Whether this node is the scheduler.
    #[getter]
    fn is_scheduler(&self) -> bool {
        self.po.is_scheduler()
    }

    /// This node's rank among the nodes of its role (in elastic mode, a
    /// worker's rank in the current round). After `start`.
    fn my_rank(&self) -> PyResult<i32> {
        self.po.my_rank().py()
    }

    /// This node's id (1 the scheduler, 8 + 2r servers, 9 + 2r workers).
    /// After `start`.
    fn my_id(&self) -> PyResult<i32> {
        self.po.my_id().py()
    }

    /// `DMLC_NUM_WORKER` (in elastic mode, the current round's workers).
    #[getter]
    fn num_workers(&self) -> i32 {
        self.po.num_workers()
    }

    /// `DMLC_NUM_SERVER`.
    #[getter]
    fn num_servers(&self) -> i32 {
        self.po.num_servers()
    }

    /// Whether this node replaced a dead one.
    #[getter]
    fn is_recovery(&self) -> bool {
        self.po.is_recovery()
    }

    /// Whether this node runs in elastic mode (`DMLC_NUM_WORKER=MIN:MAX`).
    #[getter]
    fn is_elastic(&self) -> bool {
        self.po.is_elastic()
    }

    /// The current round of workers (round 0 with every worker in plain mode).
    fn membership(&self) -> PyMembership {
        self.po.membership().into()
    }

    /// Elastic mode: the round this node joined in, once joined (a worker
    /// admitted after round 0 must not call the barrier it was admitted at).
    fn joined_round(&self) -> Option<u64> {
        self.po.joined_round()
    }

    /// Calls `callback(membership)` each time an elastic round begins or
    /// this node joins one (register it before `start`). It runs on a
    /// thread of its own, never on the node's receive thread.
    fn on_membership_change(&self, callback: Py<PyAny>) -> PyResult<()> {
        let (tx, rx) = mpsc::channel::<Membership>();
        std::thread::Builder::new()
            .name("pslite-py-membership".into())
            .spawn(move || {
                for m in rx {
                    call_python(|py| {
                        callback.call1(py, (PyMembership::from(m),))?;
                        Ok(())
                    });
                }
            })
            .map_err(|e| {
                pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start a thread: {e}"))
            })?;
        let tx = std::sync::Mutex::new(tx);
        self.po.on_membership_change(move |m| {
            let _ = pslite::proto::lock(&tx).send(m.clone());
        });
        Ok(())
    }

    /// The key range `(begin, end)` each server owns, by server rank.
    fn server_key_ranges(&self) -> Vec<(u64, u64)> {
        self.po
            .server_key_ranges()
            .into_iter()
            .map(|r| (r.begin, r.end))
            .collect()
    }

    /// The node ids of `group` (a group constant or a node id).
    fn node_ids(&self, group: i32) -> Vec<i32> {
        self.po.node_ids(group)
    }

    /// Nodes silent for longer than `timeout` seconds (ps-lite's `GetDeadNodes`).
    fn dead_nodes(&self, timeout: f64) -> PyResult<Vec<i32>> {
        let t = seconds(Some(timeout))?.unwrap_or(Duration::ZERO);
        Ok(self.po.dead_nodes(t))
    }

    /// The job's key-value store, hosted by the scheduler (after `start`);
    /// waiting calls give up after `timeout` seconds (None: never).
    #[pyo3(signature = (timeout = 300.0))]
    fn store(&self, timeout: Option<f64>) -> PyResult<PyStore> {
        let timeout = seconds(timeout)?.unwrap_or(pslite::Store::NO_TIMEOUT);
        let store = self.po.store().py()?.with_timeout(timeout);
        Ok(PyStore::new(store))
    }

    /// This node's counters: messages and bytes sent and received (in
    /// total and per peer), resends, drops, requests in flight, handler time.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.po.counters();
        let d = PyDict::new(py);
        d.set_item("bytes_sent", c.bytes_sent())?;
        d.set_item("bytes_received", c.bytes_received())?;
        let peers = PyDict::new(py);
        for p in &c.peers {
            let pd = PyDict::new(py);
            pd.set_item("messages_sent", p.messages_sent)?;
            pd.set_item("bytes_sent", p.bytes_sent)?;
            pd.set_item("messages_received", p.messages_received)?;
            pd.set_item("bytes_received", p.bytes_received)?;
            peers.set_item(p.peer, pd)?;
        }
        d.set_item("peers", peers)?;
        d.set_item("resends", c.resends)?;
        d.set_item("dropped_malformed", c.dropped_malformed)?;
        d.set_item("dropped_unknown_peer", c.dropped_unknown_peer)?;
        d.set_item("dropped_injected", c.dropped_injected)?;
        d.set_item("dropped_duplicate", c.dropped_duplicate)?;
        d.set_item("dropped_hold_limit", c.dropped_hold_limit)?;
        d.set_item("requests_in_flight", c.requests_in_flight)?;
        d.set_item("handler_calls", c.handler_calls)?;
        d.set_item("handler_seconds", c.handler_nanos as f64 / 1e9)?;
        d.set_item("uptime_seconds", c.uptime.as_secs_f64())?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        match self.po.my_id() {
            Ok(id) => format!("<pslite.Postoffice {} node {id}>", self.role()),
            Err(_) => format!("<pslite.Postoffice {} (not started)>", self.role()),
        }
    }
}
