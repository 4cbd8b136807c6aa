//! Fuzz the dump reader (`lockstep::dump::read_bytes`), the format external engines write: any byte
//! string must give a dump whose arrays agree (T tokens, `[T, V]` logits, `[T, D]` stages; an encoder's
//! dump: no logits and a `[1, D]` `pooled`) or an error — never a panic.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = lockstep::dump::read_bytes(data.to_vec(), Path::new("fuzz.npz"), 4 << 20) {
        match &d.logits {
            Some(l) => assert_eq!(l.nrows(), d.tokens.len()),
            None => assert_eq!(d.stages["pooled"].nrows(), 1),
        }
        for (name, a) in &d.stages {
            if !(d.logits.is_none() && name == "pooled") {
                assert_eq!(a.nrows(), d.tokens.len());
            }
        }
    }
});
