//! The `bitnet-trace` binary: exit codes, error messages, no partial files, `--dhat`, `diff`.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bitnet-trace"))
}

/// A fresh, uniquely named scratch directory, removed when dropped (pass or fail). The tests'
/// `--out` directories are paths inside it that do not exist yet: the tool creates them.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("bitnet-trace-cli-{name}-")).tempdir().unwrap()
}

fn run<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, String, String) {
    output(bin().args(args))
}

/// `--model tiny --context-length CTX --tokens TOKENS`, then `extra`, then `--out OUT`.
fn tiny(ctx: &str, tokens: &str, extra: &[&str], out: &std::path::Path) -> Vec<String> {
    let head = ["--model", "tiny", "--context-length", ctx, "--tokens", tokens];
    let tail = ["--out", out.to_str().unwrap()];
    head.iter().chain(extra).chain(&tail).map(|s| s.to_string()).collect()
}

fn output(cmd: &mut Command) -> (i32, String, String) {
    let o = cmd.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn bad_input_exits_2_naming_the_flag_and_writes_nothing() {
    let dir = tmp("bad");
    let out = dir.path().join("out");
    let o = out.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--model", "tiny", "--kv", "int3", "--out", o], "int3"),
        (&["--model", "tiny", "--pin", "--threads", "4097", "--out", o], "--pin with --threads 4097"),
        (&["--model", "tiny", "--kernel", "nope", "--out", o], "nope"),
        (&["--model", "no-such-model", "--out", o], "--model no-such-model"),
        (&["--model", "/nonexistent/m.gguf", "--out", o], "/nonexistent/m.gguf"),
        (&["--model", "tiny", "--batch", "0", "--out", o], "--batch"),
    ];
    for (args, needle) in cases {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: error should name {needle}: {err}");
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
    let (code, _, err) = run(&["--model", "tiny"]);
    assert_eq!(code, 2);
    assert!(err.contains("--out"), "{err}");
    // `overhead` writes nothing and has its own --steps: a trace's output options are refused,
    // not silently ignored.
    for flag in [&["--out", o][..], &["--pprof"], &["--tokens", "8"], &["--level", "off"], &["--quiet"]] {
        let mut args = vec!["overhead", "--model", "tiny", "--rounds", "1", "--steps", "1"];
        args.extend_from_slice(flag);
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(flag[0]), "{args:?}: {err}");
        assert!(!out.exists());
    }
}

#[test]
fn an_unwritable_out_dir_is_a_clear_error() {
    // A regular file where the directory's parent should be.
    let dir = tmp("file");
    let f = dir.path().join("file");
    std::fs::write(&f, b"x").unwrap();
    let out = f.join("sub");
    let (code, _, err) = run(&tiny("8", "2", &[], &out));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--out"), "{err}");
}

#[test]
fn dhat_and_diff() {
    let dir = tmp("dhat");
    let a = dir.path().join("a");
    let (code, table, err) = run(&tiny("8", "3", &["--dhat", "--no-counters"], &a));
    assert_eq!(code, 0, "{err}");
    assert!(table.contains("| decode stage") && table.contains("consistency:"), "{table}");
    assert!(table.contains("heap: 0.0 allocations"), "decode steps allocate nothing: {table}");
    let heap: serde_json::Value = serde_json::from_slice(&std::fs::read(a.join("dhat-heap.json")).unwrap()).unwrap();
    assert!(heap["dhatFileVersion"].is_number());

    let b = dir.path().join("b");
    let (code, _, err) = run(&tiny("8", "3", &["--form", "fused", "--level", "aggregate"], &b));
    assert_eq!(code, 0, "{err}");
    assert!(!b.join("trace.json").exists(), "aggregate level writes no timeline");
    let svg = dir.path().join("diff.svg");
    let (code, _, err) = run(&[
        "diff",
        a.join("stages.folded").to_str().unwrap(),
        b.join("stages.folded").to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    // A file that is not folded stacks.
    let (code, _, err) = run(&[
        "diff",
        a.join("summary.json").to_str().unwrap(),
        b.join("stages.folded").to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("summary.json") && err.contains("folded"), "{err}");
}

#[test]
fn the_lut_form_is_traced_as_one_lookup_stage() {
    let dir = tmp("lut");
    let out = dir.path().join("out");
    let lut = ["--kernel", "tq1", "--form", "lut", "--level", "aggregate", "--no-counters"];
    let (code, stdout, err) = run(&tiny("8", "3", &lut, &out));
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("kernel tq1/") && stdout.contains("/lut"), "{stdout}");
    assert!(stdout.contains("| lookup "), "the lookup stage has a row: {stdout}");
    assert!(!stdout.contains("unpack_dot"), "nothing is unpacked: {stdout}");
    let folded = std::fs::read_to_string(out.join("stages.folded")).unwrap();
    assert!(folded.lines().any(|l| l.contains(";lookup ")), "{folded}");
}

#[test]
fn a_gguf_file_is_traced_with_the_kernel_for_its_format_unless_told() {
    let scratch = tmp("gguf-default");
    let out = scratch.path();
    let model = out.join("tiny-tq2.gguf");
    let tiny = bitnet_engine::Model::synthetic("tiny", bitnet_engine::WeightFormat::Tq2_0, 42, 1).unwrap();
    bitnet_engine::gguf::save_model(&tiny, bitnet_engine::WeightFormat::Tq2_0, &model).unwrap();
    let trace = |model: &str, dir: &str| {
        let dir = out.join(dir);
        let dir = dir.to_str().unwrap();
        let args =
            ["--model", model, "--context-length", "8", "--tokens", "2", "--level", "aggregate", "--no-counters"];
        run(&[&args[..], &["--out", dir]].concat())
    };
    let (code, stdout, err) = trace(model.to_str().unwrap(), "uniform");
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("kernel tq2/"), "{stdout}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("uniform/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["run"]["kernel"], "tq2", "{summary}");
    let never = out.join("never");
    let (code, _, err) =
        run(&["--model", model.to_str().unwrap(), "--format", "tq1_0", "--out", never.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("--format tq1_0") && err.contains("holds tq2_0 weights"), "{err}");
    assert!(!never.exists());
    // The fixture mixes TQ2_0 and TQ1_0 layers, which one kernel cannot trace: a clear error.
    let mixed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bitnet-engine/tests/data/tiny-bitnet.gguf");
    let (code, _, err) = trace(mixed.to_str().unwrap(), "mixed");
    assert_eq!(code, 2);
    assert!(err.contains("mix tq2_0 and tq1_0"), "{err}");
    assert!(!out.join("mixed").exists());
}

#[test]
fn too_few_pprof_samples_is_a_check_not_run_not_a_failure() {
    let dir = tmp("pprof-few");
    let out = dir.path().join("out");
    // pprof's sampler creates an empty temporary file it never removes (it lives in a static):
    // with TMPDIR inside this test's directory, it goes when the directory does.
    let args = tiny("4", "2", &["--level", "aggregate", "--no-counters", "--pprof"], &out);
    let (code, stdout, err) = output(bin().env("TMPDIR", dir.path()).args(args));
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("check not run: pprof took only"), "{stdout}");
    // (The wall-time check may fail on a busy machine; the pprof one must not.)
    assert!(!stdout.lines().any(|l| l.starts_with("CHECK FAILED") && l.contains("pprof")), "{stdout}");
    let summary: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["consistency"]["pprof"]["ok"], true, "not run is not failed: {summary}");
    assert_eq!(summary["consistency"]["not_run"].as_array().map(|a| a.len()), Some(1), "{summary}");
}

#[test]
fn a_trace_into_an_earlier_traces_directory_leaves_none_of_its_files_behind() {
    let dir = tmp("rerun");
    let out = dir.path().join("out");
    let o = out.to_str().unwrap();
    let base = ["--model", "tiny", "--context-length", "4", "--tokens", "2", "--no-counters", "--out", o];
    let (code, _, err) = run(&[&base[..], &["--level", "timeline"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.join("trace.json").is_file());
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    // An aggregate trace writes no timeline: the first run's must not stay beside its summary.
    let (code, _, err) = run(&[&base[..], &["--level", "aggregate"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.join("summary.json").is_file());
    assert!(!out.join("trace.json").exists(), "the earlier run's trace.json is still there");
    assert!(out.join("notes.txt").is_file(), "files the tool did not write are left alone");
    // A directory that held no trace keeps even files with a trace's names.
    let user = dir.path().join("user");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("trace.json"), "{}").unwrap();
    let u = user.to_str().unwrap();
    let (code, _, err) = run(&[&base[..7], &["--out", u, "--level", "aggregate"]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(user.join("trace.json")).unwrap(), "{}");
}

#[test]
fn the_summary_says_which_ffn_activation_ran_and_why() {
    let dir = tmp("activation");
    let out = dir.path().join("out");
    let o = out.to_str().unwrap();
    let base = ["--model", "tiny", "--context-length", "4", "--tokens", "2", "--no-counters", "--level", "aggregate"];
    let (code, stdout, err) = run(&[&base[..], &["--out", o]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("relu2 FFN from preset"), "{stdout}");
    let (code, stdout, err) = run(&[&base[..], &["--ffn-activation", "silu", "--out", o]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("silu FFN from --ffn-activation"), "{stdout}");
    let summary: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        (summary["run"]["ffn_activation"].as_str(), summary["run"]["ffn_activation_source"].as_str()),
        (Some("silu"), Some("--ffn-activation"))
    );
}
