//! Q3_K: super-blocks of 256 = 16 sub-blocks of 16 3-bit quants with 6-bit scales;
//! value = `d * (sc - 32) * (q - 4)`.
//!
//! `block_q3_K` (ggml-common.h, 110 bytes): `hmask: [u8; 32]` (high bits), `qs: [u8; 64]` (low 2 bits),
//! `scales: [u8; 12]` (16 6-bit scales, packed as `dequantize_row_q3_K` unpacks them), `d: f16`. Element
//! `128h + 32k + b` takes its low bits from bits `2k..2k+2` of `qs[32h + b]` and its high bit from bit
//! `4h + k` of `hmask[b]`; a *clear* high bit subtracts 4. `vec_dot_type` Q8_K.

use super::fp::{f16_to_f32, f32_to_f16_ref, read_f16};
use super::kquant_ref::{make_q3_quants, nearest_int, pack_2bit};
use super::q8_k::QK_K;
use super::x86::{fma, fma_lanes, hsum_float_8, scaled_lanes_16};

/// Bytes per block.
pub(crate) const BYTES: usize = 110;
/// Byte offset of `d`.
const D_AT: usize = 108;

/// The 16 sub-block scales minus 32 (`-32..32`), unpacked as `dequantize_row_q3_K` / the AVX2 kernel do
/// (`kmask1 = 0x03030303`, `kmask2 = 0x0f0f0f0f` over three little-endian u32).
#[inline]
pub(super) fn scales(blk: &[u8]) -> [i32; 16] {
    let s = &blk[96..108];
    let aux = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, tmp) = (aux(0), aux(1), aux(2));
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let words = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    core::array::from_fn(|i| i32::from(words[i / 4].to_le_bytes()[i % 4] as i8) - 32)
}

/// The 256 signed 3-bit values `q - 4` (`-4..4`) of one block, in element order.
#[inline(always)]
fn values(blk: &[u8]) -> [i8; QK_K] {
    let (hm, qs) = (&blk[0..32], &blk[32..96]);
    let mut v = [0i8; QK_K];
    for (i, v) in v.iter_mut().enumerate() {
        let (h, k, b) = (i / 128, (i % 128) / 32, i % 32);
        let low = ((qs[32 * h + b] >> (2 * k)) & 3) as i8;
        let high = (hm[b] >> (4 * h + k)) & 1;
        *v = low - if high != 0 { 0 } else { 4 };
    }
    v
}

/// One block to f32 (`dequantize_row_q3_K`, ggml-quants.c: `dl = d * (sc - 32)`, `y = dl * (q - 4)`).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK_K]) {
    let d = read_f16(blk, D_AT);
    let sc = scales(blk);
    for (i, (o, &v)) in out.iter_mut().zip(values(blk).iter()).enumerate() {
        let dl = d * sc[i / 16] as f32;
        *o = dl * f32::from(v);
    }
}

/// `ggml_vec_dot_q3_K_q8_K`, x86 AVX2 branch (arch/x86/quants.c). Per super-block: `d = d8 * d_w`; eight
/// i32 lanes `lane[l] = Σ_{h<2, k<4} (sc[8h + 2k + l/4] − 32) · Σ_{e<4} v[128h+32k+4l+e] · q8[...]` with
/// the signed values `v = q − 4` (the kernel's `maddubs(low, q8) − maddubs(4·!high, q8)` then `madd` with
/// the scales: exact); `acc[l] = fma(d, lane[l], acc[l])`. Result `hsum_float_8(acc)`.
pub(crate) fn dot_q8_k(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK_K)).zip(xd) {
        let d = dy * read_f16(blk, D_AT);
        let sc = scales(blk);
        let lanes = scaled_lanes_16(&values(blk), qy, |g| sc[g]);
        fma_lanes(d, &lanes, &mut acc);
    }
    hsum_float_8(&acc)
}

/// One output of llama.cpp's tiled K-quant matmul for Q3_K (ggml-cpu/tiled,
/// `tiled_run_microtile<16, false, 4>`: unsigned codes `q` with the bias 4 taken out through the Q8_K
/// sums; the AVX2 and the AVX-512 VNNI kernels compute the same), batches ≥ 8: per super-block the exact
/// integer `s1 = Σ_s (sc[s] − 32) · Σ (q − 4)·q8`, then `res = d_w·s1`, `acc = fma(res, d_x, acc)`.
pub(crate) fn dot_q8_k_tiled(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = 0f32;
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK_K)).zip(xd) {
        let sc = scales(blk);
        let v = values(blk);
        let mut s1 = 0i32;
        for (s, &sc) in sc.iter().enumerate() {
            let dot: i32 = (16 * s..16 * s + 16)
                .map(|e| i32::from(v[e]) * i32::from(qy[e]))
                .sum();
            s1 = s1.wrapping_add(sc * dot);
        }
        acc = fma(read_f16(blk, D_AT) * s1 as f32, dy, acc);
    }
    acc
}

/// `quantize_row_q3_K_ref` (ggml-quants.c; what `quantize_q3_K` runs without an importance matrix).
/// `src`: `n·256` f32; `dst`: `n·110` bytes (`block_q3_K`).
///
/// Per super-block: [`make_q3_quants`]`(16, nmax 4, rmse)` per sub-block of 16 → signed scales `s_j`; the
/// one of largest |s| (first wins) sets `iscale = −32/max_scale`, 6-bit scales
/// `clamp((i8)nearest_int(iscale·s_j), −32, 31) + 32` (low nibbles in `scales[0..8]`, high 2 bits in
/// `scales[8..12]`), `d = f16(1/iscale)`; then each quant is redone as `clamp(nearest_int(x/d), −4, 3)` with
/// `d = d_f16·(sc − 32)` (sub-blocks with `d == 0` keep their `make_q3_quants` quants). Plain f32
/// arithmetic: libggml-base is compiled without FMA (see `kquant_ref`).
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let mut max_scale = 0f32;
        let mut amax = 0f32;
        for j in 0..16 {
            scales[j] = make_q3_quants(
                4,
                &x[16 * j..16 * j + 16],
                &mut l[16 * j..16 * j + 16],
                true,
            );
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let mut sc = [0u8; 12];
        let d_bits;
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                let q = nearest_int(iscale * s) as i8; // C: `int8_t l = nearest_int(...)`
                let q = (i32::from(q).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    sc[j] = q & 0xF;
                } else {
                    sc[j - 8] |= (q & 0xF) << 4;
                }
                sc[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            d_bits = f32_to_f16_ref(1.0 / iscale);
        } else {
            d_bits = f32_to_f16_ref(0.0);
        }
        let d16 = f16_to_f32(d_bits);
        for j in 0..16 {
            let lo = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
            let s = (lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32;
            let d = d16 * f32::from(s);
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        let (hmask, rest) = blk.split_at_mut(32);
        hmask.fill(0);
        let mut lu = [0u8; QK_K];
        for (j, (u, &v)) in lu.iter_mut().zip(&l).enumerate() {
            let mut v = v as u8;
            if v > 3 {
                hmask[j % 32] |= 1 << (j / 32);
                v -= 4;
            }
            *u = v;
        }
        pack_2bit(&lu, &mut rest[..64]);
        rest[64..76].copy_from_slice(&sc);
        rest[76..78].copy_from_slice(&d_bits.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantizes_a_hand_made_block() {
        // d = 0.25; scale of sub-block s is s + 25 (6 bits: low nibble in bytes 0..8, high 2 bits in
        // bytes 8..12); element i has value (i % 8) - 4
        let mut blk = [0u8; BYTES];
        let sc: Vec<u8> = (0..16).map(|s| s as u8 + 25).collect();
        for s in 0..16 {
            let (byte, shift) = if s < 8 { (s, 0) } else { (s - 8, 4) };
            blk[96 + byte] |= (sc[s] & 0xF) << shift;
            blk[96 + 8 + s % 4] |= (sc[s] >> 4) << (2 * (s / 4));
        }
        for i in 0..QK_K {
            let (h, k, b) = (i / 128, (i % 128) / 32, i % 32);
            let q = (i % 8) as u8;
            blk[32 + 32 * h + b] |= (q & 3) << (2 * k);
            blk[b] |= (q >> 2) << (4 * h + k);
        }
        blk[108..110].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
        let mut out = [0f32; QK_K];
        dequantize_block(&blk, &mut out);
        for (i, &v) in out.iter().enumerate() {
            let want = 0.25 * (i32::from(sc[i / 16]) - 32) as f32 * ((i % 8) as f32 - 4.0);
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
        // calls `quantize_q3_K(rows, dst, 1, n_per_row, NULL)` on the rows `dump_for_oracle` writes.
        // The ggml-quants.c.o of the llama.cpp tools build (its libggml-base.a) gives the same bytes.
        let expected = [
            (
                "constant",
                "65e5c9fd863ac8ee894c84ae764e78ee2d2038fa5aa3a86af3c6cf673e73a03b",
            ),
            (
                "huge_in_noise",
                "6a250314a5769c8a143d7d9f2dfb83dc4bcd61908979f77c484df213dc8579b0",
            ),
            (
                "mixed_groups",
                "77373517c5e1f61d77977752bd5a3f4ad145beb6b0dea24dca68533cda568de0",
            ),
            (
                "neg_constant",
                "231a05c93bcfe097c612b1da83864cdae24d26bcf9a33c7e744bd1b818ed9c2d",
            ),
            (
                "normal_0.02",
                "5f3891abf087bead23b6357b437f5adf4a25bf46d9a28c3c9e82afc97a79ea60",
            ),
            (
                "normal_1",
                "3f2c62d0f9c56e7e84ec0c53a1af0a019aa54eb2e24f0c633fdd56244f266b9a",
            ),
            (
                "one_huge",
                "bbd3a661c1a82f2187ec46b5330ccd57e1b4258ab800e92b4dbcaa08f6490e38",
            ),
            (
                "outliers",
                "852922cb649a426c22f2747b3e6597dbcad70f4b4e250e4f70becb358349403f",
            ),
            (
                "sparse",
                "8fa645954519f2c8329e28e5b94d739f21747726d8f538b83dfc91a2a7c5fee7",
            ),
            (
                "sweep_concat",
                "24bcea7283aebe2343534452db67d8282ab49da3d28ce823a6885f804f4ec934",
            ),
            (
                "tiny",
                "d37fdd33354ee4f933cd8c5309f0c1d53674c01a35f0b375ecf6b79ad1c21fc2",
            ),
            (
                "uniform_pos",
                "bf56f5225c91ccf748e09d3e32be1b0e7a441011094d8488bc4f7d9cc7577d11",
            ),
            (
                "zeros",
                "ac9ab7fef49ac432f1e4b9b43d3df89ca06dd53c244676fa5d47a8725dcc5eb9",
            ),
        ];
        check_golden("q3_K", quantize_row_ref, BYTES, &expected);
    }

    #[test]
    fn quantize_row_ref_round_trips() {
        // ggml's own output has a worst relative RMS error of 0.154 on these rows (bytes are identical)
        check_round_trip("q3_K", quantize_row_ref, BYTES, dequantize_block, 0.20);
    }
}
