//! Hostile paths given where a file is expected (issue 29, item 9): a directory or a device named as a
//! model ends in a clear error naming it and what it is, exit status 2, never "too short to be a GGUF
//! file" and never a blocked read.

use std::path::PathBuf;
use std::process::Command;

fn lockstep(args: &[&str]) -> (i32, String) {
    let out = Command::new(PathBuf::from(env!("CARGO_BIN_EXE_lockstep")))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn inspect_names_a_directory_or_a_device_for_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("model.gguf");
    std::fs::create_dir(&d).unwrap();
    let (code, err) = lockstep(&["inspect", "--model", d.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is a directory") && err.contains("model.gguf"),
        "{err}"
    );
    let (code, err) = lockstep(&["inspect", "--model", "/dev/null"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("/dev/null") && err.contains("not a regular file"),
        "{err}"
    );
}
