//! Canonical stage ids and the observe / replace hook.
//!
//! Every named stage of a forward pass is handed to an optional [`StageSink`] as a mutable `[rows, width]`
//! row-major f32 slice, *before* the forward pass reads it again. A sink may only look (recording, NaN
//! checks) or overwrite the values (golden injection for bisect); whatever the slice holds when the sink
//! returns is what the rest of the forward pass uses. With no sink attached the engine skips the call
//! entirely (one `Option` test per stage).
//!
//! Stage ids follow lockstep's canonical GGUF-style scheme (DESIGN.md §2); the llama.cpp node each one
//! matches is given on the [`StageKind`] variants.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

/// What a stage is, independent of its layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StageKind {
    /// Whisper's log-mel spectrogram (HF `WhisperFeatureExtractor`'s `input_features`), one row per 10 ms
    /// frame: the encoder's input, `[n_frames, n_mels]` (the transpose of `input_features[0]`). Width n_mels.
    Mel,
    /// Whisper encoder: `gelu(conv1(mel))`, kernel 3, stride 1, padding 1 (`WhisperEncoder.forward`'s
    /// first two lines; whisper.cpp `ggml_conv_1d_ph` + `ggml_gelu`). Rows are frames. Width d_model.
    Conv1,
    /// Whisper encoder: `gelu(conv2(conv1))`, kernel 3, stride 2, padding 1: half the frames. Width d_model.
    Conv2,
    /// Token embeddings looked up from `token_embd`, scaled where the architecture scales them: the input
    /// of block 0 (llama.cpp `inp_embd`; Gemma `inp_scaled`, ×√d_model). Width d_model.
    Embed,
    /// RMSNorm before attention, weight applied (`attn_norm-N`). Width d_model.
    AttnNorm,
    /// Query projection, before RoPE (`Qcur-N`, the MUL_MAT node). Width n_head·head_dim.
    Q,
    /// Key projection, before RoPE (`Kcur-N`, MUL_MAT). Width n_head_kv·head_dim.
    K,
    /// Value projection (`Vcur-N`, MUL_MAT). Width n_head_kv·head_dim.
    V,
    /// Per-head RMSNorm of the queries, before RoPE (Gemma 3 `Qcur_normed-N`). Width n_head·head_dim.
    QNorm,
    /// Per-head RMSNorm of the keys, before RoPE (Gemma 3 `Kcur_normed-N`). Width n_head_kv·head_dim.
    KNorm,
    /// Query after RoPE (`Qcur-N`, the ROPE node). Width n_head·head_dim.
    QRope,
    /// Key after RoPE, as written to the KV cache (`Kcur-N`, ROPE). Width n_head_kv·head_dim.
    KRope,
    /// Attention output before the output projection, heads concatenated (`kqv_out-N`). Width n_head·head_dim.
    AttnOut,
    /// Attention output after the output projection, before the residual add. Width d_model.
    AttnProj,
    /// RMSNorm of the projected attention output, before the residual add (Gemma 2/3 `attn_post_norm-N`).
    /// Width d_model.
    AttnPostNorm,
    /// Residual stream after attention: input + attn_proj, or + attn_post_norm where the architecture has
    /// post-norms (`ffn_inp-N`; Gemma 3 `sa_out-N`). Width d_model.
    FfnInp,
    /// Whisper decoder: the residual stream after self-attention, the input of the cross-attention
    /// sub-layer (`hidden_states` after `self_attn`'s residual add in `WhisperDecoderLayer.forward`). Width
    /// d_model.
    CrossInp,
    /// LayerNorm before cross-attention (`encoder_attn_layer_norm`). Width d_model.
    CrossAttnNorm,
    /// Cross-attention query projection (`encoder_attn.q_proj`, bias added). Width n_head·head_dim.
    CrossQ,
    /// Cross-attention keys: the encoder output's projection (`encoder_attn.k_proj`, no bias), computed once
    /// per input. Rows are encoder positions, not decoder positions. Width n_head·head_dim.
    CrossK,
    /// Cross-attention values (`encoder_attn.v_proj`, bias added), computed once per input; rows are
    /// encoder positions. Width n_head·head_dim.
    CrossV,
    /// Cross-attention output before its output projection, heads concatenated. Width n_head·head_dim.
    CrossAttnOut,
    /// Cross-attention after its output projection (`encoder_attn.out_proj`), before the residual add.
    /// Width d_model.
    CrossAttnProj,
    /// RMSNorm before the FFN, weight applied (`ffn_norm-N`). Width d_model.
    FfnNorm,
    /// Gate projection (`ffn_gate-N`). Width d_ff.
    FfnGate,
    /// Up projection (`ffn_up-N`). Width d_ff.
    FfnUp,
    /// act(gate) ⊙ up: SiLU (`ffn_swiglu-N`) or tanh-GELU (`ffn_geglu-N`). Width d_ff.
    FfnAct,
    /// Down projection: the FFN output before the residual add (`ffn_out-N`). Width d_model.
    FfnOut,
    /// RMSNorm of the FFN output, before the residual add (Gemma 2/3 `ffn_post_norm-N`). Width d_model.
    FfnPostNorm,
    /// Layer output: ffn_inp + ffn_out, or + ffn_post_norm with post-norms (`l_out-N`). Width d_model.
    Out,
    /// Final RMSNorm, weight applied (`result_norm`). Width d_model.
    OutputNorm,
    /// An encoder's pooled embedding (`result_embd_pooled`: mean, CLS or last row of the last block's
    /// output, `<arch>.pooling_type`), not normalised. One row per sequence (emitted at the batch's last
    /// position). Width d_model.
    Pooled,
    /// Output logits (`result_output`). Width n_vocab.
    Logits,
}

impl StageKind {
    /// Every kind in forward order; per-layer kinds are those with [`StageKind::per_layer`].
    pub const ALL: [StageKind; 33] = [
        StageKind::Mel,
        StageKind::Conv1,
        StageKind::Conv2,
        StageKind::Embed,
        StageKind::AttnNorm,
        StageKind::Q,
        StageKind::K,
        StageKind::V,
        StageKind::QNorm,
        StageKind::KNorm,
        StageKind::QRope,
        StageKind::KRope,
        StageKind::AttnOut,
        StageKind::AttnProj,
        StageKind::AttnPostNorm,
        StageKind::CrossInp,
        StageKind::CrossAttnNorm,
        StageKind::CrossQ,
        StageKind::CrossK,
        StageKind::CrossV,
        StageKind::CrossAttnOut,
        StageKind::CrossAttnProj,
        StageKind::FfnInp,
        StageKind::FfnNorm,
        StageKind::FfnGate,
        StageKind::FfnUp,
        StageKind::FfnAct,
        StageKind::FfnOut,
        StageKind::FfnPostNorm,
        StageKind::Out,
        StageKind::OutputNorm,
        StageKind::Pooled,
        StageKind::Logits,
    ];

    /// The suffix in a canonical id (`attn_norm` in `blk.3.attn_norm`), or the whole id for global stages.
    pub fn suffix(self) -> &'static str {
        match self {
            StageKind::Mel => "mel",
            StageKind::Conv1 => "conv1",
            StageKind::Conv2 => "conv2",
            StageKind::Embed => "embed",
            StageKind::AttnNorm => "attn_norm",
            StageKind::Q => "q",
            StageKind::K => "k",
            StageKind::V => "v",
            StageKind::QNorm => "q_norm",
            StageKind::KNorm => "k_norm",
            StageKind::QRope => "q_rope",
            StageKind::KRope => "k_rope",
            StageKind::AttnOut => "attn_out",
            StageKind::AttnProj => "attn_proj",
            StageKind::AttnPostNorm => "attn_post_norm",
            StageKind::CrossInp => "cross_inp",
            StageKind::CrossAttnNorm => "cross_attn_norm",
            StageKind::CrossQ => "cross_q",
            StageKind::CrossK => "cross_k",
            StageKind::CrossV => "cross_v",
            StageKind::CrossAttnOut => "cross_attn_out",
            StageKind::CrossAttnProj => "cross_attn_proj",
            StageKind::FfnInp => "ffn_inp",
            StageKind::FfnNorm => "ffn_norm",
            StageKind::FfnGate => "ffn_gate",
            StageKind::FfnUp => "ffn_up",
            StageKind::FfnAct => "ffn_act",
            StageKind::FfnOut => "ffn_out",
            StageKind::FfnPostNorm => "ffn_post_norm",
            StageKind::Out => "out",
            StageKind::OutputNorm => "output_norm",
            StageKind::Pooled => "pooled",
            StageKind::Logits => "logits",
        }
    }

    /// True for stages that occur once per transformer block.
    pub fn per_layer(self) -> bool {
        !matches!(
            self,
            StageKind::Mel
                | StageKind::Conv1
                | StageKind::Conv2
                | StageKind::Embed
                | StageKind::OutputNorm
                | StageKind::Pooled
                | StageKind::Logits
        )
    }
}

/// One stage of one forward pass: a kind and, for per-layer kinds, the block index; and which stack of an
/// encoder–decoder model it belongs to (Whisper's audio encoder: ids prefixed `enc.`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stage {
    /// True for a stage of an encoder–decoder model's encoder stack (`enc.conv1`, `enc.blk.0.q`,
    /// `enc.output_norm`); false for every other stage (decoder-only models, BERT, Whisper's decoder and
    /// its `mel` input).
    pub enc: bool,
    /// Block index for per-layer stages; `None` for `embed`, `output_norm`, `logits`.
    pub layer: Option<usize>,
    /// What the stage is.
    pub kind: StageKind,
}

impl Stage {
    /// A global (not per-layer) stage.
    pub const fn global(kind: StageKind) -> Stage {
        Stage {
            enc: false,
            layer: None,
            kind,
        }
    }

    /// A stage of block `layer`.
    pub const fn block(layer: usize, kind: StageKind) -> Stage {
        Stage {
            enc: false,
            layer: Some(layer),
            kind,
        }
    }

    /// The same stage in the encoder stack (`enc` true) or not.
    pub const fn in_encoder(self, enc: bool) -> Stage {
        Stage { enc, ..self }
    }

    /// Parse a canonical id (`embed`, `blk.3.attn_norm`, `output_norm`, `logits`; an encoder stack's
    /// `enc.conv1`, `enc.blk.0.q`).
    pub fn parse(id: &str) -> Option<Stage> {
        if let Some(rest) = id.strip_prefix("enc.") {
            return Stage::parse(rest)
                .filter(|s| !s.enc && s.kind != StageKind::Mel)
                .map(|s| s.in_encoder(true));
        }
        if let Some(rest) = id.strip_prefix("blk.") {
            let (n, suffix) = rest.split_once('.')?;
            let layer: usize = n.parse().ok()?;
            let kind = StageKind::ALL
                .into_iter()
                .find(|k| k.per_layer() && k.suffix() == suffix)?;
            Some(Stage::block(layer, kind))
        } else {
            let kind = StageKind::ALL
                .into_iter()
                .find(|k| !k.per_layer() && k.suffix() == id)?;
            Some(Stage::global(kind))
        }
    }

    /// The stage whose output is this stage's block input: `blk.{L-1}.out` for a stage of block `L > 0`,
    /// `embed` for block 0, `None` for the global stages (`embed` reads the token ids; `output_norm` and
    /// `logits` read the last block's output, which the stage alone does not name).
    ///
    /// This is llama.cpp's `inpL` of `llm_build_llama` and its siblings (llama-model.cpp): `inp_embd` for
    /// the first layer, the previous layer's `l_out-N` after it — the value bisect injects so that a block
    /// computes from the reference's input.
    pub fn layer_input(self) -> Option<Stage> {
        let s = match self.layer? {
            0 => Stage::global(StageKind::Embed),
            l => Stage::block(l - 1, StageKind::Out),
        };
        Some(s.in_encoder(self.enc))
    }

    /// The activation the last matmul upstream of this stage (within its block) reads: the value llama.cpp
    /// rounds to the weight type's `vec_dot_type` (Q8_0 / Q8_1 / Q8_K, or F16) before the product whose
    /// error this stage carries (ggml-cpu's `ggml_compute_forward_mul_mat` → `from_float`).
    ///
    /// Following `llm_build_llama`'s graph: `Qcur`/`Kcur`/`Vcur` = `mul_mat(wq|wk|wv, attn_norm)`, and the
    /// stages computed from them up to `kqv_out` carry that rounding (`attn_norm`); `mul_mat(wo, kqv_out)`
    /// and what follows it up to `ffn_norm` carry `kqv_out`'s (`attn_out`); `ffn_gate`/`ffn_up` =
    /// `mul_mat(w, ffn_norm)` and the activation carry `ffn_norm`'s; `ffn_down` = `mul_mat(w, ffn_swiglu)`
    /// and what follows it up to `l_out` carry `ffn_act`'s. `None` for `attn_norm` (it follows no matmul of
    /// its block) and the global stages.
    pub fn matmul_input(self) -> Option<Stage> {
        use StageKind::*;
        let l = self.layer?;
        let input = match self.kind {
            Q | K | V | QNorm | KNorm | QRope | KRope | AttnOut => AttnNorm,
            AttnProj | AttnPostNorm | CrossInp | CrossAttnNorm => AttnOut,
            // the cross K/V read the encoder output, which no stage of this block names
            CrossQ | CrossAttnOut => CrossAttnNorm,
            CrossK | CrossV => return None,
            CrossAttnProj => CrossAttnOut,
            FfnInp | FfnNorm => AttnOut,
            FfnGate | FfnUp | FfnAct => FfnNorm,
            FfnOut | FfnPostNorm | Out => FfnAct,
            Mel | Conv1 | Conv2 | Embed | AttnNorm | OutputNorm | Pooled | Logits => return None,
        };
        Some(Stage::block(l, input).in_encoder(self.enc))
    }

    /// True for a block's output (`blk.N.out`, llama.cpp `l_out-N`): the input of the next block.
    pub fn is_layer_output(self) -> bool {
        self.layer.is_some() && self.kind == StageKind::Out
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.enc {
            f.write_str("enc.")?;
        }
        match self.layer {
            Some(l) => write!(f, "blk.{l}.{}", self.kind.suffix()),
            None => f.write_str(self.kind.suffix()),
        }
    }
}

/// Receives every stage of a forward pass and may replace it.
///
/// `data` is row-major `[positions.len(), width]`: row `i` belongs to absolute sequence position
/// `positions.start + i`. Values written into `data` replace the stage for the rest of the forward pass.
pub trait StageSink {
    /// Whether the sink wants `stage` at all; stages it declines are not handed over. Default: all.
    fn wants(&self, _stage: Stage) -> bool {
        true
    }

    /// Observe and optionally overwrite one stage.
    fn on_stage(&mut self, stage: Stage, positions: Range<usize>, width: usize, data: &mut [f32]);
}

/// Hand a stage to the sink, if any. The forward passes call this after computing each stage.
#[inline]
pub fn emit(
    sink: &mut Option<&mut dyn StageSink>,
    stage: Stage,
    positions: Range<usize>,
    width: usize,
    data: &mut [f32],
) {
    if let Some(s) = sink.as_deref_mut() {
        if s.wants(stage) {
            debug_assert_eq!(
                data.len(),
                positions.len() * width,
                "stage {stage} has the wrong size"
            );
            s.on_stage(stage, positions, width, data);
        }
    }
}

/// A recorded stage: `rows` rows of `width` values, row-major, and the position of each row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recorded {
    /// Row width.
    pub width: usize,
    /// Absolute sequence position of each row.
    pub positions: Vec<usize>,
    /// `[positions.len(), width]` row-major values.
    pub data: Vec<f32>,
}

/// A sink that records every stage it is handed (appending rows across calls, so a prefill followed by
/// decode steps yields one `[T_total, width]` array per stage).
#[derive(Debug, Default)]
pub struct Recorder {
    /// Recorded stages by stage.
    pub stages: BTreeMap<Stage, Recorded>,
    /// Stage filter; `None` records everything.
    pub only: Option<Vec<Stage>>,
}

impl Recorder {
    /// A recorder of every stage.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// The recorded stage, if any.
    pub fn get(&self, stage: Stage) -> Option<&Recorded> {
        self.stages.get(&stage)
    }
}

impl StageSink for Recorder {
    fn wants(&self, stage: Stage) -> bool {
        self.only.as_ref().is_none_or(|o| o.contains(&stage))
    }

    fn on_stage(&mut self, stage: Stage, positions: Range<usize>, width: usize, data: &mut [f32]) {
        let rec = self.stages.entry(stage).or_default();
        rec.width = width;
        rec.positions.extend(positions);
        rec.data.extend_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for kind in StageKind::ALL {
            let s = if kind.per_layer() {
                Stage::block(7, kind)
            } else {
                Stage::global(kind)
            };
            assert_eq!(Stage::parse(&s.to_string()), Some(s), "{s}");
        }
        assert_eq!(Stage::block(3, StageKind::Out).to_string(), "blk.3.out");
        assert_eq!(Stage::parse("blk.x.out"), None);
        assert_eq!(Stage::parse("blk.1.logits"), None);
        assert_eq!(Stage::parse("attn_norm"), None);
        for id in [
            "enc.conv1",
            "enc.blk.1.ffn_act",
            "enc.output_norm",
            "mel",
            "blk.0.cross_k",
        ] {
            assert_eq!(Stage::parse(id).map(|s| s.to_string()).as_deref(), Some(id));
        }
        assert!(Stage::parse("enc.blk.1.ffn_act").unwrap().enc);
        assert_eq!(Stage::parse("enc.mel"), None);
        assert_eq!(Stage::parse("enc.enc.conv1"), None);
    }

    #[test]
    fn inputs_follow_the_block() {
        let p = |id: &str| Stage::parse(id).unwrap();
        let input = |id: &str| p(id).matmul_input().map(|s| s.to_string());
        assert_eq!(input("blk.2.ffn_act").as_deref(), Some("blk.2.ffn_norm"));
        assert_eq!(input("blk.0.q_rope").as_deref(), Some("blk.0.attn_norm"));
        assert_eq!(input("blk.4.ffn_inp").as_deref(), Some("blk.4.attn_out"));
        assert_eq!(input("blk.7.out").as_deref(), Some("blk.7.ffn_act"));
        assert_eq!(input("blk.7.attn_norm"), None);
        assert_eq!(input("output_norm"), None);
        assert_eq!(p("blk.0.q").layer_input(), Some(p("embed")));
        assert_eq!(p("blk.5.ffn_out").layer_input(), Some(p("blk.4.out")));
        assert_eq!(p("output_norm").layer_input(), None);
        assert!(p("blk.3.out").is_layer_output());
        assert!(!p("blk.3.ffn_out").is_layer_output());
        assert!(!p("output_norm").is_layer_output());
    }

    #[test]
    fn recorder_appends_rows() {
        let mut r = Recorder::new();
        let s = Stage::global(StageKind::Embed);
        let mut a = vec![1.0, 2.0, 3.0, 4.0];
        let mut sink: Option<&mut dyn StageSink> = Some(&mut r);
        emit(&mut sink, s, 0..2, 2, &mut a);
        let mut b = vec![5.0, 6.0];
        emit(&mut sink, s, 2..3, 2, &mut b);
        let rec = r.get(s).unwrap();
        assert_eq!(rec.positions, vec![0, 1, 2]);
        assert_eq!(rec.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }
}
