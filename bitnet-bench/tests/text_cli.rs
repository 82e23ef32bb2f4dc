//! Text in and out: `tokenize` as llama-tokenize prints it, `run --prompt` streaming text, and
//! clear errors for models without a tokenizer.

use std::path::Path;
use std::process::Output;

use common::{bench, tiny_gguf};

mod common;

/// A scratch directory for one test, named after it.
fn tmp(tag: &str) -> tempfile::TempDir {
    common::tmp(&format!("bitnet-text-{tag}-"))
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn tokenize_prints_pieces_or_ids_as_llama_tokenize_does() {
    let dir = tmp("tokenize");
    let file = tiny_gguf(dir.path());
    let m = file.to_str().unwrap();
    let tok = bitnet_engine::tokenizer::load_tokenizer(&file).unwrap();
    let want = tok.encode("Hi é", true, true);
    // BOS, then ▁ (E2 96 81), H, i, ▁, é (C3 A9): byte tokens are id = byte + 3.
    assert_eq!(
        want,
        [1, 0xE2 + 3, 0x96 + 3, 0x81 + 3, b'H' as u32 + 3, b'i' as u32 + 3, 229, 153, 132, 0xC3 + 3, 0xA9 + 3]
    );
    let ids = ok(bench().args(["tokenize", "--model", m, "--prompt", "Hi é", "--ids"]).output().unwrap());
    let list: Vec<String> = want.iter().map(|i| i.to_string()).collect();
    assert_eq!(ids, format!("[{}]\n", list.join(", ")));
    let pieces = ok(bench().args(["tokenize", "--model", m, "-p", "Hi é"]).output().unwrap());
    let lines: Vec<&str> = pieces.lines().collect();
    assert_eq!(lines.len(), want.len());
    assert_eq!(lines[0], "     1 -> '<s>'");
    assert_eq!(lines[4], "    75 -> 'H'");
    assert_eq!(lines[1], "   229 -> '\\xE2'", "a byte that is not UTF-8 alone is escaped");
    // Text that looks like a special token: the token when parsed, its bytes when not.
    let text = dir.path().join("special.txt");
    std::fs::write(&text, "a<s>").unwrap();
    let parsed = ok(bench().args(["tokenize", "--model", m, "--ids", "--file"]).arg(&text).output().unwrap());
    let plain =
        ok(bench().args(["tokenize", "--model", m, "--ids", "--no-parse-special", "-f"]).arg(&text).output().unwrap());
    assert!(parsed.trim_end().ends_with(", 1]"), "{parsed}");
    assert!(!plain[1..].contains(" 1,") && plain.trim_end().ends_with(&format!(", {}]", b'>' as u32 + 3)), "{plain}");
}

/// With llama.cpp's Llama 3 test vocabulary (the 2B4T file's): the ids llama-tokenize printed
/// for the same text (llama.cpp 0c1e570). Runs where CI provides llama.cpp's vocabularies.
#[test]
fn tokenize_matches_llama_tokenize_on_llama_3s_vocabulary() {
    let Some(dir) = std::env::var_os("BITNET_LLAMA_VOCAB_DIR") else {
        assert!(
            std::env::var_os("BITNET_REQUIRE_VOCABS").is_none(),
            "BITNET_REQUIRE_VOCABS set without BITNET_LLAMA_VOCAB_DIR"
        );
        eprintln!("skipped: set BITNET_LLAMA_VOCAB_DIR to llama.cpp's models/ to run");
        return;
    };
    let file = Path::new(&dir).join("ggml-vocab-llama-bpe.gguf");
    let out = ok(bench()
        .args(["tokenize", "--ids", "--model"])
        .arg(&file)
        .args(["-p", "Hello world, I'm here"])
        .output()
        .unwrap());
    assert_eq!(out, "[128000, 9906, 1917, 11, 358, 2846, 1618]\n");
}

#[test]
fn run_prompt_streams_the_text_of_the_tokens_it_generates() {
    let dir = tmp("prompt");
    // The committed trained model (models/), so the text is the model's, not noise.
    let file = bitnet_bench::trained::model("i2_s");
    let m = file.to_str().unwrap();
    let tok = bitnet_engine::tokenizer::load_tokenizer(&file).unwrap();
    let prompt = "The borrow checker";
    let ids = tok.encode(prompt, true, true);
    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let by_ids =
        ok(bench().args(["run", "--model", m, "--n-predict", "24", "--tokens", &list.join(",")]).output().unwrap());
    let generated: Vec<u32> = by_ids.trim().split(',').map(|t| t.parse().unwrap()).collect();
    let by_text = ok(bench().args(["run", "--model", m, "--n-predict", "24", "--prompt", prompt]).output().unwrap());
    // The prompt, then the text of the same greedy tokens (up to an end-of-generation token).
    let stop = generated.iter().position(|t| tok.is_eog(*t)).map_or(generated.len(), |p| p + 1);
    let mut stream = bitnet_engine::tokenizer::StreamDecoder::new(&tok);
    let mut want = String::from(prompt);
    for t in &generated[..stop] {
        want.push_str(&stream.push(*t));
    }
    want.push_str(&stream.finish());
    assert_eq!(by_text, want.clone() + "\n");
    // English words, as the model learned them: letters, spaces and punctuation, words of a
    // usual length (random weights give bytes and fragments).
    let new = &want[prompt.len()..];
    let words: Vec<&str> = new.split_whitespace().collect();
    assert!(words.len() >= 8, "{new:?}");
    let letters = new.chars().filter(|c| c.is_ascii_alphabetic() || *c == ' ').count();
    assert!(letters as f64 >= 0.85 * new.chars().count() as f64, "{new:?}");
    let prompt_file = dir.path().join("prompt.txt");
    std::fs::write(&prompt_file, prompt).unwrap();
    let from_file = ok(bench()
        .args(["run", "--model", m, "--n-predict", "24", "--prompt-file"])
        .arg(&prompt_file)
        .output()
        .unwrap());
    assert_eq!(from_file, by_text);
}

#[test]
fn text_commands_without_a_tokenizer_or_text_exit_2_naming_what_is_missing() {
    let dir = tmp("errors");
    let file = tiny_gguf(dir.path());
    // The same model with its tokenizer keys removed.
    let bytes = std::fs::read(&file).unwrap();
    let f = bitnet_engine::gguf::GgufFile::parse(&bytes).unwrap();
    let meta: Vec<_> = f.metadata.iter().filter(|(k, _)| !k.starts_with("tokenizer.")).cloned().collect();
    let tensors: Vec<_> = f
        .tensors
        .iter()
        .map(|t| bitnet_engine::gguf::writer::RawTensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ggml_type,
            data: f.data(t).to_vec(),
        })
        .collect();
    let bare = dir.path().join("bare.gguf");
    bitnet_engine::gguf::writer::write_raw(&bare, &meta, &tensors).unwrap();
    let not_utf8 = dir.path().join("latin1.txt");
    std::fs::write(&not_utf8, b"caf\xe9").unwrap();
    let b = bare.to_str().unwrap();
    let m = file.to_str().unwrap();
    let n = not_utf8.to_str().unwrap();
    for (args, needle) in [
        (vec!["tokenize", "--model", b, "-p", "x"], "tokenizer.ggml.model"),
        (vec!["run", "--model", b, "--prompt", "x"], "tokenizer.ggml.model"),
        (vec!["run", "--model", "tiny", "--prompt", "x"], "no tokenizer"),
        (vec!["tokenize", "--model", m, "-f", "/nonexistent/t.txt"], "/nonexistent/t.txt"),
        (vec!["tokenize", "--model", m, "-f", n], "not UTF-8"),
        (vec!["run", "--model", m, "--prompt-file", n], "--prompt-file"),
        (vec!["tokenize", "--model", m], "--prompt"),
        (vec!["run", "--model", m, "--prompt", "x", "--tokens", "1"], "--tokens"),
    ] {
        let out = bench().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// A quiet one-thread `--quick` sweep with `args`, and the report it wrote to `report`.
fn quick_sweep(args: &[&str], report: &str) -> serde_json::Value {
    ok(bench().args(["--quick", "--quiet", "--threads", "1", "--json-report", report]).args(args).output().unwrap());
    serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap()
}

/// `--quality-text`: each KV precision's quality on real text with the model's tokenizer,
/// marked `text` and naming the file; a preset (random weights, no tokenizer) is refused.
#[test]
fn sweep_quality_text_measures_on_the_text_and_says_so() {
    let dir = tmp("quality-text");
    let file = tiny_gguf(dir.path());
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog. ".repeat(4)).unwrap();
    let report = dir.path().join("r.json");
    let (file_s, text_s, report_s) = (file.to_str().unwrap(), text.to_str().unwrap(), report.to_str().unwrap());
    let r = quick_sweep(&["--kv-precisions", "f16", "int4", "--model", file_s, "--quality-text", text_s], report_s);
    for x in r["results"].as_array().unwrap() {
        let q = &x["quality"];
        assert_eq!(q["source"], "text", "{q}");
        assert!(q["text"].as_str().unwrap().starts_with("text.txt ("), "{q}");
        let (p32, p) = (q["perplexity_f32"].as_f64().unwrap(), q["perplexity"].as_f64().unwrap());
        assert!(p32 > 1.0 && p > 1.0, "{q}");
        if x["config"]["kv_precision"] == "int4" {
            assert!(q["kl_divergence"].as_f64().unwrap() > 0.0, "{q}");
        }
    }
    let out = bench().args(["--quick", "--model", "tiny", "--quality-text"]).arg(&text).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--quality-text"));
    let out = bench().args(["--quick", "--model", "tiny", "--quality-model"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --quality-text"));
    // --quality-model measures on another model than the swept one, and the report names it.
    let args = ["--kv-precisions", "f16", "--model", "tiny", "--quality-model", file_s, "--quality-text", text_s];
    let r = quick_sweep(&args, report_s);
    let q = &r["results"][0]["quality"];
    assert_eq!((q["source"].as_str(), q["model"].as_str()), (Some("text"), Some("tiny.gguf")), "{q}");
}

/// A preset's sweep measures quality on the committed trained model and its held-out text (a
/// preset's random weights estimate no model's quality) and says so above the table.
#[test]
fn a_presets_sweep_measures_quality_on_the_trained_model() {
    let dir = tmp("default-quality");
    let report = dir.path().join("r.json");
    let out = bench()
        .args(["--quick", "--threads", "1", "--kv-precisions", "f16", "int4", "--model", "tiny", "--json-report"])
        .arg(&report)
        .output()
        .unwrap();
    let table = ok(out);
    assert!(
        table.contains("KV quality on rustdocs-heldout.txt (") && table.contains("model rustdocs-bitnet-i2_s.gguf"),
        "{table}"
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    for x in r["results"].as_array().unwrap() {
        let q = &x["quality"];
        assert_eq!(q["source"], "text", "{q}");
        assert_eq!(q["model"], "rustdocs-bitnet-i2_s.gguf", "{q}");
        assert!(q["text"].as_str().unwrap().starts_with("rustdocs-heldout.txt ("), "{q}");
        // f16 KV changes the trained model's predictions very little; int4 changes them more.
        let kl = q["kl_divergence"].as_f64().unwrap();
        match x["config"]["kv_precision"].as_str().unwrap() {
            "f16" => assert!(kl < 1e-3, "{q}"),
            _ => assert!(kl > 1e-4, "{q}"),
        }
    }
}
