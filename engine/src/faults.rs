//! A test-only fault switch: realistic porting bugs the engine can be told to make, so that the harness's
//! mutation suite (`harness/tests/mutants.rs`) can prove that `lockstep run`'s gate catches each one and
//! `lockstep bisect` names the layer, stage kind and phase where it enters.
//!
//! The switch exists only with the cargo feature `faults` (the harness enables it for its tests through a
//! dev-dependency). Without it [`active`] is a constant `None`, every fault branch is dead code the
//! optimizer removes, and nothing can turn a fault on. With it, one fault at a time is active for the whole
//! process ([`set`]): a test that flips it must be the only one in its test binary, which nextest's
//! process-per-test model guarantees.

/// A porting bug. Each variant names where the engine applies it; the stage where its effect first shows
/// depends on the model (e.g. the first Q4_1 or Q4_K tensor in forward order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// RoPE pairs laid out the other way: NeoX half-split for a NORM model and vice versa.
    RopePairing,
    /// RoPE base θ read as 10000 (llama.cpp's default when the key is missing) instead of the file's value.
    RopeBase,
    /// A single-token (decode) batch rotated at `n_past − 1` instead of `n_past`.
    RopeDecodePosition,
    /// RMSNorm epsilon a tenth of the file's (1e-6 for 1e-5), in every norm.
    NormEps,
    /// Keys and values of a batch written at `t` instead of `n_past + t` (only decode is affected).
    KvWritePosition,
    /// GQA: query head `h` reads KV head `h mod n_kv_head` instead of `h / (n_head / n_kv_head)`.
    GqaHeadMap,
    /// The softmax scale applied twice: `kq_scale / √head_dim` (1/head_dim for Llama).
    AttnScale,
    /// No causal mask inside a prompt batch: every token attends to the whole batch.
    CausalMaskOff,
    /// `ffn_gate` and `ffn_up` weights swapped, in every layer.
    GateUpSwapped,
    /// The other GLU activation (tanh-GELU for SiLU, SiLU for tanh-GELU) in this layer only.
    WrongActivation {
        /// Block index.
        layer: usize,
    },
    /// The FFN's residual add missing in this layer: `out = ffn_out` instead of `ffn_inp + ffn_out`.
    MissingResidual {
        /// Block index.
        layer: usize,
    },
    /// A quant format's minimum misread: Q4_1's `m` read from the scale's bytes (`m = d`), Q4_K's six-bit
    /// mins read from the scales' bits (`m = sc`); in both the dequantization and the `vec_dot` kernels.
    QuantMinMisread,
    /// The final RMSNorm skipped: the logits read the raw residual stream.
    FinalNormSkipped,
    /// Q/K/V biases not added (Qwen2).
    QkvBiasMissing,
    /// The embedding's √d_model scale not applied (Gemma).
    EmbedScaleMissing,
    /// A Q4_1 unpack error in code only reference mode runs: the weight rows its matmuls dequantize take
    /// each block's two 16-element halves in the wrong order. ggml mode's kernels and the embedding's row
    /// lookup are right, so ggml mode still matches llama.cpp bit for bit: the case where bisect's ggml
    /// cross-check alone would call the gap llama.cpp's rounding (issue 29, item 8).
    ReferenceUnpack,
    /// Soft-capping missing (Gemma 2): the attention scores and the final logits are not capped.
    SoftcapMissing,
    /// The sliding window off by one: a key `window` positions back is still visible (`pos − p ≤ window`
    /// instead of `< window`).
    WindowOffByOne,
    /// A fused Q/K/V projection (`attn_qkv`, Phi-3) split with the K and V column ranges swapped: k read
    /// at offset `n_embd_q + n_embd_k`, v at `n_embd_q`.
    FusedQkvSplit,
    /// LayerNorm's bias not added (`build_norm(LLM_NORM)` without its `ggml_add`), in every LayerNorm
    /// (StarCoder2, StableLM).
    LayerNormBiasDropped,
    /// Partial rotary ignored: every dimension of each head rotated (with the angles of a head_dim-wide
    /// RoPE) instead of the first `rope.dimension_count` (StableLM).
    PartialRotaryDims,
    /// A causal mask applied in an encoder (BERT): query `t` sees keys `0..=t` only, as a decoder's would.
    EncoderCausalMask,
    /// The token-type embedding (`token_types` row 0, "sentence A") not added to BERT's input embedding.
    TokenTypeDropped,
    /// The pooling of an encoder's output swapped: the CLS row for a mean-pooled model, the mean for a
    /// CLS-pooled one (`bert.pooling_type` misread).
    PoolingWrong,
}

#[cfg(feature = "faults")]
static ACTIVE: std::sync::Mutex<Option<Fault>> = std::sync::Mutex::new(None);

#[cfg(feature = "faults")]
static ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turn `fault` on for the whole process (`None`: the unbroken engine).
#[cfg(feature = "faults")]
pub fn set(fault: Option<Fault>) {
    let mut g = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    *g = fault;
    ON.store(fault.is_some(), std::sync::atomic::Ordering::SeqCst);
}

/// The active fault, if any (always `None` without the `faults` feature).
#[inline]
pub fn active() -> Option<Fault> {
    #[cfg(feature = "faults")]
    {
        if !ON.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        *ACTIVE.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(feature = "faults"))]
    {
        None
    }
}

/// True when `fault` is the active one.
#[inline]
pub fn is(fault: Fault) -> bool {
    active() == Some(fault)
}
