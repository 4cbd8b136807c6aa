//! Which type each tensor gets: `tensor_allows_quantization`, `tensor_type_fallback` and
//! `llama_tensor_get_type` of src/llama-quant.cpp (pinned llama.cpp 0c1e570), for `--pure` and for the
//! non-quantized file types.

use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// `ggml_is_quantized` (ggml.c `type_traits[].is_quantized`): every block type; not F32, F16, BF16, F64
/// or the integer types.
pub fn is_quantized(ty: GgmlType) -> bool {
    use GgmlType::*;
    !matches!(ty, F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64)
}

/// `tensor_allows_quantization` (llama-quant.cpp) with llama-quantize's default parameters
/// (`quantize_output_tensor` on, `only_copy` off): a tensor of at least two dimensions (`ggml_n_dims`:
/// trailing 1s do not count) whose name ends in `weight` and is none of the excluded kinds (norms,
/// expert gates, positional embeddings, conv1d, RWKV time-mix, multimodal position tensors, …).
///
/// `position_embd.weight` and `token_types.weight` are excluded for every architecture (llama.cpp names
/// them per architecture through `LLM_TN`; no architecture without them has a tensor of that name).
/// `arch` is `general.architecture`; only `glm5-next` has extra exclusions.
pub fn allows_quantization(name: &str, dims: &[u64], arch: &str) -> bool {
    if n_dims(dims) < 2 {
        return false;
    }
    let has = |s: &str| name.contains(s);
    let mut quantize = name.ends_with("weight");
    quantize &= !has("_norm.weight");
    quantize &= !has("ffn_gate_inp.weight");
    quantize &= !has("ffn_gate_tid2eid.weight");
    quantize &= !has("altup");
    quantize &= !has("laurel");
    quantize &= !has("per_layer_model_proj");
    quantize &= name != "position_embd.weight";
    quantize &= name != "token_types.weight";
    quantize &= !has("ssm_conv1d");
    quantize &= !has("shortconv.conv.weight");
    quantize &= !has("indexer.k_proj.weight");
    quantize &= !has("indexer.q_proj.weight");
    if arch == "glm5-next" {
        for s in [
            "hc_",
            "indexer.attn_q_b",
            "indexer.attn_k",
            "indexer.proj",
            "indexer_compressor_gate",
            "indexer_compressor_ape",
            "ssm_f_a.weight",
            "ssm_f_b.weight",
            "ssm_g_a.weight",
            "ssm_g_b.weight",
            "ssm_beta.weight",
            "attn_kv_a_mqa.weight",
            "attn_k_b.weight",
            "attn_v_b.weight",
        ] {
            quantize &= !has(s);
        }
    }
    for s in [
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ] {
        quantize &= !has(s);
    }
    quantize
}

/// `ggml_n_dims`: the number of dimensions up to the last one greater than 1 (at least 1).
pub fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// `tensor_type_fallback` (llama-quant.cpp): the type a tensor with rows of `ncols` elements gets instead
/// of `target` when `ncols` is not a multiple of `target`'s block: IQ4_XS → IQ4_NL; Q2_K, Q3_K → Q4_0;
/// Q4_K → Q5_0; Q5_K → Q5_1; Q6_K → Q8_0 (and the other 256-block IQ/TQ types as llama.cpp maps them);
/// a 32-block type stays itself; and when the result still does not fit, F16. Returns the type and whether
/// it fell back (llama.cpp's `n_fallback`).
///
/// Errors: [`Error::Unsupported`] for a type with a block larger than 32 and no fallback (llama.cpp's
/// "no tensor type fallback is defined for type …").
pub fn fallback(ncols: u64, target: GgmlType) -> Result<(GgmlType, bool)> {
    use GgmlType::*;
    let qk = target.block_size() as u64;
    if ncols.is_multiple_of(qk) {
        return Ok((target, false));
    }
    let mut ty = match target {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        _ if qk <= 32 => target,
        _ => {
            return Err(Error::Unsupported(format!(
                "no tensor type fallback is defined for type {target}"
            )))
        }
    };
    if !ncols.is_multiple_of(ty.block_size() as u64) {
        ty = F16;
    }
    Ok((ty, true))
}

/// The type one tensor gets: `llama_tensor_get_type` (llama-quant.cpp) with no `--tensor-type`,
/// `--token-embedding-type` or `--output-tensor-type` options.
///
/// A tensor [`allows_quantization`] refuses keeps `src_type`. Otherwise it gets `default_type`; when that
/// is a block type (`ggml_is_quantized`) the `--pure` choice is kept and [`fallback`] applied to the row
/// length `dims[0]`. Returns the type and whether it fell back.
///
/// Errors: `pure == false` with a block `default_type` — the K-quant mixture of
/// `llama_tensor_get_type_impl` is not mirrored, so only `--pure` is made ([`Error::Unsupported`]); a
/// [`fallback`] error.
pub fn tensor_type(
    name: &str,
    dims: &[u64],
    arch: &str,
    src_type: GgmlType,
    default_type: GgmlType,
    pure: bool,
) -> Result<(GgmlType, bool)> {
    if !allows_quantization(name, dims, arch) {
        return Ok((src_type, false));
    }
    if !is_quantized(default_type) {
        return Ok((default_type, false));
    }
    if !pure {
        return Err(Error::Unsupported(format!(
            "only --pure quantization is implemented: llama.cpp's mixture of types for {default_type} \
             (llama_tensor_get_type_impl) is not mirrored"
        )));
    }
    fallback(dims.first().copied().unwrap_or(0), default_type)
}

/// `weight_name_comparer` (src/llama-model-loader.h), the order of `llama_model_loader::weights_map` and
/// hence of the tensors llama-quantize writes: by the layer number `N` of a `blk.N.` prefix (as `sscanf`'s
/// `%d` reads it; -1 for a name without one), then by name (byte order, `std::string::operator<`).
pub fn weight_order(a: &str, b: &str) -> std::cmp::Ordering {
    layer_of(a).cmp(&layer_of(b)).then_with(|| a.cmp(b))
}

/// `sscanf(name, "blk.%d.", &layer)` with `layer = -1` beforehand: the `%d` after `blk.` (leading white
/// space and a sign allowed), or -1 when no digits follow. A number outside the `int` range (undefined
/// behaviour in C, never in a real name) is clamped to it.
fn layer_of(name: &str) -> i64 {
    let Some(rest) = name.strip_prefix("blk.") else {
        return -1;
    };
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, digits) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    let n_digits = digits.bytes().take_while(u8::is_ascii_digit).count();
    if n_digits == 0 {
        return -1;
    }
    let mut v: i64 = 0;
    for b in digits[..n_digits].bytes() {
        v = (v * 10 + i64::from(b - b'0')).min(i64::from(i32::MAX) + 1);
    }
    let v = if neg { -v } else { v };
    v.clamp(i64::from(i32::MIN), i64::from(i32::MAX))
}
