//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`) on the `tokenizers` crate, mirroring llama.cpp's
//! `llm_tokenizer_bpe` / `llm_tokenizer_bpe_session` (src/llama-vocab.cpp) and `unicode_regex_split`
//! (src/unicode.cpp).
//!
//! llama.cpp pre-tokenizes with a list of regexes per `tokenizer.ggml.pre` (each regex splits every piece of
//! the previous one, keeping matches and the text between them), maps bytes to GPT-2's printable characters,
//! then merges by rank (`tokenizer.ggml.merges` position, leftmost first on ties). Here the regexes are
//! `tokenizers` `Split` pre-tokenizers (fancy-regex, `Isolated`), followed by `ByteLevel`, and the merges are
//! `tokenizers::models::bpe::BPE`'s, which applies the same rank/leftmost order.
//!
//! llama.cpp runs the common regexes through hand-written splitters (`unicode_regex_split_custom_gpt2`,
//! `..._qwen2`) driven by its own Unicode tables (`unicode_cpt_flags_from_cpt`), not through a regex engine.
//! For valid UTF-8 those splitters agree with the regexes below: the letter / number / whitespace classes
//! are the Unicode general categories `L*` / `N*` and the `White_Space` property in both, and a codepoint
//! llama.cpp does not know has the "undefined" flag, which makes it `[^\s\p{L}\p{N}]` as in the regex.
//! The case-insensitive contractions are written `'[sS]|...` as llama.cpp's adapted regex does, so that
//! Unicode case folding (`ſ` ~ `s`) cannot apply.
//!
//! One real difference is the Unicode version: llama.cpp's tables (src/unicode-data.cpp) are Unicode 15.1,
//! the regex crate's (regex-syntax 0.8) Unicode 16.0. The letters, numbers and punctuation Unicode 16 added
//! are "undefined" for llama.cpp, so [`llama_classes`] removes them from `\p{L}`, `\p{N}` and `\p{P}`
//! (the lists were computed by comparing every code point of both tables; `\s` is the same set in both).

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use crate::{Error, Result};

/// GPT-2's reversible byte → printable-unicode map (OpenAI `bytes_to_unicode`; llama.cpp
/// `unicode_byte_to_utf8_map`).
pub(crate) fn bytes_to_unicode() -> Vec<(u8, char)> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = printable.clone();
    let mut n = 0;
    for b in 0u32..256 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    printable
        .into_iter()
        .zip(chars)
        .map(|(b, c)| {
            (
                b as u8,
                char::from_u32(c).expect("GPT-2 byte map is valid unicode"),
            )
        })
        .collect()
}

/// The GPT-2 regex (llama.cpp `LLAMA_VOCAB_PRE_TYPE_GPT2`, run by `unicode_regex_split_custom_gpt2`). It is
/// the regex `ByteLevel` applies when `use_regex` is on.
pub(crate) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The Qwen2 regex (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`, run by `unicode_regex_split_custom_qwen2`): the
/// `(?i:'s|...)` of Qwen's tokenizer.json in llama.cpp's adapted, ASCII-only case-insensitive form.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Code points that are letters in Unicode 16.0 (regex-syntax 0.8) but unassigned in llama.cpp's Unicode 15.1
/// tables (`unicode_ranges_flags` in src/unicode-data.cpp of llama.cpp@0c1e570).
const UNICODE16_LETTERS: &str = r"\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65}\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{11380}-\x{11389}\x{1138B}\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{13460}-\x{143FA}\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1E5D0}-\x{1E5ED}\x{1E5F0}";
/// The same for numbers.
const UNICODE16_NUMBERS: &str = r"\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1E5F1}-\x{1E5FA}";
/// The same for punctuation.
const UNICODE16_PUNCTUATION: &str = r"\x{1B4E}-\x{1B4F}\x{1B7F}\x{10D6E}\x{113D4}-\x{113D5}\x{113D7}-\x{113D8}\x{11BE1}\x{16D6D}-\x{16D6F}\x{1E5FF}";

/// Rewrite `\p{L}`, `\p{N}` and `\p{P}` of a llama.cpp pre-tokenizer regex to the classes of llama.cpp's
/// Unicode tables (the regex crate's class minus what Unicode 16 added). The nested-class form is valid both
/// inside and outside a character class.
pub(super) fn llama_classes(re: &str) -> String {
    re.replace(r"\p{L}", &format!(r"[\p{{L}}--[{UNICODE16_LETTERS}]]"))
        .replace(r"\p{N}", &format!(r"[\p{{N}}--[{UNICODE16_NUMBERS}]]"))
        .replace(r"\p{P}", &format!(r"[\p{{P}}--[{UNICODE16_PUNCTUATION}]]"))
}

/// How a `tokenizer.ggml.pre` value is handled: its regexes (run in order, before the byte-level mapping)
/// and llama.cpp's `clean_spaces` flag for detokenization.
pub(crate) struct PreTokenizer {
    /// The regex list of `llm_tokenizer_bpe`'s constructor for this pre-tokenizer type.
    pub regexes: &'static [&'static str],
    /// llama.cpp `clean_spaces` (`clean_up_tokenization_spaces`) for this pre-tokenizer type.
    pub clean_spaces: bool,
}

/// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value (`llama_vocab::impl::load` maps the name
/// to a `LLAMA_VOCAB_PRE_TYPE_*` and sets `clean_spaces`; the `llm_tokenizer_bpe` constructor gives the
/// regexes). `None` (key absent) is llama.cpp's `default`.
///
/// Errors: a name llama.cpp maps to a pre-tokenizer not implemented here (or does not know).
pub(crate) fn pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizer> {
    let p = |regexes, clean_spaces| {
        Ok(PreTokenizer {
            regexes,
            clean_spaces,
        })
    };
    match pre.unwrap_or("default") {
        // LLAMA_VOCAB_PRE_TYPE_DEFAULT
        "default" => p(
            &[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2,
                r"\p{N}+",
                "[0-9][0-9][0-9]",
            ],
            true,
        ),
        // STARCODER / REFACT / COMMAND_R / SMOLLM / CODESHELL / EXAONE / MINERVA: digits one by one, then GPT-2.
        "smollm" | "command-r" => p(&[r"\p{N}", GPT2], false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => p(&[r"\p{N}", GPT2], true),
        // GPT2 / MPT / OLMO / JAIS / TRILLION / GRANITE_DOCLING.
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
        | "mellum" | "modern-bert" | "exaone4" | "mpt" | "olmo" | "jais" => p(&[GPT2], true),
        "trillion" | "granite-docling" => p(&[GPT2], false),
        // QWEN2 / STABLELM2 / HUNYUAN.
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" => p(&[QWEN2], false),
        "stablelm2" | "megrez" => p(&[QWEN2], true),
        other => Err(Error::Unsupported(format!(
            "tokenizer.ggml.pre = {other:?} is not supported (supported: default, gpt-2, smollm, starcoder, \
             qwen2 and the names llama.cpp maps to the same pre-tokenizers)"
        ))),
    }
}

/// One `tokenizer.ggml.pre` name per pre-tokenizer this module implements and `clean_spaces` setting, for
/// naming the pre-tokenizer of a `tokenizer.json` ([`crate::hf::tokenizer_json`]: llama.cpp's converter
/// does the same by hashing the tokenizer's output).
pub(crate) const PRE_NAMES: &[&str] = &[
    "smollm",
    "starcoder",
    "gpt-2",
    "trillion",
    "qwen2",
    "stablelm2",
    "default",
];

/// The `tokenizer.ggml.pre` name of [`PRE_NAMES`] whose regexes are `regexes` and whose `clean_spaces` is
/// `clean_spaces`, `None` if none.
pub(crate) fn pre_name(regexes: &[String], clean_spaces: bool) -> Option<&'static str> {
    PRE_NAMES.iter().copied().find(|n| {
        pre_tokenizer(Some(n)).is_ok_and(|p| {
            p.clean_spaces == clean_spaces
                && p.regexes.len() == regexes.len()
                && p.regexes.iter().zip(regexes).all(|(a, b)| *a == b)
        })
    })
}

/// Build the `tokenizers` pipeline: `Split` per regex (`Isolated`, as llama.cpp keeps both the matches and
/// the text between them), then `ByteLevel` without its own regex. Returns it with the id of the "missing
/// byte" sentinel, which [`super::Tokenizer::encode`] drops from the output.
///
/// A vocabulary may lack some byte characters (SmolLM2 has no token for the bytes 0x04, 0x06, 0x13, 0x14,
/// 0x16, 0x1D, 0xF1, 0xF2, ...). llama.cpp keeps such a character as a symbol that takes part in no merge and
/// outputs nothing for it (`llm_tokenizer_bpe_session::tokenize` finds no token for its bytes), so its
/// neighbours never merge across it. `BPE` without an unknown token would drop the character *before*
/// merging ("!\x04!" would become "!!"), so the sentinel (an id past the vocabulary, in no merge) is its
/// unknown token: it keeps the neighbours apart and is removed afterwards.
///
/// Errors: a regex fancy-regex rejects (a bug), a malformed merge list.
pub(super) fn build(
    tokens: &[String],
    merges: Vec<(String, String)>,
    pre: &PreTokenizer,
) -> Result<(tokenizers::Tokenizer, u32)> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
    for re in pre.regexes {
        let split = Split::new(
            SplitPattern::Regex(llama_classes(re)),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| Error::Tokenizer(format!("bad pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());

    let mut vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    // The text of the sentinel only has to differ from every token (and no byte-level text contains NUL).
    let mut unk = String::from("\0lockstep-missing-byte");
    while vocab.contains_key(&unk) {
        unk.push('\0');
    }
    let sentinel = tokens.len() as u32;
    vocab.insert(unk.clone(), sentinel);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token(unk)
        .fuse_unk(false)
        .build()
        .map_err(|e| Error::Tokenizer(format!("building BPE: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok((inner, sentinel))
}

/// Split a `tokenizer.ggml.merges` entry as llama.cpp does: at the first space after the first byte.
pub(crate) fn split_merge(m: &str) -> Option<(String, String)> {
    let at = m.as_bytes().iter().skip(1).position(|&b| b == b' ')? + 1;
    Some((m[..at].to_string(), m[at + 1..].to_string()))
}

/// llama.cpp `llama_decode_text`: a byte-level token's text back to bytes; a character outside GPT-2's map
/// becomes `[UNK_BYTE_0x<hex>` + the whole text + `]`, as llama.cpp writes it.
pub(super) fn decode_text(
    text: &str,
    unicode_to_byte: &std::collections::HashMap<char, u8>,
    out: &mut Vec<u8>,
) {
    for c in text.chars() {
        match unicode_to_byte.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).as_bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

/// llama.cpp `llama_vocab::impl::detokenize`'s `clean_spaces` passes: drop the space before `? ! . ,`, around a
/// lone `'`, and before `'s`, `'m`, `'re`, `'ve`.
pub(super) fn clean_spaces(text: &mut Vec<u8>) {
    // first pass: " ?", " !", " .", " ,"
    let t = std::mem::take(text);
    let mut out: Vec<u8> = Vec::with_capacity(t.len());
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // second pass: " ' " -> "'" (llama.cpp overwrites the dropped space with NUL, which the next
    // character then sees as its predecessor)
    let mut t = std::mem::take(&mut out);
    let mut i = 0;
    while i < t.len() {
        let x = t[i];
        if i > 0 && x == b'\'' && i + 1 < t.len() && t[i - 1] == b' ' && t[i + 1] == b' ' {
            out.pop();
            out.push(x);
            t[i + 1] = 0;
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    // third pass: " 's", " 'm", " 're", " 've"
    let t = std::mem::take(&mut out);
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && x == b'\'' && i + 1 < t.len() {
            let x1 = t[i + 1];
            let drop = matches!(x1, b's' | b'm')
                || (i + 2 < t.len() && matches!((x1, t[i + 2]), (b'r', b'e') | (b'v', b'e')));
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let m = bytes_to_unicode();
        assert_eq!(m.len(), 256);
        let mut chars: Vec<char> = m.iter().map(|p| p.1).collect();
        chars.sort();
        chars.dedup();
        assert_eq!(chars.len(), 256);
        // Space maps to 'Ġ' (U+0120), newline to 'Ċ' (U+010A), as in every GPT-2 vocabulary.
        assert!(m.contains(&(b' ', '\u{120}')));
        assert!(m.contains(&(b'\n', '\u{10A}')));
    }

    #[test]
    fn merges_split_after_the_first_byte() {
        assert_eq!(split_merge("a b"), Some(("a".into(), "b".into())));
        assert_eq!(split_merge("Ġ t"), Some(("Ġ".into(), "t".into())));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge(" "), None);
    }

    #[test]
    fn clean_spaces_matches_llama_cpp() {
        let run = |s: &str| {
            let mut v = s.as_bytes().to_vec();
            clean_spaces(&mut v);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(run("Hello , world !"), "Hello, world!");
        assert_eq!(run("a ' b"), "a'b");
        assert_eq!(
            run("it 's I 'm we 're they 've don 't"),
            "it's I'm we're they've don 't"
        );
    }

    #[test]
    fn qwen2_regex_splits_like_llama_cpp() {
        let pre = pre_tokenizer(Some("qwen2")).unwrap();
        let re = tokenizers::utils::SysRegex::new(&llama_classes(pre.regexes[0])).unwrap();
        let pieces = |s: &str| -> Vec<String> {
            re.find_iter(s).map(|(a, b)| s[a..b].to_string()).collect()
        };
        assert_eq!(
            pieces("Hello world's 123  x\n\n y"),
            ["Hello", " world", "'s", " ", "1", "2", "3", " ", " x", "\n\n", " y"]
        );
        assert_eq!(pieces("IT'S ſ's"), ["IT", "'S", " ſ", "'s"]);
        // U+1C89 (a Unicode 16 letter) and U+10D40 (a Unicode 16 digit) are unassigned for llama.cpp: they
        // split like punctuation.
        assert_eq!(
            pieces("a\u{1C89}\u{1C8A}b \u{10D40}9"),
            ["a", "\u{1C89}\u{1C8A}", "b", " \u{10D40}", "9"]
        );
    }
}
