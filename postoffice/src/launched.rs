//! How a pslite scheduler shows `pslite launch` that it is one.
//!
//! The launcher names each node's output by its node id, which it reads from
//! the scheduler's node table with the admin STATUS request. C++ ps-lite
//! does not know that request (its scheduler logs "Drop unknown typed
//! message" and may crash on it), so the launcher must not send it before it
//! knows the scheduler is pslite's. It gives the scheduler it starts the path
//! of a file in [`MARK_VAR`]; a pslite scheduler writes that file once it
//! listens ([`mark_scheduler`]). A C++ scheduler never does, and is sent
//! nothing. Nothing of this reaches the wire.

use std::path::Path;

/// The variable the launcher sets on the scheduler it starts: the path of
/// the file a pslite scheduler writes once it listens.
pub const MARK_VAR: &str = crate::settings::PSLITE_LAUNCH_MARK.name;

/// What the mark file holds: `pslite scheduler <port>`.
pub fn mark_text(port: i32) -> String {
    format!("pslite scheduler {port}\n")
}

/// Writes the mark file if the launcher asked for one (see the module
/// docs): to a temporary name, then renamed, so the launcher never reads a
/// part. A failure is logged: the launcher then names nodes by launch order.
pub(crate) fn mark_scheduler(port: i32) {
    let Ok(Some(path)) = crate::settings::PSLITE_LAUNCH_MARK.get() else {
        return;
    };
    if let Err(e) = write_mark(Path::new(&path), port) {
        log::warn!(
            "cannot tell pslite launch this scheduler's port ({MARK_VAR}={}): {e}; it names \
             nodes by launch order",
            Path::new(&path).display()
        );
    }
}

fn write_mark(path: &Path, port: i32) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, mark_text(port))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_written_whole_under_its_name() {
        let dir = std::env::temp_dir().join(format!("pslite-mark-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mark");
        write_mark(&path, 9091).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), mark_text(9091));
        assert!(!dir.join("mark.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
