//! What the quant modules' tests share: a deterministic xorshift generator (no `rand` dependency) with
//! the activation distribution the SIMD-versus-scalar tests draw from, and bit equality of two outputs.

/// Deterministic xorshift64 generator; the seed must not be 0.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [−1, 1): the top 24 bits of [`Rng::next`] scaled (the float tests' values).
    pub(crate) fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// An activation: uniform in [−1, 1), except that of every `m` draws about 8 are 30× larger
    /// (outlier channels) and, if `nan`, one is NaN (which ggml's Q8 quantizers turn into −128 or 0).
    pub(crate) fn activation(&mut self, m: u64, nan: bool) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        match self.next() % m {
            0 if nan => f32::NAN,
            1..=8 => u * 30.0,
            _ => u,
        }
    }
}

/// Two outputs with the same bits, or both NaN (any payload: the kernels' NaNs come from the same
/// operations, but a NaN's payload is not part of ggml's contract).
pub(crate) fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Random blocks of a 32-element type whose block starts with its f16 scale `d` (Q4_0, Q5_0, Q8_0,
/// IQ4_NL): random bytes, and in half of the blocks (drawn at random) `d` replaced by an ordinary
/// magnitude in `(0, 1000·scale]`; the others keep random bits (NaN, inf, subnormal included).
pub(crate) fn blocks_with_f16_scale(
    ty: super::GgmlType,
    nb: usize,
    scale: f32,
    rng: &mut Rng,
) -> Vec<u8> {
    let per = ty.type_size();
    let mut w: Vec<u8> = (0..nb * per).map(|_| rng.next() as u8).collect();
    for blk in w.chunks_exact_mut(per) {
        if rng.next().is_multiple_of(2) {
            let d = half::f16::from_f32(((rng.next() % 1000) as f32 + 1.0) * scale);
            blk[0..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    w
}

/// `x` quantized as ggml mode prepares an activation row for `ty`'s vec_dot type.
pub(crate) fn ggml_prepared(ty: super::GgmlType, x: &[f32]) -> super::PreparedRow {
    let mut p = super::PreparedRow::new();
    p.prepare(ty, crate::numerics::NumericsMode::Ggml, x)
        .unwrap();
    p
}

/// The AVX-512 kernel of `ty`, which must run the 16-token tile `wide`; `None` (and a note) without
/// AVX-512 VNNI on this CPU.
pub(crate) fn avx512_tile_kernel(
    ty: super::GgmlType,
    wide: super::Wide,
) -> Option<super::SimdKernel> {
    use crate::numerics::{GgmlTarget, Numerics, Simd};
    if !Simd::Avx512.available() {
        eprintln!("skipping: this CPU has no AVX-512 VNNI");
        return None;
    }
    let k = super::simd_kernel(
        Numerics::ggml(GgmlTarget::default()).with_simd(Simd::Avx512),
        ty,
    )?;
    assert_eq!(k.wide(), Some(wide));
    Some(k)
}
