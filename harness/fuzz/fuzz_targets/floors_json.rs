//! Fuzz the measured-floors reader (`lockstep::floors::Floors::parse`, `ci/floors.json`): any text is a
//! floors file whose every key is known, every number finite and in range, sets unique and quantiles
//! ordered, or an error naming the set, kind and field — never a panic. An accepted file passes its own
//! check again (what `lockstep floors` writes must load).

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let origin = Path::new("fuzz-floors.json");
        if let Ok(f) = lockstep::floors::Floors::parse(text, origin) {
            f.check(origin).expect("a parsed floors file passes its own check");
        }
    }
});
