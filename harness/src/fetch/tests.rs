//! Unit tests of the fetch modules.

use super::cache::read_sidecar;
use super::*;

#[test]
fn pip_command_splits_env_and_defaults() {
    assert_eq!(pip_command(None), ["python3", "-m", "pip"]);
    assert_eq!(pip_command(Some("  ")), ["python3", "-m", "pip"]);
    assert_eq!(pip_command(Some("/x/py  -m pip")), ["/x/py", "-m", "pip"]);
}

#[test]
fn cache_dir_from_env_or_user_cache() {
    assert_eq!(
        cache_dir_from(Some("/tmp/c".into())).unwrap(),
        PathBuf::from("/tmp/c")
    );
    if let Some(user) = dirs::cache_dir() {
        assert_eq!(
            cache_dir_from(Some("".into())).unwrap(),
            user.join("lockstep")
        );
        assert_eq!(cache_dir_from(None).unwrap(), user.join("lockstep"));
    }
    assert_eq!(
        model_path(Path::new("/c"), "m-1"),
        PathBuf::from("/c/models/m-1.gguf")
    );
    assert_eq!(
        sidecar_path(Path::new("/c"), "m-1"),
        PathBuf::from("/c/models/m-1.gguf.sha256")
    );
}

#[test]
fn path_specs_versus_ids() {
    assert!(!is_path_spec("smollm2-135m-q4_1"));
    assert!(!is_path_spec("qwen2.5-coder-0.5b-q4_k_m"));
    assert!(is_path_spec("model.gguf"));
    assert!(is_path_spec("./model"));
    assert!(is_path_spec("/abs/x.bin"));
}

#[test]
fn disk_full_error_names_directory_and_space() {
    let entry = Registry::builtin()
        .unwrap()
        .get("smollm2-135m-q4_1")
        .unwrap()
        .clone();
    let e = write_error(
        io::Error::from_raw_os_error(28),
        Path::new("/some/cache/models"),
        &entry,
        1 << 20,
    );
    let msg = format!("{e:#}");
    assert!(msg.contains("/some/cache/models"), "{msg}");
    assert!(msg.contains("187.6 MiB (196724864 bytes)"), "{msg}"); // 2 × 98,362,432 bytes
    assert!(msg.contains("LOCKSTEP_CACHE"), "{msg}");
    let other = write_error(io::Error::from_raw_os_error(13), Path::new("/d"), &entry, 0);
    assert!(format!("{other:#}").contains("cannot write to /d"));
}

#[test]
fn tail_keeps_last_lines() {
    let text = (1..=30)
        .map(|i| format!("line {i}"))
        .collect::<Vec<_>>()
        .join("\n");
    let t = tail_lines(&text, 3);
    assert_eq!(t, "  line 28\n  line 29\n  line 30");
    assert_eq!(tail_lines("\n\n", 3), "  (nothing)");
}

#[test]
fn sidecar_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.sha256");
    assert!(read_sidecar(&p).is_none());
    fs::write(&p, format!("{}  x.gguf\n", "AB".repeat(32))).unwrap();
    let r = read_sidecar(&p).unwrap();
    assert_eq!((r.sha256, r.stamp), ("ab".repeat(32), None));
    let st = FileStamp {
        size: 7,
        dev: 2049,
        ino: 1234,
        mtime_ns: 1_700_000_000_123_456_789,
        ctime_ns: -5,
    };
    fs::write(&p, format!("{}  x.gguf\n{}\n", "ab".repeat(32), st.line())).unwrap();
    assert_eq!(read_sidecar(&p).unwrap().stamp, Some(st));
    fs::write(&p, "short  x.gguf\n").unwrap();
    assert!(read_sidecar(&p).is_none());
}
