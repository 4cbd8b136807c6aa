//! `lockstep bisect` on SmolLM2 against the committed goldens: an unbroken engine has no finding, and a
//! change of one element of one stage is named — layer, stage and phase — even where it is far below any
//! cosine or NMSE cutoff. Real model: `#[ignore]`d, run by `ci/test.sh`.

mod common;

use common::{root, Corrupting};
use lockstep::bisect::{bisect, bisect_with, BisectOptions, Finding};
use lockstep::compare::Phase;
use lockstep::engine::LockstepEngine;
use lockstep_engine::{NumericsMode, Stage};

const MODEL: &str = "smollm2-135m-q4_1";

fn options_for(model: &str, prompt: &str, mode: NumericsMode) -> BisectOptions {
    BisectOptions {
        golden_dir: root().join("golden"),
        thresholds: root().join("ci/thresholds.toml"),
        model: model.into(),
        prompt: prompt.into(),
        mode,
        oracle: "llama.cpp-f32kv".into(),
        ggml_target: None,
        floors: root().join("ci/floors.json"),
        // the fastest kernels: ggml mode's bits do not depend on them, reference mode has none
        simd: lockstep_engine::Simd::detect(),
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn the_unbroken_engine_has_no_finding_in_ggml_mode() {
    // SmolLM2's goldens store layer outputs in f32; Gemma 3's and Qwen2.5's in f16, where bisect injects
    // the engine's own rows that round to the stored ones
    for (model, n_layer) in [
        (MODEL, 30),
        ("gemma3-270m-q4_k_m", 18),
        ("qwen2.5-coder-0.5b-q4_k_m", 24),
    ] {
        let r = bisect(&options_for(model, "prose", NumericsMode::Ggml)).unwrap();
        let text = lockstep::bisect::render(&r);
        assert_eq!(r.finding, Finding::None, "{model}: {text}");
        assert!(r.layers.iter().all(|l| l.local_exact), "{model}: {text}");
        assert_eq!(r.layers.len(), n_layer, "{model}");
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn a_one_element_change_is_named_by_layer_stage_and_phase() {
    for (id, stage, value) in [
        (MODEL, "blk.7.ffn_up", 0.5f32),
        (MODEL, "blk.19.attn_norm", 1e-3),
        // f16-stored layer outputs: the layers before are injected with the engine's own rows
        ("gemma3-270m-q4_k_m", "blk.5.ffn_up", 0.5),
    ] {
        let model = lockstep::fetch::resolve_model(id).unwrap();
        let mut engine = Corrupting {
            inner: LockstepEngine::load(&model)
                .unwrap()
                .with_simd(lockstep_engine::Simd::detect()),
            target: Stage::parse(stage).unwrap(),
            value,
        };
        let opts = options_for(id, "prose", NumericsMode::Ggml);
        let r = bisect_with(&opts, &model, &mut engine).unwrap();
        let text = lockstep::bisect::render(&r);
        match &r.finding {
            Finding::Structural { at, .. } => {
                assert_eq!(
                    (at.stage.as_str(), at.phase),
                    (stage, Phase::Prefill),
                    "{text}"
                );
            }
            other => panic!("{stage}: {other:?}\n{text}"),
        }
        assert!(text.contains("<--"), "{text}");
        // the layers before are exact with their reference input, the broken one is not; after it, an
        // f32-stored golden hands every layer its exact input again, an f16-stored one only rounded rows
        let layer: usize = stage.split('.').nth(1).unwrap().parse().unwrap();
        let f32_outputs = id == MODEL;
        for l in &r.layers {
            if l.layer < layer || l.layer > layer && f32_outputs {
                assert!(l.local_exact, "layer {}: {text}", l.layer);
            } else if l.layer == layer {
                assert!(!l.local_exact, "layer {}: {text}", l.layer);
            }
        }
    }
}

/// A golden that stores no layer output cannot localize anything, and bisect says so: what the golden
/// stores, and the golden of the same prompt that has the layer outputs (the transformers one). A failing
/// gate is never reported as "no divergence" and never exits 0 (`is_clean`).
#[test]
#[ignore = "real model: run by ci/test.sh"]
fn a_golden_without_layer_outputs_says_it_cannot_localize() {
    let r = bisect(&options_for(
        "gemma3-270m-q4_k_m",
        "chinese",
        NumericsMode::Reference,
    ))
    .unwrap();
    let text = lockstep::bisect::render(&r);
    let note = r
        .unlocalized
        .as_deref()
        .expect("the chinese golden stores no blk.N.out");
    assert!(note.contains("stores output_norm and the logits"), "{note}");
    assert!(
        note.contains(
            "gemma3-270m-q4_k_m/transformers-f32/chinese.npz (--oracle transformers-f32)"
        ),
        "{note}"
    );
    assert!(text.starts_with("cannot localize: "), "{text}");
    assert!(r.layers.is_empty(), "{text}");
    assert_eq!(r.is_clean(), r.gate.pass && r.finding == Finding::None);
    if !r.gate.pass {
        assert!(
            text.contains("the gate fails on what the golden stores"),
            "{text}"
        );
        assert!(!text.contains("no divergence"), "{text}");
    }
    // the golden it names localizes: every layer has a row
    let mut opts = options_for("gemma3-270m-q4_k_m", "chinese", NumericsMode::Reference);
    opts.oracle = "transformers-f32".into();
    let t = bisect(&opts).unwrap();
    let ttext = lockstep::bisect::render(&t);
    assert!(t.unlocalized.is_none(), "{ttext}");
    assert_eq!(t.layers.len(), 18, "{ttext}");
}
