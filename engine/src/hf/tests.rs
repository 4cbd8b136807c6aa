//! The HF path against the GGUF path on the seeded models of every architecture: every stage bit-identical
//! (prefill and decode, reference and ggml modes), the export → load round trip, tokenization, shards, and
//! bad input.

use std::path::{Path, PathBuf};

use super::export::{export, HfTensor};
use super::*;
use crate::hooks::Recorder;
use crate::synth::{SynthModel, SYNTH_ARCHS};
use crate::{Model, Numerics, NumericsMode, Simd};

/// Write the HF copy of `g` into `dir` (what `lockstep export-hf` writes).
fn write_hf(g: &GgufFile, dir: &Path) -> Vec<HfTensor> {
    let e = export(g).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let js = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap();
    std::fs::write(dir.join(CONFIG), js(&e.config)).unwrap();
    std::fs::write(dir.join(TOKENIZER), js(&e.tokenizer)).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), js(&e.tokenizer_config)).unwrap();
    std::fs::write(dir.join(WEIGHTS), st_bytes(&e.tensors)).unwrap();
    e.tensors
}

fn st_bytes(tensors: &[HfTensor]) -> Vec<u8> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let v =
                safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap();
            (t.name.clone(), v)
        })
        .collect();
    safetensors::serialize(views, &None).unwrap()
}

/// The seeded model `arch` (seed 1, as `lockstep synth` writes it) as a GGUF file and its HF copy.
fn seeded(m: &SynthModel) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join(format!("{}.gguf", m.arch));
    std::fs::write(&gguf, m.build().unwrap()).unwrap();
    let hf = dir.path().join(format!("{}-hf", m.arch));
    write_hf(&GgufFile::open(&gguf).unwrap(), &hf);
    (dir, gguf, hf)
}

/// Prefill the synth prompt, then 4 greedy decode steps; every stage and logits row recorded.
fn run(model: &Model, numerics: Numerics) -> (Recorder, Vec<f32>) {
    let tokens = model
        .tokenizer()
        .encode("the hell is here", true, false)
        .unwrap();
    let mut rec = Recorder::new();
    let mut s = model.session(64, numerics);
    let mut logits = model
        .forward(&mut s, &tokens, Some(&mut rec))
        .unwrap()
        .to_vec();
    if model.output() == crate::models::Output::Logits {
        let n_vocab = model.info().n_vocab;
        for _ in 0..4 {
            let last = &logits[logits.len() - n_vocab..];
            let next = crate::sample::argmax(last).unwrap();
            logits.extend_from_slice(model.forward(&mut s, &[next], Some(&mut rec)).unwrap());
        }
    }
    (rec, logits)
}

/// The stages (and output) that differ in bits between two runs, by name; empty when every one is equal.
fn differing(a: &(Recorder, Vec<f32>), b: &(Recorder, Vec<f32>)) -> Vec<String> {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<_> =
        a.0.stages
            .keys()
            .chain(b.0.stages.keys())
            .copied()
            .collect();
    for k in keys {
        match (a.0.stages.get(&k), b.0.stages.get(&k)) {
            (Some(x), Some(y))
                if x.width == y.width
                    && x.positions == y.positions
                    && bits(&x.data) == bits(&y.data) => {}
            _ => out.push(k.to_string()),
        }
    }
    if bits(&a.1) != bits(&b.1) {
        out.push("output".into());
    }
    out
}

#[test]
fn every_stage_is_bit_identical_from_the_gguf_and_its_hf_copy() {
    let settings = [
        Numerics {
            simd: Simd::Off,
            ..Numerics::new(NumericsMode::Reference)
        },
        Numerics {
            simd: Simd::detect(),
            ..Numerics::new(NumericsMode::Reference)
        },
        Numerics {
            simd: Simd::detect(),
            ..Numerics::new(NumericsMode::Ggml)
        },
    ];
    let mut failures = Vec::new();
    for &arch in SYNTH_ARCHS {
        let (_d, gguf, hf) = seeded(&SynthModel::preset(arch, 1).unwrap());
        let (a, b) = (Model::load(&gguf).unwrap(), Model::load(&hf).unwrap());
        assert_eq!(a.info(), b.info(), "{arch}: dims");
        assert_eq!(a.stages(), b.stages(), "{arch}: stage list");
        for n in settings {
            let (ra, rb) = (run(&a, n), run(&b, n));
            assert!(
                ra.0.stages.len() > 10,
                "{arch}: recorded {} stages",
                ra.0.stages.len()
            );
            let d = differing(&ra, &rb);
            if !d.is_empty() {
                failures.push(format!(
                    "{arch} {} simd {}: {d:?}",
                    n.mode.name(),
                    n.simd.name()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "stages not bit-identical: {failures:#?}"
    );
}

/// Metadata keys a copy does not carry, by the layouts' `Cfg::Ignored` rules (and the name, which is the
/// directory's).
fn ignored(arch: &str) -> Vec<String> {
    let l = layout::layout_of_arch(arch).unwrap();
    let v: Vec<String> = l
        .config
        .iter()
        .filter_map(|c| match c {
            layout::Cfg::Ignored(k, _) => Some(full_key(arch, k)),
            _ => None,
        })
        .collect();
    v
}

#[test]
fn export_then_load_gives_back_every_tensor_and_metadata_key() {
    let mut models: Vec<SynthModel> = SYNTH_ARCHS
        .iter()
        .map(|a| SynthModel::preset(a, 2).unwrap())
        .collect();
    // F16 / BF16 stay as stored (the Q/K permutation moves 2-byte rows)
    models.push(SynthModel {
        matrix_type: crate::quant::GgmlType::F16,
        embd_type: crate::quant::GgmlType::BF16,
        ..SynthModel::preset("llama", 2).unwrap()
    });
    models.push(SynthModel {
        matrix_type: crate::quant::GgmlType::BF16,
        ..SynthModel::preset("gpt2", 2).unwrap()
    });
    for m in models {
        let (_d, gguf, hf) = seeded(&m);
        let (g, h) = (GgufFile::open(&gguf).unwrap(), open(&hf).unwrap());
        let a = m.arch;
        assert!(h.hf_source().is_some() && g.hf_source().is_none());
        assert_eq!(g.tensors().len(), h.tensors().len(), "{a}: tensor count");
        for t in g.tensors() {
            let u = h.tensor(&t.name).unwrap_or_else(|e| panic!("{a}: {e}"));
            assert_eq!(
                (&t.dims, t.ggml_type),
                (&u.dims, u.ggml_type),
                "{a}: {}",
                t.name
            );
            assert!(
                g.tensor_data(t) == h.tensor_data(u),
                "{a}: {} bytes differ",
                t.name
            );
        }
        let skip = ignored(a);
        for (k, v) in g.metadata() {
            if k == "general.name" {
                continue; // the directory's name
            }
            if skip.contains(k) {
                assert!(h.get(k).is_none(), "{a}: {k} is ignored but made");
                continue;
            }
            assert_eq!(h.get(k), Some(v), "{a}: metadata {k}");
        }
        // in place: only the tensors whose layouts differ are copies
        let derived: Vec<&str> = h
            .hf_source()
            .unwrap()
            .derived
            .iter()
            .map(|d| d.0.as_str())
            .collect();
        let want: Vec<String> = g
            .tensors()
            .iter()
            .filter(|t| {
                let l = layout::layout_of_arch(a).unwrap();
                l.by_gguf(&t.name)
                    .is_none_or(|(r, _)| r.transform != layout::Transform::Same)
            })
            .map(|t| t.name.clone())
            .collect();
        let mut d = derived.clone();
        d.sort();
        let mut w: Vec<&str> = want.iter().map(String::as_str).collect();
        w.sort();
        assert_eq!(d, w, "{a}: derived copies");
    }
}

#[test]
fn tokenizer_json_tokenizes_the_registry_prompts_as_the_gguf() {
    let prompts: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../oracles/prompts.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let texts: Vec<&str> = prompts["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["text"].as_str())
        .chain([
            "<|im_start|>user\nHi<|im_end|>",
            "[CLS] the [MASK] is here",
            "Ünïcödé \u{1}\u{7f} 123 4567",
        ])
        .collect();
    assert!(texts.len() >= 8);
    for arch in ["llama", "bert"] {
        let (_d, gguf, hf) = seeded(&SynthModel::preset(arch, 1).unwrap());
        let (a, b) = (Model::load(&gguf).unwrap(), Model::load(&hf).unwrap());
        let (ta, tb) = (a.tokenizer(), b.tokenizer());
        assert_eq!(ta.vocab_size(), tb.vocab_size());
        assert_eq!(
            (ta.bos(), ta.eos(), ta.adds_bos()),
            (tb.bos(), tb.eos(), tb.adds_bos()),
            "{arch}"
        );
        for t in &texts {
            for (add, parse) in [(true, false), (false, false), (true, true)] {
                // the same ids, or the same refusal (WordPiece: ASCII text only)
                assert_eq!(
                    ta.encode(t, add, parse).map_err(|e| e.to_string()),
                    tb.encode(t, add, parse).map_err(|e| e.to_string()),
                    "{arch}: {t:?} add_special {add} parse_special {parse}"
                );
            }
        }
    }
}

/// Split the copy in `hf` into two shards with an index; returns the directory.
fn shard(hf: &Path, tensors: &[HfTensor], out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    for f in [CONFIG, TOKENIZER, "tokenizer_config.json"] {
        std::fs::copy(hf.join(f), out.join(f)).unwrap();
    }
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let mut map = serde_json::Map::new();
    for (name, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        std::fs::write(out.join(name), st_bytes(part)).unwrap();
        for t in part {
            map.insert(t.name.clone(), serde_json::json!(name));
        }
    }
    std::fs::write(
        out.join(INDEX),
        serde_json::to_string(&serde_json::json!({"metadata": {}, "weight_map": map})).unwrap(),
    )
    .unwrap();
}

#[test]
fn a_sharded_checkpoint_loads_as_the_single_file() {
    let (d, gguf, hf) = seeded(&SynthModel::preset("qwen2", 1).unwrap());
    let tensors = export(&GgufFile::open(&gguf).unwrap()).unwrap().tensors;
    let sharded = d.path().join("sharded");
    shard(&hf, &tensors, &sharded);
    let (a, b) = (Model::load(&hf).unwrap(), Model::load(&sharded).unwrap());
    assert_eq!(b.gguf().hf_source().unwrap().files.len(), 2);
    let n = Numerics::new(NumericsMode::Reference);
    assert!(differing(&run(&a, n), &run(&b, n)).is_empty());
}

/// The error of loading `dir` as a model, as text.
fn load_err(dir: &Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_hf_input_is_an_error_naming_the_file_and_the_problem() {
    let (d, gguf, hf) = seeded(&SynthModel::preset("llama", 1).unwrap());
    let tensors = export(&GgufFile::open(&gguf).unwrap()).unwrap().tensors;
    let fresh = |name: &str| -> PathBuf {
        let p = d.path().join(name);
        std::fs::create_dir_all(&p).unwrap();
        for f in [CONFIG, TOKENIZER, "tokenizer_config.json", WEIGHTS] {
            std::fs::copy(hf.join(f), p.join(f)).unwrap();
        }
        p
    };
    let check = |dir: &Path, want: &[&str]| {
        let e = load_err(dir);
        for w in want {
            assert!(e.contains(w), "{e:?} lacks {w:?}");
        }
    };
    // missing config.json
    let p = fresh("no-config");
    std::fs::remove_file(p.join(CONFIG)).unwrap();
    check(&p, &["no-config", "no config.json"]);
    // config.json not JSON; an unknown model_type; a value the engine does not implement
    let p = fresh("bad-config");
    std::fs::write(p.join(CONFIG), "{").unwrap();
    check(&p, &["bad-config/config.json", "not valid JSON"]);
    let edit = |p: &Path, f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(p.join(CONFIG)).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(p.join(CONFIG), v.to_string()).unwrap();
    };
    let p = fresh("mamba");
    edit(&p, &|v| v["model_type"] = "mamba".into());
    check(&p, &["mamba/config.json", "\"mamba\"", "llama"]);
    let p = fresh("relu");
    edit(&p, &|v| v["hidden_act"] = "relu".into());
    check(&p, &["relu/config.json", "hidden_act", "silu"]);
    // no weights; truncated safetensors
    let p = fresh("no-weights");
    std::fs::remove_file(p.join(WEIGHTS)).unwrap();
    check(&p, &["no-weights", "model.safetensors"]);
    let p = fresh("truncated");
    let bytes = std::fs::read(p.join(WEIGHTS)).unwrap();
    std::fs::write(p.join(WEIGHTS), &bytes[..bytes.len() - 1000]).unwrap();
    check(
        &p,
        &["truncated/model.safetensors", "truncated or malformed"],
    );
    // a missing tensor
    let p = fresh("missing");
    let less: Vec<HfTensor> = tensors
        .iter()
        .filter(|t| t.name != "model.layers.1.mlp.up_proj.weight")
        .cloned()
        .collect();
    std::fs::write(p.join(WEIGHTS), st_bytes(&less)).unwrap();
    check(
        &p,
        &[
            "missing/model.safetensors",
            "model.layers.1.mlp.up_proj.weight",
            "blk.1.ffn_up.weight",
            "missing",
        ],
    );
    // a tensor with no place in the class
    let p = fresh("extra");
    let mut more = tensors.clone();
    more.push(HfTensor {
        name: "model.layers.0.mlp.extra.weight".into(),
        ..tensors[0].clone()
    });
    std::fs::write(p.join(WEIGHTS), st_bytes(&more)).unwrap();
    check(
        &p,
        &[
            "extra/model.safetensors",
            "model.layers.0.mlp.extra.weight",
            "no place",
        ],
    );
    // a wrong shape (same element count): the loader's error, with the HF name
    let p = fresh("shape");
    let mut bad = tensors.clone();
    let v = bad
        .iter_mut()
        .find(|t| t.name == "model.layers.0.self_attn.v_proj.weight")
        .unwrap();
    v.shape = vec![64, 512];
    std::fs::write(p.join(WEIGHTS), st_bytes(&bad)).unwrap();
    check(
        &p,
        &[
            "shape",
            "blk.0.attn_v.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "shape [64, 512]",
        ],
    );
    // an unsupported dtype
    let p = fresh("dtype");
    let mut bad = tensors.clone();
    let v = bad
        .iter_mut()
        .find(|t| t.name == "model.norm.weight")
        .unwrap();
    v.dtype = safetensors::Dtype::I32;
    std::fs::write(p.join(WEIGHTS), st_bytes(&bad)).unwrap();
    check(
        &p,
        &[
            "dtype/model.safetensors",
            "model.norm.weight",
            "I32",
            "F32, F16 and BF16",
        ],
    );
    // missing tokenizer.json
    let p = fresh("no-tokenizer");
    std::fs::remove_file(p.join(TOKENIZER)).unwrap();
    check(&p, &["no-tokenizer", "no tokenizer.json"]);
    // bad index.json: not JSON, a shard outside the directory, a missing shard, a tensor in the wrong shard
    let p = d.path().join("sharded");
    shard(&hf, &tensors, &p);
    assert!(Model::load(&p).is_ok());
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.join(INDEX)).unwrap()).unwrap();
    let with_index = |name: &str, f: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let q = d.path().join(name);
        shard(&hf, &tensors, &q);
        let mut v = index.clone();
        f(&mut v);
        std::fs::write(q.join(INDEX), v.to_string()).unwrap();
        q
    };
    let q = with_index("index-junk", &|v| *v = serde_json::json!([]));
    check(
        &q,
        &["index-junk/model.safetensors.index.json", "weight_map"],
    );
    let q = with_index("index-escape", &|v| {
        v["weight_map"]["model.norm.weight"] = "../x.safetensors".into()
    });
    check(
        &q,
        &[
            "index-escape/model.safetensors.index.json",
            "model.norm.weight",
            "not a *.safetensors file name",
        ],
    );
    let q = with_index("index-gone", &|v| {
        v["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors".into()
    });
    check(
        &q,
        &[
            "index-gone/model.safetensors.index.json",
            "model-00003-of-00002.safetensors",
            "does not exist",
        ],
    );
    let first = tensors[0].name.clone();
    let q = with_index("index-wrong", &|v| {
        let other = if v["weight_map"][&first] == "model-00001-of-00002.safetensors" {
            "model-00002-of-00002.safetensors"
        } else {
            "model-00001-of-00002.safetensors"
        };
        v["weight_map"][&first] = other.into();
    });
    check(
        &q,
        &[
            "index-wrong/model.safetensors.index.json",
            &first,
            "weight_map says",
        ],
    );
}
