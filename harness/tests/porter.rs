//! The porter's path (issue 43): two architectures lockstep's engine does not implement — OLMo 2 (norms
//! after attention and the FFN, no pre-norms, Q/K norm over the whole projection) and Granite (embedding,
//! residual, attention and logit multipliers) — as tiny seeded HF checkpoints (models.toml
//! `[[checkpoints]]`), their transformers goldens (golden/porter-*/transformers-f32, the HF route of the
//! transformers oracle), and an engine written as a porter writes it (numpy, reading safetensors:
//! oracles/lockstep_session/numpy_olmo2.py, numpy_granite.py) held to them through the session protocol
//! (version 2, `format` "hf"), prefill and decode through its own KV cache. The harness never loads these
//! models itself: the tokens come from the checkpoint's tokenizer.json, the vocabulary size from the
//! engine's `load` answer.
//!
//! Per architecture: the clean engine passes every cell of ci/matrix-porter.toml, and each planted bug
//! (`--bug`) is localized by `lockstep bisect` to its layer, stage kind and phase. Also the protocol
//! versions: a version-1 engine keeps working on a GGUF model and is refused, with a clear error, on an HF
//! checkpoint; an engine whose `load` reads GGUF only fails an HF cell as `engine_error`.
//!
//! The engines need Python 3 with numpy only (no torch): `#[ignore]`d, run by ci/test.sh, which makes numpy
//! importable (or set LOCKSTEP_PYTHON).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{python_with_numpy, root};
use lockstep::bisect::{bisect_serve, BisectOptions};
use lockstep::compare::Phase;
use lockstep::judge::Finding;
use lockstep::matrix::Filters;
use lockstep::protocol::client::ServeCommand;
use lockstep::run::{run, RunOptions};
use lockstep_engine::{NumericsMode, Simd};

fn serve(command: String) -> ServeCommand {
    ServeCommand {
        command,
        timeout: Duration::from_secs(300),
        stage_map: None,
        stage_map_file: None,
    }
}

/// The numpy engine of `arch` (`olmo2`, `granite`), with a planted bug if any.
fn numpy_engine(arch: &str, bug: Option<&str>) -> ServeCommand {
    let script = root().join(format!("oracles/lockstep_session/numpy_{arch}.py"));
    let bug = bug.map_or(String::new(), |b| format!(" --bug {b}"));
    serve(format!("{} {}{bug}", python_with_numpy(), script.display()))
}

fn options(reports: &Path, matrix: &str, model: &str, serve: ServeCommand) -> RunOptions {
    RunOptions {
        golden_dir: root().join("golden"),
        matrix: root().join(matrix),
        thresholds: root().join("ci/thresholds.toml"),
        reports_root: reports.to_path_buf(),
        filters: Filters {
            model: vec![model.into()],
            mode: vec!["reference".into()],
            simd: vec!["off".into()],
            ..Filters::default()
        },
        external: None,
        force_external: false,
        serve: Some(serve),
        progress: false,
        threads: 1,
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        shard: None,
        select: Default::default(),
    }
}

/// The clean engine of `arch` passes every cell of its model in ci/matrix-porter.toml, prefill and decode
/// compared, the tokens lockstep's (the checkpoint's tokenizer.json) and the logits' width the engine's.
fn clean_engine_passes_every_cell(arch: &str) {
    let model = format!("porter-{arch}");
    let reports = tempfile::tempdir().unwrap();
    let opts = options(
        reports.path(),
        "ci/matrix-porter.toml",
        &model,
        numpy_engine(arch, None),
    );
    let (_, report) = run(&opts).unwrap();
    let prompts: Vec<&str> = report
        .cells
        .iter()
        .map(|c| c.cell.prompt.as_str())
        .collect();
    assert_eq!(prompts, ["code", "one_token", "prose"], "{prompts:?}");
    for c in &report.cells {
        assert_eq!(c.cell.engine, format!("numpy-{arch}@1"));
        assert!(c.verdict.pass, "{}: {:?}", c.cell.id(), c.verdict);
        assert!(
            matches!(
                c.finding,
                Some(Finding::None) | Some(Finding::AccumulatedDrift { .. })
            ),
            "{}: {:?}",
            c.cell.id(),
            c.finding
        );
        let compared: Vec<String> = c
            .comparison
            .stages
            .iter()
            .map(|s| format!("{} {}", s.phase, s.stage))
            .collect();
        // every stage the golden stores is compared: the architecture's own kinds in prefill, the residual
        // stream through the engine's KV cache in decode
        let own: &[&str] = match arch {
            "olmo2" => &[
                "prefill blk.0.k_norm",
                "prefill blk.1.q_norm",
                "prefill blk.1.attn_post_norm",
                "prefill blk.1.ffn_post_norm",
            ],
            _ => &[
                "prefill embed",
                "prefill blk.1.attn_norm",
                "prefill blk.1.ffn_inp",
                "prefill blk.1.ffn_norm",
            ],
        };
        for s in own.iter().chain(&[
            "prefill blk.1.q_rope",
            "decode blk.1.out",
            "decode output_norm",
        ]) {
            assert!(compared.iter().any(|x| x == s), "{s} in {compared:?}");
        }
        assert!(
            c.comparison
                .not_compared
                .iter()
                .any(|n| n.stage == "tokens"
                    && n.reason == lockstep::compare::TOKENS_NOT_FROM_ENGINE),
            "{:?}",
            c.comparison.not_compared
        );
        assert_eq!(c.comparison.golden_tokens, c.comparison.engine_tokens);
        // 6 teacher-forced decode steps, each one token through the engine's cache
        assert_eq!(c.speed.decode_tokens, 6);
    }
}

/// `lockstep bisect` through the numpy engine of `arch` with `bug` planted, on the prose golden: the
/// structural finding at `stage` in `phase`.
fn bug_is_localized(arch: &str, bug: &str, stage: &str, phase: Phase) {
    let opts = BisectOptions {
        golden_dir: root().join("golden"),
        thresholds: root().join("ci/thresholds.toml"),
        model: format!("porter-{arch}"),
        prompt: "prose".into(),
        mode: NumericsMode::Reference,
        oracle: "transformers-f32".into(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        simd: Simd::Off,
    };
    let r = bisect_serve(&opts, numpy_engine(arch, Some(bug))).unwrap();
    assert!(!r.gate.pass, "{bug}: {:?}", r.gate);
    match &r.finding {
        Finding::Structural { at, .. } => {
            assert_eq!(
                (at.stage.as_str(), at.phase),
                (stage, phase),
                "{bug}: {:?}",
                r.finding
            );
        }
        f => panic!("{bug}: expected a structural finding at {stage} ({phase}), got {f:?}"),
    }
}

#[test]
#[ignore = "needs Python 3 with numpy: run by ci/test.sh"]
fn olmo2_numpy_engine_passes_and_its_planted_bugs_are_localized() {
    clean_engine_passes_every_cell("olmo2");
    // Q/K norm over each head instead of the whole projection: layer 0's k_norm, in the prefill
    bug_is_localized("olmo2", "k-norm-per-head", "blk.0.k_norm", Phase::Prefill);
    // layer 1 normalizes residual + FFN output instead of the FFN output alone
    bug_is_localized(
        "olmo2",
        "post-norm-residual-l1",
        "blk.1.ffn_post_norm",
        Phase::Prefill,
    );
}

#[test]
#[ignore = "needs Python 3 with numpy: run by ci/test.sh"]
fn granite_numpy_engine_passes_and_its_planted_bugs_are_localized() {
    clean_engine_passes_every_cell("granite");
    // Llama's 1/sqrt(head_dim) in place of attention_multiplier: layer 0's attention output
    bug_is_localized(
        "granite",
        "attention-scale",
        "blk.0.attn_out",
        Phase::Prefill,
    );
    // layer 1's FFN residual without residual_multiplier in decode steps only: prefill clean
    bug_is_localized(
        "granite",
        "residual-multiplier-decode",
        "blk.1.out",
        Phase::Decode,
    );
}

/// A session engine of protocol version 1: `inner` behind a relay that answers `load` with `"protocol": 1`
/// (an engine written before version 2, which ignores `format`), everything else passed through.
fn version_1_engine(dir: &Path, inner: &str) -> ServeCommand {
    let relay = dir.join("v1_relay.py");
    std::fs::write(
        &relay,
        "import json, subprocess, sys\n\
         child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)\n\
         for line in sys.stdin:\n\
         \x20   op = json.loads(line).get('op')\n\
         \x20   child.stdin.write(line); child.stdin.flush()\n\
         \x20   answer = json.loads(child.stdout.readline())\n\
         \x20   if op == 'load' and answer.get('ok'):\n\
         \x20       answer['protocol'] = 1\n\
         \x20   print(json.dumps(answer), flush=True)\n\
         \x20   if op == 'shutdown':\n\
         \x20       break\n",
    )
    .unwrap();
    serve(format!(
        "{} {} {inner}",
        python_with_numpy(),
        relay.display()
    ))
}

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lockstep"))
}

#[test]
#[ignore = "needs Python 3 with numpy: run by ci/test.sh"]
fn a_version_1_engine_runs_gguf_models_and_is_refused_an_hf_checkpoint() {
    let work = tempfile::tempdir().unwrap();
    // GGUF: `lockstep serve` answering as a version-1 engine runs the seeded Llama's reference cells
    let v1 = version_1_engine(
        work.path(),
        &format!("{} serve --simd off", exe().display()),
    );
    let reports = work.path().join("r1");
    let opts = options(&reports, "ci/matrix.toml", "synth-llama", v1);
    let (_, report) = run(&opts).unwrap();
    assert!(!report.cells.is_empty());
    for c in &report.cells {
        assert!(c.cell.engine.starts_with("lockstep@"), "{}", c.cell.engine);
        assert!(c.verdict.pass, "{}: {:?}", c.cell.id(), c.verdict);
    }
    // HF: the same answer for an HF checkpoint is refused before any step, naming the versions
    let v1 = version_1_engine(work.path(), &numpy_engine("olmo2", None).command);
    let reports = work.path().join("r2");
    let opts = options(&reports, "ci/matrix-porter.toml", "porter-olmo2", v1);
    let e = format!("{:#}", run(&opts).unwrap_err());
    assert!(
        e.contains("speaks protocol 1, which loads GGUF files only")
            && e.contains("porter-olmo2")
            && e.contains("protocol 2"),
        "{e}"
    );
}

#[test]
#[ignore = "needs Python 3 with numpy: run by ci/test.sh"]
fn a_gguf_only_python_engine_fails_an_hf_cell_as_engine_error() {
    // example_engine.py's `load` takes no `format`: the helper answers an "hf" load `unsupported`, so the
    // cell fails as engine_error and the run goes on
    let example = root().join("oracles/lockstep_session/example_engine.py");
    let reports = tempfile::tempdir().unwrap();
    let opts = options(
        reports.path(),
        "ci/matrix-porter.toml",
        "porter-granite",
        serve(format!("{} {}", python_with_numpy(), example.display())),
    );
    let (_, report) = run(&opts).unwrap();
    assert_eq!(report.cells.len(), 3);
    for c in &report.cells {
        assert!(!c.verdict.pass);
        let e = c.error.as_deref().unwrap_or_default();
        assert!(e.contains("reads GGUF files only"), "{e}");
    }
}

#[test]
fn every_checkpoint_has_bisectable_transformers_goldens_of_its_directory() {
    // models.toml [[checkpoints]] <-> golden/manifest.json: each checkpoint resolves (its digest checked), and
    // its goldens name it by that digest and its arch, store every layer's output at every prompt position
    // (bisect's local pass injects them) and teacher-forced decode steps (the engine's KV cache is walked)
    let reg = lockstep::registry::Registry::active().unwrap();
    let manifest = lockstep::golden::load_manifest(&root().join("golden")).unwrap();
    assert!(reg.checkpoints.len() >= 2);
    for c in &reg.checkpoints {
        let dir = c.dir().unwrap();
        assert_eq!(lockstep::hash::sha256_model(&dir).unwrap(), c.sha256);
        if lockstep_engine::models::SPEECH_ARCHITECTURES
            .iter()
            .any(|(a, _)| *a == c.arch)
        {
            // a speech checkpoint's goldens are audio, in golden/<id>/ with a manifest of their own that
            // names this checkpoint (harness/tests/whisper.rs reads each after checking its sha256)
            let m: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(root().join("golden").join(&c.id).join("manifest.json"))
                    .unwrap_or_else(|e| panic!("{}: golden/{}/manifest.json: {e}", c.id, c.id)),
            )
            .unwrap();
            assert_eq!(m["checkpoint"], c.path.as_str(), "{}", c.id);
            assert!(
                m["files"]
                    .as_object()
                    .is_some_and(|f| f.keys().any(|k| k.ends_with(".npz"))),
                "{}: {m}",
                c.id
            );
            continue;
        }
        let goldens: Vec<_> = manifest.goldens_for_model(&c.id).collect();
        assert_eq!(goldens.len(), 3, "{}: prose, code, one_token", c.id);
        for g in goldens {
            assert_eq!(g.model_sha256, c.sha256, "{}", g.path);
            assert_eq!(g.arch, c.arch, "{}", g.path);
            assert_eq!(g.oracle.name, "transformers", "{}", g.path);
            assert!(g.stores_layer_outputs() && !g.is_compact(), "{}", g.path);
            assert_eq!(g.n_decode_steps, 6, "{}", g.path);
            lockstep::golden::verify_golden(&root().join("golden"), g)
                .unwrap_or_else(|e| panic!("{e:#}"));
        }
    }
}

#[test]
#[ignore = "needs Python 3 with numpy: run by ci/test.sh"]
fn read_safetensors_reads_shards_and_f32_f16_bf16_exactly() {
    // a two-shard checkpoint written by the safetensors crate, read back by the Python helper
    use safetensors::tensor::{Dtype, TensorView};
    let dir = tempfile::tempdir().unwrap();
    let vals: Vec<f32> = vec![1.0, -2.5, 0.15625, 3.0e-3, 65504.0, -0.0];
    let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16b: Vec<u8> = vals
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect();
    let bf16b: Vec<u8> = vals
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
        .collect();
    let write = |name: &str, tensors: Vec<(&str, TensorView<'_>)>| {
        safetensors::serialize_to_file(tensors, &None, &dir.path().join(name)).unwrap();
    };
    write(
        "model-00001-of-00002.safetensors",
        vec![(
            "a.f32",
            TensorView::new(Dtype::F32, vec![2, 3], &f32b).unwrap(),
        )],
    );
    write(
        "model-00002-of-00002.safetensors",
        vec![
            (
                "b.f16",
                TensorView::new(Dtype::F16, vec![3, 2], &f16b).unwrap(),
            ),
            (
                "c.bf16",
                TensorView::new(Dtype::BF16, vec![6], &bf16b).unwrap(),
            ),
        ],
    );
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"metadata":{},"weight_map":{"a.f32":"model-00001-of-00002.safetensors","b.f16":"model-00002-of-00002.safetensors","c.bf16":"model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let script = "import sys, json; sys.path.insert(0, sys.argv[1]); from lockstep_session import read_safetensors\n\
                  w = read_safetensors(sys.argv[2])\n\
                  print(json.dumps({k: [str(v.dtype), list(v.shape), [float(x) for x in v.reshape(-1)]] for k, v in sorted(w.items())}))";
    let out = std::process::Command::new(python_with_numpy())
        .args(["-c", script])
        .arg(root().join("oracles/lockstep_session"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let widened = |b: &[u8], f: fn([u8; 2]) -> f32| -> Vec<f64> {
        b.chunks(2).map(|c| f([c[0], c[1]]) as f64).collect()
    };
    let want = serde_json::json!({
        "a.f32": ["float32", [2, 3], vals.iter().map(|&v| v as f64).collect::<Vec<_>>()],
        "b.f16": ["float32", [3, 2], widened(&f16b, |c| half::f16::from_le_bytes(c).to_f32())],
        "c.bf16": ["float32", [6], widened(&bf16b, |c| half::bf16::from_le_bytes(c).to_f32())],
    });
    assert_eq!(got, want);
}

#[test]
fn the_default_matrix_points_a_checkpoint_to_the_porter_matrix() {
    let manifest = lockstep::golden::load_manifest(&root().join("golden")).unwrap();
    let matrix = lockstep::matrix::Matrix::load(&root().join("ci/matrix.toml")).unwrap();
    let filters = Filters {
        model: vec!["porter-olmo2".into()],
        ..Filters::default()
    };
    let e = format!("{:#}", matrix.expand(&manifest, &filters).unwrap_err());
    assert!(
        e.contains("matches nothing in the run matrix")
            && e.contains("--matrix ci/matrix-porter.toml --engine-serve"),
        "{e}"
    );
}
