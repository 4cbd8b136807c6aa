//! Fuzz the quality corpus reader (`lockstep::quality::Corpus::parse`): any byte string is a non-empty
//! UTF-8 text or an error naming the byte offset — never a panic.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = lockstep::quality::Corpus::parse(data, Path::new("fuzz.txt")) {
        assert!(!data.is_empty());
        let _ = c;
    }
});
