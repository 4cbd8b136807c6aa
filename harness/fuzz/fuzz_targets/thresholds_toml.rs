//! Fuzz the thresholds reader (`lockstep::gate::Thresholds::parse`, `ci/thresholds.toml`): any text is a
//! thresholds file with every number finite and in its range, selectors valid and no unknown key, or an
//! error naming the rule and field — never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = lockstep::gate::Thresholds::parse(text, "fuzz-thresholds.toml");
    }
});
