//! `lockstep run` end to end on SmolLM2 against the committed goldens: failures that must be loud, a
//! broken engine that the gate must catch, and the external-engine path. Real model: `#[ignore]`d, run by
//! `ci/test.sh`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use lockstep::compare::CompareOptions;
use lockstep::engine::{Engine, EngineInfo, ExternalCommands, LockstepEngine};
use lockstep::golden::{load_manifest, Manifest};
use lockstep::matrix::{Cell, Filters};
use lockstep::run::{run, run_with, RunOptions};
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::hooks::StageSink;
use lockstep_engine::ops::GgmlTarget;
use lockstep_engine::{Model, NumericsMode, Stage};
use ndarray::Array2;

const MODEL: &str = "smollm2-135m-q4_1";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn options(golden_dir: &Path, reports: &Path, prompt: &str, mode: &str) -> RunOptions {
    RunOptions {
        golden_dir: golden_dir.to_path_buf(),
        matrix: root().join("ci/matrix.toml"),
        thresholds: root().join("ci/thresholds.toml"),
        reports_root: reports.to_path_buf(),
        filters: Filters {
            model: vec![MODEL.into()],
            prompt: vec![prompt.into()],
            mode: vec![mode.into()],
            ..Filters::default()
        },
        compare: CompareOptions::default(),
        external: None,
        force_external: false,
        progress: false,
        threads: rayon::current_num_threads(),
        ggml_target: None,
    }
}

/// A copy of golden/ in a temp dir, to corrupt.
fn golden_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = root().join("golden");
    for entry in walk(&src) {
        let rel = entry.strip_prefix(&src).unwrap();
        let dst = dir.path().join(rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &dst).unwrap();
    }
    dir
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn edit_manifest(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("manifest.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

fn entry_index(m: &Manifest, path: &str) -> usize {
    m.goldens.iter().position(|g| g.path == path).unwrap()
}

const ONE: &str = "smollm2-135m-q4_1/llama.cpp-f32kv/one_token.npz";

fn err_of(r: Result<(PathBuf, lockstep::report::Report)>) -> String {
    format!("{:#}", r.expect_err("the run must fail"))
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn missing_golden_fails_naming_the_file() {
    let g = golden_copy();
    std::fs::remove_file(g.path().join(ONE)).unwrap();
    let reports = tempfile::tempdir().unwrap();
    let e = err_of(run(&options(g.path(), reports.path(), "one_token", "ggml")));
    assert!(e.contains("one_token.npz") && e.contains("missing"), "{e}");
    assert_eq!(
        std::fs::read_dir(reports.path()).unwrap().count(),
        0,
        "no report may be written"
    );
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn golden_made_from_another_model_is_refused() {
    let g = golden_copy();
    let m = load_manifest(g.path()).unwrap();
    let i = entry_index(&m, ONE);
    edit_manifest(g.path(), |v| {
        v["goldens"][i]["model_sha256"] = "ab".repeat(32).into()
    });
    let reports = tempfile::tempdir().unwrap();
    let e = err_of(run(&options(g.path(), reports.path(), "one_token", "ggml")));
    assert!(
        e.contains("one_token.npz") && e.contains(&"ab".repeat(32)),
        "{e}"
    );
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn wrong_shaped_golden_array_fails_naming_file_and_shapes() {
    let g = golden_copy();
    let m = load_manifest(g.path()).unwrap();
    let i = entry_index(&m, ONE);
    edit_manifest(g.path(), |v| {
        v["goldens"][i]["arrays"]["blk.3.out"]["shape"] = serde_json::json!([1, 575])
    });
    let reports = tempfile::tempdir().unwrap();
    let e = err_of(run(&options(g.path(), reports.path(), "one_token", "ggml")));
    assert!(
        e.contains("one_token.npz") && e.contains("blk.3.out") && e.contains("575"),
        "{e}"
    );
}

/// Our engine, with a sink wrapper that corrupts one stage.
struct Corrupting {
    inner: LockstepEngine,
    target: Stage,
    value: f32,
}

struct CorruptSink<'a> {
    inner: &'a mut dyn StageSink,
    target: Stage,
    value: f32,
}

impl StageSink for CorruptSink<'_> {
    fn on_stage(
        &mut self,
        stage: Stage,
        positions: std::ops::Range<usize>,
        width: usize,
        data: &mut [f32],
    ) {
        if stage == self.target {
            data[width / 2] = self.value;
        }
        if self.inner.wants(stage) {
            self.inner.on_stage(stage, positions, width, data);
        }
    }
}

impl Engine for Corrupting {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn tokenize(&mut self, text: &str, a: bool, p: bool) -> Result<Vec<u32>> {
        self.inner.tokenize(text, a, p)
    }
    fn stages(&self) -> Vec<(String, usize)> {
        self.inner.stages()
    }
    fn reset(&mut self, mode: NumericsMode, target: GgmlTarget, n_ctx: usize) -> Result<()> {
        self.inner.reset(mode, target, n_ctx)
    }
    fn forward(&mut self, tokens: &[u32], sink: &mut dyn StageSink) -> Result<Array2<f32>> {
        let mut s = CorruptSink {
            inner: sink,
            target: self.target,
            value: self.value,
        };
        self.inner.forward(tokens, &mut s)
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn nan_in_an_engine_stage_fails_naming_the_stage() {
    let reports = tempfile::tempdir().unwrap();
    let opts = options(&root().join("golden"), reports.path(), "one_token", "ggml");
    let mut factory = |_: &Cell, model: &Path, _: &str| -> Result<Box<dyn Engine>> {
        Ok(Box::new(Corrupting {
            inner: LockstepEngine::load(model)?,
            target: Stage::parse("blk.7.ffn_up").unwrap(),
            value: f32::NAN,
        }))
    };
    let e = err_of(run_with(&opts, &mut factory));
    assert!(e.contains("blk.7.ffn_up") && e.contains("NaN"), "{e}");
    assert_eq!(
        std::fs::read_dir(reports.path()).unwrap().count(),
        0,
        "no report may be written"
    );
}

/// Patch `llama.attention.layer_norm_rms_epsilon` in a GGUF's bytes (key, then u32 type 6 = F32, then value).
fn with_eps(mut bytes: Vec<u8>, eps: f32) -> Vec<u8> {
    let key = b"llama.attention.layer_norm_rms_epsilon";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("eps key in the file")
        + key.len();
    assert_eq!(
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()),
        6,
        "eps is an F32 value"
    );
    bytes[at + 4..at + 8].copy_from_slice(&eps.to_le_bytes());
    bytes
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn wrong_rmsnorm_epsilon_fails_the_gate_and_names_the_first_divergent_stage() {
    let reports = tempfile::tempdir().unwrap();
    let opts = options(&root().join("golden"), reports.path(), "prose", "ggml");
    let mut factory = |_: &Cell, model: &Path, _: &str| -> Result<Box<dyn Engine>> {
        let bytes = with_eps(std::fs::read(model)?, 1e-2);
        let m = Model::from_gguf(GgufFile::from_bytes(bytes, "broken-eps.gguf")?)?;
        Ok(Box::new(LockstepEngine::from_model(m, model.to_path_buf())))
    };
    let (_dir, report) = run_with(&opts, &mut factory).expect("the run itself succeeds");
    let cell = &report.cells[0];
    assert!(!cell.verdict.pass, "a wrong epsilon must fail the gate");
    let first = cell
        .verdict
        .first_divergent
        .as_ref()
        .expect("a first divergent stage");
    assert_eq!(first.stage, "blk.0.attn_norm", "{first:?}");
    let lines = lockstep::gate::failure_lines(&report);
    assert!(
        lines.iter().any(|l| l.contains("blk.0.attn_norm")),
        "{lines:?}"
    );
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn external_engine_path_gives_the_same_verdicts() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_lockstep"));
    for mode in ["ggml", "reference"] {
        let reports = tempfile::tempdir().unwrap();
        let mut opts = options(&root().join("golden"), reports.path(), "one_token", mode);
        let (_, ours) = run(&opts).unwrap();
        opts.external = Some(ExternalCommands::lockstep_itself(&exe));
        opts.force_external = true;
        let (_, theirs) = run(&opts).unwrap();
        let (a, b) = (&ours.cells[0], &theirs.cells[0]);
        assert_eq!(a.verdict, b.verdict, "mode {mode}");
        assert_eq!(a.comparison.engine_tokens, b.comparison.engine_tokens);
        // Same engine, same numbers: every compared stage and the logits agree exactly.
        assert_eq!(a.comparison.stages.len(), b.comparison.stages.len());
        for (x, y) in a.comparison.stages.iter().zip(&b.comparison.stages) {
            assert_eq!(
                (x.stage.as_str(), x.phase, &x.cosine_by_position),
                (y.stage.as_str(), y.phase, &y.cosine_by_position)
            );
        }
        assert_eq!(a.comparison.logits, b.comparison.logits, "mode {mode}");
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn default_matrix_run_writes_a_complete_report() {
    let reports = tempfile::tempdir().unwrap();
    let mut opts = options(&root().join("golden"), reports.path(), "chat", "ggml");
    opts.filters = Filters {
        model: vec![MODEL.into()],
        prompt: vec!["chat".into()],
        ..Filters::default()
    };
    let (dir, report) = run(&opts).unwrap();
    for f in ["report.json", "report.md", "results.csv"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    assert_eq!(report.cells.len(), 2, "chat × {{reference, ggml}}");
    for c in &report.cells {
        assert!(
            c.comparison.tokens_match(),
            "{}: tokens differ",
            c.cell.id()
        );
        assert!(c.speed.prefill_tokens > 0 && c.speed.decode_tokens == 8);
    }
    let back = lockstep::report::read_report(&dir.join("report.json")).unwrap();
    assert_eq!(back.cells.len(), 2);
}

/// Every stage the golden stores in f32 is bit-identical and every full logits row gives KL = 0.
fn bit_exact(report: &lockstep::report::Report, manifest: &Manifest) -> Result<(), String> {
    for c in &report.cells {
        let g = &manifest.goldens[entry_index(manifest, &c.golden_path)];
        for s in &c.comparison.stages {
            let key = match s.phase {
                lockstep::compare::Phase::Prefill => s.stage.clone(),
                lockstep::compare::Phase::Decode => format!("decode.{}", s.stage),
            };
            let f32_stored = g
                .arrays
                .get(&key)
                .is_some_and(|a| a.dtype == lockstep::golden::Dtype::F32);
            if f32_stored && !s.bit_exact {
                return Err(format!("{}: {key} differs", c.cell.id()));
            }
        }
        for l in &c.comparison.logits {
            if let Some(kl) = &l.kl {
                if kl.max != 0.0 {
                    return Err(format!("{}: {:?} KL max {}", c.cell.id(), l.phase, kl.max));
                }
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "real models: run by ci/test.sh"]
fn ggml_mode_is_bit_exact_on_goldens_of_either_cpu_with_their_own_target_only() {
    // SmolLM2's goldens come from an AVX-512 host, Gemma 3's and Qwen2.5's from an AVX2 host
    // (oracle.host_cpu_flags)
    let manifest = load_manifest(&root().join("golden")).unwrap();
    for (model, prompt, own) in [
        (MODEL, "prose", GgmlTarget::Avx512),
        ("gemma3-270m-q4_k_m", "prose", GgmlTarget::Avx2),
        ("qwen2.5-coder-0.5b-q4_k_m", "prose", GgmlTarget::Avx2),
    ] {
        let reports = tempfile::tempdir().unwrap();
        let mut opts = options(&root().join("golden"), reports.path(), prompt, "ggml");
        opts.filters.model = vec![model.into()];
        let (_, r) = run(&opts).unwrap();
        assert_eq!(
            r.cells[0].ggml_target.as_deref(),
            Some(own.name()),
            "{model}"
        );
        bit_exact(&r, &manifest).unwrap_or_else(|e| panic!("own target {own}: {e}"));
        let other = GgmlTarget::ALL.into_iter().find(|t| *t != own).unwrap();
        opts.ggml_target = Some(other);
        let (_, r) = run(&opts).unwrap();
        assert!(
            bit_exact(&r, &manifest).is_err(),
            "{model}/{prompt}: the {other} kernels also matched the {own} golden bit for bit"
        );
    }
}
