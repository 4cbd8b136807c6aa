//! Whisper (issue 44): the engine's `whisper` architecture on the seeded checkpoint
//! (oracles/whisper/checkpoints/whisper-seeded) held to its transformers goldens
//! (golden/whisper-seeded/transformers-f32, oracles/whisper/make_goldens.py) stage by stage, reference mode:
//!
//! - `mel`: the engine's log-mel of each committed WAV against `WhisperFeatureExtractor`'s;
//! - every encoder stage (`enc.conv1` … `enc.output_norm`), the cross-attention keys and values computed
//!   once per input (`blk.N.cross_k` / `cross_v`), every decoder stage of the prompt
//!   (<|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>) and of the teacher-forced decode steps
//!   (`decode.<id>`), each within 20× its f32 floor (transformers f32 vs f64, stored in the golden as
//!   `floor.<id>`: ×2 for two independent f32 computations, ×10 headroom — ci/thresholds.toml's rule for
//!   reference mode against transformers-f32). The encoder reads the golden's mel (injected through the
//!   stage hook, as bisect injects a reference input), so each stage is judged on the reference's input;
//! - greedy decoding end to end from the WAV (the engine's own mel) gives transformers' greedy tokens;
//! - each planted fault of whisper's parts is caught and localized: the first stage over its bound, in
//!   forward order, is the fault's own (encoder faults in the encoder).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use lockstep::npz::Npz;
use lockstep_engine::faults::{self, Fault};
use lockstep_engine::{Model, NumericsMode, Stage, StageKind, StageSink};

/// One fault switch per process: tests that set it take turns.
static SWITCH: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

const WAVS: [&str; 5] = ["burst", "chirp", "noise", "speech", "tones"];

fn model() -> Model {
    Model::load(&root().join("oracles/whisper/checkpoints/whisper-seeded"))
        .expect("the checkpoint loads")
}

/// `rel` (under golden/whisper-seeded) after its sha256 is checked against that directory's manifest.json
/// (written by oracles/whisper/make_goldens.py): a missing, unlisted or changed file fails.
fn verified(rel: &str) -> PathBuf {
    use sha2::Digest;
    let dir = root().join("golden/whisper-seeded");
    let text = std::fs::read_to_string(dir.join("manifest.json"))
        .expect("golden/whisper-seeded/manifest.json");
    let m: serde_json::Value = serde_json::from_str(&text).unwrap();
    let want = m["files"][rel]
        .as_str()
        .unwrap_or_else(|| panic!("golden/whisper-seeded/manifest.json does not list {rel}"));
    let path = dir.join(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&bytes)),
        want,
        "{}: sha256",
        path.display()
    );
    path
}

/// The golden's arrays: id → (rows·width values, width).
fn golden(name: &str) -> BTreeMap<String, (Vec<f32>, usize)> {
    let path = verified(&format!("transformers-f32/{name}.npz"));
    let mut z = Npz::open(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let mut out = BTreeMap::new();
    for k in z.array_names().unwrap() {
        let a = z.read(&k, u64::MAX).unwrap();
        let v = match a.to_f32() {
            Ok(v) => v,
            Err(_) => a.to_i32().unwrap().mapv(|x| x as f32),
        };
        let width = v.ncols();
        out.insert(k, (v.into_iter().collect(), width));
    }
    out
}

/// Records every stage in emission order under its golden key (`decode.` during decode steps); replaces
/// `mel` by the golden's when `inject` holds it.
struct Sink {
    prefix: &'static str,
    order: Vec<String>,
    rec: BTreeMap<String, Vec<f32>>,
    inject: Option<Vec<f32>>,
}

impl StageSink for Sink {
    fn on_stage(&mut self, stage: Stage, _: std::ops::Range<usize>, _: usize, data: &mut [f32]) {
        let id = stage.to_string();
        let is_once = stage.enc
            || matches!(
                stage.kind,
                StageKind::Mel | StageKind::CrossK | StageKind::CrossV
            );
        let key = if is_once {
            id
        } else {
            format!("{}{id}", self.prefix)
        };
        if !self.rec.contains_key(&key) {
            self.order.push(key.clone());
        }
        self.rec.entry(key).or_default().extend_from_slice(data);
        if stage.kind == StageKind::Mel {
            if let Some(m) = &self.inject {
                data.copy_from_slice(m);
            }
        }
    }
}

/// Per stage in forward order: (id, NMSE, max |Δ|, bound on the NMSE).
type Table = Vec<(String, f64, f64, f64)>;

/// The mel's max |Δ| against the feature extractor: the aim (1e-3). Its NMSE is held to 20× the
/// feature extractor's own f32 floor like every stage (`floor.mel`: its float32 spectrogram against the
/// same route in float64; the engine computes the front end in float64 and rounds once).
const MEL_MAX_ABS: f64 = 1e-3;

/// Run one WAV through the engine (encoder on the golden's mel, prompt, teacher-forced decode steps) and
/// compare every golden stage.
fn compare(m: &Model, name: &str) -> Table {
    let g = golden(name);
    let wav = verified(&format!("audio/{name}.wav"));
    let samples = lockstep_engine::audio::read_wav_16k_mono(&wav).unwrap();
    let mel = lockstep_engine::audio::log_mel(&samples, &m.mel_config().unwrap()).unwrap();
    let mut sink = Sink {
        prefix: "",
        order: Vec::new(),
        rec: BTreeMap::new(),
        inject: Some(g["mel"].0.clone()),
    };
    let mut s = m.session(64, NumericsMode::Reference);
    m.encode_audio(&mut s, &mel, Some(&mut sink)).unwrap();
    let ids = |k: &str| -> Vec<u32> { g[k].0.iter().map(|&x| x as u32).collect() };
    m.forward(&mut s, &ids("tokens"), Some(&mut sink)).unwrap();
    sink.prefix = "decode.";
    for t in ids("decode.tokens") {
        m.forward(&mut s, &[t], Some(&mut sink)).unwrap();
    }
    let mut table = Vec::new();
    for key in &sink.order {
        let Some((want, _)) = g.get(key) else {
            continue;
        };
        let have = &sink.rec[key];
        assert_eq!(
            have.len(),
            want.len(),
            "{name}: {key}: engine {} values, golden {}",
            have.len(),
            want.len()
        );
        let (mut num, mut den, mut max) = (0f64, 0f64, 0f64);
        for (&a, &b) in have.iter().zip(want) {
            let d = f64::from(a) - f64::from(b);
            num += d * d;
            den += f64::from(b) * f64::from(b);
            max = max.max(d.abs());
        }
        let nmse = if den > 0.0 { num / den } else { num };
        let bound = match g.get(&format!("floor.{key}")) {
            Some((f, _)) => 20.0 * f64::from(f[0]),
            None => panic!("{name}: golden stage {key} has no floor"),
        };
        table.push((key.clone(), nmse, max, bound));
    }
    // every golden stage was compared
    for k in g.keys() {
        let stage = !k.starts_with("floor.") && !k.ends_with("tokens");
        assert!(
            !stage || table.iter().any(|r| &r.0 == k),
            "{name}: the engine emitted no stage {k}"
        );
    }
    table
}

/// The first stage over its bound, in forward order.
fn first_divergent(t: &Table) -> Option<&str> {
    t.iter()
        .find(|(k, nmse, max, bound)| {
            !nmse.is_finite() || *nmse > *bound || (k == "mel" && *max > MEL_MAX_ABS)
        })
        .map(|r| r.0.as_str())
}

#[test]
fn whisper_stages_within_the_f32_floor() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    faults::set(None);
    let m = model();
    for name in WAVS {
        let t = compare(&m, name);
        let mel = &t[0];
        assert_eq!(mel.0, "mel");
        let worst = t[1..]
            .iter()
            .max_by(|a, b| (a.1 / a.3).total_cmp(&(b.1 / b.3)))
            .unwrap();
        eprintln!(
            "{name}: mel NMSE {:.3e} max|Δ| {:.3e}; {} stages, worst NMSE/bound {} {:.3e} / {:.3e}",
            mel.1,
            mel.2,
            t.len(),
            worst.0,
            worst.1,
            worst.3
        );
        for (k, nmse, max, bound) in &t {
            eprintln!("  {k:<28} nmse {nmse:.3e}  max|Δ| {max:.3e}  bound {bound:.3e}");
        }
        assert_eq!(first_divergent(&t), None, "{name}");
    }
}

#[test]
fn whisper_greedy_tokens_equal_transformers() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    faults::set(None);
    let m = model();
    for name in WAVS {
        let g = golden(name);
        let wav = verified(&format!("audio/{name}.wav"));
        let want: Vec<u32> = g["greedy.tokens"].0.iter().map(|&x| x as u32).collect();
        let prompt: Vec<u32> = g["tokens"].0.iter().map(|&x| x as u32).collect();
        let got = lockstep_engine::models::speech::transcribe_greedy(
            &m,
            &wav,
            &prompt,
            want.len(),
            NumericsMode::Reference,
        )
        .unwrap();
        assert_eq!(got, want, "{name}: greedy tokens");
    }
}

#[test]
fn whisper_faults_are_localized() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let m = model();
    let cases = WHISPER_FAULTS;
    let mut wrong = Vec::new();
    for (fault, want) in cases {
        faults::set(Some(fault));
        let t = compare(&m, "chirp");
        faults::set(None);
        let got = first_divergent(&t).map(str::to_string);
        eprintln!(
            "{:<24} expected {want:<24} first divergent {got:?}",
            fault.name()
        );
        if got.as_deref() != Some(want) {
            wrong.push(format!("{}: expected {want}, got {got:?}", fault.name()));
        }
    }
    assert!(wrong.is_empty(), "faults not localized: {wrong:#?}");
}

#[test]
fn generate_audio_prints_transformers_greedy_tokens() {
    for name in WAVS {
        let g = golden(name);
        let want: Vec<String> = g["greedy.tokens"]
            .0
            .iter()
            .map(|&x| (x as u32).to_string())
            .collect();
        for mode in ["reference", "ggml"] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_lockstep"))
                .args(["generate", "--model"])
                .arg(root().join("oracles/whisper/checkpoints/whisper-seeded"))
                .arg("--audio")
                .arg(verified(&format!("audio/{name}.wav")))
                .args(["-n", &want.len().to_string(), "--mode", mode])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name} {mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8(out.stdout).unwrap();
            assert_eq!(
                stdout.lines().next(),
                Some(want.join(" ").as_str()),
                "{name} {mode}"
            );
        }
    }
}

#[test]
fn generate_audio_stops_at_the_decoders_context() {
    // the default -n (64) and the 4 control tokens are more than the seeded model's 64 positions: the
    // transcription stops at the context (60 tokens, none of them <|endoftext|>) and says so
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["generate", "--model"])
        .arg(root().join("oracles/whisper/checkpoints/whisper-seeded"))
        .arg("--audio")
        .arg(verified("audio/tones.wav"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "-n 64 stops at 60 tokens: the decoder's context is 64 positions, 4 of them the prompt"
        ),
        "{stderr}"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let ids = stdout.lines().next().unwrap().split(' ').count();
    assert_eq!(ids, 60, "{stdout}");
    // the first tokens are transformers' greedy ones
    let want: Vec<String> = golden("tones")["greedy.tokens"]
        .0
        .iter()
        .map(|&x| (x as u32).to_string())
        .collect();
    assert!(stdout.starts_with(&want.join(" ")), "{stdout}");
}

#[test]
fn stages_list_both_stacks_in_forward_order() {
    let m = model();
    let ids: Vec<String> = m.stages().iter().map(|(s, _)| s.to_string()).collect();
    let at = |id: &str| {
        ids.iter()
            .position(|x| x == id)
            .unwrap_or_else(|| panic!("no {id} in {ids:?}"))
    };
    assert_eq!(ids[0], "mel");
    assert!(at("enc.conv1") < at("enc.conv2") && at("enc.conv2") < at("enc.embed"));
    assert!(
        at("enc.blk.1.out") < at("enc.output_norm") && at("enc.output_norm") < at("blk.0.cross_k")
    );
    assert!(at("blk.1.cross_v") < at("embed") && at("blk.0.cross_attn_proj") < at("blk.0.ffn_inp"));
    assert_eq!(ids.last().map(String::as_str), Some("logits"));
}

/// `lockstep run --model whisper-seeded`: the whisper cells of the default matrix (ci/matrix.toml; every
/// golden of golden/whisper-seeded listed in golden/manifest.json with its input WAV) run the engine on
/// audio through the run's own capture, compare and gate path: each cell compares `mel`, every encoder
/// stage, the cross K/V, the prompt's and the decode steps' stages and both phases' logits, and passes;
/// the report (json, md, junit) has the cells.
#[test]
fn lockstep_run_holds_the_whisper_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let junit = tmp.path().join("junit.xml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .current_dir(root())
        .args(["run", "--model", "whisper-seeded", "--reports"])
        .arg(tmp.path().join("reports"))
        .arg("--junit")
        .arg(&junit)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let dir = std::fs::read_dir(tmp.path().join("reports"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let cells = r["cells"].as_array().unwrap();
    // 5 WAVs × (reference off, reference avx2, ggml auto) in the default tier
    assert_eq!(cells.len(), 15, "{stderr}");
    for c in cells {
        let id = format!("{}/{}", c["cell"]["prompt"], c["cell"]["mode"]);
        assert_eq!(c["verdict"]["pass"], true, "{id}: {}", c["verdict"]);
        let stages = c["comparison"]["stages"].as_array().unwrap();
        let has = |name: &str, phase: &str| {
            stages
                .iter()
                .any(|s| s["stage"] == name && s["phase"] == phase)
        };
        for s in [
            "mel",
            "enc.conv1",
            "enc.conv2",
            "enc.embed",
            "enc.blk.0.k",
            "enc.blk.1.out",
            "enc.output_norm",
            "blk.0.cross_k",
            "blk.1.cross_v",
            "blk.0.cross_attn_out",
            "output_norm",
        ] {
            assert!(has(s, "prefill"), "{id}: no prefill stage {s} compared");
        }
        assert!(has("blk.1.cross_attn_out", "decode"), "{id}: decode stages");
        // 107 golden stages less `mel`'s and the encoder's being prefill-only: every golden stage compared
        assert_eq!(stages.len(), 105, "{id}: stages compared");
        let logits = c["comparison"]["logits"].as_array().unwrap();
        assert_eq!(logits.len(), 2, "{id}: prefill and decode logits");
        assert_eq!(logits[0]["n_positions"], 4, "{id}");
        assert_eq!(logits[1]["n_positions"], 6, "{id}");
        let mel = stages.iter().find(|s| s["stage"] == "mel").unwrap();
        assert!(
            mel["max_abs"].as_f64().unwrap() < MEL_MAX_ABS,
            "{id}: {mel}"
        );
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("whisper-seeded/chirp/F32/reference/simd-off"),
        "{md}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<testcase").count(), 15, "{xml}");
    assert!(!xml.contains("<failure"), "{xml}");
}

/// A whisper cell whose input WAV is missing fails the run before any cell runs, naming the file (a
/// missing input is a failure, never a skipped cell); so does a changed one.
#[test]
fn lockstep_run_refuses_a_missing_or_changed_whisper_input() {
    let tmp = tempfile::tempdir().unwrap();
    let golden = tmp.path().join("golden");
    let sub = golden.join("whisper-seeded");
    std::fs::create_dir_all(sub.join("audio")).unwrap();
    std::fs::create_dir_all(sub.join("transformers-f32")).unwrap();
    std::fs::copy(
        root().join("golden/manifest.json"),
        golden.join("manifest.json"),
    )
    .unwrap();
    for name in WAVS {
        for rel in [
            format!("transformers-f32/{name}.npz"),
            format!("audio/{name}.wav"),
        ] {
            std::fs::copy(verified(&rel), sub.join(&rel)).unwrap();
        }
    }
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .current_dir(root())
            .args(["run", "--model", "whisper-seeded", "--prompt", "chirp"])
            .arg("--golden-dir")
            .arg(&golden)
            .arg("--reports")
            .arg(tmp.path().join("reports"))
            .output()
            .unwrap()
    };
    std::fs::remove_file(sub.join("audio/chirp.wav")).unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("audio/chirp.wav") && err.contains("missing"),
        "{err}"
    );
    // another WAV in its place: its sha256 is not the manifest's
    std::fs::copy(verified("audio/tones.wav"), sub.join("audio/chirp.wav")).unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("audio/chirp.wav: sha256"), "{err}");
}

/// `lockstep bisect` on a whisper cell, with the engine given one of whisper's faults (or none): the
/// report of the normal bisect path (golden → capture with the cell's WAV → compare → judge).
fn bisect_whisper(
    prompt: &str,
    mode: NumericsMode,
    fault: Option<Fault>,
) -> lockstep::bisect::BisectReport {
    let path = root().join("oracles/whisper/checkpoints/whisper-seeded");
    let opts = lockstep::bisect::BisectOptions {
        golden_dir: root().join("golden"),
        thresholds: root().join("ci/thresholds.toml"),
        model: "whisper-seeded".into(),
        prompt: prompt.into(),
        mode,
        oracle: "transformers-f32".into(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        simd: lockstep_engine::Simd::detect(),
    };
    faults::set(fault);
    let mut engine = lockstep::engine::LockstepEngine::load(&path)
        .unwrap()
        .with_simd(lockstep_engine::Simd::detect());
    let r = lockstep::bisect::bisect_with(&opts, &path, &mut engine);
    faults::set(None);
    r.unwrap_or_else(|e| panic!("bisect {prompt} {mode} {fault:?}: {e:#}"))
}

/// Where bisect's structural finding is: the stage id as the golden names it (`decode.` for a decode step).
fn bisect_names(r: &lockstep::bisect::BisectReport) -> Option<String> {
    match &r.finding {
        lockstep::judge::Finding::Structural { at, .. } => Some(match at.phase {
            lockstep::compare::Phase::Decode => format!("decode.{}", at.stage),
            lockstep::compare::Phase::Prefill => at.stage.clone(),
        }),
        _ => None,
    }
}

/// The whisper faults and the stage each must be named at (the encoder's in the encoder).
const WHISPER_FAULTS: [(Fault, &str); 14] = [
    (Fault::MelFilterUnnormalised, "mel"),
    (Fault::StftZeroPadding, "mel"),
    (Fault::PosEmbdOffset, "enc.embed"),
    (Fault::KProjBias, "enc.blk.0.k"),
    (Fault::QkvBiasMissing, "enc.blk.0.q"),
    (Fault::LayerNormBiasDropped, "enc.blk.0.attn_norm"),
    (Fault::EncoderCausalMask, "enc.blk.0.attn_out"),
    (Fault::AttnScale, "enc.blk.0.attn_out"),
    (Fault::MissingResidual { layer: 0 }, "enc.blk.0.out"),
    (Fault::FinalNormSkipped, "enc.output_norm"),
    (Fault::CausalMaskOff, "blk.0.attn_out"),
    (Fault::CrossAttnCausal, "blk.0.cross_attn_out"),
    (Fault::CrossKvFromDecoder, "blk.0.cross_attn_out"),
    (Fault::KvWritePosition, "decode.blk.0.attn_out"),
];

/// The mutation table of whisper in the mutants-report format (harness/tests/mutants.rs: one row per
/// (mutant, mode, prompt), written to target/mutants-whisper.md): `lockstep bisect` walks both stacks —
/// every fault the gate fails, and bisect names its own stage (an encoder fault in the encoder, not at the
/// first decoder stage that reads the encoder output) in ≥ 95% of the cases; the unbroken engine gets no
/// structural verdict.
#[test]
fn whisper_mutants_bisect_names_each_fault_in_its_stack() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let mut table = String::from(
        "| model | prompt | oracle | mutant | mode | expected | gate | bisect names | right |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let (mut cases, mut right, mut gate_missed) = (0usize, 0usize, Vec::new());
    let mut enc = (0usize, 0usize);
    for prompt in ["chirp", "noise"] {
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let clean = bisect_whisper(prompt, mode, None);
            assert!(
                clean.is_clean(),
                "unbroken engine, {prompt} {mode}: {}",
                lockstep::bisect::render(&clean)
            );
            for (fault, want) in WHISPER_FAULTS {
                let r = bisect_whisper(prompt, mode, Some(fault));
                let got = bisect_names(&r);
                let ok = got.as_deref() == Some(want);
                cases += 1;
                right += usize::from(ok);
                if want == "mel" || want.starts_with("enc.") {
                    enc.0 += 1;
                    enc.1 += usize::from(ok);
                }
                if r.gate.pass {
                    gate_missed.push(format!("{prompt} {} {mode}", fault.name()));
                }
                let got_s = match (&r.finding, &got) {
                    (_, Some(s)) => s.clone(),
                    (lockstep::judge::Finding::AccumulatedDrift { at }, None) => {
                        format!("drift at {}", at.stage)
                    }
                    _ => "none".into(),
                };
                table.push_str(&format!(
                    "| whisper-seeded | {prompt} | transformers-f32 | {} | {mode} | {want} | {} | {got_s} | {} |\n",
                    fault.name(),
                    if r.gate.pass { "PASSED" } else { "fails" },
                    if ok { "yes" } else { "NO" }
                ));
            }
        }
    }
    table.push_str(&format!(
        "\n{right}/{cases} named right ({:.1}%); encoder faults named in the encoder {}/{}; gate missed {}\n",
        100.0 * right as f64 / cases as f64,
        enc.1,
        enc.0,
        gate_missed.len()
    ));
    println!("{table}");
    let _ = std::fs::write(root().join("target/mutants-whisper.md"), &table);
    assert!(
        gate_missed.is_empty(),
        "the gate passed: {gate_missed:?}\n{table}"
    );
    assert!(right as f64 >= 0.95 * cases as f64, "{table}");
    assert_eq!(
        enc.0, enc.1,
        "an encoder fault not named in the encoder\n{table}"
    );
}

/// Bisect's table walks both stacks: the encoder's blocks (`enc.N`) before the decoder's, and a fault in
/// the encoder marks its encoder block, not the decoder block of the same index.
#[test]
fn bisect_table_lists_the_encoder_blocks_before_the_decoder_blocks() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let r = bisect_whisper("chirp", NumericsMode::Reference, Some(Fault::KProjBias));
    let rows: Vec<(bool, usize)> = r.layers.iter().map(|l| (l.encoder, l.layer)).collect();
    assert_eq!(rows, [(true, 0), (true, 1), (false, 0), (false, 1)]);
    let text = lockstep::bisect::render(&r);
    let marked: Vec<&str> = text.lines().filter(|l| l.ends_with("<--")).collect();
    assert_eq!(marked.len(), 1, "{text}");
    assert!(marked[0].trim_start().starts_with("enc.0 "), "{text}");
}
