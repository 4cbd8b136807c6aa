//! Number and time formatting shared by the gate's failure lines and the reports: fixed and scientific
//! notation with trailing zeros trimmed, table cells, UTC dates. Non-finite values print as `inf`, `-inf`,
//! `nan` everywhere.

pub(crate) fn non_finite(v: f64) -> Option<&'static str> {
    if v.is_nan() {
        Some("nan")
    } else if v == f64::INFINITY {
        Some("inf")
    } else if v == f64::NEG_INFINITY {
        Some("-inf")
    } else {
        None
    }
}

/// `v` with `decimals` decimals, trailing zeros (and a trailing point) trimmed: `0.9999`,
/// `0.99912346`, `1`. Non-finite values as `inf`, `-inf`, `nan`.
pub fn fmt_fixed(v: f64, decimals: usize) -> String {
    if let Some(s) = non_finite(v) {
        return s.to_string();
    }
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".to_string()
    } else {
        s
    }
}

/// `v` in scientific notation with `digits` mantissa decimals, trailing zeros trimmed: `1.234e-5`,
/// `1e-3`, `0`. Non-finite values as `inf`, `-inf`, `nan`.
pub fn fmt_sci(v: f64, digits: usize) -> String {
    if let Some(s) = non_finite(v) {
        return s.to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    let s = format!("{v:.digits$e}");
    match s.split_once('e') {
        Some((m, e)) if m.contains('.') => {
            format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => s,
    }
}

/// NMSE, KL and margins for tables: 3 mantissa decimals, not trimmed (`1.960e-3`); `0` for zero;
/// non-finite values as `inf`, `-inf`, `nan`.
pub fn fmt_e3(v: f64) -> String {
    match non_finite(v) {
        Some(s) => s.to_string(),
        None if v == 0.0 => "0".to_string(),
        None => format!("{v:.3e}"),
    }
}

/// A cosine for tables: 8 decimals, not trimmed (columns line up): `0.99998765`.
pub fn fmt_cos(v: f64) -> String {
    match non_finite(v) {
        Some(s) => s.to_string(),
        None => format!("{v:.8}"),
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time.
pub fn fmt_utc(unix: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(unix);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC")
}

/// (year, month, day, hour, minute, second) of a Unix time, UTC (proleptic Gregorian calendar).
pub(crate) fn civil(unix: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (secs / 3600) as u32,
        (secs % 3600 / 60) as u32,
        (secs % 60) as u32,
    )
}

/// Text made a valid XML 1.0 document part (SVG, the site's HTML, JUnit XML): the characters XML 1.0
/// cannot carry at all, even escaped — control characters other than tab and line breaks (NUL, ESC, …),
/// U+FFFE and U+FFFF — become U+FFFD; everything else is kept (escaping `<`, `&` is the writer's job).
pub fn xml_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if (c < ' ' && !matches!(c, '\t' | '\n' | '\r')) || matches!(c, '\u{FFFE}' | '\u{FFFF}')
            {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

/// Text from outside lockstep (a path, an argument, an engine's message) made safe to print on a
/// terminal: control characters other than line breaks and tab (ESC of an ANSI sequence that would clear
/// the screen or retitle the window, NUL, DEL, the C1 controls) are shown as `\u{1b}`-style escapes, so an
/// error message shows what the bytes were instead of acting on them.
pub fn terminal_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && !matches!(c, '\n' | '\t') {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// Text from outside lockstep (a model id or path, a quant or prompt name, a label, an engine's error
/// message) made safe for one Markdown table cell or a line (GFM): backslash, `|` and `` ` `` are
/// backslash-escaped, `<`, `>` and `&` become HTML entities, and line breaks and other control characters
/// become spaces — so no value can end a cell, a row or the table, or inject HTML such as `<script>`.
/// report.md, bench.md and the quality report all escape through it.
pub fn md_text(s: &str) -> String {
    escape_md(s, true)
}

/// [`md_text`] keeping backticks: for lockstep's own messages that quote stage kinds in code spans and may
/// carry outside text (a stray backtick cannot split a table: GFM honours `\|` inside code spans too).
pub fn md_text_keep_code(s: &str) -> String {
    escape_md(s, false)
}

fn escape_md(s: &str, backticks: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | '|' => {
                out.push('\\');
                out.push(c);
            }
            '`' if backticks => out.push_str("\\`"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\u{2028}' | '\u{2029}' => out.push(' '),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Text from outside lockstep as one Markdown code span (backticks included): control characters become
/// spaces, `|` is escaped (GFM splits table cells on it even inside code spans), and the fence is one
/// backtick longer than the longest run inside (CommonMark), so nothing in `s` ends the span early.
pub fn md_code(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .replace('|', "\\|");
    let (mut run, mut longest) = (0usize, 0usize);
    for c in clean.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if clean.starts_with('`') || clean.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{clean}{pad}{fence}")
}

/// A CSV document (RFC 4180) written with the `csv` crate: results.csv, bench.csv and the quality CSV.
///
/// Fields are quoted only when they must be (a `,` or a `"`; `"` doubled), records end in `\n`, and every
/// record has the header's number of fields (the `csv` writer refuses another). Control characters (line
/// breaks included) become spaces before writing, so every record is one line for line-based tools.
pub struct CsvDoc {
    writer: csv::Writer<Vec<u8>>,
}

impl CsvDoc {
    /// A document whose first record is `header`.
    ///
    /// Errors: only those of [`CsvDoc::row`].
    pub fn with_header<I, S>(header: I) -> anyhow::Result<CsvDoc>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let writer = csv::WriterBuilder::new()
            .quote_style(csv::QuoteStyle::Necessary)
            .terminator(csv::Terminator::Any(b'\n'))
            .from_writer(Vec::new());
        let mut doc = CsvDoc { writer };
        doc.row(header)?;
        Ok(doc)
    }

    /// Append one record.
    ///
    /// Errors: a record with another number of fields than the header (a bug of the caller).
    pub fn row<I, S>(&mut self, fields: I) -> anyhow::Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let clean = fields.into_iter().map(|f| {
            f.as_ref()
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect::<String>()
        });
        self.writer
            .write_record(clean)
            .map_err(|e| anyhow::anyhow!("cannot write a CSV record: {e}"))
    }

    /// The document's text.
    ///
    /// Errors: only if the writer's buffer cannot be taken back (it is memory).
    pub fn finish(self) -> anyhow::Result<String> {
        let bytes = self
            .writer
            .into_inner()
            .map_err(|e| anyhow::anyhow!("cannot finish the CSV document: {e}"))?;
        String::from_utf8(bytes).map_err(|e| anyhow::anyhow!("CSV is not UTF-8: {e}"))
    }
}

#[cfg(test)]
mod escape_tests {
    use super::*;

    #[test]
    fn outside_text_cannot_break_a_table_or_inject_html() {
        assert_eq!(
            md_text("a|b\\|c\n<script>&`x`"),
            "a\\|b\\\\\\|c &lt;script&gt;&amp;\\`x\\`"
        );
        assert_eq!(md_text_keep_code("`blk`|x"), "`blk`\\|x");
        assert_eq!(md_code("a`b|c"), "``a`b\\|c``");
        assert_eq!(md_code("`x"), "`` `x ``");
        let mut doc = CsvDoc::with_header(["a", "b"]).unwrap();
        doc.row(["a,\"b\"\nc", "plain"]).unwrap();
        assert_eq!(doc.finish().unwrap(), "a,b\n\"a,\"\"b\"\" c\",plain\n");
        let mut doc = CsvDoc::with_header(["a", "b"]).unwrap();
        let e = doc.row(["only one"]).unwrap_err().to_string();
        assert!(e.contains("CSV"), "{e}");
    }
}
