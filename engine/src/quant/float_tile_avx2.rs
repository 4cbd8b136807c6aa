//! F32, F16 and BF16 weights in ggml mode, prefill, on llama.cpp's AVX2 build ([`GgmlPath::TinyBlasAvx2`]):
//! llamafile's `tinyBLAS<8, __m256, __m256, T, T, float>` (ggml-cpu/llamafile/sgemm.cpp, `gemm_bloc`)
//! with its own technique — a register tile of four weight rows × three tokens (its `mnpack<4, 3, BM>`
//! on a CPU with 16 vector registers: twelve accumulators, three activation vectors and one weight
//! vector), the weights widened inside the tile (`load<__m256>(const ggml_fp16_t *)` =
//! `_mm256_cvtph_ps`; bf16 by a 16-bit shift), every weight chunk read once for three tokens and every
//! activation chunk once for four rows.
//!
//! Every output is one 8-lane accumulator, `acc = fma(w[k..k+8], x[k..k+8], acc)` over chunks of 8
//! elements in increasing `k`, then `hsum(__m256)` (high half + low half, `movehl`, `movehdup`:
//! `x86::hsum_float_8`) — the order of `float::dot_tinyblas_avx2`, which the tests compare with bit for
//! bit. Widening is exact, so the tile shape, the token blocking and the thread split change no output's
//! bits. The activation is the row rounded to the weight's type by ggml mode's `prepare` and widened
//! (`PreparedRow::x`); the weights are read from the memory map, with no f32 copy.
//!
//! [`GgmlPath::TinyBlasAvx2`]: super::GgmlPath::TinyBlasAvx2

use std::arch::x86_64::*;

use super::GgmlType;

/// True if this CPU has the instructions of these kernels (AVX2, FMA, F16C).
pub(crate) fn available() -> bool {
    crate::numerics::avx2_available()
}

/// Tokens per tile (tinyBLAS's `RN` with 16 vector registers).
const TOKENS: usize = 3;
/// Weight rows per tile (tinyBLAS's `RM`).
const ROWS: usize = 4;

/// The weight types of the tile, as a const parameter.
const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// Eight weights of type `TY` at element `k` of the row at `p` (unaligned), widened to f32 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<const TY: u8>(p: *const u8, k: usize) -> __m256 {
    match TY {
        F32 => _mm256_loadu_ps(p.add(4 * k) as *const f32),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * k) as *const __m128i)),
        _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(p.add(2 * k) as *const __m128i),
        ))),
    }
}

/// `hsum(__m256)` of sgemm.cpp in registers: `_mm256_extractf128_ps(x, 1) + low half`, then
/// `x + movehl(x, x)`, then `x + movehdup(x)` in lane 0 — `x86::hsum_float_8`'s additions.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(a: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_extractf128_ps::<1>(a), _mm256_castps256_ps128(a));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The outputs of `R` ≤ 4 weight rows (type `TY`) × `T` ≤ 3 activation rows (f32), `n` elements each (a
/// multiple of 8). Kept out of line with named accumulators: an array of them went to the stack.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; every weight pointer reads `n` elements of `TY`, every activation
/// pointer `n` f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn tile<const TY: u8, const R: usize, const T: usize>(
    ws: [*const u8; R],
    xs: [*const f32; T],
    n: usize,
) -> [[f32; T]; R] {
    const { assert!(R >= 1 && R <= ROWS && T >= 1 && T <= TOKENS) };
    let z = _mm256_setzero_ps();
    let (mut c00, mut c01, mut c02) = (z, z, z);
    let (mut c10, mut c11, mut c12) = (z, z, z);
    let (mut c20, mut c21, mut c22) = (z, z, z);
    let (mut c30, mut c31, mut c32) = (z, z, z);
    let mut k = 0;
    while k < n {
        // token `t`'s eight values (zero for a token the tile does not have)
        macro_rules! token {
            ($t:literal) => {
                if T > $t {
                    _mm256_loadu_ps(xs[$t % T].add(k))
                } else {
                    z
                }
            };
        }
        let (x0, x1, x2) = (token!(0), token!(1), token!(2));
        // weight row `r`'s eight values into the accumulators of tokens 0..T
        macro_rules! row {
            ($r:literal: $c0:ident $c1:ident $c2:ident) => {
                if R > $r {
                    let w = load8::<TY>(ws[$r % R], k);
                    $c0 = _mm256_fmadd_ps(w, x0, $c0);
                    if T > 1 {
                        $c1 = _mm256_fmadd_ps(w, x1, $c1);
                    }
                    if T > 2 {
                        $c2 = _mm256_fmadd_ps(w, x2, $c2);
                    }
                }
            };
        }
        row!(0: c00 c01 c02);
        row!(1: c10 c11 c12);
        row!(2: c20 c21 c22);
        row!(3: c30 c31 c32);
        k += 8;
    }
    let acc = [
        [c00, c01, c02],
        [c10, c11, c12],
        [c20, c21, c22],
        [c30, c31, c32],
    ];
    std::array::from_fn(|r| std::array::from_fn(|t| hsum(acc[r][t])))
}

/// [`tile`] for the full tile (4 rows × 3 tokens) in assembly with a fixed register allocation: the
/// twelve accumulators in `ymm0`–`ymm11`, the three tokens' vectors in `ymm12`–`ymm14`, the widened
/// weight vector in `ymm15` — tinyBLAS's sixteen registers exactly. Compiled from the intrinsics, this
/// tile spilled two accumulators to the stack in its loop (a store and a reload on their dependency
/// chains every eight elements) and shuffled the others with ~20 `vmovaps`. The same fused multiply-adds
/// on the same accumulators in the same order: the bits of [`tile`].
///
/// # Safety
/// As [`tile`]; `n` is a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn tile43<const TY: u8>(
    ws: [*const u8; ROWS],
    xs: [*const f32; TOKENS],
    n: usize,
) -> [[f32; 3]; 4] {
    let z = _mm256_setzero_ps();
    let (mut c00, mut c01, mut c02) = (z, z, z);
    let (mut c10, mut c11, mut c12) = (z, z, z);
    let (mut c20, mut c21, mut c22) = (z, z, z);
    let (mut c30, mut c31, mut c32) = (z, z, z);
    // one asm block per weight type: the row loads (`ymm15` = row r's eight weights widened) differ
    macro_rules! tile_asm {
        ($l0:literal, $l1:literal, $l2:literal, $l3:literal) => {
            std::arch::asm!(
                "2:",
                "vmovups ymm12, ymmword ptr [{x0} + {k}*4]",
                "vmovups ymm13, ymmword ptr [{x1} + {k}*4]",
                "vmovups ymm14, ymmword ptr [{x2} + {k}*4]",
                $l0,
                "vfmadd231ps ymm0, ymm15, ymm12",
                "vfmadd231ps ymm1, ymm15, ymm13",
                "vfmadd231ps ymm2, ymm15, ymm14",
                $l1,
                "vfmadd231ps ymm3, ymm15, ymm12",
                "vfmadd231ps ymm4, ymm15, ymm13",
                "vfmadd231ps ymm5, ymm15, ymm14",
                $l2,
                "vfmadd231ps ymm6, ymm15, ymm12",
                "vfmadd231ps ymm7, ymm15, ymm13",
                "vfmadd231ps ymm8, ymm15, ymm14",
                $l3,
                "vfmadd231ps ymm9, ymm15, ymm12",
                "vfmadd231ps ymm10, ymm15, ymm13",
                "vfmadd231ps ymm11, ymm15, ymm14",
                "add {k}, 8",
                "cmp {k}, {n}",
                "jb 2b",
                w0 = in(reg) ws[0],
                w1 = in(reg) ws[1],
                w2 = in(reg) ws[2],
                w3 = in(reg) ws[3],
                x0 = in(reg) xs[0],
                x1 = in(reg) xs[1],
                x2 = in(reg) xs[2],
                k = inout(reg) 0usize => _,
                n = in(reg) n,
                inout("ymm0") c00,
                inout("ymm1") c01,
                inout("ymm2") c02,
                inout("ymm3") c10,
                inout("ymm4") c11,
                inout("ymm5") c12,
                inout("ymm6") c20,
                inout("ymm7") c21,
                inout("ymm8") c22,
                inout("ymm9") c30,
                inout("ymm10") c31,
                inout("ymm11") c32,
                out("ymm12") _,
                out("ymm13") _,
                out("ymm14") _,
                out("ymm15") _,
                options(nostack, readonly),
            )
        };
    }
    if n > 0 {
        match TY {
            F32 => tile_asm!(
                "vmovups ymm15, ymmword ptr [{w0} + {k}*4]",
                "vmovups ymm15, ymmword ptr [{w1} + {k}*4]",
                "vmovups ymm15, ymmword ptr [{w2} + {k}*4]",
                "vmovups ymm15, ymmword ptr [{w3} + {k}*4]"
            ),
            F16 => tile_asm!(
                "vcvtph2ps ymm15, xmmword ptr [{w0} + {k}*2]",
                "vcvtph2ps ymm15, xmmword ptr [{w1} + {k}*2]",
                "vcvtph2ps ymm15, xmmword ptr [{w2} + {k}*2]",
                "vcvtph2ps ymm15, xmmword ptr [{w3} + {k}*2]"
            ),
            _ => tile_asm!(
                "vpmovzxwd ymm15, xmmword ptr [{w0} + {k}*2]\nvpslld ymm15, ymm15, 16",
                "vpmovzxwd ymm15, xmmword ptr [{w1} + {k}*2]\nvpslld ymm15, ymm15, 16",
                "vpmovzxwd ymm15, xmmword ptr [{w2} + {k}*2]\nvpslld ymm15, ymm15, 16",
                "vpmovzxwd ymm15, xmmword ptr [{w3} + {k}*2]\nvpslld ymm15, ymm15, 16"
            ),
        }
    }
    let acc = [
        [c00, c01, c02],
        [c10, c11, c12],
        [c20, c21, c22],
        [c30, c31, c32],
    ];
    std::array::from_fn(|r| std::array::from_fn(|t| hsum(acc[r][t])))
}

/// Every row of one block of `T` tokens: tiles of [`ROWS`] rows, then the remaining rows one by one.
///
/// # Safety
/// As [`matmul`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn token_block<const TY: u8, const T: usize>(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    n: usize,
    xs: &[&[f32]],
    t0: usize,
    put: &mut impl FnMut(usize, usize, f32),
) {
    let row = |r: usize| rows.as_ptr().add(r * row_bytes);
    let xp: [*const f32; T] = std::array::from_fn(|j| xs[t0 + j].as_ptr());
    let mut r = 0;
    while r + ROWS <= n_rows {
        let ws = std::array::from_fn(|i| row(r + i));
        let o: [[f32; T]; ROWS] = if T == TOKENS {
            let o = tile43::<TY>(ws, std::array::from_fn(|j| xp[j % T]), n);
            std::array::from_fn(|i| std::array::from_fn(|j| o[i][j]))
        } else {
            tile::<TY, ROWS, T>(ws, xp, n)
        };
        for (i, ov) in o.iter().enumerate() {
            for (j, &v) in ov.iter().enumerate() {
                put(r + i, t0 + j, v);
            }
        }
        r += ROWS;
    }
    for r in r..n_rows {
        let o = tile::<TY, 1, T>([row(r)], xp, n);
        for (j, &v) in o[0].iter().enumerate() {
            put(r, t0 + j, v);
        }
    }
}

/// [`matmul`] for one weight type.
///
/// # Safety
/// As [`matmul`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matmul_ty<const TY: u8>(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    n: usize,
    xs: &[&[f32]],
    put: &mut impl FnMut(usize, usize, f32),
) {
    let full = xs.len() - xs.len() % TOKENS;
    for t0 in (0..full).step_by(TOKENS) {
        token_block::<TY, TOKENS>(rows, row_bytes, n_rows, n, xs, t0, put);
    }
    match xs.len() - full {
        0 => {}
        1 => token_block::<TY, 1>(rows, row_bytes, n_rows, n, xs, full, put),
        _ => token_block::<TY, 2>(rows, row_bytes, n_rows, n, xs, full, put),
    }
}

/// `put(i, t, ·)`: the output of llama.cpp's AVX2 tinyBLAS for weight row `i` (of `n_rows` rows of
/// `ty` = F32, F16 or BF16, `row_bytes` bytes each, in `rows`) and activation row `xs[t]` (the row
/// rounded to `ty` and widened, `row_bytes / ty.type_size()` floats), for every `i` and `t`: the bits of
/// `float::dot_tinyblas_avx2`. Blocks of three tokens outermost (their rows stay in L1 while the weight
/// rows stream through from L2, so the caller should pass a few hundred KiB of rows at a time), the last
/// block narrower.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C ([`available`]).
///
/// # Panics
/// If `ty` is not F32, F16 or BF16, the row length is not a multiple of 8 elements (tinyBLAS's `KN`:
/// `float::tinyblas_applies`), `rows` is shorter than `n_rows` rows, or an activation row is short.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul(
    ty: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: &[&[f32]],
    mut put: impl FnMut(usize, usize, f32),
) {
    let size = match ty {
        GgmlType::F32 => 4,
        GgmlType::F16 | GgmlType::BF16 => 2,
        _ => panic!("the AVX2 float tiles take F32, F16 and BF16 weights, not {ty:?}"),
    };
    let n = row_bytes / size;
    assert!(
        row_bytes == n * size && n.is_multiple_of(8),
        "{ty:?} rows of {row_bytes} bytes"
    );
    assert!(rows.len() >= n_rows * row_bytes, "{ty:?} weight rows");
    assert!(xs.iter().all(|x| x.len() >= n), "{ty:?} activation rows");
    let p = &mut put;
    match ty {
        GgmlType::F32 => matmul_ty::<F32>(rows, row_bytes, n_rows, n, xs, p),
        GgmlType::F16 => matmul_ty::<F16>(rows, row_bytes, n_rows, n, xs, p),
        _ => matmul_ty::<BF16>(rows, row_bytes, n_rows, n, xs, p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::float::dot_tinyblas_avx2;
    use crate::quant::fp::{bf16_to_f32, f16_to_f32, f32_to_f16_cpu};
    use crate::quant::test_rng::Rng;

    /// The bytes of `v` in `ty`, and the same values widened (bf16 by truncation: any bf16 bits do).
    fn encode(ty: GgmlType, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let b: Vec<u8> = match ty {
            GgmlType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            GgmlType::F16 => v
                .iter()
                .flat_map(|&x| f32_to_f16_cpu(x).to_le_bytes())
                .collect(),
            _ => v
                .iter()
                .flat_map(|&x| ((x.to_bits() >> 16) as u16).to_le_bytes())
                .collect(),
        };
        let w = match ty {
            GgmlType::F32 => v.to_vec(),
            GgmlType::F16 => b
                .chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            _ => b
                .chunks_exact(2)
                .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        };
        (b, w)
    }

    /// Every output equals `float::dot_tinyblas_avx2` (the scalar replica of the AVX2 build's tinyBLAS)
    /// bit for bit, for the three weight types, token counts around the three-token block and row counts
    /// around the four-row tile, on values spanning many binades with subnormals, ±0, ±inf and NaN.
    #[test]
    fn tiles_give_the_tinyblas_avx2_bits_for_every_shape() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2 + FMA + F16C");
            return;
        }
        let mut rng = Rng(0x51f1_6a11_7e5e_0002);
        let special = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            6.0e-8,
            -3.0e-5,
            1.0e-40,
        ];
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for cols in [8usize, 24, 576] {
                for n_rows in [1usize, 3, 4, 5, 9] {
                    for n_tok in [1usize, 2, 3, 4, 5, 7, 13] {
                        let mut draw = |i: usize| {
                            let r = rng.next();
                            if r.is_multiple_of(97) {
                                special[(r >> 8) as usize % special.len()]
                            } else {
                                ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                                    * (1 << (i % 11)) as f32
                            }
                        };
                        let (wb, _) =
                            encode(ty, &(0..n_rows * cols).map(&mut draw).collect::<Vec<_>>());
                        // the activation as `prepare` leaves it: rounded to the weight's type, widened
                        let xs: Vec<Vec<f32>> = (0..n_tok)
                            .map(|_| encode(ty, &(0..cols).map(&mut draw).collect::<Vec<_>>()).1)
                            .collect();
                        let xr: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
                        let rb = wb.len() / n_rows;
                        let mut got = vec![None; n_rows * n_tok];
                        // SAFETY: AVX2 + FMA + F16C checked above; the slices hold whole rows.
                        unsafe {
                            matmul(ty, &wb, rb, n_rows, &xr, |r, t, v| {
                                assert!(
                                    got[r * n_tok + t].replace(v).is_none(),
                                    "({r}, {t}) twice"
                                );
                            })
                        };
                        for r in 0..n_rows {
                            let row = &wb[r * rb..(r + 1) * rb];
                            for t in 0..n_tok {
                                let want = dot_tinyblas_avx2(ty, row, &xs[t]);
                                let g = got[r * n_tok + t].expect("every output written");
                                assert!(
                                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                                    "{ty:?} cols {cols} rows {n_rows} tokens {n_tok} ({r}, {t}): \
                                     {g:e} vs {want:e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// A row whose length is not a multiple of tinyBLAS's 8 elements is refused (tinyBLAS does not run
    /// there: `float::tinyblas_applies`), and so is a weight type without these tiles.
    #[test]
    fn rows_of_twelve_elements_and_quantized_weights_are_refused() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2 + FMA + F16C");
            return;
        }
        let w = vec![0u8; 24];
        let x = [0f32; 12];
        for ty in [GgmlType::F16, GgmlType::Q8_0] {
            let r = std::panic::catch_unwind(|| {
                // SAFETY: AVX2 + FMA + F16C checked above.
                unsafe { matmul(ty, &w, 24, 1, &[&x[..]], |_, _, _| {}) }
            });
            assert!(r.is_err(), "{ty:?} rows of 24 bytes were taken");
        }
    }
}
