//! Unit tests across the quant formats: round trips, ggml mode against an independent integer computation,
//! ggml mode against reference mode, edge cases. Bit-exactness against the real ggml lives in
//! `tests/quant_vs_gguf.rs`.

use super::fp::{f16_to_f32, read_f32, read_u16};
use super::*;

/// Deterministic xorshift generator (no `rand` dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Heavy-tailed values like activations with outlier channels.
    fn activation(&mut self) -> f32 {
        let u = self.uniform();
        if self.next().is_multiple_of(64) {
            u * 20.0
        } else {
            u
        }
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.activation() * scale).collect()
    }
}

const DOT_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// The quantized dot types (integer kernels in ggml mode).
const QUANT_DOT_TYPES: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// Random blocks of `ty` (every quant, scale and min bit pattern) with the f16 scales at `scales` (byte
/// offset, value) overwritten by sane values.
fn random_blocks(ty: GgmlType, n: usize, rng: &mut Rng, scales: &[(usize, f32)]) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n / ty.block_size() {
        let mut b: Vec<u8> = (0..ty.type_size()).map(|_| rng.next() as u8).collect();
        for &(at, v) in scales {
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        out.extend(b);
    }
    out
}

/// Weight rows for every dot type: quantized with [`quantize_row`] where it exists; the other types built
/// from random bytes with sane scales.
fn weight_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    match ty {
        GgmlType::Q5_1 => random_blocks(ty, n, rng, &[(0, 0.003), (2, -0.05)]),
        GgmlType::IQ4_NL => random_blocks(ty, n, rng, &[(0, 0.0005)]),
        GgmlType::Q2_K => random_blocks(ty, n, rng, &[(80, 0.002), (82, 0.001)]),
        GgmlType::Q3_K => random_blocks(ty, n, rng, &[(108, 0.001)]),
        GgmlType::Q5_K => random_blocks(ty, n, rng, &[(0, 0.001), (2, 0.001)]),
        GgmlType::IQ4_XS => random_blocks(ty, n, rng, &[(0, 0.0002)]),
        GgmlType::Q4_K => {
            let mut out = Vec::new();
            for _ in 0..n / 256 {
                let mut b: Vec<u8> = (0..144).map(|_| rng.next() as u8).collect();
                b[0..2].copy_from_slice(&half::f16::from_f32(0.002).to_le_bytes());
                b[2..4].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
                out.extend(b);
            }
            out
        }
        GgmlType::Q6_K => {
            let mut out = Vec::new();
            for _ in 0..n / 256 {
                let mut b: Vec<u8> = (0..210).map(|_| rng.next() as u8).collect();
                b[208..210].copy_from_slice(&half::f16::from_f32(0.0005).to_le_bytes());
                out.extend(b);
            }
            out
        }
        _ => quantize_row(ty, &rng.vec(n, 0.05)).unwrap(),
    }
}

fn prepared(ty: GgmlType, mode: NumericsMode, x: &[f32]) -> PreparedRow {
    let mut p = PreparedRow::new();
    p.prepare(ty, mode, x).unwrap();
    p
}

#[test]
fn round_trips_stay_within_half_a_step() {
    let mut rng = Rng(0x5eed);
    let n = 512;
    let x = rng.vec(n, 1.0);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
    ] {
        let q = quantize_row(ty, &x).unwrap();
        assert_eq!(Some(q.len()), ty.bytes_for(n as u64));
        let mut y = vec![0f32; n];
        dequantize_row(ty, &q, &mut y).unwrap();
        let bs = ty.block_size();
        for (b, (xb, yb)) in x.chunks(bs.max(32)).zip(y.chunks(bs.max(32))).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (lo, hi) = xb
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            // half a quantization step, plus the step's own f16 rounding applied to the largest quant;
            // Q4_0/Q5_0 map the signed max to -8/-16 steps, so the other side clips at 7/8 (15/16) of it
            let tol = match ty {
                GgmlType::F32 => 0.0,
                GgmlType::F16 => amax * 2f32.powi(-11),
                GgmlType::BF16 => amax * 2f32.powi(-8),
                GgmlType::Q4_0 => amax / 8.0 + amax * 1e-3,
                GgmlType::Q4_1 => (hi - lo) / 30.0 + amax * 2e-3,
                GgmlType::Q5_0 => amax / 16.0 + amax * 1e-3,
                GgmlType::Q8_0 | GgmlType::Q8_1 => amax / 254.0 + amax * 1e-3,
                GgmlType::Q8_K => amax / 254.0 + amax * 1e-6,
                _ => unreachable!(),
            };
            for (a, b2) in xb.iter().zip(yb) {
                assert!(
                    (a - b2).abs() <= tol,
                    "{ty} block {b}: {a} vs {b2} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn exact_values_round_trip_exactly() {
    // values on the quantization grid come back unchanged
    let grid: Vec<f32> = (0..64).map(|i| (i % 16) as f32 - 8.0).collect();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q5_0,
    ] {
        let q = quantize_row(ty, &grid).unwrap();
        let mut y = vec![0f32; 64];
        dequantize_row(ty, &q, &mut y).unwrap();
        if ty == GgmlType::Q8_0 {
            // d = 8/127 is not exact in f16; the grid survives within half a step
            for (a, b) in grid.iter().zip(&y) {
                assert!((a - b).abs() < 0.04, "{ty}: {a} vs {b}");
            }
        } else {
            assert_eq!(y, grid, "{ty}");
        }
    }
    let nonneg: Vec<f32> = (0..32).map(|i| (i % 16) as f32).collect();
    let q = quantize_row(GgmlType::Q4_1, &nonneg).unwrap();
    let mut y = vec![0f32; 32];
    dequantize_row(GgmlType::Q4_1, &q, &mut y).unwrap();
    assert_eq!(y, nonneg);
}

/// The integer quants of one weight block, straight from the ggml-common.h description (written without
/// the module's helpers), with the block's float parameters: value = `scale[i] * q[i] - offset[i]`.
struct Unpacked {
    q: Vec<i32>,
    scale: Vec<f64>,
    offset: Vec<f64>,
}

fn unpack(ty: GgmlType, row: &[u8]) -> Unpacked {
    let f16 = |b: &[u8], o: usize| f64::from(f16_to_f32(read_u16(b, o)));
    let mut u = Unpacked {
        q: vec![],
        scale: vec![],
        offset: vec![],
    };
    let mut push = |q: i32, s: f64, o: f64| {
        u.q.push(q);
        u.scale.push(s);
        u.offset.push(o);
    };
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 => {
            let bytes = ty.type_size();
            for b in row.chunks_exact(bytes) {
                let d = f16(b, 0);
                for j in 0..32 {
                    let (qs, shift) = (j % 16, 4 * (j / 16));
                    match ty {
                        GgmlType::Q4_0 => push(i32::from((b[2 + qs] >> shift) & 15) - 8, d, 0.0),
                        GgmlType::Q4_1 => push(i32::from((b[4 + qs] >> shift) & 15), d, -f16(b, 2)),
                        _ => {
                            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                            let hi = ((qh >> j) & 1) as i32;
                            push(i32::from((b[6 + qs] >> shift) & 15) + 16 * hi - 16, d, 0.0)
                        }
                    }
                }
            }
        }
        GgmlType::Q5_1 => {
            for b in row.chunks_exact(24) {
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                for j in 0..32 {
                    let nib = (b[8 + j % 16] >> (4 * (j / 16))) & 15;
                    let hi = ((qh >> j) & 1) as i32;
                    push(i32::from(nib) + 16 * hi, f16(b, 0), -f16(b, 2));
                }
            }
        }
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            const KV: [i32; 16] = [
                -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
            ];
            // IQ4_NL: one 32-element sub-block per block, scale d; IQ4_XS: eight, scale d * (ls - 32)
            let (bytes, subs, qoff) = if ty == GgmlType::IQ4_NL {
                (18, 1, 2)
            } else {
                (136, 8, 8)
            };
            for b in row.chunks_exact(bytes) {
                for s in 0..subs {
                    let scale = if ty == GgmlType::IQ4_NL {
                        f16(b, 0)
                    } else {
                        let lo = (b[4 + s / 2] >> (4 * (s % 2))) & 15;
                        let hi = (u16::from_le_bytes([b[2], b[3]]) >> (2 * s)) & 3;
                        f16(b, 0) * f64::from(i32::from(lo) + 16 * i32::from(hi) - 32)
                    };
                    for j in 0..32 {
                        let nib = (b[qoff + 16 * s + j % 16] >> (4 * (j / 16))) & 15;
                        push(KV[usize::from(nib)], scale, 0.0);
                    }
                }
            }
        }
        GgmlType::Q2_K => {
            for b in row.chunks_exact(84) {
                let (d, dmin) = (f16(b, 80), f16(b, 82));
                for i in 0..256 {
                    let sc = b[i / 16];
                    let q = (b[16 + 32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
                    push(
                        i32::from(q),
                        d * f64::from(sc & 15),
                        dmin * f64::from(sc >> 4),
                    );
                }
            }
        }
        GgmlType::Q3_K => {
            for b in row.chunks_exact(110) {
                let d = f16(b, 108);
                for i in 0..256 {
                    let s = i / 16;
                    let lo4 = if s < 8 {
                        b[96 + s] & 15
                    } else {
                        b[96 + s - 8] >> 4
                    };
                    let hi2 = (b[104 + s % 4] >> (2 * (s / 4))) & 3;
                    let sc = i32::from(lo4 | (hi2 << 4)) - 32;
                    let low = (b[32 + 32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
                    let high = (b[i % 32] >> (i / 32)) & 1;
                    push(
                        i32::from(low) + 4 * i32::from(high) - 4,
                        d * f64::from(sc),
                        0.0,
                    );
                }
            }
        }
        GgmlType::Q8_0 => {
            for b in row.chunks_exact(34) {
                for j in 0..32 {
                    push(i32::from(b[2 + j] as i8), f16(b, 0), 0.0);
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (bytes, qoff) = if ty == GgmlType::Q4_K {
                (144, 16)
            } else {
                (176, 48)
            };
            for b in row.chunks_exact(bytes) {
                let (d, dmin) = (f16(b, 0), f16(b, 2));
                let (sd, sm, smd) = (&b[4..8], &b[8..12], &b[12..16]);
                for j in 0..256 {
                    let sub = j / 32;
                    let (sc, m) = if sub < 4 {
                        (sd[sub] & 0x3F, sm[sub] & 0x3F)
                    } else {
                        let k = sub - 4;
                        (
                            (smd[k] & 0x0F) | ((sd[k] >> 2) & 0x30),
                            (smd[k] >> 4) | ((sm[k] >> 2) & 0x30),
                        )
                    };
                    let byte = b[qoff + 32 * (sub / 2) + j % 32];
                    let mut q = i32::from(if sub % 2 == 0 { byte & 15 } else { byte >> 4 });
                    if ty == GgmlType::Q5_K {
                        // the fifth bit of element j: bit `sub` of qh[j % 32]
                        q += 16 * i32::from((b[16 + j % 32] >> sub) & 1);
                    }
                    push(q, d * f64::from(sc), dmin * f64::from(m));
                }
            }
        }
        GgmlType::Q6_K => {
            for b in row.chunks_exact(210) {
                let d = f16(b, 208);
                for j in 0..256 {
                    let (half, r) = (j / 128, j % 128);
                    let (k, l) = (r / 32, r % 32);
                    let ql = b[64 * half + l + 32 * (k % 2)];
                    let lo = if k < 2 { ql & 15 } else { ql >> 4 };
                    let hi = (b[128 + 32 * half + l] >> (2 * k)) & 3;
                    let sc = f64::from(b[192 + j / 16] as i8);
                    push(i32::from(lo | (hi << 4)) - 32, d * sc, 0.0);
                }
            }
        }
        other => panic!("no unpacking for {other}"),
    }
    u
}

/// The activation's integer quants and per-element scale from ggml's block bytes.
fn unpack_act(ty: GgmlType, blocks: &[u8]) -> (Vec<i32>, Vec<f64>) {
    let (mut q, mut d) = (vec![], vec![]);
    let (qk, bytes, qoff) = match ty {
        GgmlType::Q8_0 => (32, 34, 2),
        GgmlType::Q8_1 => (32, 36, 4),
        GgmlType::Q8_K => (256, 292, 4),
        other => panic!("{other}"),
    };
    for b in blocks.chunks_exact(bytes) {
        let s = if ty == GgmlType::Q8_K {
            f64::from(read_f32(b, 0))
        } else {
            f64::from(f16_to_f32(read_u16(b, 0)))
        };
        for j in 0..qk {
            q.push(i32::from(b[qoff + j] as i8));
            d.push(s);
        }
    }
    (q, d)
}

#[test]
fn ggml_dot_equals_independent_integer_computation() {
    let mut rng = Rng(42);
    for ty in QUANT_DOT_TYPES {
        // an even and an odd number of 32-element blocks (IQ4_NL's vec_dot pairs blocks and has a tail)
        let sizes = if ty.block_size() == 32 {
            [1536, 1312]
        } else {
            [1536, 1280]
        };
        // every kernel llama.cpp may run for this type (see `ggml_path`)
        let mut paths = vec![GgmlPath::VecDot];
        for p in [
            GgmlPath::Tiled,
            GgmlPath::TinyBlasQ0,
            GgmlPath::RepackGemv,
            GgmlPath::RepackGemm,
        ] {
            if effective_path(ty, p) == p {
                paths.push(p);
            }
        }
        for n in sizes {
            for trial in 0..5 {
                let w = weight_row(ty, n, &mut rng);
                let mut x = rng.vec(n, 1.0 + trial as f32);
                if trial == 4 {
                    // edge blocks: all zero, one spike, tiny values
                    x[0..256].fill(0.0);
                    x[300] = 1e4;
                    x[512..768].iter_mut().for_each(|v| *v *= 1e-30);
                }
                let p = prepared(ty, NumericsMode::Ggml, &x);
                let (aty, blocks) = p.ggml_blocks().unwrap();
                let (aq, ad) = unpack_act(aty, blocks);
                let u = unpack(ty, &w);
                // Q4_1 / Q5_1: the min term goes through the activation's stored s = f16(d * sum(q))
                let via_s = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
                // exact value of the integer formulation, and the magnitude of everything the kernel sums
                let qk = ty.block_size();
                let mut exact = 0f64;
                let mut magnitude = 0f64;
                for b in 0..n / qk {
                    for i in b * qk..(b + 1) * qk {
                        let pos = u.scale[i] * f64::from(u.q[i]) * ad[i] * f64::from(aq[i]);
                        let neg = u.offset[i] * ad[i] * f64::from(aq[i]);
                        if via_s {
                            exact += pos;
                            magnitude += pos.abs();
                        } else {
                            exact += pos - neg;
                            magnitude += pos.abs() + neg.abs();
                        }
                    }
                    if via_s {
                        let s = f64::from(f16_to_f32(read_u16(blocks, 36 * b + 2)));
                        let m = -u.offset[b * qk];
                        exact += m * s;
                        magnitude += (m * s).abs();
                    }
                }
                for &path in &paths {
                    let got = f64::from(vec_dot_path(ty, &w, &p, path));
                    // f32 scale products, fmas and lane sums: a few roundings per block, relative to the
                    // magnitude; a wrong quant or scale anywhere would be off by ~1/n of the magnitude
                    let tol = magnitude * f64::from(f32::EPSILON) * (8 + n / qk) as f64 + 1e-30;
                    assert!(
                        (got - exact).abs() <= tol,
                        "{ty} n {n} trial {trial} {path:?}: {got} vs {exact} (tol {tol})"
                    );
                }
            }
        }
    }
}

/// Every float kernel of either build (`ggml_vec_dot_f32/f16/bf16` and tinyBLAS, AVX-512 and AVX2)
/// computes the dot product of the weights with the activation rounded to the weight's type, to within
/// the f32 roundings of its sums; the two builds' kernels differ only in their order of summation.
#[test]
fn float_kernels_of_both_builds_compute_the_dot_product_of_the_converted_activation() {
    let mut rng = Rng(0xa2f1);
    let mut differ = 0;
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for n in [8usize, 40, 64, 200, 576, 1000, 1536] {
            let wf = rng.vec(n, 1.0);
            let w = quantize_row(ty, &wf).unwrap();
            let x = rng.vec(n, 2.0);
            let p = prepared(ty, NumericsMode::Ggml, &x);
            let (mut wd, mut xd) = (vec![0f32; n], vec![0f32; n]);
            dequantize_row(ty, &w, &mut wd).unwrap();
            dequantize_row(ty, &quantize_row(ty, &x).unwrap(), &mut xd).unwrap();
            let exact: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let magnitude: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                .sum();
            let mut got = vec![];
            for path in [
                GgmlPath::VecDot,
                GgmlPath::VecDotAvx2,
                GgmlPath::VecDotNoBf16,
                GgmlPath::TinyBlas,
                GgmlPath::TinyBlasAvx2,
                GgmlPath::TinyBlasNoBf16,
            ] {
                // tinyBLAS runs only where the row length is a multiple of its KN
                let kn = match (path, ty) {
                    (GgmlPath::TinyBlas, GgmlType::BF16) => 32,
                    (GgmlPath::TinyBlas | GgmlPath::TinyBlasNoBf16, _) => 16,
                    (GgmlPath::TinyBlasAvx2, _) => 8,
                    _ => 1,
                };
                if n % kn != 0 {
                    continue;
                }
                let r = vec_dot_path(ty, &w, &p, path);
                let tol = magnitude * f64::from(f32::EPSILON) * 16.0;
                assert!(
                    (f64::from(r) - exact).abs() <= tol,
                    "{ty} n {n} {path:?}: {r} vs {exact}"
                );
                got.push(r.to_bits());
            }
            got.dedup();
            differ += usize::from(got.len() > 1);
        }
    }
    // the orders are not the same (if they were, the AVX2 replicas would be redundant)
    assert!(differ > 5, "{differ}");
}

#[test]
fn ggml_mode_tracks_reference_within_activation_quantization_error() {
    let mut rng = Rng(7);
    let n = 1024;
    for ty in DOT_TYPES {
        let w = weight_row(ty, n, &mut rng);
        let mut wf = vec![0f32; n];
        dequantize_row(ty, &w, &mut wf).unwrap();
        for _ in 0..3 {
            let x = rng.vec(n, 2.0);
            let pr = prepared(ty, NumericsMode::Reference, &x);
            let pg = prepared(ty, NumericsMode::Ggml, &x);
            let r = vec_dot(ty, &w, &pr);
            let g = vec_dot(ty, &w, &pg);
            // the activation ggml mode sees, dequantized
            let (t, blocks) = pg.ggml_blocks().unwrap();
            let mut xh = vec![0f32; n];
            dequantize_row(t, blocks, &mut xh).unwrap();
            let act_err: f64 = wf
                .iter()
                .zip(x.iter().zip(&xh))
                .map(|(w, (a, b))| f64::from(w.abs() * (a - b).abs()))
                .sum();
            let mag: f64 = wf
                .iter()
                .zip(&x)
                .map(|(w, a)| f64::from((w * a).abs()))
                .sum();
            let exact: f64 = wf
                .iter()
                .zip(&x)
                .map(|(w, a)| f64::from(*w) * f64::from(*a))
                .sum();
            // Q4_1/Q5_1: the min term uses the activation's s = f16(d * sum(q)), one more f16 rounding per
            // block
            let s_err: f64 = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                w.chunks_exact(ty.type_size())
                    .zip(blocks.chunks_exact(36))
                    .map(|(wb, ab)| {
                        f64::from((f16_to_f32(read_u16(wb, 2)) * f16_to_f32(read_u16(ab, 2))).abs())
                            * 1e-3
                    })
                    .sum()
            } else {
                0.0
            };
            let tol = act_err + s_err + mag * 1e-5;
            assert!(
                (f64::from(g) - exact).abs() <= tol,
                "{ty}: ggml {g} vs exact {exact} (tol {tol})"
            );
            assert!(
                (f64::from(r) - exact).abs() <= mag * 1e-5,
                "{ty}: reference {r} vs exact {exact}"
            );
        }
    }
}

#[test]
fn q8_1_activation_s_is_d_times_sum_of_quants() {
    let mut rng = Rng(99);
    let x = rng.vec(256, 3.0);
    let p = prepared(GgmlType::Q4_1, NumericsMode::Ggml, &x);
    let (t, blocks) = p.ggml_blocks().unwrap();
    assert_eq!(t, GgmlType::Q8_1);
    for blk in blocks.chunks_exact(36) {
        let d = f16_to_f32(read_u16(blk, 0));
        let s = f16_to_f32(read_u16(blk, 2));
        let sum: i32 = blk[4..].iter().map(|&q| i32::from(q as i8)).sum();
        // s is f16(d_f32 * sum); d is f16(d_f32): equal up to the two f16 roundings
        let want = d * sum as f32;
        assert!(
            (s - want).abs() <= want.abs() * 2e-3 + 1e-6,
            "s {s} vs d*sum {want}"
        );
    }
}

#[test]
fn all_zero_rows_give_zero() {
    let n = 512;
    let zeros = vec![0f32; n];
    let mut rng = Rng(1);
    for ty in DOT_TYPES {
        let w = weight_row(ty, n, &mut rng);
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let p = prepared(ty, mode, &zeros);
            assert_eq!(vec_dot(ty, &w, &p), 0.0, "{ty} {mode}");
        }
    }
    let wz = quantize_row(GgmlType::Q8_0, &zeros).unwrap();
    let p = prepared(GgmlType::Q8_0, NumericsMode::Ggml, &rng.vec(n, 1.0));
    assert_eq!(vec_dot(GgmlType::Q8_0, &wz, &p), 0.0);
}

#[test]
fn extreme_and_non_finite_inputs_do_not_panic() {
    let n = 512;
    let mut rng = Rng(3);
    let mut x = rng.vec(n, 1.0);
    x[0] = f32::NAN;
    x[40] = f32::INFINITY;
    x[70] = f32::NEG_INFINITY;
    x[100] = f32::MAX;
    x[130] = f32::MIN_POSITIVE / 4.0; // subnormal
    x[300..332].fill(1e-40);
    x[400..432].fill(0.0);
    for ty in DOT_TYPES {
        let w = weight_row(ty, n, &mut rng);
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let p = prepared(ty, mode, &x);
            let _ = vec_dot(ty, &w, &p);
        }
        // garbage weight blocks: random bytes, including NaN/inf scales
        let garbage: Vec<u8> = (0..ty.bytes_for(n as u64).unwrap())
            .map(|_| rng.next() as u8)
            .collect();
        let mut out = vec![0f32; n];
        dequantize_row(ty, &garbage, &mut out).unwrap();
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let p = prepared(ty, mode, &rng.vec(n, 1.0));
            let _ = vec_dot(ty, &garbage, &p);
        }
    }
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
    ] {
        let q = quantize_row(ty, &x).unwrap();
        let mut y = vec![0f32; n];
        dequantize_row(ty, &q, &mut y).unwrap();
    }
}

#[test]
fn nan_activation_block_matches_sign_epi8_semantics() {
    // element 27 NaN survives the max tree: every quant of block 0 is -128 with d = NaN, so the block's
    // contribution (and the result) is NaN, as in ggml
    let mut x = vec![0.5f32; 64];
    x[27] = f32::NAN;
    let p = prepared(GgmlType::Q8_0, NumericsMode::Ggml, &x);
    assert!(p.has_min_quant);
    let w = quantize_row(GgmlType::Q8_0, &[0.25f32; 64]).unwrap();
    assert!(vec_dot(GgmlType::Q8_0, &w, &p).is_nan());
    // element 3 NaN is dropped by the max tree: d finite, one quant -128 (from the NaN) multiplied the
    // sign_epi8 way: weight q = -127 (negative) against -128 gives 127*(-128), not (-127)*(-128)
    let mut x = vec![0.5f32; 32];
    x[3] = f32::NAN;
    let p = prepared(GgmlType::Q8_0, NumericsMode::Ggml, &x);
    assert!(p.has_min_quant);
    let w = quantize_row(GgmlType::Q8_0, &[-1.0f32; 32]).unwrap();
    let d = f16_to_f32(read_u16(&w, 0)) * p.d[0];
    let lanes: [f32; 8] = core::array::from_fn(|l| {
        if l == 0 {
            (-3 * 127 * 127 - 127 * 128) as f32
        } else {
            (-4 * 127 * 127) as f32
        }
    });
    let want = x86::hsum_float_8(&core::array::from_fn(|l| d * lanes[l]));
    assert_eq!(vec_dot(GgmlType::Q8_0, &w, &p), want);
}

#[test]
fn prepare_reuses_its_buffers() {
    let mut rng = Rng(11);
    let big = rng.vec(1024, 1.0);
    let small = rng.vec(512, 1.0);
    for ty in DOT_TYPES {
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let mut p = PreparedRow::new();
            p.prepare(ty, mode, &big).unwrap();
            let ptrs = |p: &PreparedRow| {
                (
                    p.x.as_ptr(),
                    p.blocks.as_ptr(),
                    p.qs.as_ptr(),
                    p.d.as_ptr(),
                    p.s.as_ptr(),
                    p.bsums.as_ptr(),
                )
            };
            let before = ptrs(&p);
            p.prepare(ty, mode, &small).unwrap();
            p.prepare(ty, mode, &big).unwrap();
            assert_eq!(ptrs(&p), before, "{ty} {mode}: prepare reallocated");
            assert_eq!(p.len(), 1024);
            assert_eq!(p.mode(), mode);
            assert_eq!(p.weight_type(), Some(ty));
        }
    }
}

#[test]
fn errors_name_the_problem() {
    let mut out = vec![0f32; 32];
    assert!(matches!(
        dequantize_row(GgmlType::Q4_1, &[0u8; 19], &mut out),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        dequantize_row(GgmlType::Q4_1, &[0u8; 20], &mut out[..31]),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        dequantize_row(GgmlType::IQ2_XS, &[0u8; 74], &mut [0f32; 256]),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        quantize_row(GgmlType::Q4_0, &[0f32; 33]),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        quantize_row(GgmlType::IQ2_XXS, &[0f32; 256]),
        Err(Error::Unsupported(_))
    ));
    let mut p = PreparedRow::new();
    assert!(p.is_empty());
    assert!(matches!(
        p.prepare(GgmlType::Q8_K, NumericsMode::Ggml, &[0f32; 256]),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        p.prepare(GgmlType::Q4_K, NumericsMode::Reference, &[0f32; 64]),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        p.prepare(GgmlType::Q4_0, NumericsMode::Ggml, &[0f32; 48]),
        Err(Error::Invalid(_))
    ));
    // F32 weights accept any length in both modes
    p.prepare(GgmlType::F32, NumericsMode::Ggml, &[1.0; 7])
        .unwrap();
    let w = quantize_row(GgmlType::F32, &[2.0; 7]).unwrap();
    assert_eq!(vec_dot(GgmlType::F32, &w, &p), 14.0);
    for ty in DOT_TYPES {
        assert!(supports(ty));
    }
    assert!(!supports(GgmlType::Q8_1) && !supports(GgmlType::IQ2_XS) && !supports(GgmlType::Q8_K));
}

/// Rough kernel speed, for a human: `cargo test --release -p lockstep-engine --lib bench_vec_dot -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn bench_vec_dot_throughput() {
    let mut rng = Rng(5);
    let n = 1536;
    let rows = 2000;
    for ty in DOT_TYPES {
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| weight_row(ty, n, &mut rng))
            .collect();
        let rb = ty.bytes_for(n as u64).unwrap();
        let x = rng.vec(n, 1.0);
        for mode in [NumericsMode::Reference, NumericsMode::Ggml] {
            let p = prepared(ty, mode, &x);
            let t = std::time::Instant::now();
            let mut s = 0f32;
            for _ in 0..5 {
                for r in 0..rows {
                    s += vec_dot(ty, &w[r * rb..(r + 1) * rb], &p);
                }
            }
            let ns = t.elapsed().as_nanos() as f64 / (5.0 * rows as f64 * (n / 32) as f64);
            eprintln!("{ty:5} {mode:9} {ns:6.2} ns per 32 elements ({s})");
        }
    }
}

#[test]
fn ggml_path_routes_each_weight_type_as_llama_cpp_does() {
    use GgmlPath::*;
    for target in GgmlTarget::ALL {
        let ggml_path = |ty, rows, cols, n, t| ggml_path(ty, rows, cols, n, t, target);
        // Q4_0 with rows % 8 == 0 is repacked: gemm for the batch rows in groups of 4, gemv for the rest
        let q4_0: Vec<GgmlPath> = (0..6)
            .map(|t| ggml_path(GgmlType::Q4_0, 576, 576, 6, t))
            .collect();
        assert_eq!(
            q4_0,
            [RepackGemm, RepackGemm, RepackGemm, RepackGemm, RepackGemv, RepackGemv]
        );
        assert_eq!(ggml_path(GgmlType::Q4_0, 576, 576, 1, 0), RepackGemv);
        assert_eq!(ggml_path(GgmlType::Q4_0, 572, 576, 6, 0), VecDot);
        // float weights: tinyBLAS for batches of 2 and more, rows % 4 == 0, row length a multiple of
        // KN (AVX-512 build: 16, 32 for BF16 with AVX512-BF16; AVX2 build: 8), else the vec_dot kernels
        // of the build; without AVX512-BF16 BF16 takes its own kernels, F32 and F16 the AVX-512 ones
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let (tb, vd) = match target {
                GgmlTarget::Avx512NoBf16 if ty == GgmlType::BF16 => (TinyBlasNoBf16, VecDotNoBf16),
                GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => (TinyBlas, VecDot),
                GgmlTarget::Avx2 => (TinyBlasAvx2, VecDotAvx2),
            };
            assert_eq!(ggml_path(ty, 576, 576, 2, 1), tb, "{ty}");
            assert_eq!(ggml_path(ty, 576, 576, 1, 0), vd, "{ty}: decode");
            assert_eq!(ggml_path(ty, 578, 576, 9, 0), vd, "{ty}: rows % 4");
            assert_eq!(effective_path(ty, ggml_path(ty, 576, 576, 9, 0)), tb);
            // a row length of 8 · odd: tinyBLAS only in the AVX2 build
            let want = if target == GgmlTarget::Avx2 { tb } else { vd };
            assert_eq!(ggml_path(ty, 576, 40, 4, 0), want, "{ty}: k = 40");
        }
        assert_eq!(
            ggml_path(GgmlType::F16, 576, 48, 4, 0),
            match target {
                GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => TinyBlas,
                GgmlTarget::Avx2 => TinyBlasAvx2,
            }
        );
        // k = 48: KN 32 refuses it, KN 16 and 8 take it
        assert_eq!(
            ggml_path(GgmlType::BF16, 576, 48, 4, 0),
            match target {
                GgmlTarget::Avx512 => VecDot,
                GgmlTarget::Avx512NoBf16 => TinyBlasNoBf16,
                GgmlTarget::Avx2 => TinyBlasAvx2,
            }
        );
        // the float paths of one build do not exist for quantized weights, BF16's own not for F32/F16
        for p in [
            TinyBlas,
            TinyBlasAvx2,
            VecDotAvx2,
            TinyBlasNoBf16,
            VecDotNoBf16,
        ] {
            assert_eq!(effective_path(GgmlType::Q4_K, p), VecDot);
        }
        for ty in [GgmlType::F32, GgmlType::F16] {
            assert_eq!(effective_path(ty, TinyBlasNoBf16), VecDot);
            assert_eq!(effective_path(ty, VecDotNoBf16), VecDot);
        }
        // quantized types tinyBLAS_Q0 takes compute the vec_dot arithmetic
        assert_eq!(ggml_path(GgmlType::Q8_0, 576, 576, 9, 0), VecDot);
        // Q2_K is repacked (q2_K_8x8_q8_K) only by an AVX-512 build, and only with rows % 8 == 0;
        // otherwise it takes the tiled path from batch 8 on and vec_dot below
        let q2_k: Vec<GgmlPath> = (0..9)
            .map(|t| ggml_path(GgmlType::Q2_K, 576, 576, 9, t))
            .collect();
        let q2_k_decode = ggml_path(GgmlType::Q2_K, 576, 576, 1, 0);
        let q2_k_small = ggml_path(GgmlType::Q2_K, 576, 576, 6, 5);
        match target {
            GgmlTarget::Avx512 | GgmlTarget::Avx512NoBf16 => {
                assert_eq!(q2_k, [[RepackGemm; 8].as_slice(), &[RepackGemv]].concat());
                assert_eq!((q2_k_decode, q2_k_small), (RepackGemv, RepackGemv));
            }
            GgmlTarget::Avx2 => {
                assert_eq!(q2_k, [Tiled; 9]);
                assert_eq!((q2_k_decode, q2_k_small), (VecDot, VecDot));
            }
        }
        assert_eq!(
            ggml_path(GgmlType::Q2_K, 572, 576, 9, 0),
            Tiled,
            "{target:?}"
        );
        assert_eq!(
            ggml_path(GgmlType::Q2_K, 572, 576, 1, 0),
            VecDot,
            "{target:?}"
        );
        // the other K-quants are repacked (Q4_K) or not (Q3_K) the same way on both targets
        assert_eq!(ggml_path(GgmlType::Q4_K, 576, 576, 9, 8), RepackGemv);
        assert_eq!(ggml_path(GgmlType::Q3_K, 576, 576, 9, 0), Tiled);
    }
}

#[test]
fn repacked_q4_0_is_one_fma_per_block_of_the_exact_integer_dot() {
    // two blocks whose products are known: block 0 all q = 15 (value 7), block 1 all q = 0 (value -8)
    let d0 = fp::f32_to_f16_ref(0.5).to_le_bytes();
    let d1 = fp::f32_to_f16_ref(0.25).to_le_bytes();
    let mut w = Vec::new();
    w.extend_from_slice(&d0);
    w.extend_from_slice(&[0xFF; 16]);
    w.extend_from_slice(&d1);
    w.extend_from_slice(&[0x00; 16]);
    let xq: Vec<i8> = (0..64).map(|i| (i % 7) as i8 - 3).collect();
    let xd = [0.125f32, 3.0];
    let s0: i32 = xq[..32].iter().map(|&q| 7 * i32::from(q)).sum();
    let s1: i32 = xq[32..].iter().map(|&q| -8 * i32::from(q)).sum();
    let want = x86::fma(s1 as f32, 0.25 * 3.0, x86::fma(s0 as f32, 0.5 * 0.125, 0.0));
    for gemv in [false, true] {
        assert_eq!(
            q4_0::dot_q8_0_repacked(&w, &xq, &xd, gemv).to_bits(),
            want.to_bits()
        );
    }
    // a -128 activation quant (NaN input) against a negative weight: the gemv's sign form wraps
    let mut xq2 = xq.clone();
    xq2[32] = -128;
    let exact = q4_0::dot_q8_0_repacked(&w, &xq2, &xd, false);
    let wrapped = q4_0::dot_q8_0_repacked(&w, &xq2, &xd, true);
    assert_ne!(exact, wrapped);
}

#[test]
fn rounded_reference_rows_hold_the_ggml_activation_dequantized() {
    // the rounding probe: reference-mode dot products of the activation llama.cpp's kernels read
    let mut rng = Rng(0x0b5e_0000_0000_0077);
    for ty in DOT_TYPES {
        let n = 512;
        let x = rng.vec(n, 3.0);
        let w = weight_row(ty, n, &mut rng);
        let mut r = PreparedRow::new();
        r.prepare_rounded(ty, &x, false).unwrap();
        let g = prepared(ty, NumericsMode::Ggml, &x);
        // what the ggml row's kernels read, as f32
        let want: Vec<f32> = match g.activation_type().unwrap() {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => g.x.clone(),
            act => {
                // one scale per element
                let (q, d) = unpack_act(act, &g.blocks);
                q.iter()
                    .zip(&d)
                    .map(|(&q, &d)| (d * f64::from(q)) as f32)
                    .collect()
            }
        };
        assert!(r.x == want, "{ty}: not the activation ggml's kernels read");
        // every type but F32 (whose kernels read the f32 input) rounds
        assert_eq!(r.x != x, ty != GgmlType::F32, "{ty}: rounded or not");
        assert_eq!(r.mode(), NumericsMode::Reference, "{ty}");
        // its dot product is reference mode's on the rounded activation
        let plain = prepared(ty, NumericsMode::Reference, &want);
        assert_eq!(
            vec_dot(ty, &w, &r).to_bits(),
            vec_dot(ty, &w, &plain).to_bits(),
            "{ty}"
        );
    }
}

/// Issue 42: `--simd off` runs the portable dequantizers. [`dequantize_row_with`] under [`Simd::Off`] gives
/// the bits of each type's scalar `dequantize_block` (the table's `dequantize`, which it must be: no AVX2
/// form is reachable with SIMD off), and every other setting — and [`dequantize_row`], which takes the
/// best this CPU runs — gives the same bits (the AVX2 forms of Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K where
/// this CPU, under the `LOCKSTEP_CPU` cap, has AVX2). Random weight rows and random garbage blocks (NaN,
/// inf and subnormal scales), with `-0.0`/`+0.0` told apart; NaN payloads too for `off`, which runs the
/// very same code (a NaN's payload is not part of ggml's contract between kernels: `test_rng::same`).
#[test]
fn dequantize_row_off_is_the_portable_code_bit_for_bit() {
    let mut rng = Rng(0x5eed_0042_d00d_f00d);
    let n = 512;
    for ty in DOT_TYPES
        .into_iter()
        .chain([GgmlType::Q8_1, GgmlType::Q8_K])
    {
        let garbage: Vec<u8> = (0..ty.bytes_for(n as u64).unwrap())
            .map(|_| rng.next() as u8)
            .collect();
        let rows = if DOT_TYPES.contains(&ty) {
            vec![weight_row(ty, n, &mut rng), garbage]
        } else {
            vec![quantize_row(ty, &rng.vec(n, 3.0)).unwrap(), garbage]
        };
        for w in rows {
            let mut portable = vec![f32::NAN; n];
            (table::traits(ty).unwrap().dequantize)(&w, &mut portable);
            let mut off = vec![f32::NAN; n];
            dequantize_row_with(ty, &w, &mut off, Simd::Off).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&off),
                bits(&portable),
                "{ty}: off is not the portable code"
            );
            let same = |got: &[f32], what: &str| {
                for (i, (&g, &e)) in got.iter().zip(&portable).enumerate() {
                    assert!(
                        test_rng::same(g, e),
                        "{ty} {what} element {i}: {g:e} vs {e:e}"
                    );
                }
            };
            for simd in Simd::ALL {
                let mut got = vec![f32::NAN; n];
                dequantize_row_with(ty, &w, &mut got, simd).unwrap();
                same(&got, simd.name());
            }
            let mut got = vec![f32::NAN; n];
            dequantize_row(ty, &w, &mut got).unwrap();
            same(&got, "dequantize_row");
        }
        // the length check does not depend on the setting
        for simd in Simd::ALL {
            let mut short = vec![0f32; n - 1];
            assert!(dequantize_row_with(ty, &[0u8; 3], &mut short, simd).is_err());
        }
    }
}
