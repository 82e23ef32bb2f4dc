//! `bitnet-bench perplexity` end to end on a tiny saved model (a byte-token SPM vocabulary):
//! chunk and token counts, the PPL recomputed from `run --logits-out`, the JSON against its
//! committed schema, KL against a base, and the errors (exit 2, flag named, no file left).

use std::path::Path;
use std::process::{Command, Output};

use bitnet_report::perplexity;
use common::{bench, tiny_gguf};

mod common;

/// A test's own scratch directory.
fn tmp() -> tempfile::TempDir {
    common::tmp("bitnet-ppl-cli-")
}

/// The tiny preset saved as GGUF in `dir` (see `common::tiny_gguf`), as a path string.
fn model(dir: &Path) -> String {
    tiny_gguf(dir).to_string_lossy().into_owned()
}

fn text(dir: &Path, name: &str, sentences: usize) -> String {
    let words = ["kernel", "cache", "token", "vector", "ternary", "weight", "matrix", "thread", "perplexity"];
    let mut s = String::new();
    for i in 0..sentences {
        s.push_str(&format!("The {} reads the {} {} times. ", words[i % 9], words[(i * 5 + 2) % 9], i % 7 + 1));
    }
    let p = dir.join(name);
    std::fs::write(&p, s).unwrap();
    p.to_string_lossy().into_owned()
}

fn ppl(model: &str, args: &[&str]) -> Output {
    bench().arg("perplexity").args(["--model", model, "--threads", "1"]).args(args).output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn committed_schema_is_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../reports/perplexity.schema.json");
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(path, perplexity::schema_json()).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == perplexity::schema_json(),
        "reports/perplexity.schema.json is stale: BLESS=1 cargo test -p bitnet-bench --test perplexity_cli committed_schema"
    );
}

#[test]
fn scores_the_second_half_of_each_chunk_and_agrees_with_run_logits() {
    let scratch = tmp();
    let dir = scratch.path();
    let m = model(dir);
    let t = text(dir, "a.txt", 30);
    let j = dir.join("a.json");
    let stdout =
        ok(&ppl(&m, &["--text", &t, "--ctx", "32", "--chunks", "4", "--batch", "32", "--json", j.to_str().unwrap()]));
    let lines: Vec<&str> = stdout.lines().collect();
    for i in 1..=4 {
        assert!(lines[i - 1].starts_with(&format!("[{i}/4] PPL ")), "{stdout}");
    }
    assert!(lines[4].starts_with("Final estimate: PPL = ") && lines[4].contains(" +/- "), "{stdout}");
    assert!(lines[5].starts_with("60 tokens scored (4 of "), "{stdout}");
    let v = json(&j);
    perplexity::validate_schema(&v, "result.json").unwrap();
    let r: perplexity::PerplexityResult = serde_json::from_value(v).unwrap();
    assert_eq!((r.chunks, r.ctx, r.tokens_scored, r.tokens_evaluated, r.complete), (4, 32, 60, 128, true));
    assert_eq!((r.add_bos, r.bos, r.running.len()), (true, Some(1), 4));
    let bytes = std::fs::read(&t).unwrap();
    assert_eq!((r.text.bytes, r.text.file.as_str()), (bytes.len() as u64, "a.txt"));
    assert_eq!(r.text.sha256.len(), 64);
    assert!(r.chunks_available >= 4 && r.text.tokens >= 2 * 32);
    let p = r.perplexity.unwrap();
    assert!(p.is_finite() && p > 1.0 && (p - r.nll_mean.unwrap().exp()).abs() < 1e-9 * p);
    assert!(stdout.contains(&format!("PPL = {p:.4} +/- {:.5}", r.standard_error.unwrap())), "{stdout}");
    assert_eq!(r.running[3].perplexity, p);

    // Chunk 2 by hand: its tokens (BOS first) through `run --logits-out`, NLL of the second half.
    let map = std::fs::read(&m).unwrap();
    let f = bitnet_engine::gguf::GgufFile::parse(&map).unwrap();
    let tok = bitnet_engine::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let ids = tok.encode(std::str::from_utf8(&bytes).unwrap(), true, false);
    assert_eq!(ids.len(), r.text.tokens);
    let mut chunk = ids[32..64].to_vec();
    chunk[0] = 1;
    let logits_file = dir.join("logits.json");
    let list = chunk.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",");
    let out = bench()
        .args(["run", "--model", &m, "--threads", "1", "--n-predict", "1", "--tokens", &list, "--logits-out"])
        .arg(&logits_file)
        .output()
        .unwrap();
    ok(&out);
    let rows = json(&logits_file)["logits"].as_array().unwrap().clone();
    let mut nll = 0.0;
    for pos in 16..31 {
        let row: Vec<f64> = rows[pos].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let z: f64 = row.iter().map(|x| x.exp()).sum();
        nll -= (row[ids[32 + pos + 1] as usize].exp() / z).ln();
    }
    let want = nll / 15.0;
    assert!((r.running[1].chunk_nll_mean - want).abs() < 1e-6, "{} vs {want}", r.running[1].chunk_nll_mean);
}

#[test]
fn kl_is_zero_against_its_own_base_and_positive_against_int2_kv_or_silu() {
    let scratch = tmp();
    let dir = scratch.path();
    let m = model(dir);
    let t = text(dir, "kl.txt", 30);
    let base = dir.join("relu2.kl");
    let common = ["--text", &t, "--ctx", "32", "--chunks", "3"];
    ok(&ppl(&m, &[&common[..], &["--kl-base", base.to_str().unwrap()]].concat()));
    let kl = |extra: &[&str]| {
        let j = dir.join(format!("kl-{}.json", extra.join("_")));
        let stdout = ok(&ppl(
            &m,
            &[&common[..], &["--kl-ref", base.to_str().unwrap(), "--json", j.to_str().unwrap()], extra].concat(),
        ));
        assert!(stdout.contains("Mean    KLD") && stdout.contains("Same top p"), "{stdout}");
        let v = json(&j);
        perplexity::validate_schema(&v, "result.json").unwrap();
        serde_json::from_value::<perplexity::KlReport>(v["kl"].clone()).unwrap()
    };
    let same = kl(&[]);
    assert_eq!(same.kl_support, "full");
    assert_eq!(same.positions, 3 * 15);
    assert!(same.kl_mean.abs() <= 1e-12 && same.kl_max.abs() <= 1e-12, "{same:?}");
    assert_eq!((same.same_top, same.delta_p_rms, same.ln_ppl_ratio), (1.0, 0.0, 0.0));
    for extra in [&["--kv", "int2"][..], &["--ffn-activation", "silu"][..]] {
        let k = kl(extra);
        assert!(k.kl_mean > 0.0 && k.kl_p99 >= k.kl_median && k.same_top < 1.0, "{extra:?}: {k:?}");
        assert!(k.delta_p_rms > 0.0 && k.kl_standard_error > 0.0, "{extra:?}: {k:?}");
    }
    // A base made from another text, or with another ctx, is refused before any work.
    // (The same sentences after another first word: equal lengths, other tokens.)
    let other = dir.join("other.txt").to_string_lossy().into_owned();
    std::fs::write(&other, std::fs::read_to_string(&t).unwrap().replacen("The", "A b", 1)).unwrap();
    let j = dir.join("refused.json");
    let out = ppl(
        &m,
        &["--text", &other, "--ctx", "32", "--chunks", "3", "--kl-ref", base.to_str().unwrap(), "--json"]
            .iter()
            .copied()
            .chain([j.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tokens differ"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = ppl(&m, &["--text", &t, "--ctx", "30", "--chunks", "3", "--kl-ref", base.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ctx is 32 in the base, --ctx 30"));
    assert!(!j.exists());
}

#[test]
fn bad_inputs_exit_2_naming_the_flag_and_leave_no_file() {
    let scratch = tmp();
    let dir = scratch.path();
    let m = model(dir);
    let t = text(dir, "short.txt", 30);
    let tiny_text = dir.join("tiny.txt");
    std::fs::write(&tiny_text, "just a few words").unwrap();
    // The saved model with its tokenizer key renamed (same length, so offsets stay valid).
    let mut bytes = std::fs::read(&m).unwrap();
    let at = bytes.windows(20).position(|w| w == b"tokenizer.ggml.model").unwrap();
    bytes[at..at + 20].copy_from_slice(b"tokenizer.ggml.mode_");
    let no_tok = dir.join("no-tokenizer.gguf");
    std::fs::write(&no_tok, bytes).unwrap();
    let j = dir.join("never.json");
    let kb = dir.join("never.kl");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--model", no_tok.to_str().unwrap(), "--text", &t], "tokenizer.ggml.model"),
        (vec!["--model", "tiny", "--text", &t], "a preset has no tokenizer"),
        (vec!["--text", tiny_text.to_str().unwrap(), "--ctx", "32"], "tokens; --ctx 32 needs at least 64"),
        (vec!["--text", "/nonexistent/t.txt"], "--text /nonexistent/t.txt: cannot read"),
        (vec!["--text", &t, "--ctx", "100000"], "--ctx 100000: the model's context length is"),
        (vec!["--text", &t, "--ctx", "2"], "--ctx 2: at least 3"),
        (vec!["--text", &t, "--ctx", "32", "--batch", "64"], "--batch 64"),
        (vec!["--text", &t, "--kl-ref", "/nonexistent/b.kl", "--ctx", "32"], "--kl-ref /nonexistent/b.kl"),
        (vec!["--text", &t, "--ctx", "32", "--kl-ref", &t], "not a KL base"),
    ];
    for (args, want) in cases {
        let mut cmd = bench();
        cmd.args(["perplexity", "--threads", "1"]);
        if !args.contains(&"--model") {
            cmd.args(["--model", &m]);
        }
        let out = cmd.args(&args).args(["--json", j.to_str().unwrap()]).output().unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains("bitnet-bench: error: ") && e.contains(want), "{args:?}: {e}");
        assert!(!j.exists(), "{args:?} left {}", j.display());
    }
    // A failing run with --kl-base leaves neither the base nor its temporary file.
    let out = ppl(&m, &["--text", tiny_text.to_str().unwrap(), "--ctx", "32", "--kl-base", kb.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("never"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn ctrl_c_reports_the_chunks_scored_so_far_and_marks_the_json_incomplete() {
    use std::io::{BufRead, BufReader};
    let scratch = tmp();
    let dir = scratch.path();
    let m = model(dir);
    let t = text(dir, "long.txt", 400);
    let j = dir.join("interrupted.json");
    let mut child = bench()
        .args(["perplexity", "--model", &m, "--threads", "1", "--text", &t, "--ctx", "64", "--json"])
        .arg(&j)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("[1/"), "{first}");
    let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("Final estimate: PPL = ")), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("INTERRUPTED, partial")), "{rest:?}");
    let v = json(&j);
    perplexity::validate_schema(&v, "result.json").unwrap();
    let r: perplexity::PerplexityResult = serde_json::from_value(v).unwrap();
    assert!(!r.complete && r.chunks >= 1 && r.chunks < r.chunks_available, "{} of {}", r.chunks, r.chunks_available);
    assert_eq!(r.tokens_scored, r.chunks * 31);
    assert_eq!(r.running.len(), r.chunks);
}

/// On the committed trained model (models/), over its whole held-out text: the perplexity and
/// its standard error are those the training framework's own forward pass gives with the same
/// method (`models/rustdocs-bitnet.reference.json`, from JAX), in each of the three layouts,
/// and far below a unigram model's on the same tokens.
#[test]
fn the_trained_models_perplexity_is_the_jax_forwards() {
    let scratch = tmp();
    let dir = scratch.path();
    let models = bitnet_bench::trained::dir();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(models.join("rustdocs-bitnet.reference.json")).unwrap()).unwrap();
    let want = &r["perplexity"];
    let (ppl, se, unigram) =
        (want["ppl"].as_f64().unwrap(), want["ppl_se"].as_f64().unwrap(), want["unigram_ppl"].as_f64().unwrap());
    assert!(ppl < unigram / 5.0, "JAX {ppl}, unigram {unigram}: the committed model learned little");
    for layout in ["tq2_0", "tq1_0", "i2_s"] {
        let json = dir.join(format!("trained-{layout}.json"));
        let out = bench()
            .args(["perplexity", "--ctx", "256", "--kv", "f32", "--threads", "2", "--model"])
            .arg(bitnet_bench::trained::model(layout))
            .arg("--text")
            .arg(bitnet_bench::trained::heldout_text())
            .arg("--json")
            .arg(&json)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let got: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(got["chunks"], want["chunks"], "{layout}");
        assert_eq!(got["tokens_scored"], want["scored"], "{layout}");
        let (p, e) = (got["perplexity"].as_f64().unwrap(), got["standard_error"].as_f64().unwrap());
        // Per-token log-probabilities differ by int8 rounding flips only (see bitnet-engine's
        // tests/trained_model.rs); over 8890 tokens that is well under 0.1%.
        assert!((p / ppl - 1.0).abs() < 1e-3, "{layout}: PPL {p}, JAX {ppl}");
        assert!((e / se - 1.0).abs() < 1e-2, "{layout}: SE {e}, JAX {se}");
    }
}
