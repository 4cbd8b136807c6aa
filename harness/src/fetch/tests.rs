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
    let entry = Registry::active()
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

// ---- seeded models ([[synth]]): written by lockstep, never downloaded -------------------------------------

/// Options under which any pip call fails: a seeded model must never need one.
fn no_pip() -> FetchOptions {
    FetchOptions {
        verify: false,
        progress: false,
        pip: vec!["/nonexistent/pip".into()],
        recipe: None,
    }
}

/// The names in `<cache>/models`, sorted.
fn models_listing(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(cache.join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The file's identity (inode, mtime, ctime, ...): a file written again has another ctime.
fn stamp(p: &Path) -> Option<FileStamp> {
    FileStamp::of(&fs::metadata(p).unwrap())
}

#[test]
fn fetch_synth_writes_the_registered_file_and_a_second_fetch_is_a_cache_hit() {
    let reg = Registry::active().unwrap();
    let entry = reg.synth("synth-qwen3").unwrap();
    let cache = tempfile::tempdir().unwrap();
    let path = fetch_synth_into(entry, cache.path(), &no_pip()).unwrap();
    assert_eq!(path, model_path(cache.path(), "synth-qwen3"));
    assert_eq!(fs::metadata(&path).unwrap().len(), entry.size);
    assert_eq!(crate::hash::sha256_file(&path).unwrap(), entry.sha256);
    assert_eq!(
        models_listing(cache.path()),
        ["synth-qwen3.gguf", "synth-qwen3.gguf.sha256"]
    );
    // the sidecar of a download: the verified hash and the file's stamp
    let side = read_sidecar(&sidecar_path(cache.path(), "synth-qwen3")).unwrap();
    assert_eq!(side.sha256, entry.sha256);
    assert_eq!(side.stamp, FileStamp::of(&fs::metadata(&path).unwrap()));
    assert_eq!(
        cached(&entry.as_model_entry(), cache.path()),
        Some(path.clone())
    );

    // a cache hit: the same file, not written again (same stamp); through every entry point
    let (before, side_before) = (
        stamp(&path),
        fs::read(sidecar_path(cache.path(), "synth-qwen3")),
    );
    assert!(before.is_some());
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(
        fetch_synth_into(entry, cache.path(), &no_pip()).unwrap(),
        path
    );
    assert_eq!(
        resolve_model_in("synth-qwen3", &reg, cache.path(), &no_pip()).unwrap(),
        path
    );
    let mut done = Vec::new();
    fetch_ids(
        &reg,
        &["synth-qwen3".to_string()],
        Some(cache.path()),
        &no_pip(),
        &mut |p| done.push(p.to_path_buf()),
    )
    .unwrap();
    assert_eq!(done, std::slice::from_ref(&path));
    assert_eq!(
        stamp(&path),
        before,
        "a cache hit must not write the file again"
    );
    assert_eq!(
        fs::read(sidecar_path(cache.path(), "synth-qwen3")).ok(),
        side_before.ok()
    );

    // bytes changed in place (same size): rehashed, deleted and written again
    let mut bytes = fs::read(&path).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        fetch_synth_into(entry, cache.path(), &no_pip()).unwrap(),
        path
    );
    assert_eq!(crate::hash::sha256_file(&path).unwrap(), entry.sha256);
    let side = read_sidecar(&sidecar_path(cache.path(), "synth-qwen3")).unwrap();
    assert_eq!(
        (side.sha256.as_str(), side.stamp),
        (entry.sha256.as_str(), stamp(&path))
    );
}

#[test]
fn fetch_synth_with_a_wrong_registered_sha256_names_both_hashes_and_leaves_nothing() {
    let reg = Registry::active().unwrap();
    let good = reg.synth("synth-llama").unwrap();
    let mut bad = good.clone();
    bad.sha256 = "0".repeat(64);
    let cache = tempfile::tempdir().unwrap();
    let e = format!(
        "{:#}",
        fetch_synth_into(&bad, cache.path(), &no_pip()).unwrap_err()
    );
    let path = model_path(cache.path(), "synth-llama");
    assert!(
        e.contains("`synth-llama`")
            && e.contains(&path.display().to_string())
            && e.contains(&"0".repeat(64))
            && e.contains(&good.sha256)
            && e.contains("Nothing was written"),
        "{e}"
    );
    assert_eq!(models_listing(cache.path()), Vec::<String>::new());
    // a wrong size alone is refused too
    let mut bad = good.clone();
    bad.size += 1;
    let e = format!(
        "{:#}",
        fetch_synth_into(&bad, cache.path(), &no_pip()).unwrap_err()
    );
    assert!(e.contains(&format!("{} bytes", good.size)), "{e}");
    assert_eq!(models_listing(cache.path()), Vec::<String>::new());
    // an arch lockstep cannot write is refused by the entry's check, before anything is made
    let mut mamba = good.clone();
    mamba.arch = "mamba".into();
    let e = format!(
        "{:#}",
        fetch_synth_into(&mamba, cache.path(), &no_pip()).unwrap_err()
    );
    assert!(e.contains("mamba") && e.contains("qwen3"), "{e}");
}

#[test]
fn fetch_synth_variants_are_made_from_the_written_source_and_verified() {
    let reg = Registry::active().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let q8 = reg.variant("synth-llama-q8_0").unwrap();
    let paths = fetch_variants_in(&[q8], &reg, cache.path(), &no_pip()).unwrap();
    assert_eq!(paths, [variant_path(cache.path(), q8)]);
    assert_eq!(crate::hash::sha256_file(&paths[0]).unwrap(), q8.sha256);
    assert!(paths[0]
        .with_file_name(format!("{}.sha256", q8.file_name()))
        .is_file());
    // its source was written (and verified) into the model cache on the way
    let src = model_path(cache.path(), "synth-llama");
    assert_eq!(
        crate::hash::sha256_file(&src).unwrap(),
        reg.synth("synth-llama").unwrap().sha256
    );
    // `lockstep fetch synth-qwen3 synth-qwen3-q4_k`: both, in the order given
    let mut done = Vec::new();
    let ids = ["synth-qwen3".to_string(), "synth-qwen3-q4_k".to_string()];
    fetch_ids(&reg, &ids, Some(cache.path()), &no_pip(), &mut |p| {
        done.push(p.to_path_buf())
    })
    .unwrap();
    assert_eq!(done.len(), 2);
    assert_eq!(done[0], model_path(cache.path(), "synth-qwen3"));
    for (id, p) in ids.iter().zip(&done) {
        assert_eq!(
            crate::hash::sha256_file(p).unwrap(),
            reg.sha256(id).unwrap(),
            "{id}"
        );
    }
    // a variant through resolve_model_in (cached now)
    assert_eq!(
        resolve_model_in("synth-qwen3-q4_k", &reg, cache.path(), &no_pip()).unwrap(),
        done[1]
    );
}

#[test]
fn hf_copies_are_exported_from_their_source_checked_by_digest_and_remade_when_changed() {
    let reg = Registry::active().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let v = reg.variant("synth-gpt2-hf").unwrap();
    // made in process: this machine's export reproduces the registered digest
    let p = resolve_model_in(&v.id, &reg, cache.path(), &no_pip()).unwrap();
    assert_eq!(p, variant_path(cache.path(), v));
    assert!(p.is_dir() && p.ends_with("variants/synth-gpt2/synth-gpt2-hf"));
    assert_eq!(crate::hash::sha256_hf_dir(&p).unwrap(), v.sha256);
    let loaded = lockstep_engine::Model::load(&p).unwrap();
    assert_eq!(loaded.info().arch, "gpt2");
    // a changed file: the copy is deleted and made again
    let st = p.join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(&st, &bytes).unwrap();
    let again = resolve_model_in(&v.id, &reg, cache.path(), &no_pip()).unwrap();
    assert_eq!(crate::hash::sha256_hf_dir(&again).unwrap(), v.sha256);
    // a registry digest no export gives: an error naming both, and no directory left behind
    let mut wrong = v.clone();
    wrong.sha256 = "0".repeat(64);
    std::fs::remove_dir_all(&again).unwrap();
    let e = format!(
        "{:#}",
        fetch_variants_in(&[&wrong], &reg, cache.path(), &no_pip()).unwrap_err()
    );
    assert!(e.contains(&v.sha256) && e.contains(&wrong.sha256), "{e}");
    let left: Vec<_> = std::fs::read_dir(p.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
