//! Real-model tests on SmolLM2-135M-Instruct Q4_1. `#[ignore]`d so a plain `cargo test` stays offline;
//! `ci/test.sh` runs them (`--run-ignored all`), fetching the model into the cache on first use.

use lockstep::dump;
use lockstep::fetch::resolve_model;
use lockstep_engine::sample::argmax;
use lockstep_engine::GgmlTarget;
use lockstep_engine::{Model, NumericsMode, Simd};

const MODEL: &str = "smollm2-135m-q4_1";

fn model() -> Model {
    let path = resolve_model(MODEL).expect("fetch the SmolLM2 model (needs PyPI on first use)");
    Model::load(&path).expect("load SmolLM2")
}

/// Greedy continuation through the KV cache, one token per forward call.
fn greedy(model: &Model, prompt: &[u32], n: usize, mode: NumericsMode) -> Vec<u32> {
    let v = model.info().n_vocab;
    let mut s = model.session(prompt.len() + n, mode);
    let logits = model.forward(&mut s, prompt, None).unwrap();
    let mut next = argmax(&logits[(prompt.len() - 1) * v..]).unwrap();
    let mut out = vec![next];
    while out.len() < n {
        next = argmax(model.forward(&mut s, &[next], None).unwrap()).unwrap();
        out.push(next);
    }
    out
}

#[test]
#[ignore = "real model: run by ci/test.sh (fetches ~98 MB on first use)"]
fn smollm2_tokenizes_like_llama_cpp() {
    let m = model();
    let tok = m.tokenizer();
    // SmolLM2's GGUF sets add_bos_token = false; digits split one by one (pre-tokenizer `smollm`).
    assert!(!tok.adds_bos());
    let ids = tok.encode("The capital of France is", true, false).unwrap();
    assert_eq!(tok.decode(&ids), "The capital of France is");
    assert_eq!(ids.len(), 5, "{ids:?}");
    let ids = tok.encode("2024", true, false).unwrap();
    assert_eq!(ids.len(), 4);
    let chat = tok
        .encode("<|im_start|>user\nHi<|im_end|>", true, true)
        .unwrap();
    assert_eq!(chat[0], 1);
    assert_eq!(*chat.last().unwrap(), 2);
}

#[test]
#[ignore = "real model: run by ci/test.sh (fetches ~98 MB on first use)"]
fn smollm2_generates_paris_and_prefill_agrees_with_decode() {
    let m = model();
    let tok = m.tokenizer();
    let prompt = tok.encode("The capital of France is", true, false).unwrap();
    for mode in [NumericsMode::Ggml, NumericsMode::Reference] {
        let cont = greedy(&m, &prompt, 12, mode);
        let text = tok.decode(&cont);
        assert!(text.contains("Paris"), "mode {mode}: continuation {text:?}");
        // Re-prefill the prompt plus the continuation in one batch: every row's argmax is the next token.
        let mut all = prompt.clone();
        all.extend(&cont);
        let d = dump::run(
            &m,
            &all[..all.len() - 1],
            mode,
            GgmlTarget::host(),
            Simd::detect(),
        )
        .unwrap();
        for (i, row) in d
            .logits
            .as_ref()
            .unwrap()
            .rows()
            .into_iter()
            .enumerate()
            .skip(prompt.len() - 1)
        {
            let top = argmax(row.as_slice().unwrap()).unwrap();
            assert_eq!(
                top,
                all[i + 1],
                "mode {mode}: position {i}: prefill top-1 differs from decode"
            );
        }
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh (fetches ~98 MB on first use)"]
fn smollm2_dump_writes_every_stage_for_a_20_token_prompt() {
    let m = model();
    let text = "In 1969, two astronauts walked on the Moon while a third orbited above; millions watched live.";
    let tokens: Vec<u32> = m
        .tokenizer()
        .encode(text, true, false)
        .unwrap()
        .into_iter()
        .take(20)
        .collect();
    assert_eq!(tokens.len(), 20);
    let dir = tempfile::tempdir().unwrap();
    for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
        let d = dump::run(&m, &tokens, mode, GgmlTarget::host(), Simd::Off).unwrap();
        if mode == NumericsMode::Ggml {
            // SIMD on gives the scalar ggml mode's bits in every stage and the logits
            let simd = dump::run(&m, &tokens, mode, GgmlTarget::host(), Simd::detect()).unwrap();
            let bits = |a: &ndarray::Array2<f32>| a.mapv(f32::to_bits);
            assert_eq!(
                bits(simd.logits.as_ref().unwrap()),
                bits(d.logits.as_ref().unwrap()),
                "logits differ with SIMD {}",
                Simd::detect()
            );
            for (id, a) in &d.stages {
                assert_eq!(
                    bits(&simd.stages[id]),
                    bits(a),
                    "stage {id} differs with SIMD {}",
                    Simd::detect()
                );
            }
        }
        let path = dir.path().join(format!("{mode}.npz"));
        dump::write(&path, &d).unwrap();
        let back = dump::read(&path).unwrap();
        assert_eq!(back, d);
        assert_eq!(back.tokens, tokens);
        let logits = back.logits.as_ref().unwrap();
        assert_eq!(logits.dim(), (20, 49152));
        // embed + 30 blocks × 15 stages + output_norm
        assert_eq!(back.stages.len(), 1 + 30 * 15 + 1);
        assert_eq!(back.stages["blk.29.out"].dim(), (20, 576));
        assert_eq!(back.stages["blk.0.k_rope"].dim(), (20, 192));
        assert_eq!(back.stages["blk.7.ffn_act"].dim(), (20, 1536));
        // The last row's top-1 equals the generate path's first token.
        let first = greedy(&m, &tokens, 1, mode)[0];
        assert_eq!(argmax(logits.row(19).as_slice().unwrap()), Some(first));
    }
}

#[test]
#[ignore = "real model: run by ci/test.sh (fetches ~98 MB and the brotli sdist on first use)"]
fn smollm2_quality_on_alice29_against_itself() {
    // the registered corpus, fetched and sha256-checked; SmolLM2 Q4_1 scored against itself: zero KLD,
    // the same top token everywhere, PPL(Q) = PPL(base)
    let path = resolve_model(MODEL).expect("fetch the SmolLM2 model");
    let dir = tempfile::tempdir().unwrap();
    let opts = lockstep::quality::QualityOptions {
        base: path.clone(),
        variants: vec![path],
        corpus: "alice29".into(),
        params: lockstep::quality::Params {
            n_ctx: 512,
            n_chunks: 2,
            mode: NumericsMode::Ggml,
            simd: Simd::parse("auto").unwrap(),
            full_kl_chunks: 0,
            window: lockstep::quality::WINDOW,
            max_kept: 64,
        },
        threads: 2,
        cache_root: dir.path().join("cache"),
        reports_root: dir.path().join("reports"),
        golden_manifest: dir.path().join("none"),
        llama_perplexity: None,
        check_types: vec![],
        llama_timeout: std::time::Duration::from_secs(3600),
    };
    let (r, out) = lockstep::quality::run(&opts, &mut |_| {}).unwrap();
    assert!(out.join("quality.md").is_file());
    assert_eq!(
        r.corpus.sha256,
        "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0"
    );
    assert_eq!(r.corpus_tokens, 41933);
    let s = r.models[0].variants[0].stats.as_ref().unwrap();
    assert_eq!(s.count, 2 * 255);
    assert!(s.kld.value.abs() < 1e-6, "{}", s.kld.value);
    assert_eq!(s.same_top_p.value, 1.0);
    assert!((s.ppl_q.value - s.ppl_base.value).abs() < 1e-3 * s.ppl_base.value);
    assert!(
        s.ppl_base.value > 1.0 && s.ppl_base.value < 100.0,
        "{}",
        s.ppl_base.value
    );
}
