//! IQ4_NL: 32 4-bit indices into a fixed non-linear table of 16 values, with an f16 scale;
//! value = `d * kvalues_iq4nl[q]`.
//!
//! `block_iq4_nl` (ggml-common.h, 18 bytes): `d: f16`, `qs: [u8; 16]` (element `j < 16` is the low nibble
//! of `qs[j]`, element `j + 16` the high nibble). `vec_dot_type` Q8_0. The table `kvalues_iq4nl`
//! (ggml-common.h) is shared with IQ4_XS.

use super::fp::{f32_to_f16_ref, read_f16};
use super::kquant_ref::nearest_int;
use super::q8::QK;
use super::x86::{fma_lanes, hsum_float_8, sign_trick_mul};

/// Bytes per block.
pub(crate) const BYTES: usize = 18;

/// `kvalues_iq4nl` (ggml-common.h): the 16 signed values a 4-bit IQ4_NL / IQ4_XS index stands for.
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 32 table values of one block's 16 index bytes `qs`, in element order (low nibbles first).
#[inline(always)]
pub(crate) fn values(qs: &[u8]) -> [i32; QK] {
    let mut v = [0i32; QK];
    for j in 0..QK / 2 {
        v[j] = i32::from(KVALUES[usize::from(qs[j] & 0x0F)]);
        v[j + QK / 2] = i32::from(KVALUES[usize::from(qs[j] >> 4)]);
    }
    v
}

/// One block to f32 (`dequantize_row_iq4_nl`, ggml-quants.c: `y = d * kvalues_iq4nl[q]`).
#[inline(always)]
pub(crate) fn dequantize_block(blk: &[u8], out: &mut [f32; QK]) {
    let d = read_f16(blk, 0);
    for (o, v) in out.iter_mut().zip(values(&blk[2..BYTES])) {
        *o = d * v as f32;
    }
}

/// The eight i32 lanes of one block: lane `l` = `Σ_{k<4} v[4l+k] * q8[4l+k]`, with the `_mm256_sign_epi8`
/// product ([`sign_trick_mul`]) when `SIGN_EXACT` (an activation quant may be −128), the plain one
/// otherwise (they agree unless a quant is −128).
#[inline]
fn lanes<const SIGN_EXACT: bool>(v: &[i32; QK], qy: &[i8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (l, lane) in lanes.iter_mut().enumerate() {
        for k in 4 * l..4 * l + 4 {
            *lane += if SIGN_EXACT {
                sign_trick_mul(v[k], qy[k])
            } else {
                v[k] * i32::from(qy[k])
            };
        }
    }
    lanes
}

/// `ggml_vec_dot_iq4_nl_q8_0`, x86 AVX2 branch (arch/x86/quants.c). Blocks in pairs: the even block of each
/// pair goes to accumulator `acc1`, the odd one to `acc2`, each as `acc[l] = fma(d_x*d_w, lane[l], acc[l])`
/// with the lanes of `mul_add_epi8` (sign trick) + `madd(·, 1)`; then `hsum_float_8(acc1 + acc2)`. An odd
/// last block takes the scalar tail: plain integer products, `sumf += (d_x*d_w) * sumi`, rounded twice (not
/// contracted to an fma in this build: the odd-block fixtures of `tests/quant_vs_gguf.rs` tell the two
/// apart).
pub(crate) fn dot_q8_0<const SIGN_EXACT: bool>(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let nb = xd.len().min(w.len() / BYTES);
    let mut acc = [[0f32; 8]; 2];
    let pairs = nb / 2 * 2;
    for ib in 0..pairs {
        let blk = &w[ib * BYTES..(ib + 1) * BYTES];
        let d = xd[ib] * read_f16(blk, 0);
        let l = lanes::<SIGN_EXACT>(&values(&blk[2..]), &xq[ib * QK..(ib + 1) * QK]);
        fma_lanes(d, &l, &mut acc[ib % 2]);
    }
    let sum: [f32; 8] = core::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut sumf = hsum_float_8(&sum);
    if nb > pairs {
        let ib = pairs;
        let blk = &w[ib * BYTES..(ib + 1) * BYTES];
        let d = xd[ib] * read_f16(blk, 0);
        let sumi: i32 = values(&blk[2..])
            .iter()
            .zip(&xq[ib * QK..(ib + 1) * QK])
            .map(|(&v, &y)| v * i32::from(y))
            .sum();
        sumf += d * sumi as f32;
    }
    sumf
}

/// One output of llamafile's `tinyBLAS_Q0_AVX<block_iq4_nl, block_q8_0>` (ggml-cpu/llamafile/sgemm.cpp),
/// which computes IQ4_NL matmuls with a batch ≥ 2 when the weight is not repacked: one eight-lane
/// accumulator over all blocks, `acc[l] = fma(d_w*d_x, lane[l], acc[l])` with the `updot` lanes
/// (`vpdpbusd` of `sign(a, a)` and `sign(b, a)`: the sign-trick products), then `hsum` (= `hsum_float_8`).
/// Unlike Q4_0/Q5_0/Q8_0, this is *not* the vec_dot kernel's order (which alternates two accumulators).
pub(crate) fn dot_q8_0_tinyblas<const SIGN_EXACT: bool>(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for ((blk, qy), &dy) in w.chunks_exact(BYTES).zip(xq.chunks_exact(QK)).zip(xd) {
        let d = read_f16(blk, 0) * dy;
        fma_lanes(d, &lanes::<SIGN_EXACT>(&values(&blk[2..]), qy), &mut acc);
    }
    hsum_float_8(&acc)
}

/// `best_index_int8` (ggml-quants.c): the index in the ascending table `val` of the value nearest to `x`
/// (ties and NaN go up: `x − val[mu−1] < val[mu] − x ? mu−1 : mu` after a bisection; below `val[0]` → 0,
/// above the last → `n − 1`).
#[cfg_attr(not(test), allow(dead_code))] // the reference for best_index_16 (tests)
#[inline]
pub(crate) fn best_index_int8(val: &[i8], x: f32) -> usize {
    let n = val.len();
    if x <= f32::from(val[0]) {
        return 0;
    }
    if x >= f32::from(val[n - 1]) {
        return n - 1;
    }
    let (mut ml, mut mu) = (0usize, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < f32::from(val[mav]) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - f32::from(val[mu - 1]) < f32::from(val[mu]) - x {
        mu - 1
    } else {
        mu
    }
}

/// [`best_index_int8`] for a strictly ascending table of 16 values already widened to f32 (exact), without
/// the binary search's branches: for `val[0] < x < val[15]` the search ends at the first `mu` with
/// `x < val[mu]`, i.e. `mu = 1 + #{k in 1..15 : val[k] <= x}`; then the same tie rule. Same result for
/// every `x`, NaN included (checked against [`best_index_int8`] in the tests).
#[inline]
fn best_index_16(val: &[f32; 16], x: f32) -> usize {
    if x <= val[0] {
        return 0;
    }
    if x >= val[15] || x.is_nan() {
        return 15;
    }
    let mut mu = 1usize;
    for &v in &val[1..15] {
        mu += usize::from(v <= x);
    }
    if x - val[mu - 1] < val[mu] - x {
        mu - 1
    } else {
        mu
    }
}

/// `quantize_row_iq4_nl_impl` (ggml-quants.c), shared by IQ4_NL and IQ4_XS: one super-block of
/// `super_block_size` elements `x` (a multiple of 32, at most 256) in sub-blocks of `block_size`, each
/// value an index into the 16-entry `values` table (`KVALUES` for both types).
///
/// Outputs: `dh` the f16 bits of the super-block scale; `q4` (`super_block_size/2` bytes) the indices,
/// packed per 32 as IQ4_NL's `qs` (element `j < 16` low nibble of byte `j`, `j + 16` high nibble); and when
/// there is more than one sub-block, the 6-bit sub-block scales `l + 32`, low nibbles in `scales_l`
/// (`nb/2` bytes) and high 2 bits in `scales_h` (`(nb+7)/8` u16s, cleared first). With a single sub-block
/// (IQ4_NL: `(32, 32)`) `dh` is the sub-block scale itself and `scales_h`/`scales_l` are not touched (pass
/// empty slices).
///
/// Weights: `quant_weights` (the importance matrix for these elements) times `sqrt(σ² + x²)` with
/// `σ² = 2Σx²/super_block_size`, or `x²` without one. Each sub-block: `d = ∓max/values[0]` (minus when
/// `ntry > 0`), indices by [`best_index_int8`], the weighted least-squares scale, then a search over
/// `id = (itry + values[0])/max` for `itry = −ntry..=ntry`. `quantize_iq4_xs` and `quantize_iq4_nl` pass
/// `ntry = 7`, `quantize_row_iq4_nl_ref` −1. Plain f32 arithmetic in C's order: libggml-base is compiled
/// without FMA (see `kquant_ref`).
///
/// One deviation, unreachable from `llama-quantize`: with a single sub-block, `ntry ≤ 0` and an all-zero
/// (`amax < GROUP_MAX_EPS`) input, C packs whatever its caller's `L` scratch held (the previous block's
/// indices, or uninitialized stack); this writes index 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize_row_iq4_nl_impl(
    super_block_size: usize,
    block_size: usize,
    x: &[f32],
    dh: &mut u16,
    q4: &mut [u8],
    scales_h: &mut [u16],
    scales_l: &mut [u8],
    values: &[i8; 16],
    quant_weights: Option<&[f32]>,
    ntry: i32,
) {
    const MAX_SB: usize = 256;
    let x = &x[..super_block_size];
    let nb = super_block_size / block_size;
    let mut l_all = [0u8; MAX_SB];
    let mut scales = [0f32; MAX_SB];
    let mut weight = [0f32; MAX_SB];
    let l_all = &mut l_all[..super_block_size];
    let v0 = f32::from(values[0]);
    let vf: [f32; 16] = values.map(f32::from);
    debug_assert!(vf.windows(2).all(|w| w[0] < w[1]), "values must ascend");

    let mut sigma2 = 0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / super_block_size as f32;

    q4[..super_block_size / 2].fill(0);
    *dh = f32_to_f16_ref(0.0);

    let mut max_scale = 0f32;
    let mut amax_scale = 0f32;
    for ib in 0..nb {
        let xb = &x[ib * block_size..(ib + 1) * block_size];
        let lb = &mut l_all[ib * block_size..(ib + 1) * block_size];
        let weight = &mut weight[..block_size];
        match quant_weights {
            Some(qw) => {
                let qw = &qw[ib * block_size..(ib + 1) * block_size];
                for ((w, &q), &v) in weight.iter_mut().zip(qw).zip(xb) {
                    *w = q * (sigma2 + v * v).sqrt();
                }
            }
            None => {
                for (w, &v) in weight.iter_mut().zip(xb) {
                    *w = v * v;
                }
            }
        }
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < super::kquant_ref::GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let mut sumqx = 0f32;
        let mut sumq2 = 0f32;
        for ((o, &v), &w) in lb.iter_mut().zip(xb).zip(weight.iter()) {
            let al = id * v;
            let l = best_index_16(&vf, al);
            *o = l as u8;
            let q = f32::from(values[l]);
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + i32::from(values[0])) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for (&v, &w) in xb.iter().zip(weight.iter()) {
                let al = id * v;
                let q = f32::from(values[best_index_16(&vf, al)]);
                sumqx += w * q * v;
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }

    if nb > 1 {
        scales_h[..nb.div_ceil(8)].fill(0);
        let d = -max_scale / 32.0;
        *dh = f32_to_f16_ref(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nb {
            let l = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &x[ib * block_size..(ib + 1) * block_size];
            let lb = &mut l_all[ib * block_size..(ib + 1) * block_size];
            for (o, &v) in lb.iter_mut().zip(xb) {
                *o = best_index_16(&vf, idl * v) as u8;
            }
            let l = (l + 32) as u8;
            let (l_l, l_h) = (l & 0xF, l >> 4);
            if ib % 2 == 0 {
                scales_l[ib / 2] = l_l;
            } else {
                scales_l[ib / 2] |= l_l << 4;
            }
            scales_h[ib / 8] |= u16::from(l_h) << (2 * (ib % 8));
        }
    } else {
        *dh = f32_to_f16_ref(scales[0]);
        if ntry > 0 {
            let id = if scales[0] != 0.0 {
                1.0 / scales[0]
            } else {
                0.0
            };
            for (o, &v) in l_all.iter_mut().zip(x) {
                *o = best_index_16(&vf, id * v) as u8;
            }
        }
    }

    for i in 0..super_block_size / 32 {
        for j in 0..16 {
            q4[16 * i + j] = l_all[32 * i + j] | (l_all[32 * i + 16 + j] << 4);
        }
    }
}

/// `quantize_iq4_nl` (ggml-quants.c) without an importance matrix, the function `ggml_quantize_chunk`
/// runs for IQ4_NL: every 32-block through [`quantize_row_iq4_nl_impl`] with super-block = block = 32,
/// `kvalues_iq4nl` and `ntry = 7`, written as `d: f16`, `qs: [u8; 16]`.
///
/// `src.len()` is a multiple of 32 and `dst` holds `src.len() / 32` blocks of [`BYTES`] (caller's
/// contract; extra input or output is left alone).
pub(crate) fn quantize_row_ref(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BYTES)) {
        let mut dh = 0u16;
        let (d, qs) = blk.split_at_mut(2);
        quantize_row_iq4_nl_impl(QK, QK, x, &mut dh, qs, &mut [], &mut [], &KVALUES, None, 7);
        d.copy_from_slice(&dh.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branchless_best_index_is_the_binary_search() {
        let vf: [f32; 16] = KVALUES.map(f32::from);
        let mut xs = vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
        ];
        for w in KVALUES.windows(2) {
            let (a, b) = (f32::from(w[0]), f32::from(w[1]));
            let mid = (a + b) / 2.0;
            for x in [
                a,
                b,
                mid,
                mid.next_up(),
                mid.next_down(),
                a.next_up(),
                b.next_down(),
            ] {
                xs.push(x);
            }
        }
        let mut s = 7u32;
        for _ in 0..20000 {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            xs.push((s >> 8) as f32 / 16_777_216.0 * 300.0 - 150.0);
        }
        for x in xs {
            assert_eq!(best_index_16(&vf, x), best_index_int8(&KVALUES, x), "{x}");
        }
    }

    #[test]
    fn dequantizes_a_hand_made_block() {
        let mut blk = [0u8; BYTES];
        blk[0..2].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
        for j in 0..16 {
            blk[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0f32; QK];
        dequantize_block(&blk, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], 0.25 * f32::from(KVALUES[j]));
            assert_eq!(out[j + 16], 0.25 * f32::from(KVALUES[15 - j]));
        }
    }

    #[test]
    fn vec_dot_and_tinyblas_orders_differ_only_in_rounding() {
        // same blocks, same exact value; the two accumulation orders may round differently, both stay
        // within a few ulps of the magnitude
        let nb = 7;
        let mut w = vec![0u8; nb * BYTES];
        let mut s = 0x1234_5678u32;
        for (i, b) in w.iter_mut().enumerate() {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            *b = (s >> 24) as u8;
            if i % BYTES == 1 {
                *b &= 0x3B; // a modest positive f16 scale
            }
        }
        let xq: Vec<i8> = (0..nb * QK)
            .map(|i| (((i * 37) % 255) as i32 - 127) as i8)
            .collect();
        let xd: Vec<f32> = (0..nb).map(|i| 0.01 + i as f32 * 1e-3).collect();
        let a = dot_q8_0::<false>(&w, &xq, &xd);
        let b = dot_q8_0_tinyblas::<false>(&w, &xq, &xd);
        let mut exact = 0f64;
        let mut mag = 0f64;
        for ib in 0..nb {
            let blk = &w[ib * BYTES..(ib + 1) * BYTES];
            let d = f64::from(xd[ib] * read_f16(blk, 0));
            for (v, &y) in values(&blk[2..]).iter().zip(&xq[ib * QK..]) {
                exact += d * f64::from(*v) * f64::from(y);
                mag += (d * f64::from(*v) * f64::from(y)).abs();
            }
        }
        for r in [a, b] {
            assert!((f64::from(r) - exact).abs() <= mag * 1e-6, "{r} vs {exact}");
        }
        assert_eq!(
            dot_q8_0::<true>(&w, &xq, &xd).to_bits(),
            a.to_bits(),
            "no -128 quant: the sign trick changes nothing"
        );
    }
}

#[cfg(test)]
mod quantize_tests {
    use super::super::kquant_ref::test_rows::{quantize, rows, sha256_hex};
    use super::*;

    /// `quantize_iq4_nl(src, dst, 1, n, NULL)` (ggml-quants.c): [`quantize_row_iq4_nl_impl`] per block of
    /// 32 with `ntry = 7` — what `llama-quantize` runs for IQ4_NL without an importance matrix.
    fn quantize_iq4_nl(src: &[f32], dst: &mut [u8]) {
        for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BYTES)) {
            let mut dh = 0u16;
            quantize_row_iq4_nl_impl(
                QK,
                QK,
                x,
                &mut dh,
                &mut blk[2..],
                &mut [],
                &mut [],
                &KVALUES,
                None,
                7,
            );
            blk[0..2].copy_from_slice(&dh.to_le_bytes());
        }
    }

    #[test]
    fn impl_with_one_block_matches_ggml_quantize_iq4_nl() {
        // sha256 of the bytes ggml produces for `test_rows::rows()`: the C oracle (dev-only, outside the
        // repo) is ggml-quants.c of the pinned llama.cpp 0c1e570 compiled as libggml-base compiles it,
        // `gcc-12 -O3 -DNDEBUG -std=gnu11 -fPIC -D_GNU_SOURCE -D_XOPEN_SOURCE=600 -DGGML_SCHED_MAX_COPIES=4
        // -Iggml/include -Iggml/src -Iggml/src/ggml-cpu -c ggml-quants.c`, linked with a small driver that
        // calls `quantize_iq4_nl(rows, dst, 1, n_per_row, NULL)` on the rows `dump_for_oracle` writes.
        // The ggml-quants.c.o of the llama.cpp tools build (its libggml-base.a) gives the same bytes.
        let expected = [
            (
                "constant",
                "799ae52a6d3559b087143efb745d3f490b2883fca0fa35188e8b36b833103b2f",
            ),
            (
                "huge_in_noise",
                "b498763a0c932ec688cff9c5b7c41eb3aa5ff073d2fde596e0c20d5c1eb7c8a2",
            ),
            (
                "mixed_groups",
                "83727c5a07a2cd23427dafcc4c67054cea6d52f263b2dbc405d525ea8addb084",
            ),
            (
                "neg_constant",
                "a9d2696638853548b9979e8f9120283f938cd97db5804846712034700b4398cd",
            ),
            (
                "normal_0.02",
                "00f015282aa65f54222ae72578ac47282d8f923b038a188ead2631e9ce73d967",
            ),
            (
                "normal_1",
                "94e3d59b4cdbb61a2e24c4bda074e82fec88c2a5318231c602b30c8f4d4f5285",
            ),
            (
                "one_huge",
                "4cd33013508b989e3e5a11d84f4a0300fef5d9aeba0caef2f64a6a714d92549e",
            ),
            (
                "outliers",
                "d28a46176bf63b15a7cc9390fba549af3eed1a254b0b1c1e12ea4a8f56b2d5ee",
            ),
            (
                "sparse",
                "e52cb482e4287f0ce6acd56108946c56287c825abb013c4642cd0dde5d2c8810",
            ),
            (
                "sweep_concat",
                "157ece91ade9ae2cf0ee67b4a74ca54d75ce3e89f448e5850d8466992d2a2170",
            ),
            (
                "tiny",
                "3dd82e9347a9546a499d111be24d10d38fafd74c5a953159725c611f754e3a9b",
            ),
            (
                "uniform_pos",
                "45a14c3fe35520aa8e0dbd0ea42dcfba6fa62a6957c44e5bd398f808a6d23f76",
            ),
            (
                "zeros",
                "cdafff315225e976e4a62792f060b3ebc36e8ce510b677aaf2e50f1df59697e6",
            ),
        ];
        for (name, v) in rows() {
            let want = expected.iter().find(|(n, _)| *n == name).unwrap().1;
            let got = sha256_hex(&quantize(quantize_iq4_nl, BYTES * 8, &v));
            assert_eq!(got, want, "IQ4_NL {name}");
        }
    }

    #[test]
    fn impl_with_one_block_round_trips() {
        let v = &rows()[0].1;
        let q = quantize(quantize_iq4_nl, BYTES * 8, v);
        let (mut err, mut norm) = (0f64, 0f64);
        for (blk, x) in q.chunks_exact(BYTES).zip(v.chunks_exact(QK)) {
            let mut y = [0f32; QK];
            dequantize_block(blk, &mut y);
            for (&a, &b) in y.iter().zip(x) {
                err += (f64::from(a) - f64::from(b)).powi(2);
                norm += f64::from(b).powi(2);
            }
        }
        let e = (err / norm).sqrt();
        assert!(e < 0.15, "IQ4_NL relative RMS error {e}");
    }

    #[test]
    fn best_index_int8_picks_the_nearest_value() {
        for i in -1400..1400 {
            let x = i as f32 * 0.1;
            let got = best_index_int8(&KVALUES, x);
            let best = KVALUES
                .iter()
                .map(|&v| (f32::from(v) - x).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((f32::from(KVALUES[got]) - x).abs(), best, "x = {x}");
        }
        assert_eq!(best_index_int8(&KVALUES, f32::NAN), 15);
    }
}
