//! The `idempotency-load` binary as a shell user runs it.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::io::Read;
use std::process::{Command, Stdio};

/// `idempotency-load ... | head -1`: the reader stops reading before the report is written.
/// The tool ends quietly, as `cat` or `grep` would, instead of panicking in `println!`.
#[test]
fn a_closed_stdout_ends_the_run_quietly() {
    for format in [&["--json"][..], &[][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idempotency-load"))
            // Nothing listens on port 1: the one request fails at once and is counted.
            .args(["--url", "http://127.0.0.1:1", "--requests", "1"])
            .args(format)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end of the pipe before the run ends.
        drop(child.stdout.take());
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(
            !stderr.contains("panicked"),
            "{format:?}: the tool panicked on a closed stdout: {stderr}"
        );
        assert!(status.success(), "{format:?}: {status}: {stderr}");
    }
}

/// The report still reaches a reader that reads it.
#[test]
fn the_report_is_written_to_stdout() {
    let out = Command::new(env!("CARGO_BIN_EXE_idempotency-load"))
        .args(["--url", "http://127.0.0.1:1", "--requests", "1", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["requests"], 1);
    assert_eq!(report["statuses"]["connection-error"], 1, "{report}");
}
