//! Fuzz the dump reader (`lockstep::dump::read_bytes`), the format external engines write: any byte
//! string must give a dump whose arrays agree (T tokens, `[T, V]` logits, `[T, D]` stages) or an error —
//! never a panic.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = lockstep::dump::read_bytes(data.to_vec(), Path::new("fuzz.npz"), 4 << 20) {
        assert_eq!(d.logits.nrows(), d.tokens.len());
        for a in d.stages.values() {
            assert_eq!(a.nrows(), d.tokens.len());
        }
    }
});
