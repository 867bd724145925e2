//! The `pslite` binary: the command of the `pslite_cli` library.

fn main() -> std::process::ExitCode {
    pslite_cli::main()
}
