//! The binary's face: a quick kernel sweep prints a table; bad flags exit 2 naming the flag.

use common::bench;

mod common;

#[test]
fn quick_kernel_sweep_prints_a_table_with_the_probe_and_ratios() {
    // Lists take spaces as the sweep's do (CI's smoke run uses commas).
    let out = bench().args(["kernels", "--quick", "--kernels", "i2s", "--batch", "1", "3"]).output().unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("memory read bandwidth (probe, 64 MiB"), "{stdout}");
    // One row per i2s kernel this CPU has × 2 shapes × 2 batch sizes, plus the oracle rows.
    let i2s_rows = stdout.lines().filter(|l| l.starts_with("| i2s/")).count();
    let expected = bitnet_engine::Kernel::all_supported()
        .iter()
        .filter(|k| k.family() == bitnet_engine::KernelFamily::I2s)
        .count()
        * 2
        * 2;
    assert_eq!(i2s_rows, expected, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("| scalar/")).count(), 4, "{stdout}");
    // Every i2s row is faster than the oracle (a ratio > 1 in the last column).
    for line in stdout.lines().filter(|l| l.starts_with("| i2s/")) {
        let speedup: f64 = line.trim_end_matches('|').rsplit('|').next().unwrap().trim().parse().unwrap();
        assert!(speedup > 1.0, "{line}");
    }
}

#[test]
fn kernel_sweep_runs_the_lm_head_against_its_scalar_loop() {
    let args = ["kernels", "--quick", "--kernels", "i2s", "--isa", "avx2", "--batch", "1", "--head"];
    let out = bench().args(args).output().unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let cells = |l: &str| -> Vec<String> { l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect() };
    let header = cells(stdout.lines().find(|l| l.starts_with("| kernel")).expect("a table header"));
    let col = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no {name} column"));
    let (oracle, of_peak) = (col("× oracle"), col("% of peak"));
    let head: Vec<Vec<String>> = stdout.lines().filter(|l| l.starts_with("| q6k_head/")).map(cells).collect();
    // 2B4T's head is 128256 × 2560; --quick runs 2048 rows in cache, no streaming case.
    let avx2 = bitnet_engine::IsaLevel::Avx2.testable();
    assert_eq!(head.len(), if avx2 { 2 } else { 1 }, "{stdout}");
    assert_eq!(&head[0][..3], &["q6k_head/scalar", "q6_k", "head 2048x2560"], "{stdout}");
    assert_eq!(head[0][oracle], "1.0", "the scalar loop is its own oracle: {stdout}");
    assert_eq!(head[0][of_peak], "-", "scalar has no int8 peak: {stdout}");
    if avx2 {
        assert_eq!(&head[1][..3], &["q6k_head/avx2", "q6_k", "head 2048x2560"], "{stdout}");
        let speedup: f64 = head[1][oracle].parse().unwrap();
        assert!(speedup > 1.0, "{stdout}");
        // Against the AVX2 peak, which the header line gives.
        let pct: f64 = head[1][of_peak].trim_end_matches('%').parse().unwrap();
        assert!(pct > 0.0, "{stdout}");
        assert!(stdout.contains("int8 multiply-add peak") && stdout.contains("avx2 "), "{stdout}");
    }
    // Without --head, naming --kernels leaves the head out.
    let out =
        bench().args(["kernels", "--quick", "--kernels", "i2s", "--isa", "scalar", "--batch", "1"]).output().unwrap();
    assert!(!String::from_utf8(out.stdout).unwrap().contains("q6k_head"));
}

#[test]
fn kernel_sweep_runs_another_presets_shapes() {
    let args =
        ["kernels", "--quick", "--kernels", "i2s", "--isa", "scalar", "--batch", "1", "--shapes", "bitnet-b1.58-large"];
    let out = bench().args(args).output().unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    // --quick keeps the first two shapes: the large model's K/V are as wide as its Q.
    let shapes: Vec<&str> =
        stdout.lines().filter(|l| l.starts_with("| scalar/")).map(|l| l.split('|').nth(3).unwrap().trim()).collect();
    assert_eq!(shapes, ["q/k/v/o 1536x1536", "gate/up 4096x1536"], "{stdout}");
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    for (args, needle) in [
        (vec!["kernels", "--kernels", "bogus"], "bogus"),
        (vec!["kernels", "--isa", "sse9"], "sse9"),
        (vec!["kernels", "--batch", "0", "--quick"], "--batch"),
        (vec!["kernels", "--shapes", "nope", "--quick"], "--shapes nope"),
        (vec!["frobnicate"], "frobnicate"),
    ] {
        let out = bench().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    }
}

#[test]
fn inspect_lists_every_tensor_with_exact_bytes() {
    let out = bench().args(["inspect", "bitnet-b1.58-2b-4t", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tensors = v["tensors"].as_array().unwrap();
    // Embedding, 30 layers × 11 tensors, output norm (tied LM head).
    assert_eq!(tensors.len(), 1 + 30 * 11 + 1);
    let q = tensors.iter().find(|t| t["name"] == "blk.0.attn_q.weight").unwrap();
    assert_eq!(q["shape"], serde_json::json!([2560, 2560]));
    assert_eq!(q["bytes"], 2560 * 640 + 4);
    let total: u64 = tensors.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(v["total_weight_bytes"], total);
    assert_eq!(v["linear_bits_per_weight"], 2.0 + 30.0 * 7.0 * 32.0 / 2_084_044_800.0);
    let table = bench().args(["inspect", "tiny"]).output().unwrap();
    assert!(String::from_utf8(table.stdout).unwrap().contains("blk.1.ffn_down.weight"));
}

#[test]
fn pipes_prints_each_mix_against_vpdpbusd_alone_and_refuses_zero_passes() {
    let out = bench().args(["pipes", "--passes", "1"]).output().unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    if bitnet_engine::IsaLevel::Avx512.testable() {
        let alone = stdout.lines().find(|l| l.starts_with("| vpdpbusd ")).unwrap_or_else(|| panic!("{stdout}"));
        assert!(alone.ends_with(" 1.00 |"), "{stdout}");
        assert!(stdout.lines().any(|l| l.starts_with("| vpdpbusd + vpaddd ")), "{stdout}");
    } else {
        assert!(stdout.contains("no AVX-512 VNNI"), "{stdout}");
    }
    let out = bench().args(["pipes", "--passes", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--passes") && stderr.contains("at least one pass"), "{stderr}");
}

#[test]
fn run_prints_tokens_and_writes_one_logits_row_per_token() {
    let scratch = tempfile::Builder::new().prefix("bitnet-cli-").tempdir().unwrap();
    let dir = scratch.path();
    let file = dir.join("logits.json");
    let out = bench()
        .args(["run", "--model", "tiny", "--tokens", "1,2,3", "--n-predict", "5", "--threads", "2"])
        .arg("--logits-out")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let generated: Vec<u32> =
        String::from_utf8(out.stdout).unwrap().trim().split(',').map(|t| t.parse().unwrap()).collect();
    assert_eq!(generated.len(), 5);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let tokens: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    assert_eq!(&tokens[..3], &[1, 2, 3]);
    assert_eq!(&tokens[3..], &generated[..]);
    let logits = v["logits"].as_array().unwrap();
    assert_eq!(logits.len(), 8);
    assert!(logits.iter().all(|r| r.as_array().unwrap().len() == 512));
    // Greedy: each generated token is the argmax of the previous row.
    for i in 2..7 {
        let row: Vec<f64> = logits[i].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let best = row.iter().enumerate().fold(0, |b, (j, x)| if *x > row[b] { j } else { b });
        assert_eq!(best as u32, tokens[i + 1], "row {i}");
    }
}

#[test]
fn run_timings_state_the_decode_rate_only_when_there_were_decode_steps() {
    let stderr = |n: &str| {
        let out = bench().args(["run", "--model", "tiny", "--tokens", "1,2,3", "--n-predict", n]).output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    // One new token comes from the prefill's logits: no rate of zero steps (once "inf ms/token").
    let one = stderr("1");
    assert!(one.contains("no decode steps") && !one.contains("inf") && !one.contains("NaN"), "{one}");
    let four = stderr("4");
    assert!(four.contains("decode 3 steps") && four.contains("ms/token") && !four.contains("inf"), "{four}");
}

#[test]
fn run_and_inspect_reject_bad_input_with_exit_2_and_no_file() {
    let scratch = tempfile::Builder::new().prefix("bitnet-cli-bad-").tempdir().unwrap();
    let dir = scratch.path();
    let file = dir.join("x.json");
    let f = file.to_str().unwrap();
    for (args, needle) in [
        (vec!["run", "--model", "gpt2", "--tokens", "1"], "gpt2"),
        (vec!["run", "--model", "model.gguf", "--tokens", "1"], "no such file"),
        (vec!["run", "--model", "tiny", "--tokens", "9999", "--logits-out", f], "9999"),
        (vec!["run", "--model", "tiny", "--tokens", "1", "--kv", "int3"], "int3"),
        (vec!["run", "--model", "tiny", "--tokens", "1", "--n-predict", "400"], "context"),
        (vec!["run", "--model", "tiny", "--tokens", "1", "--kernel", "tq2", "--format", "i2"], "--kernel"),
        (vec!["run", "--model", "tiny", "--tokens", "1", "--logits-out", "/nonexistent-dir/x.json"], "--logits-out"),
        (vec!["run", "--model", "tiny", "--tokens", "1", "--save-gguf", f, "--save-format", "bitplanes"], "I2_S"),
        (vec!["run", "--model", "tiny", "--tokens", "1", "--ffn-activation", "gelu"], "--ffn-activation"),
        (vec!["inspect", "bitnet-b1.58-3b", "--format", "tq2_0"], "3200"),
        (vec!["run", "--model", "tiny", "--tokens", "1", "--pin", "--threads", "4097"], "--pin with --threads 4097"),
    ] {
        let out = bench().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert!(std::fs::read_dir(dir).unwrap().next().is_none(), "a failed run left a file behind");
}

#[test]
fn sampled_runs_repeat_with_the_same_seed_and_differ_from_greedy() {
    let go = |extra: &[&str]| {
        let out = bench()
            .args(["run", "--model", "tiny", "--tokens", "5,6,7", "--n-predict", "12"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let sampled = ["--temperature", "1.5", "--sample-seed", "11"];
    assert_eq!(go(&sampled), go(&sampled));
    assert_ne!(go(&sampled), go(&[]));
    assert_ne!(go(&sampled), go(&["--temperature", "1.5", "--sample-seed", "12"]));
}

fn fixture() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bitnet-engine/tests/data/tiny-bitnet.gguf")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn gguf_files_can_be_inspected_and_run() {
    let out = bench().args(["inspect", &fixture(), "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["architecture"], "bitnet");
    assert_eq!(v["model"], "tiny-bitnet-fixture");
    assert_eq!(v["tensors"].as_array().unwrap().len(), 24);
    let q = v["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "blk.1.attn_q.weight").unwrap();
    assert_eq!((q["type"].as_str(), q["bytes"].as_u64()), (Some("TQ1_0"), Some(256 * 256 / 256 * 54)));
    let out = bench().args(["run", "--model", &fixture(), "--tokens", "1,2,3", "--n-predict", "6"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim().split(',').count(), 6);
    assert!(String::from_utf8_lossy(&out.stderr).contains("tq2/"), "layer 0 runs the TQ2_0 kernel");
}

#[test]
fn a_corrupt_gguf_is_a_clear_error() {
    let scratch = tempfile::Builder::new().prefix("bitnet-cli-gguf-").tempdir().unwrap();
    let dir = scratch.path();
    let bytes = std::fs::read(fixture()).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    for cmd in [vec!["inspect", cut.to_str().unwrap()], vec!["run", "--model", cut.to_str().unwrap(), "--tokens", "1"]]
    {
        let out = bench().args(&cmd).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{cmd:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        if cmd[0] == "run" {
            assert!(e.contains("cut.gguf") && e.contains("past the end"), "{e}");
        } else {
            // inspect reads only the header: a cut in the data section is caught by the
            // offset checks of the parser too.
            assert!(e.contains("past the end"), "{e}");
        }
    }
}

#[test]
fn save_gguf_writes_a_file_that_runs_the_same() {
    let scratch = tempfile::Builder::new().prefix("bitnet-cli-save-").tempdir().unwrap();
    let dir = scratch.path();
    let file = dir.join("tiny.gguf");
    let run = |model: &str, extra: &[&str]| {
        let out = bench()
            .args(["run", "--model", model, "--tokens", "1,2,3", "--n-predict", "8", "--format", "tq2_0"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let direct = run("tiny", &["--save-gguf", file.to_str().unwrap()]);
    let inspect = |extra: &[&str]| {
        let out = bench().args(["inspect", file.to_str().unwrap(), "--json"]).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // tiny is ReLU²-gated: written under bitnet-25, which llama.cpp refuses rather than run
    // with its SiLU-only `bitnet` graph; the activation is recorded under llama.cpp's key.
    let v = inspect(&[]);
    assert_eq!(v["architecture"], "bitnet-25");
    assert_eq!(v["hyperparameters"]["ffn_activation"], "relu2");
    assert_eq!(v["hyperparameters"]["ffn_activation_source"], "metadata key bitnet-25.hidden_activation");
    assert!(v["tensors"].as_array().unwrap().iter().any(|t| t["type"] == "TQ2_0"));
    let v = inspect(&["--ffn-activation", "silu"]);
    assert_eq!(v["hyperparameters"]["ffn_activation"], "silu");
    assert_eq!(v["hyperparameters"]["ffn_activation_source"], "--ffn-activation");
    // Loaded back: the same ternary weights; only the embedding went through f16, so the
    // greedy tokens of a short run agree.
    assert_eq!(run(file.to_str().unwrap(), &[]), direct);
    // The activation matters: the same file run with SiLU writes other tokens.
    assert_ne!(run(file.to_str().unwrap(), &["--ffn-activation", "silu"]), direct);
    // A SiLU model is written under llama.cpp's `bitnet`.
    run("tiny", &["--ffn-activation", "silu", "--save-gguf", file.to_str().unwrap()]);
    let v = inspect(&[]);
    assert_eq!(
        (v["architecture"].as_str(), v["hyperparameters"]["ffn_activation"].as_str()),
        (Some("bitnet"), Some("silu"))
    );
}

#[test]
fn batched_run_decodes_every_sequence_like_a_single_run() {
    let go = |batch: &str| {
        let out = bench()
            .args(["run", "--model", "tiny", "--tokens", "4,5,6", "--n-predict", "10", "--batch", batch])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (single, _) = go("1");
    let (batched, stderr) = go("4");
    assert_eq!(single, batched);
    assert!(stderr.contains("batch 4"), "{stderr}");
    let out = bench().args(["run", "--model", "tiny", "--tokens", "1", "--batch", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn run_save_gguf_writes_the_weights_the_sweep_measures() {
    let scratch = tempfile::Builder::new().prefix("bitnet-cli-save-").tempdir().unwrap();
    let dir = scratch.path();
    let file = common::tiny_gguf(dir);
    // The sweep's and the tracer's default seed.
    let swept = bitnet_engine::Model::synthetic("tiny", bitnet_engine::WeightFormat::Tq2_0, 42, 1).unwrap();
    let saved = bitnet_engine::gguf::load_model(&file).unwrap();
    for (a, b) in swept.weights.layers.iter().zip(&saved.weights.layers) {
        for (x, y) in a.linears().iter().zip(b.linears()) {
            assert_eq!(x.unpack(), y.unpack());
        }
    }
}
