//! Criterion benchmarks of the engine's hot kernels at the shapes of real models, scalar against SIMD.
//!
//! Every group puts its variants side by side: `off` and `avx2` ([`Simd`], `avx2` only where this CPU runs
//! it) for the kernels that take a SIMD setting (quantized matmul, attention, SwiGLU), `reference` and
//! `ggml` ([`NumericsMode`]) for the element-wise ops that have no SIMD setting (RoPE, GeGLU), and a
//! single `scalar` for the ops that have neither (RMSNorm, the RoPE cos/sin cache). Group names read
//! `family/kernel/model_shape/mode/batch`, so a filter picks any slice of them:
//!
//! ```text
//! cargo bench -p lockstep-engine --bench kernels                     # all ~290 functions (~15 min)
//! cargo bench -p lockstep-engine --bench kernels -- 'matmul/q4_k'    # one weight type
//! cargo bench -p lockstep-engine --bench kernels -- 'attention/.*/ggml'
//! ```
//!
//! Shapes (hidden size `d`, FFN width, heads / KV heads / head dim) are those of SmolLM2-135M
//! (576, 1536, 9/3/64, vocab 49152), Qwen2.5-0.5B (896, 4864) and Gemma 3 270M (640, 2048, 4/1/256). Weights
//! and activations are deterministic pseudo-random data ([`Rng`]); the kernels' speed does not depend on
//! the values (no data-dependent branches), only on their being finite and normal.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Bencher, Criterion, Throughput};
use lockstep_engine::backend::{Backend, CpuBackend, MatmulScratch, QMatrix};
use lockstep_engine::kv_cache::KvCache;
use lockstep_engine::ops::{self, AttnShape, KqvOrder};
use lockstep_engine::quant::{self, GgmlType};
use lockstep_engine::{GgmlTarget, Numerics, NumericsMode, Simd};

/// Deterministic xorshift64 generator (no `rand` dependency), as in the engine's own unit tests.
struct Rng(u64);

impl Rng {
    /// The next 64 random bits.
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// Both numerics modes, reference first.
const MODES: [NumericsMode; 2] = [NumericsMode::Reference, NumericsMode::Ggml];

/// Tokens of a prefill batch (a short prompt; the batched SIMD path runs 4 tokens per kernel call).
const PREFILL_TOKENS: usize = 32;

/// The SIMD settings this CPU runs: `off` always, `avx2` where the CPU has AVX2 + FMA + F16C.
fn simd_settings() -> Vec<Simd> {
    Simd::ALL.into_iter().filter(|s| s.available()).collect()
}

/// `decode` for one token, `prefill<n>` for a batch of `n`.
fn batch_label(n_tokens: usize) -> String {
    if n_tokens == 1 {
        "decode".to_owned()
    } else {
        format!("prefill{n_tokens}")
    }
}

/// Runs `run` once per variant as the functions of one criterion group named `group` (so criterion
/// prints them side by side), with a throughput of `elements` per iteration.
fn side_by_side<T: Copy>(
    c: &mut Criterion,
    group: &str,
    elements: usize,
    variants: &[T],
    name: fn(T) -> &'static str,
    mut run: impl FnMut(&mut Bencher<'_>, T),
) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(elements as u64));
    for &v in variants {
        g.bench_function(name(v), |b| run(b, v));
    }
    g.finish();
}

/// Times `f` on a fresh copy of `input` each iteration (the copy is made outside the timing), for the
/// in-place ops whose repeated application would drift the data (towards zeros or denormals).
fn bench_in_place(b: &mut Bencher<'_>, input: &[f32], mut f: impl FnMut(&mut [f32])) {
    b.iter_batched_ref(|| input.to_vec(), |x| f(x), BatchSize::SmallInput);
}

// ---------------------------------------------------------------------------------------------------------
// Quantized matmul
// ---------------------------------------------------------------------------------------------------------

/// One weight matrix of a model: `rows` output features × `cols` input features, the weight types it
/// is benchmarked in and the batch sizes.
struct MatShape {
    /// `model_tensor_rowsxcols`, the group-name component.
    id: &'static str,
    /// Output features.
    rows: usize,
    /// Input features (row length).
    cols: usize,
    /// Weight types benchmarked at this shape (K-quants only where `cols` is a multiple of 256, as in
    /// real GGUF files, whose quantizer falls back to a 32-block type elsewhere).
    types: &'static [GgmlType],
    /// Activation rows per product.
    batches: &'static [usize],
}

/// The weight types with a matmul kernel that models ship in (every one `quant::supports`).
const ALL_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::IQ4_XS,
];

/// The 32-element block types (for rows not a multiple of 256, which rules out K-quants).
const BLOCK32_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::Q5_1,
];

/// Decode and a prefill batch.
const BOTH_BATCHES: &[usize] = &[1, PREFILL_TOKENS];

/// The matrices benchmarked: per model the FFN up/gate projection `[ffn, d]` (its rows are `d` long, not a
/// multiple of 256 in any of the three models) and the FFN down projection `[d, ffn]` (rows `ffn` long:
/// every type). Attention projections are `[d, d]` or smaller and sit between the two.
const MATMUL_SHAPES: &[MatShape] = &[
    MatShape {
        id: "smollm2_ffn_up_1536x576",
        rows: 1536,
        cols: 576,
        types: BLOCK32_TYPES,
        batches: BOTH_BATCHES,
    },
    MatShape {
        id: "smollm2_ffn_down_576x1536",
        rows: 576,
        cols: 1536,
        types: ALL_TYPES,
        batches: BOTH_BATCHES,
    },
    // SmolLM2's tied output matrix is [49152, 576] (Q8_0 in the project's model files). Only the first
    // 8192 rows are benchmarked, to keep the bench time sane: the product is row-parallel and streams
    // the rows, so the per-weight rate is that of the full matrix. Decode only, as llama.cpp computes
    // logits of the last prompt token only.
    MatShape {
        id: "smollm2_output_8192of49152x576",
        rows: 8192,
        cols: 576,
        types: &[GgmlType::Q8_0],
        batches: &[1],
    },
    MatShape {
        id: "qwen2.5_ffn_up_4864x896",
        rows: 4864,
        cols: 896,
        types: BLOCK32_TYPES,
        batches: BOTH_BATCHES,
    },
    MatShape {
        id: "qwen2.5_ffn_down_896x4864",
        rows: 896,
        cols: 4864,
        types: ALL_TYPES,
        batches: BOTH_BATCHES,
    },
    MatShape {
        id: "gemma3_ffn_up_2048x640",
        rows: 2048,
        cols: 640,
        types: BLOCK32_TYPES,
        batches: BOTH_BATCHES,
    },
    MatShape {
        id: "gemma3_ffn_down_640x2048",
        rows: 640,
        cols: 2048,
        types: ALL_TYPES,
        batches: BOTH_BATCHES,
    },
];

/// Random K-quant blocks of one row of `cols` elements: random bytes (any bit pattern is a valid
/// quant / packed scale), with the f16 super-block scales at byte `scale_at` of each block set to the
/// small finite values `scales` (Q4_K: `d`, `dmin` at 0; Q6_K: `d` at 208).
fn k_quant_row(
    ty: GgmlType,
    cols: usize,
    scale_at: usize,
    scales: &[f32],
    rng: &mut Rng,
) -> Vec<u8> {
    let block = ty.type_size();
    let mut out = Vec::with_capacity(cols / ty.block_size() * block);
    for _ in 0..cols / ty.block_size() {
        let start = out.len();
        out.extend((0..block).map(|_| rng.next_u64() as u8));
        for (i, &s) in scales.iter().enumerate() {
            let at = start + scale_at + 2 * i;
            out[at..at + 2].copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
        }
    }
    out
}

/// A `[rows, cols]` weight matrix of `ty`: rows quantized from random f32 with ggml's reference
/// quantizer ([`quant::quantize_row`]); Q4_K and Q6_K as random valid blocks.
fn weight_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data = Vec::with_capacity(rows * ty.bytes_for(cols as u64).expect("whole blocks"));
    for _ in 0..rows {
        let row = match ty {
            GgmlType::Q4_K => k_quant_row(ty, cols, 0, &[0.002, 0.001], rng),
            GgmlType::Q6_K => k_quant_row(ty, cols, 208, &[0.0005], rng),
            _ => quant::quantize_row(ty, &rng.vec(cols, 0.05)).expect("reference quantizer"),
        };
        data.extend(row);
    }
    data
}

/// `matmul/<type>/<model_tensor_shape>/<mode>/<decode|prefill32>`: [`CpuBackend::matmul`] of one
/// weight matrix with `n_tokens` activation rows (activation quantization included, as in the forward
/// pass), `off` vs `avx2`. Throughput: weights × tokens (multiply-adds) per second. In reference mode
/// the engine has no SIMD kernels yet, so there `avx2` runs the scalar code.
fn bench_matmul(c: &mut Criterion) {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let simds = simd_settings();
    for shape in MATMUL_SHAPES {
        let (rows, cols) = (shape.rows, shape.cols);
        for &ty in shape.types.iter().filter(|&&t| quant::supports(t)) {
            let data = weight_matrix(ty, rows, cols, &mut rng);
            // a place for a repacked copy (Q4_0), as a model's weights have
            let cell = std::sync::OnceLock::new();
            let w = QMatrix {
                ty,
                rows,
                cols,
                data: &data,
                repacked: Some(&cell),
            };
            for &n in shape.batches {
                let x = rng.vec(n * cols, 1.0);
                let mut out = vec![0.0f32; n * rows];
                let mut scratch = MatmulScratch::default();
                for mode in MODES {
                    let group = format!(
                        "matmul/{}/{}/{mode}/{}",
                        ty.name().to_lowercase(),
                        shape.id,
                        batch_label(n)
                    );
                    side_by_side(c, &group, rows * cols * n, &simds, Simd::name, |b, simd| {
                        let backend = CpuBackend::new(simd);
                        b.iter(|| {
                            backend
                                .matmul(
                                    &w,
                                    black_box(&x),
                                    n,
                                    &mut out,
                                    Numerics {
                                        mode,
                                        target: GgmlTarget::host(),
                                        simd,
                                    },
                                    &mut scratch,
                                )
                                .expect("the type has a matmul kernel");
                        });
                    });
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------------------

/// The attention geometry of one model.
struct AttnModel {
    /// Group-name component.
    id: &'static str,
    /// Query heads.
    n_head: usize,
    /// Key/value heads.
    n_kv_head: usize,
    /// Per-head width.
    head_dim: usize,
}

/// SmolLM2-135M (9 query heads, 3 KV heads, head dim 64) and Gemma 3 270M (4, 1, 256).
const ATTN_MODELS: &[AttnModel] = &[
    AttnModel {
        id: "smollm2_9h3kv64",
        n_head: 9,
        n_kv_head: 3,
        head_dim: 64,
    },
    AttnModel {
        id: "gemma3_4h1kv256",
        n_head: 4,
        n_kv_head: 1,
        head_dim: 256,
    },
];

/// Context lengths (positions attended, the query at the last one).
const CONTEXTS: &[usize] = &[64, 512, 2048];

/// `attention/<model>/ctx<n>/<mode>/decode`: [`ops::attention`] of one decode-step query over `n`
/// cached positions (all heads; plain causal, no sliding window), `off` vs `avx2`. Ggml mode mirrors
/// the AVX2 ggml-cpu build with the decode KQV order ([`KqvOrder::VecDot`]). Throughput: context
/// positions per second.
fn bench_attention(c: &mut Criterion) {
    let mut rng = Rng(0x5eed_1234_abcd_0002);
    let simds = simd_settings();
    let capacity = CONTEXTS.iter().copied().max().unwrap_or(1);
    for m in ATTN_MODELS {
        let kv_width = m.n_kv_head * m.head_dim;
        let mut cache = KvCache::new(1, m.n_kv_head, m.head_dim, capacity);
        for pos in 0..capacity {
            let (k, v) = (rng.vec(kv_width, 1.0), rng.vec(kv_width, 1.0));
            cache.write(0, pos, &k, &v).expect("within capacity");
        }
        // kq_scale only scales the scores: the causal 1/√head_dim stands in for Gemma's 1.0
        let shape = AttnShape::causal(m.n_head, m.n_kv_head, m.head_dim);
        let q = rng.vec(m.n_head * m.head_dim, 1.0);
        let mut out = vec![0.0f32; m.n_head * m.head_dim];
        for &ctx in CONTEXTS {
            let mut scores = vec![0.0f32; ops::attention_scratch_len(ctx)];
            for mode in MODES {
                let group = format!("attention/{}/ctx{ctx}/{mode}/decode", m.id);
                side_by_side(c, &group, ctx, &simds, Simd::name, |b, simd| {
                    b.iter(|| {
                        ops::attention(
                            black_box(&q),
                            &cache,
                            0,
                            ctx - 1,
                            &shape,
                            &mut scores,
                            &mut out,
                            Numerics {
                                mode,
                                target: GgmlTarget::Avx2,
                                simd,
                            },
                            KqvOrder::VecDot,
                        );
                    });
                });
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Element-wise ops: RMSNorm, RoPE, SwiGLU, GeGLU
// ---------------------------------------------------------------------------------------------------------

/// SmolLM2-135M hidden size.
const D_MODEL: usize = 576;
/// SmolLM2-135M FFN width.
const D_FFN: usize = 1536;
/// SmolLM2-135M head dim (= its RoPE dim).
const HEAD_DIM: usize = 64;
/// SmolLM2-135M `rope_theta`.
const ROPE_BASE: f32 = 100_000.0;
/// First position of the RoPE batches (mid-context angles).
const ROPE_POS: usize = 1000;
/// Tokens of the element-wise ops' batch.
const OP_BATCH: usize = 64;
/// Decode and the element-wise ops' batch.
const OP_BATCHES: [usize; 2] = [1, OP_BATCH];

/// `norm/rms_norm/smollm2_d576/<batch>`: [`ops::rms_norm`] (with its weight multiply) of `n` rows of
/// 576. It has no mode or SIMD variant (one function, `scalar`). Throughput: elements per second.
fn bench_rms_norm(c: &mut Criterion) {
    let mut rng = Rng(0x5eed_1234_abcd_0003);
    let weight: Vec<f32> = rng.vec(D_MODEL, 0.5).iter().map(|w| 1.0 + w).collect();
    for n in OP_BATCHES {
        let x = rng.vec(n * D_MODEL, 2.0);
        let group = format!("norm/rms_norm/smollm2_d{D_MODEL}/{}", batch_label(n));
        side_by_side(
            c,
            &group,
            x.len(),
            &[()],
            |()| "scalar",
            |b, ()| {
                bench_in_place(b, &x, |x| ops::rms_norm(x, &weight, 1e-5));
            },
        );
    }
}

/// The signature of [`ops::rope_norm`] and [`ops::rope_neox`].
type RopeFn = fn(&mut [f32], usize, usize, &[f32], NumericsMode);

/// `rope/cache/smollm2_hd64/<batch>`: [`ops::rope_cache`] (cos/sin of every pair) for `n` positions;
/// `rope/<norm|neox>/smollm2_9x64/<batch>`: [`ops::rope_norm`] / [`ops::rope_neox`] rotating the query
/// heads (9 × 64 = 576) of `n` tokens with precomputed caches, `reference` vs `ggml` (RoPE has no SIMD
/// setting). Throughput: positions (cache) or elements (rotation) per second.
fn bench_rope(c: &mut Criterion) {
    let mut rng = Rng(0x5eed_1234_abcd_0004);
    let rotations: [(&str, RopeFn); 2] = [("norm", ops::rope_norm), ("neox", ops::rope_neox)];
    for n in OP_BATCHES {
        let mut caches = vec![0.0f32; n * HEAD_DIM];
        let group = format!("rope/cache/smollm2_hd{HEAD_DIM}/{}", batch_label(n));
        side_by_side(
            c,
            &group,
            n,
            &[()],
            |()| "scalar",
            |b, ()| {
                b.iter(|| {
                    for (t, cache) in caches.chunks_exact_mut(HEAD_DIM).enumerate() {
                        ops::rope_cache(black_box(ROPE_POS + t), ROPE_BASE, HEAD_DIM, cache);
                    }
                });
            },
        );
        let x = rng.vec(n * D_MODEL, 1.0);
        for (kind, rope) in rotations {
            let group = format!(
                "rope/{kind}/smollm2_{}x{HEAD_DIM}/{}",
                D_MODEL / HEAD_DIM,
                batch_label(n)
            );
            side_by_side(c, &group, x.len(), &MODES, NumericsMode::name, |b, mode| {
                bench_in_place(b, &x, |x| {
                    let tokens = x.chunks_exact_mut(D_MODEL);
                    for (row, cache) in tokens.zip(caches.chunks_exact(HEAD_DIM)) {
                        rope(row, HEAD_DIM, HEAD_DIM, cache, mode);
                    }
                });
            });
        }
    }
}

/// `glu/swiglu/smollm2_ffn1536/<mode>/<batch>`: [`ops::swiglu`] on `n` rows of 1536 (ggml mode for the
/// AVX2 ggml-cpu target), `off` vs `avx2`; `glu/geglu/smollm2_ffn1536/<batch>`: [`ops::geglu`] at the
/// same size (Gemma's gate; the SmolLM2 width keeps the two comparable), `reference` vs `ggml` (GeGLU has
/// no SIMD setting). Throughput: elements per second.
fn bench_glu(c: &mut Criterion) {
    let mut rng = Rng(0x5eed_1234_abcd_0005);
    let simds = simd_settings();
    for n in OP_BATCHES {
        let gate = rng.vec(n * D_FFN, 4.0);
        let up = rng.vec(n * D_FFN, 1.0);
        let batch = batch_label(n);
        for mode in MODES {
            let group = format!("glu/swiglu/smollm2_ffn{D_FFN}/{mode}/{batch}");
            side_by_side(c, &group, gate.len(), &simds, Simd::name, |b, simd| {
                bench_in_place(b, &gate, |g| {
                    ops::swiglu(
                        g,
                        &up,
                        D_FFN,
                        Numerics {
                            mode,
                            target: GgmlTarget::Avx2,
                            simd,
                        },
                    );
                });
            });
        }
        let group = format!("glu/geglu/smollm2_ffn{D_FFN}/{batch}");
        side_by_side(
            c,
            &group,
            gate.len(),
            &MODES,
            NumericsMode::name,
            |b, mode| {
                bench_in_place(b, &gate, |g| ops::geglu(g, &up, D_FFN, mode));
            },
        );
    }
}

/// The settings of every group: ~0.5 s warm-up, ~2 s measurement, 20 samples (command-line options such
/// as `--measurement-time` still override them).
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! {
    name = kernels;
    config = config();
    targets = bench_matmul, bench_attention, bench_rms_norm, bench_rope, bench_glu
}
criterion_main!(kernels);
