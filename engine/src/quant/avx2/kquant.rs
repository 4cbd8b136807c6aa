//! AVX2 kernels for the Q8_K-activation weight types that had only scalar kernels: Q2_K, Q3_K, Q5_K and
//! IQ4_XS, on every path llama.cpp takes for them on x86 — `ggml_vec_dot_*_q8_K` (arch/x86/quants.c,
//! decode and batches < 8), the tiled K-quant matmul (ggml-cpu/tiled, batches ≥ 8) and, for Q2_K, the
//! repacked `q2_K_8x8_q8_K` gemv/gemm of an AVX-512 build (arch/x86/repack.cpp).
//!
//! All of those kernels round only in their f32 steps; what comes before is exact integers. Each kernel
//! here computes, per super-block and activation row, the eight i32 lanes of the vec_dot kernel
//! (`maddubs` of the unsigned weight codes with the Q8_K quants, `madd` with the sub-block scales: exact,
//! no i16 pair can saturate) and derives every path's integers from them — the tiled `s1` is the sum of
//! the lanes, the repacked `isum` per half of 128 the sum of that half's lanes, the min terms `madd` of
//! the mins with the Q8_K `bsums` — then feeds them to the same f32 operations in the same order as the
//! scalar spec (`q2_k::dot_q8_k*`, `q3_k::dot_q8_k*`, `q5_k::dot_q8_k*`, `iq4_xs::dot_q8_k*`), whose
//! bits every output has. Integer sums wrap as the scalar kernels' `wrapping_add`s do (only garbage
//! blocks come near), so any order of the integer adds gives the same lanes.
//!
//! Like the other kernels of [`super`], each takes `N` activation rows against one weight row, unpacking
//! the weight's codes once per super-block.

use std::arch::x86_64::*;

use super::super::q8_k::QK_K;
use super::super::{iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, GgmlPath};
use super::{bytes_from_nibbles_32, f16x1, f16x2, hsum_float_8, hsum_i32_8, hsum_i32_8x8, Q8kRow};

/// `maddubs(q, y)` then `madd` with the scales `sc`: lane `l` = `sc_l · Σ_{e<4} q[4l+e]·y[4l+e]`, exact
/// for unsigned codes `q ≤ 127` (no i16 pair saturates against a Q8_K quant, |y| ≤ 128).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scaled(q: __m256i, y: __m256i, sc: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), sc)
}

/// Scales `a` for lanes 0..4 and `b` for lanes 4..8 of a [`scaled`] product (the two sub-blocks of 16
/// in one group of 32 quants).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scale_pair(a: i16, b: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))
}

/// The 32 Q8_K quants of group `g` (elements `32g .. 32g + 32`) of super-block `ib`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn y32(r: &Q8kRow<'_>, ib: usize, g: usize) -> __m256i {
    _mm256_loadu_si256(r.qs.as_ptr().add(ib * QK_K + 32 * g) as *const __m256i)
}

/// The 16 Q8_K `bsums` (sums of 16 quants) of super-block `ib`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn bsums16(r: &Q8kRow<'_>, ib: usize) -> __m256i {
    _mm256_loadu_si256(r.bsums.as_ptr().add(ib * QK_K / 16) as *const __m256i)
}

/// True if every activation row of a call of eight takes the tiled path: then the kernels reduce the
/// eight rows' integer lanes at once ([`hsum_i32_8x8`]) and run the tiled f32 steps on one vector whose
/// lane `j` is row `j`'s chain (the same mul and fmas per lane, so the same bits).
fn all_tiled<const N: usize>(paths: &[GgmlPath; N]) -> bool {
    N == 8 && paths.iter().all(|&p| p == GgmlPath::Tiled)
}

/// The eight rows' `d` of super-block `ib`, row `j` in lane `j`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn d8<const N: usize>(x: &[Q8kRow<'_>; N], ib: usize) -> __m256 {
    let d: [f32; 8] = std::array::from_fn(|j| *x[j % N].d.get_unchecked(ib));
    _mm256_loadu_ps(d.as_ptr())
}

/// `v` as eight lane vectors (`N` is 8 where this is called: [`all_tiled`]).
fn eight<const N: usize>(v: &[__m256i; N]) -> [__m256i; 8] {
    std::array::from_fn(|j| v[j % N])
}

/// One super-block of the tiled path for eight activation rows: `s1` (and `s2`, for the types with
/// mins) are the rows' integer lanes summed, `res = d_w·s1` (`res = fma(−dmin_w, s2, res)`),
/// `acc = fma(res, d_x, acc)` lane by lane.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn tiled8(
    s1: &[__m256i; 8],
    s2: Option<(&[__m256i; 8], f32)>,
    dw: f32,
    dy: __m256,
    acc: __m256,
) -> __m256 {
    let mut res = _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_cvtepi32_ps(hsum_i32_8x8(s1)));
    if let Some((s2, dminw)) = s2 {
        let s2 = _mm256_cvtepi32_ps(hsum_i32_8x8(s2));
        res = _mm256_fmadd_ps(_mm256_set1_ps(-dminw), s2, res);
    }
    _mm256_fmadd_ps(res, dy, acc)
}

/// The outputs of a kernel: `tiled` (lane `j` = row `j`) where every row took the eight-row tiled
/// steps, else `each(j)` per row.
fn results<const N: usize>(tiled: Option<__m256>, each: impl Fn(usize) -> f32) -> [f32; N] {
    match tiled {
        Some(v) => {
            let mut out = [0f32; 8];
            // SAFETY: `out` holds eight floats; `_mm256_storeu_ps` has no alignment requirement and
            // needs only AVX, which every caller's CPU has (a `__m256` exists).
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
            std::array::from_fn(|j| out[j])
        }
        None => std::array::from_fn(each),
    }
}

/// Checks shared by the kernels: `w` holds whole blocks of `bytes`, every activation row as many Q8_K
/// super-blocks, and every path is one of `ok`. Returns the number of super-blocks.
fn check<const N: usize>(
    w: &[u8],
    bytes: usize,
    x: &[Q8kRow<'_>; N],
    paths: &[GgmlPath; N],
    ok: &[GgmlPath],
) -> usize {
    let nb = w.len() / bytes;
    assert_eq!(w.len(), nb * bytes);
    for r in x {
        assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * QK_K / 16);
    }
    assert!(paths.iter().all(|p| ok.contains(p)), "paths {paths:?}");
    nb
}

/// One super-block unpacked for the `maddubs`/`madd` steps: `q[g]` the unsigned codes of group `g`
/// (elements `32g .. 32g + 32`), `sc[g]` the i16 scales of its lanes (a [`scaled`] operand), `mins` the
/// sixteen i16 factors whose `madd` with the Q8_K `bsums` gives the min lanes, `dw` / `dmin` the f16
/// super-block scales widened.
pub(crate) struct Codes {
    pub dw: f32,
    pub dmin: f32,
    pub q: [__m256i; 8],
    pub sc: [__m256i; 8],
    pub mins: __m256i,
}

/// Q5_K's codes: 5-bit quants (run 2c: low nibbles of `qs[32c..]` with bit 2c of `qh`, run 2c+1: high
/// nibbles with bit 2c+1), the scale of each run on all its lanes, `mins[i] = m[i / 2]`.
///
/// # Safety
/// AVX2 must be available; `p` points at one whole Q5_K block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn q5_k_codes(p: *const u8) -> Codes {
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let (dw, dmin) = f16x2(p);
    let (sc, m) = q4_k::scales_mins(std::slice::from_raw_parts(p.add(4), 12));
    let mut q = [_mm256_setzero_si256(); 8];
    let mut qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
    for c in 0..4 {
        let qs = _mm256_loadu_si256(p.add(48 + 32 * c) as *const __m256i);
        let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
        let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4);
        q[2 * c] = _mm256_or_si256(_mm256_and_si256(qs, m4), h0);
        q[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), m4), h1);
        qh = _mm256_srli_epi16(qh, 2);
    }
    let mins: [i16; 16] = std::array::from_fn(|i| i16::from(m[i / 2]));
    Codes {
        dw,
        dmin,
        q,
        sc: std::array::from_fn(|g| _mm256_set1_epi16(i16::from(sc[g]))),
        mins: _mm256_loadu_si256(mins.as_ptr() as *const __m256i),
    }
}

/// Q2_K's codes: 2-bit quants (group `4h + k`: bits `2k..` of `qs[32h + b]`), the scales of the two
/// sub-blocks of 16 in each group (lanes 0..4, 4..8), the sixteen mins.
///
/// # Safety
/// AVX2 must be available; `p` points at one whole Q2_K block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn q2_k_codes(p: *const u8) -> Codes {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0F);
    let (dw, dmin) = f16x2(p.add(80));
    let sm = _mm_loadu_si128(p as *const __m128i);
    let scales = _mm256_cvtepu8_epi16(_mm_and_si128(sm, m4));
    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
    let mut sc = [0i16; 16];
    _mm256_storeu_si256(sc.as_mut_ptr() as *mut __m256i, scales);
    let mut q = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let mut qs = _mm256_loadu_si256(p.add(16 + 32 * h) as *const __m256i);
        for k in 0..4 {
            q[4 * h + k] = _mm256_and_si256(qs, m3);
            qs = _mm256_srli_epi16(qs, 2);
        }
    }
    Codes {
        dw,
        dmin,
        q,
        sc: std::array::from_fn(|g| scale_pair(sc[2 * g], sc[2 * g + 1])),
        mins,
    }
}

/// Q3_K's codes as the tiled path takes them: the unsigned 3-bit codes `q = v + 4` (low bits `2k..` of
/// `qs[32h + b]`, plus 4 where bit `4h + k` of `hmask[b]` is set), the scales `sc − 32` per sub-block of
/// 16, and `mins[s] = 4·(sc[s] − 32)` (|·| ≤ 128), so that `Σ sc·Σ v·q8 = lanes − madd(mins, bsums)`
/// exactly (ggml's tile takes the bias out through the sums likewise). `dmin` is 0.
///
/// # Safety
/// AVX2 must be available; `p` points at one whole Q3_K block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn q3_k_tiled_codes(p: *const u8) -> Codes {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let sc = q3_k::scales(std::slice::from_raw_parts(p, q3_k::BYTES));
    let hm = _mm256_loadu_si256(p as *const __m256i);
    let mut q = [_mm256_setzero_si256(); 8];
    for h in 0..2 {
        let mut qs = _mm256_loadu_si256(p.add(32 + 32 * h) as *const __m256i);
        for k in 0..4 {
            let g = 4 * h + k;
            let bit = _mm256_set1_epi8((1u8 << g) as i8);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
            q[g] = _mm256_or_si256(_mm256_and_si256(qs, m3), _mm256_and_si256(set, four));
            qs = _mm256_srli_epi16(qs, 2);
        }
    }
    let mins: [i16; 16] = std::array::from_fn(|s| (4 * sc[s]) as i16);
    Codes {
        dw: f16x1(p.add(108)),
        dmin: 0.0,
        q,
        sc: std::array::from_fn(|g| scale_pair(sc[2 * g] as i16, sc[2 * g + 1] as i16)),
        mins: _mm256_loadu_si256(mins.as_ptr() as *const __m256i),
    }
}

/// Q5_K weights against Q8_K activations: `ggml_vec_dot_q5_K_q8_K` (AVX2 branch) for `paths[j] =
/// VecDot`, the tiled matmul for `Tiled`. Per super-block the lanes
/// `Σ_j sc[2j]·Σ q5·q8 (low run) + sc[2j+1]·Σ q5·q8 (high run)` and the mins integer
/// `msum = Σ_g m[g]·(bsums[2g] + bsums[2g+1])` (`madd` of the mins with the sums; the scalar's i16 add of
/// two sums of 16 quants cannot wrap); vec_dot: `summs = fma(−d_x·dmin_w, msum, summs)`,
/// `acc = fma(d_x·d_w, lanes, acc)`, result `hsum_float_8(acc) + summs`; tiled: `s1` = the lanes' sum,
/// `res = fma(−dmin_w, msum, d_w·s1)`, `acc = fma(res, d_x, acc)`. The bits of `q5_k::dot_q8_k` /
/// `q5_k::dot_q8_k_tiled`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds `nb` Q5_K blocks and every activation row `nb` Q8_K
/// blocks (checked); every path is `VecDot` or `Tiled` (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_k_q8_k<const N: usize>(
    w: &[u8],
    x: [Q8kRow<'_>; N],
    paths: [GgmlPath; N],
) -> [f32; N] {
    use GgmlPath::{Tiled, VecDot};
    let nb = check(w, q5_k::BYTES, &x, &paths, &[VecDot, Tiled]);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut summs = [0f32; N];
    let mut acc1 = [0f32; N];
    let tiled8_on = all_tiled(&paths);
    let mut acc8 = _mm256_setzero_ps();
    for ib in 0..nb {
        let Codes {
            dw,
            dmin: dminw,
            q,
            sc: scv,
            mins,
        } = q5_k_codes(w.as_ptr().add(ib * q5_k::BYTES));
        let mut lanes = [_mm256_setzero_si256(); N];
        let mut mlanes = [_mm256_setzero_si256(); N];
        for j in 0..N {
            let r = &x[j];
            for (g, (&q, &s)) in q.iter().zip(&scv).enumerate() {
                lanes[j] = _mm256_add_epi32(lanes[j], scaled(q, y32(r, ib, g), s));
            }
            mlanes[j] = _mm256_madd_epi16(mins, bsums16(r, ib));
        }
        if tiled8_on {
            let s2 = eight(&mlanes);
            acc8 = tiled8(&eight(&lanes), Some((&s2, dminw)), dw, d8(&x, ib), acc8);
            continue;
        }
        for j in 0..N {
            let dy = *x[j].d.get_unchecked(ib);
            let msum = hsum_i32_8(mlanes[j]) as f32;
            match paths[j] {
                Tiled => {
                    let s1 = hsum_i32_8(lanes[j]) as f32;
                    let res = (-dminw).mul_add(msum, dw * s1);
                    acc1[j] = res.mul_add(dy, acc1[j]);
                }
                _ => {
                    summs[j] = (-dy * dminw).mul_add(msum, summs[j]);
                    let d = _mm256_set1_ps(dy * dw);
                    acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes[j]), acc[j]);
                }
            }
        }
    }
    results(tiled8_on.then_some(acc8), |j| match paths[j] {
        Tiled => acc1[j],
        _ => hsum_float_8(acc[j]) + summs[j],
    })
}

/// Q3_K weights against Q8_K activations: `ggml_vec_dot_q3_K_q8_K` (AVX2 branch) for `paths[j] = VecDot`,
/// the tiled matmul for `Tiled`. The signed values `q − 4` are taken as ggml's kernel takes them,
/// `maddubs(low, q8) − maddubs(4·!high, q8)` (exact), then `madd` with the scales `sc − 32`; vec_dot:
/// `acc = fma(d_x·d_w, lanes, acc)`, result `hsum_float_8(acc)`; tiled: `s1` = the lanes' sum,
/// `acc = fma(d_w·s1, d_x, acc)`. The bits of `q3_k::dot_q8_k` / `q3_k::dot_q8_k_tiled`.
///
/// # Safety
/// As [`dot_q5_k_q8_k`], with Q3_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q3_k_q8_k<const N: usize>(
    w: &[u8],
    x: [Q8kRow<'_>; N],
    paths: [GgmlPath; N],
) -> [f32; N] {
    use GgmlPath::{Tiled, VecDot};
    let nb = check(w, q3_k::BYTES, &x, &paths, &[VecDot, Tiled]);
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc1 = [0f32; N];
    let tiled8_on = all_tiled(&paths);
    let mut acc8 = _mm256_setzero_ps();
    for ib in 0..nb {
        let blk = &w[ib * q3_k::BYTES..(ib + 1) * q3_k::BYTES];
        let p = blk.as_ptr();
        let dw = f16x1(p.add(108));
        let sc = q3_k::scales(blk);
        // group g = 4h + k (elements 32g ..): low bits 2k.. of qs[32h + b], high bit 4h + k of hmask[b]
        let hm = _mm256_loadu_si256(p as *const __m256i);
        let mut low = [_mm256_setzero_si256(); 8];
        let mut bias = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let mut qs = _mm256_loadu_si256(p.add(32 + 32 * h) as *const __m256i);
            for k in 0..4 {
                let g = 4 * h + k;
                low[g] = _mm256_and_si256(qs, m3);
                qs = _mm256_srli_epi16(qs, 2);
                let bit = _mm256_set1_epi8((1u8 << g) as i8);
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                bias[g] = _mm256_and_si256(clear, four);
            }
        }
        let scv: [__m256i; 8] =
            std::array::from_fn(|g| scale_pair(sc[2 * g] as i16, sc[2 * g + 1] as i16));
        let mut lanes = [_mm256_setzero_si256(); N];
        for j in 0..N {
            for g in 0..8 {
                let y = y32(&x[j], ib, g);
                let v = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(low[g], y),
                    _mm256_maddubs_epi16(bias[g], y),
                );
                lanes[j] = _mm256_add_epi32(lanes[j], _mm256_madd_epi16(v, scv[g]));
            }
        }
        if tiled8_on {
            acc8 = tiled8(&eight(&lanes), None, dw, d8(&x, ib), acc8);
            continue;
        }
        for j in 0..N {
            let dy = *x[j].d.get_unchecked(ib);
            match paths[j] {
                Tiled => {
                    let s1 = hsum_i32_8(lanes[j]) as f32;
                    acc1[j] = (dw * s1).mul_add(dy, acc1[j]);
                }
                _ => {
                    let d = _mm256_set1_ps(dy * dw);
                    acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes[j]), acc[j]);
                }
            }
        }
    }
    results(tiled8_on.then_some(acc8), |j| match paths[j] {
        Tiled => acc1[j],
        _ => hsum_float_8(acc[j]),
    })
}

/// Q2_K weights against Q8_K activations on every path llama.cpp takes: `ggml_vec_dot_q2_K_q8_K` (AVX2
/// branch; `VecDot`), the tiled matmul (`Tiled`) and the repacked `ggml_gemv_q2_K_8x8_q8_K` /
/// `ggml_gemm_q2_K_8x8_q8_K` of an AVX-512 build (`RepackGemv` / `RepackGemm`). Per super-block the
/// lanes `Σ sc·Σ q2·q8` per half of 128 elements and the mins lanes `m[2l]·bsums[2l] +
/// m[2l+1]·bsums[2l+1]` (`madd`: lanes 0..4 are the first half's sub-blocks); vec_dot:
/// `acc = fma(−d_x·dmin_w, mins lanes, acc)`, then `acc = fma(d_x·d_w, lanes, acc)`, result
/// `hsum_float_8(acc)`; tiled: `res = fma(−dmin_w, s2, d_w·s1)`, `acc = fma(res, d_x, acc)`; repacked:
/// `acc = fma(isum, d_w·d_x, acc)`, `accm = fma(imin, dmin_w·d_x, accm)` per half (gemm) or per
/// super-block (gemv), result `acc − accm`. The bits of `q2_k::dot_q8_k`, `q2_k::dot_q8_k_tiled` and
/// `q2_k::dot_q8_k_repacked`.
///
/// # Safety
/// As [`dot_q5_k_q8_k`], with Q2_K blocks; any path but the float and tinyBLAS ones (checked).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q2_k_q8_k<const N: usize>(
    w: &[u8],
    x: [Q8kRow<'_>; N],
    paths: [GgmlPath; N],
) -> [f32; N] {
    use GgmlPath::{RepackGemm, RepackGemv, Tiled, VecDot};
    let nb = check(
        w,
        q2_k::BYTES,
        &x,
        &paths,
        &[VecDot, Tiled, RepackGemv, RepackGemm],
    );
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc1 = [0f32; N];
    let mut accm = [0f32; N];
    let tiled8_on = all_tiled(&paths);
    let mut acc8 = _mm256_setzero_ps();
    for ib in 0..nb {
        let Codes {
            dw,
            dmin: dminw,
            q,
            sc: scv,
            mins,
        } = q2_k_codes(w.as_ptr().add(ib * q2_k::BYTES));
        let mut halves = [[_mm256_setzero_si256(); 2]; N];
        let mut prods = [_mm256_setzero_si256(); N];
        for j in 0..N {
            let r = &x[j];
            for (g, (&q, &s)) in q.iter().zip(&scv).enumerate() {
                let h = &mut halves[j][g / 4];
                *h = _mm256_add_epi32(*h, scaled(q, y32(r, ib, g), s));
            }
            prods[j] = _mm256_madd_epi16(mins, bsums16(r, ib));
        }
        if tiled8_on {
            let s1: [__m256i; 8] =
                std::array::from_fn(|j| _mm256_add_epi32(halves[j % N][0], halves[j % N][1]));
            acc8 = tiled8(&s1, Some((&eight(&prods), dminw)), dw, d8(&x, ib), acc8);
            continue;
        }
        for j in 0..N {
            let dy = *x[j].d.get_unchecked(ib);
            let (half, prod) = (halves[j], prods[j]);
            match paths[j] {
                VecDot => {
                    let dmin = _mm256_set1_ps(-dy * dminw);
                    acc[j] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc[j]);
                    let d = _mm256_set1_ps(dy * dw);
                    let lanes = _mm256_add_epi32(half[0], half[1]);
                    acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[j]);
                }
                Tiled => {
                    let s1 = hsum_i32_8(_mm256_add_epi32(half[0], half[1])) as f32;
                    let s2 = hsum_i32_8(prod) as f32;
                    let res = (-dminw).mul_add(s2, dw * s1);
                    acc1[j] = res.mul_add(dy, acc1[j]);
                }
                _ => {
                    let (dsc, dmn) = (dw * dy, dminw * dy);
                    let isum = [hsum_i32_8(half[0]), hsum_i32_8(half[1])];
                    // the mins of sub-blocks 0..8 are lanes 0..4 (the low 128 bits)
                    let lo = _mm256_castsi256_si128(prod);
                    let hi = _mm256_extracti128_si256::<1>(prod);
                    let imin = [hsum_i32_4(lo), hsum_i32_4(hi)];
                    if paths[j] == RepackGemm {
                        for h in 0..2 {
                            acc1[j] = (isum[h] as f32).mul_add(dsc, acc1[j]);
                            accm[j] = (imin[h] as f32).mul_add(dmn, accm[j]);
                        }
                    } else {
                        let (s, m) = (isum[0].wrapping_add(isum[1]), imin[0].wrapping_add(imin[1]));
                        acc1[j] = (s as f32).mul_add(dsc, acc1[j]);
                        accm[j] = (m as f32).mul_add(dmn, accm[j]);
                    }
                }
            }
        }
    }
    results(tiled8_on.then_some(acc8), |j| match paths[j] {
        VecDot => hsum_float_8(acc[j]),
        Tiled => acc1[j],
        _ => acc1[j] - accm[j],
    })
}

/// Sum of the four i32 lanes of `v` (exact, wrapping).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum_i32_4(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// IQ4_XS weights against Q8_K activations: `ggml_vec_dot_iq4_xs_q8_K` (AVX2 branch) for `paths[j] =
/// VecDot`, the tiled matmul for `Tiled`. The table values `v` (`kvalues_iq4nl` through `pshufb`) against
/// the quants: vec_dot with ggml's `mul_add_epi8` sign trick, `maddubs(|v|, sign(q8, v))` (which differs
/// from `v·q8` for a −128 quant, as ggml's kernel does); tiled with the plain products, as the AVX-512
/// VNNI tile this build runs (`maddubs(|q8|, sign(v, q8))`: exact, |q8| ≤ 128 fits the unsigned operand,
/// pairs ≤ 32512); `madd` with the scales `ls − 32`. vec_dot: `acc = fma(d_w·d_x, lanes, acc)`, result
/// `hsum_float_8(acc)`; tiled: `acc = fma(d_w·s1, d_x, acc)`. The bits of `iq4_xs::dot_q8_k` /
/// `iq4_xs::dot_q8_k_tiled`.
///
/// # Safety
/// As [`dot_q5_k_q8_k`], with IQ4_XS blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_iq4_xs_q8_k<const N: usize>(
    w: &[u8],
    x: [Q8kRow<'_>; N],
    paths: [GgmlPath; N],
) -> [f32; N] {
    use GgmlPath::{Tiled, VecDot};
    let nb = check(w, iq4_xs::BYTES, &x, &paths, &[VecDot, Tiled]);
    let lut128 = _mm_loadu_si128(iq4_nl::KVALUES.as_ptr() as *const __m128i);
    let lut = _mm256_set_m128i(lut128, lut128);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc1 = [0f32; N];
    let tiled8_on = all_tiled(&paths);
    let mut acc8 = _mm256_setzero_ps();
    for ib in 0..nb {
        let blk = &w[ib * iq4_xs::BYTES..(ib + 1) * iq4_xs::BYTES];
        let p = blk.as_ptr();
        let dw = f16x1(p);
        let ls = iq4_xs::scales(blk);
        // sub-block s: its 16 bytes at 8 + 16s, low nibbles = elements 0..16, high = 16..32
        let v: [__m256i; 8] = std::array::from_fn(|s| {
            _mm256_shuffle_epi8(lut, bytes_from_nibbles_32(p.add(8 + 16 * s)))
        });
        let av: [__m256i; 8] = std::array::from_fn(|s| _mm256_sign_epi8(v[s], v[s]));
        let scv: [__m256i; 8] = std::array::from_fn(|s| _mm256_set1_epi16(ls[s] as i16));
        let mut lanes = [_mm256_setzero_si256(); N];
        for j in 0..N {
            let r = &x[j];
            if paths[j] == Tiled {
                for s in 0..8 {
                    let y = y32(r, ib, s);
                    let prod = _mm256_maddubs_epi16(_mm256_abs_epi8(y), _mm256_sign_epi8(v[s], y));
                    lanes[j] = _mm256_add_epi32(lanes[j], _mm256_madd_epi16(prod, scv[s]));
                }
            } else {
                for s in 0..8 {
                    let y = y32(r, ib, s);
                    let prod = _mm256_maddubs_epi16(av[s], _mm256_sign_epi8(y, v[s]));
                    lanes[j] = _mm256_add_epi32(lanes[j], _mm256_madd_epi16(prod, scv[s]));
                }
            }
        }
        if tiled8_on {
            acc8 = tiled8(&eight(&lanes), None, dw, d8(&x, ib), acc8);
            continue;
        }
        for j in 0..N {
            let dy = *x[j].d.get_unchecked(ib);
            if paths[j] == Tiled {
                let s1 = hsum_i32_8(lanes[j]) as f32;
                acc1[j] = (dw * s1).mul_add(dy, acc1[j]);
            } else {
                let d = _mm256_set1_ps(dw * dy);
                acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes[j]), acc[j]);
            }
        }
    }
    results(tiled8_on.then_some(acc8), |j| match paths[j] {
        Tiled => acc1[j],
        _ => hsum_float_8(acc[j]),
    })
}
