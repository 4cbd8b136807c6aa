//! Q6_K: super-blocks of 256 = 16 sub-blocks of 16 6-bit quants with signed 8-bit scales;
//! value = `d * sc * (q - 32)`.
//!
//! `block_q6_K` (ggml-common.h, 210 bytes): `ql: [u8; 128]` (low 4 bits), `qh: [u8; 64]` (high 2 bits),
//! `scales: [i8; 16]`, `d: f16`. Each half of 128 elements uses 64 bytes of `ql` and 32 of `qh`: element
//! `l + 32*k` (k = 0..4, l = 0..32) takes its low bits from `ql[l + 32*(k%2)]` (low nibble for k < 2, high
//! nibble for k >= 2) and its high bits from bits `2k..2k+2` of `qh[l]`. `vec_dot_type` Q8_K.

use super::fp::{f16_to_f32, f32_to_f16_ref, read_f16};
use super::kquant_ref::{make_qx_quants, nearest_int, GROUP_MAX_EPS};
use super::q8_k::QK_K;
use super::x86::{fma, fma_lanes, hsum_float_8};

/// Bytes per block.
pub(crate) const BYTES: usize = 210;

/// The 256 unsigned 6-bit quants (0..64, before the -32 offset) of one block, in element order.
#[inline]
pub(super) fn quants(blk: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for half in 0..2 {
        let ql = &blk[64 * half..64 * half + 64];
        let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
        let y = &mut q[128 * half..128 * half + 128];
        for l in 0..32 {
            y[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            y[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// One block to f32 (`dequantize_row_q6_K`: `y = d * sc * (q - 32)`, evaluated left to right).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK_K]) {
    let d = read_f16(blk, 208);
    let sc = &blk[192..208];
    for (i, (o, &q)) in out.iter_mut().zip(quants(blk).iter()).enumerate() {
        *o = d * f32::from(sc[i / 16] as i8) * f32::from(q as i8 - 32);
    }
}

/// `ggml_vec_dot_q6_K_q8_K`, x86 AVX2 branch (arch/x86/quants.c). Per super-block: `d = d8 * d_w`; eight
/// i32 lanes, lane `l` = sum over sub-blocks of 32 (`g`) of `sc[2g + l/4] * sum_{k<4} q[32g+4l+k] *
/// q8[32g+4l+k]` with the unsigned quants `q` (0..64), minus the offset term
/// `32 * (bsums[2l]*sc[2l] + bsums[2l+1]*sc[2l+1])`; `acc[l] = fma(d, (float)lane, acc[l])` (the lane sum can
/// exceed 2^24, and is rounded to f32 as `_mm256_cvtepi32_ps` does); result `hsum_float_8(acc)`.
pub(crate) fn dot_q8_k(w: &[u8], xq: &[i8], xd: &[f32], xbsums: &[i16]) -> f32 {
    let mut acc = [0f32; 8];
    for (((blk, qy), &dy), bsums) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK_K))
        .zip(xd)
        .zip(xbsums.chunks_exact(QK_K / 16))
    {
        let d = dy * read_f16(blk, 208);
        let sc: [i32; 16] = core::array::from_fn(|i| i32::from(blk[192 + i] as i8));
        let q = quants(blk);
        let mut lanes = [0i32; 8];
        for g in 0..8 {
            let q6 = &q[32 * g..32 * g + 32];
            let q8 = &qy[32 * g..32 * g + 32];
            for (l, lane) in lanes.iter_mut().enumerate() {
                let mut p = 0i32;
                for k in 4 * l..4 * l + 4 {
                    p += i32::from(q6[k]) * i32::from(q8[k]);
                }
                *lane = lane.wrapping_add(sc[2 * g + l / 4] * p);
            }
        }
        for (l, lane) in lanes.iter_mut().enumerate() {
            let sub =
                i32::from(bsums[2 * l]) * sc[2 * l] + i32::from(bsums[2 * l + 1]) * sc[2 * l + 1];
            *lane = lane.wrapping_sub(sub << 5);
        }
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc)
}

/// One output of llama.cpp's tiled K-quant matmul for Q6_K (ggml-cpu/tiled, `tiled_run_microtile_avx2`;
/// the AVX-512 VNNI kernel computes the same), which runs for batches ≥ 8: per super-block the exact
/// integer `s1 = Σ_s scale_s · Σ (q − 32)·q8`, then `res = d_w·s1` and `acc = fma(res, d_x, acc)`.
pub(crate) fn dot_q8_k_tiled(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = 0f32;
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK_K)).zip(xd) {
        let sc: [i32; 16] = core::array::from_fn(|i| i32::from(blk[192 + i] as i8));
        let q = quants(blk);
        let mut s1 = 0i32;
        for (i, (&qv, &y)) in q.iter().zip(qy).enumerate() {
            s1 += sc[i / 16] * (i32::from(qv) - 32) * i32::from(y);
        }
        acc = fma(read_f16(blk, 208) * s1 as f32, dy, acc);
    }
    acc
}

/// `quantize_row_q6_K_ref` (ggml-quants.c; what `quantize_q6_K` runs without an importance matrix).
/// `src`: `n·256` f32; `dst`: `n·210` bytes (`block_q6_K`).
///
/// Per super-block: [`make_qx_quants`]`(16, nmax 32, rmse_type 1)` per sub-block of 16 → signed scales;
/// if the largest |scale| is below `GROUP_MAX_EPS` the whole block is zero bytes. Otherwise
/// `iscale = −128/max_scale` (the scale of largest |·|, first wins), `d = f16(1/iscale)`, 8-bit scales
/// `(i8)min(127, nearest_int(iscale·s))`, and each quant redone as `clamp(nearest_int(x/d), −32, 31) + 32`
/// with `d = d_f16·sc` (sub-blocks with `d == 0` keep their `make_qx_quants` quants). Plain f32
/// arithmetic: libggml-base is compiled without FMA (see `kquant_ref`).
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let mut max_scale = 0f32;
        let mut max_abs_scale = 0f32;
        for ib in 0..16 {
            let scale = make_qx_quants(
                32,
                &x[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                1,
            );
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            blk.fill(0);
            blk[208..210].copy_from_slice(&f32_to_f16_ref(0.0).to_le_bytes());
            continue;
        }
        let iscale = -128.0 / max_scale;
        let d_bits = f32_to_f16_ref(1.0 / iscale);
        let d16 = f16_to_f32(d_bits);
        let mut sc = [0i8; 16];
        for (o, &s) in sc.iter_mut().zip(&scales) {
            *o = nearest_int(iscale * s).min(127) as i8;
        }
        for j in 0..16 {
            let d = d16 * f32::from(sc[j]);
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        let (ql, rest) = blk.split_at_mut(128);
        let (qh, tail) = rest.split_at_mut(64);
        for h in 0..2 {
            let lh = &l[128 * h..128 * h + 128];
            for b in 0..32 {
                let q = |k: usize| lh[b + 32 * k] as u8;
                ql[64 * h + b] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
                ql[64 * h + b + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
                qh[32 * h + b] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
        for (o, &s) in tail[..16].iter_mut().zip(&sc) {
            *o = s as u8;
        }
        tail[16..18].copy_from_slice(&d_bits.to_le_bytes());
    }
}

#[cfg(test)]
mod quantize_tests {
    use super::super::kquant_ref::test_rows::{check_golden, check_round_trip};
    use super::*;

    #[test]
    fn quantize_row_ref_matches_ggml_bytes() {
        // sha256 of the bytes ggml produces for `test_rows::rows()`: the C oracle (dev-only, outside the
        // repo) is ggml-quants.c of the pinned llama.cpp 0c1e570 compiled as libggml-base compiles it,
        // `gcc-12 -O3 -DNDEBUG -std=gnu11 -fPIC -D_GNU_SOURCE -D_XOPEN_SOURCE=600 -DGGML_SCHED_MAX_COPIES=4
        // -Iggml/include -Iggml/src -Iggml/src/ggml-cpu -c ggml-quants.c`, linked with a small driver that
        // calls `quantize_q6_K(rows, dst, 1, n_per_row, NULL)` on the rows `dump_for_oracle` writes.
        // The ggml-quants.c.o of the llama.cpp tools build (its libggml-base.a) gives the same bytes.
        let expected = [
            (
                "constant",
                "552651789009f6bc88afc1978786a5405217c9790e4018be1d6b674f20d83d2c",
            ),
            (
                "huge_in_noise",
                "d6238f5a10023cf4febe06a1940d61f7c015e5607d148795b18819eea0109671",
            ),
            (
                "mixed_groups",
                "cfe4485190190cb0bd5c1ccd1c1963c808fc7a04a44e91fb497f88728c44cac8",
            ),
            (
                "neg_constant",
                "c9f62c93211bb3f6bc9b116a2851621616025783c87b027e2e6794b363b4abea",
            ),
            (
                "normal_0.02",
                "136f5a866a1ebb00e541d42cc1745fc57d5b8a17dad4ace195b607714ced901f",
            ),
            (
                "normal_1",
                "3210ee6078c50dea3dbdef849ecbe8082e09d6123c3033873aa2c283b93ef2bc",
            ),
            (
                "one_huge",
                "ca90ff3523625474b287fc81d2c44f8dd14a4a5962af1a4532be58598666046d",
            ),
            (
                "outliers",
                "b59cf0ea04b31a4d864480052a2dcfb1c2f7993706ddeb180876f543983e16c3",
            ),
            (
                "sparse",
                "7497fc702cb94a16d5715ee5e6f3a24679c14af71280d5d69490c9103038d4a5",
            ),
            (
                "sweep_concat",
                "439bd054c9f6aea92d31a8cb79767ab8869669375b87a24924b4f69e996e5049",
            ),
            (
                "tiny",
                "d23127b549ee4716bad32a0b6d3a7001e591be76efc0a000b9dde290e725c9c4",
            ),
            (
                "uniform_pos",
                "fbf1c910ec47b1623ed40ffe1dbd954627450ac94c9c146f8b386a14401f7b2a",
            ),
            (
                "zeros",
                "de1da8f3791deb5ea5a11c9a67179b1e240aa14979524a3cc28add0e3612c0fe",
            ),
        ];
        check_golden("q6_K", quantize_row_ref, BYTES, &expected);
    }

    #[test]
    fn quantize_row_ref_round_trips() {
        // ggml's own output has a worst relative RMS error of 0.037 on these rows (bytes are identical)
        check_round_trip("q6_K", quantize_row_ref, BYTES, dequantize_block, 0.05);
    }
}
