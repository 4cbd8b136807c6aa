//! JUnit XML of a run (`lockstep run --junit FILE`, `lockstep gate REPORT --junit FILE`): what GitHub,
//! GitLab and Jenkins read as test results.
//!
//! The schema is the de-facto one of those readers (Jenkins' `junit` plugin, GitLab's unit test reports,
//! the `surefire`/Ant XML): one `<testsuites>` holding one `<testsuite>` per report, one `<testcase>` per
//! cell — `classname` = `lockstep.<model>`, `name` = the cell id, `time` = the cell's wall seconds — and a
//! failing cell's `<failure>` whose `message` is the gate's failure line ([`crate::gate::failure_line`])
//! and whose text lists each failed threshold on its own line. A run that stopped early gets one more
//! testcase, `(run)`, with an `<error>` saying where and why. Written with `quick-xml`, which escapes every
//! attribute and text; characters XML 1.0 cannot carry at all (control characters other than tab and line
//! breaks) are replaced by U+FFFD.

use anyhow::{Context, Result};
use quick_xml::events::{BytesDecl, BytesText, Event};
use quick_xml::Writer;

use super::Report;
use crate::gate::failure_value;

use crate::format::xml_safe;

/// Seconds as JUnit writes them (3 decimals; 0 when unknown or not finite).
fn secs(v: f64) -> String {
    if v.is_finite() && v >= 0.0 {
        format!("{v:.3}")
    } else {
        "0.000".into()
    }
}

/// Render `r` as a JUnit XML document (UTF-8, indented). `suite` names the testsuite (e.g. `lockstep run`).
///
/// Errors: only a failure of the in-memory writer.
pub fn render_junit(r: &Report, suite: &str) -> Result<String> {
    // an expected failure (XFAIL) is a `<skipped>` with its reason, as pytest writes one; a listed cell that
    // passes (XPASS) is a failure
    let failures = r
        .cells
        .iter()
        .filter(|c| c.verdict.pass == c.expected_failure.is_some())
        .count();
    let skipped = r
        .cells
        .iter()
        .filter(|c| !c.verdict.pass && c.expected_failure.is_some())
        .count()
        .to_string();
    let errors = usize::from(r.incomplete.is_some());
    let tests = r.cells.len() + errors;
    let cell_secs = |c: &super::CellReport| {
        c.seconds
            .unwrap_or(c.speed.prefill_seconds + c.speed.decode_seconds)
    };
    let total: f64 = r
        .cells
        .iter()
        .map(cell_secs)
        .filter(|s| s.is_finite())
        .sum();
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let write = |w: &mut Writer<Vec<u8>>| -> std::io::Result<()> {
        w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
        let (tests, failures, errors) =
            (tests.to_string(), failures.to_string(), errors.to_string());
        let name = xml_safe(&format!("{suite} {}", r.run_id));
        let (y, mo, d, h, mi, sec) = crate::format::civil(r.created_unix);
        let timestamp = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{sec:02}");
        w.create_element("testsuites")
            .with_attributes([
                ("name", "lockstep"),
                ("tests", tests.as_str()),
                ("failures", failures.as_str()),
                ("errors", errors.as_str()),
                ("time", secs(total).as_str()),
            ])
            .write_inner_content(|w| {
                w.create_element("testsuite")
                    .with_attributes([
                        ("name", name.as_str()),
                        ("tests", tests.as_str()),
                        ("failures", failures.as_str()),
                        ("errors", errors.as_str()),
                        ("skipped", skipped.as_str()),
                        ("timestamp", timestamp.as_str()),
                        ("time", secs(total).as_str()),
                    ])
                    .write_inner_content(|w| {
                        let env = &r.environment;
                        w.create_element("properties").write_inner_content(|w| {
                            for (k, v) in [
                                ("git_commit", env.git_commit.as_str()),
                                ("cpu_model", env.cpu_model.as_str()),
                                ("lockstep_version", env.lockstep_version.as_str()),
                                (
                                    "golden_manifest_sha256",
                                    env.golden_manifest_sha256.as_str(),
                                ),
                            ] {
                                let v = xml_safe(v);
                                w.create_element("property")
                                    .with_attributes([("name", k), ("value", v.as_str())])
                                    .write_empty()?;
                            }
                            Ok(())
                        })?;
                        for c in &r.cells {
                            let id = xml_safe(&c.cell.id());
                            let class = xml_safe(&format!("lockstep.{}", c.cell.model));
                            let el = w.create_element("testcase").with_attributes([
                                ("classname", class.as_str()),
                                ("name", id.as_str()),
                                ("time", secs(cell_secs(c)).as_str()),
                            ]);
                            match (super::cell_failure_line(c), &c.expected_failure) {
                                (None, None) => {
                                    el.write_empty()?;
                                }
                                (None, Some(x)) => {
                                    let msg = xml_safe(&format!(
                                        "XPASS {}: passed, but listed as expected to fail ({}: {})",
                                        c.cell.id(),
                                        x.cell,
                                        x.reason
                                    ));
                                    el.write_inner_content(|w| {
                                        w.create_element("failure")
                                            .with_attributes([
                                                ("message", msg.as_str()),
                                                ("type", "xpass"),
                                            ])
                                            .write_empty()?;
                                        Ok(())
                                    })?;
                                }
                                (Some(line), Some(x)) => {
                                    let msg = xml_safe(&format!(
                                        "XFAIL (expected until {}): {}",
                                        x.expires, x.reason
                                    ));
                                    let line = xml_safe(&line);
                                    el.write_inner_content(|w| {
                                        w.create_element("skipped")
                                            .with_attribute(("message", msg.as_str()))
                                            .write_text_content(BytesText::new(&line))?;
                                        Ok(())
                                    })?;
                                }
                                (Some(line), None) => {
                                    let kind: Vec<&str> = c
                                        .verdict
                                        .failures
                                        .iter()
                                        .map(|f| f.metric.as_str())
                                        .collect();
                                    let text: Vec<String> = c
                                        .verdict
                                        .failures
                                        .iter()
                                        .map(|f| format!("{}: {}", failure_value(f), f.detail))
                                        .collect();
                                    let (line, kind, text) = (
                                        xml_safe(&line),
                                        xml_safe(&kind.join(",")),
                                        xml_safe(&text.join("\n")),
                                    );
                                    el.write_inner_content(|w| {
                                        w.create_element("failure")
                                            .with_attributes([
                                                ("message", line.as_str()),
                                                ("type", kind.as_str()),
                                            ])
                                            .write_text_content(BytesText::new(&text))?;
                                        Ok(())
                                    })?;
                                }
                            }
                        }
                        if let Some(inc) = &r.incomplete {
                            let msg = xml_safe(&format!(
                                "INCOMPLETE: the run stopped at cell {} ({} cells not run)",
                                inc.failed_cell, inc.cells_not_run
                            ));
                            let text = xml_safe(&inc.error);
                            w.create_element("testcase")
                                .with_attributes([("classname", "lockstep"), ("name", "(run)")])
                                .write_inner_content(|w| {
                                    w.create_element("error")
                                        .with_attributes([
                                            ("message", msg.as_str()),
                                            ("type", "incomplete"),
                                        ])
                                        .write_text_content(BytesText::new(&text))?;
                                    Ok(())
                                })?;
                        }
                        Ok(())
                    })?;
                Ok(())
            })?;
        Ok(())
    };
    write(&mut w).context("cannot render the JUnit XML")?;
    let mut out = String::from_utf8(w.into_inner()).context("JUnit XML is not UTF-8")?;
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_replaced_not_written() {
        assert_eq!(xml_safe("a\u{1}b\tc\nd"), "a\u{FFFD}b\tc\nd");
        assert_eq!(secs(f64::NAN), "0.000");
        assert_eq!(secs(1.23456), "1.235");
    }
}
