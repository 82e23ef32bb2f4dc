//! The `bitnet-diff` binary: exit codes, formats, environment checks and malformed input.

use std::process::Command;

fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A fresh, uniquely named scratch directory, removed when dropped (pass or fail), so runs
/// leave nothing in the system's temporary directory.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("bitnet-diff-cli-{name}-")).tempdir().unwrap()
}

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_bitnet-diff")).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

/// A copy of a fixture with `edit` applied to its JSON.
fn edited(dir: &std::path::Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(data("quiet.json")).unwrap()).unwrap();
    edit(&mut v);
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
    p.to_string_lossy().into_owned()
}

fn scale_samples(v: &mut serde_json::Value, f: f64) {
    for r in v["results"].as_array_mut().unwrap() {
        let s = &mut r["decode"]["tokens_per_sec"];
        let samples: Vec<f64> = s["samples"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() * f).collect();
        let st = bitnet_report::stats::Stat::of(&samples);
        *s = serde_json::to_value(st).unwrap();
    }
}

#[test]
fn exit_codes_and_formats() {
    let dir = tmp("codes");
    let d = dir.path();
    let (code, out, err) = run(&[&data("aa-a1.json"), &data("aa-a2.json")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("0 regressions"), "{out}");
    // 25% slower decode: resolved even in the noisiest configuration of quiet.json.
    let slow = edited(d, "slow.json", |v| scale_samples(v, 0.75));
    let quiet = data("quiet.json");
    let (code, out, _) = run(&[&quiet, &slow, "--format", "markdown"]);
    assert_eq!(code, 1, "{out}");
    let first = out.lines().next().unwrap();
    assert!(first.starts_with("**4 regressions,"), "summary line first: {first}");
    let (code, _, _) = run(&[&quiet, &slow, "--fail-on", "never"]);
    assert_eq!(code, 0);
    let out_file = d.join("diff.json");
    let (code, _, _) = run(&[
        &quiet,
        &slow,
        "--format",
        "json",
        "--output",
        out_file.to_str().unwrap(),
        "--metrics",
        "decode.tokens_per_sec",
    ]);
    assert_eq!(code, 1);
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    assert_eq!(j["counts"]["regressions"], 4);
    assert_eq!(j["pairs"][0]["metrics"][0]["verdict"], "regression");
    // Swapped: the same changes are improvements.
    let (code, out, _) = run(&[&slow, &quiet]);
    assert_eq!(code, 0);
    assert!(out.contains("4 improvements"), "{out}");
}

#[test]
fn the_html_page_holds_every_compared_figure() {
    let dir = tmp("html");
    let d = dir.path();
    let slow = edited(d, "slow <&>.json", |v| scale_samples(v, 0.75));
    let quiet = data("quiet.json");
    let page = d.join("diff.html");
    let (code, _, err) = run(&[&quiet, &slow, "--format", "html", "--output", page.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    let (_, json, _) = run(&[&quiet, &slow, "--format", "json"]);
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    let figures: usize = j["pairs"].as_array().unwrap().iter().map(|p| p["metrics"].as_array().unwrap().len()).sum();
    assert!(html.starts_with("<!doctype html>") && html.contains("<h1>bitnet-diff: 4 regressions,"), "{html}");
    assert_eq!(html.lines().filter(|l| l.starts_with("<tr><td>")).count(), figures);
    assert_eq!(html.matches("<td>regression</td>").count(), 4);
    assert!(html.contains("slow &lt;&amp;&gt;.json") && !html.contains("slow <&>"), "file names escaped");
    assert!(html.contains("<select data-col=\"1\">") && html.contains("<select data-col=\"7\">"), "filters");
    // The structure is pinned, the scratch and data directories named by placeholders (the
    // bootstrap is seeded, so the figures are too).
    let pinned = html
        .replace(&format!("{}/", d.display()), "SCRATCH/")
        .replace(&format!("{}/tests/data/", env!("CARGO_MANIFEST_DIR")), "DATA/");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/diff.html");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &pinned).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(pinned, want, "diff.html changed; review and rerun with UPDATE_GOLDEN=1");
}

#[test]
fn a_roofline_fraction_taken_at_another_bus_level_is_inconclusive() {
    let dir = tmp("levels");
    let d = dir.path();
    // Batch-1 decode at 90% of a 33 GB/s bus, then at 73% of a 57 GB/s one (the same code:
    // Zen 4 VMs move between those levels), then at 73% of the same 33 GB/s bus.
    let at = |name: &str, gbps: f64, fraction: f64| {
        edited(d, name, move |v| {
            for r in v["results"].as_array_mut().unwrap() {
                let dec = &mut r["decode"];
                dec["probes_gbps"] = serde_json::json!([gbps, gbps * 1.01, gbps * 0.99, gbps]);
                dec["step_fractions"] = serde_json::json!([fraction, fraction, fraction, fraction]);
                dec["pass_fractions"] = serde_json::json!([fraction, fraction * 1.005, fraction * 0.995]);
                dec["roofline_fraction"] = fraction.into();
            }
        })
    };
    let (slow_bus, fast_bus, slower_code) =
        (at("slow.json", 33.0, 0.90), at("fast.json", 57.0, 0.73), at("worse.json", 33.0, 0.73));
    let metric = ["--metrics", "decode.roofline_fraction"];
    let (code, out, err) = run(&[&slow_bus, &fast_bus, metric[0], metric[1]]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("0 regressions") && out.contains("inconclusive"), "{out}");
    assert!(out.contains("step probes read 33.0 → 57.0 GB/s"), "{out}");
    // At one level the same drop is a regression.
    let (code, out, _) = run(&[&slow_bus, &slower_code, metric[0], metric[1]]);
    assert_eq!(code, 1, "{out}");
    assert!(!out.contains("step probes read"), "{out}");
}

#[test]
fn added_removed_and_environment() {
    let dir = tmp("env");
    let d = dir.path();
    let fewer = edited(d, "fewer.json", |v| {
        v["results"].as_array_mut().unwrap().pop();
    });
    let (code, out, _) = run(&[&data("quiet.json"), &fewer]);
    assert_eq!(code, 0);
    assert!(out.contains("removed (only in"), "{out}");
    // The same, from an interrupted run: the gate fails (unless --fail-on never) and says why.
    let cut = edited(d, "cut.json", |v| {
        v["results"].as_array_mut().unwrap().pop();
        v["complete"] = false.into();
    });
    let (code, out, err) = run(&[&data("quiet.json"), &cut]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("incomplete") && out.contains("NEW is incomplete"), "{out}{err}");
    let (code, _, _) = run(&[&data("quiet.json"), &cut, "--fail-on", "never"]);
    assert_eq!(code, 0);
    let (code, out, _) = run(&[&cut, &data("quiet.json")]);
    assert_eq!(code, 0, "an incomplete BASE only gets a note");
    assert!(out.contains("BASE is incomplete"), "{out}");
    // Settings and huge pages that move the figures are environment differences.
    let other_settings = edited(d, "settings.json", |v| {
        v["settings"]["max_new_tokens"] = 64.into();
        v["settings"]["warmup"] = 0.into();
        v["system"]["transparent_hugepage"] = "never".into();
        v["system"]["huge_pages_requested"] = false.into();
    });
    let thp = edited(d, "thp.json", |v| {
        v["system"]["transparent_hugepage"] = "madvise".into();
        v["system"]["huge_pages_requested"] = true.into();
    });
    let (code, _, err) = run(&[&thp, &other_settings]);
    assert_eq!(code, 0);
    for w in [
        "new tokens per run differs: 16 vs 64",
        "warm-up runs differs: 1 vs 0",
        "transparent huge pages differs",
        "huge pages differs: asked for vs not asked for (BITNET_HUGE_PAGES=0)",
    ] {
        assert!(err.contains(w), "{w}: {err}");
    }
    let other_cpu = edited(d, "cpu.json", |v| v["system"]["cpu_model"] = "Other CPU".into());
    let (code, _, err) = run(&[&data("quiet.json"), &other_cpu]);
    assert_eq!(code, 0);
    assert!(err.contains("warning: CPU model differs"), "{err}");
    let (code, _, err) = run(&[&data("quiet.json"), &other_cpu, "--strict-env"]);
    assert_eq!(code, 2);
    assert!(err.contains("--strict-env") && err.contains("CPU model"), "{err}");
    // The same CPU name on another generation: told apart by its caches and features.
    let other_gen = edited(d, "gen.json", |v| {
        v["system"]["l1d_kib"] = 48.into();
        v["system"]["cpu_features"].as_array_mut().unwrap().push("avx512_vp2intersect".into());
    });
    let (code, _, err) = run(&[&data("quiet.json"), &other_gen]);
    assert_eq!(code, 0);
    assert!(err.contains("warning: L1d cache differs: 32 KiB vs 48 KiB"), "{err}");
    assert!(err.contains("warning: CPU feature list differs"), "{err}");
    // The same name, caches and features on another core: told apart by CPUID (Zen 4 against
    // Zen 5 VMs); unknown on one side (older reports) is not a difference.
    let id = |family: u32, micro: &str| {
        serde_json::json!({"vendor": "AuthenticAMD", "family": family, "model": 17, "stepping": 1,
                           "microarchitecture": micro})
    };
    let zen4 = edited(d, "zen4.json", |v| v["system"]["cpu_id"] = id(25, "zen4"));
    let zen5 = edited(d, "zen5.json", |v| v["system"]["cpu_id"] = id(26, "zen5"));
    let (code, _, err) = run(&[&zen4, &zen5]);
    assert_eq!(code, 0);
    let want = "warning: CPU (CPUID) differs: zen4, AuthenticAMD family 25 model 17 stepping 1 vs zen5, AuthenticAMD family 26";
    assert!(err.contains(want), "{err}");
    let (_, _, err) = run(&[&data("quiet.json"), &zen5]);
    assert!(!err.contains("CPUID"), "{err}");
    // Unknown on one side (as in an imported llama-bench report): not a difference.
    let unknown = edited(d, "unknown.json", |v| {
        v["system"]["l1d_kib"] = serde_json::Value::Null;
        v["system"]["cpu_features"] = serde_json::json!([]);
    });
    let (_, _, err) = run(&[&data("quiet.json"), &unknown]);
    assert!(!err.contains("L1d cache") && !err.contains("CPU feature list"), "{err}");
    // Same name, other weights (a preset against a GGUF file of its shapes).
    let other_source = edited(d, "source.json", |v| {
        v["model"]["source"] = "GGUF file m.gguf".into();
        v["model"]["weight_bytes"] = 1.into();
    });
    let (code, _, err) = run(&[&data("quiet.json"), &other_source]);
    assert_eq!(code, 0);
    assert!(err.contains("warning: model source differs") && err.contains("warning: weight bytes differs"), "{err}");
    // A metric that cannot be ratioed is listed as not compared, not dropped unseen.
    let zero = edited(d, "zero.json", |v| {
        let s = &mut v["results"][0]["decode"]["tokens_per_sec"];
        let mut samples: Vec<f64> = s["samples"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        samples[0] = 0.0;
        *s = serde_json::to_value(bitnet_report::stats::Stat::of(&samples)).unwrap();
    });
    let (code, out, err) = run(&[&data("quiet.json"), &zero]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("not compared:") && out.contains("decode.tokens_per_sec: the new report has"), "{out}");
    let other_model = edited(d, "model.json", |v| {
        for r in v["results"].as_array_mut().unwrap() {
            r["config"]["model"] = "other".into();
        }
    });
    let (code, _, err) = run(&[&data("quiet.json"), &other_model]);
    assert_eq!(code, 2);
    assert!(err.contains("no configuration in common"), "{err}");
}

#[test]
fn malformed_inputs_exit_2_with_the_file_and_json_path() {
    let dir = tmp("bad");
    let d = dir.path();
    let text = std::fs::read_to_string(data("quiet.json")).unwrap();
    let trunc = d.join("trunc.json");
    std::fs::write(&trunc, &text[..text.len() / 2]).unwrap();
    let nan = d.join("nan.json");
    std::fs::write(&nan, text.replacen("\"roofline_fraction\": ", "\"roofline_fraction\": NaN, \"x\": ", 1)).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (trunc.to_string_lossy().into(), "not valid JSON"),
        (nan.to_string_lossy().into(), "not valid JSON"),
        (
            edited(d, "type.json", |v| v["results"][2]["prefill"]["ttft_ms"]["median"] = "fast".into()),
            "$.results[2].prefill.ttft_ms.median",
        ),
        (
            edited(d, "missing.json", |v| {
                v["results"][0]["decode"].as_object_mut().unwrap().remove("tokens_per_sec");
            }),
            "$.results[0].decode",
        ),
        (edited(d, "empty.json", |v| v["results"] = serde_json::json!([])), "$.results is empty"),
        (edited(d, "schema.json", |v| v["schema_version"] = 7.into()), "schema_version 7"),
        ("/nonexistent/base.json".into(), "/nonexistent/base.json"),
    ];
    for (file, needle) in cases {
        let (code, _, err) = run(&[&file, &data("aa-a2.json")]);
        assert_eq!(code, 2, "{file}: {err}");
        assert!(err.contains(&file) || file.starts_with("/nonexistent"), "names the file: {err}");
        assert!(err.contains(needle), "{file}: expected {needle:?} in {err}");
    }
    for bad in [&["--threshold", "abc"][..], &["--threshold", "150%"], &["--metrics", "nope"], &["--format", "xml"]] {
        let mut args = vec![data("aa-a1.json"), data("aa-a2.json")];
        args.extend(bad.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{bad:?}: {err}");
    }
}

#[cfg(feature = "history")]
#[test]
fn history_database_compares_commits_and_prints_a_trend() {
    let dir = tmp("db");
    let d = dir.path();
    let db = d.join("history.sqlite");
    let quiet = bitnet_report::load(std::path::Path::new(&data("quiet.json"))).unwrap();
    for (commit, f) in [("aaaa1111", 1.0), ("bbbb2222", 0.75), ("cccc3333", 0.8)] {
        let mut r = quiet.clone();
        r.tool.git_commit = Some(commit.into());
        for x in &mut r.results {
            let s: Vec<f64> = x.decode.tokens_per_sec.samples().iter().map(|v| v * f).collect();
            x.decode.tokens_per_sec = bitnet_report::stats::Stat::of(&s);
        }
        bitnet_bench::history::append(&db, &r).unwrap();
    }
    // Newer runs from trees with uncommitted changes: a commit's clean run is preferred to
    // them, and one that has only such a run gets it, with a note.
    for commit in ["bbbb2222", "ffff6666"] {
        let mut r = quiet.clone();
        r.tool.git_commit = Some(commit.into());
        r.tool.git_dirty = Some(true);
        bitnet_bench::history::append(&db, &r).unwrap();
    }
    // The same model name from a GGUF file: its own series.
    let mut g = quiet.clone();
    g.tool.git_commit = Some("eeee5555".into());
    g.model.source = "GGUF file /x/m.gguf".into();
    bitnet_bench::history::append(&db, &g).unwrap();
    let dbs = db.to_str().unwrap();
    let (code, out, err) =
        run(&["--db", dbs, "--base", "aaaa", "--head", "bbbb2222", "--metrics", "decode.tokens_per_sec"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("4 regressions"), "{out}");
    assert!(!out.contains("uncommitted"), "{out}");
    let (code, out, err) =
        run(&["--db", dbs, "--base", "aaaa", "--head", "ffff", "--metrics", "decode.tokens_per_sec"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("NEW was built from a tree with uncommitted changes (tool.git_dirty): commit ffff6666"),
        "{out}"
    );
    let svg = d.join("trend.svg");
    let (code, out, err) =
        run(&["--db", dbs, "--history", "--metric", "decode.tokens_per_sec", "--plot", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().filter(|l| l.starts_with("| ") && l.contains("aaaa1111")).count(), 4, "{out}");
    // Each row names its model and where the weights came from, so runs of two models, or of
    // a preset and a GGUF file of one name, never read as one series.
    let model = quiet.results[0].config.model.clone();
    assert!(
        out.lines().filter(|l| l.contains("aaaa1111")).all(|l| l.contains(&format!("| {model} [preset] "))),
        "{out}"
    );
    assert!(
        out.lines().filter(|l| l.contains("eeee5555")).all(|l| l.contains(&format!("| {model} [m.gguf] "))),
        "{out}"
    );
    assert!(out.contains("eeee5555"), "{out}");
    assert!(out.contains("cccc3333"));
    // The trend: a tick per run named by its id and commit, a series per configuration, each
    // point with its interval and exact values on hover.
    let svg = std::fs::read_to_string(&svg).unwrap();
    for tick in ["#1 aaaa111", "#2 bbbb222", "#3 cccc333", "#6 eeee555"] {
        assert!(svg.contains(&format!(">{tick}</text>")), "tick {tick}: {svg}");
    }
    let points = svg.matches("<circle").count();
    assert_eq!(points, out.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| run")).count(), "{svg}");
    assert_eq!(svg.matches("h8M").count(), points, "an error bar per point");
    assert!(svg.contains("<title>run 1 (aaaa1111, "), "{svg}");
    let (code, _, err) = run(&["--db", dbs, "--base", "dddd", "--head", "aaaa"]);
    assert_eq!(code, 2);
    assert!(err.contains("no complete run of commit dddd"), "{err}");
    let (code, _, err) = run(&["--db", dbs]);
    assert_eq!(code, 2);
    assert!(err.contains("--db FILE --base REV --head REV"), "{err}");
}

/// Sets every result's quality: real-text figures (`Some(ppl)`) or synthetic ones.
fn set_quality(v: &mut serde_json::Value, kl: f64, perplexity: Option<f64>) {
    for r in v["results"].as_array_mut().unwrap() {
        let mut q = serde_json::json!({"kl_divergence": kl, "top1_agreement": 0.97, "positions": 64});
        match perplexity {
            Some(p) => {
                q["source"] = "text".into();
                q["text"] = "t.txt (100 bytes, sha256 0123456789abcdef)".into();
                q["perplexity_f32"] = p.into();
                q["perplexity"] = p.into();
            }
            None => q["source"] = "synthetic".into(),
        }
        r["quality"] = q;
    }
}

/// A model that got worse is a regression even when it is as fast: real-text quality is
/// compared by default with its own thresholds; synthetic quality is never gated.
#[test]
fn quality_on_real_text_is_gated_and_synthetic_quality_is_not() {
    let dir = tmp("quality");
    let d = dir.path();
    let base = edited(d, "base.json", |v| set_quality(v, 0.010, Some(12.0)));
    let same = edited(d, "same.json", |v| set_quality(v, 0.0102, Some(12.05)));
    let worse_ppl = edited(d, "worse-ppl.json", |v| set_quality(v, 0.010, Some(12.3)));
    let worse_kl = edited(d, "worse-kl.json", |v| set_quality(v, 0.020, Some(12.0)));
    let (code, out, err) = run(&[&base, &same]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("quality.perplexity") && out.contains("quality.kl_divergence"), "compared by default: {out}");
    // +2.5% perplexity (over its 1% threshold, under --threshold's 5%) and 2× KL: regressions.
    for worse in [&worse_ppl, &worse_kl] {
        let (code, out, _) = run(&[&base, worse]);
        assert_eq!(code, 1, "{worse}: {out}");
    }
    let (code, out, _) = run(&[&base, &worse_ppl, "--format", "json"]);
    assert_eq!(code, 1);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let verdicts: Vec<&str> = j["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["metrics"].as_array().unwrap())
        .filter(|m| m["metric"] == "quality.perplexity")
        .map(|m| m["verdict"].as_str().unwrap())
        .collect();
    assert!(!verdicts.is_empty() && verdicts.iter().all(|v| *v == "regression"), "{verdicts:?}");
    // Synthetic figures, even 10× worse: not gated, and said so.
    let syn_base = edited(d, "syn-base.json", |v| set_quality(v, 0.01, None));
    let syn_worse = edited(d, "syn-worse.json", |v| set_quality(v, 0.1, None));
    let (code, out, _) = run(&[&syn_base, &syn_worse, "--metrics", "quality.kl_divergence"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("synthetic") && out.contains("not gated"), "{out}");
    // A KL of 0 (a run against itself) against a positive one still compares.
    let zero = edited(d, "zero.json", |v| set_quality(v, 0.0, Some(12.0)));
    let (code, out, _) = run(&[&zero, &worse_kl]);
    assert_eq!(code, 1, "{out}");
}
