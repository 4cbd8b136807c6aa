//! The mutation suite: realistic porting bugs, switched on one at a time in the engine
//! (`lockstep_engine::faults`, a test-only cargo feature), each run through the gate and `lockstep bisect`
//! on the committed goldens, in both numerics modes. For every (mutant, mode, prompt) the gate must fail,
//! and bisect must name the layer, the stage kind and the phase where the bug enters in at least 95% of
//! the cases; the unbroken engine must get no structural verdict. Real models: `#[ignore]`d, run by
//! `ci/test.sh`.
//!
//! One test per architecture. The fault switch is process-wide: nextest runs each test in a process of
//! its own, and under `cargo test` the tests take turns ([`SWITCH`]).

mod common;

use common::root;
use lockstep::bisect::{bisect_with, render, BisectOptions, BisectReport};
use lockstep::compare::Phase;
use lockstep::engine::LockstepEngine;
use lockstep::judge::Finding;
use lockstep_engine::faults::{self, Fault};
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::models::blocks::{GluAct, RopeKind};
use lockstep_engine::quant::GgmlType;
use lockstep_engine::{NumericsMode, Stage, StageKind};

/// Where a mutant's effect must be named: the layer (`None`: a global stage), the stage kinds that count
/// (either of `q_rope`/`k_rope` for a RoPE bug), and the phase.
#[derive(Clone, Debug, PartialEq)]
struct Site {
    layer: Option<usize>,
    kinds: Vec<StageKind>,
    phase: Phase,
}

/// A model of the suite, with what its file says about where each bug must show.
struct Subject {
    id: &'static str,
    prompt: &'static str,
    /// The goldens' oracle directory (`llama.cpp-f32kv`, `transformers-f32`): the suite holds the engine to
    /// that oracle's goldens alone.
    oracle: &'static str,
    /// Tokens in the prompt: position-dependent bugs show only from the second position on.
    n_prompt: usize,
    n_layer: usize,
    n_head: usize,
    n_kv_head: usize,
    has_bias: bool,
    /// Q/K/V from one fused `attn_qkv` matrix (Phi-3).
    fused_qkv: bool,
    has_embed_scale: bool,
    /// Attention logit soft-capping (Gemma 2).
    has_softcap: bool,
    /// The sliding window and the first layer that uses it.
    window: Option<(usize, usize)>,
    /// Decode steps of the golden.
    n_decode: usize,
    /// A gated FFN (gate and up, separate or fused); StarCoder2's is not (no gate to swap, GELU only).
    gated_ffn: bool,
    /// LayerNorms with a bias (`blk.0.attn_norm.bias`: StarCoder2, StableLM).
    has_norm_bias: bool,
    /// RoPE rotates fewer dimensions than the head has (`rope.dimension_count` < head_dim: StableLM).
    partial_rotary: bool,
    /// RoPE at all (GPT-2 has learned absolute positions instead).
    has_rope: bool,
    /// Per-head Q/K RMSNorms before RoPE (Qwen3, Gemma 3, Gemma 4).
    has_qk_norm: bool,
    /// A GELU FFN activation (GeGLU or plain GELU), not SiLU.
    gelu_ffn: bool,
    /// Learned absolute positions (`position_embd`, GPT-2).
    has_pos_embd: bool,
    /// The first layer whose RoPE has frequency factors (Gemma 4's full-attention layers).
    first_rope_freqs: Option<usize>,
    /// The first layer whose RoPE base is not 10000 (Gemma 3's local layers use 10000).
    first_rope_base_not_10k: Option<usize>,
    /// The first matmul in forward order whose weight is Q4_1 or Q4_K (whose min the fault misreads).
    first_min_quant: Option<Site>,
    /// An encoder (BERT): post-norms from the embedding LayerNorm on, bidirectional attention, token types,
    /// a pooled output; no RoPE, no KV cache, no output norm.
    encoder: bool,
    /// The arrays the golden stores (`blk.0.q`, `decode.blk.0.out`, ...): bisect can only name a stage the
    /// golden stores, so where it lacks the stage a bug enters at, the right answer is the layer's `out`.
    stored: Vec<String>,
    /// A compact golden's `stage_positions` (its prefill stages are stored at these prompt positions only;
    /// `None`: at every position): a bug that changes only some positions shows in its prefill stages only if
    /// it stores one of them.
    stage_positions: Option<Vec<usize>>,
}

/// The stage a weight's matmul emits, and its rank within a block.
fn weight_stage(tensor: &str) -> Option<(StageKind, usize)> {
    Some(match tensor {
        "attn_q.weight" => (StageKind::Q, 0),
        "attn_k.weight" => (StageKind::K, 1),
        "attn_v.weight" => (StageKind::V, 2),
        "attn_output.weight" => (StageKind::AttnProj, 3),
        "ffn_gate.weight" => (StageKind::FfnGate, 4),
        "ffn_up.weight" => (StageKind::FfnUp, 5),
        "ffn_down.weight" => (StageKind::FfnOut, 6),
        _ => return None,
    })
}

fn subject(id: &'static str, prompt: &'static str) -> Subject {
    subject_of(id, prompt, "llama.cpp-f32kv")
}

/// [`subject`] held to the goldens of `oracle`.
fn subject_of(id: &'static str, prompt: &'static str, oracle: &'static str) -> Subject {
    let manifest = lockstep::golden::load_manifest(&root().join("golden")).unwrap();
    let entry = manifest
        .entry(
            &root().join("golden"),
            &format!("{id}/{oracle}/{prompt}.npz"),
        )
        .unwrap();
    let stored: Vec<String> = entry.arrays.keys().cloned().collect();
    let stage_positions = lockstep::golden::GoldenFile::open(&root().join("golden"), entry)
        .unwrap()
        .stage_positions()
        .unwrap();
    let n_prompt = entry.n_prompt_tokens;
    let n_decode = entry.n_decode_steps;
    let path = lockstep::fetch::resolve_model(id).unwrap();
    let model = lockstep_engine::Model::load(&path).unwrap();
    let layers: &[lockstep_engine::models::blocks::DecoderLayer] =
        model.decoder().map_or(&[], |d| &d.layers);
    let g = GgufFile::open(&path).unwrap();
    let arch = g.get_str("general.architecture").unwrap().to_string();
    let key = |k: &str| g.get_u64(&format!("{arch}.{k}")).unwrap() as usize;
    let key_or = |k: &str, d: usize| g.get_u64(&format!("{arch}.{k}")).map_or(d, |v| v as usize);
    let mut first: Option<(usize, usize, StageKind)> = None;
    for t in g.tensors() {
        if !matches!(t.ggml_type, GgmlType::Q4_1 | GgmlType::Q4_K) {
            continue;
        }
        let mut parts = t.name.splitn(3, '.');
        let (Some("blk"), Some(l), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Some((kind, rank)) = weight_stage(rest) else {
            continue;
        };
        let key = (l.parse().unwrap(), rank, kind);
        if first.is_none_or(|f| (key.0, key.1) < (f.0, f.1)) {
            first = Some(key);
        }
    }
    Subject {
        id,
        prompt,
        oracle,
        n_prompt,
        n_layer: key("block_count"),
        n_head: key("attention.head_count"),
        n_kv_head: key_or("attention.head_count_kv", key("attention.head_count")),
        has_bias: g.tensor("blk.0.attn_q.bias").is_ok() || g.tensor("blk.0.attn_qkv.bias").is_ok(),
        fused_qkv: g.tensor("blk.0.attn_qkv.weight").is_ok(),
        has_embed_scale: model.decoder().is_some_and(|d| d.embed.scale.is_some()),
        has_softcap: layers.iter().any(|l| l.attn.shape.softcap.is_some()),
        window: layers
            .iter()
            .find_map(|l| Some((l.attn.shape.window?, l.layer))),
        n_decode,
        gated_ffn: layers
            .first()
            .is_some_and(|l| l.ffn.gate.is_some() || l.ffn.fused),
        has_norm_bias: g.tensor("blk.0.attn_norm.bias").is_ok()
            || g.tensor("token_embd_norm.bias").is_ok(),
        partial_rotary: layers
            .first()
            .is_some_and(|l| l.attn.rope.dim < l.attn.shape.head_dim),
        encoder: model.encoder().is_some(),
        has_rope: layers
            .first()
            .is_some_and(|l| l.attn.rope.kind != RopeKind::None),
        has_pos_embd: model.decoder().is_some_and(|d| d.embed.positions.is_some()),
        has_qk_norm: layers.first().is_some_and(|l| l.attn.qk_norm.is_some()),
        gelu_ffn: layers.first().is_some_and(|l| {
            (l.ffn.gate.is_none() && !l.ffn.fused) || l.ffn.act == GluAct::GeluTanh
        }),
        first_rope_freqs: layers.iter().position(|l| l.attn.rope_freqs.is_some()),
        first_min_quant: first.map(|(l, _, k)| Site {
            layer: Some(l),
            kinds: vec![k],
            phase: Phase::Prefill,
        }),
        stored,
        stage_positions,
        first_rope_base_not_10k: layers.iter().position(|l| l.attn.rope.base != 10000.0),
    }
}

/// `site`, or where the golden stores none of the site's stage kinds in that phase, the first stage after it
/// that the golden stores in that phase: the layer's `out`, else the next stored layer output, else the final
/// norm (e.g. a golden whose decode steps store only `decode.output_norm`).
fn as_stored(site: Site, s: &Subject) -> Site {
    let prefix = if site.phase == Phase::Decode {
        "decode."
    } else {
        ""
    };
    let has = |layer: Option<usize>, k: StageKind| {
        let id = Stage {
            enc: false,
            layer,
            kind: k,
        }
        .to_string();
        s.stored.contains(&format!("{prefix}{id}"))
    };
    let Some(layer) = site.layer else {
        return site;
    };
    if site.kinds.iter().any(|&k| has(site.layer, k)) {
        return site;
    }
    match (layer..s.n_layer).find(|&l| has(Some(l), StageKind::Out)) {
        Some(l) => Site {
            layer: Some(l),
            kinds: vec![StageKind::Out],
            ..site
        },
        None => Site {
            layer: None,
            kinds: vec![StageKind::OutputNorm],
            ..site
        },
    }
}

/// Where `fault` must be named on `s`; `None` when the fault cannot change anything there (e.g. the
/// causal mask of a one-token prompt, GQA head mapping with a single KV head).
fn expected(fault: Fault, s: &Subject) -> Option<Site> {
    use StageKind as K;
    let site = |layer: Option<usize>, kinds: &[StageKind], phase| Site {
        layer,
        kinds: kinds.to_vec(),
        phase,
    };
    // a bug that needs a second position shows in the prompt, or else in the first decode step
    let multi = if s.n_prompt > 1 {
        Phase::Prefill
    } else {
        Phase::Decode
    };
    let mid = s.n_layer / 2;
    if s.encoder {
        return expected_encoder(fault, s).map(|x| as_stored(x, s));
    }
    let site = Some(match fault {
        // no rotation to get wrong where positions are a learned table (GPT-2)
        Fault::RopePairing
        | Fault::RopeBase
        | Fault::RopeDecodePosition
        | Fault::PartialRotaryDims
            if !s.has_rope =>
        {
            return None
        }
        Fault::PosEmbdOffset if !s.has_pos_embd => return None,
        Fault::PosEmbdOffset => site(None, &[K::Embed], Phase::Decode),
        Fault::RopeFreqFactorsIgnored => {
            site(Some(s.first_rope_freqs?), &[K::QRope, K::KRope], multi)
        }
        Fault::RopePairing => site(Some(0), &[K::QRope, K::KRope], multi),
        // emitted out of order (q_rope before q_norm): the reference's q_norm comes first and differs from
        // the second position on, where RoPE stops being the identity
        Fault::QkNormAfterRope if !s.has_qk_norm => return None,
        Fault::QkNormAfterRope => site(Some(0), &[K::QNorm, K::KNorm], multi),
        // no k_norm emitted: the first stage that shows it is k_rope
        Fault::KNormSkipped if !s.has_qk_norm => return None,
        Fault::KNormSkipped => site(Some(0), &[K::KNorm, K::KRope], Phase::Prefill),
        // the activation of every layer's FFN; StarCoder2/GPT-2's plain GELU and Gemma's GeGLU (not SiLU)
        Fault::GeluErf if !s.gelu_ffn => return None,
        Fault::GeluErf => site(Some(0), &[K::FfnAct], Phase::Prefill),
        Fault::AttnSoftcapFromFinal if !s.has_softcap => return None,
        Fault::AttnSoftcapFromFinal => site(Some(0), &[K::AttnOut], Phase::Prefill),
        Fault::RopeBase => site(
            Some(s.first_rope_base_not_10k?),
            &[K::QRope, K::KRope],
            multi,
        ),
        Fault::RopeDecodePosition => site(Some(0), &[K::QRope, K::KRope], Phase::Decode),
        Fault::LayerNormBiasDropped if !s.has_norm_bias => return None,
        Fault::LayerNormBiasDropped => site(Some(0), &[K::AttnNorm], Phase::Prefill),
        Fault::PartialRotaryDims if !s.partial_rotary => return None,
        Fault::PartialRotaryDims => site(Some(0), &[K::QRope, K::KRope], multi),
        Fault::NormEps => site(Some(0), &[K::AttnNorm], Phase::Prefill),
        Fault::KvWritePosition => site(Some(0), &[K::AttnOut], Phase::Decode),
        Fault::GqaHeadMap if s.n_kv_head == 1 || s.n_kv_head == s.n_head => return None,
        Fault::GqaHeadMap => site(Some(0), &[K::AttnOut], Phase::Prefill),
        Fault::AttnScale => site(Some(0), &[K::AttnOut], multi),
        Fault::CausalMaskOff if s.n_prompt == 1 => return None,
        Fault::CausalMaskOff => site(Some(0), &[K::AttnOut], Phase::Prefill),
        Fault::GateUpSwapped | Fault::WrongActivation { .. } if !s.gated_ffn => return None,
        // ffn_gate, or where the golden cannot hold it (Phi-3's fused gate+up has no node) the activation
        Fault::GateUpSwapped => site(Some(0), &[K::FfnGate, K::FfnAct], Phase::Prefill),
        Fault::WrongActivation { .. } => site(Some(mid), &[K::FfnAct], Phase::Prefill),
        Fault::MissingResidual { .. } => site(Some(mid), &[K::Out], Phase::Prefill),
        Fault::QuantMinMisread => s.first_min_quant.clone()?,
        Fault::FinalNormSkipped => site(None, &[K::OutputNorm], Phase::Prefill),
        Fault::QkvBiasMissing if !s.has_bias => return None,
        // q, or where q is a view of the fused matmul with no node and no RoPE follows (GPT-2) attn_out
        Fault::QkvBiasMissing if s.fused_qkv && !s.has_rope => {
            site(Some(0), &[K::Q, K::AttnOut], Phase::Prefill)
        }
        Fault::QkvBiasMissing => site(Some(0), &[K::Q], Phase::Prefill),
        Fault::EmbedScaleMissing if !s.has_embed_scale => return None,
        Fault::EmbedScaleMissing => site(None, &[K::Embed], Phase::Prefill),
        Fault::SoftcapMissing if !s.has_softcap => return None,
        Fault::SoftcapMissing => site(Some(0), &[K::AttnOut], multi),
        // the key `window` positions back becomes visible: from the query at position `window` on (in the
        // prompt's stages only where the golden stores a position from `window` on: a compact golden)
        Fault::WindowOffByOne => {
            let (w, l) = s.window?;
            let stores_past_window = s
                .stage_positions
                .as_ref()
                .is_none_or(|p| p.iter().any(|&p| p >= w));
            let phase = if s.n_prompt > w && stores_past_window {
                Phase::Prefill
            } else if s.n_prompt + s.n_decode > w {
                Phase::Decode
            } else {
                return None;
            };
            site(Some(l), &[K::AttnOut], phase)
        }
        Fault::FusedQkvSplit if !s.fused_qkv => return None,
        // k and v swapped: k shows first (k_rope where the golden has no q/k/v of the fused matmul's views)
        Fault::FusedQkvSplit if !s.has_rope => {
            site(Some(0), &[K::K, K::V, K::AttnOut], Phase::Prefill)
        }
        Fault::FusedQkvSplit => site(Some(0), &[K::K, K::V, K::KRope], Phase::Prefill),
        // reference mode only: its own test below, not the two-mode suite
        Fault::ReferenceUnpack => return None,
        // the portable dequantizer, which these runs (the fastest SIMD setting) do not run: tests/simd_off.rs
        Fault::PortableDequantHalvesSwapped => return None,
        // an encoder's blocks: a decoder has no token types, no pooling, no encoder attention
        Fault::EncoderCausalMask | Fault::TokenTypeDropped | Fault::PoolingWrong => return None,
        // Whisper's front end and cross-attention (tests/whisper.rs), which no decoder-only model has
        Fault::MelFilterUnnormalised
        | Fault::StftZeroPadding
        | Fault::CrossAttnCausal
        | Fault::KProjBias
        | Fault::CrossKvFromDecoder => return None,
    });
    site.map(|x| as_stored(x, s))
}

/// [`expected`] for an encoder (BERT): its first norm is the embedding LayerNorm (`embed` is its output),
/// its attention sees the whole prompt, its output is `pooled`. Faults of blocks it does not have (RoPE,
/// KV cache, causal mask, gate, output norm, soft-cap, window, fused QKV) cannot change anything.
fn expected_encoder(fault: Fault, s: &Subject) -> Option<Site> {
    use StageKind as K;
    let site = |layer: Option<usize>, kinds: &[StageKind]| Site {
        layer,
        kinds: kinds.to_vec(),
        phase: Phase::Prefill,
    };
    let mid = s.n_layer / 2;
    Some(match fault {
        Fault::NormEps | Fault::LayerNormBiasDropped | Fault::TokenTypeDropped => {
            site(None, &[K::Embed])
        }
        Fault::GqaHeadMap if s.n_kv_head == 1 || s.n_kv_head == s.n_head => return None,
        Fault::GqaHeadMap | Fault::AttnScale => site(Some(0), &[K::AttnOut]),
        Fault::EncoderCausalMask if s.n_prompt == 1 => return None,
        Fault::EncoderCausalMask => site(Some(0), &[K::AttnOut]),
        Fault::MissingResidual { .. } => site(Some(mid), &[K::Out]),
        Fault::QuantMinMisread => s.first_min_quant.clone()?,
        Fault::QkvBiasMissing if !s.has_bias => return None,
        Fault::QkvBiasMissing => site(Some(0), &[K::Q]),
        Fault::PoolingWrong => site(None, &[K::Pooled]),
        Fault::RopePairing
        | Fault::RopeBase
        | Fault::RopeDecodePosition
        | Fault::PartialRotaryDims
        | Fault::KvWritePosition
        | Fault::CausalMaskOff
        | Fault::GateUpSwapped
        | Fault::WrongActivation { .. }
        | Fault::FinalNormSkipped
        | Fault::EmbedScaleMissing
        | Fault::SoftcapMissing
        | Fault::WindowOffByOne
        | Fault::FusedQkvSplit
        // learned positions are only offset in a decode step, which an encoder never takes
        | Fault::PosEmbdOffset
        | Fault::RopeFreqFactorsIgnored
        | Fault::QkNormAfterRope
        | Fault::KNormSkipped
        | Fault::AttnSoftcapFromFinal
        // the encoder's GELU is the exact one already (HF `gelu`)
        | Fault::GeluErf
        | Fault::ReferenceUnpack
        | Fault::PortableDequantHalvesSwapped
        | Fault::MelFilterUnnormalised
        | Fault::StftZeroPadding
        | Fault::CrossAttnCausal
        | Fault::KProjBias
        | Fault::CrossKvFromDecoder => return None,
    })
}

fn mutants(s: &Subject) -> Vec<Fault> {
    let mid = s.n_layer / 2;
    vec![
        Fault::RopePairing,
        Fault::RopeBase,
        Fault::RopeDecodePosition,
        Fault::NormEps,
        Fault::KvWritePosition,
        Fault::GqaHeadMap,
        Fault::AttnScale,
        Fault::CausalMaskOff,
        Fault::GateUpSwapped,
        Fault::WrongActivation { layer: mid },
        Fault::MissingResidual { layer: mid },
        Fault::QuantMinMisread,
        Fault::FinalNormSkipped,
        Fault::QkvBiasMissing,
        Fault::EmbedScaleMissing,
        Fault::SoftcapMissing,
        Fault::WindowOffByOne,
        Fault::FusedQkvSplit,
        Fault::LayerNormBiasDropped,
        Fault::PartialRotaryDims,
        Fault::PosEmbdOffset,
        Fault::RopeFreqFactorsIgnored,
        Fault::QkNormAfterRope,
        Fault::GeluErf,
        Fault::KNormSkipped,
        Fault::AttnSoftcapFromFinal,
        Fault::EncoderCausalMask,
        Fault::TokenTypeDropped,
        Fault::PoolingWrong,
    ]
}

fn options(s: &Subject, mode: NumericsMode) -> BisectOptions {
    BisectOptions {
        golden_dir: root().join("golden"),
        thresholds: root().join("ci/thresholds.toml"),
        model: s.id.into(),
        prompt: s.prompt.into(),
        mode,
        oracle: s.oracle.into(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        // the fastest kernels: ggml mode's bits do not depend on them, reference mode has none
        simd: lockstep_engine::Simd::detect(),
    }
}

/// The site a bisect verdict names (structural verdicts only: a bug is not drift).
fn named(r: &BisectReport) -> Option<(Option<usize>, StageKind, Phase)> {
    match &r.finding {
        Finding::Structural { at, .. } => {
            let st = Stage::parse(&at.stage)?;
            Some((st.layer, st.kind, at.phase))
        }
        _ => None,
    }
}

fn bisect_once(s: &Subject, mode: NumericsMode, fault: Option<Fault>) -> BisectReport {
    faults::set(fault);
    let path = lockstep::fetch::resolve_model(s.id).unwrap();
    let mut engine = LockstepEngine::load(&path)
        .unwrap()
        .with_simd(lockstep_engine::Simd::detect());
    let r = bisect_with(&options(s, mode), &path, &mut engine);
    faults::set(None);
    r.unwrap_or_else(|e| panic!("{} {} {mode} {fault:?}: {e:#}", s.id, s.prompt))
}

/// The fault switch is process-wide: tests of this file that run as threads of one process (`cargo test`
/// rather than nextest) take turns.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Run every mutant on `subjects` in both modes; write the table to `target/mutants-<name>.md`; assert the
/// gate fails every one and bisect names ≥ 95% of them right.
/// Per numerics mode: (cases, named right, caught by the gate).
type Tally = std::collections::BTreeMap<String, (usize, usize, usize)>;

/// Run every mutant on `subjects` in both modes; write the table to `target/mutants-<name>.md`; assert the
/// gate fails every one and bisect names ≥ 95% of them right.
fn suite(name: &str, subjects: &[Subject]) {
    let (table, gate_missed, rate) = run_suite(name, subjects);
    assert!(
        gate_missed.is_empty(),
        "the gate passed: {gate_missed:?}\n{table}"
    );
    assert!(overall(&rate) >= 0.95, "{table}");
}

/// The share of all cases named right.
fn overall(t: &Tally) -> f64 {
    let (n, r) = t.values().fold((0, 0), |(n, r), v| (n + v.0, r + v.1));
    r as f64 / n as f64
}

/// [`suite`] without its assertions: the table (also written to `target/mutants-<name>.md`), the cases the
/// gate passed, and the tally per mode.
fn run_suite(name: &str, subjects: &[Subject]) -> (String, Vec<String>, Tally) {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let mut tally = Tally::new();
    let mut table = String::from(
        "| model | prompt | oracle | mutant | mode | expected | gate | bisect names | right |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let (mut cases, mut right, mut gate_missed) = (0, 0, Vec::new());
    for s in subjects {
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let r = bisect_once(s, mode, None);
            assert!(
                !matches!(r.finding, Finding::Structural { .. }),
                "unbroken engine, {} {} {mode}: {}",
                s.id,
                s.prompt,
                render(&r)
            );
            for fault in mutants(s) {
                let Some(want) = expected(fault, s) else {
                    continue;
                };
                let r = bisect_once(s, mode, Some(fault));
                let got = named(&r);
                let ok = got.is_some_and(|(l, k, p)| {
                    l == want.layer && want.kinds.contains(&k) && p == want.phase
                });
                cases += 1;
                right += usize::from(ok);
                let t = tally.entry(mode.to_string()).or_default();
                *t = (
                    t.0 + 1,
                    t.1 + usize::from(ok),
                    t.2 + usize::from(!r.gate.pass),
                );
                if r.gate.pass {
                    gate_missed.push(format!("{} {} {fault:?} {mode}", s.id, s.prompt));
                }
                let show = |l: Option<usize>, k: &str, p: Phase| {
                    format!(
                        "{}{k} ({p})",
                        l.map_or(String::new(), |l| format!("blk.{l}."))
                    )
                };
                let want_s = show(
                    want.layer,
                    &want
                        .kinds
                        .iter()
                        .map(|k| k.suffix())
                        .collect::<Vec<_>>()
                        .join("|"),
                    want.phase,
                );
                let got_s = match (&r.finding, got) {
                    (_, Some((l, k, p))) => show(l, k.suffix(), p),
                    (Finding::AccumulatedDrift { at }, None) => format!("drift at {}", at.stage),
                    _ => "none".into(),
                };
                let line = format!(
                    "| {} | {} | {} | {fault:?} | {mode} | {want_s} | {} | {got_s} | {} |\n",
                    s.id,
                    s.prompt,
                    s.oracle,
                    if r.gate.pass { "PASSED" } else { "fails" },
                    if ok { "yes" } else { "NO" }
                );
                eprint!("{line}");
                table.push_str(&line);
            }
        }
    }
    let rate = right as f64 / cases as f64;
    table.push_str(&format!(
        "\n{right}/{cases} named right ({:.1}%); gate missed {}\n",
        100.0 * rate,
        gate_missed.len()
    ));
    for (mode, (n, r, c)) in &tally {
        table.push_str(&format!(
            "{mode}: {r}/{n} named right ({:.1}%), {c}/{n} caught by the gate ({:.1}%)\n",
            100.0 * *r as f64 / *n as f64,
            100.0 * *c as f64 / *n as f64
        ));
    }
    println!("{table}");
    let out = root().join(format!("target/mutants-{name}.md"));
    let _ = std::fs::write(&out, &table);
    (table, gate_missed, tally)
}

/// Assert that ≥ 95% of the cases of `modes` together are named right and ≥ 95% caught by the gate — the bar of
/// issue 42 for the transformers goldens alone, over a whole suite, with its cells of both modes counted
/// together as the issue's own table counts them (the table gives each mode's figures too).
fn assert_cases(t: &Tally, modes: &[&str], table: &str) {
    let (n, r, c) = modes
        .iter()
        .map(|m| t[*m])
        .fold((0, 0, 0), |a, v| (a.0 + v.0, a.1 + v.1, a.2 + v.2));
    assert!(
        r as f64 >= 0.95 * n as f64 && c as f64 >= 0.95 * n as f64,
        "{modes:?}: {r}/{n} named right, {c}/{n} caught\n{table}"
    );
}

// every golden that stores each layer's stages for its prompt (the others store only layer outputs)

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn smollm2_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite(
        "smollm2",
        &[
            subject("smollm2-135m-q4_1", "prose"),
            subject("smollm2-135m-q4_1", "one_token"),
        ],
    );
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn gemma3_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("gemma3", &[subject("gemma3-270m-q4_k_m", "prose")]);
}

/// Issue 42: the real Gemma 3's sliding window (512 positions) is crossed by the compact golden `long_window`
/// (540 prompt tokens; blk.N.out and output_norm stored at a few positions around the window boundary). A window
/// off by one (`pos − p ≤ window`) lets the query at position 512 see position 0: ggml mode's gate fails the
/// cell at the first window layer's output at position 512 exactly (every stored row before it stays bit exact;
/// measured: blk.0.out cosine 0.99999955, NMSE 2.0e-6 there). Reference mode does NOT catch it: an NMSE of 2e-6
/// is far inside its floor (its unbroken rows differ from llama.cpp by ~1e-4..1e-3), so its verdict is printed,
/// not asserted. A compact golden cannot be injected, so bisect says it cannot localize and gives the
/// accumulated pass's first divergent stage; the unbroken engine passes in both modes.
#[test]
#[ignore = "real model: run by ci/test.sh"]
fn gemma3_window_off_by_one_fails_the_ggml_gate_on_the_golden_longer_than_its_window() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let s = subject("gemma3-270m-q4_k_m", "long_window");
    let (w, l) = s.window.expect("Gemma 3 has a sliding window");
    assert!(
        s.n_prompt > w,
        "the prompt ({}) crosses the window ({w})",
        s.n_prompt
    );
    let want = expected(Fault::WindowOffByOne, &s).expect("the fault changes this golden");
    assert_eq!(
        want,
        Site {
            layer: Some(l),
            kinds: vec![StageKind::Out],
            phase: Phase::Prefill
        }
    );
    for mode in [NumericsMode::Ggml, NumericsMode::Reference] {
        let clean = bisect_once(&s, mode, None);
        assert!(
            clean.gate.pass,
            "unbroken engine, {mode}: {}",
            render(&clean)
        );
        let note = clean.unlocalized.as_deref().unwrap_or_default();
        assert!(note.contains("compact"), "{mode}: {note}");
        let r = bisect_once(&s, mode, Some(Fault::WindowOffByOne));
        let text = render(&r);
        eprintln!(
            "---- WindowOffByOne, {mode}: gate {}\n{text}",
            if r.gate.pass { "PASSED" } else { "fails" }
        );
        if mode == NumericsMode::Reference {
            continue; // below reference mode's floor (see above): reported, not asserted
        }
        assert!(
            !r.gate.pass,
            "{mode}: the gate passed a window off by one\n{text}"
        );
        // bit equality up to the first query that sees one key too many
        let first = r
            .gate
            .first_divergent
            .clone()
            .unwrap_or_else(|| panic!("{mode}: no first divergent stage\n{text}"));
        assert_eq!(
            (first.stage.as_str(), first.phase, first.position),
            (format!("blk.{l}.out").as_str(), Phase::Prefill, w),
            "{text}"
        );
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn qwen2_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("qwen2", &[subject("qwen2.5-coder-0.5b-q4_k_m", "prose")]);
}

// the tiny seeded models (`lockstep synth`; made in the cache on first use, no download): every block a
// porter meets, on a prompt that crosses their sliding window of 4. Fast: not ignored.

#[test]
fn synth_llama_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-llama", &[subject("synth-llama", "synth")]);
}

#[test]
fn synth_qwen2_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-qwen2", &[subject("synth-qwen2", "synth")]);
}

#[test]
fn synth_qwen3_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-qwen3", &[subject("synth-qwen3", "synth")]);
}

#[test]
fn synth_gemma2_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-gemma2", &[subject("synth-gemma2", "synth")]);
}

#[test]
fn synth_gemma3_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-gemma3", &[subject("synth-gemma3", "synth")]);
}

#[test]
fn synth_phi3_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-phi3", &[subject("synth-phi3", "synth")]);
}

#[test]
fn synth_starcoder2_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-starcoder2", &[subject("synth-starcoder2", "synth")]);
}

#[test]
fn synth_stablelm_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-stablelm", &[subject("synth-stablelm", "synth")]);
}

#[test]
fn synth_gemma4_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-gemma4", &[subject("synth-gemma4", "synth")]);
}

#[test]
fn synth_gpt2_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-gpt2", &[subject("synth-gpt2", "synth")]);
}

#[test]
fn synth_bert_every_mutant_is_caught_by_the_gate_and_named_by_bisect() {
    suite("synth-bert", &[subject("synth-bert", "synth")]);
}

// The same suite held to the transformers goldens alone (issue 42): for an architecture llama.cpp does not have,
// transformers is the porter's only oracle, so its cells must localize as sharply. Both modes, against the
// transformers-f32 floors of ci/floors.json (reference mode at the float32 floor, ggml mode at llama.cpp's own
// distance from float32).

const TF: &str = "transformers-f32";

/// Every seeded model (all eleven architectures) held to its transformers golden alone: ≥ 95% of the (mutant,
/// model, mode) cases named right and caught by the gate, over the whole suite. The misses it allows are
/// measured and physical: a wrong RMSNorm epsilon on the Gemma models (their inputs' mean square is so large that a
/// tenth of eps moves `attn_norm` by less than the float32 floor) and, in ggml mode, erf for tanh GELU (below
/// ggml's own f16 GELU table against float32); the llama.cpp suites catch both bit for bit.
#[test]
fn every_seeded_model_against_transformers_every_mutant_is_caught_and_named() {
    let subjects: Vec<Subject> = [
        "synth-llama",
        "synth-qwen2",
        "synth-qwen3",
        "synth-gemma2",
        "synth-gemma3",
        "synth-gemma4",
        "synth-phi3",
        "synth-starcoder2",
        "synth-stablelm",
        "synth-gpt2",
        "synth-bert",
    ]
    .into_iter()
    .map(|id| subject_of(id, "synth", TF))
    .collect();
    let (table, _, tally) = run_suite("synth-tf", &subjects);
    assert_cases(&tally, &["reference", "ggml"], &table);
}

/// The downloaded models against their transformers goldens alone. Reference mode is held to the full bar (every
/// case caught, ≥ 95% named). ggml mode's table is written (target/mutants-real-tf.md) but not held to it: on
/// these quantized files ggml mode is llama.cpp's arithmetic, whose measured local distance from float32
/// (ci/floors.json, e.g. Gemma 3 270M `out` 1.25e-3 NMSE on f32-stored rows) is larger than the effect of the
/// smaller faults (a tenth of RMSNorm eps, erf GELU, a wrong RoPE base in one layer); the llama.cpp cells of the
/// same run catch them bit for bit, and reference mode here catches them at the float32 floor.
#[test]
#[ignore = "real models: run by ci/test.sh"]
fn downloaded_models_against_transformers_every_mutant_is_caught_and_named_in_reference_mode() {
    let subjects = [
        subject_of("smollm2-135m-q4_1", "prose", TF),
        subject_of("smollm2-135m-q4_1", "one_token", TF),
        subject_of("gemma3-270m-q4_k_m", "prose", TF),
        subject_of("qwen2.5-coder-0.5b-q4_k_m", "prose", TF),
    ];
    let (table, gate_missed, tally) = run_suite("real-tf", &subjects);
    let missed_ref: Vec<&String> = gate_missed
        .iter()
        .filter(|m| m.ends_with(" reference"))
        .collect();
    assert!(
        missed_ref.is_empty(),
        "reference mode: the gate passed {missed_ref:?}\n{table}"
    );
    assert_cases(&tally, &["reference"], &table);
}

/// A bug in code only reference mode runs (its matmuls' Q4_1 dequantization) while ggml mode stays bit
/// exact: bisect's ggml cross-check alone called such rows "oracle-side rounding" (issue 29, item 8).
/// Reference mode's rerun with llama.cpp's input rounding keeps them above the floor, so the verdict is
/// structural, at the first Q4_1 matmul, and the gate fails; ggml mode, which does not run that code, is
/// clean.
#[test]
#[ignore = "real model: run by ci/test.sh"]
fn a_reference_only_unpack_bug_is_structural_not_oracle_rounding() {
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let s = subject("smollm2-135m-q4_1", "prose");
    let want = as_stored(
        s.first_min_quant.clone().expect("SmolLM2 has Q4_1 matmuls"),
        &s,
    );
    let r = bisect_once(&s, NumericsMode::Reference, Some(Fault::ReferenceUnpack));
    let text = render(&r);
    let got = named(&r).unwrap_or_else(|| panic!("not structural:\n{text}"));
    assert!(
        got.0 == want.layer && want.kinds.contains(&got.1) && got.2 == want.phase,
        "named {got:?}, expected {want:?}:\n{text}"
    );
    assert!(
        text.contains("with llama.cpp's input rounding added"),
        "{text}"
    );
    assert!(!r.gate.pass && !r.is_clean(), "{text}");
    let g = bisect_once(&s, NumericsMode::Ggml, Some(Fault::ReferenceUnpack));
    assert_eq!(g.finding, Finding::None, "{}", render(&g));
}

/// Issue 41: under the cross-oracle yardstick (reference mode against llama.cpp held to llama.cpp's own measured
/// distance from transformers, `ci/thresholds.toml`), a wrong RMSNorm epsilon and a misread Q4_1 minimum (the
/// two faults whose effect is smallest in reference mode) still fail the llama.cpp-side gate of every downloaded
/// model whose reference cells that yardstick holds, on its `prose` golden.
#[test]
#[ignore = "real models: run by ci/test.sh"]
fn the_cross_oracle_yardstick_still_fails_small_reference_mode_bugs() {
    use lockstep::gate::yardstick::LABEL;
    let _turn = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let th = lockstep::gate::Thresholds::load(&root().join("ci/thresholds.toml")).unwrap();
    for id in [
        "smollm2-135m-q4_1",
        "gemma3-270m-q4_k_m",
        "qwen2.5-coder-0.5b-q4_k_m",
    ] {
        let s = subject(id, "prose");
        let clean = bisect_once(&s, NumericsMode::Reference, None);
        assert_eq!(
            th.for_cell(&clean.cell).unwrap().yardstick,
            LABEL,
            "{id}: its reference cells against llama.cpp are held to the cross-oracle distance"
        );
        assert!(
            clean.gate.pass,
            "{id}: the unbroken engine fails: {}",
            render(&clean)
        );
        for fault in [Fault::NormEps, Fault::QuantMinMisread] {
            if expected(fault, &s).is_none() {
                continue; // no Q4_1-family weight for the misread minimum to act on
            }
            let r = bisect_once(&s, NumericsMode::Reference, Some(fault));
            assert!(
                !r.gate.pass,
                "{id} {fault:?}: the gate passed under the cross-oracle yardstick\n{}",
                render(&r)
            );
        }
    }
}
