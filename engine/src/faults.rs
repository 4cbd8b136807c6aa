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
    /// Learned absolute positions off by one in decode (GPT-2): a single-token batch at `n_past` adds
    /// `position_embd[n_past − 1]` instead of `position_embd[n_past]`.
    PosEmbdOffset,
    /// The per-head Q/K RMSNorms (`attn_q_norm`, `attn_k_norm`: Qwen3, Gemma 3, Gemma 4) applied after RoPE
    /// instead of before it. The engine then emits `q_rope`/`k_rope` (rotated, not yet normed) before
    /// `q_norm`/`k_norm` — out of the reference's forward order, where the norms come first and already
    /// differ from the second position on (RoPE at position 0 is the identity).
    QkNormAfterRope,
    /// GELU computed exactly, `0.5·x·(1 + erf(x/√2))` (HF `gelu`), where the model's is the tanh
    /// approximation (`gelu_pytorch_tanh`, ggml's `ggml_gelu`): GeGLU (Gemma) and the plain GELU FFN (GPT-2,
    /// StarCoder2), in both modes. A small error (stage NMSE ~1e-7) that f16 golden storage would hide.
    GeluErf,
    /// The K norm skipped (Qwen3, Gemma 3, Gemma 4): K goes to RoPE un-normed and no `k_norm` is emitted.
    KNormSkipped,
    /// The attention soft-cap read from `final_logit_softcapping` instead of `attn_logit_softcapping`
    /// (Gemma 2: 30 instead of the seeded model's 5, or the real models' 50).
    AttnSoftcapFromFinal,
    /// RoPE frequency factors (`rope_freqs.weight`) ignored: every pair of a Gemma 4 full-attention head
    /// turns, instead of the quarter its "proportional" RoPE turns.
    RopeFreqFactorsIgnored,
    /// A causal mask applied in an encoder (BERT): query `t` sees keys `0..=t` only, as a decoder's would.
    EncoderCausalMask,
    /// The token-type embedding (`token_types` row 0, "sentence A") not added to BERT's input embedding.
    TokenTypeDropped,
    /// The pooling of an encoder's output swapped: the CLS row for a mean-pooled model, the mean for a
    /// CLS-pooled one (`bert.pooling_type` misread).
    PoolingWrong,
    /// A Q4_0 unpack error in the portable code only: the scalar dequantizer (`q4_0::dequantize_block`,
    /// ggml's `dequantize_row_q4_0` ported) takes each block's nibbles in the wrong halves — element
    /// `j < 16` from the high nibble of `qs[j]`, element `j + 16` from the low one. The AVX2 dequantizer
    /// (`dequantize_simd.rs`) and ggml mode's integer dot kernels are right, so only code that runs the
    /// portable dequantizer shows it: reference mode's weight rows and the Q4_0 embedding lookup under
    /// `--simd off` (issue 42: `off` must run the portable code, so such a bug cannot hide behind AVX2).
    PortableDequantHalvesSwapped,
    /// Whisper's mel filters without the slaney normalisation (`2 / (f[m+2] − f[m])` dropped): shows at
    /// `mel`.
    MelFilterUnnormalised,
    /// The STFT's centre padding with zeros instead of reflecting the signal: shows at `mel` (its first and
    /// last frames).
    StftZeroPadding,
    /// A causal mask in cross-attention (decoder row `t` sees encoder positions `0..=t` only): shows at
    /// `blk.0.cross_attn_out`.
    CrossAttnCausal,
    /// A bias added to Whisper's `k_proj`, which has none (the value projection's bias, added to K): shows
    /// at the encoder's first `enc.blk.0.k`.
    KProjBias,
    /// Cross-attention keys and values recomputed from the decoder's own normed rows instead of the cached
    /// encoder projections: shows at `blk.0.cross_attn_out`.
    CrossKvFromDecoder,
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

/// The environment variable a child process (`lockstep serve` under the mutation suite) reads its fault
/// from: the fault switch is per process, so a test that gates an engine running in another process
/// names the fault there. Read by [`set_from_env`].
pub const FAULT_ENV: &str = "LOCKSTEP_FAULT";

impl Fault {
    /// Every fault without a parameter, and the parameterised ones at layer 0, for [`Fault::parse`].
    const NAMED: [Fault; 36] = [
        Fault::RopePairing,
        Fault::RopeBase,
        Fault::RopeDecodePosition,
        Fault::NormEps,
        Fault::KvWritePosition,
        Fault::GqaHeadMap,
        Fault::AttnScale,
        Fault::CausalMaskOff,
        Fault::GateUpSwapped,
        Fault::WrongActivation { layer: 0 },
        Fault::MissingResidual { layer: 0 },
        Fault::QuantMinMisread,
        Fault::FinalNormSkipped,
        Fault::QkvBiasMissing,
        Fault::EmbedScaleMissing,
        Fault::ReferenceUnpack,
        Fault::SoftcapMissing,
        Fault::WindowOffByOne,
        Fault::FusedQkvSplit,
        Fault::LayerNormBiasDropped,
        Fault::PartialRotaryDims,
        Fault::PosEmbdOffset,
        Fault::RopeFreqFactorsIgnored,
        Fault::QkNormAfterRope,
        Fault::GeluErf,
        Fault::KNormSkipped,
        Fault::AttnSoftcapFromFinal,
        Fault::EncoderCausalMask,
        Fault::TokenTypeDropped,
        Fault::PoolingWrong,
        Fault::PortableDequantHalvesSwapped,
        Fault::MelFilterUnnormalised,
        Fault::StftZeroPadding,
        Fault::CrossAttnCausal,
        Fault::KProjBias,
        Fault::CrossKvFromDecoder,
    ];

    /// Every fault, the layer-specific ones (`WrongActivation`, `MissingResidual`) at `layer`: the list
    /// a test iterates to run the whole mutation suite.
    pub fn every(layer: usize) -> Vec<Fault> {
        Fault::NAMED
            .iter()
            .map(|&f| match f {
                Fault::WrongActivation { .. } => Fault::WrongActivation { layer },
                Fault::MissingResidual { .. } => Fault::MissingResidual { layer },
                other => other,
            })
            .collect()
    }

    /// The fault's name as [`Fault::parse`] reads it: the variant's name, and `:L` for the layer of
    /// `WrongActivation` and `MissingResidual` (`KvWritePosition`, `MissingResidual:15`).
    pub fn name(self) -> String {
        let base = format!("{self:?}");
        let base = base
            .split([' ', '{'])
            .next()
            .unwrap_or_default()
            .to_string();
        match self {
            Fault::WrongActivation { layer } | Fault::MissingResidual { layer } => {
                format!("{base}:{layer}")
            }
            _ => base,
        }
    }

    /// Read a fault named as [`Fault::name`] writes it. `None` for an unknown name or a missing or
    /// malformed layer.
    pub fn parse(s: &str) -> Option<Fault> {
        let (base, layer) = match s.split_once(':') {
            Some((b, l)) => (b, Some(l.parse::<usize>().ok()?)),
            None => (s, None),
        };
        let f = Fault::NAMED
            .into_iter()
            .find(|f| f.name().split(':').next() == Some(base))?;
        match (f, layer) {
            (Fault::WrongActivation { .. }, Some(layer)) => Some(Fault::WrongActivation { layer }),
            (Fault::MissingResidual { .. }, Some(layer)) => Some(Fault::MissingResidual { layer }),
            (Fault::WrongActivation { .. } | Fault::MissingResidual { .. }, None) => None,
            (_, Some(_)) => None,
            (f, None) => Some(f),
        }
    }
}

/// Turn on the fault named in [`FAULT_ENV`], if it is set (the mutation suite's child processes).
///
/// Errors: the name is not a fault ([`Fault::parse`]); the variable is set in a build without the
/// `faults` feature, which cannot make the bug — said loudly, so a test can never pass an unbroken
/// engine off as a broken one.
pub fn set_from_env() -> Result<Option<Fault>, String> {
    let Ok(name) = std::env::var(FAULT_ENV) else {
        return Ok(None);
    };
    let fault = Fault::parse(&name)
        .ok_or_else(|| format!("{FAULT_ENV}={name:?} names no fault of engine/src/faults.rs"))?;
    #[cfg(feature = "faults")]
    {
        set(Some(fault));
        Ok(Some(fault))
    }
    #[cfg(not(feature = "faults"))]
    {
        Err(format!(
            "{FAULT_ENV}={name:?} is set, but this build has no fault switch (the `faults` feature of \
             lockstep-engine, on in the harness's test builds only): {fault:?} cannot be made"
        ))
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn every_fault_name_reads_back() {
        for f in Fault::NAMED {
            assert_eq!(Fault::parse(&f.name()), Some(f), "{}", f.name());
        }
        let f = Fault::MissingResidual { layer: 15 };
        assert_eq!(f.name(), "MissingResidual:15");
        assert_eq!(Fault::parse("MissingResidual:15"), Some(f));
        for bad in [
            "",
            "Nope",
            "KvWritePosition:3",
            "MissingResidual",
            "WrongActivation:x",
        ] {
            assert_eq!(Fault::parse(bad), None, "{bad}");
        }
    }
}
