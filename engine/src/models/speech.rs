//! The blocks of an encoder–decoder speech model (Whisper), each computing and emitting its stages like
//! [`super::blocks`]:
//!
//! - [`AudioStem`]: the log-mel input (`mel`), two 1-D convolutions with GELU (`enc.conv1`, `enc.conv2`,
//!   the second with stride 2), plus the encoder's position table (`enc.embed`, the input of encoder
//!   block 0);
//! - [`AudioEncoder`]: the stem, pre-norm blocks ([`DecoderLayer`] with bidirectional attention, no KV
//!   cache: `enc.blk.N.*`), a final LayerNorm (`enc.output_norm`);
//! - [`EncoderDecoder`]: the encoder, then the cross-attention keys and values of every decoder block
//!   computed once from its output (`CrossAttention::precompute`: `blk.N.cross_k`, `blk.N.cross_v`), and
//!   a [`Decoder`] whose blocks carry [`super::blocks::CrossAttention`].
//!
//! An architecture module ([`super::whisper`]) only loads tensors into these; it contains no arithmetic.

use crate::faults;
use crate::gguf::GgufFile;
use crate::hooks::{Stage, StageKind};
use crate::kv_cache::KvCache;
use crate::models::blocks::{sized, AttnBufs, Decoder, DecoderLayer, Fwd, LayerBufs, RmsNorm};
use crate::models::weights::{load_vector, Weight};
use crate::ops;
use crate::quant;
use crate::{Error, Result};

/// Whisper's convolutional front of the encoder (HF `WhisperEncoder.forward`: `gelu(conv1(x))`,
/// `gelu(conv2(x))`, `permute`, `+ embed_positions.weight`; whisper.cpp `whisper_build_graph_conv`:
/// `ggml_conv_1d_ph` twice, each followed by `ggml_gelu`, then the position rows).
#[derive(Debug)]
pub struct AudioStem {
    /// `enc.conv1.weight` `[d_model, n_mels·3]` (PyTorch `[d_model, n_mels, 3]`), kernel 3, stride 1,
    /// padding 1.
    pub conv1: Weight,
    /// `enc.conv1.bias` `[d_model]`.
    pub conv1_bias: Vec<f32>,
    /// `enc.conv2.weight` `[d_model, d_model·3]`, kernel 3, stride 2, padding 1.
    pub conv2: Weight,
    /// `enc.conv2.bias` `[d_model]`.
    pub conv2_bias: Vec<f32>,
    /// `enc.position_embd.weight` `[n_ctx, d_model]`: the positions as the checkpoint stores them
    /// (Whisper's sinusoids, `sinusoids(max_source_positions, d_model)`), one row per output frame.
    pub positions: Weight,
    /// Mel bins (the input row width).
    pub n_mels: usize,
}

/// Buffers of an [`AudioEncoder`] forward (resized, never shrunk).
#[derive(Default)]
pub struct SpeechBufs {
    /// The mel as stage rows `[n_frames, n_mels]`.
    mel: Vec<f32>,
    /// im2col columns.
    cols: Vec<f32>,
    /// conv1's output `[n_frames, d]`.
    c1: Vec<f32>,
    /// The encoder's residual stream `[n_ctx, d]`; after the forward, its output.
    x: Vec<f32>,
    /// One position row.
    row: Vec<f32>,
    layer: LayerBufs,
    attn: AttnBufs,
}

impl AudioStem {
    /// `x` (`[n_frames/2, d]`) ← the stem of `b.mel` (`[n_frames, n_mels]`); emits `enc.conv1`, `enc.conv2`,
    /// `enc.embed`. Sets `f.n` to the rows of each stage as it goes (frames, then positions).
    ///
    /// Errors: more positions than `positions` has rows; a weight type the matmul refuses.
    fn forward(&self, f: &mut Fwd, b: &mut SpeechBufs) -> Result<()> {
        let d = self.conv1.rows;
        // conv1: im2col [n_frames, n_mels·3] · W1ᵀ + b1, then GELU   → enc.conv1 [n_frames, d]
        let t1 = ops::im2col_1d(&b.mel, self.n_mels, 3, 1, 1, &mut b.cols);
        f.n = t1;
        let c1 = sized(&mut b.c1, t1 * d);
        f.matmul(&self.conv1, &b.cols, c1)?;
        super::blocks::add_bias(c1, &self.conv1_bias);
        ops::gelu_erf(c1);
        f.emit(Stage::global(StageKind::Conv1), c1);
        // conv2: stride 2                                            → enc.conv2 [n_frames/2, d]
        let t2 = ops::im2col_1d(c1, d, 3, 2, 1, &mut b.cols);
        f.n = t2;
        let x = sized(&mut b.x, t2 * d);
        f.matmul(&self.conv2, &b.cols, x)?;
        super::blocks::add_bias(x, &self.conv2_bias);
        ops::gelu_erf(x);
        f.emit(Stage::global(StageKind::Conv2), x);
        // + positions                                                → enc.embed
        if t2 > self.positions.rows {
            return Err(Error::Model {
                path: f.g.path().to_path_buf(),
                what: format!(
                    "{t2} encoder positions beyond enc.position_embd's {} rows (max_source_positions)",
                    self.positions.rows
                ),
            });
        }
        let m = self.positions.matrix(f.g);
        let row = sized(&mut b.row, d);
        let shift = usize::from(faults::is(faults::Fault::PosEmbdOffset));
        for (p, xt) in x.chunks_exact_mut(d).enumerate() {
            let p = (p + shift).min(self.positions.rows - 1);
            quant::dequantize_row_with(m.ty, m.row(p), row, f.num.simd)?;
            ops::add_in_place(xt, row);
        }
        f.emit(Stage::global(StageKind::Embed), x);
        Ok(())
    }
}

/// An audio encoder stack: [`AudioStem`], pre-norm bidirectional blocks, final LayerNorm (HF
/// `WhisperEncoder`).
#[derive(Debug)]
pub struct AudioEncoder {
    /// Convolutions and positions.
    pub stem: AudioStem,
    /// The blocks (their attention [`crate::models::blocks::Attention::bidirectional`]).
    pub layers: Vec<DecoderLayer>,
    /// `enc.output_norm` (HF `encoder.layer_norm`).
    pub norm: RmsNorm,
    /// Mel frames per input (`2·max_source_positions`: the feature extractor's padded chunk).
    pub n_frames: usize,
}

/// An encoder–decoder model: the audio encoder, and a decoder whose blocks cross-attend to its output.
#[derive(Debug)]
pub struct EncoderDecoder {
    /// The encoder stack.
    pub encoder: AudioEncoder,
    /// The decoder stack; every block has [`DecoderLayer::cross`].
    pub decoder: Decoder,
}

impl EncoderDecoder {
    /// Encode `mel` (`[n_mels, n_frames]` row-major: the feature extractor's `input_features[0]`), then
    /// compute and cache every decoder block's cross-attention keys and values in `kv`. Emits `mel` (as
    /// `[n_frames, n_mels]` rows), the encoder's stages (`enc.…`) and `blk.N.cross_k` / `cross_v`.
    ///
    /// Errors: a mel of another shape than `[n_mels, n_frames]`; as the blocks'.
    pub(crate) fn encode(
        &self,
        f: &mut Fwd,
        kv: &mut KvCache,
        b: &mut SpeechBufs,
        mel: &[f32],
    ) -> Result<()> {
        let e = &self.encoder;
        let (n_mels, n_frames) = (e.stem.n_mels, e.n_frames);
        if mel.len() != n_mels * n_frames {
            return Err(Error::Invalid(format!(
                "a log-mel input of {} values is not [{n_mels} mels, {n_frames} frames] (the model's \
                 num_mel_bins and 2·max_source_positions)",
                mel.len()
            )));
        }
        // mel rows: one per frame (the transpose of input_features)
        let m = sized(&mut b.mel, n_frames * n_mels);
        for (t, row) in m.chunks_exact_mut(n_mels).enumerate() {
            for (i, v) in row.iter_mut().enumerate() {
                *v = mel[i * n_frames + t];
            }
        }
        (f.p0, f.n, f.enc) = (0, n_frames, false);
        f.emit(Stage::global(StageKind::Mel), m);

        f.enc = true;
        let r = self.encode_stack(f, kv, b);
        f.enc = false;
        r?;
        let x = &b.x;
        for l in &self.decoder.layers {
            if let Some(c) = &l.cross {
                c.precompute(f, kv, x, &mut b.attn)?;
            }
        }
        Ok(())
    }

    /// The stem, the blocks and the final norm over `b.mel`; the output lands in `b.x`.
    fn encode_stack(&self, f: &mut Fwd, kv: &mut KvCache, b: &mut SpeechBufs) -> Result<()> {
        let e = &self.encoder;
        e.stem.forward(f, b)?;
        let x = &mut b.x;
        for l in &e.layers {
            l.forward(f, kv, x, &mut b.layer)?;
        }
        if faults::is(faults::Fault::FinalNormSkipped) {
            f.emit(Stage::global(StageKind::OutputNorm), x);
        } else {
            e.norm.forward(f, x, Stage::global(StageKind::OutputNorm));
        }
        Ok(())
    }
}

/// Load the stem's tensors (`enc.conv1`, `enc.conv2`, `enc.position_embd`) of a model `d` wide with
/// `n_mels` mel bins and `n_ctx` encoder positions.
///
/// Errors: a missing or misshapen tensor (naming file and tensor).
pub fn load_stem(g: &GgufFile, d: usize, n_mels: usize, n_ctx: usize) -> Result<AudioStem> {
    Ok(AudioStem {
        conv1: Weight::load(g, "enc.conv1.weight", Some(d), Some(n_mels * 3))?,
        conv1_bias: load_vector(g, "enc.conv1.bias", d)?,
        conv2: Weight::load(g, "enc.conv2.weight", Some(d), Some(d * 3))?,
        conv2_bias: load_vector(g, "enc.conv2.bias", d)?,
        positions: Weight::load(g, "enc.position_embd.weight", Some(n_ctx), Some(d))?,
        n_mels,
    })
}

/// Greedy transcription of a 16 kHz mono WAV file by a speech model: the log-mel of the file
/// ([`crate::audio::log_mel`] with [`crate::Model::mel_config`]), the encoder once, the decoder `prompt`
/// (Whisper's control tokens), then `n_tokens` greedy steps, each feeding the previous step's argmax (the
/// first maximum on ties, as `torch.argmax`) through the KV cache. Returns the `n_tokens` argmax tokens,
/// the first of them the prompt's last row's. Nothing stops early: the caller cuts at `<|endoftext|>`.
///
/// Errors: the WAV's ([`crate::audio::read_wav_16k_mono`]); a model that is not a speech model; a prompt
/// and `n_tokens` longer than the decoder's context; as [`crate::Model::forward`].
pub fn transcribe_greedy(
    m: &crate::Model,
    wav: &std::path::Path,
    prompt: &[u32],
    n_tokens: usize,
    mode: crate::NumericsMode,
) -> Result<Vec<u32>> {
    let cfg = m.mel_config().ok_or_else(|| {
        Error::Invalid(format!(
            "{} is not a speech model: it cannot transcribe {}",
            m.info().arch,
            wav.display()
        ))
    })?;
    let samples = crate::audio::read_wav_16k_mono(wav)?;
    let mel = crate::audio::log_mel(&samples, &cfg)?;
    let n_ctx = prompt.len() + n_tokens;
    m.check_context(n_ctx)?;
    let mut s = m.session(n_ctx, mode);
    m.encode_audio(&mut s, &mel, None)?;
    let argmax = |row: &[f32]| -> u32 {
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = i;
            }
        }
        best as u32
    };
    let mut out = Vec::with_capacity(n_tokens);
    let mut next = argmax(m.forward_last(&mut s, prompt, None)?);
    while out.len() < n_tokens {
        out.push(next);
        if out.len() < n_tokens {
            next = argmax(m.forward_last(&mut s, &[next], None)?);
        }
    }
    Ok(out)
}
