//! Hostile and runaway input through the `lockstep` binary and the external-engine seam: each must end in
//! a clear error naming the file or argument and the fault, exit status 2, no panic, nothing half-written.
//! Synthetic models only (no download), so these run in every `cargo test`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lockstep::capture::NullSink;
use lockstep::engine::{Engine, ExternalCommands, ExternalEngine};
use lockstep_engine::synth::SynthModel;
use lockstep_engine::GgmlTarget;
use lockstep_engine::NumericsMode;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lockstep"))
}

/// A synthetic model file (context 256) in `dir`.
fn tiny(dir: &Path, name: &str, t: SynthModel) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, t.build().unwrap()).unwrap();
    p
}

/// Run the binary; returns (exit code, stderr). Fails the test on a panic.
fn lockstep(args: &[&str]) -> (i32, String) {
    let out = Command::new(exe()).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "lockstep {args:?} panicked:\n{stderr}"
    );
    (out.status.code().unwrap_or(-1), stderr)
}

fn expect_error(args: &[&str], needles: &[&str]) {
    let (code, stderr) = lockstep(args);
    assert_eq!(code, 2, "lockstep {args:?}: exit {code}\n{stderr}");
    for n in needles {
        assert!(
            stderr.contains(n),
            "lockstep {args:?}: no {n:?} in\n{stderr}"
        );
    }
}

#[test]
fn threads_beyond_the_machine_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), "m.gguf", SynthModel::default());
    let m = m.to_str().unwrap();
    expect_error(
        &[
            "--threads",
            "100000",
            "tokenize",
            "--model",
            m,
            "--prompt",
            "hi",
        ],
        &["--threads 100000", "cores"],
    );
    // 0 means every core
    let (code, stderr) = lockstep(&["--threads", "0", "tokenize", "--model", m, "--prompt", "hi"]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn an_oversized_prompt_file_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), "m.gguf", SynthModel::default());
    let big = dir.path().join("big.txt");
    std::fs::write(&big, vec![b'a'; (1 << 20) + 1]).unwrap();
    expect_error(
        &[
            "tokenize",
            "--model",
            m.to_str().unwrap(),
            "--prompt-file",
            big.to_str().unwrap(),
        ],
        &["big.txt", "larger than 1048576 bytes"],
    );
}

#[test]
fn an_empty_prompt_and_an_over_long_sequence_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), "m.gguf", SynthModel::default());
    let m = m.to_str().unwrap();
    let out = dir.path().join("d.npz");
    let out = out.to_str().unwrap();
    expect_error(
        &["dump", "--model", m, "--prompt", "", "--out", out],
        &["the prompt is empty"],
    );
    // 20k positions against a context of 256: refused at once, not run for minutes
    let ids = vec!["7"; 20_000].join(",");
    let t0 = Instant::now();
    expect_error(
        &["dump", "--model", m, "--tokens", &ids, "--out", out],
        &["20000 positions", "context of 256"],
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    let long = "hello ".repeat(400);
    expect_error(
        &["generate", "--model", m, "--prompt", &long, "-n", "4"],
        &["longer than the model's context of 256"],
    );
    assert!(!Path::new(out).exists(), "no dump may be written");
}

#[test]
fn a_model_that_computes_nan_fails_naming_the_first_non_finite_stage() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(
        dir.path(),
        "nan.gguf",
        SynthModel {
            norm_eps: f32::NAN,
            ..SynthModel::default()
        },
    );
    let m = m.to_str().unwrap();
    let out = dir.path().join("d.npz");
    for mode in ["reference", "ggml"] {
        expect_error(
            &[
                "dump",
                "--model",
                m,
                "--tokens",
                "5,6,7",
                "--mode",
                mode,
                "--out",
                out.to_str().unwrap(),
            ],
            &[
                "logits hold NaN",
                "first stage that went non-finite is `blk.0.attn_norm`",
            ],
        );
        assert!(!out.exists(), "no all-NaN dump may be written");
        expect_error(
            &[
                "generate",
                "--model",
                m,
                "--prompt",
                "hello",
                "-n",
                "4",
                "--mode",
                mode,
                "--temperature",
                "0",
            ],
            &["non-finite logits", "`blk.0.attn_norm`"],
        );
    }
}

/// An external engine whose every call starts a helper and hangs.
fn hanging_engine(dir: &Path, timeout: Duration) -> (ExternalEngine, PathBuf) {
    let (script, pids) = common::hanging_script(dir);
    let s = script.display();
    let cmds = ExternalCommands {
        forward: format!("{s} {{tokens}} {{out}}"),
        tokenize: format!("{s} {{prompt_file}}"),
        timeout,
    };
    (
        ExternalEngine::new(cmds, Path::new("/nonexistent/model.gguf"), "llama").unwrap(),
        pids,
    )
}

#[test]
fn a_hanging_external_engine_is_killed_with_its_helpers_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (mut e, pids) = hanging_engine(dir.path(), Duration::from_millis(800));
    let t0 = Instant::now();
    let err = format!("{:#}", e.tokenize("hi", true, false).unwrap_err());
    assert!(
        err.contains("did not finish within 0.8 s") && err.contains("hang.sh"),
        "{err}"
    );
    e.reset(NumericsMode::Reference, GgmlTarget::Avx2, 8)
        .unwrap();
    let err = format!("{:#}", e.forward(&[1, 2], &mut NullSink).unwrap_err());
    assert!(err.contains("(forward) did not finish"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(200));
    let left = common::still_running(&pids);
    assert!(left.is_empty(), "processes {left:?} outlived the timeout");
}

#[test]
fn hostile_dumps_from_an_external_engine_are_refused_naming_the_file() {
    use std::io::Write;
    let npz = |members: &[(&str, Vec<u8>)]| {
        let mut buf = std::io::Cursor::new(Vec::new());
        let mut z = zip::ZipWriter::new(&mut buf);
        let o = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (n, b) in members {
            z.start_file(*n, o).unwrap();
            z.write_all(b).unwrap();
        }
        z.finish().unwrap();
        buf.into_inner()
    };
    use lockstep::npz::{npy_bytes, Dtype};
    let tokens = npy_bytes(Dtype::I32, &[1], &7i32.to_le_bytes());
    let label = Path::new("engine-out.npz");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not a zip".to_vec(), "not a valid .npz"),
        (
            npz(&[("tokens.npy", tokens.clone())]),
            "no `logits` array (nor `pooled`",
        ),
        (
            // a zip bomb: 256 MiB of logits (~256 KiB compressed) against a 16 MiB bound
            npz(&[
                ("tokens.npy", tokens.clone()),
                (
                    "logits.npy",
                    npy_bytes(Dtype::F32, &[1, 1 << 26], &vec![0u8; 1 << 28]),
                ),
            ]),
            "refusing to decompress",
        ),
        (
            npz(&[
                (
                    "tokens.npy",
                    npy_bytes(Dtype::I32, &[1], &(-3i32).to_le_bytes()),
                ),
                ("logits.npy", npy_bytes(Dtype::F32, &[1, 1], &[0; 4])),
            ]),
            "negative token id -3",
        ),
        (
            npz(&[
                ("tokens.npy", tokens.clone()),
                ("logits.npy", npy_bytes(Dtype::F16, &[1, 2], &[0; 4])),
            ]),
            "float32 [T, D]",
        ),
        (
            npz(&[
                ("tokens.npy", tokens.clone()),
                ("logits.npy", npy_bytes(Dtype::F32, &[1, 2], &[0; 8])),
                ("blk.0.out.npy", npy_bytes(Dtype::F32, &[2, 2], &[0; 16])),
            ]),
            "stage `blk.0.out` has 2 rows",
        ),
        (
            // an encoder's dump (no logits): its `pooled` is the last position's one row
            npz(&[
                ("tokens.npy", npy_bytes(Dtype::I32, &[2], &[0; 8])),
                ("pooled.npy", npy_bytes(Dtype::F32, &[2, 2], &[0; 16])),
            ]),
            "an encoder's `pooled` is (2, 2), expected [1, D]",
        ),
    ];
    for (bytes, needle) in cases {
        let e = format!(
            "{:#}",
            lockstep::dump::read_bytes(bytes, label, 16 << 20).unwrap_err()
        );
        assert!(
            e.contains("engine-out.npz") && e.contains(needle),
            "{needle}: {e}"
        );
    }
    // a well-formed encoder dump reads: no logits, `pooled` [1, D], the other stages [T, D]
    let d = lockstep::dump::read_bytes(
        npz(&[
            ("tokens.npy", npy_bytes(Dtype::I32, &[2], &[0; 8])),
            ("pooled.npy", npy_bytes(Dtype::F32, &[1, 2], &[0; 8])),
            ("blk.0.out.npy", npy_bytes(Dtype::F32, &[2, 2], &[0; 16])),
        ]),
        label,
        16 << 20,
    )
    .unwrap();
    assert!(d.logits.is_none());
    assert_eq!(d.stages["pooled"].dim(), (1, 2));
}
