//! Our token ids against llama.cpp's, on its own vocabularies.
//!
//! - llama.cpp's test vectors (`models/ggml-vocab-*.gguf.inp/.out`, made by its
//!   `test-tokenizer-0`: add_special = false, parse_special = false).
//! - Our extra cases (`tests/data/tokenizer/extra-*.json`), whose ids `llama-tokenize` gave on the
//!   same files (see the README there), including the llama-bpe vocabulary without
//!   `tokenizer.ggml.pre` (the official BitNet 2B4T file has none), rebuilt here by dropping the key.
//!
//! The vocabularies come from `BITNET_LLAMA_VOCAB_DIR` (llama.cpp's `models/`); without it the tests
//! are skipped, unless `BITNET_REQUIRE_VOCABS=1`, which makes a missing directory or file a failure.

use std::path::{Path, PathBuf};

use bitnet_engine::gguf::GgufFile;
use bitnet_engine::Tokenizer;

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn required() -> bool {
    std::env::var("BITNET_REQUIRE_VOCABS").is_ok_and(|v| v == "1")
}

/// The vocabulary file `ggml-vocab-<name>.gguf`, or `None` (test skipped) when not configured.
fn vocab_path(name: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("BITNET_LLAMA_VOCAB_DIR") else {
        assert!(!required(), "BITNET_REQUIRE_VOCABS=1 but BITNET_LLAMA_VOCAB_DIR is not set");
        println!("skipped: set BITNET_LLAMA_VOCAB_DIR to llama.cpp's models/ directory to compare with its tokenizer");
        return None;
    };
    let path = Path::new(&dir).join(format!("ggml-vocab-{name}.gguf"));
    if !path.is_file() {
        assert!(!required(), "BITNET_REQUIRE_VOCABS=1 but {} does not exist", path.display());
        println!("skipped: {} does not exist", path.display());
        return None;
    }
    Some(path)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A tokenizer from the file, optionally without some metadata keys.
fn tokenizer(bytes: &[u8], drop_keys: &[&str]) -> Tokenizer {
    let mut f = GgufFile::parse(bytes).expect("vocabulary parses");
    f.metadata.retain(|(k, _)| !drop_keys.contains(&k.as_str()));
    Tokenizer::from_gguf(&f).expect("tokenizer builds")
}

/// llama.cpp's vector files: inputs separated by `\n__ggml_vocab_test__\n` (the file ends with
/// one), one line of space-separated ids per input.
fn vectors(path: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = String::from_utf8(read(&path.with_extension("gguf.inp"))).expect("UTF-8 inputs");
    let out = String::from_utf8(read(&path.with_extension("gguf.out"))).expect("UTF-8 outputs");
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEPARATOR) {
            Some(at) => {
                inputs.push(rest[..at].to_owned());
                rest = &rest[at + SEPARATOR.len()..];
            }
            None => {
                inputs.push(rest.to_owned());
                rest = "";
            }
        }
    }
    let outputs: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().expect("an id")).collect()).collect();
    assert_eq!(inputs.len(), outputs.len(), "{}: inputs and outputs differ in number", path.display());
    assert!(inputs.len() > 10, "{}: too few cases", path.display());
    inputs.into_iter().zip(outputs).collect()
}

struct Case {
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
}

fn extra_cases(file: &str) -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer").join(file);
    let json: serde_json::Value = serde_json::from_slice(&read(&path)).expect("JSON");
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_owned(),
            add_special: c["add_special"].as_bool().expect("add_special"),
            parse_special: c["parse_special"].as_bool().expect("parse_special"),
            ids: c["ids"].as_array().expect("ids").iter().map(|i| i.as_u64().expect("id") as u32).collect(),
        })
        .collect()
}

/// Compares every case, prints each mismatch, and fails with the count.
fn check(what: &str, tok: &Tokenizer, cases: &[Case]) {
    let mut failed = 0;
    for c in cases {
        let ours = tok.encode(&c.text, c.add_special, c.parse_special);
        if ours != c.ids {
            failed += 1;
            println!(
                "{what}: MISMATCH for {:?} (add_special {}, parse_special {})\n  llama.cpp: {:?}\n  ours:      {:?}",
                c.text, c.add_special, c.parse_special, c.ids, ours
            );
        }
    }
    println!("{what}: {}/{} cases equal llama.cpp's", cases.len() - failed, cases.len());
    assert_eq!(failed, 0, "{what}: {failed} of {} cases differ from llama.cpp", cases.len());
}

fn check_vectors(name: &str) {
    let Some(path) = vocab_path(name) else { return };
    let bytes = read(&path);
    let tok = tokenizer(&bytes, &[]);
    let cases: Vec<Case> = vectors(&path)
        .into_iter()
        .map(|(text, ids)| Case { text, add_special: false, parse_special: false, ids })
        .collect();
    check(&format!("{name} vectors"), &tok, &cases);
}

fn check_extra(name: &str, file: &str, drop_keys: &[&str]) {
    let Some(path) = vocab_path(name) else { return };
    let bytes = read(&path);
    let tok = tokenizer(&bytes, drop_keys);
    check(file, &tok, &extra_cases(file));
}

#[test]
fn llama_bpe_vectors() {
    check_vectors("llama-bpe");
}

#[test]
fn llama_spm_vectors() {
    check_vectors("llama-spm");
}

#[test]
fn gpt2_vectors() {
    check_vectors("gpt-2");
}

#[test]
fn llama_bpe_extra() {
    check_extra("llama-bpe", "extra-llama-bpe.json", &[]);
}

#[test]
fn llama_spm_extra() {
    check_extra("llama-spm", "extra-llama-spm.json", &[]);
}

#[test]
fn gpt2_extra() {
    check_extra("gpt-2", "extra-gpt-2.json", &[]);
}

/// Llama 3's vocabulary without `tokenizer.ggml.pre`, as in the official BitNet 2B4T file:
/// llama.cpp's "default" pre-tokenizer, and no BOS unless the file asks for one.
#[test]
fn llama_bpe_without_pre_extra() {
    let Some(path) = vocab_path("llama-bpe") else { return };
    let bytes = read(&path);
    let tok = tokenizer(&bytes, &["tokenizer.ggml.pre"]);
    assert_eq!(tok.pre(), "default");
    assert!(!tok.add_bos());
    check("extra-llama-bpe-nopre.json", &tok, &extra_cases("extra-llama-bpe-nopre.json"));
}

/// Perplexity tokenizes whole files: a megabyte with long runs that have no break (where a
/// quadratic merge loop would take minutes) encodes and decodes back to itself.
#[test]
fn a_megabyte_with_long_unbroken_runs_round_trips() {
    for name in ["llama-bpe", "llama-spm"] {
        let Some(path) = vocab_path(name) else { return };
        let bytes = read(&path);
        let tok = tokenizer(&bytes, &[]);
        let sample: String = vectors(&path).into_iter().map(|(t, _)| t).collect::<Vec<_>>().join("\n");
        let mut text = sample.repeat((1 << 20) / sample.len() + 1);
        text.push_str(&"a".repeat(50_000));
        text.push_str(&"🦙".repeat(10_000));
        text.push_str(&" ".repeat(50_000));
        let start = std::time::Instant::now();
        let ids = tok.encode(&text, false, false);
        let secs = start.elapsed().as_secs_f64();
        println!("{name}: {} bytes -> {} tokens in {secs:.2} s", text.len(), ids.len());
        // Timed for the log only (no wall-clock threshold in tests: these machines swing 2×).
        assert!(tok.decode(&ids) == text, "{name}: the megabyte does not decode back to itself");
    }
}
