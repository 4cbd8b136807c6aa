//! Q4_K: super-blocks of 256 = 8 sub-blocks of 32 4-bit quants, each with a 6-bit scale and a 6-bit min;
//! value = `d * sc * q - dmin * m`.
//!
//! `block_q4_K` (ggml-common.h, 144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (8 scales and 8 mins,
//! 6 bits each, packed as `get_scale_min_k4` reads them), `qs: [u8; 128]`. Each run of 32 bytes of `qs` holds
//! two sub-blocks: the low nibbles are sub-block `2k`, the high nibbles sub-block `2k + 1`. `vec_dot_type`
//! Q8_K.

use super::fp::read_f16;
use super::kquant_ref::{q45_k_block, Qkx2};
use super::q8_k::QK_K;
use super::x86::{fma, fma_lanes, hsum_float_4, hsum_float_8};

/// Bytes per block.
pub(crate) const BYTES: usize = 144;

/// The 8 scales and 8 mins (`get_scale_min_k4`, ggml-quants.c).
#[inline]
pub(super) fn scales_mins(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    if crate::faults::is(crate::faults::Fault::QuantMinMisread) {
        return (sc, sc);
    }
    (sc, m)
}

/// One block to f32 (`dequantize_row_q4_K`: `d1 = d * sc`, `m1 = dmin * m`, `y = d1 * q - m1`).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK_K]) {
    let d = read_f16(blk, 0);
    let min = read_f16(blk, 2);
    let (sc, m) = scales_mins(&blk[4..16]);
    let qs = &blk[16..16 + QK_K / 2];
    for c in 0..4 {
        let d1 = d * f32::from(sc[2 * c]);
        let m1 = min * f32::from(m[2 * c]);
        let d2 = d * f32::from(sc[2 * c + 1]);
        let m2 = min * f32::from(m[2 * c + 1]);
        let q = &qs[32 * c..32 * c + 32];
        let y = &mut out[64 * c..64 * c + 64];
        for l in 0..32 {
            y[l] = d1 * f32::from(q[l] & 0xF) - m1;
            y[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
        }
    }
}

/// `ggml_vec_dot_q4_K_q8_K`, x86 AVX2 branch (arch/x86/quants.c). Per super-block:
/// `d = d8 * d_w`, `dmin = -d8 * dmin_w`; four i32 lanes `mins[2t]*(bsums[4t]+bsums[4t+1]) +
/// mins[2t+1]*(bsums[4t+2]+bsums[4t+3])` fused into `acc_m[t] = fma(dmin, ., acc_m[t])`; eight i32 lanes,
/// lane `l` = sum over sub-blocks `g` of `sc[g] * sum_{k<4} q4[32g+4l+k] * q8[32g+4l+k]`, fused into
/// `acc[l] = fma(d, ., acc[l])`. Result `hsum_float_8(acc) + hsum_float_4(acc_m)`.
///
/// On this machine a Q4_K matmul usually does not reach this kernel: Q4_K weights with a row count divisible
/// by 8 are repacked (`q4_K_8x8_q8_K`, see the module docs of `quant`).
pub(crate) fn dot_q8_k(w: &[u8], xq: &[i8], xd: &[f32], xbsums: &[i16]) -> f32 {
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    for (((blk, qy), &dy), bsums) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK_K))
        .zip(xd)
        .zip(xbsums.chunks_exact(QK_K / 16))
    {
        let d = dy * read_f16(blk, 0);
        let dmin = -dy * read_f16(blk, 2);
        let (sc, m) = scales_mins(&blk[4..16]);
        // _mm_hadd_epi16 of the bsums: sums of 32 (one per sub-block), then _mm_madd_epi16 with the mins
        let mut q8s = [0i32; 8];
        for (g, s) in q8s.iter_mut().enumerate() {
            *s = i32::from(bsums[2 * g].wrapping_add(bsums[2 * g + 1]));
        }
        for (t, a) in acc_m.iter_mut().enumerate() {
            let prod = i32::from(m[2 * t]) * q8s[2 * t] + i32::from(m[2 * t + 1]) * q8s[2 * t + 1];
            *a = fma(dmin, prod as f32, *a);
        }
        let qs = &blk[16..16 + QK_K / 2];
        let mut lanes = [0i32; 8];
        for c in 0..4 {
            let q4 = &qs[32 * c..32 * c + 32];
            let q8l = &qy[64 * c..64 * c + 32];
            let q8h = &qy[64 * c + 32..64 * c + 64];
            let (sl, sh) = (i32::from(sc[2 * c]), i32::from(sc[2 * c + 1]));
            for (l, lane) in lanes.iter_mut().enumerate() {
                let (mut pl, mut ph) = (0i32, 0i32);
                for k in 4 * l..4 * l + 4 {
                    pl += i32::from(q4[k] & 0xF) * i32::from(q8l[k]);
                    ph += i32::from(q4[k] >> 4) * i32::from(q8h[k]);
                }
                *lane = lane.wrapping_add(sl * pl + sh * ph);
            }
        }
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc) + hsum_float_4(&acc_m)
}

/// Exact integer parts of one Q4_K super-block against Q8_K activations: per sub-block `g` of 32,
/// `isum[g] = sc[g] · Σ q4·q8` and `imin[g] = m[g] · (bsums[2g] + bsums[2g+1])`.
#[inline(always)]
fn block_ints(blk: &[u8], qy: &[i8], bsums: &[i16]) -> ([i32; 8], [i32; 8]) {
    let (sc, m) = scales_mins(&blk[4..16]);
    let qs = &blk[16..16 + QK_K / 2];
    let mut isum = [0i32; 8];
    let mut imin = [0i32; 8];
    for g in 0..8 {
        let (c, high) = (g / 2, g % 2 == 1);
        let q4 = &qs[32 * c..32 * c + 32];
        let q8 = &qy[32 * g..32 * g + 32];
        let dot: i32 = q4
            .iter()
            .zip(q8)
            .map(|(&q, &y)| i32::from(if high { q >> 4 } else { q & 0xF }) * i32::from(y))
            .sum();
        isum[g] = i32::from(sc[g]) * dot;
        imin[g] = i32::from(m[g]) * (i32::from(bsums[2 * g]) + i32::from(bsums[2 * g + 1]));
    }
    (isum, imin)
}

/// One output of llama.cpp's repacked Q4_K matmul (`q4_K_8x8_q8_K`, arch/x86/repack.cpp), which is what
/// runs for Q4_K weights with a row count divisible by 8 (the default `CPU_REPACK` buffer):
///
/// - `gemm = false`: `ggml_gemv_q4_K_8x8_q8_K` (decode, and the last `B % 4` rows of a batch): one fma per
///   super-block, `acc = fma(Σ isum, d_w·d_x, acc)`, `accm = fma(Σ imin, dmin_w·d_x, accm)`;
/// - `gemm = true`: `ggml_gemm_q4_K_8x8_q8_K` (batch rows in groups of 4): the same with one fma per *pair*
///   of sub-blocks.
///
/// Result `acc − accm`. The activation's `ggml_quantize_mat_q8_K_4x8` gives the values of
/// `quantize_row_q8_K` (up to a sign flip of a whole block that leaves every product unchanged).
pub(crate) fn dot_q8_k_repacked(
    w: &[u8],
    xq: &[i8],
    xd: &[f32],
    xbsums: &[i16],
    gemm: bool,
) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (((blk, qy), &dy), bsums) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK_K))
        .zip(xd)
        .zip(xbsums.chunks_exact(QK_K / 16))
    {
        let dsc = read_f16(blk, 0) * dy;
        let dmn = read_f16(blk, 2) * dy;
        let (isum, imin) = block_ints(blk, qy, bsums);
        if gemm {
            for p in 0..4 {
                let s = isum[2 * p] + isum[2 * p + 1];
                let m = imin[2 * p] + imin[2 * p + 1];
                acc = fma(s as f32, dsc, acc);
                accm = fma(m as f32, dmn, accm);
            }
        } else {
            acc = fma(isum.iter().sum::<i32>() as f32, dsc, acc);
            accm = fma(imin.iter().sum::<i32>() as f32, dmn, accm);
        }
    }
    acc - accm
}

/// One output of llama.cpp's tiled K-quant matmul (ggml-cpu/tiled, `tiled_run_microtile_avx2` and the
/// AVX-512 VNNI kernel compute the same) for Q4_K weights that were not repacked, batches ≥ 8: per
/// super-block `res = d_w·s1`, `res = fma(−dmin_w, s2, res)`, `acc = fma(res, d_x, acc)` with the exact
/// integers `s1 = Σ isum`, `s2 = Σ imin`.
pub(crate) fn dot_q8_k_tiled(w: &[u8], xq: &[i8], xd: &[f32], xbsums: &[i16]) -> f32 {
    let mut acc = 0f32;
    for (((blk, qy), &dy), bsums) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK_K))
        .zip(xd)
        .zip(xbsums.chunks_exact(QK_K / 16))
    {
        let (isum, imin) = block_ints(blk, qy, bsums);
        let s1 = isum.iter().sum::<i32>() as f32;
        let s2 = imin.iter().sum::<i32>() as f32;
        let res = fma(-read_f16(blk, 2), s2, read_f16(blk, 0) * s1);
        acc = fma(res, dy, acc);
    }
    acc
}

/// `quantize_row_q4_K_ref` (ggml-quants.c; what `quantize_q4_K` runs without an importance matrix).
/// `src`: `n·256` f32; `dst`: `n·144` bytes (`block_q4_K`).
///
/// Per super-block ([`q45_k_block`]): weights `sqrt(Σx²/32) + |x|` per sub-block of 32,
/// [`make_qkx2_quants`](super::kquant_ref::make_qkx2_quants)`(nmax 15, rmin −1, rdelta 0.1, nstep 20, squared error)`, 6-bit scales and mins against `d = f16(max_s/63)`,
/// `dmin = f16(max_m/63)`, then every quant redone from the stored values as
/// `clamp(nearest_int((x + dmin·m)/(d·sc)), 0, 15)`. Plain f32 arithmetic: libggml-base is compiled
/// without FMA (see `kquant_ref`).
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    let p = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    for (x, blk) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BYTES)) {
        let l = q45_k_block(x, p, &mut blk[..16]);
        let qs = &mut blk[16..16 + QK_K / 2];
        for c in 0..4 {
            for b in 0..32 {
                qs[32 * c + b] = l[64 * c + b] | (l[64 * c + b + 32] << 4);
            }
        }
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
        // calls `quantize_q4_K(rows, dst, 1, n_per_row, NULL)` on the rows `dump_for_oracle` writes.
        // The ggml-quants.c.o of the llama.cpp tools build (its libggml-base.a) gives the same bytes.
        let expected = [
            (
                "constant",
                "a71049e735fa2935906f36eee6e8f8571dd3341c0b865e85c874e6e0109c606d",
            ),
            (
                "huge_in_noise",
                "3cbe841acabd84c19d754950c14187e081773cb4e6d1df55a97729bb0c743939",
            ),
            (
                "mixed_groups",
                "7e6208080b9f26ba58c75937f99d06b9e1d79af879b0b8385711996e73215376",
            ),
            (
                "neg_constant",
                "1e332d3993149777fcc780e0421608a675d34b554b24a6ca11eca911ba7b23a7",
            ),
            (
                "normal_0.02",
                "007ad49d9ad1c6e2c86696e7d29f99b0d3f34c886e8c45bf7443e48bbdea0e70",
            ),
            (
                "normal_1",
                "604e7476a388318a42ed02b11795cd4e3b403f4b456e8c1fb518a4cc2c885ea1",
            ),
            (
                "one_huge",
                "68c9821715140ffcca8fc7c3842b1f0ef1ea09b867430d9ee4e8104827b101a5",
            ),
            (
                "outliers",
                "81a2864cfd53a1202b7c63a6c0a14261729eb080fda143a839c7ccb202283d9f",
            ),
            (
                "sparse",
                "42671fd734e3a445dd4ca8f97263617ef784939e3231d47692ac40c3775bb928",
            ),
            (
                "sweep_concat",
                "f4bc4a857f2b1c5d418ba817c97305bea8194e8ba9c046c3eafc4131c27660bf",
            ),
            (
                "tiny",
                "533fb110b698b479ffa8f1eb7a236fedb5615ee93573b29739d6db71edac5628",
            ),
            (
                "uniform_pos",
                "d738d6971be8bd2f4545f0f55e5a81e2f33ce99232e077fc220458b4d1021a40",
            ),
            (
                "zeros",
                "2d5565fb483d8ea4525a7a9229677d1038ad34b6e22c8d5152e1d7f7b9817597",
            ),
        ];
        check_golden("q4_K", quantize_row_ref, BYTES, &expected);
    }

    #[test]
    fn quantize_row_ref_round_trips() {
        // ggml's own output has a worst relative RMS error of 0.101 on these rows (bytes are identical)
        check_round_trip("q4_K", quantize_row_ref, BYTES, dequantize_block, 0.13);
    }
}
