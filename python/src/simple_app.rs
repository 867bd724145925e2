//! `SimpleApp`: requests with an integer head and a byte body (see
//! `pslite::SimpleApp`), and `SimpleData`, what its handles see.

use pslite::{SimpleApp, SimpleData};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::calls::{call_python, Closable};
use crate::errors::IntoPy;
use crate::postoffice::PyPostoffice;
use crate::request::{Handle, PyRequest, Target};
use crate::wait::wait_request;

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
    /// `Request` to wait on (also its timestamp, as in ps-lite).
    #[pyo3(signature = (head, body = b"".as_slice(), recv = pslite::SERVER_GROUP))]
    fn request(&self, py: Python<'_>, head: i32, body: &[u8], recv: i32) -> PyResult<PyRequest> {
        let app = self.app.get()?;
        let request = py.detach(|| app.request(head, body, recv)).py()?;
        Ok(PyRequest::new(Handle::Simple(request), "request"))
    }

    /// Answers request `req` with `body`.
    #[pyo3(signature = (req, body = b"".as_slice()))]
    fn response(&self, py: Python<'_>, req: &PySimpleData, body: &[u8]) -> PyResult<()> {
        let app = self.app.get()?;
        py.detach(|| app.response(&req.data, body)).py()
    }

    /// Waits until every receiver of request `ts` (a `Request`, or its int
    /// timestamp) has answered.
    #[pyo3(signature = (ts, timeout = None))]
    fn wait(&self, py: Python<'_>, ts: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        match Target::of(ts)? {
            Target::Request(r) => r.get().wait_for(py, timeout),
            Target::Ts(ts) => {
                let app = self.app.get()?;
                wait_request(py, ts, timeout, |slice| app.wait_timeout(ts, slice))
            }
        }
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
