//! IQ4_NL: 32 4-bit indices into a fixed non-linear table of 16 values, with an f16 scale;
//! value = `d * kvalues_iq4nl[q]`.
//!
//! `block_iq4_nl` (ggml-common.h, 18 bytes): `d: f16`, `qs: [u8; 16]` (element `j < 16` is the low nibble
//! of `qs[j]`, element `j + 16` the high nibble). `vec_dot_type` Q8_0. The table `kvalues_iq4nl`
//! (ggml-common.h) is shared with IQ4_XS.

use super::fp::{f32_to_f16_ref, read_f16};
use super::q8::QK;
use super::x86::{fma_lanes, hsum_float_8, sign_trick_mul};

/// Bytes per block.
pub(crate) const BYTES: usize = 18;

/// `kvalues_iq4nl` (ggml-common.h): the 16 signed values a 4-bit IQ4_NL / IQ4_XS index stands for.
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 32 table values of one block's 16 index bytes `qs`, in element order (low nibbles first).
#[inline]
pub(crate) fn values(qs: &[u8]) -> [i32; QK] {
    let mut v = [0i32; QK];
    for j in 0..QK / 2 {
        v[j] = i32::from(KVALUES[usize::from(qs[j] & 0x0F)]);
        v[j + QK / 2] = i32::from(KVALUES[usize::from(qs[j] >> 4)]);
    }
    v
}

/// One block to f32 (`dequantize_row_iq4_nl`, ggml-quants.c: `y = d * kvalues_iq4nl[q]`).
#[inline]
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

/// `GROUP_MAX_EPS` (ggml-quants.c): a block whose largest |x| is below this gets scale 0.
const GROUP_MAX_EPS: f32 = 1e-15;

/// `best_index_int8` (ggml-quants.c): the index of the entry of the ascending table `val` nearest to `x`
/// (a tie goes to the upper entry), by the same comparisons as the C (a NaN `x` gives the last index).
#[cfg_attr(not(test), allow(dead_code))]
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

/// `nearest_int` (ggml-quants.c): round to nearest (ties to even) by adding `1.5 * 2^23` and reading the
/// mantissa bits; valid for |x| ≤ 4194303.
#[inline]
pub(crate) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// `quantize_row_iq4_nl_impl` (ggml-quants.c), shared by IQ4_NL (`super_block_size == block_size == 32`)
/// and IQ4_XS (256 and 32): quantizes one super-block `x` (`super_block_size` values) to 4-bit indices
/// into `values` (`kvalues_iq4nl`).
///
/// Per block of `block_size`: weights `w = x²` (or `qw * sqrt(sigma2 + x²)` with `quant_weights`); a
/// block whose max |x| is below `GROUP_MAX_EPS` gets scale 0; otherwise the scale `d = -max/values[0]`
/// (`ntry > 0`), indices by [`best_index_int8`] of `x/d`, the least-squares scale `sumqx/sumq2`, then
/// `2*ntry + 1` trial scales `(itry + values[0])/max` keeping the best `sumqx²/sumq2`. With one block the
/// super-block scale `dh` is that scale and (when `ntry > 0`) the indices are redone with `1/d`; with
/// several, `dh = -max_scale/32`, each block's 6-bit scale `nearest_int(scale/dh)` clamped to -32..31,
/// stored +32 as low nibbles in `scales_l` and high 2 bits in `scales_h`, and the indices redone with
/// `1/(dh*l)`. Finally `q4` packs element `j` of each 32 in the low nibble of byte `j`, `j + 16` in the high.
///
/// Arithmetic is f32 in the C's order, multiply and add rounded separately (libggml-base is built without
/// FMA). Outputs: `dh` (f16 bits), `q4` (`super_block_size/2` bytes), `scales_h` (`(nb+7)/8` entries) and
/// `scales_l` (`nb/2` bytes) only written when `nb = super_block_size/block_size > 1`; scratch: `scales`
/// (`nb`), `weight` (`block_size`), `l` (`super_block_size`). Slices shorter than that panic (caller's
/// contract, as the C's buffers).
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize_row_iq4_nl_impl(
    super_block_size: usize,
    block_size: usize,
    x: &[f32],
    dh: &mut u16,
    q4: &mut [u8],
    scales_h: &mut [u16],
    scales_l: &mut [u8],
    scales: &mut [f32],
    weight: &mut [f32],
    l: &mut [u8],
    values: &[i8; 16],
    quant_weights: Option<&[f32]>,
    ntry: i32,
) {
    let mut sigma2 = 0f32;
    for &v in &x[..super_block_size] {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / super_block_size as f32;

    q4[..super_block_size / 2].fill(0);
    *dh = f32_to_f16_ref(0.0);

    let v0 = f32::from(values[0]);
    let vf: [f32; 16] = values.map(f32::from);
    debug_assert!(vf.windows(2).all(|w| w[0] < w[1]), "values must ascend");
    let nb = super_block_size / block_size;
    let mut max_scale = 0f32;
    let mut amax_scale = 0f32;
    for ib in 0..nb {
        let xb = &x[ib * block_size..(ib + 1) * block_size];
        let lb = &mut l[ib * block_size..(ib + 1) * block_size];
        match quant_weights {
            Some(qw) => {
                let qw = &qw[ib * block_size..(ib + 1) * block_size];
                for j in 0..block_size {
                    weight[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for j in 0..block_size {
                    weight[j] = xb[j] * xb[j];
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
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let mut sumqx = 0f32;
        let mut sumq2 = 0f32;
        for j in 0..block_size {
            let al = id * xb[j];
            let li = best_index_16(&vf, al);
            lb[j] = li as u8;
            let q = f32::from(values[li]);
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + i32::from(values[0])) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..block_size {
                let al = id * xb[j];
                let li = best_index_16(&vf, al);
                let q = f32::from(values[li]);
                let w = weight[j];
                sumqx += w * q * xb[j];
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
            let mut li = nearest_int(id * scales[ib]);
            li = li.clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &x[ib * block_size..(ib + 1) * block_size];
            let lb = &mut l[ib * block_size..(ib + 1) * block_size];
            for j in 0..block_size {
                lb[j] = best_index_16(&vf, idl * xb[j]) as u8;
            }
            li += 32;
            let l_l = (li & 0xf) as u8;
            let l_h = (li >> 4) as u16;
            if ib % 2 == 0 {
                scales_l[ib / 2] = l_l;
            } else {
                scales_l[ib / 2] |= l_l << 4;
            }
            scales_h[ib / 8] |= l_h << (2 * (ib % 8));
        }
    } else {
        *dh = f32_to_f16_ref(scales[0]);
        if ntry > 0 {
            let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
            for j in 0..super_block_size {
                l[j] = best_index_16(&vf, id * x[j]) as u8;
            }
        }
    }

    for i in 0..super_block_size / 32 {
        for j in 0..16 {
            q4[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
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
    let mut l = [0u8; QK];
    let mut weight = [0f32; QK];
    let mut scale = [0f32; 1];
    let mut unused_h = [0u16; 1];
    for (x, blk) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BYTES)) {
        let mut dh = 0u16;
        let (d, qs) = blk.split_at_mut(2);
        quantize_row_iq4_nl_impl(
            QK,
            QK,
            x,
            &mut dh,
            qs,
            &mut unused_h,
            &mut [],
            &mut scale,
            &mut weight,
            &mut l,
            &KVALUES,
            None,
            7,
        );
        d.copy_from_slice(&dh.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branchless_best_index_is_the_binary_search() {
        let vf: [f32; 16] = KVALUES.map(f32::from);
        let mut xs = vec![f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        for w in KVALUES.windows(2) {
            let (a, b) = (f32::from(w[0]), f32::from(w[1]));
            let mid = (a + b) / 2.0;
            for x in [a, b, mid, mid.next_up(), mid.next_down(), a.next_up(), b.next_down()] {
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
