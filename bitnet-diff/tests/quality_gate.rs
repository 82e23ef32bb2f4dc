//! The quality gate end to end on the committed trained model (`models/`): the same model run
//! with the wrong FFN activation is a regression (exit 1) against the right one, even though it
//! is exactly as fast.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;

use bitnet_bench::perplexity::{
    base_top_k, fed_tokens_hash, perplexity, Kl, KlBaseReader, KlBaseWriter, KlHeader, PerplexityOptions,
};
use bitnet_engine::model::FfnActivation;
use bitnet_engine::{KvPrecision, Model};
use bitnet_report::perplexity::PerplexityResult;

const CTX: usize = 128;
/// The trained model's BOS (`<|begin_of_text|>`, id 0).
const BOS: u32 = 0;

fn opts() -> PerplexityOptions {
    PerplexityOptions {
        ctx: CTX,
        chunks: Some(3),
        batch: 16,
        threads: 2,
        kv: KvPrecision::F32,
        kernel: None,
        kl_top_k: 32,
    }
}

/// One run of `model` on `tokens`, compared with the base file (or writing it).
fn run(model: &Model, tokens: &[u32], base: &Path, write_base: bool) -> PerplexityResult {
    let stop = AtomicBool::new(false);
    let o = opts();
    let mut r = if write_base {
        let header = KlHeader {
            vocab: model.config.vocab,
            ctx: CTX,
            chunks: 3,
            top_k: base_top_k(model.config.vocab, o.kl_top_k),
            tokens_hash: fed_tokens_hash(tokens, CTX, 3, true, Some(BOS)),
        };
        let mut w = KlBaseWriter::create(base, header).unwrap();
        let r = perplexity(model, tokens, true, Some(BOS), &o, Kl::Base(&mut w), &stop, &mut |_| {}).unwrap();
        w.finish(r.chunks).unwrap();
        r
    } else {
        let mut rd = KlBaseReader::open(base).unwrap();
        perplexity(model, tokens, true, Some(BOS), &o, Kl::Ref(&mut rd, "base.kl".into()), &stop, &mut |_| {}).unwrap()
    };
    r.text.file = "rustdocs-heldout.txt".into();
    r.text.sha256 = "0".repeat(64);
    r
}

fn diff(a: &Path, b: &Path) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_bitnet-diff")).arg(a).arg(b).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
    )
}

#[test]
fn the_wrong_ffn_activation_is_a_regression_against_the_right_one() {
    let dir = tempfile::Builder::new().prefix("bitnet-diff-gate-").tempdir().unwrap();
    // The trained model is ReLU²-gated (as 2B4T); the same weights run with SiLU are the wrong
    // model (what llama.cpp's `bitnet` graph would compute).
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
    let file = models.join("rustdocs-bitnet-tq2_0.gguf");
    let right = bitnet_engine::gguf::load_model(&file).unwrap();
    assert_eq!(right.config.activation, FfnActivation::ReluSquared);
    let mut wrong = right.clone();
    wrong.config.override_activation(FfnActivation::Silu);
    let tok = bitnet_engine::tokenizer::load_tokenizer(&file).unwrap();
    assert_eq!(tok.bos(), Some(BOS));
    let text = std::fs::read_to_string(models.join("rustdocs-heldout.txt")).unwrap();
    let tokens = tok.encode(&text, true, false);
    let base = dir.path().join("base.kl");
    run(&right, &tokens, &base, true);
    let write = |name: &str, r: &PerplexityResult| {
        let p = dir.path().join(name);
        std::fs::write(&p, serde_json::to_string_pretty(r).unwrap()).unwrap();
        p
    };
    let good = run(&right, &tokens, &base, false);
    let bad = run(&wrong, &tokens, &base, false);
    assert_eq!(good.kl.as_ref().unwrap().kl_mean, 0.0, "the right model against its own base");
    assert!(bad.kl.as_ref().unwrap().kl_mean > 0.0);
    let (good_p, bad_p) = (write("right.json", &good), write("wrong.json", &bad));
    let (code, out) = diff(&good_p, &bad_p);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("kl_mean") && out.contains("regression") && out.contains("relu2") && out.contains("silu"),
        "{out}"
    );
    // On trained weights the perplexity tells right from wrong too.
    let (p_good, p_bad) = (good.perplexity.unwrap(), bad.perplexity.unwrap());
    assert!(p_bad > 1.5 * p_good, "perplexity {p_good} right, {p_bad} with SiLU");
    let ppl_line = out.lines().find(|l| l.starts_with("| perplexity")).unwrap();
    assert!(ppl_line.ends_with("| regression |"), "{out}");
    // The right model against itself passes; the other way round, everything improves.
    assert_eq!(diff(&good_p, &good_p).0, 0);
    let (code, out) = diff(&bad_p, &good_p);
    assert_eq!(code, 0, "{out}");
    for metric in ["| kl_mean", "| perplexity"] {
        let line = out.lines().find(|l| l.starts_with(metric)).unwrap();
        assert!(line.ends_with("| improvement |"), "{out}");
    }
    // Another text (or ctx) is refused: their perplexities are of different things.
    let mut other = good.clone();
    other.text.sha256 = "1".repeat(64);
    let other_p = write("other.json", &other);
    let (code, out) = diff(&good_p, &other_p);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("different text"), "{out}");
}
