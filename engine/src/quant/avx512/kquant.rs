//! AVX-512 BW kernels for a prompt's groups of eight tokens against Q2_K, Q3_K and Q5_K weights: the
//! tiled K-quant matmul (ggml-cpu/tiled, batches ≥ 8) and, for Q2_K, the repacked
//! `ggml_gemm_q2_K_8x8_q8_K` (arch/x86/repack.cpp) of an AVX-512 build, for
//! [`crate::numerics::Simd::Avx512`].
//!
//! They compute the integers of [`super::super::avx2::kquant`]'s kernels with 512-bit `maddubs`/`madd`
//! (two groups of 32 quants per instruction instead of one; the lanes are exact integers, so summing
//! them in another order changes nothing) from the same unpacked codes ([`Codes`]), and then the same
//! f32 steps, lane `j` of one vector being token `j`'s chain: the bits of the scalar spec
//! (`q2_k::dot_q8_k_tiled` / `dot_q8_k_repacked`, `q3_k::dot_q8_k_tiled`, `q5_k::dot_q8_k_tiled`). Calls
//! on other paths (decode's vec_dot and gemv, the last `B % 8` tokens) take the AVX2 kernels.
//!
//! Every function here is `unsafe`: the caller must have checked that the CPU has AVX-512 F and BW (and
//! AVX2, FMA, F16C), and the slices must hold whole blocks (checked with `assert!`).

use std::arch::x86_64::*;

use super::super::avx2::kquant::{
    bsums16, d8, q2_k_codes, q3_k_tiled_codes, q5_k_codes, tiled8, Codes,
};
use super::super::avx2::{hsum_i32_8x8, Q8kRow};
use super::super::q8_k::QK_K;
use super::super::{q2_k, q3_k, q5_k};

/// What one [`dot_x8`] call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)] // ggml's type names
pub(crate) enum Tile8 {
    /// Q2_K, tiled path: `res = fma(−dmin_w, s2, d_w·s1)`, `acc = fma(res, d_x, acc)`.
    Q2_KTiled,
    /// Q2_K, repacked gemm: per half of 128, `acc = fma(isum, d_w·d_x, acc)`,
    /// `accm = fma(imin, dmin_w·d_x, accm)`; result `acc − accm`.
    Q2_KGemm,
    /// Q3_K, tiled path: `acc = fma(d_w·s1, d_x, acc)`.
    Q3_KTiled,
    /// Q5_K, tiled path: as Q2_K's.
    Q5_KTiled,
}

/// The two 256-bit halves as one 512-bit vector (`lo` in bits 0..256).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// One weight row against eight activation rows on the path `kind` names (see [`Tile8`]): output `j`
/// has the bits the scalar kernel gives for row `j`.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL; `w` holds whole blocks of the type and
/// every activation row as many Q8_K super-blocks (checked).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_x8(kind: Tile8, w: &[u8], x: [Q8kRow<'_>; 8]) -> [f32; 8] {
    let bytes = match kind {
        Tile8::Q2_KTiled | Tile8::Q2_KGemm => q2_k::BYTES,
        Tile8::Q3_KTiled => q3_k::BYTES,
        Tile8::Q5_KTiled => q5_k::BYTES,
    };
    let nb = w.len() / bytes;
    assert_eq!(w.len(), nb * bytes);
    for r in &x {
        assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * QK_K / 16);
    }
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for ib in 0..nb {
        let p = w.as_ptr().add(ib * bytes);
        let c: Codes = match kind {
            Tile8::Q2_KTiled | Tile8::Q2_KGemm => q2_k_codes(p),
            Tile8::Q3_KTiled => q3_k_tiled_codes(p),
            Tile8::Q5_KTiled => q5_k_codes(p),
        };
        let q: [__m512i; 4] = std::array::from_fn(|i| join(c.q[2 * i], c.q[2 * i + 1]));
        let sc: [__m512i; 4] = std::array::from_fn(|i| join(c.sc[2 * i], c.sc[2 * i + 1]));
        // per row: the lanes of each half of 128 elements (pairs 0, 1 and 2, 3 of groups) and the
        // min lanes
        let mut half = [[_mm256_setzero_si256(); 8]; 2];
        let mut mins = [_mm256_setzero_si256(); 8];
        for j in 0..8 {
            let y = x[j].qs.as_ptr().add(ib * QK_K);
            for (h, half) in half.iter_mut().enumerate() {
                let mut a = _mm512_setzero_si512();
                for i in 2 * h..2 * h + 2 {
                    let yv = _mm512_loadu_si512(y.add(64 * i) as *const _);
                    let prod = _mm512_madd_epi16(_mm512_maddubs_epi16(q[i], yv), sc[i]);
                    a = _mm512_add_epi32(a, prod);
                }
                half[j] =
                    _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64::<1>(a));
            }
            mins[j] = _mm256_madd_epi16(c.mins, bsums16(&x[j], ib));
        }
        let lanes: [__m256i; 8] = std::array::from_fn(|j| _mm256_add_epi32(half[0][j], half[1][j]));
        let dy = d8(&x, ib);
        match kind {
            Tile8::Q2_KTiled | Tile8::Q5_KTiled => {
                acc = tiled8(&lanes, Some((&mins, c.dmin)), c.dw, dy, acc);
            }
            Tile8::Q3_KTiled => {
                let s1: [__m256i; 8] = std::array::from_fn(|j| _mm256_sub_epi32(lanes[j], mins[j]));
                acc = tiled8(&s1, None, c.dw, dy, acc);
            }
            Tile8::Q2_KGemm => {
                let dsc = _mm256_mul_ps(_mm256_set1_ps(c.dw), dy);
                let dmn = _mm256_mul_ps(_mm256_set1_ps(c.dmin), dy);
                // the min lanes of the first half's sub-blocks are lanes 0..4
                let lo = _mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0);
                for (h, half) in half.iter().enumerate() {
                    let isum = _mm256_cvtepi32_ps(hsum_i32_8x8(half));
                    let m: [__m256i; 8] = std::array::from_fn(|j| {
                        if h == 0 {
                            _mm256_and_si256(mins[j], lo)
                        } else {
                            _mm256_andnot_si256(lo, mins[j])
                        }
                    });
                    let imin = _mm256_cvtepi32_ps(hsum_i32_8x8(&m));
                    acc = _mm256_fmadd_ps(isum, dsc, acc);
                    accm = _mm256_fmadd_ps(imin, dmn, accm);
                }
            }
        }
    }
    if kind == Tile8::Q2_KGemm {
        acc = _mm256_sub_ps(acc, accm);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}
