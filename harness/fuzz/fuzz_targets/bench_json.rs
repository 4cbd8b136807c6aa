//! Fuzz the speed gate's reader (`lockstep::bench::parse_bench_json`): any text is a bench.json whose
//! every sample is finite and positive and whose recorded statistics and comparisons are the ones its
//! samples give, or an error naming the field — never a panic. Inputs are capped at 64 KiB: every accepted
//! comparison is recomputed with a 2000-resample bootstrap.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() > 64 << 10 {
        return;
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = lockstep::bench::parse_bench_json(text, Path::new("fuzz-bench.json"));
    }
});
