//! Fuzz the bounded `.npz` reader (`lockstep::npz`): any byte string must open or be refused, and every
//! member must read, within a 1 MiB bound, or be refused with an error — never a panic, never an
//! allocation beyond the bound.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use lockstep::npz::Npz;

fuzz_target!(|data: &[u8]| {
    let Ok(mut npz) = Npz::from_bytes(data.to_vec(), Path::new("fuzz.npz")) else {
        return;
    };
    let _ = npz.array_names();
    for m in npz.members() {
        let name = m.strip_suffix(".npy").unwrap_or(&m).to_string();
        if let Ok(a) = npz.read(&name, 1 << 20) {
            assert!(a.data.len() <= 1 << 20);
            let _ = (a.to_f32(), a.to_i32());
        }
    }
});
