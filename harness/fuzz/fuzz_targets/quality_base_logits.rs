//! Fuzz the quality base-logits cache reader (`lockstep::quality::base::parse_base_logits`): any byte
//! string is a checked cache (its sha256 trailer and every size and value in range) or an error — never a
//! panic, never an allocation beyond what the input's length bounds.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = lockstep::quality::base::parse_base_logits(data, Path::new("fuzz.lsqbase"));
});
