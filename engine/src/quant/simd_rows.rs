//! The SIMD kernels of a ggml-mode matmul: [`SimdKernel`] (one per weight type and instruction set, named
//! by the type's row of the type table), [`simd_kernel`] (the choice per [`Numerics`]) and the row loops
//! that run a kernel over many weight rows and up to eight activation rows at once, bit for bit what
//! [`vec_dot_path`] gives per output.

#[cfg(target_arch = "x86_64")]
use super::{avx2, avx2_float, avx512, bf16_dp, iq4_nl, q4_0};
use super::{
    dots, effective_path, ktile, nibble_tile, pair_tile, vec_dot_path, GgmlPath, GgmlType,
    PreparedRow,
};
use crate::numerics::{Numerics, NumericsMode, Simd};

/// A SIMD kernel chosen for one matmul ([`simd_kernel`]): computes `N` outputs of one weight row at once,
/// each with the same bits as [`vec_dot_path`] gives for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)] // ggml's type names
pub(crate) enum SimdKernel {
    /// `ggml_vec_dot_q4_1_q8_1`, AVX2 (`avx2::dot_q4_1_q8_1`).
    Q4_1Avx2,
    /// `ggml_vec_dot_q8_0_q8_0`, AVX2 (`avx2::dot_q8_0_q8_0`).
    Q8_0Avx2,
    /// `ggml_vec_dot_q5_0_q8_0`, AVX2 (`avx2::dot_q5_0_q8_0`).
    Q5_0Avx2,
    /// Q4_K's repacked gemv/gemm and tiled paths, AVX2 integer sums (`avx2::dot_q4_k_q8_k`); a group of
    /// eight tokens all on the repacked gemm or all on the tiled path through the 8-token tile
    /// (`avx2::ktile8::dot_rows_q4_k`).
    Q4_KAvx2,
    /// Q4_0's repacked gemv/gemm (`avx2::dot_q4_0_repacked`); its vec_dot path stays scalar.
    Q4_0Avx2,
    /// `ggml_vec_dot_q5_1_q8_1`, AVX2 (`avx2::dot_q5_1_q8_1`).
    Q5_1Avx2,
    /// IQ4_NL's repacked gemv/gemm (`iq4_nl_8x8_q8_0`: Q4_0's kernel with the IQ4_NL value table,
    /// `avx2::dot_q4_0_repacked`); its vec_dot and tinyBLAS paths stay scalar.
    IQ4_NLAvx2,
    /// F32 weights: `ggml_vec_dot_f32` and tinyBLAS of either build (`avx2_float::dot_float`).
    F32Avx2,
    /// F16 weights: `ggml_vec_dot_f16` and tinyBLAS of either build (`avx2_float::dot_float`).
    F16Avx2,
    /// BF16 weights: `ggml_vec_dot_bf16` and tinyBLAS of either build, the AVX-512 build's `dpbf16`
    /// emulated (`avx2_float::dot_float`).
    BF16Avx2,
    /// `ggml_vec_dot_q6_K_q8_K` and the tiled path, AVX2 (`avx2::dot_q6_k_q8_k`); a group of eight
    /// tokens all on the tiled path through the 8-token tile (`avx2::ktile8::dot_rows_q6_k`).
    Q6_KAvx2,
    /// `ggml_vec_dot_q2_K_q8_K`, the tiled path and the repacked `q2_K_8x8_q8_K` gemv/gemm, AVX2
    /// (`avx2::kquant::dot_q2_k_q8_k`).
    Q2_KAvx2,
    /// `ggml_vec_dot_q3_K_q8_K` and the tiled path, AVX2 (`avx2::kquant::dot_q3_k_q8_k`).
    Q3_KAvx2,
    /// `ggml_vec_dot_q5_K_q8_K` and the tiled path, AVX2 (`avx2::kquant::dot_q5_k_q8_k`).
    Q5_KAvx2,
    /// `ggml_vec_dot_iq4_xs_q8_K` and the tiled path, AVX2 (`avx2::kquant::dot_iq4_xs_q8_k`).
    IQ4_XSAvx2,
    /// Q2_K with AVX-512 BW for groups of eight tokens on the tiled or repacked gemm path
    /// (`avx512::kquant::dot_x8`), [`SimdKernel::Q2_KAvx2`] otherwise.
    Q2_KAvx512,
    /// Q3_K with AVX-512 BW for groups of eight tokens on the tiled path (`avx512::kquant::dot_x8`),
    /// [`SimdKernel::Q3_KAvx2`] otherwise.
    Q3_KAvx512,
    /// Q5_K with AVX-512 BW for groups of eight tokens on the tiled path (`avx512::kquant::dot_x8`),
    /// [`SimdKernel::Q5_KAvx2`] otherwise.
    Q5_KAvx512,
    /// `ggml_vec_dot_q4_1_q8_1` with VNNI block products (`avx512::dot_q4_1_q8_1`).
    Q4_1Avx512,
    /// `ggml_vec_dot_q8_0_q8_0` / `tinyBLAS_Q0_AVX`, VNNI offset form (`avx512::dot_q8_0_q8_0`).
    Q8_0Avx512,
    /// `ggml_vec_dot_q5_0_q8_0` / `tinyBLAS_Q0_AVX`, VNNI offset form (`avx512::dot_q5_0_q8_0`).
    Q5_0Avx512,
    /// Q4_K's repacked gemm and tiled paths on sixteen tokens at once (`ktile::dot_rows_q4_k`); any
    /// other call runs [`SimdKernel::Q4_KAvx2`].
    Q4_KAvx512,
    /// Q6_K's tiled path on sixteen tokens at once (`ktile::dot_rows_q6_k`); any other call runs
    /// [`SimdKernel::Q6_KAvx2`].
    Q6_KAvx512,
    /// Q4_0's repacked gemm on sixteen rows and sixteen tokens at once (`nibble_tile::dot_rows`); any
    /// other call runs [`SimdKernel::Q4_0Avx2`].
    Q4_0Avx512,
    /// IQ4_NL's repacked gemm on sixteen rows and sixteen tokens at once (`nibble_tile::dot_rows`); any
    /// other call runs [`SimdKernel::IQ4_NLAvx2`].
    IQ4_NLAvx512,
    /// BF16 weights on a CPU with AVX512-BF16: the `__AVX512BF16__` paths (`ggml_vec_dot_bf16`, tinyBLAS
    /// `<32, __m512bh>`) on `vdpbf16ps` itself (`bf16_dp::dot_rows`); any other path runs
    /// [`SimdKernel::BF16Avx2`]. Chosen only where the CPU has the instruction.
    BF16Avx512,
}

/// The SIMD kernel for weights of `ty` in `num.mode` under `num.simd`, or `None` where only the scalar
/// kernel exists (then the caller uses [`vec_dot_path`]; `num.target` is not read). Checks at run time
/// that the CPU has the instructions, so a `Simd` value built by hand cannot reach an unsupported kernel.
pub(crate) fn simd_kernel(num: Numerics, ty: GgmlType) -> Option<SimdKernel> {
    let Numerics { mode, simd, .. } = num;
    if !simd.avx2_kernels() || mode != NumericsMode::Ggml {
        return None;
    }
    let d = dots(ty)?;
    match simd {
        Simd::Avx512 => d.simd_avx512.filter(|k| k.cpu_has()).or(d.simd_avx2),
        Simd::Avx2 | Simd::Off => d.simd_avx2,
    }
}

#[cfg(test)]
impl SimdKernel {
    /// `out[r][t] = vec_dot_path(w[r], xs[t], paths[t])` through [`SimdKernel::dot_rows`] (the tests'
    /// view of the kernels: any rows, any activation rows).
    pub(crate) fn dot<const R: usize, const N: usize>(
        self,
        w: [&[u8]; R],
        xs: [&PreparedRow; N],
        paths: [GgmlPath; N],
    ) -> [[f32; N]; R] {
        // the rows side by side in one buffer and one call, as the backend calls it
        let rb = w[0].len();
        assert!(w.iter().all(|r| r.len() == rb));
        let rows: Vec<u8> = w.concat();
        let mut out = vec![[0f32; R]; N];
        let mut outs = out.iter_mut();
        let outs: [&mut [f32]; N] = std::array::from_fn(|_| &mut outs.next().unwrap()[..]);
        self.dot_rows(&rows, rb, R, xs, paths, outs);
        std::array::from_fn(|r| std::array::from_fn(|t| out[t][r]))
    }
}

impl SimdKernel {
    /// True if this CPU has the instructions of this kernel beyond those of its `Simd` setting (which
    /// `Simd::available` checks): AVX512-BF16 for [`SimdKernel::BF16Avx512`].
    fn cpu_has(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            SimdKernel::BF16Avx512 => bf16_dp::available(),
            #[cfg(not(target_arch = "x86_64"))]
            SimdKernel::BF16Avx512 => false,
            _ => true,
        }
    }

    /// `outs[t][i] = vec_dot_path(rows[i], xs[t], paths[t])` for `i < n_rows` consecutive weight rows of
    /// `row_bytes` bytes each in `rows` and the `N` activation rows `xs`, bit for bit: one dispatch for a
    /// whole run of rows (a decode step's matrix-vector product with `N = 1`, a group of `N` prompt
    /// tokens otherwise) instead of one per row; each token's outputs go straight to its own output row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dot_rows<const N: usize>(
        self,
        rows: &[u8],
        row_bytes: usize,
        n_rows: usize,
        xs: [&PreparedRow; N],
        paths: [GgmlPath; N],
        outs: [&mut [f32]; N],
    ) {
        self.dot_rows_tiled(rows, row_bytes, n_rows, xs, paths, outs, None)
    }

    /// True if [`SimdKernel::dot_rows`] on `N > 1` activation rows reads them through transposed scales
    /// ([`tile_scales`]), which a caller that runs the same rows against many weight rows may make once
    /// and hand to [`SimdKernel::dot_rows_tiled`].
    pub(crate) fn uses_tiles(self) -> bool {
        matches!(
            self,
            SimdKernel::Q4_1Avx512
                | SimdKernel::Q8_0Avx512
                | SimdKernel::Q5_0Avx512
                | SimdKernel::Q4_0Avx2
                | SimdKernel::IQ4_NLAvx2
                | SimdKernel::Q4_0Avx512
                | SimdKernel::IQ4_NLAvx512
        )
    }

    /// The AVX2 kernel an AVX-512 one runs where it has no tile (itself for the AVX2 kernels).
    fn avx2(self) -> SimdKernel {
        use SimdKernel::*;
        match self {
            Q4_1Avx512 => Q4_1Avx2,
            Q8_0Avx512 => Q8_0Avx2,
            Q5_0Avx512 => Q5_0Avx2,
            Q4_KAvx512 => Q4_KAvx2,
            Q6_KAvx512 => Q6_KAvx2,
            Q2_KAvx512 => Q2_KAvx2,
            Q3_KAvx512 => Q3_KAvx2,
            Q5_KAvx512 => Q5_KAvx2,
            Q4_0Avx512 => Q4_0Avx2,
            IQ4_NLAvx512 => IQ4_NLAvx2,
            BF16Avx512 => BF16Avx2,
            k => k,
        }
    }

    /// The 16-token tiles of this kernel, if it has them (the K-quant tiles of Q4_K and Q6_K, the pair
    /// tiles of Q5_0 and Q8_0, the nibble tiles of Q4_0 and IQ4_NL).
    pub(crate) fn wide(self) -> Option<Wide> {
        match self {
            SimdKernel::Q4_KAvx512 => Some(Wide::K(GgmlType::Q4_K)),
            SimdKernel::Q6_KAvx512 => Some(Wide::K(GgmlType::Q6_K)),
            SimdKernel::Q5_0Avx512 => Some(Wide::Pairs(GgmlType::Q5_0)),
            SimdKernel::Q8_0Avx512 => Some(Wide::Pairs(GgmlType::Q8_0)),
            SimdKernel::Q4_0Avx512 => Some(Wide::Nibbles(GgmlType::Q4_0)),
            SimdKernel::IQ4_NLAvx512 => Some(Wide::Nibbles(GgmlType::IQ4_NL)),
            _ => None,
        }
    }

    /// `outs[t][i] = vec_dot_path(rows[i], xs[t], path)` for `i < n_rows` weight rows and the
    /// [`Wide::TOKENS`] activation rows `xs` whose tile ([`Wide::build`]) is `tile`, bit for bit.
    ///
    /// # Panics
    /// If this kernel has no tile for these rows and `path` ([`Wide::accepts`]), or the shapes do not
    /// match.
    pub(crate) fn dot_rows_wide(
        self,
        rows: &[u8],
        row_bytes: usize,
        n_rows: usize,
        tile: &[ktile::Line],
        path: GgmlPath,
        mut outs: [&mut [f32]; Wide::TOKENS],
    ) {
        let wide = self.wide();
        assert!(
            wide.is_some_and(|w| w.path_ok(path)),
            "{self:?} has no 16-token tile for {path:?}"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `SimdKernel` of the Avx512 kind exists only where `simd_kernel` found AVX2, FMA, F16C
        // and AVX-512 F/BW/VL/VNNI on this CPU; the kernels check the shapes.
        unsafe {
            match wide {
                Some(Wide::K(GgmlType::Q4_K)) => {
                    ktile::dot_rows_q4_k(rows, row_bytes, n_rows, tile, path, &mut outs)
                }
                Some(Wide::K(_)) => ktile::dot_rows_q6_k(rows, row_bytes, n_rows, tile, &mut outs),
                Some(Wide::Pairs(ty)) => {
                    pair_tile::dot_rows(ty, rows, row_bytes, n_rows, tile, &mut outs)
                }
                Some(Wide::Nibbles(ty)) => {
                    nibble_tile::dot_rows(ty, rows, row_bytes, n_rows, tile, &mut outs)
                }
                None => unreachable!("checked above"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (rows, row_bytes, n_rows, tile, outs);
            unreachable!("no SIMD kernel is selected off x86-64")
        }
    }

    /// [`SimdKernel::dot_rows`] with the activation rows' transposed scales made beforehand by
    /// [`tile_scales`] (`tiles`, for these `xs`), or made here (`None`). Same bits either way.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dot_rows_tiled<const N: usize>(
        self,
        rows: &[u8],
        row_bytes: usize,
        n_rows: usize,
        xs: [&PreparedRow; N],
        paths: [GgmlPath; N],
        mut outs: [&mut [f32]; N],
        tiles: Option<&[f32]>,
    ) {
        assert!(rows.len() >= n_rows * row_bytes);
        assert!(outs.iter().all(|o| o.len() >= n_rows));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `SimdKernel` exists only where `simd_kernel` found its features on this CPU
        // (AVX2+FMA+F16C, AVX-512 F/BW/VL/VNNI for the `Avx512` ones, and AVX512-BF16 for `BF16Avx512`); the
        // bounds were checked above.
        unsafe {
            use SimdKernel::*;
            if let Some(tile) = self.tile8(&paths) {
                // `tile8` returns a tile only for eight activation rows
                let x8: [&PreparedRow; 8] = std::array::from_fn(|j| xs[j % N]);
                kquant_rows_avx512(tile, rows, row_bytes, n_rows, x8, &mut outs);
                return;
            }
            if self == BF16Avx512 && bf16_dp::handles(&paths) {
                // `simd_kernel` chose it only where the CPU has AVX512-BF16
                bf16_dp::dot_rows(rows, row_bytes, n_rows, xs, paths, &mut outs);
                return;
            }
            if N == 1 && matches!(self, Q4_0Avx512 | IQ4_NLAvx512) && !xs[0].has_min_quant {
                let (ty, values) = if self == Q4_0Avx512 {
                    (GgmlType::Q4_0, &q4_0::VALUES)
                } else {
                    (GgmlType::IQ4_NL, &iq4_nl::KVALUES)
                };
                let path = effective_path(ty, paths[0]);
                if matches!(path, GgmlPath::RepackGemv | GgmlPath::RepackGemm) {
                    let x = avx2::Q8Row {
                        qs: &xs[0].qs,
                        d: &xs[0].d,
                        s: &xs[0].s,
                    };
                    repacked_gemv_vnni(rows, row_bytes, n_rows, x, path, values, outs[0]);
                    return;
                }
            }
            let vnni = matches!(self, Q4_1Avx512 | Q8_0Avx512 | Q5_0Avx512);
            // a −128 activation quant needs ggml's `sign` form, which the AVX2 kernels have; a single
            // activation row (decode) is faster there too (the tile's transposed scales and products
            // cost more than they save for one row: criterion `matmul/q8_0/*/ggml/decode`)
            if vnni && N > 1 && !xs.iter().any(|x| x.has_min_quant) {
                dot_rows_avx512(self, rows, row_bytes, n_rows, xs, &mut outs, tiles)
            } else {
                let k = self.avx2();
                dot_rows_avx2(k, rows, row_bytes, n_rows, xs, paths, &mut outs, tiles)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (rows, row_bytes, n_rows, xs, paths, outs, tiles);
            unreachable!("no SIMD kernel is selected off x86-64")
        }
    }
}

/// The 16-token tiles of a SIMD kernel ([`SimdKernel::wide`]): the activation rows of a group of
/// [`Wide::TOKENS`] prompt tokens laid out once per matmul ([`Wide::build`]) for all its weight rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wide {
    /// The K-quant tiles of this weight type (Q4_K, Q6_K; `quant::ktile`).
    K(GgmlType),
    /// The pair tiles of this weight type (Q5_0, Q8_0; `quant::pair_tile`).
    Pairs(GgmlType),
    /// The nibble tiles of this weight type (Q4_0, IQ4_NL; `quant::nibble_tile`): sixteen weight rows
    /// at once as well.
    Nibbles(GgmlType),
}

impl Wide {
    /// Tokens per tile.
    pub(crate) const TOKENS: usize = 16;

    /// Lines of one tile of activation rows of `nb` blocks (as [`PreparedRow::n_blocks`] counts them).
    pub(crate) fn lines(self, nb: usize) -> usize {
        match self {
            Wide::K(_) => ktile::tile_lines(nb),
            Wide::Pairs(_) => pair_tile::tile_lines(nb),
            Wide::Nibbles(_) => nibble_tile::tile_lines(nb),
        }
    }

    /// True if the tile computes outputs on ggml path `path` (the K-quant tiles: Q4_K's repacked gemm
    /// and tiled paths, Q6_K's tiled one; the pair tiles: every path, all the same kernel; the nibble
    /// tiles: the repacked gemm).
    fn path_ok(self, path: GgmlPath) -> bool {
        match self {
            Wide::K(ty) => ktile::handles(ty, path),
            Wide::Pairs(_) => true,
            Wide::Nibbles(ty) => nibble_tile::handles(ty, path),
        }
    }

    /// True if the activation rows `xs`, all on ggml path `path`, can be one tile: the path is one the
    /// tile has, and (pair tiles) no row holds a −128 quant.
    pub(crate) fn accepts(self, xs: &[&PreparedRow; Self::TOKENS], path: GgmlPath) -> bool {
        self.path_ok(path)
            && match self {
                Wide::K(_) | Wide::Nibbles(_) => true,
                Wide::Pairs(_) => pair_tile::accepts(xs),
            }
    }

    /// The tile of the activation rows `xs` in `out` ([`Wide::lines`] lines).
    pub(crate) fn build(self, xs: [&PreparedRow; Self::TOKENS], out: &mut [ktile::Line]) {
        match self {
            Wide::K(ty) => ktile::build_tile(ty, xs, out),
            Wide::Pairs(_) => pair_tile::build_tile(xs, out),
            Wide::Nibbles(ty) => nibble_tile::build_tile(ty, xs, out),
        }
    }
}

impl SimdKernel {
    /// The AVX-512 K-quant tile ([`avx512::kquant::Tile8`]) that computes a call of this kernel on
    /// `paths`, if there is one: eight activation rows, all on the tiled path (Q2_K, Q3_K, Q5_K) or all on
    /// the repacked gemm (Q2_K).
    #[cfg(target_arch = "x86_64")]
    fn tile8<const N: usize>(self, paths: &[GgmlPath; N]) -> Option<avx512::kquant::Tile8> {
        use avx512::kquant::Tile8;
        let ty = match self {
            SimdKernel::Q2_KAvx512 => GgmlType::Q2_K,
            SimdKernel::Q3_KAvx512 => GgmlType::Q3_K,
            SimdKernel::Q5_KAvx512 => GgmlType::Q5_K,
            _ => return None,
        };
        let p0 = effective_path(ty, paths[0]);
        if N != 8 || paths.iter().any(|&p| effective_path(ty, p) != p0) {
            return None;
        }
        match (ty, p0) {
            (GgmlType::Q2_K, GgmlPath::Tiled) => Some(Tile8::Q2_KTiled),
            (GgmlType::Q2_K, GgmlPath::RepackGemm) => Some(Tile8::Q2_KGemm),
            (GgmlType::Q3_K, GgmlPath::Tiled) => Some(Tile8::Q3_KTiled),
            (GgmlType::Q5_K, GgmlPath::Tiled) => Some(Tile8::Q5_KTiled),
            _ => None,
        }
    }
}

/// The row loop of the AVX-512 K-quant tiles: `outs[t][i]` = `avx512::kquant::dot_x8(tile, row(i),
/// xs)[t]`.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL; `rows` holds `n_rows` rows of `row_bytes`
/// and every output `n_rows` floats (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn kquant_rows_avx512<const N: usize>(
    tile: avx512::kquant::Tile8,
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: [&PreparedRow; 8],
    outs: &mut [&mut [f32]; N],
) {
    let q8k = xs.map(|x| avx2::Q8kRow {
        qs: &x.qs,
        d: &x.d,
        bsums: &x.bsums,
    });
    for i in 0..n_rows {
        let r = avx512::kquant::dot_x8(tile, &rows[i * row_bytes..(i + 1) * row_bytes], q8k);
        for (o, r) in outs.iter_mut().zip(r) {
            o[i] = r;
        }
    }
}

/// `outs[t][i] = dot(row(i))[t]` for every weight row `i < n_rows`: the row loop of the SIMD dispatchers,
/// written out in each (a closure or `dyn` call would keep the kernel from inlining).
#[cfg(target_arch = "x86_64")]
macro_rules! each_row {
    ($n_rows:expr, $row:ident, $outs:ident, $w:ident => $dot:expr) => {
        for i in 0..$n_rows {
            let $w = $row(i);
            let r: [f32; N] = $dot;
            for (o, r) in $outs.iter_mut().zip(r) {
                o[i] = r;
            }
        }
    };
}

/// [`SimdKernel::dot_rows`], compiled with the kernels' features so that the kernel inlines into the
/// row loop.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows_avx2<const N: usize>(
    k: SimdKernel,
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: [&PreparedRow; N],
    paths: [GgmlPath; N],
    outs: &mut [&mut [f32]; N],
    tiles: Option<&[f32]>,
) {
    let row = |i: usize| &rows[i * row_bytes..(i + 1) * row_bytes];
    // a path that does not exist for the kernel's weight type is the vec_dot kernel (as in vec_dot_path)
    let ty = match k {
        SimdKernel::Q4_KAvx2 => Some(GgmlType::Q4_K),
        SimdKernel::Q6_KAvx2 => Some(GgmlType::Q6_K),
        SimdKernel::Q2_KAvx2 => Some(GgmlType::Q2_K),
        SimdKernel::Q3_KAvx2 => Some(GgmlType::Q3_K),
        SimdKernel::Q5_KAvx2 => Some(GgmlType::Q5_K),
        SimdKernel::IQ4_XSAvx2 => Some(GgmlType::IQ4_XS),
        SimdKernel::Q4_0Avx2 => Some(GgmlType::Q4_0),
        SimdKernel::IQ4_NLAvx2 => Some(GgmlType::IQ4_NL),
        _ => None,
    };
    let paths = paths.map(|p| ty.map_or(p, |t| effective_path(t, p)));
    // the repacked kernels serve only calls whose every row takes a repacked path (Q4_0, IQ4_NL)
    let repacked = paths
        .iter()
        .all(|p| matches!(p, GgmlPath::RepackGemv | GgmlPath::RepackGemm));
    let q8 = xs.map(|x| avx2::Q8Row {
        qs: &x.qs,
        d: &x.d,
        s: &x.s,
    });
    let q8k = xs.map(|x| avx2::Q8kRow {
        qs: &x.qs,
        d: &x.d,
        bsums: &x.bsums,
    });
    // one plain loop per kernel (a closure or `dyn` call would keep the kernel from inlining)
    macro_rules! each {
        ($w:ident => $dot:expr) => {
            each_row!(n_rows, row, outs, $w => $dot)
        };
    }
    match k {
        SimdKernel::Q4_1Avx2 => each!(w => avx2::dot_q4_1_q8_1(w, q8)),
        SimdKernel::Q8_0Avx2 => each!(w => avx2::dot_q8_0_q8_0(w, q8)),
        SimdKernel::Q5_0Avx2 => each!(w => avx2::dot_q5_0_q8_0(w, q8)),
        SimdKernel::Q4_KAvx2 if paths.contains(&GgmlPath::VecDot) => {
            each!(w => std::array::from_fn(|t| vec_dot_path(GgmlType::Q4_K, w, xs[t], paths[t])))
        }
        // a group of eight tokens on one path: one weight row against all eight at once
        SimdKernel::Q4_KAvx2 if avx2::ktile8::handles_q4_k(&paths) => {
            let x8: [avx2::Q8kRow<'_>; 8] = std::array::from_fn(|j| q8k[j % N]);
            let outs8: &mut [&mut [f32]; 8] = outs.as_mut_slice().try_into().expect("N is 8");
            avx2::ktile8::dot_rows_q4_k(rows, row_bytes, n_rows, x8, paths[0], outs8)
        }
        SimdKernel::Q4_KAvx2 => each!(w => avx2::dot_q4_k_q8_k(w, q8k, paths)),
        SimdKernel::Q4_0Avx2 if !repacked => {
            each!(w => std::array::from_fn(|t| vec_dot_path(GgmlType::Q4_0, w, xs[t], paths[t])))
        }
        SimdKernel::Q4_0Avx2 => repacked_rows(
            rows,
            row_bytes,
            n_rows,
            xs,
            q8,
            paths,
            &q4_0::VALUES,
            outs,
            tiles,
        ),
        SimdKernel::F32Avx2 | SimdKernel::F16Avx2 | SimdKernel::BF16Avx2 => {
            let ty = match k {
                SimdKernel::F32Avx2 => GgmlType::F32,
                SimdKernel::F16Avx2 => GgmlType::F16,
                _ => GgmlType::BF16,
            };
            let xf = xs.map(|x| avx2_float::FloatRow {
                x: &x.x,
                raw: &x.blocks,
            });
            each!(w => avx2_float::dot_float(ty, w, xf, paths))
        }
        SimdKernel::Q6_KAvx2 if avx2::ktile8::handles_q6_k(&paths) => {
            let x8: [avx2::Q8kRow<'_>; 8] = std::array::from_fn(|j| q8k[j % N]);
            let outs8: &mut [&mut [f32]; 8] = outs.as_mut_slice().try_into().expect("N is 8");
            avx2::ktile8::dot_rows_q6_k(rows, row_bytes, n_rows, x8, outs8)
        }
        SimdKernel::Q6_KAvx2 => each!(w => avx2::dot_q6_k_q8_k(w, q8k, paths)),
        SimdKernel::Q2_KAvx2 => each!(w => avx2::kquant::dot_q2_k_q8_k(w, q8k, paths)),
        SimdKernel::Q3_KAvx2 => each!(w => avx2::kquant::dot_q3_k_q8_k(w, q8k, paths)),
        SimdKernel::Q5_KAvx2 => each!(w => avx2::kquant::dot_q5_k_q8_k(w, q8k, paths)),
        SimdKernel::IQ4_XSAvx2 => each!(w => avx2::kquant::dot_iq4_xs_q8_k(w, q8k, paths)),
        SimdKernel::Q5_1Avx2 => each!(w => avx2::dot_q5_1_q8_1(w, q8)),
        SimdKernel::IQ4_NLAvx2 if !repacked => {
            each!(w => std::array::from_fn(|t| vec_dot_path(GgmlType::IQ4_NL, w, xs[t], paths[t])))
        }
        SimdKernel::IQ4_NLAvx2 => repacked_rows(
            rows,
            row_bytes,
            n_rows,
            xs,
            q8,
            paths,
            &iq4_nl::KVALUES,
            outs,
            tiles,
        ),
        SimdKernel::Q4_1Avx512
        | SimdKernel::Q8_0Avx512
        | SimdKernel::Q5_0Avx512
        | SimdKernel::Q4_KAvx512
        | SimdKernel::Q6_KAvx512
        | SimdKernel::Q2_KAvx512
        | SimdKernel::Q3_KAvx512
        | SimdKernel::Q5_KAvx512
        | SimdKernel::Q4_0Avx512
        | SimdKernel::IQ4_NLAvx512
        | SimdKernel::BF16Avx512 => {
            unreachable!(
                "the AVX-512 kernels are dispatched by dot_rows_avx512, dot_rows_k16 or kquant_rows_avx512; \
                 dot_rows_tiled hands the others their AVX2 names"
            )
        }
    }
}

/// The repacked Q4_0 / IQ4_NL kernels (`values`: the nibble table) over `n_rows` weight rows: a group of
/// eight prompt tokens with their scales transposed once for all rows (`avx2::dot_q4_0_repacked_x8`: 24%
/// faster on a SmolLM2 Q4_0 prompt), a decode step eight weight rows at a time
/// (`avx2::dot_q4_0_repacked_rows8`, which prefetches the next eight: 18% faster on a SmolLM2 Q4_0
/// decode), anything else row by row (`avx2::dot_q4_0_repacked`). Same bits every way.
///
/// # Safety
/// As [`dot_rows_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn repacked_rows<const N: usize>(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: [&PreparedRow; N],
    q8: [avx2::Q8Row<'_>; N],
    paths: [GgmlPath; N],
    values: &[i8; 16],
    outs: &mut [&mut [f32]; N],
    tiles: Option<&[f32]>,
) {
    let row = |i: usize| &rows[i * row_bytes..(i + 1) * row_bytes];
    if N == 8 {
        let nb = xs[0].n_blocks();
        let x8: [avx2::Q8Row<'_>; 8] = std::array::from_fn(|j| q8[j]);
        let p8: [GgmlPath; 8] = std::array::from_fn(|j| paths[j]);
        let mut run = |dt: &[f32]| {
            for i in 0..n_rows {
                let r = avx2::dot_q4_0_repacked_x8(row(i), x8, &dt[..8 * nb], p8, values);
                for (o, r) in outs.iter_mut().zip(r) {
                    o[i] = r;
                }
            }
        };
        // the transposed scales the caller made once per matmul, or made here in the tile buffer
        match tiles {
            Some(t) => run(t),
            None => TILE_SCRATCH.with(|buf| {
                let buf = &mut *buf.borrow_mut();
                if buf.len() < 16 * nb {
                    buf.resize(16 * nb, 0.0);
                }
                tile_scales(xs, buf);
                run(buf)
            }),
        }
        return;
    }
    let mut i = 0;
    if N == 1 {
        // a decode step: eight weight rows at once in the lanes of one vector
        while i + 8 <= n_rows {
            let w8 = &rows[i * row_bytes..(i + 8) * row_bytes];
            let r = avx2::dot_q4_0_repacked_rows8(w8, q8[0], paths[0], values);
            outs[0][i..i + 8].copy_from_slice(&r);
            i += 8;
        }
    }
    for i in i..n_rows {
        let r = avx2::dot_q4_0_repacked(row(i), q8, paths, values);
        for (o, r) in outs.iter_mut().zip(r) {
            o[i] = r;
        }
    }
}

/// A decode step's repacked Q4_0 / IQ4_NL matrix-vector product on AVX-512 VNNI: eight rows at a time
/// through `avx512::dot_q4_0_repacked_rows8` (`vpdpbusd` for ggml's `sign`/`maddubs`/`madd`; the same
/// bits where no activation quant is −128), the rows past a multiple of eight through
/// `avx2::dot_q4_0_repacked`.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; `x` has no −128 quant.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn repacked_gemv_vnni(
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    x: avx2::Q8Row<'_>,
    path: GgmlPath,
    values: &[i8; 16],
    out: &mut [f32],
) {
    let mut i = 0;
    while i + 8 <= n_rows {
        let w8 = &rows[i * row_bytes..(i + 8) * row_bytes];
        out[i..i + 8].copy_from_slice(&avx512::dot_q4_0_repacked_rows8(w8, x, values));
        i += 8;
    }
    for i in i..n_rows {
        let w = &rows[i * row_bytes..(i + 1) * row_bytes];
        out[i] = avx2::dot_q4_0_repacked(w, [x], [path], values)[0];
    }
}

/// The bytes of `q` as `u8` (the same memory; `vpdpbusd` takes Q8_1 quants as its signed operand).
#[cfg(target_arch = "x86_64")]
fn bytemuck_i8(q: &[i8]) -> &[u8] {
    // SAFETY: i8 and u8 have the same size and alignment, and every bit pattern is valid for both.
    unsafe { std::slice::from_raw_parts(q.as_ptr() as *const u8, q.len()) }
}

/// [`SimdKernel::dot_rows`] for the AVX-512 VNNI kernels (`quant::avx512`), compiled with their features;
/// no activation row may hold a −128 quant (the caller checks `has_min_quant`).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F, BW, VL, VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_rows_avx512<const N: usize>(
    k: SimdKernel,
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: [&PreparedRow; N],
    outs: &mut [&mut [f32]; N],
    tiles: Option<&[f32]>,
) {
    use avx512::LANES;
    let nb = xs.first().map_or(0, |x| x.d.len());
    // the thread's tile buffer: the rows' scales transposed, LANES per block (lanes past N are 0), unless
    // the caller made them, and room for the kernel's per-row scale products (grows once, then reused:
    // no allocation per call)
    TILE_SCRATCH.with(|buf| {
        let buf = &mut *buf.borrow_mut();
        if buf.len() < 4 * LANES * nb {
            buf.resize(4 * LANES * nb, 0.0);
        }
        let (ds, prod) = buf.split_at_mut(2 * LANES * nb);
        let ds = match tiles {
            Some(t) => {
                assert!(t.len() >= 2 * LANES * nb);
                &t[..2 * LANES * nb]
            }
            None => {
                tile_scales(xs, ds);
                &*ds
            }
        };
        let (d, s) = ds.split_at(LANES * nb);
        let prod = &mut prod[..2 * LANES * nb];
        dot_rows_tiles(k, rows, row_bytes, n_rows, xs, d, s, prod, outs)
    })
}

/// The transposed scales the AVX-512 tiles read ([`SimdKernel::uses_tiles`]) for the activation rows
/// `xs` (`N ≤ 8`, each `nb` blocks): `out[ib·8 + j]` = row `j`'s `d` of block `ib`, then from `8·nb` on
/// its `s` (Q8_1; 0 for Q8_0 rows), lanes past `N` 0. `out` holds at least `16·nb` floats (checked).
pub(crate) fn tile_scales<const N: usize>(xs: [&PreparedRow; N], out: &mut [f32]) {
    const LANES: usize = 8;
    assert!(N <= LANES);
    let nb = xs.first().map_or(0, |x| x.d.len());
    let (d, s) = out[..2 * LANES * nb].split_at_mut(LANES * nb);
    if N < LANES {
        d.fill(0.0);
        s.fill(0.0);
    }
    for (j, x) in xs.iter().enumerate() {
        assert_eq!(
            x.d.len(),
            nb,
            "activation rows of one tile have the same length"
        );
        for ib in 0..nb {
            d[ib * LANES + j] = x.d[ib];
            s[ib * LANES + j] = x.s.get(ib).copied().unwrap_or(0.0);
        }
    }
}

thread_local! {
    /// Per-thread buffer of [`dot_rows_avx512`] (transposed scales and scale products) and of
    /// [`repacked_rows`] (transposed scales), when their caller made none.
    #[cfg(target_arch = "x86_64")]
    static TILE_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The row loop of [`dot_rows_avx512`] over its tile buffer (a separate function with the kernels'
/// features: a closure would be compiled without them).
///
/// # Safety
/// As [`dot_rows_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows_tiles<const N: usize>(
    k: SimdKernel,
    rows: &[u8],
    row_bytes: usize,
    n_rows: usize,
    xs: [&PreparedRow; N],
    d: &[f32],
    s: &[f32],
    prod: &mut [f32],
    outs: &mut [&mut [f32]; N],
) {
    let row = |i: usize| &rows[i * row_bytes..(i + 1) * row_bytes];
    let q4_1 = avx512::Tile {
        qs: xs.map(|x| bytemuck_i8(&x.qs)),
        d,
        s,
    };
    let q8u = avx512::Tile {
        qs: xs.map(|x| &x.qu[..]),
        d,
        s,
    };
    macro_rules! each {
        ($w:ident => $dot:expr) => {
            each_row!(n_rows, row, outs, $w => $dot)
        };
    }
    // rows two at a time through `$x2`, an odd last one through `$one`
    macro_rules! pairs {
        ($x2:path, $one:path) => {{
            let pairs = n_rows / 2;
            for i in 0..pairs {
                let r = $x2([row(2 * i), row(2 * i + 1)], &q8u);
                for (t, o) in outs.iter_mut().enumerate() {
                    // SAFETY: every output holds `n_rows` floats (`dot_rows_tiled` checked it)
                    *o.get_unchecked_mut(2 * i) = r[0][t];
                    *o.get_unchecked_mut(2 * i + 1) = r[1][t];
                }
            }
            for i in 2 * pairs..n_rows {
                let r = $one(row(i), &q8u, prod);
                for (o, r) in outs.iter_mut().zip(r) {
                    o[i] = r;
                }
            }
        }};
    }
    match k {
        SimdKernel::Q4_1Avx512 => each!(w => avx512::dot_q4_1_q8_1(w, &q4_1, prod)),
        // two weight rows per step: each activation block loaded once for both
        SimdKernel::Q8_0Avx512 => pairs!(avx512::dot_q8_0_q8_0_x2, avx512::dot_q8_0_q8_0),
        SimdKernel::Q5_0Avx512 => pairs!(avx512::dot_q5_0_q8_0_x2, avx512::dot_q5_0_q8_0),
        _ => unreachable!("dot_rows_avx512 runs the AVX-512 kernels only"),
    }
}
