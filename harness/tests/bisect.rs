//! `lockstep bisect` on SmolLM2 against the committed goldens: an unbroken engine has no finding, and a
//! change of one element of one stage is named — layer, stage and phase — even where it is far below any
//! cosine or NMSE cutoff. Real model: `#[ignore]`d, run by `ci/test.sh`.

mod common;

use std::path::{Path, PathBuf};

use common::Corrupting;
use lockstep::bisect::{bisect, bisect_with, BisectOptions, Finding};
use lockstep::compare::Phase;
use lockstep::engine::LockstepEngine;
use lockstep_engine::{NumericsMode, Stage};

const MODEL: &str = "smollm2-135m-q4_1";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn options(prompt: &str, mode: NumericsMode) -> BisectOptions {
    BisectOptions {
        golden_dir: root().join("golden"),
        thresholds: root().join("ci/thresholds.toml"),
        model: MODEL.into(),
        prompt: prompt.into(),
        mode,
        oracle: "llama.cpp-f32kv".into(),
        ggml_target: None,
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn the_unbroken_engine_has_no_finding_in_ggml_mode() {
    let r = bisect(&options("prose", NumericsMode::Ggml)).unwrap();
    assert_eq!(r.finding, Finding::None, "{}", lockstep::bisect::render(&r));
    assert!(r.layers.iter().all(|l| l.local_exact));
    assert_eq!(r.layers.len(), 30);
}

#[test]
#[ignore = "real model: run by ci/test.sh"]
fn a_one_element_change_is_named_by_layer_stage_and_phase() {
    let model = lockstep::fetch::resolve_model(MODEL).unwrap();
    for (stage, value) in [("blk.7.ffn_up", 0.5f32), ("blk.19.attn_norm", 1e-3)] {
        let mut engine = Corrupting {
            inner: LockstepEngine::load(&model).unwrap(),
            target: Stage::parse(stage).unwrap(),
            value,
        };
        let r = bisect_with(&options("prose", NumericsMode::Ggml), &model, &mut engine).unwrap();
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
        // the layers before are exact with their reference input, the broken one is not
        let layer: usize = stage.split('.').nth(1).unwrap().parse().unwrap();
        for l in &r.layers {
            assert_eq!(l.local_exact, l.layer != layer, "layer {}: {text}", l.layer);
        }
    }
}
