use super::attention::kqv_all_d;
use super::*;
use crate::kv_cache::KvCache;
use crate::numerics::GgmlTarget;
use crate::quant::x86::Emulated;

/// Ggml mode mirroring `target` with the kernels of `simd`.
fn ggml(target: GgmlTarget, simd: Simd) -> Numerics {
    Numerics::ggml(target).with_simd(simd)
}

const MODES: [NumericsMode; 2] = [NumericsMode::Reference, NumericsMode::Ggml];

#[test]
fn rms_norm_unit_rms() {
    let mut x = vec![3.0, -4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
    rms_norm(&mut x, &[1.0; 4], 0.0);
    // row 1: rms = sqrt(25/4) = 2.5
    assert!((x[0] - 1.2).abs() < 1e-6 && (x[1] + 1.6).abs() < 1e-6);
    assert_eq!(&x[4..], &[1.0; 4]);
}

#[test]
fn softmax_all_masked_is_zero_not_nan() {
    let mut x = vec![f32::NEG_INFINITY; 3];
    softmax_scaled(&mut x, 0.5);
    assert_eq!(x, vec![0.0; 3]);
    let mut y = vec![1.0, 2.0, f32::NEG_INFINITY];
    softmax_scaled(&mut y, 1.0);
    assert!((y.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    assert_eq!(y[2], 0.0);
}

#[test]
fn rope_position_zero_is_identity_and_rotation_preserves_norm() {
    for mode in MODES {
        let mut c = vec![0.0; 4];
        rope_cache(0, 10000.0, 4, &mut c);
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rope_norm(&mut x, 4, 4, &c, mode);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0]);
        rope_cache(5, 10000.0, 4, &mut c);
        rope_norm(&mut x, 4, 4, &c, mode);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
        // pair 0 rotated by θ = 5 rad
        assert!((x[0] - (5f32.cos() - 2.0 * 5f32.sin())).abs() < 1e-5);
    }
}

#[test]
fn simd_rope_gives_the_scalar_bits() {
    if !Simd::Avx2.available() {
        eprintln!("skipping: no AVX2+FMA on this CPU");
        return;
    }
    let (hd, rd) = (64, 48);
    let x: Vec<f32> = (0..9 * hd)
        .map(|i| (i as f32 * 0.77).sin() * 10f32.powi(i as i32 % 7 - 3))
        .collect();
    for pos in [0, 1, 17, 500, 30_000] {
        let mut c = vec![0.0; rd];
        rope_cache(pos, 10_000.0, rd, &mut c);
        type Rope = fn(&mut [f32], usize, usize, &[f32], Numerics);
        for rope in [rope_norm_simd as Rope, rope_neox_simd] {
            let (mut a, mut b) = (x.clone(), x.clone());
            rope(&mut a, hd, rd, &c, Numerics::new(NumericsMode::Ggml));
            rope(
                &mut b,
                hd,
                rd,
                &c,
                Numerics::new(NumericsMode::Ggml).with_simd(Simd::Avx2),
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "pos {pos}");
            if pos > 0 {
                assert_ne!(bits(&a), bits(&x), "pos {pos}: rotated");
            }
        }
    }
}

#[test]
fn swiglu_modes_agree_closely() {
    let gate: Vec<f32> = (0..70).map(|i| (i as f32 * 0.61).sin() * 6.0).collect();
    let up: Vec<f32> = (0..70).map(|i| (i as f32 * 0.23).cos()).collect();
    for t in GgmlTarget::ALL {
        let (mut a, mut b) = (gate.clone(), gate.clone());
        swiglu(
            &mut a,
            &up,
            35,
            Numerics {
                mode: NumericsMode::Reference,
                target: t,
                simd: Simd::Off,
            },
        );
        swiglu(
            &mut b,
            &up,
            35,
            Numerics {
                mode: NumericsMode::Ggml,
                target: t,
                simd: Simd::Off,
            },
        );
        if Simd::Avx2.available() {
            // the SIMD rows give the scalar replica's bits, with large, tiny and infinite inputs too
            let mut wide: Vec<f32> = (0..4000).map(|i| (i as f32 * 0.37).sin() * 120.0).collect();
            wide[17] = f32::INFINITY;
            wide[18] = f32::NEG_INFINITY;
            wide[19] = 1e-40;
            let up: Vec<f32> = (0..4000).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut c = wide.clone();
            swiglu(
                &mut c,
                &up,
                1000,
                Numerics {
                    mode: NumericsMode::Ggml,
                    target: t,
                    simd: Simd::Off,
                },
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            // rows of 1000 leave a tail of 8 past the sixteen-lane vectors (AVX-512's own loop)
            for simd in [Simd::Avx2, Simd::Avx512] {
                if simd.available() {
                    let mut d = wide.clone();
                    swiglu(
                        &mut d,
                        &up,
                        1000,
                        Numerics {
                            mode: NumericsMode::Ggml,
                            target: t,
                            simd,
                        },
                    );
                    assert_eq!(bits(&c), bits(&d), "{t} {simd:?}");
                }
            }
        }
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 4.0 * f32::EPSILON * x.abs().max(1e-30),
                "{t}: {x} vs {y}"
            );
        }
    }
}

#[test]
fn a_batch_of_queries_gives_the_bits_of_one_query_at_a_time() {
    // attention_ggml_batch runs every (query, run of heads) pair as one task of one parallel pass;
    // each output must be the one attention_ggml computes for that query alone
    let mut s = 0x0bad_cafe_1234_5678u64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for (n_head, n_kv, hd) in [(9, 3, 64), (4, 1, 256), (14, 2, 64)] {
        let (p0, n) = (5, 70);
        let mut cache = KvCache::new(1, n_kv, hd, p0 + n);
        for p in 0..p0 + n {
            let k: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
            cache.write(0, p, &k, &v).unwrap();
        }
        let qw = n_head * hd;
        let q: Vec<f32> = (0..n * qw).map(|_| rnd()).collect();
        let shape = AttnShape::causal(n_head, n_kv, hd);
        for simd in [Simd::Off, Simd::Avx2]
            .into_iter()
            .filter(|s| s.available())
        {
            let to = KqvOrder::TinyBlas;
            let mut scores = vec![0.0; attention_scratch_len(p0 + n)];
            let mut batch = vec![0.0; n * qw];
            pool.install(|| {
                let (sc, b) = (&mut scores, &mut batch);
                attention_ggml_batch(
                    &q,
                    &cache,
                    0,
                    n,
                    |t| p0 + t,
                    &shape,
                    sc,
                    b,
                    ggml(GgmlTarget::Avx512, simd),
                    to,
                )
            });
            for t in 0..n {
                let mut one = vec![0.0; qw];
                let qt = &q[t * qw..][..qw];
                attention_ggml(
                    qt,
                    &cache,
                    0,
                    p0 + t,
                    &shape,
                    &mut scores,
                    &mut one,
                    ggml(GgmlTarget::Avx512, simd),
                    to,
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&batch[t * qw..][..qw]),
                    bits(&one),
                    "{n_head}x{hd} query {t} {simd:?}"
                );
            }
        }
    }
}

#[test]
fn simd_attention_gives_the_scalar_bits_for_every_target_order_and_shape() {
    if !Simd::Avx2.available() {
        eprintln!("skipping: no AVX2+FMA on this CPU");
        return;
    }
    let mut s = 0x1234_5678_9abc_def1u64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
    };
    let mut cases = 0;
    for (n_head, n_kv, hd) in [(9, 3, 64), (4, 1, 256), (2, 2, 8), (14, 2, 64), (3, 1, 300)] {
        let n = 300;
        let mut cache = KvCache::new(1, n_kv, hd, n);
        for p in 0..n {
            let k: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..n_kv * hd).map(|_| rnd()).collect();
            cache.write(0, p, &k, &v).unwrap();
        }
        let q: Vec<f32> = (0..n_head * hd).map(|_| rnd()).collect();
        let mut scores = vec![0.0; attention_scratch_len(n)];
        for pos in [0, 1, 15, 16, 17, 63, 64, 100, 255, 299] {
            for window in [None, Some(7)] {
                let shape = AttnShape {
                    window,
                    ..AttnShape::causal(n_head, n_kv, hd)
                };
                for target in GgmlTarget::ALL {
                    for order in [KqvOrder::VecDot, KqvOrder::TinyBlas] {
                        let run = |simd: Simd, scores: &mut Vec<f32>| {
                            let mut out = vec![0.0; n_head * hd];
                            let num = ggml(target, simd);
                            attention_ggml(
                                &q, &cache, 0, pos, &shape, scores, &mut out, num, order,
                            );
                            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
                        };
                        let scalar = run(Simd::Off, &mut scores);
                        // the AVX2 kernels, and where this CPU has them the AVX-512 ones
                        // (32-register KQ and 64-wide KQV)
                        for simd in [Simd::Avx2, Simd::Avx512] {
                            if simd.available() {
                                assert_eq!(
                                    scalar,
                                    run(simd, &mut scores),
                                    "{simd:?} {n_head}x{hd} pos {pos} {window:?} {target} \
                                     {order:?}"
                                );
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cases, 5 * 10 * 2 * GgmlTarget::ALL.len() * 2);
}

#[test]
fn kqv_for_every_output_at_once_equals_the_per_output_ggml_dot_products() {
    // kqv_all_d claims each output sees exactly the operations of ggml_vec_dot_f32 (decode) or of
    // tinyBLAS (prompt batch) over a strided V column: hold it to those replicas, for every target,
    // bit for bit (the AVX2 reductions of the two kernels differ in their order) — the portable walk,
    // and the AVX2 and AVX-512 kernels where this CPU has them (64-wide heads, 128, 256, 8)
    kqv_case::<Emulated>();
    #[cfg(target_arch = "x86_64")]
    {
        use crate::quant::x86::{Hardware, HardwareAvx512};
        if crate::numerics::cpu_has("avx2") && crate::numerics::cpu_has("fma") {
            kqv_case::<Hardware>();
            if crate::numerics::cpu_has("avx512f") && crate::numerics::cpu_has("avx512vl") {
                kqv_case::<HardwareAvx512>();
            }
        }
    }
}

fn kqv_case<F: crate::quant::x86::Fma>() {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    };
    let mut acc = Vec::new();
    for hd in [8, 64, 128, 256] {
        for n_pos in [1, 17, 64, 100] {
            let values: Vec<f32> = (0..n_pos * hd).map(|_| rnd()).collect();
            let v = |i: usize, d: usize| if i < n_pos { values[i * hd + d] } else { 0.0 };
            for target in GgmlTarget::ALL {
                for order in [KqvOrder::VecDot, KqvOrder::TinyBlas] {
                    let k = match order {
                        KqvOrder::VecDot => attention_scratch_len(n_pos),
                        KqvOrder::TinyBlas => n_pos.div_ceil(ggml_cpu::LANES) * ggml_cpu::LANES,
                    };
                    // one to three query heads sharing this V (a run of the kernels' heads)
                    for run in 1..=3 {
                        let p: Vec<f32> = (0..run * k)
                            .map(|i| if i % k < n_pos { rnd().abs() } else { 0.0 })
                            .collect();
                        let mut out = vec![0.0; run * hd];
                        kqv_all_d::<F>(
                            target,
                            order,
                            &values,
                            n_pos,
                            hd,
                            (&p, k, k),
                            run,
                            &mut out,
                            &mut acc,
                        );
                        for (j, out) in out.chunks_exact(hd).enumerate() {
                            let p = &p[j * k..][..k];
                            for (d, &o) in out.iter().enumerate() {
                                let want =
                                    match order {
                                        KqvOrder::VecDot => ggml_cpu::vec_dot_f32_by::<Emulated>(
                                            target,
                                            k,
                                            |i| v(i, d),
                                            p,
                                        ),
                                        KqvOrder::TinyBlas => ggml_cpu::tinyblas_dot_f32_by::<
                                            Emulated,
                                        >(
                                            target, k, |i| v(i, d), p
                                        ),
                                    };
                                assert_eq!(
                                    o.to_bits(),
                                    want.to_bits(),
                                    "hd {hd} n_pos {n_pos} {target} {order:?} run {run} head {j} d {d}: \
                                     {o} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn attention_single_position_returns_value() {
    for mode in MODES {
        let mut cache = KvCache::new(1, 1, 2, 4);
        cache.write(0, 0, &[1.0, 0.0], &[5.0, 6.0]).unwrap();
        let mut out = vec![0.0; 4];
        let mut scores = vec![0.0; attention_scratch_len(1)];
        // two query heads share one kv head
        attention(
            &[1.0, 1.0, -1.0, 2.0],
            &cache,
            0,
            0,
            &AttnShape::causal(2, 1, 2),
            &mut scores,
            &mut out,
            Numerics {
                mode,
                target: GgmlTarget::Avx2,
                simd: Simd::Off,
            },
            KqvOrder::VecDot,
        );
        assert_eq!(out, vec![5.0, 6.0, 5.0, 6.0]);
    }
}

#[test]
fn sliding_window_sees_only_the_last_window_positions() {
    // values are one-hot per position; a query equal to every key gives equal weights to the visible
    // positions, so the output is the mean of their one-hot vectors
    let (hd, n) = (8, 8);
    let mut cache = KvCache::new(1, 1, hd, n);
    for p in 0..n {
        let mut v = vec![0.0; hd];
        v[p] = 1.0;
        cache.write(0, p, &[0.0; 8], &v).unwrap();
    }
    for mode in MODES {
        for (window, first) in [(None, 0), (Some(3), 5), (Some(1), 7), (Some(100), 0)] {
            let shape = AttnShape {
                window,
                ..AttnShape::causal(1, 1, hd)
            };
            let mut out = vec![0.0; hd];
            let mut scores = vec![0.0; attention_scratch_len(n)];
            let q = [0.0; 8];
            attention(
                &q,
                &cache,
                0,
                7,
                &shape,
                &mut scores,
                &mut out,
                Numerics {
                    mode,
                    target: GgmlTarget::Avx512,
                    simd: Simd::Off,
                },
                KqvOrder::VecDot,
            );
            let w = 1.0 / (n - first) as f32;
            for (p, &o) in out.iter().enumerate() {
                let want = if p >= first { w } else { 0.0 };
                assert!(
                    (o - want).abs() < 1e-6,
                    "{mode:?} {window:?} pos {p}: {o} vs {want}"
                );
            }
        }
    }
}

#[test]
fn rope_neox_pairs_halves_and_matches_norm_on_permuted_input() {
    // NeoX on [a0..a(h-1), b0..b(h-1)] equals NORM on the interleaved [a0, b0, a1, b1, ...]
    let (hd, rd) = (8, 8);
    let x: Vec<f32> = (0..hd).map(|i| i as f32 * 0.3 - 1.0).collect();
    let mut c = vec![0.0; rd];
    rope_cache(11, 10000.0, rd, &mut c);
    for mode in MODES {
        let mut neox = x.clone();
        rope_neox(&mut neox, hd, rd, &c, mode);
        let mut inter: Vec<f32> = (0..hd / 2).flat_map(|i| [x[i], x[i + hd / 2]]).collect();
        rope_norm(&mut inter, hd, rd, &c, mode);
        let back: Vec<f32> = (0..hd)
            .map(|i| {
                if i < hd / 2 {
                    inter[2 * i]
                } else {
                    inter[2 * (i - hd / 2) + 1]
                }
            })
            .collect();
        assert_eq!(neox, back, "{mode:?}");
    }
}

#[test]
fn ggml_attention_orders_agree_up_to_16_positions_then_differ() {
    let (hd, n) = (8, 80);
    let mut cache = KvCache::new(1, 1, hd, n);
    let val = |i: usize, s: f32| ((i as f32 * s).sin() * 3.0) + 0.1;
    for p in 0..n {
        let k: Vec<f32> = (0..hd).map(|d| val(p * hd + d, 0.37)).collect();
        let v: Vec<f32> = (0..hd).map(|d| val(p * hd + d, 0.91)).collect();
        cache.write(0, p, &k, &v).unwrap();
    }
    let q: Vec<f32> = (0..hd).map(|d| val(d, 1.3)).collect();
    let mut scores = vec![0.0; attention_scratch_len(n)];
    let mut differ = 0;
    for pos in 0..n {
        let mut a = vec![0.0; hd];
        let mut b = vec![0.0; hd];
        attention_ggml(
            &q,
            &cache,
            0,
            pos,
            &AttnShape::causal(1, 1, hd),
            &mut scores,
            &mut a,
            ggml(GgmlTarget::Avx512, Simd::Off),
            KqvOrder::TinyBlas,
        );
        attention_ggml(
            &q,
            &cache,
            0,
            pos,
            &AttnShape::causal(1, 1, hd),
            &mut scores,
            &mut b,
            ggml(GgmlTarget::Avx512, Simd::Off),
            KqvOrder::VecDot,
        );
        if pos < 16 {
            assert_eq!(a, b, "pos {pos}");
        } else if a != b {
            differ += 1;
        }
        let mut r = vec![0.0; hd];
        attention(
            &q,
            &cache,
            0,
            pos,
            &AttnShape::causal(1, 1, hd),
            &mut scores,
            &mut r,
            Numerics {
                mode: NumericsMode::Reference,
                target: GgmlTarget::Avx512,
                simd: Simd::Off,
            },
            KqvOrder::TinyBlas,
        );
        for (x, y) in a.iter().zip(&r) {
            assert!(
                (x - y).abs() < 1e-5 * (1.0 + y.abs()),
                "pos {pos}: {x} vs {y}"
            );
        }
    }
    assert!(differ > 0, "the two accumulation orders never differed");
}

#[test]
fn layer_norm_zero_mean_unit_variance_then_weight_and_bias() {
    // rows of 37: a 16-lane block, a second one (AVX-512) or four 8-lane ones (AVX2), and a scalar tail
    let width = 37;
    let row: Vec<f32> = (0..width)
        .map(|i| (i as f32 * 0.37).sin() * 3.0 + 1.5)
        .collect();
    let (w, b) = (vec![2.0f32; width], vec![0.25f32; width]);
    for num in [
        Numerics::new(NumericsMode::Reference),
        ggml(GgmlTarget::Avx2, Simd::Off),
        ggml(GgmlTarget::Avx512, Simd::Off),
    ] {
        let mut x = row.clone();
        layer_norm(&mut x, &w, Some(&b), 0.0, num);
        let y: Vec<f64> = x.iter().map(|&v| (v as f64 - 0.25) / 2.0).collect();
        let mean = y.iter().sum::<f64>() / width as f64;
        let var = y.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / width as f64;
        assert!(
            mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5,
            "{num:?}: {mean} {var}"
        );
        let mut no_bias = row.clone();
        layer_norm(&mut no_bias, &w, None, 0.0, num);
        assert!(x
            .iter()
            .zip(&no_bias)
            .all(|(a, c)| a - c == 0.25 || (a - c - 0.25).abs() < 1e-6));
    }
}

#[test]
fn layer_norm_ggml_variance_sums_lane_blocks_per_target() {
    // values whose squared deviations round differently when summed in f32 blocks than one at a time in
    // f64: the targets' trees and the reference order must not all agree bit for bit on every row, and
    // each must be within an f32 rounding of the others
    let width = 64;
    let mut differ = false;
    for seed in 0..64u32 {
        let row: Vec<f32> = (0..width)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 1000) as f32
                    * 1e-3
                    + 1e3
            })
            .collect();
        let out: Vec<Vec<f32>> = [
            Numerics::new(NumericsMode::Reference),
            ggml(GgmlTarget::Avx2, Simd::Off),
            ggml(GgmlTarget::Avx512, Simd::Off),
        ]
        .iter()
        .map(|&num| {
            let mut x = row.clone();
            layer_norm(&mut x, &[1.0; 64], None, 1e-5, num);
            x
        })
        .collect();
        differ |= out[0] != out[1] || out[1] != out[2];
        for o in &out[1..] {
            assert!(o
                .iter()
                .zip(&out[0])
                .all(|(a, b)| (a - b).abs() < 1e-4 * b.abs().max(1.0)));
        }
    }
    assert!(
        differ,
        "the summation orders never mattered: the test values are too tame"
    );
}

#[test]
fn gelu_ggml_is_the_f16_table_and_reference_the_f32_formula() {
    let x: Vec<f32> = (-60..60).map(|i| i as f32 * 0.2 + 0.013).collect();
    let mut g = x.clone();
    gelu(&mut g, NumericsMode::Ggml);
    let mut via_geglu = x.clone();
    geglu(
        &mut via_geglu,
        &vec![1.0; x.len()],
        x.len(),
        NumericsMode::Ggml,
    );
    assert_eq!(g, via_geglu, "gelu(x) = geglu(x, 1) in ggml mode");
    let mut r = x.clone();
    gelu(&mut r, NumericsMode::Reference);
    for ((&xi, &gi), &ri) in x.iter().zip(&g).zip(&r) {
        assert_eq!(ri, gelu_tanh(xi));
        assert!(
            (gi - ri).abs() <= 2e-3 * ri.abs().max(1.0),
            "{xi}: {gi} vs {ri}"
        );
    }
}

#[test]
fn partial_rotary_leaves_the_dims_past_rope_dim_alone() {
    let (hd, rd) = (64, 16);
    let x: Vec<f32> = (0..2 * hd).map(|i| (i as f32 * 0.1).cos()).collect();
    let mut cache = vec![0.0; rd];
    rope_cache(5, 10000.0, rd, &mut cache);
    for mode in MODES {
        let mut y = x.clone();
        rope_neox(&mut y, hd, rd, &cache, mode);
        for h in 0..2 {
            assert_eq!(&y[h * hd + rd..(h + 1) * hd], &x[h * hd + rd..(h + 1) * hd]);
            assert_ne!(&y[h * hd..h * hd + rd], &x[h * hd..h * hd + rd]);
        }
    }
}
