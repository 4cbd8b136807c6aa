//! The committed goldens agree with `golden/manifest.json`, and the checks that say so catch
//! damage (each reported with the file's name).
//!
//! `cargo test -p lockstep --test goldens`. These tests never skip: a missing golden directory,
//! manifest or file is a failure.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use lockstep::golden::{
    check_model, load_manifest, read_array_f32, read_tokens, verify_golden, Dtype, GoldenEntry,
    GoldenFile, Manifest,
};

const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("golden")
}

fn manifest() -> Manifest {
    load_manifest(&golden_dir()).unwrap_or_else(|e| panic!("{e:#}"))
}

/// All `.npz` files under `dir`, relative, with `/` separators; a subdirectory with a `manifest.json` of
/// its own is another golden directory (`golden/avx2/`) and is left out.
fn npz_files(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() && p.join("manifest.json").is_file() {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else if p.extension().is_some_and(|x| x == "npz") {
                let rel = p.strip_prefix(root).unwrap();
                let parts: Vec<_> = rel.iter().map(|c| c.to_string_lossy()).collect();
                out.insert(parts.join("/"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn every_golden_matches_the_manifest() {
    let dir = golden_dir();
    let m = manifest();
    assert!(
        !m.goldens.is_empty(),
        "{} lists no goldens",
        dir.join("manifest.json").display()
    );
    let errors: Vec<String> = m
        .goldens
        .iter()
        .filter_map(|g| verify_golden(&dir, g).err().map(|e| format!("{e:#}")))
        .collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));

    let listed: BTreeSet<String> = m.goldens.iter().map(|g| g.path.clone()).collect();
    assert_eq!(listed.len(), m.goldens.len(), "a path is listed twice");
    let on_disk = npz_files(&dir);
    let unlisted: Vec<_> = on_disk.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "golden files not listed in golden/manifest.json: {unlisted:?}"
    );
}

/// golden/avx2/: goldens of an AVX2-only llama.cpp made on a bigger host (`LOCKSTEP_ORACLE_CPU=avx2`),
/// in a manifest of their own. Each is intact and listed, records the real host and the build's flags,
/// and selects the AVX2 target although its host has AVX-512.
#[test]
fn avx2_build_goldens_match_their_manifest_and_select_the_avx2_target() {
    let dir = golden_dir().join("avx2");
    let m = load_manifest(&dir).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(!m.goldens.is_empty());
    for g in &m.goldens {
        verify_golden(&dir, g).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(g.oracle.extra["ggml_cpu_build"], "avx2", "{}", g.path);
        let host = g.oracle.host_cpu_flags().expect("host_cpu_flags");
        let build = g.oracle.ggml_cpu_flags().expect("ggml_cpu_flags");
        assert!(build.iter().all(|f| host.contains(f)), "{}", g.path);
        assert!(!build.iter().any(|f| f.starts_with("avx512")), "{}", g.path);
        assert_eq!(
            g.oracle.ggml_target().unwrap(),
            lockstep_engine::GgmlTarget::Avx2,
            "{}",
            g.path
        );
        // the variant it was made from is registered (same file as golden/manifest.json's)
        let main = manifest();
        let twin = main
            .find(&g.model_id, "llama.cpp", "f32", &g.prompt_id)
            .expect("the same variant in golden/manifest.json");
        assert_eq!(twin.model_sha256, g.model_sha256, "{}", g.path);
        assert_eq!(
            (&twin.prompt, twin.n_prompt_tokens),
            (&g.prompt, g.n_prompt_tokens),
            "{}",
            g.path
        );
    }
    let listed: BTreeSet<String> = m.goldens.iter().map(|g| g.path.clone()).collect();
    assert_eq!(npz_files(&dir), listed);
}

#[test]
fn llama_cpp_goldens_cover_the_prompts_and_both_kv_types() {
    let m = manifest();
    let model = "smollm2-135m-q4_1";
    let prompts = ["prose", "code", "chinese", "passage", "one_token", "chat"];
    for p in prompts {
        for kv in ["f32", "f16"] {
            let g = m
                .find(model, "llama.cpp", kv, p)
                .unwrap_or_else(|| panic!("no llama.cpp {kv}-KV golden for {model} / {p}"));
            assert_eq!(g.model_sha256, SMOLLM2_SHA256, "{}", g.path);
            assert_eq!(g.settings.type_k.as_deref(), Some(kv), "{}", g.path);
            assert_eq!(
                g.settings.flash_attn.as_deref(),
                Some("disabled"),
                "{}",
                g.path
            );
            assert!(g.n_decode_steps >= 8, "{}", g.path);
            assert_eq!(g.capture_changes_logits, 0.0, "{}", g.path);
            assert!(g.oracle.llama_cpp_commit.is_some(), "{}", g.path);
        }
    }
    let one = m.find(model, "llama.cpp", "f32", "one_token").unwrap();
    assert_eq!(one.n_prompt_tokens, 1);
    let passage = m.find(model, "llama.cpp", "f32", "passage").unwrap();
    assert!(passage.n_prompt_tokens >= 60);
}

#[test]
fn every_seeded_model_and_variant_has_its_goldens() {
    // [[synth]] of models.toml and their [[variants]]: a llama.cpp f32-KV golden of the prompt `synth` (made
    // from exactly that file, crossing the window of 4, 8 decode steps, every stage for the F32 file), and a
    // transformers-f32 golden wherever the transformers oracle has a stage map for the architecture
    let m = manifest();
    let reg = lockstep::registry::Registry::active().unwrap();
    assert!(reg.synth.len() >= 8, "the seeded architectures");
    let mut ids: Vec<(&str, &str, &str, bool)> = Vec::new();
    for s in &reg.synth {
        ids.push((&s.id, &s.sha256, &s.arch, true));
    }
    // (the Hugging Face copies are held to their source's goldens: harness/tests/gate.rs)
    for v in reg.variants.iter().filter(|v| !v.is_hf()) {
        if let Some(s) = reg.synth(&v.source) {
            ids.push((&v.id, &v.sha256, &s.arch, false));
        }
    }
    assert!(ids.len() >= 8 * 7, "six variants each");
    for (id, sha, arch, base) in ids {
        let g = m
            .find(id, "llama.cpp", "f32", "synth")
            .unwrap_or_else(|| panic!("no llama.cpp golden for seeded model {id}"));
        assert_eq!(g.model_sha256, sha, "{}", g.path);
        assert_eq!(g.arch, arch, "{}", g.path);
        if g.is_encoder() {
            // an encoder (bert): one prefill of its 8 WordPiece tokens, no logits, no decode steps, the
            // pooled embedding as its output; every stage for the F32 file
            assert_eq!(arch, "bert", "{}", g.path);
            assert_eq!(g.n_prompt_tokens, 8, "{}", g.path);
            assert_eq!(g.n_decode_steps, 0, "{}", g.path);
            assert_eq!(g.capture_changes_logits, 0.0, "{}", g.path);
            assert!(
                !g.arrays
                    .keys()
                    .any(|a| a.starts_with("logits") || a.starts_with("decode.")),
                "{}",
                g.path
            );
            assert_eq!(g.arrays["pooled"].shape, [1, 256], "{}", g.path);
            for a in ["tokens", "blk.0.out", "blk.1.out"] {
                assert!(g.arrays.contains_key(a), "{}: no {a}", g.path);
            }
            if base {
                for a in [
                    "embed",
                    "blk.0.q",
                    "blk.0.attn_out",
                    "blk.1.ffn_act",
                    "blk.1.ffn_inp",
                ] {
                    assert!(g.arrays.contains_key(a), "{}: no {a}", g.path);
                }
            }
            let t = m
                .find(id, "transformers", "f32", "synth")
                .unwrap_or_else(|| panic!("no transformers golden for seeded encoder {id}"));
            assert_eq!(t.model_sha256, sha, "{}", t.path);
            assert!(
                t.is_encoder() && t.arrays.contains_key("pooled"),
                "{}",
                t.path
            );
            assert_all_f32(t);
            continue;
        }
        assert!(g.n_prompt_tokens > 8, "{}", g.path);
        assert_eq!(g.n_decode_steps, 8, "{}", g.path);
        assert_eq!(g.capture_changes_logits, 0.0, "{}", g.path);
        for a in [
            "tokens",
            "logits",
            "decode.tokens",
            "decode.logits",
            "blk.0.out",
            "blk.1.out",
        ] {
            assert!(g.arrays.contains_key(a), "{}: no {a}", g.path);
        }
        if base {
            for a in ["embed", "blk.0.attn_norm", "blk.1.ffn_act", "output_norm"] {
                assert!(g.arrays.contains_key(a), "{}: no {a}", g.path);
            }
        }
        if m.stage_map("transformers", arch).is_some() {
            let t = m
                .find(id, "transformers", "f32", "synth")
                .unwrap_or_else(|| panic!("no transformers golden for seeded model {id}"));
            assert_eq!(t.model_sha256, sha, "{}", t.path);
            assert_all_f32(t);
        }
    }
}

/// A seeded model's transformers-f32 golden stores every array f32 (token ids i32): issue 42, the f16 storage of
/// its stages put a ~1e-7 NMSE floor under comparisons at the float32 floor (~1e-13).
fn assert_all_f32(t: &GoldenEntry) {
    for (name, spec) in &t.arrays {
        assert!(
            matches!(spec.dtype, Dtype::F32 | Dtype::I32),
            "{}: {name} is stored {:?}",
            t.path,
            spec.dtype
        );
    }
}

#[test]
fn every_registered_variant_has_compact_goldens_of_both_kv_types() {
    // the quant axis: each [[variants]] file of models.toml has its own goldens (oracles/README.md
    // "Quantization variants"), made from exactly that file, on a recorded host
    let m = manifest();
    let reg = lockstep::registry::Registry::active().unwrap();
    // the downloaded model's variants (those of the seeded models: the test below)
    let variants: Vec<_> = reg
        .variants
        .iter()
        .filter(|v| reg.synth(&v.source).is_none())
        .collect();
    assert_eq!(variants.len(), 14, "the 14 types of make_variants.sh");
    for v in variants {
        for kv in ["f32", "f16"] {
            let g = m
                .find(&v.id, "llama.cpp", kv, "prose")
                .unwrap_or_else(|| panic!("no llama.cpp {kv}-KV golden for variant {}", v.id));
            assert_eq!(g.model_sha256, v.sha256, "{}", g.path);
            assert_eq!(g.model_file, v.file_name(), "{}", g.path);
            assert_eq!(g.arch, "llama", "{}", g.path);
            assert_eq!(g.settings.type_k.as_deref(), Some(kv), "{}", g.path);
            // batched prefill paths of llama.cpp differ at batch >= 4 and >= 8: the prompt must reach them
            assert!(g.n_prompt_tokens >= 9, "{}", g.path);
            assert_eq!(g.n_decode_steps, 8, "{}", g.path);
            assert_eq!(g.capture_changes_logits, 0.0, "{}", g.path);
            assert!(
                g.oracle.host_cpu_flags().is_some(),
                "{}: no host CPU recorded",
                g.path
            );
            let rec = &g.extra["variant"];
            assert_eq!(rec["source_model"], v.source.as_str(), "{}", g.path);
            assert_eq!(rec["type"], v.qtype.as_str(), "{}", g.path);
            assert_eq!(rec["recipe"], v.recipe().as_str(), "{}", g.path);
            for a in [
                "tokens",
                "logits",
                "logits_topk",
                "decode.tokens",
                "logits_decode_topk",
            ] {
                assert!(g.arrays.contains_key(a), "{}: no {a}", g.path);
            }
        }
        let g = m.find(&v.id, "llama.cpp", "f32", "prose").unwrap();
        let n_layer = 30;
        for n in 0..n_layer {
            assert!(
                g.arrays.contains_key(&format!("blk.{n}.out")),
                "{}: no blk.{n}.out",
                g.path
            );
        }
        for a in ["output_norm", "decode.output_norm"] {
            assert!(g.arrays.contains_key(a), "{}: no {a}", g.path);
        }
        // the gated golden keeps its logits in f32
        assert_eq!(g.arrays["logits"].dtype, Dtype::F32, "{}", g.path);
        let f16 = m.find(&v.id, "llama.cpp", "f16", "prose").unwrap();
        assert!(
            f16.extra.contains_key("vs_f32kv"),
            "{}: no noise floor",
            f16.path
        );
    }
}

/// The transformers-f32 goldens (oracles/transformers): one per llama.cpp-f32kv golden of each downloaded
/// model, fed the same token ids (prompt and teacher-forced decode), recording the library versions, the
/// host's CPU flags (ggml mode's target) and the float32-vs-float64 floor; every stored stage resolves
/// through `stage_map.transformers.<arch>`; the residual stream of every layer in every golden, and every
/// stage of every layer, in f32, in `one_token`.
#[test]
fn transformers_goldens_mirror_the_llama_cpp_f32kv_token_ids() {
    let dir = golden_dir();
    let m = manifest();
    for model in [
        "smollm2-135m-q4_1",
        "gemma3-270m-q4_k_m",
        "qwen2.5-coder-0.5b-q4_k_m",
    ] {
        let sources: Vec<&GoldenEntry> = m
            .goldens
            .iter()
            .filter(|g| g.model_id == model && g.oracle.name == "llama.cpp" && g.kv_type == "f32")
            // a compact golden (Gemma 3's `long_window`, past the sliding window) has no transformers twin: the
            // transformers goldens store every position's residual stream in f32 (~25 MB at 540 tokens)
            .filter(|g| !g.is_compact())
            .collect();
        assert!(sources.len() >= 6, "{model}: llama.cpp-f32kv goldens");
        for src in sources {
            let g = m
                .find(model, "transformers", "f32", &src.prompt_id)
                .unwrap_or_else(|| {
                    panic!("no transformers golden for {model} / {}", src.prompt_id)
                });
            assert_eq!(
                g.path,
                format!("{model}/transformers-f32/{}.npz", src.prompt_id)
            );
            verify_golden(&dir, g).unwrap_or_else(|e| panic!("{e:#}"));
            assert_eq!(g.model_sha256, src.model_sha256, "{}", g.path);
            assert_eq!(
                (&g.prompt, g.add_special, g.parse_special),
                (&src.prompt, src.add_special, src.parse_special),
                "{}",
                g.path
            );
            let seq = |e: &GoldenEntry| GoldenFile::open(&dir, e).unwrap().read_sequence().unwrap();
            assert_eq!(
                seq(g),
                seq(src),
                "{}: not the llama.cpp golden's token ids",
                g.path
            );
            for k in ["torch", "transformers", "gguf", "dtype", "host_cpu"] {
                assert!(
                    g.oracle.extra.get(k).and_then(|v| v.as_str()).is_some(),
                    "{}: oracle.{k}",
                    g.path
                );
            }
            assert_eq!(g.oracle.extra["dtype"], "float32", "{}", g.path);
            g.oracle
                .ggml_target()
                .unwrap_or_else(|e| panic!("{}: {e:#}", g.path));
            let floor = &g.extra["floor_f32_vs_f64"];
            for kind in ["out", "output_norm", "logits"] {
                let max = floor["nmse"][kind]["max"].as_f64().unwrap();
                assert!(
                    (0.0..1e-6).contains(&max),
                    "{}: floor of {kind} {max}",
                    g.path
                );
            }
            let map = m
                .stage_map("transformers", &g.arch)
                .unwrap_or_else(|| panic!("no stage_map.transformers.{}", g.arch));
            for s in g.prefill_stages().chain(g.decode_stages()) {
                assert!(
                    map.oracle_node(s).is_some(),
                    "{}: stage {s} not in the map",
                    g.path
                );
            }
            let n_layer = g.extra["model_hparams"]["n_layer"].as_u64().unwrap();
            for n in 0..n_layer {
                assert!(
                    g.arrays.contains_key(&format!("blk.{n}.out")),
                    "{}: blk.{n}.out",
                    g.path
                );
            }
        }
        // every stage the llama.cpp oracle captures (its fully staged `prose`) in `one_token`, f32 but for
        // ffn_gate / ffn_up (f16 by the storage criterion: golden budget; their product ffn_act is f32)
        let full = m.find(model, "transformers", "f32", "one_token").unwrap();
        let lc = m.find(model, "llama.cpp", "f32", "prose").unwrap();
        for s in lc.prefill_stages() {
            let spec = full
                .arrays
                .get(s)
                .unwrap_or_else(|| panic!("{}: no stage {s}", full.path));
            if !(s.ends_with(".ffn_gate") || s.ends_with(".ffn_up")) {
                assert_eq!(spec.dtype, Dtype::F32, "{} {s}", full.path);
            }
        }
    }
}

#[test]
fn stage_map_resolves_llama_stages() {
    let m = manifest();
    let map = m
        .stage_map("llama.cpp", "llama")
        .expect("golden/manifest.json has no stage_map.llama.cpp.llama");
    let node = |c: &str| {
        let n = map
            .oracle_node(c)
            .unwrap_or_else(|| panic!("no oracle node for {c}"));
        (n.name, n.op)
    };
    assert_eq!(node("embed"), ("embd".into(), "GET_ROWS".into()));
    assert_eq!(node("blk.0.q"), ("Qcur-0".into(), "MUL_MAT".into()));
    assert_eq!(node("blk.29.q_rope"), ("Qcur-29".into(), "ROPE".into()));
    assert_eq!(node("blk.4.k_rope"), ("Kcur-4".into(), "ROPE".into()));
    assert_eq!(node("blk.4.attn_out"), ("kqv_out-4".into(), "CONT".into()));
    assert_eq!(
        node("blk.4.attn_proj"),
        ("attn_out-4".into(), "MUL_MAT".into())
    );
    assert_eq!(
        node("blk.4.ffn_act"),
        ("ffn_swiglu-4".into(), "SWIGLU".into())
    );
    assert_eq!(node("blk.17.out"), ("l_out-17".into(), "ADD".into()));
    assert_eq!(node("output_norm"), ("result_norm".into(), "MUL".into()));
    assert_eq!(node("logits"), ("result_output".into(), "MUL_MAT".into()));

    // every stage stored in a llama.cpp golden resolves through its architecture's map
    for g in m.goldens.iter().filter(|g| g.oracle.name == "llama.cpp") {
        let map = m
            .stage_map("llama.cpp", &g.arch)
            .unwrap_or_else(|| panic!("no stage map for {}", g.arch));
        for s in g.prefill_stages().chain(g.decode_stages()) {
            assert!(
                map.oracle_node(s).is_some(),
                "{}: stage {s} not in the stage map",
                g.path
            );
        }
    }
}

#[test]
fn arrays_read_back_consistently() {
    let dir = golden_dir();
    let m = manifest();
    for g in &m.goldens {
        let tokens = read_tokens(&dir, g).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(tokens.len(), g.n_prompt_tokens, "{}", g.path);
        let mut f = GoldenFile::open(&dir, g).unwrap();
        if g.is_encoder() {
            // no logits, no decode: the pooled embedding, one finite row
            let pooled = f.read_f32("pooled").unwrap();
            assert_eq!(pooled.nrows(), 1, "{}", g.path);
            assert!(pooled.iter().all(|v| v.is_finite()), "{}", g.path);
            continue;
        }
        let decode = f.read_tokens("decode.tokens").unwrap();
        assert_eq!(decode.len(), g.n_decode_steps, "{}", g.path);

        // the last prompt position's full logits agree with its top-k
        let logits = f.read_f32("logits").unwrap();
        if g.is_audio() {
            // an audio golden (Whisper) keeps the full logits of every prompt position, no top-k
            assert_eq!(logits.nrows(), g.n_prompt_tokens, "{}", g.path);
        } else {
            let positions = f.read_i32("logits_positions").unwrap();
            let last = g.n_prompt_tokens - 1;
            let row = positions
                .iter()
                .position(|&p| p as usize == last)
                .unwrap_or_else(|| panic!("{}: logits_positions lacks the last position", g.path));
            let topk = f.read_f32("logits_topk").unwrap();
            let topk_ids = f.read_i32("logits_topk_ids").unwrap();
            assert_eq!(topk.nrows(), g.n_prompt_tokens);
            let full = logits.row(row);
            let (arg, max) = full
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |a, (i, &v)| if v > a.1 { (i, v) } else { a },
                );
            assert_eq!(topk[[last, 0]], max, "{}", g.path);
            assert_eq!(topk_ids[[last, 0]] as usize, arg, "{}", g.path);
            assert!(topk.row(last).windows(2).into_iter().all(|w| w[0] >= w[1]));

            // llama.cpp's f32-KV goldens feed their own greedy continuation: decode token 0 = argmax at `last`
            // (the transformers goldens are teacher-forced with those same tokens: their own argmax may differ
            // at a near tie; `decode_own_argmax_agreement` records how often it does)
            if g.kv_type == "f32" && g.oracle.name == "llama.cpp" {
                assert_eq!(decode[0] as usize, arg, "{}", g.path);
            }
        }

        // every float array is finite, f16 ones come back widened with the listed shape
        for (name, spec) in &g.arrays {
            if spec.dtype == Dtype::I32 {
                continue;
            }
            let a = read_array_f32(&dir, g, name).unwrap_or_else(|e| panic!("{e:#}"));
            let want: Vec<usize> = match spec.shape.as_slice() {
                [n] => vec![1, *n],
                s => s.to_vec(),
            };
            assert_eq!(a.shape(), want.as_slice(), "{} {name}", g.path);
            assert!(a.iter().all(|v| v.is_finite()), "{} {name}", g.path);
        }
    }
}

#[test]
fn a_golden_from_another_model_is_refused() {
    let dir = golden_dir();
    let m = manifest();
    let g = &m.goldens[0];
    check_model(&dir, g, SMOLLM2_SHA256).unwrap();
    let other = "0".repeat(64);
    let err = format!("{:#}", check_model(&dir, g, &other).unwrap_err());
    assert!(
        err.contains(&g.path) && err.contains(&other) && err.contains(SMOLLM2_SHA256),
        "{err}"
    );
}

// ---- negative tests on a copy of the golden directory ----------------------------------------

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dst = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dst);
        } else {
            fs::copy(&p, &dst).unwrap();
        }
    }
}

/// A copy of golden/ in a tempdir and the entry of its smallest golden of a decoder (an encoder's golden
/// has no logits to damage: [`an_encoder_golden_is_held_to_its_own_contract`]).
fn scratch() -> (tempfile::TempDir, Manifest, GoldenEntry) {
    scratch_where(|g| !g.is_encoder())
}

fn scratch_where(
    keep: impl Fn(&GoldenEntry) -> bool,
) -> (tempfile::TempDir, Manifest, GoldenEntry) {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&golden_dir(), tmp.path());
    let m = load_manifest(tmp.path()).unwrap();
    let g = m
        .goldens
        .iter()
        .filter(|g| keep(g))
        .min_by_key(|g| fs::metadata(tmp.path().join(&g.path)).unwrap().len())
        .unwrap()
        .clone();
    verify_golden(tmp.path(), &g).unwrap();
    (tmp, m, g)
}

fn err_of(r: anyhow::Result<()>) -> String {
    format!("{:#}", r.expect_err("damage went unnoticed"))
}

#[test]
fn a_missing_file_is_reported() {
    let (tmp, _m, g) = scratch();
    fs::remove_file(tmp.path().join(&g.path)).unwrap();
    let err = err_of(verify_golden(tmp.path(), &g));
    assert!(err.contains(&g.path), "{err}");
    assert!(
        err.contains("is missing (listed in") && err.contains("manifest.json"),
        "{err}"
    );
}

#[test]
fn a_flipped_byte_is_reported_with_both_hashes() {
    let (tmp, _m, g) = scratch();
    let path = tmp.path().join(&g.path);
    let mut bytes = fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    let err = err_of(verify_golden(tmp.path(), &g));
    assert!(err.contains(&g.path) && err.contains("sha256"), "{err}");
    assert!(err.contains(&g.sha256), "{err}");
    let actual = lockstep::golden::sha256_file(&path).unwrap();
    assert!(err.contains(&actual), "{err}");
}

/// npy bytes of a C-order little-endian array.
fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    lockstep::npz::npy_bytes(Dtype::from_descr(descr).unwrap(), shape, data)
}

/// Rewrite the golden `g` in `dir`: every member copied except `replace` (member name without
/// `.npy`), which gets `new` (None = dropped); `add` appends a member. Then fix the sha256 in
/// the copy's manifest so that only the array check can notice.
fn rewrite(
    dir: &Path,
    g: &GoldenEntry,
    replace: Option<(&str, Option<Vec<u8>>)>,
    add: Option<(&str, Vec<u8>)>,
) -> GoldenEntry {
    let path = dir.join(&g.path);
    let mut src = zip::ZipArchive::new(fs::File::open(&path).unwrap()).unwrap();
    let out_path = path.with_extension("npz.new");
    {
        let mut out = zip::ZipWriter::new(fs::File::create(&out_path).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for i in 0..src.len() {
            let mut f = src.by_index(i).unwrap();
            let name = f.name().to_string();
            match &replace {
                Some((r, new)) if name == format!("{r}.npy") => {
                    if let Some(bytes) = new {
                        out.start_file(name, opts).unwrap();
                        out.write_all(bytes).unwrap();
                    }
                }
                _ => {
                    let mut bytes = Vec::new();
                    f.read_to_end(&mut bytes).unwrap();
                    out.start_file(name, opts).unwrap();
                    out.write_all(&bytes).unwrap();
                }
            }
        }
        if let Some((name, bytes)) = add {
            out.start_file(format!("{name}.npy"), opts).unwrap();
            out.write_all(&bytes).unwrap();
        }
        out.finish().unwrap();
    }
    fs::rename(&out_path, &path).unwrap();
    let sha = lockstep::golden::sha256_file(&path).unwrap();
    let mpath = dir.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&mpath).unwrap()).unwrap();
    for e in m["goldens"].as_array_mut().unwrap() {
        if e["path"] == g.path.as_str() {
            e["sha256"] = serde_json::Value::String(sha.clone());
        }
    }
    fs::write(&mpath, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let mut g = g.clone();
    g.sha256 = sha;
    g
}

/// A float stage of `g` (2-D) and its spec.
fn some_stage(g: &GoldenEntry) -> (String, Vec<usize>, Dtype) {
    let (name, spec) = g
        .arrays
        .iter()
        .find(|(n, s)| s.shape.len() == 2 && s.dtype != Dtype::I32 && n.starts_with("blk."))
        .expect("a golden with a blk.* stage");
    (name.clone(), spec.shape.clone(), spec.dtype)
}

#[test]
fn an_array_with_a_wrong_shape_is_reported_with_both_shapes() {
    let (tmp, _m, g) = scratch();
    let (name, shape, dtype) = some_stage(&g);
    let wrong = vec![shape[0] + 1, shape[1]];
    let data = vec![0u8; wrong[0] * wrong[1] * dtype.size()];
    let g2 = rewrite(
        tmp.path(),
        &g,
        Some((&name, Some(npy(dtype.npy_descr(), &wrong, &data)))),
        None,
    );
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(&g.path) && err.contains(&format!("`{name}`")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{wrong:?}")) && err.contains(&format!("{shape:?}")),
        "{err}"
    );
    // the reader refuses it too
    let err = format!("{:#}", read_array_f32(tmp.path(), &g2, &name).unwrap_err());
    assert!(
        err.contains(&g.path) && err.contains(&format!("{wrong:?}")),
        "{err}"
    );
}

#[test]
fn an_array_with_a_wrong_dtype_is_reported() {
    let (tmp, _m, g) = scratch();
    let (name, shape, dtype) = some_stage(&g);
    let other = if dtype == Dtype::F16 {
        Dtype::F32
    } else {
        Dtype::F16
    };
    let data = vec![0u8; shape[0] * shape[1] * other.size()];
    let g2 = rewrite(
        tmp.path(),
        &g,
        Some((&name, Some(npy(other.npy_descr(), &shape, &data)))),
        None,
    );
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(&g.path) && err.contains(&format!("`{name}`")),
        "{err}"
    );
    assert!(
        err.contains(&other.to_string()) && err.contains(&dtype.to_string()),
        "{err}"
    );
}

#[test]
fn a_missing_array_is_reported() {
    let (tmp, _m, g) = scratch();
    let (name, _, _) = some_stage(&g);
    let g2 = rewrite(tmp.path(), &g, Some((&name, None)), None);
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(&g.path) && err.contains(&name) && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn an_unlisted_array_is_reported() {
    let (tmp, _m, g) = scratch();
    let g2 = rewrite(
        tmp.path(),
        &g,
        None,
        Some(("blk.999.extra", npy("<f4", &[1, 1], &[0; 4]))),
    );
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(&g.path) && err.contains("blk.999.extra") && err.contains("not listed"),
        "{err}"
    );
}

#[test]
fn a_manifest_of_another_schema_is_refused() {
    let (tmp, _m, _g) = scratch();
    let mpath = tmp.path().join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&mpath).unwrap()).unwrap();
    m["schema_version"] = serde_json::json!(2);
    fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();
    let err = format!("{:#}", load_manifest(tmp.path()).unwrap_err());
    assert!(
        err.contains("manifest.json") && err.contains("schema_version is 2"),
        "{err}"
    );
}

// ---- hostile contents: every field is checked before anything is compared -------------------

const ONE_F32: &str = "smollm2-135m-q4_1/llama.cpp-f32kv/one_token.npz";

/// A golden directory holding only the manifest and the SmolLM2 one-token f32-KV golden (T = 1, 8 decode
/// steps, full decode logits), and that golden's entry.
fn scratch_one() -> (tempfile::TempDir, GoldenEntry) {
    scratch_of(ONE_F32)
}

/// A golden directory holding only the manifest and the committed golden `path`, and its entry (verified).
fn scratch_of(path: &str) -> (tempfile::TempDir, GoldenEntry) {
    let tmp = tempfile::tempdir().unwrap();
    fs::copy(
        golden_dir().join("manifest.json"),
        tmp.path().join("manifest.json"),
    )
    .unwrap();
    let dst = tmp.path().join(path);
    fs::create_dir_all(dst.parent().unwrap()).unwrap();
    fs::copy(golden_dir().join(path), &dst).unwrap();
    let g = load_manifest(tmp.path())
        .unwrap()
        .goldens
        .into_iter()
        .find(|g| g.path == path)
        .unwrap();
    verify_golden(tmp.path(), &g).unwrap();
    (tmp, g)
}

/// The stored `.npy` bytes of array `name`, split into (header, data).
fn member(dir: &Path, g: &GoldenEntry, name: &str) -> (Vec<u8>, Vec<u8>) {
    let mut z = zip::ZipArchive::new(fs::File::open(dir.join(&g.path)).unwrap()).unwrap();
    let mut bytes = Vec::new();
    z.by_name(&format!("{name}.npy"))
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    let (_, _, off) = lockstep::npz::parse_npy_header(&bytes).unwrap();
    let data = bytes.split_off(off);
    (bytes, data)
}

/// Rewrite one array's data in place (same shape and dtype) with `f` and fix the file's sha256.
fn patch_data(
    dir: &Path,
    g: &GoldenEntry,
    name: &str,
    f: impl FnOnce(&mut Vec<u8>),
) -> GoldenEntry {
    let (mut header, mut data) = member(dir, g, name);
    f(&mut data);
    header.extend_from_slice(&data);
    rewrite(dir, g, Some((name, Some(header))), None)
}

/// Edit the golden's manifest entry (JSON) and return the entry as now read.
fn patch_entry(dir: &Path, g: &GoldenEntry, f: impl FnOnce(&mut serde_json::Value)) -> GoldenEntry {
    let mpath = dir.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&mpath).unwrap()).unwrap();
    let e = m["goldens"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|e| e["path"] == g.path.as_str())
        .unwrap();
    f(e);
    fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();
    load_manifest(dir)
        .unwrap()
        .goldens
        .into_iter()
        .find(|x| x.path == g.path)
        .unwrap()
}

fn set_i32(data: &mut [u8], i: usize, v: i32) {
    data[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn nan_or_inf_in_golden_logits_or_stages_is_a_golden_error_naming_file_and_array() {
    for (array, value) in [
        ("logits", f32::NAN),
        ("decode.logits", f32::INFINITY),
        ("decode.blk.7.out", f32::NEG_INFINITY),
    ] {
        let (tmp, g) = scratch_one();
        let g2 = patch_data(tmp.path(), &g, array, |d| {
            d[40..44].copy_from_slice(&value.to_le_bytes())
        });
        let err = err_of(verify_golden(tmp.path(), &g2));
        assert!(
            err.contains(ONE_F32)
                && err.contains(&format!("golden array `{array}`"))
                && err.contains(&value.to_string())
                && err.contains("column 10"),
            "{err}"
        );
    }
}

#[test]
fn n_decode_steps_and_logits_positions_must_agree_with_the_stored_arrays() {
    let (tmp, g) = scratch_one();
    // a manifest claiming fewer steps than stored would silently compare less
    let g2 = patch_entry(tmp.path(), &g, |e| e["n_decode_steps"] = 7.into());
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(ONE_F32)
            && err.contains("decode.tokens")
            && err.contains("n_decode_steps = 7"),
        "{err}"
    );
    let g2 = patch_entry(tmp.path(), &g, |e| e["n_decode_steps"] = 0.into());
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(err.contains("n_decode_steps = 0"), "{err}");
    let g2 = patch_entry(tmp.path(), &g, |e| e["n_prompt_tokens"] = 2.into());
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(err.contains("n_prompt_tokens = 2"), "{err}");

    let (tmp, g) = scratch_one();
    let g2 = patch_data(tmp.path(), &g, "logits_positions", |d| set_i32(d, 0, 3));
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(ONE_F32) && err.contains("`logits_positions` holds 3"),
        "{err}"
    );
}

#[test]
fn top_k_arrays_must_be_non_empty_with_ids_in_the_vocabulary() {
    // an empty [T, 0] top-k (manifest and file agreeing) used to panic in the metrics
    let (tmp, g) = scratch_one();
    let g2 = rewrite(
        tmp.path(),
        &g,
        Some(("logits_topk_ids", Some(npy("<i4", &[1, 0], &[])))),
        None,
    );
    let g2 = rewrite(
        tmp.path(),
        &g2,
        Some(("logits_topk", Some(npy("<f4", &[1, 0], &[])))),
        None,
    );
    let g2 = patch_entry(tmp.path(), &g2, |e| {
        e["arrays"]["logits_topk_ids"]["shape"] = serde_json::json!([1, 0]);
        e["arrays"]["logits_topk"]["shape"] = serde_json::json!([1, 0]);
    });
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(ONE_F32) && err.contains("logits_topk_ids") && err.contains("K ≥ 1"),
        "{err}"
    );

    // a negative id used to wrap to 4294967289 and blame the engine
    for (id, what) in [(-7, "token id -7"), (49152, "token id 49152")] {
        let (tmp, g) = scratch_one();
        let g2 = patch_data(tmp.path(), &g, "logits_topk_ids", |d| set_i32(d, 5, id));
        let err = err_of(verify_golden(tmp.path(), &g2));
        assert!(
            err.contains(ONE_F32)
                && err.contains("`logits_topk_ids`")
                && err.contains(what)
                && err.contains("0..49152"),
            "{err}"
        );
    }
}

#[test]
fn token_ids_beyond_the_vocabulary_name_the_golden() {
    for array in ["tokens", "decode.tokens"] {
        let (tmp, g) = scratch_one();
        let g2 = patch_data(tmp.path(), &g, array, |d| set_i32(d, 0, 60_000));
        let err = err_of(verify_golden(tmp.path(), &g2));
        assert!(
            err.contains(ONE_F32) && err.contains(&format!("`{array}`")) && err.contains("60000"),
            "{err}"
        );
    }
}

#[test]
fn an_oversized_member_is_refused_before_it_is_decompressed() {
    // `tokens` is listed as [1] i32 (4 bytes); the member inflates to 256 MiB (a ~250 KiB zip bomb)
    let (tmp, g) = scratch_one();
    let bomb = npy("<i4", &[1 << 26], &vec![0u8; 1 << 28]);
    let g2 = rewrite(tmp.path(), &g, Some(("tokens", Some(bomb))), None);
    assert!(fs::metadata(tmp.path().join(ONE_F32)).unwrap().len() < 8 << 20);
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(ONE_F32) && err.contains("`tokens`") && err.contains("refusing to decompress"),
        "{err}"
    );
    // a manifest listing an absurd shape is refused without reading anything
    let g3 = patch_entry(tmp.path(), &g2, |e| {
        e["arrays"]["tokens"]["shape"] = serde_json::json!([1u64 << 40])
    });
    let err = err_of(verify_golden(tmp.path(), &g3));
    assert!(err.contains("larger than"), "{err}");
}

#[test]
fn an_encoder_golden_is_held_to_its_own_contract() {
    // a pooled embedding of two rows for one sequence
    let (tmp, _m, g) = scratch_where(|g| g.is_encoder());
    let data = vec![0u8; 2 * 256 * 4];
    let pooled = npy(Dtype::F32.npy_descr(), &[2, 256], &data);
    let mut g2 = rewrite(tmp.path(), &g, Some(("pooled", Some(pooled))), None);
    g2.arrays.get_mut("pooled").unwrap().shape = vec![2, 256];
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(&g.path) && err.contains("`pooled`") && err.contains("one pooled row"),
        "{err}"
    );
    // decode steps claimed for an encoder
    let mut g3 = g.clone();
    g3.n_decode_steps = 1;
    let (tmp, _m, _) = scratch_where(|g| g.is_encoder());
    let err = err_of(verify_golden(tmp.path(), &g3));
    assert!(err.contains("an encoder has no decode step"), "{err}");
}

// ---- compact goldens (issue 42): prefill stages at the positions of `stage_positions` only ----------------

const LONG: &str = "gemma3-270m-q4_k_m/llama.cpp-f32kv/long_window.npz";

/// A golden directory holding only the manifest and Gemma 3's compact `long_window` golden, and its entry.
fn scratch_long() -> (tempfile::TempDir, GoldenEntry) {
    scratch_of(LONG)
}

#[test]
fn gemma3_has_a_compact_golden_longer_than_its_sliding_window() {
    let m = manifest();
    let g = m
        .find("gemma3-270m-q4_k_m", "llama.cpp", "f32", "long_window")
        .expect("Gemma 3's long_window golden");
    // Gemma 3 270M's attention.sliding_window is 512: the prompt crosses it in the prefill
    let window = 512;
    assert!(g.n_prompt_tokens > window, "{}", g.n_prompt_tokens);
    assert!(g.is_compact() && !g.stores_layer_outputs(), "{}", g.path);
    // the budget of issue 42: at most ~1.0 MB on disk
    assert!(g.bytes.unwrap() <= 1_000_000, "{:?}", g.bytes);
    let mut f = GoldenFile::open(&golden_dir(), g).unwrap();
    let pos = f.stage_positions().unwrap().expect("stage_positions");
    for p in [window - 1, window, window + 1, g.n_prompt_tokens - 1] {
        assert!(pos.contains(&p), "{pos:?} lacks {p}");
    }
    // the residual stream of every layer and the final norm at those positions
    let n_layer = 18;
    for id in (0..n_layer)
        .map(|n| format!("blk.{n}.out"))
        .chain(["output_norm".to_string()])
    {
        assert_eq!(g.arrays[&id].shape, [pos.len(), 640], "{id}");
    }
    // the other compact goldens' contract: no stage of a compact golden has a row per prompt position
    assert!(g.prefill_stages().all(|s| s != "stage_positions"));
    // made by the same llama.cpp build kind as Gemma 3's other llama.cpp goldens (AVX2 kernels)
    let prose = m
        .find("gemma3-270m-q4_k_m", "llama.cpp", "f32", "prose")
        .unwrap();
    assert_eq!(
        g.oracle.ggml_target().unwrap(),
        prose.oracle.ggml_target().unwrap()
    );
}

#[test]
fn stage_positions_must_be_sorted_distinct_in_range_and_match_the_stage_rows() {
    let (tmp, g) = scratch_long();
    let t = g.n_prompt_tokens as i32;
    let n = g.arrays["stage_positions"].shape[0];
    let read = |d: &[u8], i: usize| i32::from_le_bytes(d[4 * i..4 * i + 4].try_into().unwrap());
    // unsorted: two positions swapped
    let g2 = patch_data(tmp.path(), &g, "stage_positions", |d| {
        let (a, b) = (read(d, 1), read(d, 2));
        set_i32(d, 1, b);
        set_i32(d, 2, a);
    });
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(LONG)
            && err.contains("`stage_positions`")
            && err.contains("not strictly increasing"),
        "{err}"
    );
    // a position twice
    let (tmp, g) = scratch_long();
    let g2 = patch_data(tmp.path(), &g, "stage_positions", |d| {
        let a = read(d, 1);
        set_i32(d, 2, a);
    });
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(LONG) && err.contains("not strictly increasing"),
        "{err}"
    );
    // out of range: the prompt length itself, and a negative position
    for (i, bad) in [(n - 1, t), (0, -1)] {
        let (tmp, g) = scratch_long();
        let g2 = patch_data(tmp.path(), &g, "stage_positions", |d| set_i32(d, i, bad));
        let err = err_of(verify_golden(tmp.path(), &g2));
        assert!(
            err.contains(LONG)
                && err.contains(&format!("holds {bad} at index {i}"))
                && err.contains(&format!("outside the prompt positions 0..{t}")),
            "{err}"
        );
    }
    // one position fewer than the stages have rows (file and manifest agreeing on the array itself)
    let (tmp, g) = scratch_long();
    let (_, data) = member(tmp.path(), &g, "stage_positions");
    let g2 = rewrite(
        tmp.path(),
        &g,
        Some((
            "stage_positions",
            Some(npy("<i4", &[n - 1], &data[..4 * (n - 1)])),
        )),
        None,
    );
    let g2 = patch_entry(tmp.path(), &g2, |e| {
        e["arrays"]["stage_positions"]["shape"] = serde_json::json!([n - 1])
    });
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(LONG)
            && err.contains(&format!("expected {} rows", n - 1))
            && err.contains("position of `stage_positions`"),
        "{err}"
    );
    // and not a 1-D list
    let (tmp, g) = scratch_long();
    let (_, data) = member(tmp.path(), &g, "stage_positions");
    let g2 = rewrite(
        tmp.path(),
        &g,
        Some(("stage_positions", Some(npy("<i4", &[1, n], &data)))),
        None,
    );
    let g2 = patch_entry(tmp.path(), &g2, |e| {
        e["arrays"]["stage_positions"]["shape"] = serde_json::json!([1, n])
    });
    let err = err_of(verify_golden(tmp.path(), &g2));
    assert!(
        err.contains(LONG) && err.contains("non-empty 1-D list"),
        "{err}"
    );
}

#[test]
fn a_compact_golden_is_compared_at_its_stage_positions() {
    use lockstep::compare::{compare_stages, EngineOutput, Phase};
    use lockstep::gate::{cell_metrics, first_inexact};
    use ndarray::Array2;

    let dir = golden_dir();
    let m = manifest();
    let g = m.goldens.iter().find(|g| g.path == LONG).unwrap();
    let mut f = GoldenFile::open(&dir, g).unwrap();
    let pos = f.stage_positions().unwrap().unwrap();
    let t = g.n_prompt_tokens;
    // an "engine" whose rows at the stored positions are the golden's (f16 rows widen and round back
    // exactly) and zeros elsewhere: positions the golden does not store are not compared
    let mut out = EngineOutput {
        own_tokens: f.read_tokens("tokens").unwrap(),
        ..Default::default()
    };
    for id in g.prefill_stages() {
        let rows = f.read_f32(id).unwrap();
        let mut full = Array2::<f32>::zeros((t, rows.ncols()));
        for (r, &p) in pos.iter().enumerate() {
            full.row_mut(p).assign(&rows.row(r));
        }
        out.prefill.insert(id.to_string(), full);
        out.stage_order.push(id.to_string());
    }
    let d = f.read_f32("decode.output_norm").unwrap();
    out.decode.insert("output_norm".into(), d);
    let cmp = compare_stages(&mut f, &out, None).unwrap();
    assert!(!cmp.stages.is_empty());
    for s in cmp.stages.iter().filter(|s| s.phase == Phase::Prefill) {
        assert_eq!(s.positions, pos, "{}", s.stage);
        assert!(s.exact_at_storage(), "{}", s.stage);
    }
    assert!(first_inexact(&cmp).is_none());

    // a difference at the first position past the window is reported at that prompt position, not its row
    let w = 512;
    let mut bad = out.clone();
    bad.prefill.get_mut("blk.3.out").unwrap()[[w, 0]] += 1.0;
    let cmp = compare_stages(&mut f, &bad, None).unwrap();
    let d = first_inexact(&cmp).expect("a difference");
    assert_eq!(
        (d.stage.as_str(), d.phase, d.position),
        ("blk.3.out", Phase::Prefill, w)
    );
    let s = cmp.stages.iter().find(|s| s.stage == "blk.3.out").unwrap();
    assert_eq!(s.worst_position, w);
    let low = cell_metrics(&cmp, 0.01).min_cosine_out.unwrap();
    assert_eq!((low.stage.as_str(), low.position), ("blk.3.out", w));

    // the engine's row count must still be the prompt's
    let mut short = out.clone();
    let a = short.prefill.get_mut("blk.0.out").unwrap();
    *a = a.slice(ndarray::s![..t - 1, ..]).to_owned();
    let err = format!("{:#}", compare_stages(&mut f, &short, None).unwrap_err());
    assert!(
        err.contains(LONG)
            && err.contains("blk.0.out")
            && err.contains(&format!("{t} prompt positions")),
        "{err}"
    );
}
