//! `lockstep floors` and the files it writes and reads (issue 29): the default paths come from the
//! checkout the command runs in (or `--root` / `$LOCKSTEP_ROOT`), never from the directory the binary was
//! built in; result targets that are not regular files are refused before any work and never replaced;
//! each golden is measured once per SIMD setting of the matrix that gives other results (reference mode: its
//! scalar order and its 16-lane SIMD order), never once per cell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use lockstep::floors::{kind_of, FloorSet, Floors};
use lockstep_engine::synth::SynthModel;

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// Run the binary in `cwd` with `env`, `LOCKSTEP_ROOT` removed unless given; (exit code, stderr).
fn lockstep_in(cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lockstep"));
    c.current_dir(cwd).env_remove("LOCKSTEP_ROOT").args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    (out.status.code().unwrap_or(-1), stderr)
}

fn sha(p: &Path) -> String {
    lockstep::hash::sha256_file(p).unwrap()
}

#[test]
fn outside_a_checkout_a_needed_default_is_an_error_not_the_build_checkout() {
    let dir = tempfile::tempdir().unwrap();
    let committed = checkout().join("ci/floors.json");
    let before = sha(&committed);
    // `--model` names no model: had the defaults come from the build checkout, the matrix would have
    // loaded and the error would name the filter instead
    for args in [
        &["floors", "--model", "no-such-model"][..],
        &["bisect", "--model", "no-such-model", "--prompt", "p"],
        &["run", "--model", "no-such-model"],
    ] {
        let (code, stderr) = lockstep_in(dir.path(), &[], args);
        assert_eq!(code, 2, "{args:?}\n{stderr}");
        assert!(
            stderr.contains("no lockstep checkout at or above the working directory")
                && stderr.contains("LOCKSTEP_ROOT")
                && !stderr.contains("matches nothing"),
            "{args:?}\n{stderr}"
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    assert_eq!(
        sha(&committed),
        before,
        "the build checkout's floors were rewritten"
    );

    // the same commands with the root named: the defaults resolve, said on one line, and the command gets
    // as far as the unknown model
    let root = checkout();
    type Env<'a> = &'a [(&'a str, &'a Path)];
    let named: [(Env, Vec<&str>); 2] = [
        (&[("LOCKSTEP_ROOT", &root)], vec![]),
        (&[], vec!["--root", root.to_str().unwrap()]),
    ];
    for (env, flag) in named {
        let mut args = vec!["floors", "--model", "no-such-model"];
        args.extend(&flag);
        let (code, stderr) = lockstep_in(dir.path(), env, &args);
        assert_eq!(code, 2, "{stderr}");
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("lockstep: default paths from the checkout"))
            .collect();
        assert_eq!(said.len(), 1, "{stderr}");
        assert!(said[0].contains(root.to_str().unwrap()), "{stderr}");
        assert!(
            stderr.contains("no-such-model") && stderr.contains("matches nothing"),
            "{stderr}"
        );
    }
    // a named root that is no checkout
    let (code, stderr) = lockstep_in(
        dir.path(),
        &[("LOCKSTEP_ROOT", dir.path())],
        &["floors", "--model", "x"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("$LOCKSTEP_ROOT") && stderr.contains("not a lockstep checkout"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn the_root_is_the_nearest_checkout_at_or_above_the_working_directory() {
    use lockstep::cli::find_checkout_root;
    let dir = tempfile::tempdir().unwrap();
    let co = dir.path().join("co");
    std::fs::create_dir_all(co.join("ci")).unwrap();
    std::fs::create_dir_all(co.join("a/b")).unwrap();
    std::fs::write(co.join("models.toml"), "").unwrap();
    let (r, from) = find_checkout_root(None, None, &co.join("a/b")).unwrap();
    assert_eq!(
        (r, from),
        (co.clone(), "found at or above the working directory")
    );
    assert!(find_checkout_root(None, None, dir.path()).is_err());
    // the flag wins over the variable, which wins over the working directory
    let (r, _) = find_checkout_root(
        Some(Path::new("co")),
        Some(dir.path().as_os_str()),
        dir.path(),
    )
    .unwrap();
    assert_eq!(r, co);
    let e = find_checkout_root(None, Some(dir.path().as_os_str()), &co).unwrap_err();
    assert!(
        format!("{e:#}").contains("not a lockstep checkout"),
        "{e:#}"
    );
    let e = find_checkout_root(None, Some("".as_ref()), &co).unwrap_err();
    assert!(format!("{e:#}").contains("empty"), "{e:#}");
    // ci/ must be a directory, models.toml a file
    std::fs::remove_dir(co.join("ci")).unwrap();
    std::fs::write(co.join("ci"), "").unwrap();
    assert!(find_checkout_root(None, None, &co).is_err());
}

/// (fifo, symlink to a regular file, that file) in `dir`.
fn hostile_targets(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let real = dir.join("real.json");
    std::fs::write(&real, "keep").unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    (fifo, link, real)
}

fn assert_untouched(fifo: &Path, link: &Path, real: &Path) {
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(std::fs::symlink_metadata(link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(real).unwrap(), "keep");
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn result_targets_that_are_not_regular_files_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let (fifo, link, real) = hostile_targets(dir.path());
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, SynthModel::default().build().unwrap()).unwrap();
    let m = model.to_str().unwrap();
    let cwd = checkout();
    for out in [&fifo, &link, Path::new("/dev/null"), dir.path()] {
        let o = out.to_str().unwrap();
        // `--model no-such-model`: without the check first, the error would be about the model
        for (args, flag) in [
            (
                vec!["floors", "--model", "no-such-model", "--out", o],
                "--out",
            ),
            (
                vec![
                    "bisect",
                    "--model",
                    "no-such-model",
                    "--prompt",
                    "p",
                    "--json",
                    o,
                ],
                "--json",
            ),
            (
                vec!["dump", "--model", m, "--tokens", "1,2", "--out", o],
                "--out",
            ),
            (
                vec!["quantize", "--model", m, "--type", "Q8_0", "--out", o],
                "--out",
            ),
        ] {
            let (code, stderr) = lockstep_in(&cwd, &[], &args);
            assert_eq!(code, 2, "{args:?}\n{stderr}");
            assert!(
                stderr.contains(&format!("{flag} {o}"))
                    && (stderr.contains("not a regular file")
                        || stderr.contains("symbolic link")
                        || stderr.contains("is a directory")),
                "{args:?}\n{stderr}"
            );
            assert_untouched(&fifo, &link, &real);
        }
    }
    // the same commands with a regular target work and replace it whole
    let out = dir.path().join("d.npz");
    std::fs::write(&out, "old").unwrap();
    let (code, stderr) = lockstep_in(
        &cwd,
        &[],
        &[
            "dump",
            "--model",
            m,
            "--tokens",
            "1,2",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(lockstep::dump::read(&out).is_ok());
}

/// Rows of each stage kind a golden stores (prefill and decode), from the manifest's array shapes, where
/// the golden has a local pass to measure (it stores a layer output to inject); none elsewhere.
fn stored_rows(manifest: &lockstep::golden::Manifest, golden: &str) -> BTreeMap<String, usize> {
    let g = manifest
        .goldens
        .iter()
        .find(|g| g.path == golden)
        .unwrap_or_else(|| panic!("{golden} is not in the manifest"));
    let mut rows = BTreeMap::new();
    if !g.stores_layer_outputs() {
        return rows;
    }
    for (name, spec) in g
        .arrays
        .iter()
        .filter(|(n, _)| !n.contains("logits") && *n != "tokens")
    {
        let stage = name.strip_prefix("decode.").unwrap_or(name);
        *rows.entry(kind_of(stage).to_string()).or_insert(0) += spec.shape[0];
    }
    rows
}

/// How many times `lockstep floors` measures each golden of a set with the default matrix on this CPU: once per
/// SIMD setting of the set's default-tier cells whose results differ in its mode
/// (`lockstep::measure::simd_settings_of`; the matrix's `auto` resolved here, as where the committed file was
/// measured: an AVX2 or AVX-512 host). Reference mode: its scalar and its SIMD order; ggml mode: one.
///
/// A model of the porter's matrix (ci/matrix-porter.toml: HF checkpoints our engine cannot load) is measured
/// through its external engine (`lockstep floors --engine-serve`), on the `simd = off` cells only: once.
fn settings_measured(root: &Path, manifest: &lockstep::golden::Manifest, s: &FloorSet) -> usize {
    let default = lockstep::matrix::Matrix::load(&root.join("ci/matrix.toml")).unwrap();
    let porter = !default.models.iter().any(|m| m.id == s.model);
    let matrix = if porter {
        lockstep::matrix::Matrix::load(&root.join("ci/matrix-porter.toml")).unwrap()
    } else {
        default
    };
    let filters = lockstep::matrix::Filters {
        model: vec![s.model.clone()],
        oracle: vec![s.oracle.clone()],
        mode: vec![s.mode.clone()],
        simd: if porter { vec!["off".into()] } else { vec![] },
        ..Default::default()
    };
    let cells = matrix.expand(manifest, &filters).unwrap();
    lockstep::measure::simd_settings_of(&cells).unwrap().len()
}

#[test]
fn the_committed_floors_count_each_stored_row_once_per_simd_order() {
    let root = checkout();
    let manifest = lockstep::golden::load_manifest(&root.join("golden")).unwrap();
    let floors = Floors::load(&root.join("ci/floors.json")).unwrap_or_else(|e| panic!("{e:#}"));
    for s in &floors.sets {
        let times = settings_measured(&root, &manifest, s);
        let mut want: BTreeMap<String, usize> = BTreeMap::new();
        for g in s.goldens.keys() {
            for (k, n) in stored_rows(&manifest, g) {
                *want.entry(k).or_insert(0) += n * times;
            }
        }
        for (k, f) in &s.kinds {
            assert_eq!(
                Some(&f.rows),
                want.get(k),
                "{}/{}/{} kind {k}: rows measured vs stored in its goldens",
                s.model,
                s.oracle,
                s.mode
            );
        }
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh (makes SmolLM2's Q8_0 variant on first use)"]
fn floors_run_from_anywhere_with_the_root_named_and_measure_each_golden_once_per_simd_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = checkout();
    let out = dir.path().join("floors.json");
    let model = "smollm2-135m-q4_1-q8_0";
    let (code, stderr) = lockstep_in(
        dir.path(),
        &[("LOCKSTEP_ROOT", &root)],
        &["floors", "--model", model, "--out", out.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    let f = Floors::load(&out).unwrap();
    let s = f.sets.iter().find(|s| s.model == model).unwrap();
    // the default matrix runs reference mode at three SIMD settings (off, avx2, auto) that give two
    // orders: the golden counts once per order, not once per cell
    let manifest = lockstep::golden::load_manifest(&root.join("golden")).unwrap();
    let (g, _) = s.goldens.iter().next().unwrap();
    let stored = stored_rows(&manifest, g);
    let times = settings_measured(&root, &manifest, s);
    assert!(!s.kinds.is_empty());
    for (k, kf) in &s.kinds {
        assert_eq!(Some(kf.rows), stored.get(k).map(|n| n * times), "kind {k}");
    }
    // and it is what ci/floors.json holds for that model
    let committed = Floors::load(&root.join("ci/floors.json")).unwrap();
    let c = committed.sets.iter().find(|c| c.model == model).unwrap();
    assert_eq!(
        c, s,
        "ci/floors.json is stale for {model}: rerun `lockstep floors`"
    );
}
