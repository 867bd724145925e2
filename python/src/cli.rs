//! The `pslite` command inside the Python package: `pip install ./python`
//! puts a `pslite` script on the venv's PATH (and `python -m pslite`
//! works) that runs the same command as the Rust binary, from this module.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use pyo3::prelude::*;

/// Runs the `pslite` command with `argv` (its first element the program's
/// name) and exits the process with its code: `python` is the interpreter
/// (`sys.executable`), whose directory goes first on the nodes' PATH and
/// which runs `.py` node programs and the command's own nodes
/// (`python -m pslite scheduler`).
#[pyfunction]
pub fn _cli(py: Python<'_>, argv: Vec<OsString>, python: PathBuf) -> PyResult<()> {
    let invocation = pslite_cli::Invocation {
        program: vec![python.clone().into(), "-m".into(), "pslite".into()],
        python: Some(python),
    };
    let code = py.detach(|| pslite_cli::main_with(argv, invocation));
    // ExitCode has no stable getter: find the byte it was made of.
    let code = (0..=u8::MAX)
        .find(|&c| ExitCode::from(c) == code)
        .unwrap_or(1);
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // The command's threads (output forwarders) may still run: leave
    // without Python's teardown, as the binary would.
    std::process::exit(i32::from(code));
}
