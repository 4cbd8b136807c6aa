//! Reading an architecture's hyperparameters from GGUF metadata (`<arch>.<key>`, llama.cpp's `LLM_KV_*`
//! names in src/llama-arch.cpp). Each architecture module reads the keys it needs through [`Meta`]; there is
//! no one config every architecture must fill. [`DecoderDims`] holds what every decoder-only transformer
//! file has.

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// Typed access to the `<arch>.*` metadata of one file; every error names the file and the key.
#[derive(Clone, Copy)]
pub struct Meta<'a> {
    /// The parsed file.
    pub gguf: &'a GgufFile,
    /// `general.architecture`, the key prefix.
    pub arch: &'a str,
}

impl<'a> Meta<'a> {
    /// Metadata of `gguf` under the prefix `arch`.
    pub fn new(gguf: &'a GgufFile, arch: &'a str) -> Meta<'a> {
        Meta { gguf, arch }
    }

    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A required unsigned integer `<arch>.<k>`.
    pub fn usize(&self, k: &str) -> Result<usize> {
        Ok(self.gguf.get_u32(&self.key(k))? as usize)
    }

    /// An optional unsigned integer `<arch>.<k>`.
    pub fn opt_usize(&self, k: &str) -> Result<Option<usize>> {
        let key = self.key(k);
        match self.gguf.get(&key) {
            Some(_) => Ok(Some(self.gguf.get_u32(&key)? as usize)),
            None => Ok(None),
        }
    }

    /// A required float `<arch>.<k>`.
    pub fn f32(&self, k: &str) -> Result<f32> {
        self.gguf.get_f32(&self.key(k))
    }

    /// An optional float `<arch>.<k>`.
    pub fn opt_f32(&self, k: &str) -> Result<Option<f32>> {
        let key = self.key(k);
        match self.gguf.get(&key) {
            Some(_) => Ok(Some(self.gguf.get_f32(&key)?)),
            None => Ok(None),
        }
    }

    /// An [`Error::Model`] about this file.
    pub fn error(&self, what: String) -> Error {
        Error::Model {
            path: self.gguf.path().to_path_buf(),
            what,
        }
    }
}

/// The dimensions every decoder-only transformer file states (llama.cpp `llama_hparams`).
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderDims {
    /// Transformer blocks (`block_count`).
    pub n_layer: usize,
    /// Residual width (`embedding_length`).
    pub d_model: usize,
    /// Query heads (`attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`attention.head_count_kv`, default n_head).
    pub n_kv_head: usize,
    /// Per-head width (`attention.key_length`, default d_model / n_head).
    pub head_dim: usize,
    /// FFN hidden width (`feed_forward_length`).
    pub d_ff: usize,
    /// Vocabulary size (rows of `token_embd`).
    pub n_vocab: usize,
    /// Training context (`context_length`, default 2048).
    pub n_ctx_train: usize,
    /// Norm epsilon (`attention.layer_norm_rms_epsilon`; LayerNorm models `attention.layer_norm_epsilon`).
    pub norm_eps: f32,
    /// Dimensions rotated per head (`rope.dimension_count`, default head_dim).
    pub rope_dim: usize,
    /// RoPE base (`rope.freq_base`, default 10000).
    pub rope_base: f32,
}

impl DecoderDims {
    /// Read and validate the dimensions.
    ///
    /// Errors: a missing required key, `head_count` not a positive multiple of `head_count_kv`, an odd
    /// `rope.dimension_count` or one larger than the head, a zero width; RoPE scaling (a
    /// `rope.scaling.factor` other than 1, a `rope_freqs.weight` tensor) is [`Error::Unsupported`].
    pub fn read(m: &Meta<'_>) -> Result<DecoderDims> {
        Self::read_eps(m, "attention.layer_norm_rms_epsilon")
    }

    /// [`DecoderDims::read`] with the norm epsilon read from `eps_key` (LayerNorm models:
    /// `attention.layer_norm_epsilon`, llama.cpp `LLM_KV_ATTENTION_LAYERNORM_EPS`).
    ///
    /// Errors: as [`DecoderDims::read`].
    pub fn read_eps(m: &Meta<'_>, eps_key: &str) -> Result<DecoderDims> {
        let dims = Self::read_dims(m, eps_key)?;
        if m.gguf.tensor("rope_freqs.weight").is_ok() {
            return Err(Error::Unsupported(format!(
                "{}: rope_freqs.weight (per-dimension RoPE frequency factors) is not implemented",
                m.gguf.path().display()
            )));
        }
        Ok(dims)
    }

    /// [`DecoderDims::read_eps`] for an architecture that reads `rope_freqs.weight` itself (Gemma 4's
    /// proportional RoPE): the same checks but that one.
    ///
    /// Errors: as [`DecoderDims::read`], but for `rope_freqs.weight`.
    pub fn read_dims(m: &Meta<'_>, eps_key: &str) -> Result<DecoderDims> {
        let d_model = m.usize("embedding_length")?;
        let n_head = m.usize("attention.head_count")?;
        let n_kv_head = m.opt_usize("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head == 0 || n_kv_head == 0 || n_head % n_kv_head != 0 {
            return Err(m.error(format!(
                "head_count {n_head} is not a positive multiple of head_count_kv {n_kv_head}"
            )));
        }
        let head_dim = m
            .opt_usize("attention.key_length")?
            .unwrap_or(d_model / n_head);
        let embd = m.gguf.tensor("token_embd.weight")?;
        let dims = DecoderDims {
            n_layer: m.usize("block_count")?,
            d_model,
            n_head,
            n_kv_head,
            head_dim,
            d_ff: m.usize("feed_forward_length")?,
            n_vocab: embd.dims.get(1).copied().unwrap_or(0) as usize,
            n_ctx_train: m.opt_usize("context_length")?.unwrap_or(2048),
            norm_eps: m.f32(eps_key)?,
            rope_dim: m.opt_usize("rope.dimension_count")?.unwrap_or(head_dim),
            rope_base: m.opt_f32("rope.freq_base")?.unwrap_or(10000.0),
        };
        if dims.rope_dim > dims.head_dim || !dims.rope_dim.is_multiple_of(2) {
            return Err(m.error(format!(
                "rope.dimension_count {} must be even and ≤ head_dim {}",
                dims.rope_dim, dims.head_dim
            )));
        }
        if dims.d_model == 0 || dims.head_dim == 0 || dims.d_ff == 0 || dims.n_vocab == 0 {
            return Err(m.error(format!("a zero width in {dims:?}")));
        }
        // RoPE scaling (linear, YaRN, Llama 3 `rope_freqs`) changes every angle: refuse it rather than
        // compute plain RoPE for a model that expects scaled RoPE.
        if let Some(f) = m.opt_f32("rope.scaling.factor")? {
            if f != 1.0 {
                return Err(Error::Unsupported(format!(
                    "{}: {}.rope.scaling.factor = {f} (RoPE scaling) is not implemented",
                    m.gguf.path().display(),
                    m.arch
                )));
            }
        }
        Ok(dims)
    }
}
