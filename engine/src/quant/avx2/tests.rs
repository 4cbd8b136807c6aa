//! Each SIMD kernel against its scalar replica, in the style of llama.cpp's test-backend-ops: many
//! shapes, random block bytes (any f16 scale bit pattern: NaN, infinities, subnormals) and
//! activations quantized by ggml mode's own `from_float`, NaN inputs included.
use super::super::test_rng::{same, Rng};
use super::super::{simd_kernel, vec_dot_path, GgmlPath, GgmlType, PreparedRow};
use crate::numerics::NumericsMode;
use crate::numerics::{GgmlTarget, Numerics, Simd};

/// Random block bytes whose f16 scales are random bit patterns half of the time and ordinary
/// magnitudes otherwise (so that most results are finite and every rounding shows).
fn weight_row(ty: GgmlType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = ty.bytes_for((nb * ty.block_size()) as u64).unwrap();
    let per = bytes / nb;
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    for blk in w.chunks_exact_mut(per) {
        if rng.next().is_multiple_of(2) {
            let d = half::f16::from_f32(((rng.next() % 1000) as f32 + 1.0) * 1e-5);
            blk[0..2].copy_from_slice(&d.to_le_bytes());
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                let m = half::f16::from_f32(-((rng.next() % 1000) as f32) * 1e-4);
                blk[2..4].copy_from_slice(&m.to_le_bytes());
            }
        }
    }
    w
}

/// `count` random activation rows of `n` elements prepared for `ty` in ggml mode; NaN inputs only if
/// `nan` (they quantize to −128).
fn activation_rows(
    ty: GgmlType,
    n: usize,
    count: usize,
    nan: bool,
    rng: &mut Rng,
) -> Vec<PreparedRow> {
    (0..count)
        .map(|_| {
            let x: Vec<f32> = (0..n)
                .map(|_| match rng.activation(512, true) {
                    v if v.is_nan() && !nan => 0.5,
                    v => v,
                })
                .collect();
            let mut p = PreparedRow::new();
            p.prepare(ty, NumericsMode::Ggml, &x).unwrap();
            p
        })
        .collect()
}

#[test]
fn avx2_quantizer_writes_the_scalar_bytes() {
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: no AVX2+FMA+F16C on this CPU");
        return;
    }
    let mut rng = Rng(0x51ed_2701_aa55_0f0f);
    let specials = [
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        -1e-40,
        3e38,
        -3e38,
        1e-30,
        0.5,
        -0.5,
    ];
    for case in 0..200 {
        let n = 32 * (1 + case % 9);
        let mut x: Vec<f32> = (0..n).map(|_| rng.activation(512, true)).collect();
        match case % 4 {
            // a whole block of zeros (max 0 → id 0), and single specials
            0 => x[..32].fill(0.0),
            1 => x[(rng.next() as usize) % n] = specials[(case / 4) % specials.len()],
            // exact ties x·id = k + 0.5 round to even
            2 => {
                for (i, v) in x[..32].iter_mut().enumerate() {
                    *v = (i as f32 - 16.0) + 0.5;
                }
                x[31] = 127.0;
            }
            _ => {}
        }
        let (mut a, mut b) = (PreparedRow::new(), PreparedRow::new());
        a.prepare_simd(GgmlType::Q8_0, NumericsMode::Ggml, &x, false)
            .unwrap();
        b.prepare_simd(GgmlType::Q8_0, NumericsMode::Ggml, &x, true)
            .unwrap();
        assert_eq!(a.blocks, b.blocks, "case {case}: block bytes");
        assert_eq!(a.qs, b.qs, "case {case}: quants");
        assert_eq!(a.qu, b.qu, "case {case}: offset quants");
        let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.d), bits(&b.d), "case {case}: scales");
        assert_eq!(a.has_min_quant, b.has_min_quant, "case {case}: −128 flag");
    }
}

/// Every SIMD setting this CPU runs besides `off`.
fn simd_settings() -> Vec<Simd> {
    Simd::ALL
        .into_iter()
        .filter(|s| *s != Simd::Off && s.available())
        .collect()
}

#[test]
fn simd_kernels_give_the_scalar_kernels_bits() {
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: this CPU has no AVX2+FMA+F16C (the scalar path is the only one)");
        return;
    }
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut cases = 0;
    let mut with_min_quant = 0;
    for simd in simd_settings() {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
        ] {
            let k = simd_kernel(Numerics::ggml(GgmlTarget::default()).with_simd(simd), ty)
                .expect("a SIMD kernel");
            let vd = GgmlPath::VecDot;
            for nb in (1..=24).chain([36, 48, 64, 96, 192]) {
                let n = nb * 32;
                for _ in 0..6 {
                    let w = weight_row(ty, nb, &mut rng);
                    // one call in four has rows with NaN inputs (a −128 quant: the AVX-512 tiles
                    // hand such calls to the AVX2 kernels); the others none
                    let nan = rng.next().is_multiple_of(4);
                    let xs = activation_rows(ty, n, 8, nan, &mut rng);
                    with_min_quant += xs.iter().filter(|p| p.has_min_quant).count();
                    let want: Vec<f32> = xs
                        .iter()
                        .map(|p| vec_dot_path(ty, &w, p, GgmlPath::VecDot))
                        .collect();
                    let x8: [&PreparedRow; 8] = std::array::from_fn(|j| &xs[j]);
                    let eight = k.dot([&w], x8, [vd; 8])[0];
                    let four = k.dot([&w], [&xs[0], &xs[1], &xs[2], &xs[3]], [vd; 4])[0];
                    // another row between two copies of this one in a 3-row call (kernels that
                    // take weight rows in pairs): each row gives its own bits (a NaN's sign and
                    // payload are not part of the contract)
                    let w2 = weight_row(ty, nb, &mut rng);
                    let rows3 = k.dot([&w, &w2, &w], x8, [vd; 8]);
                    for r in [rows3[0], rows3[2]] {
                        for (a, b) in r.iter().zip(&eight) {
                            assert!(
                                same(*a, *b),
                                "{simd} {ty} nb {nb}: 3-row {a:e} vs 1-row {b:e}"
                            );
                        }
                    }
                    for (j, x) in xs.iter().enumerate() {
                        let want2 = vec_dot_path(ty, &w2, x, vd);
                        let got = rows3[1][j];
                        assert!(
                            same(got, want2),
                            "{simd} {ty} nb {nb} row 2: {got:e} vs {want2:e}"
                        );
                    }
                    for j in 0..8 {
                        let one = k.dot([&w], [&xs[j]], [vd])[0][0];
                        let x4 = if j < 4 { four[j] } else { eight[j] };
                        assert!(
                            same(one, want[j]) && same(eight[j], want[j]) && same(x4, want[j]),
                            "{simd} {ty} nb {nb} row {j}: scalar {:e} ({:#x}), simd x1 {one:e}, \
                             x4 {x4:e}, x8 {:e}",
                            want[j],
                            want[j].to_bits(),
                            eight[j]
                        );
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(
        cases > 1000 && with_min_quant > 10,
        "{cases} {with_min_quant}"
    );
}

/// Random K-quant super-blocks: random bytes, with the f16 super-block scales (`d`, and Q4_K's
/// `dmin`) set to ordinary magnitudes most of the time and left as random bit patterns otherwise.
fn k_quant_row(ty: GgmlType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    let per = ty.type_size();
    let mut w: Vec<u8> = (0..nb * per).map(|_| rng.next() as u8).collect();
    for blk in w.chunks_exact_mut(per) {
        if !rng.next().is_multiple_of(8) {
            let mut f16 = |lo: f32| {
                half::f16::from_f32(((rng.next() % 1000) as f32 + lo) * 1e-5).to_le_bytes()
            };
            // where each type keeps `d` (and `dmin`, for the types with mins)
            let (d_at, dmin_at) = match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => (0, Some(2)),
                GgmlType::Q2_K => (80, Some(82)),
                GgmlType::Q3_K => (108, None),
                GgmlType::IQ4_XS => (0, None),
                _ => (208, None),
            };
            blk[d_at..d_at + 2].copy_from_slice(&f16(1.0));
            if let Some(m) = dmin_at {
                blk[m..m + 2].copy_from_slice(&f16(0.0));
            }
        }
    }
    w
}

#[test]
fn k_quant_simd_kernels_give_the_scalar_bits_on_every_ggml_path() {
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: this CPU has no AVX2+FMA+F16C (the scalar path is the only one)");
        return;
    }
    use GgmlPath::*;
    let mut rng = Rng(0x0dd_ba11_cafe_f00d);
    let mut cases = 0;
    for (ty, paths, simd) in [
        (
            GgmlType::Q4_K,
            [RepackGemv, RepackGemm, Tiled, VecDot],
            Simd::Avx2,
        ),
        (GgmlType::Q6_K, [VecDot, Tiled, VecDot, Tiled], Simd::Avx2),
        (
            GgmlType::Q2_K,
            [RepackGemv, RepackGemm, Tiled, VecDot],
            Simd::Avx2,
        ),
        (GgmlType::Q3_K, [VecDot, Tiled, Tiled, VecDot], Simd::Avx2),
        (GgmlType::Q5_K, [Tiled, VecDot, VecDot, Tiled], Simd::Avx2),
        (GgmlType::IQ4_XS, [VecDot, Tiled, VecDot, Tiled], Simd::Avx2),
        (GgmlType::Q5_K, [Tiled, VecDot, VecDot, Tiled], Simd::Avx512),
        (
            GgmlType::Q2_K,
            [Tiled, RepackGemm, VecDot, RepackGemv],
            Simd::Avx512,
        ),
        (GgmlType::Q3_K, [Tiled, VecDot, Tiled, VecDot], Simd::Avx512),
        (
            GgmlType::IQ4_XS,
            [Tiled, VecDot, Tiled, VecDot],
            Simd::Avx512,
        ),
    ] {
        if !simd.available() {
            continue;
        }
        let k = simd_kernel(Numerics::ggml(GgmlTarget::default()).with_simd(simd), ty)
            .expect("a SIMD kernel");
        for nb in [1, 2, 3, 4, 7, 19] {
            for _ in 0..6 {
                let w = k_quant_row(ty, nb, &mut rng);
                let xs: Vec<PreparedRow> = (0..8)
                    .map(|_| {
                        let x: Vec<f32> =
                            (0..nb * 256).map(|_| rng.activation(512, true)).collect();
                        let mut p = PreparedRow::new();
                        p.prepare(ty, NumericsMode::Ggml, &x).unwrap();
                        p
                    })
                    .collect();
                let xs4 = [&xs[0], &xs[1], &xs[2], &xs[3]];
                // every path in one call (as in a batch whose tail rows take another kernel), and
                // each path on its own for every row
                let mixed = k.dot([&w, &w], xs4, paths);
                // eight rows on one path (a prompt's group of tokens), each row its own bits
                let x8: [&PreparedRow; 8] = std::array::from_fn(|j| &xs[j]);
                for p in [Tiled, VecDot, RepackGemm] {
                    let got = k.dot([&w], x8, [p; 8])[0];
                    for (j, x) in xs.iter().enumerate() {
                        let want = vec_dot_path(ty, &w, x, p);
                        assert!(
                            same(got[j], want),
                            "{ty} nb {nb} {p:?} x8 row {j}: simd {:e} vs scalar {want:e}",
                            got[j]
                        );
                    }
                }
                for (j, &p) in paths.iter().enumerate() {
                    let want = vec_dot_path(ty, &w, &xs[j], p);
                    for (r, row) in mixed.iter().enumerate() {
                        assert!(
                            same(row[j], want),
                            "{ty} nb {nb} {p:?} row {r}: simd {:e} vs scalar {want:e}",
                            row[j]
                        );
                    }
                    for p in [VecDot, Tiled, RepackGemv, RepackGemm] {
                        // a path without a kernel of its own for the type (the repacked ones but for
                        // Q4_K and Q2_K) is the vec_dot kernel, in SIMD and scalar alike
                        let want = vec_dot_path(ty, &w, &xs[j], p);
                        let one = k.dot([&w], [&xs[j]], [p])[0][0];
                        assert!(same(one, want), "{ty} nb {nb} {p:?}: {one:e} vs {want:e}");
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases > 500, "{cases}");
}

/// The K-quant kernels at the edges of their integer steps: every weight code at its largest (bytes
/// 0xFF: Q5_K's 31, Q3_K's 3, IQ4_XS's 113 and the largest scales) or smallest (0x00: Q3_K's −4, IQ4_XS's
/// −127, scales −32) against activation rows whose Q8_K quants are all −127 (a constant row) or
/// alternate −127 / 127, and a row with NaN inputs, so that a saturating `maddubs` pair would show.
/// (`quantize_row_q8_K` never writes −128: `iscale = −127/max`, and a NaN gives a code ≥ 0.)
#[test]
fn k_quant_simd_kernels_give_the_scalar_bits_on_extreme_blocks() {
    use GgmlPath::*;
    let mut rng = Rng(0xed6e_0001_1234_5678);
    let mut cases = 0;
    for simd in simd_settings() {
        for ty in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q5_K,
            GgmlType::IQ4_XS,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let k = simd_kernel(Numerics::ggml(GgmlTarget::default()).with_simd(simd), ty)
                .expect("a SIMD kernel");
            let nb = 3;
            let n = nb * 256;
            let xs: Vec<PreparedRow> = [
                (0..n).map(|_| 1.5).collect::<Vec<f32>>(),
                (0..n).map(|_| -0.25).collect(),
                (0..n)
                    .map(|i| if i % 2 == 0 { 2.0 } else { -2.0 })
                    .collect(),
                (0..n)
                    .map(|i| if i % 3 == 0 { -3.0 } else { 3.0 })
                    .collect(),
                (0..n).map(|_| 0.0).collect(),
                (0..n).map(|_| rng.activation(512, true)).collect(),
                (0..n)
                    .map(|i| if i % 16 < 8 { 1.0 } else { -1.0 })
                    .collect(),
                (0..n).map(|i| (i % 7) as f32 - 3.0).collect(),
                (0..n)
                    .map(|i| if i % 5 == 0 { f32::NAN } else { -1.0 })
                    .collect(),
            ]
            .iter()
            .map(|x| {
                let mut p = PreparedRow::new();
                p.prepare(ty, NumericsMode::Ggml, x).unwrap();
                p
            })
            .collect();
            assert!(
                xs[0].qs.iter().all(|&q| q == -127),
                "a constant row quantizes to -127"
            );
            let x8: [&PreparedRow; 8] = std::array::from_fn(|j| &xs[j]);
            for fill in [0xFFu8, 0x00, 0xAA, 0x55, 0x0F, 0xF0] {
                // the codes and scales from `fill`, the f16 scales ordinary (k_quant_row's places)
                let mut w = k_quant_row(ty, nb, &mut rng);
                let d = w.clone();
                w.fill(fill);
                for (blk, src) in w
                    .chunks_exact_mut(ty.type_size())
                    .zip(d.chunks_exact(ty.type_size()))
                {
                    let at: &[usize] = match ty {
                        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 1, 2, 3],
                        GgmlType::Q2_K => &[80, 81, 82, 83],
                        GgmlType::Q3_K => &[108, 109],
                        GgmlType::IQ4_XS => &[0, 1],
                        _ => &[208, 209],
                    };
                    for &i in at {
                        blk[i] = src[i];
                    }
                }
                for p in [VecDot, Tiled, RepackGemv, RepackGemm] {
                    let got = k.dot([&w], x8, [p; 8])[0];
                    let got = got
                        .iter()
                        .copied()
                        .chain([k.dot([&w], [&xs[8]], [p])[0][0]]);
                    for (j, (x, got)) in xs.iter().zip(got).enumerate() {
                        let want = vec_dot_path(ty, &w, x, p);
                        let one = k.dot([&w], [x], [p])[0][0];
                        assert!(
                            same(got, want) && same(one, want),
                            "{simd} {ty} fill {fill:#x} {p:?} row {j}: x8 {got:e}, x1 {one:e}, \
                             scalar {want:e}"
                        );
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 6 * 6 * 4 * 9, "{cases}");
}

/// A float weight row of `n` elements: ordinary magnitudes, with one element in eight a random bit
/// pattern (NaN, infinities, subnormals) and one in eight tiny (`dpbf16`'s flushing shows).
fn float_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w = Vec::new();
    // one row in four of the smallest normals only: every product with an activation below 1 is
    // subnormal (flushed by `dpbf16`, kept by `fma`)
    let tiny_row = rng.next().is_multiple_of(4);
    for _ in 0..n {
        let raw = rng.next();
        let scale = if tiny_row || raw % 8 == 1 {
            1.2e-38
        } else {
            1e-3
        };
        let v = ((rng.next() % 2001) as f32 - 1000.0) * scale;
        let odd = raw.is_multiple_of(8);
        match ty {
            GgmlType::F32 if odd && !tiny_row => w.extend_from_slice(&(raw as u32).to_le_bytes()),
            GgmlType::F32 => w.extend_from_slice(&v.to_le_bytes()),
            GgmlType::F16 if odd && !tiny_row => w.extend_from_slice(&(raw as u16).to_le_bytes()),
            GgmlType::F16 => w.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            _ if odd && !tiny_row => w.extend_from_slice(&(raw as u16).to_le_bytes()),
            _ => w.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
        }
    }
    w
}

#[test]
fn float_and_repacked_4_bit_simd_kernels_give_the_scalar_bits_on_every_ggml_path() {
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: this CPU has no AVX2+FMA+F16C (the scalar path is the only one)");
        return;
    }
    use GgmlPath::*;
    let mut rng = Rng(0xf10a_7000_0000_0042);
    let mut cases = 0;
    for simd in simd_settings() {
        let types = [
            GgmlType::Q4_0,
            GgmlType::IQ4_NL,
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
        ];
        for ty in types {
            let k = simd_kernel(Numerics::ggml(GgmlTarget::default()).with_simd(simd), ty)
                .expect("a SIMD kernel");
            let nibbles = matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4_NL);
            for n in [32, 64, 96, 160, 576, 1536, 40, 200, 1000] {
                if nibbles && n % 32 != 0 {
                    continue;
                }
                for trial in 0..6 {
                    // every build's kernels (AVX-512: VecDot, TinyBlas; AVX-512 without AVX512-BF16:
                    // VecDotNoBf16, TinyBlasNoBf16, BF16's own, the others' VecDot for F32/F16; AVX2:
                    // VecDotAvx2, TinyBlasAvx2), mixed in one call and alone
                    let paths = match (nibbles, trial) {
                        // a call with a row that is not repacked runs the scalar kernels
                        (true, 3) => [RepackGemv, TinyBlasQ0, VecDot, RepackGemm],
                        (true, _) => [RepackGemv, RepackGemm, RepackGemm, RepackGemv],
                        (_, 0) => [TinyBlas, VecDot, TinyBlas, VecDot],
                        (_, 1) => [TinyBlasAvx2, VecDotAvx2, TinyBlasAvx2, VecDotAvx2],
                        (_, 2) => [TinyBlasAvx2; 4],
                        (_, 3) => [VecDotAvx2, TinyBlas, TinyBlasAvx2, VecDot],
                        (_, 4) => [TinyBlasNoBf16, VecDotNoBf16, TinyBlas, VecDotNoBf16],
                        _ => [TinyBlasNoBf16; 4],
                    };
                    let w = if nibbles {
                        weight_row(ty, n / 32, &mut rng)
                    } else {
                        float_row(ty, n, &mut rng)
                    };
                    let nan = rng.next().is_multiple_of(3);
                    let xs = activation_rows(ty, n, 4, nan, &mut rng);
                    let xs4 = [&xs[0], &xs[1], &xs[2], &xs[3]];
                    let w2 = weight_row_like(ty, &w, &mut rng);
                    let got = k.dot([&w, &w2], xs4, paths);
                    for (r, row) in [&w, &w2].iter().enumerate() {
                        for (j, &p) in paths.iter().enumerate() {
                            let want = vec_dot_path(ty, row, &xs[j], p);
                            assert!(
                                same(got[r][j], want),
                                "{simd} {ty} n {n} {p:?} row {r}: simd {:e} vs scalar {want:e}",
                                got[r][j]
                            );
                            let one = k.dot([row], [&xs[j]], [p])[0][0];
                            assert!(same(one, want), "{simd} {ty} n {n} {p:?}: {one:e}");
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 500, "{cases}");
}

#[test]
fn repacked_4_bit_kernels_give_the_scalar_bits_one_or_eight_tokens_at_a_time() {
    if !crate::numerics::avx2_available() {
        eprintln!("skipping: this CPU has no AVX2+FMA+F16C (the scalar path is the only one)");
        return;
    }
    use GgmlPath::*;
    let mut rng = Rng(0x4e9a_c4ed_0000_0008);
    let mut cases = 0;
    let mut with_min_quant = 0;
    for simd in simd_settings() {
        for ty in [GgmlType::Q4_0, GgmlType::IQ4_NL] {
            let k = simd_kernel(Numerics::ggml(GgmlTarget::default()).with_simd(simd), ty)
                .expect("a SIMD kernel");
            for nb in [1, 2, 18, 48] {
                let n = nb * 32;
                let w: Vec<Vec<u8>> = (0..35).map(|_| weight_row(ty, nb, &mut rng)).collect();
                let nan = rng.next().is_multiple_of(3);
                let mut xs = activation_rows(ty, n, 8, nan, &mut rng);
                if nb == 2 {
                    // a −128 quant in the decode token and in one prompt token, constructed: the
                    // draws alone reach one only on hosts that iterate more settings (issue 41)
                    xs[0] = activation_row_with_min_quant(ty, n, &mut rng);
                    xs[5] = activation_row_with_min_quant(ty, n, &mut rng);
                }
                with_min_quant += usize::from(xs[0].has_min_quant);
                // a decode step: 35 rows against one token (the eight-row gemv's four groups and the
                // three rows after them)
                for p in [RepackGemv, RepackGemm] {
                    let rows: [&[u8]; 35] = std::array::from_fn(|r| &w[r][..]);
                    let got = k.dot(rows, [&xs[0]], [p]);
                    for (r, row) in rows.iter().enumerate() {
                        let want = vec_dot_path(ty, row, &xs[0], p);
                        assert!(same(got[r][0], want), "{simd} {ty} nb {nb} {p:?} row {r}");
                        cases += 1;
                    }
                }
                // a prompt's token group: three rows against eight tokens, gemm and gemv rows mixed
                let paths = [
                    RepackGemm, RepackGemm, RepackGemv, RepackGemm, RepackGemm, RepackGemv,
                    RepackGemv, RepackGemm,
                ];
                let rows: [&[u8]; 3] = std::array::from_fn(|r| &w[r][..]);
                let x8: [&PreparedRow; 8] = std::array::from_fn(|j| &xs[j]);
                let got = k.dot(rows, x8, paths);
                for (r, row) in rows.iter().enumerate() {
                    for (j, &p) in paths.iter().enumerate() {
                        let want = vec_dot_path(ty, row, &xs[j], p);
                        assert!(
                            same(got[r][j], want),
                            "{simd} {ty} nb {nb} {p:?} row {r} token {j}"
                        );
                        cases += 1;
                    }
                }
            }
        }
    }
    // every setting and type had its constructed −128 decode token (and maybe drawn ones)
    assert!(
        cases > 100 && with_min_quant >= 2 * simd_settings().len(),
        "{cases} {with_min_quant}"
    );
}

/// One random activation row of `n` elements prepared for `ty` in ggml mode, with a NaN planted at a
/// random element so that its block holds a −128 quant (`has_min_quant`).
fn activation_row_with_min_quant(ty: GgmlType, n: usize, rng: &mut Rng) -> PreparedRow {
    let mut x: Vec<f32> = (0..n)
        .map(|_| match rng.activation(512, true) {
            v if v.is_nan() => 0.5,
            v => v,
        })
        .collect();
    x[(rng.next() as usize) % n] = f32::NAN;
    let mut p = PreparedRow::new();
    p.prepare(ty, NumericsMode::Ggml, &x).unwrap();
    assert!(p.has_min_quant, "a NaN input quantizes to −128");
    p
}

/// Another random row of the same type and length as `w`.
fn weight_row_like(ty: GgmlType, w: &[u8], rng: &mut Rng) -> Vec<u8> {
    if matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4_NL) {
        weight_row(ty, w.len() / ty.type_size(), rng)
    } else {
        float_row(ty, w.len() / ty.type_size(), rng)
    }
}

#[test]
fn no_simd_kernel_outside_ggml_mode() {
    assert_eq!(
        simd_kernel(Numerics::ggml(GgmlTarget::default()), GgmlType::Q4_1),
        None
    );
    assert_eq!(
        simd_kernel(Numerics::reference().with_simd(Simd::Avx2), GgmlType::Q4_1),
        None
    );
}
