//! Tokenizer parity with llama.cpp on the real model files.
//!
//! `fixtures/tokenizer/llamacpp.json` (made by oracles/fixtures/make_tokenizer_fixtures.py with
//! llama-cpp-python 0.3.36) holds, for SmolLM2-135M (gpt2 BPE, pre `smollm`), Gemma 3 270m (SentencePiece)
//! and Qwen2.5-Coder-0.5B (gpt2 BPE, pre `qwen2`), llama.cpp's `llama_tokenize(text, add_special,
//! parse_special)` of a corpus (prose, Arabic, CJK, emoji sequences, code with tabs, runs of spaces and
//! newlines, digits, contractions, chat templates with special tokens, the empty string, ...) and
//! `llama_detokenize(ids, remove_special = false, unparse_special = false)` of the result. Every case must be
//! reproduced exactly by `Tokenizer::encode` / `Tokenizer::decode_bytes` (and `decode`, its lossy UTF-8 form).
//!
//! The model tests are `#[ignore]`d because they need the fetched models (`lockstep fetch <id>` puts them in
//! `$LOCKSTEP_CACHE/models` or `~/.cache/lockstep/models`); CI runs them with `--ignored` after fetching, and
//! a missing model is a failure, not a skip.

use std::path::PathBuf;

use lockstep_engine::gguf::GgufFile;
use lockstep_engine::tokenizer::Tokenizer;

const FIXTURE: &str = include_str!("fixtures/tokenizer/llamacpp.json");

/// A minimal JSON reader (the engine has no JSON dependency): enough for the fixture.
mod json {
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Num(f64),
        Str(String),
        Arr(Vec<Value>),
        Obj(Vec<(String, Value)>),
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Obj(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }
        pub fn arr(&self) -> &[Value] {
            match self {
                Value::Arr(a) => a,
                other => panic!("expected an array, got {other:?}"),
            }
        }
        pub fn str(&self) -> &str {
            match self {
                Value::Str(s) => s,
                other => panic!("expected a string, got {other:?}"),
            }
        }
        pub fn bool(&self) -> bool {
            match self {
                Value::Bool(b) => *b,
                other => panic!("expected a bool, got {other:?}"),
            }
        }
        pub fn u32(&self) -> u32 {
            match self {
                Value::Num(n) if *n >= 0.0 && n.fract() == 0.0 && *n <= u32::MAX as f64 => {
                    *n as u32
                }
                other => panic!("expected a u32, got {other:?}"),
            }
        }
    }

    pub fn parse(s: &str) -> Value {
        let mut p = Parser {
            b: s.as_bytes(),
            s,
            i: 0,
        };
        let v = p.value();
        p.ws();
        assert_eq!(p.i, p.b.len(), "trailing data at byte {}", p.i);
        v
    }

    struct Parser<'a> {
        b: &'a [u8],
        s: &'a str,
        i: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }
        fn eat(&mut self, c: u8) {
            self.ws();
            assert_eq!(
                self.b.get(self.i),
                Some(&c),
                "expected {:?} at byte {}",
                c as char,
                self.i
            );
            self.i += 1;
        }
        fn value(&mut self) -> Value {
            self.ws();
            match self.b[self.i] {
                b'{' => {
                    self.i += 1;
                    let mut kv = Vec::new();
                    self.ws();
                    if self.b[self.i] == b'}' {
                        self.i += 1;
                        return Value::Obj(kv);
                    }
                    loop {
                        self.ws();
                        let k = self.string();
                        self.eat(b':');
                        kv.push((k, self.value()));
                        self.ws();
                        self.i += 1;
                        match self.b[self.i - 1] {
                            b',' => continue,
                            b'}' => return Value::Obj(kv),
                            c => panic!("unexpected {:?} at byte {}", c as char, self.i - 1),
                        }
                    }
                }
                b'[' => {
                    self.i += 1;
                    let mut a = Vec::new();
                    self.ws();
                    if self.b[self.i] == b']' {
                        self.i += 1;
                        return Value::Arr(a);
                    }
                    loop {
                        a.push(self.value());
                        self.ws();
                        self.i += 1;
                        match self.b[self.i - 1] {
                            b',' => continue,
                            b']' => return Value::Arr(a),
                            c => panic!("unexpected {:?} at byte {}", c as char, self.i - 1),
                        }
                    }
                }
                b'"' => Value::Str(self.string()),
                b't' => self.word("true", Value::Bool(true)),
                b'f' => self.word("false", Value::Bool(false)),
                b'n' => self.word("null", Value::Null),
                _ => {
                    let start = self.i;
                    while self.i < self.b.len()
                        && matches!(
                            self.b[self.i],
                            b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                        )
                    {
                        self.i += 1;
                    }
                    Value::Num(
                        self.s[start..self.i]
                            .parse()
                            .unwrap_or_else(|e| panic!("number at byte {start}: {e}")),
                    )
                }
            }
        }
        fn word(&mut self, w: &str, v: Value) -> Value {
            assert!(
                self.s[self.i..].starts_with(w),
                "expected {w} at byte {}",
                self.i
            );
            self.i += w.len();
            v
        }
        fn hex4(&mut self) -> u32 {
            let h = &self.s[self.i..self.i + 4];
            self.i += 4;
            u32::from_str_radix(h, 16).unwrap_or_else(|e| panic!("bad \\u{h}: {e}"))
        }
        fn string(&mut self) -> String {
            self.eat(b'"');
            let mut out = String::new();
            loop {
                let start = self.i;
                while self.b[self.i] != b'"' && self.b[self.i] != b'\\' {
                    self.i += 1;
                }
                out.push_str(&self.s[start..self.i]);
                let c = self.b[self.i];
                self.i += 1;
                if c == b'"' {
                    return out;
                }
                let e = self.b[self.i];
                self.i += 1;
                match e {
                    b'"' => out.push('"'),
                    b'\\' => out.push('\\'),
                    b'/' => out.push('/'),
                    b'b' => out.push('\u{8}'),
                    b'f' => out.push('\u{c}'),
                    b'n' => out.push('\n'),
                    b'r' => out.push('\r'),
                    b't' => out.push('\t'),
                    b'u' => {
                        let hi = self.hex4();
                        let cp = if (0xD800..0xDC00).contains(&hi) {
                            assert_eq!(&self.b[self.i..self.i + 2], b"\\u", "lone surrogate");
                            self.i += 2;
                            let lo = self.hex4();
                            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                        } else {
                            hi
                        };
                        out.push(char::from_u32(cp).expect("valid code point"));
                    }
                    other => panic!("bad escape \\{}", other as char),
                }
            }
        }
    }
}

fn fixture() -> json::Value {
    json::parse(FIXTURE)
}

/// Where `lockstep fetch` caches a model: `$LOCKSTEP_CACHE/models/<id>.gguf`, else
/// `$XDG_CACHE_HOME/lockstep/models/<id>.gguf` or `~/.cache/lockstep/models/<id>.gguf`; panics (the test fails)
/// when none exists.
fn model_path(id: &str) -> PathBuf {
    let file = format!("{id}.gguf");
    let mut tried = Vec::new();
    if let Some(cache) = std::env::var_os("LOCKSTEP_CACHE").filter(|c| !c.is_empty()) {
        tried.push(PathBuf::from(cache).join("models").join(&file));
    }
    if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME").filter(|c| !c.is_empty()) {
        tried.push(PathBuf::from(xdg).join("lockstep/models").join(&file));
    }
    if let Some(home) = std::env::var_os("HOME") {
        tried.push(
            PathBuf::from(home)
                .join(".cache/lockstep/models")
                .join(&file),
        );
    }
    tried
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!("{file} not found (looked at {tried:?}); run `lockstep fetch {id}` first")
        })
}

/// Every fixture case of `model_id` against the engine's tokenizer; all mismatches are listed before failing.
fn check_model(model_id: &str) {
    let fx = fixture();
    let texts: Vec<&str> = fx
        .get("texts")
        .unwrap()
        .arr()
        .iter()
        .map(|t| t.str())
        .collect();
    let m = fx
        .get("models")
        .and_then(|m| m.get(model_id))
        .unwrap_or_else(|| panic!("no {model_id} in the fixture"));
    let path = model_path(model_id);
    // The fetch step leaves a verified `sha256sum` sidecar; it must name the file the fixture was made from.
    let sidecar = PathBuf::from(format!("{}.sha256", path.display()));
    if let Ok(s) = std::fs::read_to_string(&sidecar) {
        let want = m.get("sha256").unwrap().str();
        assert!(
            s.starts_with(want),
            "{}: {s:?} is not the fixture's model {want}",
            sidecar.display()
        );
    }
    let gguf = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();

    let mut failures = Vec::new();
    let mut n = 0;
    for case in m.get("cases").unwrap().arr() {
        let name = case.get("name").unwrap().str();
        let text = texts[case.get("text").unwrap().u32() as usize];
        let add_special = case.get("add_special").unwrap().bool();
        let want: Vec<u32> = case
            .get("ids")
            .unwrap()
            .arr()
            .iter()
            .map(json::Value::u32)
            .collect();
        let want_bytes: Vec<u8> = match (case.get("decoded"), case.get("decoded_bytes")) {
            (Some(d), _) => d.str().as_bytes().to_vec(),
            (None, Some(b)) => b
                .arr()
                .iter()
                .map(|v| u8::try_from(v.u32()).unwrap())
                .collect(),
            (None, None) => text.as_bytes().to_vec(),
        };
        for ps in case.get("parse_special").unwrap().arr() {
            let parse_special = ps.bool();
            n += 1;
            let got = tok.encode(text, add_special, parse_special).unwrap();
            if got != want {
                let show = |ids: &[u32]| -> Vec<String> {
                    ids.iter()
                        .map(|&i| format!("{i}:{:?}", tok.token_text(i).unwrap_or("?")))
                        .collect()
                };
                failures.push(format!(
                    "{name} (add_special {add_special}, parse_special {parse_special}) {text:?}:\n  llama.cpp {:?}\n  engine    {:?}",
                    show(&want),
                    show(&got)
                ));
                continue;
            }
            let decoded = tok.decode_bytes(&got);
            if decoded != want_bytes {
                failures.push(format!(
                    "{name} (add_special {add_special}, parse_special {parse_special}): decode gives {:?}, llama.cpp {:?}",
                    String::from_utf8_lossy(&decoded),
                    String::from_utf8_lossy(&want_bytes)
                ));
            } else if tok.decode(&got) != String::from_utf8_lossy(&want_bytes) {
                failures.push(format!(
                    "{name}: decode is not the lossy form of decode_bytes"
                ));
            }
        }
    }
    assert!(n > 50, "{model_id}: only {n} cases");
    assert!(
        failures.is_empty(),
        "{model_id}: {} of {n} cases differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn fixture_is_well_formed() {
    let fx = fixture();
    let texts = fx.get("texts").unwrap().arr();
    assert!(texts.len() > 40);
    assert!(
        texts.iter().any(|t| t.str().is_empty()),
        "the empty string is covered"
    );
    for id in [
        "smollm2-135m-q4_1",
        "gemma3-270m-q4_k_m",
        "qwen2.5-coder-0.5b-q4_k_m",
    ] {
        let m = fx
            .get("models")
            .unwrap()
            .get(id)
            .unwrap_or_else(|| panic!("{id} missing"));
        assert_eq!(m.get("sha256").unwrap().str().len(), 64);
        let cases = m.get("cases").unwrap().arr();
        // every text appears, with both parse_special values
        for t in 0..texts.len() as u32 {
            let mut seen = [false; 2];
            for c in cases.iter().filter(|c| c.get("text").unwrap().u32() == t) {
                for ps in c.get("parse_special").unwrap().arr() {
                    seen[ps.bool() as usize] = true;
                }
            }
            assert_eq!(seen, [true, true], "{id}: text {t}");
        }
    }
    assert_eq!(
        json::parse(r#"{"a": ["\u00e9\ud83e\udd80\n", -1.5e1, true, null, {}]}"#),
        json::Value::Obj(vec![(
            "a".into(),
            json::Value::Arr(vec![
                json::Value::Str("é🦀\n".into()),
                json::Value::Num(-15.0),
                json::Value::Bool(true),
                json::Value::Null,
                json::Value::Obj(vec![]),
            ])
        )])
    );
}

#[test]
#[ignore = "needs smollm2-135m-q4_1 in $LOCKSTEP_CACHE/models or ~/.cache/lockstep/models; CI runs it with --ignored after fetching"]
fn smollm2_tokenizer_matches_llamacpp() {
    check_model("smollm2-135m-q4_1");
}

#[test]
#[ignore = "needs gemma3-270m-q4_k_m in $LOCKSTEP_CACHE/models or ~/.cache/lockstep/models; CI runs it with --ignored after fetching"]
fn gemma3_tokenizer_matches_llamacpp() {
    check_model("gemma3-270m-q4_k_m");
}

#[test]
#[ignore = "needs qwen2.5-coder-0.5b-q4_k_m in $LOCKSTEP_CACHE/models or ~/.cache/lockstep/models; CI runs it with --ignored after fetching"]
fn qwen25_tokenizer_matches_llamacpp() {
    check_model("qwen2.5-coder-0.5b-q4_k_m");
}
