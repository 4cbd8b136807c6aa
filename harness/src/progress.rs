//! Progress on stderr for long commands: a bar on a terminal, one plain line per finished item elsewhere.
//!
//! A CI log or `| tee` is not a terminal, and a bar drawn there is hidden (indicatif draws nothing), so a run
//! of twenty minutes would print nothing at all. Where stderr is not a terminal [`Progress`] prints one line
//! per finished item instead, as cargo and nextest do:
//!
//! ```text
//! [37/192] smollm2-135m-q4_1/prose/Q4_1/ggml/simd-avx2/llama.cpp-f32kv/lockstep PASS 2.1 s, elapsed 3:12, ~6:40 left
//! ```
//!
//! and one line per long step ([`Progress::step`]: fetching a model, making a variant). The estimate of the
//! time left is the mean time of the finished items times the number left.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Display {
    /// Nothing (tests, `--quiet` callers).
    Hidden,
    /// An indicatif bar (stderr is a terminal).
    Bar,
    /// One line per finished item and per long step (stderr is not a terminal).
    Lines,
}

impl Display {
    /// [`Display::Bar`] when stderr is a terminal, else [`Display::Lines`]; [`Display::Hidden`] when `on` is
    /// false.
    pub fn for_stderr(on: bool) -> Display {
        match (on, std::io::stderr().is_terminal()) {
            (false, _) => Display::Hidden,
            (true, true) => Display::Bar,
            (true, false) => Display::Lines,
        }
    }
}

/// A bar over `total` bytes written (`lockstep quantize`): drawn when `display` is [`Display::Bar`]; with
/// [`Display::Lines`] one line saying what starts (`what`, the size), as a log has no bar; hidden otherwise.
/// Write through it with [`ProgressBar::wrap_write`]; its position is the bytes written so far.
pub fn byte_bar(total: u64, what: &str, display: Display) -> ProgressBar {
    match display {
        Display::Bar => {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ~{eta} left",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b.set_message(what.to_string());
            b
        }
        Display::Lines => {
            eprintln!(
                "{what}: {:.1} MiB to write",
                total as f64 / (1 << 20) as f64
            );
            let b = ProgressBar::hidden();
            b.set_length(total);
            b
        }
        Display::Hidden => {
            let b = ProgressBar::hidden();
            b.set_length(total);
            b
        }
    }
}

/// Progress over `total` items (cells of a run).
pub struct Progress {
    display: Display,
    bar: ProgressBar,
    total: usize,
    done: usize,
    start: Instant,
}

impl Progress {
    /// Progress over `total` items, shown as `display` says.
    pub fn new(total: usize, display: Display) -> Progress {
        let bar = match display {
            Display::Bar => {
                let b = ProgressBar::new(total as u64);
                b.set_style(
                    ProgressStyle::with_template("{spinner} [{pos}/{len}] {wide_msg} {elapsed}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                b
            }
            _ => ProgressBar::hidden(),
        };
        Progress {
            display,
            bar,
            total,
            done: 0,
            start: Instant::now(),
        }
    }

    /// Item `name` starts (the bar shows its name; lines print nothing until it ends).
    pub fn start(&self, name: &str) {
        self.bar.set_message(printable(name));
    }

    /// Item `name` ended with `outcome` (e.g. `PASS`, `FAIL`) after `took`.
    pub fn finish(&mut self, name: &str, outcome: &str, took: Duration) {
        self.done += 1;
        self.bar.inc(1);
        if self.display == Display::Lines {
            eprintln!("{}", self.line(name, outcome, took));
        }
    }

    /// A long step outside the items (fetching, making a variant) ended: one line in [`Display::Lines`],
    /// printed above the bar in [`Display::Bar`].
    pub fn step(&self, what: &str, took: Duration) {
        let line = format!("{what} ({:.1} s)", took.as_secs_f64());
        match self.display {
            Display::Hidden => {}
            Display::Bar => self.bar.println(line),
            Display::Lines => eprintln!("{line}"),
        }
    }

    /// Clears the bar.
    pub fn clear(&self) {
        self.bar.finish_and_clear();
    }

    /// The line printed for a finished item.
    fn line(&self, name: &str, outcome: &str, took: Duration) -> String {
        let elapsed = self.start.elapsed();
        let left = self.total.saturating_sub(self.done);
        let eta = if self.done == 0 {
            Duration::ZERO
        } else {
            elapsed.mul_f64(left as f64 / self.done as f64)
        };
        format!(
            "[{}/{}] {} {outcome} {:.1} s, elapsed {}, ~{} left",
            self.done,
            self.total,
            printable(name),
            took.as_secs_f64(),
            clock(elapsed),
            clock(eta)
        )
    }
}

/// `name` (a cell id made of the matrix's names) with control characters as spaces: one line per item,
/// and no escape sequence from a matrix file reaches the terminal.
fn printable(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `m:ss` (or `h:mm:ss` from an hour on).
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_bar_counts_the_bytes_written_through_it() {
        use std::io::Write;
        for display in [Display::Bar, Display::Lines, Display::Hidden] {
            let bar = byte_bar(3000, "quantize x to Q4_0", display);
            assert_eq!(bar.length(), Some(3000));
            let mut w = bar.wrap_write(Vec::new());
            for _ in 0..3 {
                w.write_all(&[7u8; 1000]).unwrap();
            }
            assert_eq!(bar.position(), 3000, "{display:?}");
            if display != Display::Bar {
                assert!(bar.is_hidden());
            }
        }
    }

    #[test]
    fn names_print_on_one_line_without_escapes() {
        assert_eq!(super::printable("a\nb\u{1b}[31mc"), "a b [31mc");
    }

    #[test]
    fn clock_formats_minutes_and_hours() {
        assert_eq!(clock(Duration::from_secs(0)), "0:00");
        assert_eq!(clock(Duration::from_secs(192)), "3:12");
        assert_eq!(clock(Duration::from_secs(3 * 3600 + 61)), "3:01:01");
    }

    #[test]
    fn line_counts_and_estimates_time_left() {
        let mut p = Progress::new(4, Display::Hidden);
        p.start = Instant::now() - Duration::from_secs(10);
        p.done = 1;
        let l = p.line("m/p/Q4_1/ggml", "PASS", Duration::from_millis(2100));
        assert!(
            l.starts_with("[1/4] m/p/Q4_1/ggml PASS 2.1 s, elapsed 0:10, ~0:3"),
            "{l}"
        );
        p.done = 4;
        let l = p.line("x", "FAIL", Duration::ZERO);
        assert!(l.ends_with("~0:00 left"), "{l}");
    }
}
