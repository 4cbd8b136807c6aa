//! The verdict on a cell's first divergence: [`Finding`] (structural, oracle-side rounding, accumulated
//! drift, tokenization, none), the tokens and rounding evidence it carries, and their text.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::format::fmt_e3;
use crate::gate::Divergence;

/// The verdict of a bisection (`lockstep bisect`) and of `lockstep run`'s first-divergent column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// The first stage whose local error is above the floor.
    Structural {
        /// Where.
        at: Divergence,
        /// Which floor it is above: `bit equality (...)`, the measured floor, or the cutoffs.
        floor: String,
        /// Local NMSE ÷ the measured floor (`None` where the floor is bit equality or a cutoff).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ratio: Option<f64>,
    },
    /// Local errors above the measured floor only where ggml mode — which rounds every matmul input to 8
    /// bits as llama.cpp does — equals the golden bit for bit: llama.cpp's own rounding, not a bug.
    OracleRounding {
        /// Each row above the floor, with the evidence.
        sites: Vec<RoundingEvidence>,
    },
    /// Local errors within the floor everywhere; the accumulated pass diverges first here.
    AccumulatedDrift {
        /// The accumulated pass's first divergent stage.
        at: Divergence,
    },
    /// The engine tokenized the prompt differently from the oracle (a tokenizer bug such as a dropped BOS,
    /// or another tokenizer): every later comparison reads other tokens, so this is the verdict and no
    /// stage is bisected.
    Tokens {
        /// Index of the first differing token (the shorter length when one sequence is a prefix).
        position: usize,
        /// The golden's token there (`None`: its sequence ended).
        golden: Option<TokenAt>,
        /// The engine's token there (`None`: its sequence ended).
        engine: Option<TokenAt>,
        /// Tokens in the golden's sequence.
        golden_len: usize,
        /// Tokens in the engine's sequence.
        engine_len: usize,
    },
    /// No local pass could run, so the stage where the error enters cannot be told from the later stages
    /// that only carry it: the engine cannot take injected stages (no `inject` capability: a session
    /// engine that does not announce it, a one-shot command), or the golden stores no layer output to
    /// inject. Never "drift": drift means a local pass ran and found every stage within its floor.
    NotLocalized {
        /// Why there is no local pass.
        why: NoLocalPass,
        /// Where the accumulated pass first leaves the gate's cutoffs (`None`: nowhere it could be
        /// placed) — the first place the error is seen, not necessarily where it enters.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Divergence>,
    },
    /// Neither pass diverges.
    None,
}

/// Why a cell has no local pass ([`Finding::NotLocalized`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoLocalPass {
    /// The engine cannot replace a stage with the golden's value (no `inject` capability).
    NoInject,
    /// The golden stores no layer output (`blk.N.out`) at every prompt position to inject (a logits-only or
    /// compact golden).
    NoLayerOutputs,
}

impl NoLocalPass {
    /// The short reason in a verdict's name: `no inject`, `no layer outputs in the golden`.
    pub fn short(self) -> &'static str {
        match self {
            NoLocalPass::NoInject => "no inject",
            NoLocalPass::NoLayerOutputs => "no layer outputs in the golden",
        }
    }

    /// Why that leaves the divergence unlocalized, in a sentence.
    pub fn explain(self) -> &'static str {
        match self {
            NoLocalPass::NoInject => {
                "the engine does not take injected stages (no `inject` capability), so no local pass can \
                 feed a layer the golden's own input: the first stage seen to differ may only carry an error \
                 that entered earlier (a KV-cache or decode-position bug shows first wherever it is read)"
            }
            NoLocalPass::NoLayerOutputs => {
                "the golden stores no layer output (blk.N.out) at every prompt position to inject, so no \
                 local pass can run: the first stage seen to differ may only carry an error that entered \
                 earlier"
            }
        }
    }
}

/// A token of a [`Finding::Tokens`]: its id and its vocabulary text, when the engine can say.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenAt {
    /// Token id.
    pub id: u32,
    /// Vocabulary text ([`Engine::token_piece`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub piece: Option<String>,
}

impl std::fmt::Display for TokenAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.piece {
            Some(p) => write!(f, "{} {p:?}", self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

/// The first difference between the golden's prompt tokens and the engine's tokenization of the same
/// text, as a [`Finding::Tokens`] (pieces from `engine`'s vocabulary); `None` when they are equal.
pub fn tokens_finding(golden: &[u32], mine: &[u32], engine: &dyn Engine) -> Option<Finding> {
    if golden == mine {
        return None;
    }
    let position = golden
        .iter()
        .zip(mine)
        .position(|(a, b)| a != b)
        .unwrap_or(golden.len().min(mine.len()));
    let at = |v: &[u32]| {
        v.get(position).map(|&id| TokenAt {
            id,
            piece: engine.token_piece(id),
        })
    };
    Some(Finding::Tokens {
        position,
        golden: at(golden),
        engine: at(mine),
        golden_len: golden.len(),
        engine_len: mine.len(),
    })
}

impl Finding {
    /// The verdict's name, as every view prints it (report.md's failure line and first-divergent table,
    /// the HTML run page, `lockstep bisect`): `structural`, `oracle-side rounding`, `drift`, `tokens`,
    /// `cannot localize (no inject)`, `none`.
    pub fn name(&self) -> String {
        match self {
            Finding::Structural { .. } => "structural".into(),
            Finding::OracleRounding { .. } => "oracle-side rounding".into(),
            Finding::AccumulatedDrift { .. } => "drift".into(),
            Finding::Tokens { .. } => "tokens".into(),
            Finding::NotLocalized { why, .. } => format!("cannot localize ({})", why.short()),
            Finding::None => "none".into(),
        }
    }

    /// [`Finding::name`] as the first-divergent tables print it (report.md, the HTML run page): an
    /// oracle-side-rounding verdict adds its row count, `oracle-side rounding (3 rows)`.
    pub fn table_name(&self) -> String {
        match self {
            Finding::OracleRounding { sites } => format!("{} ({} rows)", self.name(), sites.len()),
            _ => self.name(),
        }
    }

    /// Where the verdict places the divergence: the structural stage, the first oracle-side-rounding
    /// row, the drift's first divergent stage, the first stage seen to differ without a local pass;
    /// `None` for tokens (their position is in [`Finding::Tokens`]) and none.
    pub fn site(&self) -> Option<&Divergence> {
        match self {
            Finding::Structural { at, .. } | Finding::AccumulatedDrift { at } => Some(at),
            Finding::OracleRounding { sites } => sites.first().map(|s| &s.at),
            Finding::NotLocalized { at, .. } => at.as_ref(),
            Finding::Tokens { .. } | Finding::None => None,
        }
    }

    /// The local NMSE over the measured floor at [`Finding::site`], where the verdict has one.
    pub fn ratio(&self) -> Option<f64> {
        match self {
            Finding::Structural { ratio, .. } => *ratio,
            Finding::OracleRounding { sites } => sites.first().and_then(|s| s.ratio),
            _ => None,
        }
    }

    /// The verdict in one line, for a cell's failure line: `structural at blk.0.k (prefill position 1,
    /// cosine 0.97910659)`, `tokens at token 0 (golden 1 "<s>" vs engine 15 "Hello" ...)`,
    /// `cannot localize (no inject): first seen at blk.0.out (decode position 5, cosine ...) — why`.
    pub fn headline(&self) -> String {
        let place = |d: &Divergence| {
            let cos = if d.cosine.is_finite() {
                format!(", cosine {}", crate::format::fmt_cos(d.cosine))
            } else {
                String::new()
            };
            format!("{} ({} position {}{cos})", d.stage, d.phase, d.position)
        };
        match self {
            Finding::Tokens { position, .. } => format!(
                "tokens at token {position} ({})",
                self.tokens_text().unwrap_or_default()
            ),
            Finding::NotLocalized { why, at } => format!(
                "{}: {}; {}",
                self.name(),
                at.as_ref()
                    .map_or("no stage differs beyond its cutoffs".to_string(), |d| {
                        format!("first seen at {}", place(d))
                    }),
                why.explain()
            ),
            Finding::OracleRounding { sites } => match sites.first() {
                Some(s) => format!("{} at {} ({} rows)", self.name(), place(&s.at), sites.len()),
                None => self.name(),
            },
            _ => match self.site() {
                Some(d) => format!("{} at {}", self.name(), place(d)),
                None => self.name(),
            },
        }
    }

    /// The tokenization difference in words: `position 0: golden 1 "<s>" vs engine 15 "Hello" (golden 12
    /// tokens, engine 11)`; `None` for other findings.
    pub fn tokens_text(&self) -> Option<String> {
        let Finding::Tokens {
            position,
            golden,
            engine,
            golden_len,
            engine_len,
        } = self
        else {
            return None;
        };
        let show = |t: &Option<TokenAt>| t.as_ref().map_or("(end)".to_string(), |t| t.to_string());
        Some(format!(
            "position {position}: golden {} vs engine {} (golden {golden_len} tokens, engine {engine_len})",
            show(golden),
            show(engine)
        ))
    }
}

/// Why a row above the floor is llama.cpp's activation rounding rather than a bug.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundingEvidence {
    /// The row (reference mode's local error there).
    pub at: Divergence,
    /// Local NMSE ÷ the measured floor.
    pub ratio: Option<f64>,
    /// The matmul input llama.cpp rounded (`blk.2.ffn_norm` for `blk.2.ffn_act`), when the golden stores it.
    pub input: Option<String>,
    /// That input row's crest factor, max|x| / rms.
    pub input_crest: Option<f64>,
    /// NMSE of rounding that row to 8 bits per 32-block (scale amax/127), as llama.cpp does before the
    /// product.
    pub input_q8_nmse: Option<f64>,
    /// The same for the median row of that input kind (all layers the golden stores, same phase).
    pub median_q8_nmse: Option<f64>,
    /// The row's local NMSE when reference mode reruns its local pass with llama.cpp's input rounding
    /// ([`Engine::set_input_rounding`]) and nothing else changed: reference mode's own code, confirming
    /// that rounding explains the row (`None`: the engine cannot round its inputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounded_nmse: Option<f64>,
}

/// The evidence table of an oracle-side-rounding verdict (at most 12 rows).
pub fn render_rounding(sites: &[RoundingEvidence]) -> String {
    let mut out = format!(
        "{:>24}  {:>7}  {:>5}  {:>10}  {:>8}  {:>13}  {:>18}  {:>6}  {:>14}  {:>14}",
        "stage",
        "phase",
        "pos",
        "local NMSE",
        "÷ floor",
        "rounded NMSE",
        "matmul input",
        "crest",
        "input Q8 NMSE",
        "median Q8 NMSE"
    );
    let opt = |v: Option<f64>, f: fn(f64) -> String| v.map_or("-".to_string(), f);
    for s in sites.iter().take(12) {
        let _ = write!(
            out,
            "\n{:>24}  {:>7}  {:>5}  {:>10}  {:>8}  {:>13}  {:>18}  {:>6}  {:>14}  {:>14}",
            s.at.stage,
            s.at.phase.to_string(),
            s.at.position,
            fmt_e3(s.at.nmse),
            opt(s.ratio, |r| format!("{r:.1}")),
            opt(s.rounded_nmse, fmt_e3),
            s.input.as_deref().unwrap_or("-"),
            opt(s.input_crest, |c| format!("{c:.1}")),
            opt(s.input_q8_nmse, fmt_e3),
            opt(s.median_q8_nmse, fmt_e3),
        );
    }
    if sites.len() > 12 {
        let _ = write!(out, "\n... and {} more", sites.len() - 12);
    }
    out
}
