//! ggml tensor types: block layouts, row dequantization, and dot products in two numerics modes.
//!
//! Source of truth for every layout: ggml's `ggml/src/ggml-common.h` (block structs) and
//! `ggml/src/ggml-quants.c` / `ggml/src/ggml-cpu/quants.c` (dequantize / quantize / vec_dot reference
//! code). Weights are read as little-endian bytes straight from the memory map; nothing is dequantized at
//! load. One module per format (`q4_0`, `q4_1`, `q5_0`, `q5_1`, `q8` = Q8_0 + Q8_1, `iq4_nl`, `q8_k`,
//! `q2_k`, `q3_k`, `q4_k`, `q5_k`, `q6_k`, `iq4_xs`, `float` = F32/F16/BF16); `fp` holds ggml's f16/bf16 conversions, `x86` the scalar replicas of the SIMD
//! reduction steps, `reference` the reference-mode dot products, `prepared` the [`PreparedRow`]; `avx2`
//! and `avx512` the SIMD kernels of ggml mode ([`crate::numerics::Simd`]), each bit-identical to the scalar
//! replicas, and the 16-token AVX-512 tiles of prompt batches: `pair_tile` (Q5_0, Q8_0), `ktile`
//! (Q4_K, Q6_K) and `nibble_tile` (the repacked Q4_0 / IQ4_NL gemm, sixteen weight rows at once),
//! chosen per token group by `simd_rows` ([`Wide`]), and their AVX2 counterparts for Q4_K and Q6_K,
//! one weight row against eight tokens (`avx2::ktile8`); `bf16_dp` BF16 weights on `vdpbf16ps` itself where the
//! CPU has AVX512-BF16 (`avx2_float` emulates it elsewhere).
//!
//! | type | dequantize | quantize (`_ref`) | dot (both modes) | `vec_dot_type` |
//! |---|---|---|---|---|
//! | F32, F16, BF16 | yes | yes | yes | itself |
//! | Q4_0, Q5_0, Q8_0 | yes | yes | yes | Q8_0 |
//! | IQ4_NL | yes | yes | yes | Q8_0 |
//! | Q4_1 | yes | yes | yes | Q8_1 |
//! | Q5_1 | yes | yes | yes | Q8_1 |
//! | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS | yes | yes | yes | Q8_K |
//! | Q8_1, Q8_K (activation types) | yes | yes | no | — |
//!
//! The K-quant and IQ4_XS reference quantizers (helpers in `kquant_ref`) reproduce `llama-quantize --pure`
//! without an importance matrix byte for byte: libggml-base, which holds `ggml-quants.c`, is compiled
//! without `-march=native` and so without FMA contraction (`kquant_ref` has the evidence).
//!
//! # What ggml mode reproduces, and what llama.cpp on this machine actually runs
//!
//! The llama.cpp that matters is the one vendored by llama-cpp-python 0.3.36 (ggml 0.25.3), built on this
//! machine with `GGML_NATIVE` (one `libggml-cpu.so`; `ggml_cpu_has_*`: AVX2, FMA, F16C, AVX-512 F/VNNI/BF16,
//! AVX-VNNI; AVX512-FP16 not used by the build), `GGML_LLAMAFILE` on and `GGML_CPU_REPACK` on. What I
//! found reading its sources (and its disassembly, and calling its kernels through ctypes — see
//! `oracles/fixtures/make_quant_fixtures.py` and `tests/quant_vs_gguf.rs`):
//!
//! **The vec_dot path** (`ggml_compute_forward_mul_mat` → `ggml_compute_forward_mul_mat_one_chunk`,
//! ggml-cpu.c). The activation row is converted once by `type_traits_cpu[vec_dot_type].from_float`: on x86
//! that is `quantize_row_q8_0` / `quantize_row_q8_1` from `ggml-cpu/arch/x86/quants.c`, *not* the `_ref`
//! functions: `id = 127/max` instead of `1/d`, round half to even instead of `roundf`, saturating packs;
//! `quantize_row_q8_K` is `quantize_row_q8_K_ref`. Then each weight row goes through the x86 kernel
//! (`ggml_vec_dot_q4_1_q8_1` etc. in arch/x86/quants.c, AVX2 branch), which keeps eight f32 lanes — lane `l`
//! takes the integer dot of elements `4l..4l+4` of each 32-block (exact, `vpdpbusd`) — updates them with
//! `fma(d_w*d_x, lane, acc)` block after block, and adds the lanes with `hsum_float_8`. That is not the order
//! of the portable C (`ggml_vec_dot_*_generic` in ggml-cpu/quants.c: `sumf += sumi*d_x*d_y` per block).
//! The K-quant and IQ4 kernels follow the same pattern with their own lane layouts and scale orders,
//! documented at each replica (`q2_k::dot_q8_k` etc.); two of them deviate from "one `__m256`, one fma per
//! block": `ggml_vec_dot_iq4_nl_q8_0` alternates two accumulators between even and odd blocks and adds an odd
//! last block in scalar code (not fma-contracted), and `ggml_vec_dot_q5_K_q8_K` (like Q4_1/Q5_1) keeps the
//! mins term in a scalar fma'd `summs`. None of the quant kernels of arch/x86/quants.c has an `__AVX512*`
//! branch (checked for Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS as for the older types): an AVX-512 build runs
//! their `__AVX2__` code, whose only VNNI variant is the exact integer `mul_sum_us8_pairs_float` (Q4_1,
//! Q5_1).
//! **Ggml mode mirrors the x86 kernels step for step** (exactly rounded fmas, `x86::fma`), because they are
//! what runs here: on the committed fixtures every dot product and every quantized activation is
//! bit-identical to the real `libggml-cpu.so`. Threads split output rows and the activation is quantized per
//! block, so thread count changes nothing.
//!
//! **Float weights** (F32, F16, BF16; `ggml_vec_dot_f32/f16/bf16`, ggml-cpu/vec.cpp) are the one place
//! where the vec_dot kernel itself depends on the build: the AVX-512 build runs four 16-lane accumulators
//! over chunks of 64 (`_mm512_dpbf16_ps` for BF16), an AVX2-only build four 8-lane ones over chunks of 32
//! with `GGML_F32x8_REDUCE` (BF16: its `__AVX2__` branch, fma-contracted, `hsum`); ggml mode mirrors
//! both, [`GgmlPath::VecDot`] for the former and [`GgmlPath::VecDotAvx2`] for the latter (`float.rs`).
//! An AVX-512 build without AVX512-BF16 runs `ggml_vec_dot_bf16`'s `__AVX512F__` branch instead (two
//! 16-lane fma accumulators over chunks of 32): [`GgmlPath::VecDotNoBf16`].
//!
//! **Batched prefill, llamafile sgemm** (`llamafile_sgemm`, ggml-cpu/llamafile/sgemm.cpp, tried first
//! when the batch is ≥ 2): handles F32, F16, BF16 weights when the row count is a multiple of 4 (tinyBLAS:
//! one 16-lane accumulator per output, then `_mm512_reduce_add_ps` — a different order from
//! `ggml_vec_dot_f32/f16/bf16`, mirrored as [`GgmlPath::TinyBlas`]; an AVX2 build's `tinyBLAS<8, __m256>`
//! keeps one 8-lane accumulator and `hsum`, for row lengths that are multiples of 8,
//! [`GgmlPath::TinyBlasAvx2`]; BF16 in an AVX-512 build without AVX512-BF16 is `tinyBLAS<16, __m512,
//! __m512>`, the F32 arithmetic on widened bf16, [`GgmlPath::TinyBlasNoBf16`]) and Q8_0, Q4_0, Q5_0, IQ4_NL
//! weights with Q8_0 activations (`tinyBLAS_Q0_AVX`). The latter computes, per output, the same lane
//! integers (`updot`: the sign-trick products), one `fma(d_w*d_x, lane, acc)` per block into *one*
//! accumulator and the same `hsum`: for Q4_0/Q5_0/Q8_0 exactly the vec_dot kernel (bit-identical), for
//! IQ4_NL not (its vec_dot alternates two accumulators), so ggml mode mirrors IQ4_NL's tinyBLAS order
//! separately ([`GgmlPath::TinyBlasQ0`]); all checked on whole `ggml_mul_mat` ops at batch 4 and 9 in
//! `tests/quant_vs_gguf.rs`. Q4_1, Q5_1, the K-quants and IQ4_XS are not handled by tinyBLAS.
//!
//! **Repacking** (extra buffer type `CPU_REPACK`, ggml-cpu/repack.cpp `ggml_repack_get_optimal_repack_type`;
//! llama.cpp uses it by default, `llama_model_params .use_extra_bufts = true`, and llama-cpp-python does not
//! change that). On x86 with AVX2: Q4_0 weights with a row count divisible by 8 become `q4_0_8x8_q8_0`, Q4_K
//! → `q4_K_8x8_q8_K`, also IQ4_NL (`iq4_nl_8x8_q8_0`) and MXFP4 (Q2_K → `q2_K_8x8_q8_K` only with
//! AVX-512; the Q5_K and Q6_K repacks are ARM-only). Those matmuls run `ggml_gemv_*` /
//! `ggml_gemm_*` (arch/x86/repack.cpp) with their own activation quantization (`ggml_quantize_mat_q8_*_4x8`)
//! and accumulation order. Ggml mode mirrors the Q4_K ones ([`GgmlPath::RepackGemm`] for batch rows in
//! groups of 4, [`GgmlPath::RepackGemv`] for decode and the last `B % 4` rows: one fma per pair of
//! sub-blocks, resp. per super-block), the Q2_K ones of an AVX-512 build (gemm one fma per half of 128
//! elements, gemv one per super-block; [`ggml_path`] takes the golden's [`GgmlTarget`] for this), and the
//! Q4_0 and IQ4_NL ones (`q4_0_8x8_q8_0`, `iq4_nl_8x8_q8_0`: one fma per block on a single accumulator,
//! gemm and gemv alike). Not repacked on x86: Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q5_K, Q6_K,
//! IQ4_XS, F16, BF16, F32. `token_embd` is read by GET_ROWS with `dequantize_row_*`
//! (libggml-base), which [`dequantize_row`] matches bit for bit.
//!
//! **Tiled K-quant matmul** (ggml-cpu/tiled, new in this version): for batches ≥ 8, weights that were not
//! repacked of the types `ggml_tiled_supported` lists (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, and IQ2_*,
//! IQ3_*, IQ1_*; *not* IQ4_NL, Q5_1 or the other 32-blocks) go to `ggml_compute_forward_mul_mat_tiled`
//! unless `GGML_CPU_TILED_MM=0`: per super-block `res = d_w·s1`, `res = fma(−dmin_w, s2, res)` for the
//! types with mins (Q2_K, Q4_K, Q5_K), `acc = fma(res, d_x, acc)`, with exact integers
//! `s1 = Σ scale·Σ q·q8`, `s2 = Σ min·bsum` (the biased codes of Q3_K, Q6_K, IQ4_XS are corrected through
//! the Q8_K sums, exactly). The AVX2 kernel (`tiled_run_microtile_avx2`) and the AVX-512 VNNI kernel this
//! build runs (`tiled_run_micro_vnni_8x16`) compute the same integers and the same three roundings — except
//! for IQ4_XS with a −128 activation quant (only a NaN input gives one): the AVX2 kernel uses the sign
//! trick there, VNNI the plain product, which ggml mode follows. Ggml mode mirrors the tiled path for all
//! six types ([`GgmlPath::Tiled`]); the fixtures check each of them bit for bit at batch 9.
//!
//! [`ggml_path`] picks the kernel per weight and batch row the way llama.cpp does, so ggml mode is exactly as
//! batch-dependent as llama.cpp (a decode step is not a re-prefill).
//!
//! **So, per model** (measured against the committed goldens, `lockstep run --mode ggml`): SmolLM2 Q4_1 (+
//! Q8_0 tied output), Gemma 3 270M and Qwen2.5-Coder-0.5B Q4_K_M (Q5_0, Q8_0, Q4_K, Q6_K, F32) are
//! bit-exact in prefill and decode. The SmolLM2 variants made by llama-quantize (every captured stage of a
//! 14-token prefill against llama-cpp-python, F32 KV cache): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS bit-identical with llama.cpp's default
//! repacking (Q2_K repacked, on this AVX-512 host); F32, F16 and BF16 also against an AVX2-only build of
//! the same llama.cpp (goldens made with `LOCKSTEP_ORACLE_CPU=avx2`, which record `ggml_cpu_flags`), with
//! [`GgmlTarget::Avx2`]; the seeded synth models' BF16 variants against the native build of an AVX-512
//! host without AVX512-BF16, with [`GgmlTarget::Avx512NoBf16`]. What remains outside the contract:
//! 1. MXFP4 weights, and Q2_K on a host with AVX-512 F but not DQ (ggml repacks Q2_K on
//!    `ggml_cpu_has_avx512()`, i.e. AVX-512 F, while [`GgmlTarget::Avx512`] needs F and DQ);
//! 2. an F16 KV cache (llama.cpp's default): attention is not a weight matmul and lives in
//!    `crate::ops::ggml_cpu`, which mirrors KQ and KQV for an F32 KV cache only;
//! 3. a NaN in an activation block: ggml's max tree drops or keeps it by position and a NaN quantizes to
//!    -128; both are mirrored, but the NaN payloads themselves are not part of the contract;
//! 4. everything outside these kernels — norms, RoPE, softmax, SiLU/GELU — is mirrored in
//!    `crate::ops::ggml_cpu`, per ggml target (AVX2, AVX-512), not here; the quantized kernels here are the
//!    same on all targets (ggml-cpu has only AVX2 branches for them, or AVX-512 ones with the same
//!    arithmetic), only the choice of kernel for Q2_K and the float kernels depend on the target
//!    ([`ggml_path`]; of those, only BF16's on AVX512-BF16);
//! 5. on another CPU (no FMA, ARM) llama.cpp picks other kernels and this bit-exactness does not carry over.
//!
//! Reference mode is plain: dequantize to f32 (the values [`dequantize_row_with`] gives with the session's
//! SIMD setting — the portable code under [`Simd::Off`] — identical to the `gguf` package's and to ggml's
//! `dequantize_row_*`), f32 multiply-accumulate in a fixed order (see `reference.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_float;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
mod bf16_dp;
#[cfg(target_arch = "x86_64")]
mod dequantize_simd;
#[cfg(target_arch = "x86_64")]
mod f16_tile;
mod float;
#[cfg(target_arch = "x86_64")]
mod float_tile_avx2;
mod fp;
mod iq4_nl;
pub(crate) mod iq4_nlx8;
mod iq4_xs;
mod kquant_ref;
pub(crate) mod ktile;
mod nibble_tile;
mod pair_tile;
mod prepared;
mod q2_k;
mod q3_k;
mod q4_0;
pub(crate) mod q4_0x8;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8;
mod q8_k;
mod reference;
mod reference_fma;
mod reference_fused;
mod simd_rows;
mod table;
mod types;
pub(crate) mod x86;

pub use prepared::PreparedRow;

pub use types::GgmlType;

pub(crate) use reference_fma::Lanes16;
pub(crate) use simd_rows::{simd_kernel, tile_scales, SimdKernel, Wide};

/// Reference mode with SIMD on: every product of the dequantized weight rows `w` (`[w.len() / cols,
/// cols]`) with the activation rows `xs` in the 16-lane fma order of `reference_fma.rs`, through
/// `put(row, token, value)`. Panics if a row is shorter than `cols` (the caller's contract).
pub(crate) fn reference_fma_matmul(
    lanes: Lanes16,
    w: &[f32],
    cols: usize,
    xs: &[&[f32]],
    put: impl FnMut(usize, usize, f32),
) {
    reference_fma::matmul(lanes, w, cols, xs, put)
}

/// True when [`f16_tinyblas_matmul`] can run on this CPU (AVX-512 F).
pub(crate) fn f16_tiles_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return f16_tile::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Ggml mode, F16 weights on the AVX-512 build's tinyBLAS ([`GgmlPath::TinyBlas`]), AVX-512 kernels:
/// `put(i, t, ·)` for each of the `n_rows` F16 rows of `row_bytes` bytes in `rows` and each activation
/// row's f16 bytes `xs[t]` ([`PreparedRow::ggml_blocks`]), in tinyBLAS's order with the f16 widened
/// inside the tile (`f16_tile.rs`): the bits of [`vec_dot_path`] on that path.
///
/// # Panics
/// If [`f16_tiles_available`] is false, `row_bytes` is not a multiple of 32, or a row is short.
pub(crate) fn f16_tinyblas_matmul(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: &[&[u8]],
    put: impl FnMut(usize, usize, f32),
) {
    assert!(f16_tiles_available(), "the F16 tiles need AVX-512 F");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512 F checked just above.
    unsafe {
        f16_tile::matmul(rows, row_bytes, n_rows, xs, put)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, row_bytes, n_rows, xs, put);
}

/// True when [`float_tinyblas_avx2_matmul`] can run on this CPU (AVX2, FMA, F16C).
pub(crate) fn float_tiles_avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return float_tile_avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Ggml mode, F32/F16/BF16 weights (`ty`) on the AVX2 build's tinyBLAS ([`GgmlPath::TinyBlasAvx2`]):
/// `put(i, t, ·)` for each of the `n_rows` rows of `row_bytes` bytes in `rows` and each activation row
/// `xs[t]` ([`PreparedRow::x`]: rounded to `ty` and widened), in `tinyBLAS<8, __m256>`'s order with
/// four rows × three tokens per register tile (`float_tile_avx2.rs`): the bits of [`vec_dot_path`] on
/// that path.
///
/// # Panics
/// If [`float_tiles_avx2_available`] is false, `ty` is not a float type, the row length is not a
/// multiple of 8 elements, or a row is short.
pub(crate) fn float_tinyblas_avx2_matmul(
    ty: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: &[&[f32]],
    put: impl FnMut(usize, usize, f32),
) {
    assert!(
        float_tiles_avx2_available(),
        "the AVX2 float tiles need AVX2, FMA and F16C"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX2, FMA and F16C checked just above.
    unsafe {
        float_tile_avx2::matmul(ty, rows, row_bytes, n_rows, xs, put)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, rows, row_bytes, n_rows, xs, put);
}

/// True when [`reference_fused_matmul`] has a kernel for weights of `ty` on this CPU
/// (`reference_fused.rs`: AVX-512 F; Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K).
pub(crate) fn reference_fused_supported(ty: GgmlType) -> bool {
    reference_fused::supported(ty)
}

/// Reference mode with SIMD on, few tokens: the products of the quantized weight rows `w` (whole rows of
/// `row_bytes` bytes, `cols` elements of `ty`) with `xs`, each block dequantized in registers and fused
/// into the 16-lane order — the bits of [`reference_fma_matmul`] on the dequantized rows, without writing
/// them out. Panics where [`reference_fused_supported`] is false or the lengths disagree.
pub(crate) fn reference_fused_matmul(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    cols: usize,
    xs: &[&[f32]],
    put: impl FnMut(usize, usize, f32),
) {
    reference_fused::matmul(ty, w, row_bytes, cols, xs, put)
}

use crate::numerics::{GgmlTarget, NumericsMode, Simd};

use crate::Error;

/// True if `ty` has dequantization and dot-product kernels (weights of this type can be used in a matmul):
/// its row of the type table (`table.rs`) has [dot kernels](table::Dots).
pub fn supports(ty: GgmlType) -> bool {
    dots(ty).is_some()
}

/// The type ggml-cpu converts the activation to before a dot product with weights of `ty`
/// (`type_traits_cpu[ty].vec_dot_type`, ggml-cpu.c), or `None` if this module has no dot kernel for `ty`.
pub fn vec_dot_type(ty: GgmlType) -> Option<GgmlType> {
    Some(dots(ty)?.vec_dot_type)
}

/// The dot kernels of weight type `ty` (its row of the type table), `None` for a type without them.
fn dots(ty: GgmlType) -> Option<&'static table::Dots> {
    table::traits(ty)?.dot.as_ref()
}

/// The dot kernels of weight type `weight_ty`, for the kernels' callers, whose weights were checked at
/// load ([`supports`]; `models::weights` refuses a tensor of another type, naming it).
///
/// # Panics
/// If `weight_ty` has no dot kernels: a caller's bug (a row prepared for a type without kernels cannot
/// exist: [`PreparedRow::prepare`] refuses it).
fn dots_of(weight_ty: GgmlType) -> &'static table::Dots {
    dots(weight_ty).unwrap_or_else(|| panic!("no dot kernel for {weight_ty}"))
}

/// Check that `n_bytes` holds exactly `n_elements` of `ty`.
fn check_len(ty: GgmlType, n_bytes: usize, n_elements: usize) -> crate::Result<()> {
    match ty.bytes_for(n_elements as u64) {
        Some(b) if b == n_bytes => Ok(()),
        Some(b) => Err(Error::Invalid(format!(
            "{ty}: {n_elements} elements take {b} bytes, got {n_bytes}"
        ))),
        None => Err(Error::Invalid(format!(
            "{ty}: {n_elements} elements is not a whole number of {}-element blocks",
            ty.block_size()
        ))),
    }
}

/// Dequantize a row: `src` holds the ggml blocks of `dst.len()` elements of `ty`, with the kernels of
/// the best SIMD setting this CPU runs ([`Simd::detect`], under the `LOCKSTEP_CPU` cap): the AVX2 forms
/// of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K where it is [`Simd::Avx2`] or [`Simd::Avx512`], the portable
/// code otherwise. For code that runs under a session's `--simd` setting (the weight rows of reference
/// mode's matmuls, the embedding lookup) use [`dequantize_row_with`] with that setting, so that
/// [`Simd::Off`] runs the portable code; this one is for loaders and tools that have no setting. Both
/// give the same values (see [`dequantize_row_with`]).
///
/// Errors: as [`dequantize_row_with`].
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> crate::Result<()> {
    dequantize_row_with(ty, src, dst, Simd::detect())
}

/// Dequantize a row (`src`: the ggml blocks of `dst.len()` elements of `ty`) with the kernels of the SIMD
/// setting `simd`.
///
/// Bit for bit ggml's `dequantize_row_<type>` (ggml-quants.c) and the `gguf` package's `dequantize`,
/// whichever kernels run:
/// - [`Simd::Off`]: the portable scalar code of every type (its `dequantize_block`, e.g.
///   `q4_0::dequantize_block`), never an x86 intrinsic — the code `--simd off` exists to check;
/// - [`Simd::Avx2`] and [`Simd::Avx512`]: the AVX2 forms of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K
///   (`dequantize_simd.rs`: the same operations in the same order on eight lanes, the same bits) where
///   the CPU has AVX2 ([`crate::numerics::cpu_has`]), the portable code for other types and on a CPU
///   without AVX2.
///
/// Errors: [`Error::Invalid`] if `src.len() != ty.bytes_for(dst.len())`; [`Error::Unsupported`] for types
/// without a kernel.
pub fn dequantize_row_with(
    ty: GgmlType,
    src: &[u8],
    dst: &mut [f32],
    simd: Simd,
) -> crate::Result<()> {
    let t = table::traits(ty)
        .ok_or_else(|| Error::Unsupported(format!("no dequantization kernel for {ty}")))?;
    check_len(ty, src.len(), dst.len())?;
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Off && dequantize_simd::dequantize_row(ty, src, dst) {
        return Ok(());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    (t.dequantize)(src, dst);
    Ok(())
}

/// Quantize a row with ggml's reference quantizers — the ones that write model files:
/// `quantize_row_{q4_0,q4_1,q5_0,q5_1,q8_0,q8_1,q2_K,q3_K,q4_K,q5_K,q6_K,q8_K}_ref`, `quantize_iq4_nl` and
/// `quantize_iq4_xs` (ggml-quants.c, without an importance matrix), `ggml_fp32_to_fp16_row`, `ggml_fp32_to_bf16_row_ref`, and a plain copy for F32.
/// Output bytes are identical to libggml-base's (including NaN handling). For the activation quantizers
/// ggml-cpu uses inside a matmul, see [`PreparedRow`].
///
/// Errors: [`Error::Invalid`] if `src.len()` is not a whole number of blocks; [`Error::Unsupported`] for
/// other types (see [`quantize_into`]).
pub fn quantize_row(ty: GgmlType, src: &[f32]) -> crate::Result<Vec<u8>> {
    let n_bytes = ty.bytes_for(src.len() as u64).ok_or_else(|| {
        Error::Invalid(format!(
            "{ty}: {} elements is not a whole number of {}-element blocks",
            src.len(),
            ty.block_size()
        ))
    })?;
    let mut dst = vec![0u8; n_bytes];
    quantize_into(ty, src, &mut dst)?;
    Ok(dst)
}

/// [`quantize_row`] into a caller's buffer: `dst` must be exactly `ty.bytes_for(src.len())` bytes. The
/// quantizers work block by block, so any whole number of rows (or blocks) may be passed at once.
///
/// Errors: [`Error::Invalid`] if `src.len()` is not a whole number of blocks or `dst` has the wrong size;
/// [`Error::Unsupported`] naming the type for a type without a reference quantizer here (the IQ2/IQ3/IQ1,
/// TQ, MXFP4 and integer types).
pub fn quantize_into(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> crate::Result<()> {
    let t = table::traits(ty)
        .ok_or_else(|| Error::Unsupported(format!("no reference quantizer for {ty}")))?;
    check_len(ty, dst.len(), src.len())?;
    (t.quantize)(src, dst);
    Ok(())
}

/// Reference mode's dot product of a weight row already dequantized to f32 ([`dequantize_row`]) with a
/// prepared reference row: the bits [`vec_dot`] gives for the same row (`reference.rs` states the order with
/// SIMD off, `reference_fma.rs` with SIMD on).
/// `w.len()` equals `x.len()` (the caller's contract).
pub fn dot_dequantized(w: &[f32], x: &PreparedRow) -> f32 {
    debug_assert_eq!(x.mode(), NumericsMode::Reference);
    reference::dot_dequantized(w, &x.x, x.simd)
}

/// Dot product of one weight row (raw block bytes straight from the mmap, unaligned) with a prepared row.
///
/// - Reference mode: dequantize and f32 multiply-accumulate, in the order of `reference.rs` with SIMD off,
///   of `reference_fma.rs` with SIMD on (the row's `simd`).
/// - Ggml mode: the x86 `ggml_vec_dot_<type>_<vec_dot_type>` of this machine's llama.cpp build, step for
///   step (see the module docs): `ggml_vec_dot_q4_0_q8_0`, `ggml_vec_dot_q4_1_q8_1`,
///   `ggml_vec_dot_q5_0_q8_0`, `ggml_vec_dot_q5_1_q8_1`, `ggml_vec_dot_q8_0_q8_0`,
///   `ggml_vec_dot_iq4_nl_q8_0`, `ggml_vec_dot_q2_K_q8_K`, `ggml_vec_dot_q3_K_q8_K`,
///   `ggml_vec_dot_q4_K_q8_K`, `ggml_vec_dot_q5_K_q8_K`, `ggml_vec_dot_q6_K_q8_K`,
///   `ggml_vec_dot_iq4_xs_q8_K` (arch/x86/quants.c), `ggml_vec_dot_f32`, `ggml_vec_dot_f16`,
///   `ggml_vec_dot_bf16` (vec.cpp). Other kernels of a matmul: [`vec_dot_path`].
///
/// Lengths are the caller's contract: `w_row` holds `x.len()` elements of `weight_ty`, and `x` was prepared
/// for `weight_ty` or a type with the same `vec_dot_type` (checked by `debug_assert`).
///
/// # Panics
/// If `weight_ty` has no dot kernel ([`supports`]; such a row cannot have been prepared).
pub fn vec_dot(weight_ty: GgmlType, w_row: &[u8], x: &PreparedRow) -> f32 {
    debug_assert_eq!(
        weight_ty.bytes_for(x.len() as u64),
        Some(w_row.len()),
        "{weight_ty} row of {} bytes against {} prepared elements",
        w_row.len(),
        x.len()
    );
    let d = dots_of(weight_ty);
    match x.mode() {
        NumericsMode::Reference if x.simd => {
            // the 16-lane fma order (reference_fma.rs) on the dequantized row, as the batched matmul
            let mut deq = vec![0f32; x.len()];
            (table::traits(weight_ty)
                .expect("a type with dots")
                .dequantize)(w_row, &mut deq);
            reference::dot_dequantized(&deq, &x.x, true)
        }
        NumericsMode::Reference => (d.reference)(w_row, &x.x),
        NumericsMode::Ggml => {
            debug_assert_eq!(
                vec_dot_type(weight_ty),
                x.activation_type(),
                "row prepared for {:?}, used with {weight_ty}",
                x.weight_type()
            );
            (d.ggml)(w_row, x)
        }
    }
}

/// Which ggml-cpu kernel computes one output of a ggml-mode matmul. llama.cpp's choice depends on the
/// weight type, the weight's row count and the batch (`ggml_compute_forward_mul_mat` in ggml-cpu.c, the
/// `CPU_REPACK` buffer of repack.cpp, ggml-cpu/tiled); only the choices whose arithmetic differs from the
/// vec_dot kernels are named here (tinyBLAS_Q0 for Q8_0/Q5_0/Q4_0 computes exactly what vec_dot does; for
/// IQ4_NL it does not: [`GgmlPath::TinyBlasQ0`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlPath {
    /// `ggml_vec_dot_<type>_<vec_dot_type>` (arch/x86/quants.c).
    VecDot,
    /// Repacked weights (`q4_K_8x8_q8_K`, `q2_K_8x8_q8_K`, `q4_0_8x8_q8_0`, `iq4_nl_8x8_q8_0`): the
    /// `ggml_gemv_*` kernel (decode; the last `B % 4` batch rows).
    RepackGemv,
    /// Repacked weights: the `ggml_gemm_*` kernel (batch rows `0 .. B − B % 4`).
    RepackGemm,
    /// ggml-cpu/tiled K-quant matmul (batches ≥ 8; Q2_K, Q3_K, Q5_K, Q6_K, IQ4_XS, and Q4_K not
    /// repacked).
    Tiled,
    /// llamafile's `tinyBLAS` for F32/F16/BF16 weights, AVX-512 build (ggml-cpu/llamafile/sgemm.cpp;
    /// batches ≥ 2, row count a multiple of 4): one 16-lane accumulator per output,
    /// `_mm512_reduce_add_ps` (`float::dot_tinyblas`).
    TinyBlas,
    /// llamafile's `tinyBLAS<8, __m256>` for F32/F16/BF16 weights, AVX2 build (batches ≥ 2, row count a
    /// multiple of 4, row length a multiple of 8): one 8-lane accumulator per output, `hsum`
    /// (`float::dot_tinyblas_avx2`).
    TinyBlasAvx2,
    /// `ggml_vec_dot_f32` / `ggml_vec_dot_f16` / `ggml_vec_dot_bf16` (vec.cpp) of an AVX2 build, for
    /// F32/F16/BF16 weights (`float::dot_f32_avx2` etc.): where [`GgmlPath::VecDot`] runs the AVX-512
    /// build's branches of those functions for float weights, this is what an AVX2-only llama.cpp runs.
    VecDotAvx2,
    /// llamafile's `tinyBLAS<16, __m512, __m512, ggml_bf16_t, ...>` for BF16 weights in an AVX-512 build
    /// without AVX512-BF16 (batches ≥ 2, row count a multiple of 4, row length a multiple of 16): one
    /// 16-lane fma accumulator per output, `_mm512_reduce_add_ps` (`float::dot_tinyblas_bf16_avx512f`).
    TinyBlasNoBf16,
    /// `ggml_vec_dot_bf16`'s `__AVX512F__` branch (vec.cpp) for BF16 weights in an AVX-512 build without
    /// AVX512-BF16: two 16-lane fma accumulators over chunks of 32 (`float::dot_bf16_avx512f`), where
    /// [`GgmlPath::VecDot`] runs the `__AVX512BF16__` branch (`_mm512_dpbf16_ps`).
    VecDotNoBf16,
    /// llamafile's `tinyBLAS_Q0_AVX` where its arithmetic differs from the vec_dot kernel's: IQ4_NL
    /// weights that are not repacked, batches ≥ 2 (one accumulator where `ggml_vec_dot_iq4_nl_q8_0`
    /// alternates two).
    TinyBlasQ0,
}

/// `path` if it names a kernel that exists for weights of `ty` (its row of the type table has it), else
/// [`GgmlPath::VecDot`] (what [`vec_dot_path`] computes for it).
pub(crate) fn effective_path(ty: GgmlType, path: GgmlPath) -> GgmlPath {
    let Some(d) = dots(ty) else {
        return GgmlPath::VecDot;
    };
    let exists = match path {
        GgmlPath::VecDot => true,
        GgmlPath::RepackGemv | GgmlPath::RepackGemm => d.repack.is_some(),
        GgmlPath::Tiled => d.tiled.is_some(),
        GgmlPath::TinyBlasQ0 => d.tinyblas_q0.is_some(),
        GgmlPath::TinyBlas | GgmlPath::TinyBlasAvx2 | GgmlPath::VecDotAvx2 => d.float.is_some(),
        GgmlPath::TinyBlasNoBf16 | GgmlPath::VecDotNoBf16 => {
            d.float.as_ref().is_some_and(|f| f.avx512_nobf16.is_some())
        }
    };
    if exists {
        path
    } else {
        GgmlPath::VecDot
    }
}

/// The kernel llama.cpp (the pinned version, default `CPU_REPACK` on x86 with AVX2) built for `target`
/// uses for output row `t` of a `[n_tokens]`-row activation batch against a `[rows, cols]` weight of type
/// `ty`:
///
/// - Q4_K, Q4_0 and IQ4_NL with `rows % 8 == 0` are repacked (`ggml_repack_get_optimal_repack_type`,
///   ggml-cpu/repack.cpp: `q4_K_8x8_q8_K`, `q4_0_8x8_q8_0`, `iq4_nl_8x8_q8_0`), and so is Q2_K with
///   `rows % 8 == 0` when the target is [`GgmlTarget::Avx512`] (`q2_K_8x8_q8_K`, only if
///   `ggml_cpu_has_avx512()`): gemm for `t < n − n % 4`, gemv for the rest. This holds for the tied
///   output too: llama.cpp loads `token_embd` a second time as the output layer's MUL_MAT weight
///   (`TENSOR_DUPLICATED`, llama-model-loader.cpp), into the repack buffer;
/// - Q3_K, Q5_K, Q6_K, IQ4_XS, and Q2_K and Q4_K that are not repacked, take the tiled path when
///   `n_tokens ≥ 8`;
/// - IQ4_NL that is not repacked takes llamafile's `tinyBLAS_Q0_AVX` when `n_tokens ≥ 2`
///   ([`GgmlPath::TinyBlasQ0`]);
/// - F32, F16 and BF16 take llamafile's tinyBLAS when `n_tokens ≥ 2`, `rows % 4 == 0` and `cols` is a
///   multiple of `KN`: [`GgmlPath::TinyBlas`] (AVX-512 build, `KN` 16, 32 for BF16 with AVX512-BF16) or
///   [`GgmlPath::TinyBlasAvx2`] (AVX2 build, `KN` 8); otherwise `ggml_vec_dot_f32/f16/bf16`, whose AVX2
///   build is [`GgmlPath::VecDotAvx2`]. BF16 in an AVX-512 build without AVX512-BF16 takes
///   [`GgmlPath::TinyBlasNoBf16`] (`KN` 16) and [`GgmlPath::VecDotNoBf16`] instead;
/// - everything else the vec_dot kernel (or tinyBLAS_Q0 for Q4_0/Q5_0/Q8_0, the same arithmetic).
///
/// `target` matters for Q2_K (repacked by an AVX-512 build only) and for the float weights (the
/// kernels' lane counts and reductions differ between the builds, and BF16's also with AVX512-BF16);
/// the quantized kernels are the same on all targets.
pub fn ggml_path(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    t: usize,
    target: GgmlTarget,
) -> GgmlPath {
    // a type without kernels never reaches a kernel (`PreparedRow::prepare` refuses it)
    let Some(d) = dots(ty) else {
        return GgmlPath::VecDot;
    };
    let repacked = d.repack.as_ref().is_some_and(|r| (r.on)(target)) && rows.is_multiple_of(8);
    if repacked {
        if t < n_tokens - n_tokens % 4 {
            GgmlPath::RepackGemm
        } else {
            GgmlPath::RepackGemv
        }
    } else if d.tiled.is_some() && n_tokens >= 8 {
        GgmlPath::Tiled
    } else if d.tinyblas_q0.is_some() && n_tokens >= 2 {
        GgmlPath::TinyBlasQ0
    } else if let Some(f) = &d.float {
        let tinyblas = float::tinyblas_applies(ty, rows, cols, n_tokens, target);
        // the kernels of a build without AVX512-BF16 that differ from those with it (BF16's)
        let nobf16 = target == GgmlTarget::Avx512NoBf16 && f.avx512_nobf16.is_some();
        match (target, tinyblas) {
            (GgmlTarget::Avx2, true) => GgmlPath::TinyBlasAvx2,
            (GgmlTarget::Avx2, false) => GgmlPath::VecDotAvx2,
            (_, true) if nobf16 => GgmlPath::TinyBlasNoBf16,
            (_, false) if nobf16 => GgmlPath::VecDotNoBf16,
            (GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16, true) => GgmlPath::TinyBlas,
            (GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16, false) => GgmlPath::VecDot,
        }
    } else {
        GgmlPath::VecDot
    }
}

/// [`vec_dot`] through an explicit ggml kernel `path` ([`ggml_path`]); reference mode ignores `path`,
/// and a path that does not exist for the weight type falls back to [`GgmlPath::VecDot`]. Kernels:
/// `{q4_k,q2_k}::dot_q8_k_repacked` (arch/x86/repack.cpp),
/// `{q2_k,q3_k,q4_k,q5_k,q6_k,iq4_xs}::dot_q8_k_tiled` (ggml-cpu/tiled), `iq4_nl::dot_q8_0_tinyblas`
/// (llamafile/sgemm.cpp `tinyBLAS_Q0_AVX`), `float::dot_tinyblas` / `dot_tinyblas_avx2` (tinyBLAS of an
/// AVX-512 / AVX2 build), `float::dot_{f32,f16,bf16}_avx2` (vec.cpp of an AVX2 build),
/// `float::dot_tinyblas_bf16_avx512f` / `dot_bf16_avx512f` (BF16 in an AVX-512 build without
/// AVX512-BF16).
pub fn vec_dot_path(weight_ty: GgmlType, w_row: &[u8], x: &PreparedRow, path: GgmlPath) -> f32 {
    if x.mode() == NumericsMode::Ggml {
        let d = dots_of(weight_ty);
        // `effective_path` names only the paths whose kernel the row has
        let missing = "effective_path checked the kernel";
        match effective_path(weight_ty, path) {
            GgmlPath::VecDot => {}
            p @ (GgmlPath::RepackGemv | GgmlPath::RepackGemm) => {
                let r = d.repack.as_ref().expect(missing);
                return (r.dot)(w_row, x, p == GgmlPath::RepackGemm);
            }
            GgmlPath::Tiled => return d.tiled.expect(missing)(w_row, x),
            GgmlPath::TinyBlasQ0 => return d.tinyblas_q0.expect(missing)(w_row, x),
            GgmlPath::TinyBlas => return (d.float.as_ref().expect(missing).tinyblas)(w_row, &x.x),
            GgmlPath::TinyBlasAvx2 => {
                return (d.float.as_ref().expect(missing).tinyblas_avx2)(w_row, &x.x)
            }
            GgmlPath::VecDotAvx2 => {
                return (d.float.as_ref().expect(missing).vec_dot_avx2)(w_row, &x.x)
            }
            p @ (GgmlPath::TinyBlasNoBf16 | GgmlPath::VecDotNoBf16) => {
                let k = d.float.as_ref().and_then(|f| f.avx512_nobf16.as_ref());
                let k = k.expect(missing);
                let dot = if p == GgmlPath::TinyBlasNoBf16 {
                    k.tinyblas
                } else {
                    k.vec_dot
                };
                return dot(w_row, &x.x);
            }
        }
    }
    vec_dot(weight_ty, w_row, x)
}

#[cfg(test)]
pub(crate) mod test_rng;
#[cfg(test)]
mod tests;
