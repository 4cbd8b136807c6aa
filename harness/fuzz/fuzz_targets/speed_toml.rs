//! Fuzz the speed limits reader (`lockstep::bench::parse_speed_limits`, `ci/speed.toml`): any text is a
//! limits file with every number finite and in range and no unknown key, or an error — never a panic.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = lockstep::bench::parse_speed_limits(text, Path::new("fuzz-speed.toml"));
    }
});
