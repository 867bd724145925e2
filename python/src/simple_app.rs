//! `SimpleApp`: requests with an integer head and a byte body (see
//! `pslite::SimpleApp`), and `SimpleData`, what its handles see.

use pslite::{Error, SimpleApp, SimpleData};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::calls::{call_python, Closable};
use crate::errors::{to_py, IntoPy};
use crate::postoffice::PyPostoffice;
use crate::wait::{seconds, sliced, Slice};

/// A SimpleApp message as a handle sees it: `head`, `body` (bytes),
/// `sender`, `timestamp`, `customer_id`.
#[pyclass(module = "pslite", frozen, name = "SimpleData")]
pub struct PySimpleData {
    pub(crate) data: SimpleData,
}

#[pymethods]
impl PySimpleData {
    /// The app-defined command.
    #[getter]
    fn head(&self) -> i32 {
        self.data.head
    }

    /// The payload.
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data.body)
    }

    /// The sending node's id.
    #[getter]
    fn sender(&self) -> i32 {
        self.data.sender
    }

    /// The request's timestamp (echoed in the response).
    #[getter]
    fn timestamp(&self) -> i32 {
        self.data.timestamp
    }

    /// The sending customer.
    #[getter]
    fn customer_id(&self) -> i32 {
        self.data.customer_id
    }

    fn __repr__(&self) -> String {
        format!(
            "SimpleData(head={}, body=<{} bytes>, sender={}, timestamp={})",
            self.data.head,
            self.data.body.len(),
            self.data.sender,
            self.data.timestamp
        )
    }
}

/// Waits for request `ts` of a customer in slices; `wait_slice` is the
/// app's `wait_timeout`.
pub fn wait_request(
    py: Python<'_>,
    ts: i32,
    timeout: Option<f64>,
    wait_slice: impl Fn(std::time::Duration) -> Result<(), Error> + Send + Sync,
) -> PyResult<()> {
    let limit = seconds(timeout)?;
    let done = sliced(py, limit, |slice| match wait_slice(slice) {
        Err(Error::Timeout { .. }) => Slice::Again,
        other => Slice::Done(other),
    })?;
    match done {
        Some(result) => result.py(),
        None => Err(to_py(Error::Timeout {
            ts,
            secs: limit.map_or(0.0, |l| l.as_secs_f64()),
        })),
    }
}

/// Request/response messages with an integer `head` and a byte `body`, as
/// ps-lite's SimpleApp: a request goes to one node or a whole group, and
/// completes when every receiver has answered. As in ps-lite, requests are
/// delivered to the customer whose id is the app id: the app that serves
/// requests is `SimpleApp(po, app_id=A, customer_id=A)`.
#[pyclass(module = "pslite", name = "SimpleApp")]
pub struct PySimpleApp {
    app: Closable<SimpleApp>,
}

/// A Python handle as a SimpleApp handle.
fn simple_handle(handle: Py<PyAny>) -> impl FnMut(&SimpleData, &SimpleApp) + Send + 'static {
    move |data, app| {
        call_python(|py| {
            let data = PySimpleData { data: data.clone() };
            let app = PySimpleApp {
                app: Closable::new(app.clone(), "SimpleApp"),
            };
            handle.call1(py, (data, app))?;
            Ok(())
        })
    }
}

#[pymethods]
impl PySimpleApp {
    /// A SimpleApp `app_id`, customer `customer_id` of `po`.
    #[new]
    #[pyo3(signature = (po, app_id = 0, customer_id = 0))]
    fn new(py: Python<'_>, po: &PyPostoffice, app_id: i32, customer_id: i32) -> PyResult<Self> {
        let po = po.po.clone();
        let app = py
            .detach(|| SimpleApp::new(&po, app_id, customer_id))
            .py()?;
        Ok(PySimpleApp {
            app: Closable::new(app, "SimpleApp"),
        })
    }

    /// Sends request `head`/`body` to node or group `recv`; returns the
    /// timestamp to `wait` on.
    #[pyo3(signature = (head, body = b"".as_slice(), recv = pslite::SERVER_GROUP))]
    fn request(&self, py: Python<'_>, head: i32, body: &[u8], recv: i32) -> PyResult<i32> {
        let app = self.app.get()?;
        py.detach(|| app.request(head, body, recv).map(pslite::Request::into_ts))
            .py()
    }

    /// Answers request `req` with `body`.
    #[pyo3(signature = (req, body = b"".as_slice()))]
    fn response(&self, py: Python<'_>, req: &PySimpleData, body: &[u8]) -> PyResult<()> {
        let app = self.app.get()?;
        py.detach(|| app.response(&req.data, body)).py()
    }

    /// Waits until every receiver of request `ts` has answered.
    #[pyo3(signature = (ts, timeout = None))]
    fn wait(&self, py: Python<'_>, ts: i32, timeout: Option<f64>) -> PyResult<()> {
        let app = self.app.get()?;
        wait_request(py, ts, timeout, |slice| app.wait_timeout(ts, slice))
    }

    /// Calls `handle(req, app)` for each request (it answers with
    /// `app.response(req, body)`, now or later); requests that came before
    /// are handled now, in order.
    fn set_request_handle(&self, py: Python<'_>, handle: Py<PyAny>) -> PyResult<()> {
        let app = self.app.get()?;
        py.detach(|| app.set_request_handle(simple_handle(handle)));
        Ok(())
    }

    /// Calls `handle(resp, app)` for each response.
    fn set_response_handle(&self, py: Python<'_>, handle: Py<PyAny>) -> PyResult<()> {
        let app = self.app.get()?;
        py.detach(|| app.set_response_handle(simple_handle(handle)));
        Ok(())
    }

    /// The app id.
    #[getter]
    fn app_id(&self) -> PyResult<i32> {
        Ok(self.app.get()?.app_id())
    }

    /// The customer id.
    #[getter]
    fn customer_id(&self) -> PyResult<i32> {
        Ok(self.app.get()?.customer_id())
    }

    /// Closes the app now (otherwise when it is garbage-collected).
    fn close(&mut self) {
        self.app.close();
    }
}
