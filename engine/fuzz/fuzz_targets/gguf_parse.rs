//! Fuzz the GGUF parser: any byte string must parse or be refused with `Error::Gguf`, never panic,
//! and a file that parses must lend out every tensor's bytes and answer every metadata getter.

#![no_main]

use libfuzzer_sys::fuzz_target;
use lockstep_engine::gguf::GgufFile;
use lockstep_engine::Error;

fuzz_target!(|data: &[u8]| {
    match GgufFile::from_bytes(data.to_vec(), "fuzz") {
        Ok(g) => {
            let mut sum = 0u64;
            for t in g.tensors() {
                let bytes = g.tensor_data(t);
                assert_eq!(bytes.len(), t.n_bytes, "tensor '{}'", t.name);
                sum = sum.wrapping_add(bytes.iter().map(|&b| u64::from(b)).sum::<u64>());
                assert!(g.tensor(&t.name).is_ok());
            }
            for (k, v) in g.metadata() {
                let _ = (
                    g.get_u32(k),
                    g.get_u64(k),
                    g.get_f32(k),
                    g.get_bool(k),
                    g.get_str(k),
                );
                let _ = (g.get_str_array(k), g.get_f32_array(k), g.get_i32_array(k));
                sum = sum.wrapping_add(v.to_string().len() as u64);
            }
            std::hint::black_box(sum);
        }
        Err(Error::Gguf { .. }) => {}
        Err(e) => panic!("from_bytes returned a non-GGUF error: {e:?}"),
    }
});
