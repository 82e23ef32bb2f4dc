//! Any bytes: parsing and loading a GGUF file must return, never panic or read out of bounds.
//! `cargo +nightly fuzz run gguf_load fuzz/corpus/gguf_load` (see fuzz/README.md).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = bitnet_engine::gguf::GgufFile::parse(data) {
        let _ = bitnet_engine::gguf::load::model_from_gguf(&f, "fuzz");
    }
});
