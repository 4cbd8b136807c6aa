//! The HTML of the site: escaping (quick-xml's, which covers `& < > " '`), the page frame with its
//! navigation, the one stylesheet, and small table helpers. No JavaScript.

use std::fmt::Write as _;

/// Text from a report made safe inside an HTML element or a quoted attribute value: control characters
/// (NUL, ESC, …) become U+FFFD ([`crate::format::xml_safe`]), then `& < > " '` are escaped.
pub fn esc(s: &str) -> String {
    quick_xml::escape::escape(crate::format::xml_safe(s)).into_owned()
}

/// The site's stylesheet (`style.css`): plain CSS, readable without it too.
pub const STYLE_CSS: &str = "\
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 80em; padding: 0 1em; color: #222; }
nav { margin-bottom: 1em; padding-bottom: .5em; border-bottom: 1px solid #ccc; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: .9em; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #17692a; font-weight: bold; }
.fail { color: #b00020; font-weight: bold; }
.muted { color: #666; }
code { font-size: .95em; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
section.cell { border-top: 1px solid #ddd; padding-top: .5em; }
";

/// A whole page: `title`, the navigation (relative to the site root through `root`, e.g. `../../`), and
/// `body` (HTML, already escaped).
pub fn page(title: &str, root: &str, body: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{t}</title>\n<link rel=\"stylesheet\" href=\"{root}style.css\">\n</head>\n<body>\n\
         <nav><a href=\"{root}index.html\">Runs</a><a href=\"{root}bench.html\">Benchmarks</a></nav>\n\
         <h1>{t}</h1>\n{body}</body>\n</html>\n",
        t = esc(title),
    );
    s
}

/// `PASS` or `FAIL` as a styled span.
pub fn verdict(pass: bool) -> &'static str {
    if pass {
        "<span class=\"pass\">PASS</span>"
    } else {
        "<span class=\"fail\">FAIL</span>"
    }
}

/// A table cell holding HTML (already escaped).
pub fn td(html: impl AsRef<str>) -> String {
    format!("<td>{}</td>", html.as_ref())
}

/// A right-aligned table cell holding a number's text (escaped here).
pub fn td_num(text: impl AsRef<str>) -> String {
    format!("<td class=\"num\">{}</td>", esc(text.as_ref()))
}

/// A table: header cells (escaped here) and rows of cells made by [`td`] / [`td_num`].
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::from("<table>\n<tr>");
    for h in header {
        let _ = write!(s, "<th>{}</th>", esc(h));
    }
    s.push_str("</tr>\n");
    for r in rows {
        s.push_str("<tr>");
        for c in r {
            s.push_str(c);
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&apos;x&apos;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
    }

    #[test]
    fn a_number_cell_is_right_aligned_and_text_is_kept() {
        let t = table(&["a<b", "n"], &[vec![td("x"), td_num("1.5")]]);
        assert!(t.contains("<th>a&lt;b</th>") && t.contains("<td class=\"num\">1.5</td>"));
    }
}
