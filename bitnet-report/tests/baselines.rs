//! The committed reports load as they were written: recomputing every summary and fraction from
//! the samples gives back the stored figures (the code that wrote them computed them the same
//! way), so reading a report changes nothing but a hand-edited summary.

use std::path::{Path, PathBuf};

fn committed_reports() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for dir in ["reports", "bitnet-diff/tests/data"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".json") && !name.contains("schema") {
                out.push(p);
            }
        }
    }
    assert!(out.len() >= 7, "{out:?}");
    out
}

/// Walks a stored and a loaded JSON value in step; numbers may differ by rounding (1e-12 of
/// their size).
fn same(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> Result<(), String> {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            if (x - y).abs() <= 1e-12 * x.abs().max(y.abs()) {
                Ok(())
            } else {
                Err(format!("{at}: stored {x}, recomputed {y}"))
            }
        }
        (Array(x), Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().try_for_each(|(i, (x, y))| same(x, y, &format!("{at}[{i}]")))
        }
        // Loading may add a field an older report lacks (its default); every stored one stays.
        (Object(x), Object(y)) => x.iter().try_for_each(|(k, v)| {
            y.get(k).ok_or(format!("{at}.{k}: missing after loading")).and_then(|w| same(v, w, &format!("{at}.{k}")))
        }),
        _ if a == b => Ok(()),
        _ => Err(format!("{at}: stored {a}, loaded {b}")),
    }
}

#[test]
fn committed_reports_load_as_they_were_written() {
    for p in committed_reports() {
        let text = std::fs::read_to_string(&p).unwrap();
        let stored: serde_json::Value = serde_json::from_str(&text).unwrap();
        let loaded = bitnet_report::parse(&text, &p.display().to_string()).unwrap();
        let back = serde_json::to_value(&loaded).unwrap();
        if let Err(e) = same(&stored, &back, "$") {
            panic!("{}: {e}", p.display());
        }
    }
}
