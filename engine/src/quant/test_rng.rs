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
