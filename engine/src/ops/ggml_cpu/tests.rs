use super::*;

#[test]
#[cfg(target_arch = "x86_64")]
fn zmm_expf_and_reduce_give_the_lane_replicas_bits() {
    if !crate::numerics::avx512_available() {
        eprintln!("skipping: no AVX-512 on this CPU");
        return;
    }
    use std::arch::x86_64::*;
    // a sweep through every range (overflow, underflow to subnormals and 0, ±0), and the specials
    let mut xs: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.0625).collect();
    xs.extend((0..4000).map(|i| f32::from_bits(0x3000_0000u32.wrapping_add(i * 0x1_2345))));
    xs.extend((0..4000).map(|i| -f32::from_bits(0x3000_0000u32.wrapping_add(i * 0x1_2345))));
    xs.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        88.72,
        88.73,
        -87.3,
    ]);
    xs.extend([
        -103.0,
        -104.0,
        -149.9,
        133.0,
        -133.0,
        192.5 / LOG2E,
        -192.5 / LOG2E,
    ]);
    while !xs.len().is_multiple_of(16) {
        xs.push(1.0);
    }
    for v in xs.chunks_exact(16) {
        // SAFETY: AVX-512 F was detected above; `v` holds 16 floats
        let (got, sum) = unsafe {
            let z = v_expf_zmm(_mm512_loadu_ps(v.as_ptr()));
            let mut o = [0f32; 16];
            _mm512_storeu_ps(o.as_mut_ptr(), z);
            (o, reduce_add_zmm(z))
        };
        for (&x, g) in v.iter().zip(got) {
            assert_eq!(g.to_bits(), expf_avx512(x).to_bits(), "x = {x:e}");
        }
        assert_eq!(
            sum.to_bits(),
            crate::quant::x86::reduce_add_16(&got).to_bits()
        );
    }
}

#[test]
fn expf_is_close_to_libm_and_handles_the_edges() {
    let mut x = -110.0f32;
    while x < 90.0 {
        let (a, b) = (expf_avx512(x), x.exp());
        let a2 = expf_avx2(x);
        if b > 1e-37 && b.is_finite() {
            assert!(
                ((a2 - b) / b).abs() < 3.0 * f32::EPSILON,
                "avx2 x={x}: {a2} vs {b}"
            );
        }
        // 1.45 + 0.5 ulp in the normal range; subnormal results lose relative precision
        if b > 1e-37 && b.is_finite() {
            assert!(
                ((a - b) / b).abs() < 3.0 * f32::EPSILON,
                "x={x}: {a} vs {b}"
            );
        }
        x += 0.013;
    }
    for t in GgmlTarget::ALL {
        let expf = |x| t.expf(x);
        assert_eq!(expf(0.0), 1.0, "{t}");
        assert_eq!(expf(f32::NEG_INFINITY), 0.0, "{t}");
        assert_eq!(expf(-1e30), 0.0, "{t}");
        assert_eq!(expf(f32::INFINITY), f32::INFINITY, "{t}");
        assert_eq!(expf(100.0), f32::INFINITY, "{t}");
        assert!(expf(f32::NAN).is_nan(), "{t}");
        // below −87.3 the result is subnormal, rounded (not flushed)
        assert!(expf(-95.0) > 0.0 && expf(-95.0) < f32::MIN_POSITIVE, "{t}");
    }
}

#[test]
fn silu_and_swiglu_tail() {
    let silu = |x| silu_on(GgmlTarget::Avx512, x);
    assert_eq!(silu(0.0), 0.0);
    assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
    assert_eq!(silu(-200.0), -0.0);
    assert_eq!(silu_on(GgmlTarget::Avx2, -200.0), -0.0);
    // 19 elements: 16 in the vector loop, 3 through the scalar libm path
    let mut x: Vec<f32> = (0..19).map(|i| i as f32 * 0.37 - 3.0).collect();
    let g = vec![2.0f32; 19];
    let orig = x.clone();
    swiglu_row(GgmlTarget::Avx512, &mut x, &g);
    for i in 0..19 {
        let want = if i < 16 {
            silu(orig[i])
        } else {
            silu_scalar(orig[i])
        } * 2.0;
        assert_eq!(x[i].to_bits(), want.to_bits());
    }
}

#[test]
fn vec_dot_f32_structure() {
    // n < 64: all leftovers; exact small integers make every order agree
    let x: Vec<f32> = (0..200).map(|i| (i % 7) as f32).collect();
    let y: Vec<f32> = (0..200).map(|i| (i % 5) as f32 - 2.0).collect();
    for n in [0, 1, 7, 8, 15, 16, 63, 64, 65, 80, 100, 127, 128, 200] {
        let want: f32 = x[..n].iter().zip(&y[..n]).map(|(a, b)| a * b).sum();
        for t in GgmlTarget::ALL {
            assert_eq!(vec_dot_f32(t, &x[..n], &y[..n]), want, "n={n}");
        }
    }
    // the lane structure shows with cancellation: 1e8 in lane 0 of sum[0] and −1e8 in lane 0 of
    // sum[2] cancel before the 1.0 of sum[1] is added
    let mut x = vec![0f32; 64];
    x[0] = 1e8;
    x[32] = -1e8;
    x[16] = 1.0;
    let y = vec![1f32; 64];
    assert_eq!(vec_dot_f32(GgmlTarget::Avx512, &x, &y), 1.0);
}

#[test]
fn softmax_row_sums_to_one_and_masks() {
    let mut x: Vec<f32> = (0..40).map(|i| (i as f32 * 0.7).sin() * 4.0).collect();
    let mut mask = vec![0f32; 40];
    mask[30..].fill(f32::NEG_INFINITY);
    soft_max_row(GgmlTarget::Avx512, &mut x, Some(&mask), 0.5);
    assert!(x[30..].iter().all(|&v| v == 0.0));
    let s: f32 = x.iter().sum();
    assert!((s - 1.0).abs() < 1e-6);
    let mut all = vec![f32::NEG_INFINITY; 16];
    soft_max_row(GgmlTarget::Avx2, &mut all, None, 1.0);
    assert_eq!(all, vec![0.0; 16]);
}

#[test]
fn rotate_pairs_is_a_rotation() {
    let mut h = vec![1.0f32, 2.0, 3.0, 4.0];
    rotate_pairs_norm(&mut h, &[1.0, 0.0, 0.0, 1.0]);
    assert_eq!(h, vec![1.0, 2.0, -4.0, 3.0]);
}
