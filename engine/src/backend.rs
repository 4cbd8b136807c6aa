//! The compute seam: matrix products of quantized weights with f32 activations.
//!
//! A [`Backend`] computes `out[t, r] = Σ_k W[r, k] · x[t, k]` for a weight matrix whose rows are ggml
//! blocks read in place from the memory map. [`CpuBackend`] runs the scalar kernels (the portable
//! reference) or, per [`Simd`], the SIMD ones where they exist.
//!
//! Threads split output rows (the engine's persistent workers, [`crate::workers`]): each output value is
//! computed by one thread with one fixed accumulation order, so results are bit-identical for any
//! thread count.

use crate::numerics::{Numerics, NumericsMode, Simd};
use crate::quant::{self, ktile, GgmlType, PreparedRow, Wide};
use crate::workers;

/// A weight matrix `[rows, cols]` (ggml `ne = [cols, rows]`) stored as ggml blocks, row-major.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    /// Element type of the blocks.
    pub ty: GgmlType,
    /// Output features (rows).
    pub rows: usize,
    /// Input features (row length in elements).
    pub cols: usize,
    /// `rows · row_bytes` bytes.
    pub data: &'a [u8],
    /// Where the load-time repacked copy of a Q4_0 or IQ4_NL matrix is kept once made (`quant::q4_0x8`:
    /// eight rows interleaved, llama.cpp's `block_q4_0x8` / `block_iq4_nlx8`, `quant::iq4_nlx8`), for
    /// the repacked gemv/gemm kernels; `None` for a matrix
    /// without one (any other type, or a view made without its `Weight`). Made on first use by the
    /// backend, so a session that never runs those kernels holds only the memory map.
    pub repacked: Option<&'a std::sync::OnceLock<Vec<u8>>>,
}

impl<'a> QMatrix<'a> {
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// The raw blocks of row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// The repacked copy of a Q4_0 or IQ4_NL matrix whose rows are a multiple of 8 (`quant::q4_0x8`, the
    /// same interleave for both: `quant::iq4_nlx8`), made now if it was not yet; `None` for another
    /// matrix or one without a place for the copy.
    pub(crate) fn q4_0x8(&self) -> Option<&'a [u8]> {
        let cell = self.repacked?;
        let rb = self.row_bytes();
        let fits = matches!(self.ty, GgmlType::Q4_0 | GgmlType::IQ4_NL)
            && quant::q4_0x8::packable(self.rows, rb)
            && self.ty.bytes_for(self.cols as u64) == Some(rb)
            && self.data.len() == self.rows * rb;
        fits.then(|| {
            cell.get_or_init(|| quant::q4_0x8::repack(self.data, self.rows, rb))
                .as_slice()
        })
    }
}

/// Reusable buffers for [`Backend::matmul`]; grows on first use and then allocates nothing.
#[derive(Debug, Default)]
pub struct MatmulScratch {
    prepared: Vec<PreparedRow>,
    /// The transposed scales of each full token group of a batch, for kernels that read them
    /// ([`quant::SimdKernel::uses_tiles`]): made once per matmul instead of once per task.
    tiles: Vec<f32>,
    /// The 16-token tiles of a batch's groups of 16 tokens, for kernels that have them
    /// ([`quant::SimdKernel::wide`]): made once per matmul; `wide_ok[g]` says whether group `g` has one.
    wide_tiles: Vec<quant::ktile::Line>,
    wide_ok: Vec<bool>,
    /// Per token and block `−8·Σ a` (Q4_0) or `−128·Σ a` (IQ4_NL) of the activation quants, for the
    /// repacked kernels (`quant::q4_0x8`, `quant::iq4_nlx8`): made once per matmul.
    q4_0x8_corr: Vec<i32>,
}

/// Computes quantized-weight × f32-activation products.
pub trait Backend: Send + Sync {
    /// Short name for reports (`scalar`, `avx2`, ...).
    fn name(&self) -> &'static str;

    /// `out[t · rows + r] = Σ_k W[r, k] · x[t · cols + k]` for `t < n_tokens`.
    /// `x`: `[n_tokens, cols]`; `out`: `[n_tokens, rows]`. Numerics per `num.mode` ([`NumericsMode`]); in
    /// ggml mode the kernels llama.cpp built for `num.target` picks ([`quant::ggml_path`]). `num.simd` is
    /// not read: the backend's own kernels run (a session keeps the two equal).
    ///
    /// Errors: the weight type has no kernel ([`crate::Error::Unsupported`]).
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        w: &QMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        num: Numerics,
        scratch: &mut MatmulScratch,
    ) -> crate::Result<()>;

    /// [`Backend::matmul`] of several matrices with one input: `outs[i]` = `x · ws[i]ᵀ` (`x`:
    /// `[n_tokens, cols]`, every `ws[i]` `cols` wide; `outs[i]`: `[n_tokens, ws[i].rows]`) — a layer's Q, K
    /// and V projections, or its gate and up. Every output has the bits [`Backend::matmul`] gives it;
    /// a backend may run the products together (one parallel region for all of them). The default runs
    /// them one after another.
    ///
    /// Errors: as [`Backend::matmul`]. Panics if `ws` and `outs` differ in length.
    fn matmul_shared(
        &self,
        ws: &[QMatrix<'_>],
        x: &[f32],
        n_tokens: usize,
        outs: &mut [&mut [f32]],
        num: Numerics,
        scratch: &mut MatmulScratch,
    ) -> crate::Result<()> {
        one_by_one(self, ws, x, n_tokens, outs, num, scratch)
    }
}

/// [`Backend::matmul_shared`] as one [`Backend::matmul`] after another.
fn one_by_one<B: Backend + ?Sized>(
    b: &B,
    ws: &[QMatrix<'_>],
    x: &[f32],
    n_tokens: usize,
    outs: &mut [&mut [f32]],
    num: Numerics,
    scratch: &mut MatmulScratch,
) -> crate::Result<()> {
    assert_eq!(ws.len(), outs.len(), "one output per matrix");
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        b.matmul(w, x, n_tokens, out, num, scratch)?;
    }
    Ok(())
}

/// The CPU backend: ggml-mode and reference-mode kernels from [`crate::quant`], the SIMD ones where
/// [`Simd`] selects them (scalar elsewhere), output rows split across the engine's workers
/// ([`crate::workers`]).
///
/// With SIMD on, batched products run several activation rows against each weight row at once (the weight
/// row is decoded once): groups of 16 tokens through the kernel's 16-token tiles where it has them
/// ([`quant::Wide`]), of 8 otherwise, the rest one by one; every output is still computed by one kernel call in one fixed order, so results
/// are bit-identical for any thread count and, in ggml mode, to [`Simd::Off`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend {
    simd: Simd,
    input_rounding: bool,
}

impl CpuBackend {
    /// A backend with the kernels of `simd`. A setting the CPU cannot run falls back to scalar kernels
    /// ([`Simd::parse`] refuses it earlier, with a message).
    pub fn new(simd: Simd) -> Self {
        CpuBackend {
            simd,
            input_rounding: false,
        }
    }

    /// In reference mode, round every matmul input as llama.cpp does before the f32 dot products
    /// ([`PreparedRow::prepare_rounded`]): the rounding probe. No effect in ggml mode, which rounds anyway.
    pub fn with_input_rounding(mut self, on: bool) -> Self {
        self.input_rounding = on;
        self
    }

    /// The SIMD setting.
    pub fn simd(&self) -> Simd {
        self.simd
    }
}

impl CpuBackend {
    /// A matmul on weight rows dequantized to f32 ([`quant::dequantize_row_with`] with this backend's
    /// SIMD setting: the portable dequantizers under [`Simd::Off`]; each row once for all tokens) against
    /// `prepared[t].x` (`out` as [`Backend::matmul`]'s). `lanes` `None`: the portable reference dot
    /// ([`quant::dot_dequantized`]) per output; `Some`: register tiles of rows × tokens in the 16-lane fma
    /// order (`quant::reference_fma`). Either way every output has one fixed order, so the bits
    /// do not depend on the batch size, the chunking or the thread count. Runs
    ///
    /// - reference mode (`lanes` from the SIMD setting): the bits of [`quant::vec_dot`] per token;
    /// - ggml mode's tinyBLAS of float weights (F32/F16 [`quant::GgmlPath::TinyBlas`], BF16
    ///   [`quant::GgmlPath::TinyBlasNoBf16`], rows of a multiple of 16): that path's one 16-lane fma
    ///   accumulator over chunks of 16 then `_mm512_reduce_add_ps` is exactly the 16-lane order, and
    ///   widening f16/bf16 to f32 is exact, so the tiles give [`quant::vec_dot_path`]'s bits.
    ///
    /// Fewer than 8 tokens with the AVX-512 lanes, on the types of [`quant::reference_fused_matmul`]: each
    /// block dequantized in registers and fused into the same order (the same bits, no row written out).
    /// A row that cannot be dequantized falls back to [`quant::vec_dot_path`]. `fault`: the
    /// [`crate::faults::Fault::ReferenceUnpack`] probe (reference mode only).
    fn dequantized_matmul(
        &self,
        w: &QMatrix<'_>,
        prepared: &[PreparedRow],
        out: &mut [f32],
        path: &(dyn Fn(usize) -> quant::GgmlPath + Sync),
        lanes: Option<quant::Lanes16>,
        fault: bool,
    ) {
        let base = OutPtr(out.as_mut_ptr());
        let (rows_total, cols) = (w.rows, w.cols);
        // the activation rows; a decode step's few on the stack (a decode step allocates nothing)
        let mut few: [&[f32]; 8] = [&[]; 8];
        let many: Vec<&[f32]>;
        let xs: &[&[f32]] = if prepared.len() <= few.len() {
            for (x, p) in few.iter_mut().zip(prepared) {
                *x = p.x();
            }
            &few[..prepared.len()]
        } else {
            many = prepared.iter().map(|p| p.x()).collect();
            &many
        };
        let n_tokens = prepared.len();
        // a decode step's few tokens: each block dequantized in registers and fused into the same 16-lane
        // order (`quant::reference_fused_matmul`), rather than rows written out and read back
        let rb = w.row_bytes();
        let fused = lanes == Some(quant::Lanes16::Avx512)
            && n_tokens < 8
            && !fault
            && quant::reference_fused_supported(w.ty)
            && w.ty.bytes_for(cols as u64) == Some(rb);
        par_row_chunks(rows_total, |r0, n_rows| {
            let put = |i: usize, t: usize, v: f32| {
                // SAFETY: `out` holds n_tokens·rows floats (checked by `matmul`) and outlives this scope;
                // the chunks' row ranges are disjoint, so each element is written by one task.
                unsafe { *base.get().add(t * rows_total + r0 + i) = v }
            };
            if fused {
                let rows = &w.data[r0 * rb..(r0 + n_rows) * rb];
                quant::reference_fused_matmul(w.ty, rows, rb, cols, xs, put);
                return;
            }
            // rows dequantized a few at a time: a decode step's four (the 4 × 1 tile, read back from
            // L1), a batch's enough to amortise the token groups, few enough to stay in L2
            let group = if n_tokens < 8 {
                4
            } else {
                (REFERENCE_ROW_BYTES / (4 * cols)).clamp(4, 64)
            };
            DEQ_SCRATCH.with(|buf| {
                let deq = &mut *buf.borrow_mut();
                if deq.len() < group * cols {
                    deq.resize(group * cols, 0.0);
                }
                let mut i0 = 0;
                while i0 < n_rows {
                    let g = group.min(n_rows - i0);
                    let mut ok = true;
                    for i in 0..g {
                        let d = &mut deq[i * cols..(i + 1) * cols];
                        ok &= quant::dequantize_row_with(w.ty, w.row(r0 + i0 + i), d, self.simd)
                            .is_ok();
                        if fault {
                            d.chunks_exact_mut(32).for_each(|b| b.rotate_left(16));
                        }
                    }
                    if !ok {
                        for i in i0..i0 + g {
                            for (t, p) in prepared.iter().enumerate() {
                                put(i, t, quant::vec_dot_path(w.ty, w.row(r0 + i), p, path(t)));
                            }
                        }
                    } else if let Some(lanes) = lanes {
                        quant::reference_fma_matmul(
                            lanes,
                            &deq[..g * cols],
                            cols,
                            xs,
                            |i, t, v| put(i0 + i, t, v),
                        );
                    } else {
                        for i in 0..g {
                            let d = &deq[i * cols..(i + 1) * cols];
                            for (t, p) in prepared.iter().enumerate() {
                                put(i0 + i, t, quant::dot_dequantized(d, p));
                            }
                        }
                    }
                    i0 += g;
                }
            });
        });
    }
}

impl CpuBackend {
    /// Ggml mode, F16 weights, every token on the AVX-512 build's tinyBLAS, AVX-512 kernels: the rows in
    /// chunks of about [`ROWS_PER_TASK`] (`batch_chunk_rows`), each chunk through
    /// [`quant::f16_tinyblas_matmul`] on the rows in the memory map and the activations' f16 bytes (`out`
    /// as [`Backend::matmul`]'s). Every output has tinyBLAS's one order, so the split changes no bits.
    fn f16_tinyblas_matmul(&self, w: &QMatrix<'_>, prepared: &[PreparedRow], out: &mut [f32]) {
        let xs: Vec<&[u8]> = prepared
            .iter()
            .map(|p| p.ggml_blocks().map_or(&[][..], |(_, b)| b))
            .collect();
        let base = OutPtr(out.as_mut_ptr());
        let (rows_total, rb) = (w.rows, w.row_bytes());
        par_row_chunks(rows_total, |r0, n_rows| {
            let rows = &w.data[r0 * rb..(r0 + n_rows) * rb];
            quant::f16_tinyblas_matmul(rows, rb, n_rows, &xs, |i, t, v| {
                // SAFETY: `out` holds n_tokens·rows floats (checked by `matmul`) and outlives this
                // scope; the chunks' row ranges are disjoint, so each element is written by one task.
                unsafe { *base.get().add(t * rows_total + r0 + i) = v }
            });
        });
    }

    /// Ggml mode, F32/F16/BF16 weights on the AVX2 build's tinyBLAS
    /// ([`quant::float_tinyblas_avx2_matmul`]): the row chunks in parallel, each through the tiles.
    fn float_tinyblas_avx2_matmul(
        &self,
        w: &QMatrix<'_>,
        prepared: &[PreparedRow],
        out: &mut [f32],
    ) {
        let xs: Vec<&[f32]> = prepared.iter().map(|p| p.x()).collect();
        let base = OutPtr(out.as_mut_ptr());
        let (rows_total, rb) = (w.rows, w.row_bytes());
        par_row_chunks(rows_total, |r0, n_rows| {
            let rows = &w.data[r0 * rb..(r0 + n_rows) * rb];
            quant::float_tinyblas_avx2_matmul(w.ty, rows, rb, n_rows, &xs, |i, t, v| {
                // SAFETY: `out` holds n_tokens·rows floats (checked by `matmul`) and outlives this
                // scope; the chunks' row ranges are disjoint, so each element is written by one task.
                unsafe { *base.get().add(t * rows_total + r0 + i) = v }
            });
        });
    }
}

thread_local! {
    /// Each worker's buffer of dequantized weight rows (`CpuBackend::dequantized_matmul`), kept across
    /// matmuls so that a task neither allocates nor zeroes pages.
    static DEQ_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Bytes of dequantized f32 weight rows a reference-mode task holds at once (the rows its tiles read for
/// every token group; about half a 1 MiB L2).
const REFERENCE_ROW_BYTES: usize = 256 << 10;

/// The output of a batched matmul shared by its row-chunk tasks, each of which writes a disjoint set of
/// elements (see [`CpuBackend`]'s `matmul`).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the tasks that share an `OutPtr` write disjoint elements (their weight rows), and the matmul
// that made it waits for all of them before `out` is used again.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    /// The pointer (a method, so that closures capture the whole `Send + Sync` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `f(r0, n_rows)` for every chunk of a batched matmul's `rows` weight rows ([`batch_chunk_rows`]), the
/// chunks as tasks of the persistent workers ([`workers::for_each`]).
fn par_row_chunks(rows: usize, f: impl Fn(usize, usize) + Sync + Send) {
    let chunk_rows = batch_chunk_rows(rows, workers::threads());
    workers::for_each(rows.div_ceil(chunk_rows), &|c| {
        f(c * chunk_rows, chunk_rows.min(rows - c * chunk_rows))
    });
}

thread_local! {
    /// Each worker's running sums of the repacked Q4_0 kernel (`quant::q4_0x8::gemm`: eight floats per
    /// token), kept across matmuls.
    static Q4_0X8_ACC: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Per token and block the repacked kernels' correction of `prepared` (`nb` blocks each) into `corr`,
/// grown as needed: `−8·Σ a` for Q4_0 (`ty`), `−128·Σ a` for IQ4_NL.
fn q4_0x8_corrections(ty: GgmlType, prepared: &[PreparedRow], nb: usize, corr: &mut Vec<i32>) {
    corr.resize(prepared.len() * nb, 0);
    for (c, p) in corr.chunks_exact_mut(nb).zip(prepared) {
        if ty == GgmlType::IQ4_NL {
            quant::iq4_nlx8::corrections(&p.qs, nb, c);
        } else {
            quant::q4_0x8::corrections(&p.qs, nb, c);
        }
    }
}

/// Rows `r0 .. r0 + n_rows` (a multiple of 8) of the product of a repacked Q4_0 or IQ4_NL (`ty`) matrix
/// `pk` (`nb` blocks a row) with every token of `acts`, token `t`'s outputs written by `out(t)` (`n_rows`
/// floats); `vnni`: the AVX-512 VNNI kernel (the same bits).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn q4_0x8_rows<'o>(
    ty: GgmlType,
    pk: &[u8],
    nb: usize,
    r0: usize,
    n_rows: usize,
    acts: &[quant::q4_0x8::Act<'_>],
    vnni: bool,
    out: impl FnMut(usize) -> &'o mut [f32],
) {
    let gb = nb * quant::q4_0x8::GROUP_BLOCK_BYTES;
    let (g0, g1) = (
        r0 / quant::q4_0x8::ROWS,
        (r0 + n_rows) / quant::q4_0x8::ROWS,
    );
    let pk = &pk[g0 * gb..g1 * gb];
    Q4_0X8_ACC.with(|acc| {
        let acc = &mut acc.borrow_mut();
        // SAFETY: the caller (`q4_0x8_for`) checked that this backend's AVX2 kernels run on this CPU,
        // and `vnni` is set for the Avx512 setting only, which runs only where AVX-512 VNNI is
        unsafe {
            match (ty, vnni) {
                (GgmlType::IQ4_NL, true) => quant::iq4_nlx8::gemm_vnni(pk, nb, acts, acc, out),
                (GgmlType::IQ4_NL, false) => quant::iq4_nlx8::gemm(pk, nb, acts, acc, out),
                (_, true) => quant::q4_0x8::gemm_vnni(pk, nb, acts, acc, out),
                (_, false) => quant::q4_0x8::gemm(pk, nb, acts, acc, out),
            }
        }
    });
}

/// The activations of `prepared` as the repacked kernel reads them (`corr`: [`q4_0x8_corrections`]).
#[cfg(target_arch = "x86_64")]
fn q4_0x8_acts<'a>(
    prepared: &'a [PreparedRow],
    corr: &'a [i32],
    nb: usize,
) -> Vec<quant::q4_0x8::Act<'a>> {
    prepared
        .iter()
        .zip(corr.chunks_exact(nb))
        .map(|(p, c)| quant::q4_0x8::Act {
            qs: &p.qs,
            d: &p.d,
            corr: c,
        })
        .collect()
}

/// A ggml-mode product of a Q4_0 matrix through its repacked copy `pk` ([`CpuBackend::q4_0x8_for`]):
/// row chunks (multiples of 8 rows) across the workers, every token of the batch against each group of
/// eight rows (`out` as [`Backend::matmul`]'s). Each output is the scalar repacked spec's, so neither the
/// split nor the batch size changes a bit.
fn q4_0x8_matmul(
    w: &QMatrix<'_>,
    pk: &[u8],
    prepared: &[PreparedRow],
    out: &mut [f32],
    corr: &mut Vec<i32>,
    vnni: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let nb = w.cols / 32;
        q4_0x8_corrections(w.ty, prepared, nb, corr);
        let acts = q4_0x8_acts(prepared, corr, nb);
        let base = OutPtr(out.as_mut_ptr());
        let rows = w.rows;
        par_row_chunks(rows, |r0, n_rows| {
            q4_0x8_rows(w.ty, pk, nb, r0, n_rows, &acts, vnni, |t| {
                // SAFETY: `out` holds n_tokens·rows floats (checked by `matmul`) and outlives this scope;
                // chunks are disjoint row ranges, and the kernel holds one token's slice at a time.
                unsafe { std::slice::from_raw_parts_mut(base.get().add(t * rows + r0), n_rows) }
            });
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("q4_0x8_for gives a repacked copy on x86-64 only: {w:?} {pk:?} {prepared:?} {out:?} {corr:?} {vnni}");
}

/// [`Backend::matmul_shared`]'s decode step when every matrix has its repacked Q4_0 copy (`packed[i]` of
/// `ws[i]`): every matrix's row chunks in one parallel region, each through [`q4_0x8_rows`].
fn q4_0x8_shared(
    ws: &[QMatrix<'_>],
    packed: &[&[u8]],
    x: &PreparedRow,
    outs: &mut [&mut [f32]],
    corr: &mut Vec<i32>,
    vnni: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let nb = ws[0].cols / 32;
        q4_0x8_corrections(ws[0].ty, std::slice::from_ref(x), nb, corr);
        let acts = q4_0x8_acts(std::slice::from_ref(x), corr, nb);
        let threads = workers::threads();
        let mut chunk_rows = [1usize; SHARED_MAX];
        let mut first = [0usize; SHARED_MAX + 1];
        let mut ptrs = [OutPtr(std::ptr::null_mut()); SHARED_MAX];
        for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
            assert_eq!(out.len(), w.rows, "matmul output size"); // the tasks write through a raw pointer
            chunk_rows[i] = batch_chunk_rows(w.rows, threads);
            first[i + 1] = first[i] + w.rows.div_ceil(chunk_rows[i]);
            ptrs[i] = OutPtr(out.as_mut_ptr());
        }
        workers::for_each(first[ws.len()], &|c| {
            let i = (0..ws.len()).rev().find(|&i| first[i] <= c).unwrap_or(0);
            let r0 = (c - first[i]) * chunk_rows[i];
            let n = chunk_rows[i].min(ws[i].rows - r0);
            q4_0x8_rows(ws[i].ty, packed[i], nb, r0, n, &acts, vnni, |_| {
                // SAFETY: task c alone writes rows r0 .. r0 + n of outs[i] (in bounds: r0 + n <= rows),
                // and outs outlive this loop
                unsafe { std::slice::from_raw_parts_mut(ptrs[i].get().add(r0), n) }
            });
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("q4_0x8_for gives a repacked copy on x86-64 only: {ws:?} {packed:?} {x:?} {outs:?} {corr:?} {vnni}");
}

/// Rows per task: large enough to amortise scheduling, small enough to balance two cores.
const ROWS_PER_TASK: usize = 64;

/// Weight rows per task of a matmul (a prompt batch or a decode step) of `rows` rows on `threads` workers: about
/// [`ROWS_PER_TASK`], a multiple of 8 (the kernels' row pairs and tiles), and such that the number of
/// chunks is a multiple of `threads`, so that no worker idles while another finishes a last chunk (576
/// rows in 64-row chunks on two workers split 5:4, in 48-row chunks 6:6; 192 rows 2:1 against 2:2).
/// Falls back to [`ROWS_PER_TASK`] when no size between it and a quarter of it does that. Rows are
/// independent, so the split never changes a result.
fn batch_chunk_rows(rows: usize, threads: usize) -> usize {
    let threads = threads.max(1);
    let first = rows.div_ceil(ROWS_PER_TASK).max(1);
    for n_chunks in first..=4 * first {
        let per = rows.div_ceil(n_chunks).div_ceil(8) * 8;
        if per >= ROWS_PER_TASK / 4 && rows.div_ceil(per) % threads == 0 {
            return per;
        }
    }
    ROWS_PER_TASK
}

/// Activation rows per SIMD kernel call in a batch (8 measured ~8% faster than 4 on a Qwen2.5 prompt, where
/// unpacking K-quant blocks is dear; the same on SmolLM2 Q4_1).
const TOKENS_PER_CALL: usize = 8;

/// Most matrices the CPU backend's [`Backend::matmul_shared`] runs in one parallel region.
const SHARED_MAX: usize = 4;

/// Rows `r0 .. r0 + out.len()` of a decode step's product (`out[i]` = row `r0 + i` · the one activation
/// row `x`), with the type's SIMD kernel where it has one (`path` its ggml path), else the scalar
/// `vec_dot` of that path.
fn decode_rows(
    w: &QMatrix<'_>,
    kernel: Option<quant::SimdKernel>,
    path: quant::GgmlPath,
    x: &PreparedRow,
    r0: usize,
    out: &mut [f32],
) {
    let Some(k) = kernel else {
        for (i, o) in out.iter_mut().enumerate() {
            *o = quant::vec_dot_path(w.ty, w.row(r0 + i), x, path);
        }
        return;
    };
    // one dispatch per chunk of rows (the kernel takes them eight at a time where it can)
    let rb = w.row_bytes();
    k.dot_rows(&w.data[r0 * rb..], rb, out.len(), [x], [path], [out]);
}

impl CpuBackend {
    /// The repacked copy of `w` (made now if it was not yet) when this product runs on the repacked
    /// Q4_0 or IQ4_NL kernels (`quant::q4_0x8`, `quant::iq4_nlx8`): ggml mode, this backend's setting
    /// `avx2`, `w` a Q4_0 or IQ4_NL matrix with a place for the copy and rows a multiple of 8, and every token on llama.cpp's repacked gemm or
    /// gemv — a gemv token without a −128 quant (the gemv's `sign` form wraps on one, which these
    /// kernels, exact there, do not mirror: such a product takes the other kernels); for IQ4_NL a batch
    /// of two tokens or more (a decode step keeps the file's layout). `None` otherwise.
    fn q4_0x8_for<'a>(
        &self,
        w: &QMatrix<'a>,
        mode: NumericsMode,
        prepared: &[PreparedRow],
        path: &dyn Fn(usize) -> quant::GgmlPath,
    ) -> Option<&'a [u8]> {
        // AVX2 only: with AVX-512 VNNI the sixteen-row nibble tiles (prefill) and the eight-row gemv
        // (decode) on the file's layout measured faster than the copy (Q4_0 pp512 0.52x, tg128 0.64x
        // [0.35, 1.11] on a 2-core Xeon; IQ4_NL pp512 0.84x [0.65, 0.97], issue 45); the `gemm_vnni`
        // kernels stay tested for a later layout
        // IQ4_NL on a batch only: a decode step through the copy measured 0.74x [0.66, 0.83] of the
        // eight-row gemv on the file's layout (`avx2::dot_q4_0_repacked_rows8`), a prompt 1.4x faster
        // (SmolLM2 IQ4_NL tg128 / pp512 on 2 cores, issue 45)
        if w.ty == GgmlType::IQ4_NL && prepared.len() < 2 {
            return None;
        }
        if mode != NumericsMode::Ggml
            || self.simd != Simd::Avx2
            || !self.simd.avx2_kernels()
            || !cfg!(target_arch = "x86_64")
            || !matches!(w.ty, GgmlType::Q4_0 | GgmlType::IQ4_NL)
            || w.repacked.is_none()
        {
            return None;
        }
        let on_repack = prepared.iter().enumerate().all(|(t, p)| match path(t) {
            quant::GgmlPath::RepackGemm => true,
            quant::GgmlPath::RepackGemv => !p.has_min_quant,
            _ => false,
        });
        on_repack.then(|| w.q4_0x8()).flatten()
    }

    /// The activation rows of a product with `w` (`x`: `[n_tokens, w.cols]`) in `scratch.prepared`:
    /// quantized as ggml's `vec_dot_type` of `w.ty` in ggml mode, kept in f32 (or rounded, with
    /// `input_rounding`) in reference mode ([`PreparedRow`]). Errors: the weight type has no kernel.
    fn prepare(
        &self,
        w: &QMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        mode: NumericsMode,
        scratch: &mut MatmulScratch,
    ) -> crate::Result<()> {
        if scratch.prepared.len() < n_tokens {
            scratch.prepared.resize_with(n_tokens, PreparedRow::new);
        }
        // each row is quantized on its own (ggml quantizes per block), so the split changes nothing;
        // the first failing row's error is the one reported
        let failed = std::sync::Mutex::new(None::<(usize, crate::Error)>);
        workers::for_each_chunk_mut(&mut scratch.prepared[..n_tokens], 1, |t, p| {
            let xt = &x[t * w.cols..(t + 1) * w.cols];
            let simd = self.simd != Simd::Off;
            let r = if self.input_rounding && mode == NumericsMode::Reference {
                p[0].prepare_rounded(w.ty, xt, simd)
            } else {
                p[0].prepare_simd(w.ty, mode, xt, simd)
            };
            if let Err(e) = r {
                let mut f = failed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if f.as_ref().is_none_or(|(t0, _)| t < *t0) {
                    *f = Some((t, e));
                }
            }
        });
        match failed
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        match self.simd {
            Simd::Off => "scalar",
            Simd::Avx2 => "avx2",
            Simd::Avx512 => "avx512",
        }
    }

    /// A decode step's products in ggml mode, all of one weight type: the activation row quantized once
    /// and every matrix's row chunks ([`batch_chunk_rows`]) in one parallel region — one fork and join
    /// for a layer's Q, K and V instead of three (each chunk through the kernel [`Backend::matmul`]
    /// gives it, so the same bits). Anything else goes one product at a time.
    fn matmul_shared(
        &self,
        ws: &[QMatrix<'_>],
        x: &[f32],
        n_tokens: usize,
        outs: &mut [&mut [f32]],
        num: Numerics,
        scratch: &mut MatmulScratch,
    ) -> crate::Result<()> {
        let together = n_tokens == 1
            && num.mode == NumericsMode::Ggml
            && (2..=SHARED_MAX).contains(&ws.len())
            && ws.iter().all(|w| w.ty == ws[0].ty && w.cols == ws[0].cols);
        if !together || ws.len() != outs.len() {
            return one_by_one(self, ws, x, n_tokens, outs, num, scratch);
        }
        debug_assert_eq!(x.len(), ws[0].cols);
        self.prepare(&ws[0], x, 1, num.mode, scratch)?;
        // the repacked Q4_0 copies: every matrix's groups of eight rows in one parallel region
        let path0 = |w: &QMatrix<'_>| {
            let p = quant::ggml_path(w.ty, w.rows, w.cols, 1, 0, num.target);
            move |_: usize| p
        };
        let packed: Option<Vec<&[u8]>> = ws
            .iter()
            .map(|w| self.q4_0x8_for(w, num.mode, &scratch.prepared[..1], &path0(w)))
            .collect();
        if let Some(packed) = packed {
            let vnni = self.simd == Simd::Avx512;
            q4_0x8_shared(
                ws,
                &packed,
                &scratch.prepared[0],
                outs,
                &mut scratch.q4_0x8_corr,
                vnni,
            );
            return Ok(());
        }
        let prepared = &scratch.prepared[0];
        let kernel = quant::simd_kernel(num.with_simd(self.simd), ws[0].ty);
        let threads = workers::threads();
        // matrix i's chunks are tasks first[i] .. first[i + 1], of chunk_rows[i] rows each
        let mut chunk_rows = [1usize; SHARED_MAX];
        let mut first = [0usize; SHARED_MAX + 1];
        let mut paths = [quant::GgmlPath::VecDot; SHARED_MAX];
        let mut ptrs = [OutPtr(std::ptr::null_mut()); SHARED_MAX];
        for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
            assert_eq!(out.len(), w.rows, "matmul output size"); // the tasks write through a raw pointer
            chunk_rows[i] = batch_chunk_rows(w.rows, threads);
            first[i + 1] = first[i] + w.rows.div_ceil(chunk_rows[i]);
            paths[i] = quant::ggml_path(w.ty, w.rows, w.cols, 1, 0, num.target);
            ptrs[i] = OutPtr(out.as_mut_ptr());
        }
        workers::for_each(first[ws.len()], &|c| {
            let i = (0..ws.len()).rev().find(|&i| first[i] <= c).unwrap_or(0);
            let r0 = (c - first[i]) * chunk_rows[i];
            let n = chunk_rows[i].min(ws[i].rows - r0);
            // SAFETY: task c alone writes rows r0 .. r0 + n of outs[i] (in bounds: r0 + n <= rows =
            // outs[i].len()), and outs outlive this loop
            let out = unsafe { std::slice::from_raw_parts_mut(ptrs[i].get().add(r0), n) };
            decode_rows(&ws[i], kernel, paths[i], prepared, r0, out);
        });
        Ok(())
    }

    fn matmul(
        &self,
        w: &QMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        num: Numerics,
        scratch: &mut MatmulScratch,
    ) -> crate::Result<()> {
        let Numerics { mode, target, .. } = num;
        debug_assert_eq!(x.len(), n_tokens * w.cols);
        assert_eq!(out.len(), n_tokens * w.rows, "matmul output size"); // the tasks write through a raw pointer
        self.prepare(w, x, n_tokens, mode, scratch)?;
        let prepared = &scratch.prepared[..n_tokens];
        // the ggml kernel of each batch row (llama.cpp's choice depends on the batch size)
        let path = |t: usize| quant::ggml_path(w.ty, w.rows, w.cols, n_tokens, t, target);
        // the SIMD kernel of this weight type, or none (each call is given its rows' ggml paths)
        let kernel = quant::simd_kernel(num.with_simd(self.simd), w.ty);
        if mode == NumericsMode::Reference {
            let lanes = (self.simd != Simd::Off).then(|| quant::Lanes16::for_simd(self.simd));
            let fault =
                w.ty == GgmlType::Q4_1 && crate::faults::is(crate::faults::Fault::ReferenceUnpack);
            self.dequantized_matmul(w, prepared, out, &path, lanes, fault);
            return Ok(());
        }
        // float weights in a batch on llama.cpp's tinyBLAS whose arithmetic is the 16-lane fma order:
        // widened once per row, tiles of rows × tokens (see `dequantized_matmul`)
        let tinyblas16 = |t: usize| {
            matches!(
                (w.ty, path(t)),
                (GgmlType::F32 | GgmlType::F16, quant::GgmlPath::TinyBlas)
                    | (GgmlType::BF16, quant::GgmlPath::TinyBlasNoBf16)
            )
        };
        if self.simd != Simd::Off
            && n_tokens >= 2
            && w.cols.is_multiple_of(16)
            && (0..n_tokens).all(tinyblas16)
        {
            let lanes = quant::Lanes16::for_simd(self.simd);
            if w.ty == GgmlType::F16
                && lanes == quant::Lanes16::Avx512
                && quant::f16_tiles_available()
            {
                self.f16_tinyblas_matmul(w, prepared, out);
                return Ok(());
            }
            self.dequantized_matmul(w, prepared, out, &path, Some(lanes), false);
            return Ok(());
        }
        // float weights in a batch on the AVX2 build's tinyBLAS (one 8-lane accumulator per output):
        // register tiles of rows × tokens with the weights widened inside (`float_tile_avx2.rs`)
        if self.simd != Simd::Off
            && n_tokens >= 2
            && matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
            && w.cols.is_multiple_of(8)
            && w.ty.bytes_for(w.cols as u64) == Some(w.row_bytes())
            && quant::float_tiles_avx2_available()
            && (0..n_tokens).all(|t| path(t) == quant::GgmlPath::TinyBlasAvx2)
        {
            self.float_tinyblas_avx2_matmul(w, prepared, out);
            return Ok(());
        }
        if let Some(pk) = self.q4_0x8_for(w, mode, prepared, &path) {
            let vnni = self.simd == Simd::Avx512;
            q4_0x8_matmul(w, pk, prepared, out, &mut scratch.q4_0x8_corr, vnni);
            return Ok(());
        }
        if n_tokens == 1 {
            let p = path(0);
            // an even split of the chunks: with fixed 64-row chunks a decode step's K and V (192 rows)
            // ran 2:1 on two workers, its 576-row matrices 5:4 (SmolLM2 Q4_0 tg128 sample 1.07x faster)
            let chunk_rows = batch_chunk_rows(w.rows, workers::threads());
            workers::for_each_chunk_mut(out, chunk_rows, |c, chunk| {
                decode_rows(w, kernel, p, &prepared[0], c * chunk_rows, chunk)
            });
            return Ok(());
        }
        // Tasks are chunks of about ROWS_PER_TASK weight rows (batch_chunk_rows), each writing its rows of every token's output
        // row: row-major over weight rows, so each row's blocks are read once for all tokens.
        // the token groups' transposed scales, once for every task (16 floats per block and group)
        let full = n_tokens - n_tokens % TOKENS_PER_CALL;
        let tile_len = 16 * prepared.first().map_or(0, |p| p.n_blocks());
        let tiled = kernel.is_some_and(|k| k.uses_tiles()) && tile_len > 0;
        if tiled {
            let groups = full / TOKENS_PER_CALL;
            scratch.tiles.resize(groups * tile_len, 0.0);
            workers::for_each_chunk_mut(&mut scratch.tiles, tile_len, |g, t| {
                let t0 = g * TOKENS_PER_CALL;
                let xs: [&PreparedRow; TOKENS_PER_CALL] =
                    std::array::from_fn(|j| &prepared[t0 + j]);
                quant::tile_scales(xs, t);
            });
        }
        let tiles = &scratch.tiles;
        // the 16-token tiles (quant::Wide) of each group of 16 tokens whose rows the tile accepts (one
        // path the tile has, all rows on it; no −128 quant for the pair tiles), once for every task;
        // the other groups run as two 8-token calls below
        let w16 = Wide::TOKENS;
        let wide = kernel.and_then(|k| k.wide());
        let w_len = wide.map_or(0, |wd| {
            wd.lines(prepared.first().map_or(0, |p| p.n_blocks()))
        });
        scratch.wide_ok.clear();
        if let Some(wd) = wide.filter(|_| w_len > 0) {
            scratch.wide_ok.extend((0..n_tokens / w16).map(|g| {
                let t0 = g * w16;
                let xs: [&PreparedRow; Wide::TOKENS] = std::array::from_fn(|j| &prepared[t0 + j]);
                (t0..t0 + w16).all(|t| path(t) == path(t0)) && wd.accepts(&xs, path(t0))
            }));
            scratch
                .wide_tiles
                .resize(scratch.wide_ok.len() * w_len, ktile::Line::default());
            let ok = &scratch.wide_ok;
            workers::for_each_chunk_mut(&mut scratch.wide_tiles, w_len, |g, t| {
                if ok[g] {
                    wd.build(std::array::from_fn(|j| &prepared[g * w16 + j]), t);
                }
            });
        }
        let (wide_ok, wide_tiles) = (&scratch.wide_ok, &scratch.wide_tiles);
        let base = OutPtr(out.as_mut_ptr());
        let (rows_total, rb) = (w.rows, w.row_bytes());
        par_row_chunks(rows_total, |r0, n_rows| {
            // token t's outputs of this chunk: out[t·rows + r0 .. + n_rows]
            let token_out = |t: usize| -> &mut [f32] {
                // SAFETY: `out` holds n_tokens·rows floats (checked above) and outlives this scope; the
                // chunks' row ranges are disjoint, and within a chunk each token's range is taken once
                // per kernel call (distinct t), so no two live slices overlap.
                unsafe {
                    std::slice::from_raw_parts_mut(base.get().add(t * rows_total + r0), n_rows)
                }
            };
            let Some(k) = kernel else {
                for i in 0..n_rows {
                    let row = w.row(r0 + i);
                    for (t, p) in prepared.iter().enumerate() {
                        token_out(t)[i] = quant::vec_dot_path(w.ty, row, p, path(t));
                    }
                }
                return;
            };
            // token groups outermost: the group's activations stay in L1 across the chunk's rows
            let rows = &w.data[r0 * rb..];
            let group8 = |t0: usize| {
                let xs: [&PreparedRow; TOKENS_PER_CALL] =
                    std::array::from_fn(|j| &prepared[t0 + j]);
                let paths = std::array::from_fn(|j| path(t0 + j));
                let outs = std::array::from_fn(|j| token_out(t0 + j));
                let g = t0 / TOKENS_PER_CALL;
                let tile = tiled.then(|| &tiles[g * tile_len..(g + 1) * tile_len]);
                k.dot_rows_tiled(rows, rb, n_rows, xs, paths, outs, tile);
            };
            // the 16-token groups with a tile, the others as two groups of 8; then the last group of 8
            // and the tokens after it one by one
            for (g, &ok) in wide_ok.iter().enumerate() {
                let t0 = g * w16;
                if ok {
                    let outs = std::array::from_fn(|j| token_out(t0 + j));
                    let tile = &wide_tiles[g * w_len..(g + 1) * w_len];
                    k.dot_rows_wide(rows, rb, n_rows, tile, path(t0), outs);
                } else {
                    group8(t0);
                    group8(t0 + TOKENS_PER_CALL);
                }
            }
            for t0 in (wide_ok.len() * w16..full).step_by(TOKENS_PER_CALL) {
                group8(t0);
            }
            for (t, x) in prepared.iter().enumerate().skip(full) {
                k.dot_rows(rows, rb, n_rows, [x], [path(t)], [token_out(t)]);
            }
        });
        Ok(())
    }
}

#[cfg(test)]
/// Run the whole ggml-mode matmul of `m` on `x` (`[n_tokens, m.cols]`) through the backend with SIMD
/// off, AVX2 and AVX-512, and require the same bits in every output (`what` names the case).
pub(crate) fn assert_matmul_same_bits_on_every_simd(
    m: &QMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    what: &str,
) {
    use crate::numerics::{GgmlTarget, Numerics, Simd};
    use crate::quant::test_rng::same;
    let run = |simd: Simd| {
        let mut out = vec![0f32; n_tokens * m.rows];
        let num = Numerics::ggml(GgmlTarget::default()).with_simd(simd);
        CpuBackend::new(simd)
            .matmul(m, x, n_tokens, &mut out, num, &mut MatmulScratch::default())
            .unwrap();
        out
    };
    let (off, avx2, avx512) = (run(Simd::Off), run(Simd::Avx2), run(Simd::Avx512));
    for (i, ((a, b), c)) in off.iter().zip(&avx2).zip(&avx512).enumerate() {
        assert!(
            same(*a, *b) && same(*a, *c),
            "{what} tokens {n_tokens} output {i}: off {a:e} avx2 {b:e} avx512 {c:e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rayon pools of one and two worker threads (a result must not depend on the split).
    fn one_and_two_workers() -> Vec<rayon::ThreadPool> {
        [1, 2]
            .into_iter()
            .map(|n| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .unwrap()
            })
            .collect()
    }

    /// A reference-mode matmul (each row dequantized once for all tokens; with SIMD on, register tiles in
    /// the 16-lane fma order) gives the bits of the per-token dequantizing dot product ([`quant::vec_dot`]
    /// of a row prepared with the same SIMD setting), for every SIMD setting this CPU has, batch sizes
    /// below, at and above the tiles' token groups (1 = decode), row counts over several chunks with
    /// remainders, one and two worker threads, and row lengths that are not a multiple of 8 or 16 for
    /// the float types. So the bits depend neither on the batch size, the tiling, the chunking nor the
    /// thread count.
    #[test]
    fn reference_batch_dequantizes_once_with_the_per_token_bits() {
        let mut rng = crate::quant::test_rng::Rng(0x2545_f491_4f6c_dd1du64);
        let mut rnd = move || rng.uniform();
        let pools = one_and_two_workers();
        for (ty, cols, rows) in [
            (GgmlType::Q4_0, 64, 19),
            (GgmlType::Q4_1, 96, 19),
            (GgmlType::Q5_0, 64, 19),
            (GgmlType::Q8_0, 64, 19),
            (GgmlType::Q4_K, 256, 67),
            (GgmlType::Q6_K, 512, 9),
            (GgmlType::F16, 36, 19),
            (GgmlType::BF16, 36, 19),
            (GgmlType::F32, 37, 131),
        ] {
            let wf: Vec<f32> = (0..rows * cols).map(|_| rnd() * 0.1).collect();
            let data = quant::quantize_row(ty, &wf).unwrap();
            let w = QMatrix {
                ty,
                rows,
                cols,
                data: &data,
                repacked: None,
            };
            for n_tokens in [1, 5, 17] {
                let x: Vec<f32> = (0..n_tokens * cols).map(|_| rnd() * 3.0).collect();
                let simds = [Simd::Off, Simd::Avx2, Simd::Avx512];
                for simd in simds.into_iter().filter(|s| s.available()) {
                    for pool in &pools {
                        let mut out = vec![0f32; n_tokens * rows];
                        pool.install(|| {
                            CpuBackend::new(simd).matmul(
                                &w,
                                &x,
                                n_tokens,
                                &mut out,
                                Numerics::reference(),
                                &mut MatmulScratch::default(),
                            )
                        })
                        .unwrap();
                        for t in 0..n_tokens {
                            let mut p = PreparedRow::new();
                            let xt = &x[t * cols..(t + 1) * cols];
                            p.prepare_simd(ty, NumericsMode::Reference, xt, simd != Simd::Off)
                                .unwrap();
                            for r in 0..rows {
                                let want = quant::vec_dot(ty, w.row(r), &p);
                                assert_eq!(
                                    out[t * rows + r].to_bits(),
                                    want.to_bits(),
                                    "{ty} {simd:?} {n_tokens} tokens, token {t} row {r}, {} threads",
                                    pool.current_num_threads()
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Ggml mode, float weights: a batched matmul with SIMD on (tiles of widened rows × tokens where the
    /// path is a 16-lane tinyBLAS or the AVX2 build's 8-lane one, the `dot_float` kernels elsewhere) gives the scalar kernel's bits
    /// ([`quant::vec_dot_path`] on the path llama.cpp takes) for every output, for every ggml target
    /// (tinyBLAS, tinyBLAS without AVX512-BF16, the AVX2 build's), batch sizes around the token groups,
    /// row counts that are (tinyBLAS) and are not (vec_dot) a multiple of 4, and values spanning many
    /// binades, including f16 subnormals.
    #[test]
    fn float_batches_give_the_scalar_bits_on_every_path() {
        use crate::numerics::GgmlTarget;
        let mut rng = crate::quant::test_rng::Rng(0x9e37_79b9_7f4a_7c15u64);
        let mut rnd = move || rng.uniform();
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for (rows, cols) in [(12, 64), (36, 96), (13, 64), (8, 40)] {
                let wf: Vec<f32> = (0..rows * cols)
                    .map(|i| rnd() * (2f32).powi((i % 29) as i32 - 20))
                    .collect();
                let data = quant::quantize_row(ty, &wf).unwrap();
                let w = QMatrix {
                    ty,
                    rows,
                    cols,
                    data: &data,
                    repacked: None,
                };
                for n_tokens in [2, 8, 13] {
                    let x: Vec<f32> = (0..n_tokens * cols).map(|_| rnd() * 3.0).collect();
                    for target in GgmlTarget::ALL {
                        let num = Numerics::ggml(target);
                        for simd in [Simd::Avx2, Simd::Avx512]
                            .into_iter()
                            .filter(|s| s.available())
                        {
                            let mut out = vec![0f32; n_tokens * rows];
                            CpuBackend::new(simd)
                                .matmul(
                                    &w,
                                    &x,
                                    n_tokens,
                                    &mut out,
                                    num,
                                    &mut MatmulScratch::default(),
                                )
                                .unwrap();
                            for t in 0..n_tokens {
                                let mut p = PreparedRow::new();
                                let xt = &x[t * cols..(t + 1) * cols];
                                p.prepare(ty, NumericsMode::Ggml, xt).unwrap();
                                let path = quant::ggml_path(ty, rows, cols, n_tokens, t, target);
                                for r in 0..rows {
                                    let want = quant::vec_dot_path(ty, w.row(r), &p, path);
                                    assert_eq!(
                                        out[t * rows + r].to_bits(),
                                        want.to_bits(),
                                        "{ty} {target:?} {simd:?} {path:?} {rows}x{cols}, {n_tokens} tokens: ({t}, {r})"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Several products with one input ([`Backend::matmul_shared`]: a decode step's Q, K and V in one
    /// parallel region) give each product's own [`Backend::matmul`] bits, in ggml mode for every SIMD
    /// setting this CPU has, on one and two workers; with row counts that are (repacked gemv) and are
    /// not a multiple of 8, one chunk and several; and where the products cannot run together (a batch,
    /// mixed weight types, reference mode).
    #[test]
    fn shared_products_give_each_products_own_bits() {
        use crate::numerics::GgmlTarget;
        let mut rng = crate::quant::test_rng::Rng(0x6a09_e667_f3bc_c908u64);
        let mut rnd = move || rng.uniform();
        let pools = one_and_two_workers();
        let cols = 256;
        let types = [
            [GgmlType::Q4_0; 3],
            [GgmlType::IQ4_NL; 3],
            [GgmlType::Q4_1; 3],
            [GgmlType::Q8_0; 3],
            [GgmlType::Q4_K; 3],
            [GgmlType::Q6_K; 3],
            [GgmlType::F16; 3],
            [GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K],
        ];
        for tys in types {
            let rows = [200, 72, 19];
            let data: Vec<Vec<u8>> = tys
                .iter()
                .zip(rows)
                .map(|(&ty, r)| {
                    let wf: Vec<f32> = (0..r * cols).map(|_| rnd() * 0.1).collect();
                    quant::quantize_row(ty, &wf).unwrap()
                })
                .collect();
            let ws: Vec<QMatrix> = (0..3)
                .map(|i| QMatrix {
                    ty: tys[i],
                    rows: rows[i],
                    cols,
                    data: &data[i],
                    repacked: None,
                })
                .collect();
            for n_tokens in [1, 3] {
                let x: Vec<f32> = (0..n_tokens * cols).map(|_| rnd() * 3.0).collect();
                for num in [Numerics::ggml(GgmlTarget::default()), Numerics::reference()] {
                    let simds = [Simd::Off, Simd::Avx2, Simd::Avx512];
                    for simd in simds.into_iter().filter(|s| s.available()) {
                        let b = CpuBackend::new(simd);
                        let num = num.with_simd(simd);
                        for pool in &pools {
                            let (mut o0, mut o1, mut o2) = (
                                vec![0f32; n_tokens * rows[0]],
                                vec![0f32; n_tokens * rows[1]],
                                vec![0f32; n_tokens * rows[2]],
                            );
                            pool.install(|| {
                                b.matmul_shared(
                                    &ws,
                                    &x,
                                    n_tokens,
                                    &mut [&mut o0, &mut o1, &mut o2],
                                    num,
                                    &mut MatmulScratch::default(),
                                )
                            })
                            .unwrap();
                            for (i, got) in [o0, o1, o2].iter().enumerate() {
                                let mut want = vec![0f32; n_tokens * rows[i]];
                                let mut scratch = MatmulScratch::default();
                                b.matmul(&ws[i], &x, n_tokens, &mut want, num, &mut scratch)
                                    .unwrap();
                                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                                    assert_eq!(
                                        g.to_bits(),
                                        w.to_bits(),
                                        "{tys:?} {:?} {simd:?} {n_tokens} tokens, {} threads: \
                                         matrix {i} output {j}",
                                        num.mode,
                                        pool.current_num_threads()
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
    fn batch_chunks_split_evenly_over_the_workers() {
        for threads in 1..=8 {
            for rows in [8usize, 64, 192, 576, 640, 896, 1536, 4864, 49152, 100, 1000] {
                let per = batch_chunk_rows(rows, threads);
                assert!(
                    per.is_multiple_of(8) && per > 0,
                    "{rows} rows, {threads} threads: {per}"
                );
                let n = rows.div_ceil(per);
                if per != ROWS_PER_TASK {
                    assert_eq!(
                        n % threads,
                        0,
                        "{rows} rows, {threads} threads: {per}-row chunks"
                    );
                    assert!((ROWS_PER_TASK / 4..=ROWS_PER_TASK).contains(&per));
                }
            }
        }
        // the shapes of the models in models.toml, on two workers
        assert_eq!(batch_chunk_rows(576, 2), 48);
        assert_eq!(batch_chunk_rows(192, 2), 48);
        assert_eq!(batch_chunk_rows(1536, 2), 64);
    }
}
