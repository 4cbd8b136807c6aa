//! Tests of the quantize module: the legacy quantizers against golden bytes of ggml's C, the type
//! choice, the output layout (read back with the engine's own GGUF reader) and the variant recipe.

use sha2::{Digest, Sha256};

use super::choice::{allows_quantization, fallback, n_dims, tensor_type, weight_order};
use super::writer::{pad, ALIGNMENT};
use super::*;
use crate::gguf::{GgufFile, GgufWriter};
use crate::quant::{dequantize_row, quantize_row};
use crate::synth::SynthModel;

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// 8 rows × 256 seeded values in 32-blocks of eight kinds (all zero, one value, below `GROUP_MAX_EPS`,
/// constant, offset, and three typical), with a random power-of-two scale per block — the generator of
/// the C check below, step for step.
fn seeded_rows() -> Vec<f32> {
    let mut st = 12345u32;
    let mut next = || {
        st = st.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        st
    };
    let mut x = vec![0f32; 8 * 256];
    for (b, xb) in x.chunks_exact_mut(32).enumerate() {
        let kind = b % 8;
        let scale = 2f32.powi((next() % 24) as i32 - 16);
        for (j, v) in xb.iter_mut().enumerate() {
            let u = (next() >> 8) as f32 / 16_777_216.0 - 0.5;
            *v = match kind {
                0 => 0.0,
                1 => {
                    if j == 5 {
                        -scale
                    } else {
                        0.0
                    }
                }
                2 => u * 1e-18,
                3 => scale,
                4 => u * scale + 0.25 * scale,
                _ => u * scale,
            };
        }
    }
    x
}

/// Golden sha256 of each type's bytes for [`seeded_rows`], made by ggml's own C: `oracle.c` (kept outside
/// the repository, in the session's scratch dir) generates the same rows, calls `quantize_q4_0`,
/// `quantize_q4_1`, `quantize_q5_0`, `quantize_q5_1`, `quantize_q8_0`, `quantize_iq4_nl` (NULL importance
/// matrix, 8 rows of 256), `ggml_compute_fp32_to_fp16` and `ggml_compute_fp32_to_bf16` for each value,
/// and writes the bytes; it is linked with ggml-quants.c of the pinned llama.cpp compiled with the flags
/// of the pinned build's ggml-base (`-O3 -DNDEBUG -std=gnu11`, no `-march`: `objdump -d` shows no FMA in
/// it), and the files hashed with `sha256sum`. `input.bin` (the f32 rows) hashed
/// 8b1159f085e964ee544a79bbe33f88ac9cdb970e8c5ecadbb2bc06225dfe2069.
const GOLDEN: [(GgmlType, &str); 8] = [
    (
        GgmlType::Q4_0,
        "a9744088eaba353c5e87432719cec81a222c995da5b4fcb759a87f7075964fb4",
    ),
    (
        GgmlType::Q4_1,
        "5f73faa7b645d324a1e2e58c863e5660ea28eafa7f329716a2e9ff9afeec570b",
    ),
    (
        GgmlType::Q5_0,
        "b10b799fdb359735c9ff01f781847d274c7abdf90c1f0ffa02c3dfed0aac3947",
    ),
    (
        GgmlType::Q5_1,
        "a1d75dd1b1c727217ccd1729ab30a363fb78f365bc7aa2a090ac6d08c40b0647",
    ),
    (
        GgmlType::Q8_0,
        "12ecc81320eec660c5f3bc6589be0fee01ffe6c04a7bd3a5b93f93c05bacc328",
    ),
    (
        GgmlType::IQ4_NL,
        "7cf2bd4c9ee6f1572c96f9f13923058a97bb2353f6c487afd50d99c7ee35ddff",
    ),
    (
        GgmlType::F16,
        "630055ee7c5a3840d76995583b4f7b7f46da75194ac188cee7c25b10cc252419",
    ),
    (
        GgmlType::BF16,
        "877f390d75a3fd0448389042acfd14af47ea2127a0a1059120480ff83bb40af6",
    ),
];

#[test]
fn legacy_quantizers_match_ggml_c_golden_bytes() {
    let x = seeded_rows();
    let input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        sha256_hex(&input),
        "8b1159f085e964ee544a79bbe33f88ac9cdb970e8c5ecadbb2bc06225dfe2069",
        "the generator must match oracle.c's"
    );
    for (ty, want) in GOLDEN {
        // serial and through the parallel row splitter: the same bytes
        let serial = quantize_row(ty, &x).unwrap();
        assert_eq!(sha256_hex(&serial), want, "{ty}");
        let mut par = vec![0u8; serial.len()];
        rows::quantize_rows(ty, &x, 256, &mut par).unwrap();
        assert_eq!(par, serial, "{ty} in parallel");
    }
}

#[test]
fn quantize_then_dequantize_stays_close() {
    let x = seeded_rows();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
    ] {
        let q = quantize_row(ty, &x).unwrap();
        let mut back = vec![0f32; x.len()];
        dequantize_row(ty, &q, &mut back).unwrap();
        for (xb, bb) in x.chunks(32).zip(back.chunks(32)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax < 0.01 {
                continue; // the f16 scale is subnormal or zero: no relative bound
            }
            for (a, b) in xb.iter().zip(bb) {
                // 4 bits at worst: a step of about amax/7 (IQ4_NL's coarsest gap is ~23/127)
                assert!((a - b).abs() <= amax * 0.2 + 1e-30, "{ty}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn every_variant_type_has_a_quantizer_and_others_are_errors_naming_the_type() {
    for t in FileType::ALL {
        rows::check_quantizer(t.default_type()).unwrap();
    }
    for ty in [GgmlType::IQ2_XXS, GgmlType::TQ1_0, GgmlType::I32] {
        let e = rows::check_quantizer(ty).unwrap_err().to_string();
        assert!(e.contains(ty.name()), "{e}");
        let mut out = vec![0u8; 1 << 12];
        assert!(rows::quantize_rows(ty, &[0.5; 256], 256, &mut out).is_err());
    }
}

#[test]
fn file_types_parse_and_carry_llama_ftype_numbers() {
    assert_eq!(FileType::parse("q4_k").unwrap(), FileType::Q4_K);
    assert_eq!(FileType::Q4_K.llama_ftype(), 15, "Q4_K is Q4_K_M");
    assert_eq!(FileType::Q3_K.llama_ftype(), 12);
    assert_eq!(FileType::Q5_K.llama_ftype(), 17);
    assert_eq!(FileType::BF16.llama_ftype(), 32);
    assert_eq!(FileType::F32.llama_ftype(), 0);
    assert_eq!(FileType::IQ4_XS.default_type(), GgmlType::IQ4_XS);
    for t in FileType::ALL {
        assert_eq!(FileType::parse(t.name()).unwrap(), t);
    }
    let e = FileType::parse("Q4_K_S").unwrap_err().to_string();
    assert!(e.contains("Q4_K_S") && e.contains("IQ4_NL"), "{e}");
}

#[test]
fn type_choice_follows_llama_quant_cpp() {
    use GgmlType::*;
    // SmolLM2's 576-wide rows do not fit 256-blocks: the fallbacks of tensor_type_fallback
    for (k, want) in [
        (Q2_K, Q4_0),
        (Q3_K, Q4_0),
        (Q4_K, Q5_0),
        (Q5_K, Q5_1),
        (Q6_K, Q8_0),
        (IQ4_XS, IQ4_NL),
    ] {
        assert_eq!(fallback(576, k).unwrap(), (want, true), "{k}");
        assert_eq!(fallback(1536, k).unwrap(), (k, false), "{k}");
        assert_eq!(
            tensor_type("blk.0.ffn_up.weight", &[576, 1536], "llama", F32, k, true).unwrap(),
            (want, true)
        );
        assert_eq!(
            tensor_type("blk.0.ffn_down.weight", &[1536, 576], "llama", F32, k, true).unwrap(),
            (k, false)
        );
    }
    // rows that fit no block: F16; a 32-block type stays itself when it fits
    assert_eq!(fallback(100, Q4_K).unwrap(), (F16, true));
    assert_eq!(fallback(100, Q4_0).unwrap(), (F16, true));
    assert_eq!(fallback(576, Q4_0).unwrap(), (Q4_0, false));
    // what is never quantized keeps its type
    for (name, dims) in [
        ("blk.0.attn_norm.weight", &[576u64][..]),
        ("output_norm.weight", &[576]),
        ("blk.3.ffn_gate_inp.weight", &[576, 8]),
        ("blk.0.attn_q.bias", &[576, 4]),
        ("position_embd.weight", &[576, 1024]),
        ("blk.0.ssm_conv1d.weight", &[4, 576]),
        ("blk.0.attn_q.weight", &[576, 1, 1]),
    ] {
        assert!(!allows_quantization(name, dims, "llama"), "{name}");
        assert_eq!(
            tensor_type(name, dims, "llama", F32, Q4_0, true).unwrap(),
            (F32, false),
            "{name}"
        );
    }
    assert!(allows_quantization(
        "token_embd.weight",
        &[576, 49152],
        "llama"
    ));
    assert!(allows_quantization("output.weight", &[576, 49152], "llama"));
    assert!(allows_quantization(
        "blk.0.attn_k_b.weight",
        &[64, 64],
        "llama"
    ));
    assert!(!allows_quantization(
        "blk.0.attn_k_b.weight",
        &[64, 64],
        "glm5-next"
    ));
    // non-block file types: no fallback, and --pure does not matter (the F32 step of the recipe)
    assert_eq!(
        tensor_type(
            "token_embd.weight",
            &[576, 49152],
            "llama",
            Q8_0,
            F32,
            false
        )
        .unwrap(),
        (F32, false)
    );
    assert_eq!(
        tensor_type("blk.0.attn_q.weight", &[100, 4], "llama", F32, F16, true).unwrap(),
        (F16, false)
    );
    // without --pure a block type needs the K-quant mixture: an error
    let e = tensor_type(
        "blk.0.attn_q.weight",
        &[576, 576],
        "llama",
        F32,
        Q4_0,
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--pure"), "{e}");
    assert_eq!(n_dims(&[576, 1, 1, 1]), 1);
    assert_eq!(n_dims(&[576, 1, 3]), 3);
}

#[test]
fn tensor_order_is_the_weights_map_order() {
    let mut names = vec![
        "blk.10.attn_q.weight",
        "output_norm.weight",
        "blk.2.ffn_up.weight",
        "blk.2.attn_k.weight",
        "token_embd.weight",
        "blk.x.weird",
        "blk.-1.neg",
        "blk.0.attn_q.weight",
    ];
    names.sort_by(|a, b| weight_order(a, b));
    assert_eq!(
        names,
        [
            "blk.-1.neg",
            "blk.x.weird",
            "output_norm.weight",
            "token_embd.weight",
            "blk.0.attn_q.weight",
            "blk.2.attn_k.weight",
            "blk.2.ffn_up.weight",
            "blk.10.attn_q.weight",
        ]
    );
}

/// A small source file: metadata with a bool, arrays, the keys llama-quantize moves and removes;
/// tensors out of weights_map order with 576-wide rows, a norm, a 3-D tensor.
fn source_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    let s = |x: &str| MetaValue::String(x.into());
    w.add_metadata("general.architecture", s("llama"));
    w.add_metadata("general.file_type", MetaValue::U32(3));
    w.add_metadata("general.quantization_version", MetaValue::U32(2));
    w.add_metadata("general.name", s("test"));
    w.add_metadata("split.count", MetaValue::U16(1));
    w.add_metadata("tokenizer.ggml.add_bos_token", MetaValue::Bool(true));
    w.add_metadata(
        "some.flags",
        MetaValue::Array(vec![MetaValue::Bool(true), MetaValue::Bool(false)]),
    );
    w.add_metadata(
        "some.scores",
        MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-1.0)]),
    );
    w.add_metadata("llama.rope.freq_base", MetaValue::F64(1e4));
    let x = seeded_rows();
    let q = |ty: GgmlType, n: usize| quantize_row(ty, &x[..n]).unwrap();
    w.add_tensor(
        "blk.1.attn_q.weight",
        &[576, 2],
        GgmlType::Q4_1,
        q(GgmlType::Q4_1, 1152),
    );
    w.add_tensor(
        "output_norm.weight",
        &[64],
        GgmlType::F32,
        q(GgmlType::F32, 64),
    );
    w.add_tensor(
        "token_embd.weight",
        &[576, 3],
        GgmlType::Q8_0,
        q(GgmlType::Q8_0, 1728),
    );
    w.add_tensor(
        "blk.0.ffn_down.weight",
        &[256, 2, 2],
        GgmlType::F16,
        q(GgmlType::F16, 1024),
    );
    w.add_tensor(
        "blk.0.attn_norm.weight",
        &[64],
        GgmlType::F32,
        q(GgmlType::F32, 64),
    );
    w.to_bytes()
}

fn quantized(src: &GgufFile, params: &QuantizeParams) -> Vec<u8> {
    let (_, out) = quantize(src, params, Vec::new(), std::path::Path::new("<test>")).unwrap();
    out
}

#[test]
fn written_files_have_llama_quantize_layout_and_read_back() {
    let src = GgufFile::from_bytes(source_file(), "src").unwrap();
    for ftype in [
        FileType::Q4_0,
        FileType::IQ4_NL,
        FileType::F16,
        FileType::Q5_1,
    ] {
        let params = QuantizeParams::variant(ftype);
        let bytes = quantized(&src, &params);
        let plan = plan(&src, &params).unwrap();
        assert_eq!(bytes.len() as u64, plan.file_size());
        let out = GgufFile::from_bytes(bytes.clone(), "out").unwrap();
        assert_eq!(out.version(), 3);
        assert_eq!(out.alignment(), ALIGNMENT);
        // metadata: source order without the moved and removed keys, then the two set at the end
        let keys: Vec<&str> = out.metadata().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "general.architecture",
                "general.name",
                "tokenizer.ggml.add_bos_token",
                "some.flags",
                "some.scores",
                "llama.rope.freq_base",
                "general.quantization_version",
                "general.file_type",
            ]
        );
        assert_eq!(
            out.get_u32("general.file_type").unwrap(),
            ftype.llama_ftype()
        );
        assert_eq!(out.get_u32("general.quantization_version").unwrap(), 2);
        for (i, (k, _)) in out.metadata().iter().enumerate().take(6) {
            let j = src.metadata().iter().position(|(sk, _)| sk == k).unwrap();
            assert_eq!(
                out.metadata_raw(i),
                src.metadata_raw(j),
                "{k} copied as encoded"
            );
        }
        // tensors: weights_map order, types by the choice, offsets packed at 32, data = quantize(f32)
        let names: Vec<&str> = out.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "output_norm.weight",
                "token_embd.weight",
                "blk.0.attn_norm.weight",
                "blk.0.ffn_down.weight",
                "blk.1.attn_q.weight",
            ]
        );
        let mut next = out.data_offset();
        for t in out.tensors() {
            assert_eq!(t.offset, next, "{}", t.name);
            next += pad(t.n_bytes as u64);
            let s = src.tensor(&t.name).unwrap();
            assert_eq!(t.dims, s.dims);
            let data = out.tensor_data(t);
            if t.name.contains("norm") {
                assert_eq!(t.ggml_type, GgmlType::F32);
                assert_eq!(data, src.tensor_data(s));
                continue;
            }
            assert_eq!(t.ggml_type, ftype.default_type(), "{}", t.name);
            let mut f = vec![0f32; s.n_elements as usize];
            dequantize_row(s.ggml_type, src.tensor_data(s), &mut f).unwrap();
            assert_eq!(
                data,
                &quantize_row(t.ggml_type, &f).unwrap()[..],
                "{}",
                t.name
            );
            // padding is zeros
            let end = (t.offset + t.n_bytes as u64) as usize;
            assert!(bytes[end..pad(end as u64) as usize].iter().all(|&b| b == 0));
        }
        assert_eq!(next, bytes.len() as u64);
        // 3-D tensor kept 3-D; 1-D norms 1-D
        assert_eq!(
            out.tensor("blk.0.ffn_down.weight").unwrap().dims,
            [256, 2, 2]
        );
    }
}

#[test]
fn one_pass_variant_equals_the_two_llama_quantize_steps() {
    let src = GgufFile::from_bytes(source_file(), "src").unwrap();
    // step 1: llama-quantize --allow-requantize SRC F32.gguf F32 (not --pure, not via F32)
    let step1 = QuantizeParams {
        ftype: FileType::F32,
        pure: false,
        allow_requantize: true,
        via_f32: false,
    };
    let f32_file = GgufFile::from_bytes(quantized(&src, &step1), "f32").unwrap();
    assert!(f32_file
        .tensors()
        .iter()
        .all(|t| t.ggml_type == GgmlType::F32));
    assert_eq!(f32_file.get_u32("general.file_type").unwrap(), 0);
    for ftype in [
        FileType::Q4_1,
        FileType::Q8_0,
        FileType::BF16,
        FileType::IQ4_NL,
    ] {
        // step 2: llama-quantize --pure F32.gguf OUT TYPE
        let step2 = QuantizeParams {
            ftype,
            pure: true,
            allow_requantize: false,
            via_f32: false,
        };
        let two = quantized(&f32_file, &step2);
        let one = quantized(&src, &QuantizeParams::variant(ftype));
        assert!(two == one, "{ftype}: one pass differs from two steps");
    }
    // the same source requantized directly copies the tensor that already has the type
    let direct = QuantizeParams {
        via_f32: false,
        ..QuantizeParams::variant(FileType::Q4_1)
    };
    let p = plan(&src, &direct).unwrap();
    let q = p
        .tensors
        .iter()
        .find(|t| t.name == "blk.1.attn_q.weight")
        .unwrap();
    assert!(!q.convert && q.src_type == GgmlType::Q4_1);
}

#[test]
fn bad_requests_are_errors_naming_file_and_problem() {
    let src = GgufFile::from_bytes(source_file(), "src.gguf").unwrap();
    // requantizing without --allow-requantize
    let no_requant = QuantizeParams {
        ftype: FileType::Q4_0,
        pure: true,
        allow_requantize: false,
        via_f32: false,
    };
    let e = plan(&src, &no_requant).unwrap_err().to_string();
    assert!(
        e.contains("src.gguf") && e.contains("requantizing from type") && e.contains("is disabled"),
        "{e}"
    );
    // a K-quant of rows that fit no 256-block falls back; the plan names both
    let p = plan(&src, &QuantizeParams::variant(FileType::Q4_K)).unwrap();
    let t = p
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .unwrap();
    assert_eq!((t.dst_type, t.fell_back), (GgmlType::Q5_0, true));
    let t = p
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap();
    assert_eq!((t.dst_type, t.fell_back), (GgmlType::Q4_K, false));
    // no architecture
    let mut w = GgufWriter::new();
    w.add_metadata("general.name", MetaValue::String("x".into()));
    let f = GgufFile::from_bytes(w.to_bytes(), "noarch.gguf").unwrap();
    let e = plan(&f, &QuantizeParams::variant(FileType::Q8_0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("noarch.gguf") && e.contains("general.architecture"),
        "{e}"
    );
    // an alignment llama-quantize would not keep
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetaValue::String("llama".into()));
    w.set_alignment(64);
    let f = GgufFile::from_bytes(w.to_bytes(), "align.gguf").unwrap();
    let e = plan(&f, &QuantizeParams::variant(FileType::Q8_0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("align.gguf") && e.contains("general.alignment"),
        "{e}"
    );
}

#[test]
fn tiny_model_quantizes_and_loads() {
    let bytes = SynthModel::default().build().unwrap();
    let src = GgufFile::from_bytes(bytes, "tiny").unwrap();
    for ftype in [
        FileType::Q4_0,
        FileType::Q5_1,
        FileType::IQ4_NL,
        FileType::F16,
    ] {
        let out = quantized(&src, &QuantizeParams::variant(ftype));
        let f = GgufFile::from_bytes(out, "tiny-q").unwrap();
        assert_eq!(f.tensors().len(), src.tensors().len());
        assert_eq!(f.get_u32("general.file_type").unwrap(), ftype.llama_ftype());
    }
}
