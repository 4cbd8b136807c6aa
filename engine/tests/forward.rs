//! Forward-pass properties on tiny synthetic models of every architecture ([`ARCHS`]): hooks, derived stage
//! lists, KV-cache decode, sliding windows, thread independence, modes; the encoder (bert) apart: no decode
//! step, bidirectional attention, a pooled output.

use std::ops::Range;

use lockstep_engine::gguf::GgufFile;
use lockstep_engine::hooks::{Recorder, Stage, StageKind, StageSink};
use lockstep_engine::quant::GgmlType;
use lockstep_engine::sample::argmax;
use lockstep_engine::synth::SynthModel;
use lockstep_engine::{Model, NumericsMode};

fn tiny(cfg: &SynthModel) -> Model {
    let bytes = cfg.build().expect("build tiny model");
    Model::from_gguf(GgufFile::from_bytes(bytes, "tiny-llama.gguf").unwrap())
        .expect("load tiny model")
}

fn record(model: &Model, tokens: &[u32], mode: NumericsMode, sink: &mut dyn StageSink) -> Vec<f32> {
    let mut s = model.session(64, mode);
    model.forward(&mut s, tokens, Some(sink)).unwrap().to_vec()
}

const PROMPT: [u32; 7] = [40, 75, 100, 3, 200, 17, 259];

/// Every architecture the engine wires, as a tiny synthetic model.
const ARCHS: [&str; 10] = [
    "llama",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "gemma4",
    "phi3",
    "starcoder2",
    "stablelm",
    "gpt2",
];

fn tiny_arch(arch: &'static str) -> Model {
    let d = SynthModel::default();
    tiny(&SynthModel {
        arch,
        // GPT-2 has no grouped-query attention
        n_kv_head: if arch == "gpt2" {
            d.n_head
        } else {
            d.n_kv_head
        },
        ..d
    })
}

/// Replaces one stage with a fixed pattern and records everything.
struct Replace {
    target: Stage,
    rec: Recorder,
}

impl StageSink for Replace {
    fn on_stage(&mut self, stage: Stage, positions: Range<usize>, width: usize, data: &mut [f32]) {
        if stage == self.target {
            for (i, v) in data.iter_mut().enumerate() {
                *v = (i % 7) as f32 * 0.25 - 0.5;
            }
        }
        self.rec.on_stage(stage, positions, width, data);
    }
}

#[test]
fn replacing_a_stage_changes_every_later_stage_and_nothing_earlier() {
    for arch in ARCHS {
        replace_each_target(&tiny_arch(arch));
    }
}

fn replace_each_target(model: &Model) {
    let order: Vec<Stage> = model.stages().into_iter().map(|(s, _)| s).collect();
    // the rotated keys, or (GPT-2: no RoPE) the values, the last of q, k, v to be emitted
    let keys = [StageKind::KRope, StageKind::V]
        .map(|k| Stage::block(0, k))
        .into_iter()
        .find(|s| order.contains(s))
        .unwrap();
    for target in [
        Stage::block(0, StageKind::AttnNorm),
        keys,
        Stage::block(1, StageKind::FfnAct),
        Stage::global(StageKind::OutputNorm),
    ] {
        let mut base = Recorder::new();
        let base_logits = record(model, &PROMPT, NumericsMode::Reference, &mut base);
        let mut rep = Replace {
            target,
            rec: Recorder::new(),
        };
        let rep_logits = record(model, &PROMPT, NumericsMode::Reference, &mut rep);
        let at = order.iter().position(|s| *s == target).unwrap();
        for (i, s) in order.iter().enumerate() {
            let a = &base.get(*s).unwrap().data;
            let b = &rep.rec.get(*s).unwrap().data;
            let arch = &model.info().arch;
            if i < at {
                assert_eq!(a, b, "{arch}: replacing {target} changed earlier stage {s}");
            } else {
                assert_ne!(a, b, "{arch}: replacing {target} left stage {s} unchanged");
            }
        }
        assert_ne!(base_logits, rep_logits);
        // The logits returned are the logits stage as the sink saw it.
        assert_eq!(
            rep_logits,
            rep.rec.get(Stage::global(StageKind::Logits)).unwrap().data
        );
    }
}

#[test]
fn every_stage_is_emitted_with_its_declared_width() {
    for arch in ARCHS {
        every_stage_emitted(&tiny_arch(arch));
    }
}

fn every_stage_emitted(model: &Model) {
    let mut rec = Recorder::new();
    record(model, &PROMPT, NumericsMode::Ggml, &mut rec);
    let stages = model.stages();
    assert_eq!(rec.stages.len(), stages.len());
    for (s, w) in stages {
        let r = rec
            .get(s)
            .unwrap_or_else(|| panic!("stage {s} not emitted"));
        assert_eq!(r.width, w, "{s}");
        assert_eq!(r.positions, (0..PROMPT.len()).collect::<Vec<_>>(), "{s}");
        assert!(
            r.data.iter().all(|v| v.is_finite()),
            "{s} has non-finite values"
        );
    }
}

#[test]
fn kv_cache_decode_equals_full_reprefill_for_16_steps() {
    for arch in ARCHS {
        decode_equals_reprefill(&tiny_arch(arch));
    }
}

fn decode_equals_reprefill(model: &Model) {
    let n_vocab = model.info().n_vocab;
    for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
        let mut s = model.session(64, mode);
        let mut seq: Vec<u32> = PROMPT.to_vec();
        let mut last =
            model.forward(&mut s, &seq, None).unwrap()[(seq.len() - 1) * n_vocab..].to_vec();
        for step in 0..16 {
            let next = argmax(&last).unwrap();
            seq.push(next);
            last = model.forward(&mut s, &[next], None).unwrap().to_vec();
            let mut fresh = model.session(64, mode);
            let full = model.forward(&mut fresh, &seq, None).unwrap();
            let full_last = &full[(seq.len() - 1) * n_vocab..];
            // Reference mode: each position's arithmetic is the same in a batch and alone, equal to the
            // bit. Ggml mode mirrors llama.cpp, whose KQV sum runs in another order for a single token
            // than for a batch (ops::ggml_kqv_order): on the AVX-512 target the two orders agree while
            // every lane holds one product (≤ 16 positions), and stay within rounding afterwards.
            let arch = &model.info().arch;
            if mode == NumericsMode::Reference || seq.len() <= 16 {
                assert_eq!(
                    last, full_last,
                    "{arch}, mode {mode}, decode step {step}: cached decode differs from re-prefill"
                );
            } else {
                let num: f32 = last
                    .iter()
                    .zip(full_last)
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum();
                let den: f32 = full_last.iter().map(|b| b * b).sum();
                assert!(num / den < 1e-8, "{arch}, step {step}: NMSE {}", num / den);
            }
        }
        assert_eq!(s.n_past(), PROMPT.len() + 16);
    }
}

#[test]
fn each_architecture_emits_the_stages_its_blocks_have() {
    use StageKind::*;
    let kinds = |m: &Model| -> Vec<StageKind> {
        let mut k: Vec<StageKind> = m
            .stages()
            .into_iter()
            .filter(|(s, _)| s.layer == Some(1))
            .map(|(s, _)| s.kind)
            .collect();
        k.dedup();
        k
    };
    let llama = vec![
        AttnNorm, Q, K, V, QRope, KRope, AttnOut, AttnProj, FfnInp, FfnNorm, FfnGate, FfnUp,
        FfnAct, FfnOut, Out,
    ];
    assert_eq!(kinds(&tiny_arch("llama")), llama);
    assert_eq!(kinds(&tiny_arch("qwen2")), llama);
    // phi3's fused Q/K/V and gate+up matmuls emit the same stages, split
    assert_eq!(kinds(&tiny_arch("phi3")), llama);
    let gemma = vec![
        AttnNorm,
        Q,
        K,
        V,
        QNorm,
        KNorm,
        QRope,
        KRope,
        AttnOut,
        AttnProj,
        AttnPostNorm,
        FfnInp,
        FfnNorm,
        FfnGate,
        FfnUp,
        FfnAct,
        FfnOut,
        FfnPostNorm,
        Out,
    ];
    assert_eq!(kinds(&tiny_arch("gemma3")), gemma);
    // gemma2: gemma3's blocks without the per-head Q/K norms
    let gemma2: Vec<StageKind> = gemma
        .iter()
        .copied()
        .filter(|k| !matches!(k, QNorm | KNorm))
        .collect();
    assert_eq!(kinds(&tiny_arch("gemma2")), gemma2);
    // qwen3: llama's with the per-head Q/K norms before RoPE
    let qwen3: Vec<StageKind> = llama
        .iter()
        .flat_map(|&k| match k {
            V => vec![V, QNorm, KNorm],
            k => vec![k],
        })
        .collect();
    assert_eq!(kinds(&tiny_arch("qwen3")), qwen3);
    // stablelm: llama's stages (LayerNorm instead of RMSNorm, partial rotary); starcoder2: no gate
    assert_eq!(kinds(&tiny_arch("stablelm")), llama);
    let no_gate: Vec<StageKind> = llama.iter().copied().filter(|k| *k != FfnGate).collect();
    assert_eq!(kinds(&tiny_arch("starcoder2")), no_gate);
    let widths: Vec<(Stage, usize)> = tiny_arch("gemma3").stages();
    let w = |s| widths.iter().find(|(x, _)| *x == s).unwrap().1;
    assert_eq!(w(Stage::block(0, QNorm)), 64, "4 heads × 16");
    assert_eq!(w(Stage::block(0, KNorm)), 32, "2 kv heads × 16");
}

#[test]
fn qwen2_biases_are_added_after_the_projections() {
    // the same weights with and without biases: q/k/v differ by exactly the bias, rows alike
    let mut with = Recorder::new();
    record(
        &tiny_arch("qwen2"),
        &PROMPT,
        NumericsMode::Reference,
        &mut with,
    );
    let mut without = Recorder::new();
    record(
        &tiny_arch("llama"),
        &PROMPT,
        NumericsMode::Reference,
        &mut without,
    );
    let q = Stage::block(0, StageKind::Q);
    let (a, b) = (&with.get(q).unwrap().data, &without.get(q).unwrap().data);
    let width = with.get(q).unwrap().width;
    let d0: Vec<f32> = (0..width).map(|i| a[i] - b[i]).collect();
    for t in 1..PROMPT.len() {
        for i in 0..width {
            let d = a[t * width + i] - b[t * width + i];
            assert!((d - d0[i]).abs() < 1e-5, "position {t}, column {i}");
        }
    }
    assert!(d0.iter().any(|&d| d.abs() > 1e-3), "no bias was added");
}

#[test]
fn gemma3_sliding_window_limits_what_a_position_sees() {
    // window 3, two local layers: position 6 sees tokens 6 − 2·(3 − 1) = 2 .. 6 only
    use lockstep_engine::synth::TINY_GEMMA3_WINDOW;
    assert_eq!(TINY_GEMMA3_WINDOW, 3);
    let last = |arch: &'static str, first: u32, mode: NumericsMode| {
        let m = tiny_arch(arch);
        let v = m.info().n_vocab;
        let mut p = PROMPT;
        p[0] = first;
        let mut s = m.session(16, mode);
        m.forward(&mut s, &p, None).unwrap()[6 * v..7 * v].to_vec()
    };
    for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
        assert_eq!(
            last("gemma3", 40, mode),
            last("gemma3", 41, mode),
            "{mode}: token 0 leaked into position 6"
        );
        assert_ne!(
            last("llama", 40, mode),
            last("llama", 41, mode),
            "{mode}: llama attends to every position"
        );
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let model = tiny(&SynthModel {
        d_ff: 256,
        ..SynthModel::default()
    });
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut s = model.session(16, NumericsMode::Ggml);
            model.forward(&mut s, &PROMPT, None).unwrap().to_vec()
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn ggml_mode_gives_the_same_bits_with_simd_on_for_every_matrix_type_and_thread_count() {
    let simd = lockstep_engine::Simd::detect();
    for (matrix_type, embd_type) in [
        (GgmlType::Q4_1, GgmlType::Q8_0),
        (GgmlType::Q8_0, GgmlType::Q8_0),
        (GgmlType::Q5_0, GgmlType::Q8_0),
        (GgmlType::Q4_0, GgmlType::Q4_1),
    ] {
        let model = tiny(&SynthModel {
            d_ff: 256,
            matrix_type,
            embd_type,
            ..SynthModel::default()
        });
        let run = |threads: usize, simd: lockstep_engine::Simd| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut s = model.session(24, NumericsMode::Ggml);
                s.set_simd(simd);
                // a prompt batch, then decode steps (both kernel paths)
                let mut out = model.forward(&mut s, &PROMPT, None).unwrap().to_vec();
                for t in [5, 9, 2] {
                    out.extend(model.forward(&mut s, &[t], None).unwrap());
                }
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            })
        };
        let scalar = run(1, lockstep_engine::Simd::Off);
        assert_eq!(scalar, run(1, simd), "{matrix_type}: simd {simd}, 1 thread");
        assert_eq!(
            scalar,
            run(3, simd),
            "{matrix_type}: simd {simd}, 3 threads"
        );
    }
}

#[test]
fn modes_agree_closely_but_not_exactly() {
    let model = tiny(&SynthModel::default());
    let mut a = model.session(16, NumericsMode::Reference);
    let la = model.forward(&mut a, &PROMPT, None).unwrap().to_vec();
    let mut b = model.session(16, NumericsMode::Ggml);
    let lb = model.forward(&mut b, &PROMPT, None).unwrap().to_vec();
    assert_ne!(la, lb, "ggml mode must quantize activations");
    let num: f32 = la.iter().zip(&lb).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = la.iter().map(|x| x * x).sum();
    assert!(num / den < 1e-3, "modes differ by NMSE {}", num / den);
}

#[test]
fn bad_inputs_are_errors() {
    let model = tiny(&SynthModel::default());
    let mut s = model.session(4, NumericsMode::Reference);
    let e = model
        .forward(&mut s, &[100_000], None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    let e = model
        .forward(&mut s, &[1, 2, 3, 4, 5], None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("context overflow"), "{e}");
    assert!(model.forward(&mut s, &[], None).is_err());
}

#[test]
fn tokenizer_round_trips_and_parses_specials_on_request() {
    let model = tiny(&SynthModel::default());
    let tok = model.tokenizer();
    let ids = tok.encode("hello the<|im_end|>", true, false).unwrap();
    assert_eq!(tok.decode(&ids), "hello the<|im_end|>");
    // "he" + "ll" merge into "hell" (vocab id 3 + 256 + 2)
    assert!(ids.contains(&(3 + 256 + 2)), "{ids:?}");
    let ids = tok.encode("hi<|im_end|>", true, true).unwrap();
    assert_eq!(*ids.last().unwrap(), 2);
    assert!(tok.is_eog(2));
    // digits are split one by one (smollm pre-tokenizer)
    let ids = tok.encode("123", false, false).unwrap();
    assert_eq!(ids.len(), 3);
}

#[test]
fn forward_last_gives_the_last_row_of_forward_and_the_same_cache() {
    // every block runs on every position; only the head is restricted to the last one. Reference mode
    // and these ggml kernels (Q4_1, Q8_0: vec_dot for any batch) give the full forward's last row bit
    // for bit, and the decode steps after it see the same KV cache
    for arch in ARCHS {
        let model = tiny_arch(arch);
        let n_vocab = model.info().n_vocab;
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let mut full = model.session(16, mode);
            let mut last = model.session(16, mode);
            let want = model.forward(&mut full, &PROMPT, None).unwrap().to_vec();
            let mut rec = Recorder::new();
            let got = model
                .forward_last(&mut last, &PROMPT, Some(&mut rec))
                .unwrap()
                .to_vec();
            assert_eq!(got.len(), n_vocab, "{arch} {mode}");
            assert_eq!(got, want[(PROMPT.len() - 1) * n_vocab..], "{arch} {mode}");
            for kind in [StageKind::OutputNorm, StageKind::Logits] {
                let r = rec.get(Stage::global(kind)).unwrap();
                assert_eq!(
                    r.positions,
                    vec![PROMPT.len() - 1],
                    "{arch} {mode} {kind:?}"
                );
            }
            let blk = rec.get(Stage::parse("blk.0.out").unwrap()).unwrap();
            assert_eq!(blk.positions.len(), PROMPT.len(), "{arch} {mode}");
            for t in [5, 9] {
                let a = model.forward(&mut full, &[t], None).unwrap().to_vec();
                let b = model.forward_last(&mut last, &[t], None).unwrap().to_vec();
                assert_eq!(a, b, "{arch} {mode} decode");
            }
        }
    }
}

// ---- the encoder (bert): no KV cache, bidirectional attention, a pooled output ----------------------

/// A tiny seeded bert (widths of 64, Q4_1 matrices) and a prompt of its WordPiece vocabulary (94 tokens).
fn tiny_bert(matrix_type: GgmlType) -> Model {
    tiny(&SynthModel {
        arch: "bert",
        n_kv_head: 4,
        matrix_type,
        ..SynthModel::default()
    })
}

const BERT_PROMPT: [u32; 9] = [2, 87, 89, 90, 88, 89, 91, 40, 3];

#[test]
fn bert_stages_follow_the_encoder_and_end_in_the_pooled_embedding() {
    let model = tiny_bert(GgmlType::Q4_1);
    assert_eq!(model.output(), lockstep_engine::models::Output::Pooled);
    let stages = model.stages();
    let ids: Vec<String> = stages.iter().map(|(s, _)| s.to_string()).collect();
    assert_eq!(ids.first().map(String::as_str), Some("embed"));
    assert_eq!(ids.last().map(String::as_str), Some("pooled"));
    for id in [
        "blk.0.q",
        "blk.0.attn_out",
        "blk.0.ffn_inp",
        "blk.1.ffn_act",
        "blk.1.out",
    ] {
        assert!(ids.iter().any(|s| s == id), "{id} missing from {ids:?}");
    }
    // no RoPE, no pre-norms, no output head
    for id in [
        "blk.0.q_rope",
        "blk.0.attn_norm",
        "blk.0.ffn_norm",
        "output_norm",
        "logits",
    ] {
        assert!(!ids.iter().any(|s| s == id), "{id} in {ids:?}");
    }
    let mut rec = Recorder::new();
    let out = record(&model, &BERT_PROMPT, NumericsMode::Ggml, &mut rec);
    assert_eq!(out.len(), model.info().d_model);
    assert_eq!(rec.stages.len(), stages.len());
    let n = BERT_PROMPT.len();
    for (s, w) in stages {
        let r = rec.get(s).unwrap();
        assert_eq!(r.width, w, "{s}");
        let want: Vec<usize> = if s.kind == StageKind::Pooled {
            vec![n - 1]
        } else {
            (0..n).collect()
        };
        assert_eq!(r.positions, want, "{s}");
        assert!(r.data.iter().all(|v| v.is_finite()), "{s}");
    }
    // the output is the pooled stage as the sink saw it; mean pooling of the last block (reference mode)
    assert_eq!(out, rec.get(Stage::global(StageKind::Pooled)).unwrap().data);
    let mut rec = Recorder::new();
    let out = record(&model, &BERT_PROMPT, NumericsMode::Reference, &mut rec);
    let last = &rec.get(Stage::block(1, StageKind::Out)).unwrap().data;
    let d = out.len();
    for (j, o) in out.iter().enumerate() {
        let mean = (0..n).map(|t| last[t * d + j]).sum::<f32>() / n as f32;
        assert!((o - mean).abs() < 1e-5, "dim {j}: {o} vs {mean}");
    }
}

#[test]
fn bert_replacing_a_stage_changes_every_later_stage_and_nothing_earlier() {
    let model = tiny_bert(GgmlType::Q4_1);
    let order: Vec<Stage> = model.stages().into_iter().map(|(s, _)| s).collect();
    for target in [
        Stage::global(StageKind::Embed),
        Stage::block(0, StageKind::AttnOut),
        Stage::block(1, StageKind::FfnAct),
        Stage::global(StageKind::Pooled),
    ] {
        let mut base = Recorder::new();
        let base_out = record(&model, &BERT_PROMPT, NumericsMode::Reference, &mut base);
        let mut rep = Replace {
            target,
            rec: Recorder::new(),
        };
        let rep_out = record(&model, &BERT_PROMPT, NumericsMode::Reference, &mut rep);
        let at = order.iter().position(|s| *s == target).unwrap();
        for (i, s) in order.iter().enumerate() {
            let (a, b) = (&base.get(*s).unwrap().data, &rep.rec.get(*s).unwrap().data);
            if i < at {
                assert_eq!(a, b, "replacing {target} changed earlier stage {s}");
            } else {
                assert_ne!(a, b, "replacing {target} left stage {s} unchanged");
            }
        }
        assert_ne!(base_out, rep_out);
    }
}

#[test]
fn bert_attention_sees_the_whole_sequence() {
    // bidirectional: the last token changes what the first position attends to (a causal model's first
    // position sees itself alone)
    let model = tiny_bert(GgmlType::Q8_0);
    let first_row = |tokens: &[u32]| {
        let mut rec = Recorder::new();
        record(&model, tokens, NumericsMode::Ggml, &mut rec);
        let r = rec.get(Stage::block(0, StageKind::AttnOut)).unwrap();
        r.data[..r.width].to_vec()
    };
    let mut other = BERT_PROMPT;
    other[7] = 41;
    assert_ne!(first_row(&BERT_PROMPT), first_row(&other));
}

#[test]
fn bert_has_no_decode_step_and_says_so() {
    let model = tiny_bert(GgmlType::Q4_1);
    let mut s = model.session(16, NumericsMode::Ggml);
    let a = model.forward(&mut s, &BERT_PROMPT, None).unwrap().to_vec();
    let e = model.forward(&mut s, &[5], None).unwrap_err().to_string();
    assert!(
        e.contains("encoder without a KV cache") && e.contains("reset"),
        "{e}"
    );
    s.reset();
    assert_eq!(a, model.forward(&mut s, &BERT_PROMPT, None).unwrap());
}

#[test]
fn bert_ggml_bits_do_not_depend_on_simd_or_threads() {
    let simd = lockstep_engine::Simd::detect();
    for matrix_type in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16] {
        let model = tiny_bert(matrix_type);
        let run = |threads: usize, simd: lockstep_engine::Simd| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut s = model.session(24, NumericsMode::Ggml);
                s.set_simd(simd);
                let out = model.forward(&mut s, &BERT_PROMPT, None).unwrap();
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            })
        };
        let scalar = run(1, lockstep_engine::Simd::Off);
        assert_eq!(scalar, run(1, simd), "{matrix_type}: simd {simd}");
        assert_eq!(scalar, run(3, simd), "{matrix_type}: 3 threads");
    }
}
