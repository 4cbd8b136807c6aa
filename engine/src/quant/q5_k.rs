//! Q5_K: super-blocks of 256 = 8 sub-blocks of 32 5-bit quants, each with a 6-bit scale and a 6-bit min;
//! value = `d * sc * q - dmin * m`.
//!
//! `block_q5_K` (ggml-common.h, 176 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (packed as Q4_K's,
//! `get_scale_min_k4`), `qh: [u8; 32]` (fifth bits), `qs: [u8; 128]` (low 4 bits). Chunk `j` of 64
//! elements uses `qs[32j..32j+32]`: element `64j + b` is the low nibble of `qs[32j + b]` plus bit `2j` of
//! `qh[b]` (as 16), element `64j + 32 + b` the high nibble plus bit `2j + 1`. `vec_dot_type` Q8_K.

use super::fp::read_f16;
use super::kquant_ref::{q45_k_block, Qkx2};
use super::q4_k::scales_mins;
use super::q8_k::QK_K;
use super::x86::{fma, fma_lanes, hsum_float_8};

/// Bytes per block.
pub(crate) const BYTES: usize = 176;

/// The 256 unsigned 5-bit quants (0..32) of one block, in element order.
#[inline]
fn quants(blk: &[u8]) -> [u8; QK_K] {
    let (qh, qs) = (&blk[16..48], &blk[48..176]);
    let mut q = [0u8; QK_K];
    for j in 0..4 {
        for b in 0..32 {
            let byte = qs[32 * j + b];
            q[64 * j + b] = (byte & 0xF) | (((qh[b] >> (2 * j)) & 1) << 4);
            q[64 * j + 32 + b] = (byte >> 4) | (((qh[b] >> (2 * j + 1)) & 1) << 4);
        }
    }
    q
}

/// One block to f32 (`dequantize_row_q5_K`, ggml-quants.c: `d1 = d * sc`, `m1 = dmin * m`,
/// `y = d1 * q - m1`).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK_K]) {
    let d = read_f16(blk, 0);
    let min = read_f16(blk, 2);
    let (sc, m) = scales_mins(&blk[4..16]);
    for (g, (y, q)) in out
        .chunks_exact_mut(32)
        .zip(quants(blk).chunks_exact(32))
        .enumerate()
    {
        let d1 = d * f32::from(sc[g]);
        let m1 = min * f32::from(m[g]);
        for (y, &q) in y.iter_mut().zip(q) {
            *y = d1 * f32::from(q) - m1;
        }
    }
}

/// `ggml_vec_dot_q5_K_q8_K`, x86 AVX2 branch (arch/x86/quants.c). Per super-block: `d = d8 * d_w`,
/// `dmin = -d8 * dmin_w`; the mins term as one integer, `Σ_g m[g] · (bsums[2g] + bsums[2g+1])` (`hadd` of
/// the i16 sums, wrapping as `_mm_hadd_epi16` does, `madd` with the mins, `hadd`s), fused into a scalar
/// `summs = fma(dmin, ., summs)` (gcc contracts `summs += dmin * x`); eight i32 lanes
/// `lane[l] = Σ_j sc[2j] · Σ_{e<4} q5[64j+4l+e]·q8[..] + sc[2j+1] · Σ_{e<4} q5[64j+32+4l+e]·q8[..]`,
/// `acc[l] = fma(d, lane[l], acc[l])`. Result `hsum_float_8(acc) + summs`.
pub(crate) fn dot_q8_k(w: &[u8], xq: &[i8], xd: &[f32], xbsums: &[i16]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (((blk, qy), &dy), bsums) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK_K))
        .zip(xd)
        .zip(xbsums.chunks_exact(QK_K / 16))
    {
        let d = dy * read_f16(blk, 0);
        let dmin = -dy * read_f16(blk, 2);
        let (sc, m) = scales_mins(&blk[4..16]);
        let mut msum = 0i32;
        for g in 0..8 {
            let q8s = i32::from(bsums[2 * g].wrapping_add(bsums[2 * g + 1]));
            msum = msum.wrapping_add(i32::from(m[g]) * q8s);
        }
        summs = fma(dmin, msum as f32, summs);
        let q = quants(blk);
        let mut lanes = [0i32; 8];
        for j in 0..4 {
            let (s0, s1) = (i32::from(sc[2 * j]), i32::from(sc[2 * j + 1]));
            for (l, lane) in lanes.iter_mut().enumerate() {
                let (mut p0, mut p1) = (0i32, 0i32);
                for e in 4 * l..4 * l + 4 {
                    p0 += i32::from(q[64 * j + e]) * i32::from(qy[64 * j + e]);
                    p1 += i32::from(q[64 * j + 32 + e]) * i32::from(qy[64 * j + 32 + e]);
                }
                *lane = lane.wrapping_add(s0 * p0 + s1 * p1);
            }
        }
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc) + summs
}

/// One output of llama.cpp's tiled K-quant matmul for Q5_K (ggml-cpu/tiled,
/// `tiled_run_microtile<32, true, 0>`, shared with Q4_K; the AVX2 and the AVX-512 VNNI kernels compute
/// the same), batches ≥ 8: per super-block the exact integers `s1 = Σ_g sc[g] · Σ q5·q8` and
/// `s2 = Σ_g m[g] · (bsums[2g] + bsums[2g+1])`, then `res = d_w·s1`, `res = fma(−dmin_w, s2, res)`,
/// `acc = fma(res, d_x, acc)`.
pub(crate) fn dot_q8_k_tiled(w: &[u8], xq: &[i8], xd: &[f32], xbsums: &[i16]) -> f32 {
    let mut acc = 0f32;
    for (((blk, qy), &dy), bsums) in w
        .chunks_exact(BYTES)
        .zip(xq.chunks_exact(QK_K))
        .zip(xd)
        .zip(xbsums.chunks_exact(QK_K / 16))
    {
        let (sc, m) = scales_mins(&blk[4..16]);
        let q = quants(blk);
        let (mut s1, mut s2) = (0i32, 0i32);
        for g in 0..8 {
            let dot: i32 = (32 * g..32 * g + 32)
                .map(|e| i32::from(q[e]) * i32::from(qy[e]))
                .sum();
            s1 = s1.wrapping_add(i32::from(sc[g]) * dot);
            let bs = i32::from(bsums[2 * g]) + i32::from(bsums[2 * g + 1]);
            s2 = s2.wrapping_add(i32::from(m[g]) * bs);
        }
        let res = fma(-read_f16(blk, 2), s2 as f32, read_f16(blk, 0) * s1 as f32);
        acc = fma(res, dy, acc);
    }
    acc
}

/// `quantize_row_q5_K_ref` (ggml-quants.c; what `quantize_q5_K` runs without an importance matrix).
/// `src`: `n·256` f32; `dst`: `n·176` bytes (`block_q5_K`).
///
/// Per super-block ([`q45_k_block`]): weights `sqrt(Σx²/32) + |x|` per sub-block of 32,
/// [`make_qkx2_quants`](super::kquant_ref::make_qkx2_quants)`(nmax 31, rmin −0.5, rdelta 0.1, nstep 15, squared error)`, 6-bit scales and mins against `d = f16(max_s/63)`,
/// `dmin = f16(max_m/63)`, then every quant redone from the stored values as
/// `clamp(nearest_int((x + dmin·m)/(d·sc)), 0, 31)`. Plain f32 arithmetic: libggml-base is compiled
/// without FMA (see `kquant_ref`).
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    let p = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    for (x, blk) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BYTES)) {
        let l = q45_k_block(x, p, &mut blk[..16]);
        let (qh, qs) = blk[16..].split_at_mut(32);
        qh.fill(0);
        for c in 0..4 {
            for b in 0..32 {
                let (mut l1, mut l2) = (l[64 * c + b], l[64 * c + b + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    qh[b] |= 1 << (2 * c);
                }
                if l2 > 15 {
                    l2 -= 16;
                    qh[b] |= 2 << (2 * c);
                }
                qs[32 * c + b] = l1 | (l2 << 4);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantizes_a_hand_made_block() {
        // d = 0.5, dmin = 0.25; scales 1..8 and mins 8..1 in Q4_K's packing (all < 16: low 6 bits of
        // bytes 0..8, nibbles of bytes 8..12); element i has quant i % 32
        let mut blk = [0u8; BYTES];
        blk[0..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        blk[2..4].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
        let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8).map(|g| (g + 1, 8 - g)).unzip();
        for g in 0..4 {
            blk[4 + g] = sc[g];
            blk[8 + g] = mn[g];
            blk[12 + g] = sc[g + 4] | (mn[g + 4] << 4);
        }
        for i in 0..QK_K {
            let (j, hi, b) = (i / 64, (i % 64) / 32, i % 32);
            let q = (i % 32) as u8;
            blk[48 + 32 * j + b] |= (q & 0xF) << (4 * hi);
            blk[16 + b] |= (q >> 4) << (2 * j + hi);
        }
        let mut out = [0f32; QK_K];
        dequantize_block(&blk, &mut out);
        for (i, &v) in out.iter().enumerate() {
            let g = i / 32;
            let want = 0.5 * f32::from(sc[g]) * (i % 32) as f32 - 0.25 * f32::from(mn[g]);
            assert_eq!(v, want, "element {i}");
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
        // calls `quantize_q5_K(rows, dst, 1, n_per_row, NULL)` on the rows `dump_for_oracle` writes.
        // The ggml-quants.c.o of the llama.cpp tools build (its libggml-base.a) gives the same bytes.
        let expected = [
            (
                "constant",
                "bf1b7f18acccf871eac91d2eb01ba1b3cdfb7c55dc535e2409eba43a243b693a",
            ),
            (
                "huge_in_noise",
                "c05a604b16c95b40c07c3477658fa6cbbbf54e5d7571cf34630402b338a91809",
            ),
            (
                "mixed_groups",
                "f4ca3c5d969c4db4b14fb71a3a080a9e817a05084dbdd70f270a1f663a58197d",
            ),
            (
                "neg_constant",
                "aae5c07095b01e455377739f665e52d3341d72df8b2a1a130ddd2b658967a645",
            ),
            (
                "normal_0.02",
                "e0cb54fea0af6164ef586c40dc0940e9665d8c1967059edd3d87ed5cf5b802ba",
            ),
            (
                "normal_1",
                "472e0d5fcae30f12e47f4fe5e8ae3cde5a561f46cca3fe71db6dbfa1736ff645",
            ),
            (
                "one_huge",
                "df910ae54465c5d45090ca0ddd9a9fd8daf2f7963bdb73eace29c9173e79bc40",
            ),
            (
                "outliers",
                "e196808754cb60d9b21bb3c7ccfc94fe83e2240313b6a4a003f2addab2a346c0",
            ),
            (
                "sparse",
                "7ff28123511bc4a1b9033ecdc8ab02e3c1a11d088f56327daf77addac509433c",
            ),
            (
                "sweep_concat",
                "96d99b0483067c40b083e61e307bd85e6146132d54a1a619cbc65a85f51b2df7",
            ),
            (
                "tiny",
                "59dff5a72f98396312337eab63de64290887b893b8123d2768986574104bb425",
            ),
            (
                "uniform_pos",
                "f6e91d173a0fcd6bda8ded917b679478245345e62399c7bb8e0f9ebedf235b53",
            ),
            (
                "zeros",
                "627f6149015f853f26db2f3dffba1b7c30b3b74b87c5cfb9f346c1616e3636d0",
            ),
        ];
        check_golden("q5_K", quantize_row_ref, BYTES, &expected);
    }

    #[test]
    fn quantize_row_ref_round_trips() {
        // ggml's own output has a worst relative RMS error of 0.051 on these rows (bytes are identical)
        check_round_trip("q5_K", quantize_row_ref, BYTES, dequantize_block, 0.07);
    }
}
