//! The engine's module graph stays one way (docs/architecture.md): each top-level module may
//! name only the modules listed for it here, so a new `crate::model` import in a kernel, or
//! any other edge that would close a circle, fails with the file and line that adds it. Files
//! stay short enough to read: over `MAX_LINES`, a file must be listed with its reason.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Module → the modules it may import (`crate::name`), lowest layer first. Leaves (`error`,
/// `aligned`, `rng`, `instrument`) import nothing of the crate.
const ALLOWED: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("aligned", &[]),
    ("rng", &[]),
    ("instrument", &[]),
    ("cpu", &["error"]),
    ("ternary", &["error", "rng"]),
    ("simd", &["cpu"]),
    ("formats", &["aligned", "error", "rng", "ternary"]),
    ("activations", &["aligned", "error", "formats", "rng", "simd"]),
    ("ops", &["error", "rng", "simd"]),
    ("attention", &["error", "formats", "ops", "rng", "simd"]),
    ("matmul", &["activations", "aligned", "cpu", "error", "formats", "instrument", "rng", "simd"]),
    ("pool", &["error", "simd"]),
    ("probes", &["aligned", "cpu", "error", "pool", "simd"]),
    (
        "model",
        &[
            "activations",
            "aligned",
            "attention",
            "cpu",
            "error",
            "formats",
            "instrument",
            "matmul",
            "ops",
            "pool",
            "rng",
            "simd",
        ],
    ),
    ("gguf", &["error", "formats", "model", "ops", "rng", "ternary"]),
    ("tokenizer", &["error", "gguf"]),
];

/// Longest file, in lines, before it should be split by family or block.
const MAX_LINES: usize = 1000;

/// Files allowed over [`MAX_LINES`], each with why.
const LONG_FILES: &[(&str, &str)] = &[("model/forward.rs", "the forward pass, to become named blocks (issue 55 §2)")];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`matmul/x86_avx2/codes.rs` → `matmul`), or `None`
/// for `lib.rs`.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    if first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_owned())
}

/// The `crate::name` paths a line names, outside comments.
fn crate_paths(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    code.match_indices("crate::")
        .filter(|(i, _)| !code[..*i].ends_with('$') && !code[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        .map(|(i, m)| code[i + m.len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
        .filter(|s: &String| !s.is_empty())
        .collect()
}

#[test]
fn every_module_imports_only_the_layers_below_it() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let known: BTreeSet<&str> = ALLOWED.iter().map(|(m, _)| *m).collect();
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(src()).unwrap();
        let Some(module) = module_of(rel) else { continue };
        let Some((_, allowed)) = ALLOWED.iter().find(|(m, _)| *m == module) else {
            bad.push(format!("{}: module `{module}` is not in this test's ALLOWED table", rel.display()));
            continue;
        };
        for (n, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            for dep in crate_paths(line) {
                if dep != module && known.contains(dep.as_str()) && !allowed.contains(&dep.as_str()) {
                    bad.push(format!("{}:{}: `{module}` imports `{dep}`", rel.display(), n + 1));
                }
            }
        }
    }
    assert!(bad.is_empty(), "imports against the layering (docs/architecture.md):\n{}", bad.join("\n"));
}

#[test]
fn the_allowed_graph_has_no_circle() {
    // Depth-first search for a back edge over the table itself, so that widening an entry
    // cannot reintroduce a circle unnoticed.
    fn visit<'a>(m: &'a str, path: &mut Vec<&'a str>, done: &mut BTreeSet<&'a str>) {
        if let Some(i) = path.iter().position(|p| *p == m) {
            panic!("circle: {}", [&path[i..], &[m]].concat().join(" → "));
        }
        if done.contains(m) {
            return;
        }
        path.push(m);
        let deps = ALLOWED.iter().find(|(n, _)| *n == m).map(|(_, d)| *d).unwrap_or(&[]);
        for d in deps {
            visit(d, path, done);
        }
        path.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for (m, _) in ALLOWED {
        visit(m, &mut Vec::new(), &mut done);
    }
}

#[test]
fn files_stay_short_enough_to_read() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut long = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(src()).unwrap().to_string_lossy().replace('\\', "/");
        let lines = std::fs::read_to_string(f).unwrap().lines().count();
        if lines > MAX_LINES && !LONG_FILES.iter().any(|(p, _)| *p == rel) {
            long.push(format!("{rel}: {lines} lines"));
        }
    }
    assert!(long.is_empty(), "files over {MAX_LINES} lines (split them, or list them with why):\n{}", long.join("\n"));
}

#[test]
fn the_scan_sees_an_upward_import() {
    // The checks above can fail: a kernel line naming the model is found, a comment is not.
    assert_eq!(crate_paths("use crate::model::KvPrecision;"), ["model"]);
    assert_eq!(crate_paths("let x = crate::ops::portable::exp(1.0); // crate::model"), ["ops"]);
    assert!(crate_paths("/// see [`crate::model::Weights`]").is_empty());
    assert!(crate_paths("$crate::simd::x86_avx2::Avx2::new()").is_empty());
}
