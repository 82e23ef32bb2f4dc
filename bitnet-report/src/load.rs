//! Reading a report: the schema version, the JSON Schema, the typed structure, then what the
//! types cannot say; the derived figures are then recomputed from the samples.

use std::path::Path;

use crate::error::{ReportError, Result};
use crate::report::{schema_json, Report, SCHEMA_VERSION};

/// Parses and checks a report named `file` in messages: the schema version, the schema, the
/// typed structure (unknown or missing fields are errors naming their JSON path), then what
/// types cannot say (finite numbers, counts that must agree). Every summary and fraction is
/// recomputed from the samples ([`Report::refresh_derived`]).
pub fn parse(text: &str, file: &str) -> Result<Report> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| ReportError::Json { file: file.into(), error })?;
    match value.get("schema_version").and_then(|v| v.as_u64()) {
        Some(v) if v == SCHEMA_VERSION as u64 => {}
        Some(found) => return Err(ReportError::Version { file: file.into(), found, supported: SCHEMA_VERSION }),
        None => return Err(ReportError::NoVersion { file: file.into() }),
    }
    validate_against(&schema_json(), "report", &value, file)?;
    let mut report: Report = typed(text, file)?;
    check(&report).map_err(|(at, message)| ReportError::Field { file: file.into(), at, message })?;
    report.refresh_derived();
    Ok(report)
}

/// Reads and checks a report file.
pub fn load(path: &Path) -> Result<Report> {
    let text = std::fs::read_to_string(path).map_err(|error| ReportError::Read { path: path.into(), error })?;
    parse(&text, &path.display().to_string())
}

/// Deserializes `text` (already valid JSON) as `T`, naming the JSON path of a field at fault.
pub fn typed<T: serde::de::DeserializeOwned>(text: &str, file: &str) -> Result<T> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| ReportError::Field {
        file: file.into(),
        at: format!("$.{}", e.path()),
        message: e.into_inner().to_string(),
    })
}

/// Validates a JSON value against this build's report schema (`reports/schema.json`).
pub fn validate_schema(value: &serde_json::Value, file: &str) -> Result<()> {
    validate_against(&schema_json(), "report", value, file)
}

/// Validates `value` against the JSON Schema `schema` (`what` names it in the error).
pub fn validate_against(schema: &str, what: &'static str, value: &serde_json::Value, file: &str) -> Result<()> {
    let schema: serde_json::Value = serde_json::from_str(schema).expect("a generated schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("a generated schema is a valid JSON Schema");
    match validator.validate(value) {
        Ok(()) => Ok(()),
        Err(e) => Err(ReportError::Schema {
            file: file.into(),
            what,
            at: json_path(&e.instance_path().to_string()),
            message: e.to_string(),
        }),
    }
}

/// A JSON pointer (`/results/0/decode`) as a JSON path (`$.results[0].decode`).
fn json_path(pointer: &str) -> String {
    let steps: String = pointer
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| if p.bytes().all(|b| b.is_ascii_digit()) { format!("[{p}]") } else { format!(".{p}") })
        .collect();
    format!("${steps}")
}

/// Invariants the types cannot express, as (JSON path, what is wrong).
fn check(r: &Report) -> std::result::Result<(), (String, String)> {
    let fail = |at: String, message: String| Err((at, message));
    for (i, res) in r.results.iter().enumerate() {
        let p = format!("$.results[{i}]");
        if let Some(g) = res.decode.probes_gbps.iter().find(|g| !(g.is_finite() && **g > 0.0)) {
            return fail(format!("{p}.decode.probes_gbps"), format!("{g} is not a positive bandwidth"));
        }
        if res.decode.step_fractions.len() != res.decode.probes_gbps.len()
            || res.decode.step_fractions.iter().any(|f| !(f.is_finite() && *f >= 0.0))
        {
            return fail(
                format!("{p}.decode.step_fractions"),
                "needs one finite, non-negative value per probe in probes_gbps".into(),
            );
        }
        if res.decode.pass_fractions.len() > res.decode.step_fractions.len()
            || res.decode.pass_fractions.iter().any(|f| !(f.is_finite() && *f >= 0.0))
        {
            return fail(
                format!("{p}.decode.pass_fractions"),
                "needs finite, non-negative values, at most one per step fraction".into(),
            );
        }
        if res.config.batch == 0 || res.config.threads == 0 {
            return fail(format!("{p}.config"), "batch and threads must be at least 1".into());
        }
    }
    if !r.roofline.read_bandwidth_gbps.is_finite() {
        return fail("$.roofline.read_bandwidth_gbps".into(), "non-finite value".into());
    }
    if let Some((k, g)) = r.roofline.int8_peak_gmacs.iter().find(|(_, g)| !(g.is_finite() && **g > 0.0)) {
        return fail(format!("$.roofline.int8_peak_gmacs.{k}"), format!("{g} is not a positive rate"));
    }
    if let Some((t, g)) = r.roofline.by_threads.iter().find(|(_, g)| !(g.is_finite() && **g >= 0.0)) {
        return fail(format!("$.roofline.by_threads.{t}"), format!("{g} is not a bandwidth"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn baseline_text() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../reports/baseline-quick-avx2.json")).unwrap()
    }

    #[test]
    fn pointers_become_json_paths() {
        assert_eq!(json_path("/results/0/decode/latency_ms"), "$.results[0].decode.latency_ms");
        assert_eq!(json_path(""), "$");
    }

    #[test]
    fn derived_figures_are_recomputed_on_load() {
        let mut v: serde_json::Value = serde_json::from_str(&baseline_text()).unwrap();
        let want = parse(&baseline_text(), "a.json").unwrap();
        let d = &mut v["results"][0]["decode"];
        d["roofline_fraction"] = 9.0.into();
        d["tokens_per_sec"]["median"] = 1.0.into();
        d["latency_ms"]["p99"] = 1e6.into();
        let got = parse(&v.to_string(), "b.json").unwrap();
        assert_eq!(got, want);
        assert!(got.results[0].decode.roofline_fraction < 9.0);
    }

    #[test]
    fn a_bad_field_is_named_with_its_file_and_path() {
        let mut v: serde_json::Value = serde_json::from_str(&baseline_text()).unwrap();
        v["results"][1]["decode"]["probes_gbps"] = serde_json::json!([-1.0]);
        let e = parse(&v.to_string(), "b.json").unwrap_err().to_string();
        assert!(e.starts_with("b.json: at $.results[1].decode.probes_gbps: -1"), "{e}");
        v["results"][1]["prefill"]["ttft_ms"]["samples"] = serde_json::json!([]);
        let e = parse(&v.to_string(), "b.json").unwrap_err().to_string();
        assert!(e.contains("$.results[1].prefill.ttft_ms") && e.contains("at least one sample"), "{e}");
    }
}
