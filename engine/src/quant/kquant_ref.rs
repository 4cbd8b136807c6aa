//! The helpers of ggml's reference K-quant quantizers (ggml-quants.c): `nearest_int`, `make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants`, `get_scale_min_k4`, and the block-by-block `_ref` drivers'
//! shared pieces. Every float expression is evaluated in ggml's order with plain f32 operations.
//!
//! # Why no `mul_add`
//!
//! `ggml-quants.c` is part of libggml-base. Its compile line in a cmake Release build of the pinned
//! llama.cpp (0c1e570, gcc 12, x86-64) is `cc -O3 -DNDEBUG -std=gnu11 -fPIC` (+ warnings and
//! `-D_GNU_SOURCE -D_XOPEN_SOURCE=600 -DGGML_SCHED_MAX_COPIES=4`): `CMAKE_C_STANDARD 11` with extensions
//! left on gives `gnu11`, so gcc's default `-ffp-contract=fast` is in force, but `GGML_NATIVE`'s
//! `-march=native` is added only to the CPU backend (`target_compile_options(ggml-cpu PRIVATE
//! ${ARCH_FLAGS})`, ggml/src/ggml-cpu/CMakeLists.txt), not to ggml-base. Baseline x86-64 has no FMA
//! instruction, so gcc contracts nothing: `objdump -d` of that object shows no `vfmadd` anywhere. (The same
//! file built with `-march=native` has dozens in `quantize_row_q2_K_ref` & co., and its Q2_K…Q6_K bytes
//! then differ from the real build's on random rows; that build is not what llama-quantize runs.) SSE
//! arithmetic (`FLT_EVAL_METHOD == 0`), no reassociation without `-ffast-math`: Rust's f32 operations
//! in the same order give the same bits.
//!
//! Checked on this machine's llama.cpp tools build (`oracles/llamacpp/build_tools.sh`): ggml-base's
//! `flags.make` has `C_FLAGS = -O3 -DNDEBUG <warnings> -fopenmp -std=gnu11` (ggml-cpu's adds
//! `-march=native`); its `ggml-quants.c.o` contains no FMA instruction and, linked into a small driver,
//! gives exactly the bytes of these ports on the golden rows, hundreds of varied random rows and real
//! `ffn_down` rows of the cached models. The golden tests pin those bytes as sha256.
//!
//! Where the mirrored C has an FMA-sensitive spot (what a contracted build would change), for the
//! record: `nearest_int(a*b)` (the `+ 1.5·2^23` fuses with the product), the running sums
//! (`sumlx += w*x*l`, `sum_xl += w*l*x`, …), `D = sum_w*sum_l2 - sum_l*sum_l` and the scale/min
//! numerators, `scale*L + min - x`. All are plain here.

use super::fp::{f16_to_f32, f32_to_f16_ref};

/// `GROUP_MAX_EPS` (ggml-quants.c): below this largest |x| a group counts as all zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// `nearest_int` (ggml-quants.c): round to nearest even through `fval + 1.5·2^23` and the low 23 bits.
/// Exact for |x| ≤ 2^22; beyond that and for NaN it returns the same garbage as the C (ggml's `assert`
/// is compiled out by `NDEBUG`), never panics.
#[inline]
pub(crate) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `GGML_FP32_TO_FP16` then `GGML_FP16_TO_FP32` (libggml-base): the value a stored f16 field reads back
/// as, and its bits.
#[inline]
pub(crate) fn f16_round(x: f32) -> (u16, f32) {
    let h = f32_to_f16_ref(x);
    (h, f16_to_f32(h))
}

/// `get_scale_min_k4` (ggml-quants.c): sub-block `j`'s 6-bit scale and min from Q4_K/Q5_K's 12 packed
/// bytes. (A copy of [`super::q4_k::scales_mins`] without the mutation suite's fault hook, which must not
/// reach the quantizers.)
#[inline]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `make_qx_quants` (ggml-quants.c) for `qw == NULL`: symmetric quants `L[i] = l + nmax`,
/// `l ∈ [-nmax, nmax)`, of `x` (`x.len() == l.len()`); returns the scale. `rmse_type` 0: plain `1/iscale`;
/// otherwise per-element weights (1: `x²`, 2: 1, 3: `|x|`, else `sqrt|x|`), a weighted least-squares scale
/// and a search over 18 nearby `iscale`s (a negative `rmse_type` returns early, as the C). Q6_K uses
/// `(n = 16, nmax = 32, rmse_type = 1)`.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8], rmse_type: i32) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = (-nmax) as f32 / max;
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    if rmse_type == 0 {
        for (o, &v) in l_out.iter_mut().zip(x) {
            *o = (nmax + clamp(nearest_int(iscale * v))) as i8;
        }
        return 1.0 / iscale;
    }
    let (rmse_type, return_early) = if rmse_type < 0 {
        (-rmse_type, true)
    } else {
        (rmse_type, false)
    };
    let weight = |v: f32| match rmse_type {
        1 => v * v,
        2 => 1.0,
        3 => v.abs(),
        _ => v.abs().sqrt(),
    };
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for (o, &v) in l_out.iter_mut().zip(x) {
        let l = clamp(nearest_int(iscale * v));
        *o = (l + nmax) as i8;
        let w = weight(v);
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = clamp(nearest_int(iscale * v));
            let w = weight(v);
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l_out.iter_mut().zip(x) {
                *o = (nmax + clamp(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` (ggml-quants.c): symmetric quants `L[i] = l + nmax`, `l ∈ [-nmax, nmax)`, of `x`
/// (`x.len() == l.len()`); returns the scale. With `do_rmse` (Q3_K: `n = 16, nmax = 4, true`), weights
/// `x²` and up to five passes of coordinate descent on the weighted least-squares error.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..x.len()].fill(0);
        return 0.0;
    }
    let iscale = (-nmax) as f32 / max;
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    if do_rmse {
        let mut sumlx = 0f32;
        let mut suml2 = 0f32;
        for (o, &v) in l_out.iter_mut().zip(x) {
            let l = clamp(nearest_int(iscale * v));
            *o = l as i8;
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for (o, &v) in l_out.iter_mut().zip(x) {
                let w = v * v;
                let li = f32::from(*o);
                let mut slx = sumlx - w * v * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = clamp(nearest_int(v * sl2 / slx));
                    if new_l != i32::from(*o) {
                        slx += w * v * new_l as f32;
                        sl2 += w * new_l as f32 * new_l as f32;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            *o = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for o in l_out[..x.len()].iter_mut() {
            *o = (i32::from(*o) + nmax) as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (o, &v) in l_out.iter_mut().zip(x) {
        *o = (clamp(nearest_int(iscale * v)) + nmax) as i8;
    }
    1.0 / iscale
}

/// The knobs of one `make_qkx2_quants` call: `nmax` (largest quant), the `iscale` search
/// `(rmin + rdelta·is + nmax)/(max − min)` for `is = 0..=nstep`, and the error measure (`use_mad`:
/// weighted |diff|, else weighted diff²).
#[derive(Clone, Copy)]
pub(crate) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

/// `make_qkx2_quants` (ggml-quants.c): asymmetric quants `L[i] ∈ [0, nmax]` of `x` with weights `weights`
/// (all three of the same length `n`, `laux` scratch of `n`), fitted as `x ≈ scale·L − the_min` by a
/// weighted least-squares search. Returns `(scale, the_min)` (`the_min ≥ 0` unless the input is not
/// finite). Q2_K: `(16, nmax 3, −0.5, 0.1, 15, mad)`; Q4_K: `(32, 15, −1, 0.1, 20, squares)`; Q5_K:
/// `(32, 31, −0.5, 0.1, 15, squares)`.
pub(crate) fn make_qkx2_quants(
    p: Qkx2,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    laux: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 256 2-bit values as Q2_K/Q3_K's `qs` (64 bytes): element `128h + 32k + b` goes to bits
/// `2k..2k+2` of `qs[32h + b]`.
#[inline]
pub(crate) fn pack_2bit(l: &[u8; 256], qs: &mut [u8]) {
    for h in 0..2 {
        for b in 0..32 {
            let j = 128 * h;
            qs[32 * h + b] =
                l[j + b] | (l[j + b + 32] << 2) | (l[j + b + 64] << 4) | (l[j + b + 96] << 6);
        }
    }
}

/// Q4_K/Q5_K's 12 scale bytes from the eight 6-bit scales `ls` and mins `lm` (the packing loop of
/// `quantize_row_q4_K_ref`, the inverse of [`get_scale_min_k4`]).
#[inline]
pub(crate) fn pack_scales_mins_k4(ls: &[u8; 8], lm: &[u8; 8], out: &mut [u8]) {
    for j in 0..8 {
        if j < 4 {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            out[j - 4] |= (ls[j] >> 4) << 6;
            out[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// The shared super-block step of `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref` (ggml-quants.c):
/// per sub-block of 32, `sum_x2` (sequential), `av_x = sqrt(sum_x2/32)`, weights `av_x + |x|`,
/// [`make_qkx2_quants`] with `p`; the 6-bit scales/mins `min(63, (u8)nearest_int(63/max · s))`, the f16
/// `d = max_scale/63`, `dmin = max_min/63`; then each quant redone as
/// `clamp(nearest_int((x + dm)/d), 0, nmax)` with `d = d_f16·sc`, `dm = dmin_f16·m` (sub-blocks with
/// `d == 0` keep their `make_qkx2_quants` quants). Writes `d`, `dmin`, the 12 scale bytes into
/// `head[0..16]` and returns the 256 quants.
pub(crate) fn q45_k_block(x: &[f32], p: Qkx2, head: &mut [u8]) -> [u8; 256] {
    let mut l = [0u8; 256];
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..8 {
        let xb = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xb {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xb) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(p, xb, &weights, &mut l[32 * j..32 * j + 32], &mut laux);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls: [u8; 8] = core::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = core::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    pack_scales_mins_k4(&ls, &lm, &mut head[4..16]);
    let (dh, d16) = f16_round(max_scale / 63.0);
    let (mh, m16) = f16_round(max_min / 63.0);
    head[0..2].copy_from_slice(&dh.to_le_bytes());
    head[2..4].copy_from_slice(&mh.to_le_bytes());
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &head[4..16]);
        let d = d16 * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        let dm = m16 * f32::from(m);
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, p.nmax);
            l[32 * j + ii] = q as u8;
        }
    }
    l
}

#[cfg(test)]
pub(crate) mod test_rows {
    //! Deterministic test rows shared by the quantizers' golden tests (xorshift64* + Box–Muller), and the
    //! dump the C oracle compares against (`dump_for_oracle`).

    /// xorshift64* state.
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        pub(crate) fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Uniform in (0, 1), 24 bits.
        pub(crate) fn uniform(&mut self) -> f32 {
            ((self.next_u64() >> 40) as f32 + 0.5) / 16_777_216.0
        }
        /// Standard normal (Box–Muller in f64, rounded to f32).
        pub(crate) fn normal(&mut self) -> f32 {
            let u1 = f64::from(self.uniform());
            let u2 = f64::from(self.uniform());
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        }
    }

    /// The named golden rows: 512 elements (two super-blocks) each of realistic weight rows (normal,
    /// σ = 0.02, a few outliers), wider scales and edge cases, then `sweep_concat` (102400 elements).
    pub(crate) fn rows() -> Vec<(&'static str, Vec<f32>)> {
        let n = 512;
        let mut out = Vec::new();
        let mut r = Rng::new(1);
        out.push(("normal_0.02", (0..n).map(|_| 0.02 * r.normal()).collect()));
        let mut r = Rng::new(2);
        let mut v: Vec<f32> = (0..n).map(|_| 0.02 * r.normal()).collect();
        for k in 0..6 {
            let i = (r.next_u64() % n as u64) as usize;
            v[i] = if k % 2 == 0 { 0.5 } else { -0.4 } * (1.0 + r.uniform());
        }
        out.push(("outliers", v));
        let mut r = Rng::new(3);
        out.push(("normal_1", (0..n).map(|_| r.normal()).collect()));
        let mut r = Rng::new(4);
        // per-16 groups with very different magnitudes, some all-positive, some all-negative
        out.push((
            "mixed_groups",
            (0..n)
                .map(|i| {
                    let g = i / 16;
                    let s = 10f32.powi((g % 7) as i32 - 4);
                    let x = r.normal() * s;
                    match g % 5 {
                        0 => x.abs(),
                        1 => -x.abs(),
                        _ => x,
                    }
                })
                .collect(),
        ));
        out.push(("zeros", vec![0.0; n]));
        out.push(("constant", vec![0.37; n]));
        out.push(("neg_constant", vec![-1.25; n]));
        let mut r = Rng::new(5);
        out.push(("tiny", (0..n).map(|_| 1e-9 * r.normal()).collect()));
        let mut v = vec![0.0; n];
        v[3] = 1000.0;
        v[300] = -7.5;
        out.push(("one_huge", v));
        let mut r = Rng::new(6);
        let mut v: Vec<f32> = (0..n).map(|_| 0.01 * r.normal()).collect();
        v[17] = 300.0;
        out.push(("huge_in_noise", v));
        let mut r = Rng::new(7);
        out.push((
            "uniform_pos",
            (0..n).map(|_| 0.1 + 0.05 * r.uniform()).collect(),
        ));
        let mut r = Rng::new(8);
        out.push((
            "sparse",
            (0..n)
                .map(|i| if i % 7 == 0 { r.normal() } else { 0.0 })
                .collect(),
        ));
        // 100 varied rows in one (400 super-blocks): the row that tells FMA-contracted arithmetic apart
        // (ggml-quants.c built with -march=native gives different bytes here for every type but IQ4_XS)
        out.push((
            "sweep_concat",
            sweep_rows(100).into_iter().flat_map(|(_, v)| v).collect(),
        ));
        out
    }

    /// Rows for the oracle sweep (not golden): `count` rows of 1024 elements with varied distributions
    /// (normal at scales 1e-3…10, with outliers, shifted means, Laplace-like, rounded to few values).
    pub(crate) fn sweep_rows(count: usize) -> Vec<(String, Vec<f32>)> {
        (0..count)
            .map(|k| {
                let mut r = Rng::new(1000 + k as u64);
                let scale = 10f32.powf(-3.0 + 4.0 * r.uniform());
                let mean = if k % 3 == 0 {
                    scale * (r.uniform() - 0.5)
                } else {
                    0.0
                };
                let kind = k % 5;
                let mut v: Vec<f32> = (0..1024)
                    .map(|_| match kind {
                        0 | 1 => mean + scale * r.normal(),
                        2 => {
                            let u = r.uniform() - 0.5;
                            -scale * u.signum() * (1.0 - 2.0 * u.abs()).max(1e-7).ln()
                        }
                        3 => scale * (4.0 * r.normal()).round() / 4.0,
                        _ => mean + scale * r.normal() * r.normal(),
                    })
                    .collect();
                if kind == 1 {
                    for _ in 0..8 {
                        let i = (r.next_u64() % 1024) as usize;
                        v[i] = scale * 20.0 * (r.uniform() - 0.5);
                    }
                }
                (format!("sweep_{k:04}"), v)
            })
            .collect()
    }

    /// A row quantizer: `src` (whole super-blocks) → `dst` bytes.
    pub(crate) type QuantizeFn = fn(&[f32], &mut [u8]);

    /// The quantizers under test: (oracle type name, bytes per 256, function).
    pub(crate) fn quantizers() -> [(&'static str, usize, QuantizeFn); 6] {
        [
            (
                "q2_K",
                super::super::q2_k::BYTES,
                super::super::q2_k::quantize_row_ref,
            ),
            (
                "q3_K",
                super::super::q3_k::BYTES,
                super::super::q3_k::quantize_row_ref,
            ),
            (
                "q4_K",
                super::super::q4_k::BYTES,
                super::super::q4_k::quantize_row_ref,
            ),
            (
                "q5_K",
                super::super::q5_k::BYTES,
                super::super::q5_k::quantize_row_ref,
            ),
            (
                "q6_K",
                super::super::q6_k::BYTES,
                super::super::q6_k::quantize_row_ref,
            ),
            (
                "iq4_xs",
                super::super::iq4_xs::BYTES,
                super::super::iq4_xs::quantize_row_ref,
            ),
        ]
    }

    /// `f` applied to `src` (whole super-blocks).
    pub(crate) fn quantize(f: QuantizeFn, bytes: usize, src: &[f32]) -> Vec<u8> {
        let mut dst = vec![0xAAu8; src.len() / 256 * bytes];
        f(src, &mut dst);
        dst
    }

    /// Lower-case hex sha256.
    pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
        use sha2::Digest;
        sha2::Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Checks `f`'s output on every golden row against `expected` (row name, sha256 of the C oracle's
    /// output for that row), naming every mismatch.
    pub(crate) fn check_golden(ty: &str, f: QuantizeFn, bytes: usize, expected: &[(&str, &str)]) {
        let rows = rows();
        assert_eq!(
            rows.len(),
            expected.len(),
            "{ty}: one expected hash per row"
        );
        let mut bad = Vec::new();
        for (name, v) in &rows {
            let want = expected
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{ty}: no expected hash for {name}"))
                .1;
            let got = sha256_hex(&quantize(f, bytes, v));
            if got != want {
                bad.push(format!("{name}: got {got}"));
            }
        }
        assert!(bad.is_empty(), "{ty} differs from ggml on: {bad:#?}");
    }

    /// Relative RMS error `‖dequant(quant(x)) − x‖ / ‖x‖` of `f` followed by `deq` on `x`.
    pub(crate) fn round_trip_rel_rmse(
        f: QuantizeFn,
        bytes: usize,
        deq: fn(&[u8], &mut [f32; 256]),
        x: &[f32],
    ) -> f64 {
        let q = quantize(f, bytes, x);
        let (mut err, mut norm) = (0f64, 0f64);
        for (blk, xb) in q.chunks_exact(bytes).zip(x.chunks_exact(256)) {
            let mut y = [0f32; 256];
            deq(blk, &mut y);
            for (&a, &b) in y.iter().zip(xb) {
                err += (f64::from(a) - f64::from(b)).powi(2);
                norm += f64::from(b).powi(2);
            }
        }
        (err / norm).sqrt()
    }

    /// Round-trip checks shared by every type: on the random rows the relative RMS error is below
    /// `bound`; the all-zero row comes back as zeros; every row (including the edge cases and
    /// non-finite input) quantizes without panicking and dequantizes to finite values when the input was
    /// finite.
    pub(crate) fn check_round_trip(
        ty: &str,
        f: QuantizeFn,
        bytes: usize,
        deq: fn(&[u8], &mut [f32; 256]),
        bound: f64,
    ) {
        for (name, v) in rows() {
            let e = round_trip_rel_rmse(f, bytes, deq, &v);
            match name {
                "normal_0.02" | "normal_1" | "outliers" | "uniform_pos" => {
                    assert!(e < bound, "{ty} {name}: relative RMS error {e} ≥ {bound}")
                }
                "zeros" => {
                    let q = quantize(f, bytes, &v);
                    let mut y = [1f32; 256];
                    deq(&q[..bytes], &mut y);
                    assert!(
                        y.iter().all(|&a| a == 0.0),
                        "{ty}: zeros do not come back as zeros"
                    );
                }
                _ => {
                    let q = quantize(f, bytes, &v);
                    let mut y = [0f32; 256];
                    for blk in q.chunks_exact(bytes) {
                        deq(blk, &mut y);
                        assert!(
                            y.iter().all(|a| a.is_finite()),
                            "{ty} {name}: non-finite output"
                        );
                    }
                }
            }
        }
        let mut v = rows().swap_remove(0).1;
        v[5] = f32::NAN;
        v[300] = f32::INFINITY;
        v[301] = f32::NEG_INFINITY;
        let _ = quantize(f, bytes, &v);
        let _ = quantize(f, bytes, &[f32::NAN; 256]);
        let _ = quantize(f, bytes, &[f32::INFINITY; 256]);
        let _ = quantize(f, bytes, &[f32::MAX; 256]);
    }

    /// Dev tool for the C oracle (not a check): with `LOCKSTEP_DUMP_DIR` set, writes every golden and
    /// sweep row to `$DIR/rows/<name>.f32` (little-endian f32) and our bytes to `$DIR/ours/<type>/<name>.bin`.
    /// `LOCKSTEP_SWEEP` sets the number of sweep rows (default 200); `LOCKSTEP_EXTRA_ROWS` names a directory
    /// of further `.f32` rows to include (real weights).
    #[test]
    fn dump_for_oracle() {
        let Some(dir) = std::env::var_os("LOCKSTEP_DUMP_DIR") else {
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        let n_sweep = std::env::var("LOCKSTEP_SWEEP")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(200);
        let mut all: Vec<(String, Vec<f32>)> = rows()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        all.extend(sweep_rows(n_sweep));
        // any extra rows (e.g. real weights) from `$LOCKSTEP_EXTRA_ROWS/*.f32`, whole super-blocks only
        if let Some(extra) = std::env::var_os("LOCKSTEP_EXTRA_ROWS") {
            for e in std::fs::read_dir(extra).unwrap() {
                let path = e.unwrap().path();
                let b = std::fs::read(&path).unwrap();
                let v: Vec<f32> = b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                if !v.is_empty() && v.len().is_multiple_of(256) {
                    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                    all.push((name, v));
                }
            }
        }
        std::fs::create_dir_all(dir.join("rows")).unwrap();
        for (ty, _, _) in quantizers() {
            std::fs::create_dir_all(dir.join("ours").join(ty)).unwrap();
        }
        for (name, v) in &all {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            std::fs::write(dir.join("rows").join(format!("{name}.f32")), bytes).unwrap();
            for (ty, bytes, f) in quantizers() {
                let out = quantize(f, bytes, v);
                std::fs::write(dir.join("ours").join(ty).join(format!("{name}.bin")), out).unwrap();
            }
        }
    }
}
