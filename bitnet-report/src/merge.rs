//! Pooling reports of one build, model and machine (e.g. interleaved runs of a CI job) into
//! one.

use crate::error::{ReportError, Result};
use crate::report::{source_identity, Report};

fn refuse<T>(file: &str, message: String) -> Result<T> {
    Err(ReportError::Merge { file: file.into(), message })
}

/// Merges reports of the same build, model and machine (e.g. interleaved runs of a CI job)
/// into one: the samples of equal configurations are concatenated and their statistics
/// recomputed; a configuration present in only some reports keeps the samples it has.
pub fn merge(reports: &[(String, Report)]) -> Result<Report> {
    let Some((first_name, first)) = reports.first() else {
        return Err(ReportError::Merge { file: "merge".into(), message: "no reports given".into() });
    };
    let mut out = first.clone();
    for (name, r) in &reports[1..] {
        let commit = |r: &Report| r.tool.git_commit.clone().unwrap_or_else(|| "unknown".into());
        if r.model.name != first.model.name || r.tool.git_commit != first.tool.git_commit {
            return refuse(
                name,
                format!(
                    "model {} at commit {} cannot be merged with {first_name} (model {} at commit {})",
                    r.model.name,
                    commit(r),
                    first.model.name,
                    commit(first)
                ),
            );
        }
        // Samples pool only if they measured the same weights the same way.
        for (field, a, b) in [
            ("model.source", &source_identity(&r.model.source), &source_identity(&first.model.source)),
            ("model.weight_format", &r.model.weight_format, &first.model.weight_format),
        ] {
            if a != b {
                return refuse(name, format!("{field} is {a:?}, {first_name}'s is {b:?}: not the same weights"));
            }
        }
        for (field, a, b) in [
            ("settings.max_new_tokens", r.settings.max_new_tokens, first.settings.max_new_tokens),
            ("settings.warmup", r.settings.warmup, first.settings.warmup),
            ("settings.seed", r.settings.seed as usize, first.settings.seed as usize),
            ("model.weight_bytes", r.model.weight_bytes as usize, first.model.weight_bytes as usize),
        ] {
            if a != b {
                return refuse(name, format!("{field} is {a}, {first_name}'s is {b}"));
            }
        }
        // The roofline of merged runs is the best probe of any of them: only probes of one size
        // (a small one partly reads the cache) and decodes from one depth pool.
        let shown = |v: Option<u64>| v.map_or("absent".to_string(), |b| b.to_string());
        for (field, a, b) in [
            ("roofline.probe_bytes", r.roofline.probe_bytes, first.roofline.probe_bytes),
            ("roofline.step_probe_bytes", r.roofline.step_probe_bytes, first.roofline.step_probe_bytes),
            (
                "settings.decode_depth",
                r.settings.decode_depth.map(|d| d as u64),
                first.settings.decode_depth.map(|d| d as u64),
            ),
        ] {
            if a != b {
                return refuse(name, format!("{field} is {}, {first_name}'s is {}", shown(a), shown(b)));
            }
        }
        out.complete &= r.complete;
        out.settings.repeat += r.settings.repeat;
        // The roofline of merged runs is the best bandwidth any of them measured.
        for (t, gbps) in &r.roofline.by_threads {
            out.roofline.raise(t, *gbps);
        }
        for (t, probes) in &r.roofline.probes_gbps {
            out.roofline.probes_gbps.entry(t.clone()).or_default().extend(probes);
        }
        for (k, g) in &r.roofline.int8_peak_gmacs {
            out.roofline.raise_peak(k, *g);
        }
        for (k, probes) in &r.roofline.int8_peak_probes {
            out.roofline.int8_peak_probes.entry(k.clone()).or_default().extend(probes);
        }
        for x in &r.results {
            match out.results.iter_mut().find(|o| o.config == x.config) {
                None => out.results.push(x.clone()),
                Some(o) => {
                    o.prefill.tokens_per_sec = o.prefill.tokens_per_sec.pooled(&x.prefill.tokens_per_sec);
                    o.prefill.ttft_ms = o.prefill.ttft_ms.pooled(&x.prefill.ttft_ms);
                    o.decode.tokens_per_sec = o.decode.tokens_per_sec.pooled(&x.decode.tokens_per_sec);
                    o.decode.latency_ms = o.decode.latency_ms.pooled(&x.decode.latency_ms);
                    o.decode.probes_gbps.extend(&x.decode.probes_gbps);
                    o.decode.step_fractions.extend(&x.decode.step_fractions);
                    o.decode.pass_fractions.extend(&x.decode.pass_fractions);
                    o.memory.peak_rss_bytes = o.memory.peak_rss_bytes.max(x.memory.peak_rss_bytes);
                }
            }
        }
    }
    // The fractions follow the pooled samples and the best roofline.
    out.refresh_derived();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn baseline() -> Report {
        serde_json::from_str(include_str!("../../reports/baseline-quick-avx2.json")).unwrap()
    }

    #[test]
    fn equal_configurations_pool_their_samples() {
        let (a, b) = (baseline(), baseline());
        let m = merge(&[("a.json".into(), a.clone()), ("b.json".into(), b)]).unwrap();
        assert_eq!(m.results.len(), a.results.len());
        assert_eq!(m.settings.repeat, 2 * a.settings.repeat);
        for (x, y) in m.results.iter().zip(&a.results) {
            let s = y.decode.tokens_per_sec.samples();
            assert_eq!(x.decode.tokens_per_sec.samples(), [s, s].concat());
        }
    }

    #[test]
    fn merged_fractions_follow_the_pooled_samples_and_the_best_roofline() {
        use crate::roofline::{compute_fraction, peak_key};
        use crate::stats::median;
        let (mut a, mut b) = (baseline(), baseline());
        for (r, peak) in [(&mut a, 100.0), (&mut b, 200.0)] {
            for x in &mut r.results {
                x.decode.macs_per_step = 1_000_000_000;
                r.roofline.int8_peak_gmacs.insert(peak_key(&x.config.isa, x.config.threads), peak);
            }
        }
        for x in &mut b.results {
            x.decode.tokens_per_sec = x.decode.tokens_per_sec.map(|v| 3.0 * v);
            x.decode.step_fractions.iter_mut().for_each(|f| *f *= 3.0);
        }
        let m = merge(&[("a.json".into(), a.clone()), ("b.json".into(), b.clone())]).unwrap();
        for (x, (xa, xb)) in m.results.iter().zip(a.results.iter().zip(&b.results)) {
            let steps = [xa.decode.step_fractions.as_slice(), &xb.decode.step_fractions].concat();
            assert_eq!(x.decode.roofline_fraction, median(&steps));
            let tps = median(&[xa.decode.tokens_per_sec.samples(), xb.decode.tokens_per_sec.samples()].concat());
            assert_eq!(x.decode.compute_fraction, Some(compute_fraction(1e9, tps, x.config.batch, 200.0)));
        }
    }

    #[test]
    fn reports_of_other_weights_or_settings_are_refused() {
        type Edit = fn(&mut Report);
        let cases: [(&str, Edit); 9] = [
            ("roofline.probe_bytes", |r| r.roofline.probe_bytes = Some(64 << 20)),
            ("roofline.step_probe_bytes", |r| r.roofline.step_probe_bytes = Some(1 << 20)),
            ("settings.decode_depth", |r| r.settings.decode_depth = Some(0)),
            ("settings.seed", |r| r.settings.seed += 1),
            ("settings.warmup", |r| r.settings.warmup += 1),
            ("settings.max_new_tokens", |r| r.settings.max_new_tokens += 1),
            ("model.source", |r| r.model.source = "GGUF file m.gguf".into()),
            ("model.weight_format", |r| r.model.weight_format = "tq1_0".into()),
            ("model.weight_bytes", |r| r.model.weight_bytes += 1),
        ];
        for (field, edit) in cases {
            let mut b = baseline();
            edit(&mut b);
            let err = merge(&[("a.json".into(), baseline()), ("b.json".into(), b)]).unwrap_err().to_string();
            assert!(err.starts_with("b.json: ") && err.contains(field), "{field}: {err}");
        }
        // One GGUF file by two paths is one source.
        let (mut a, mut b) = (baseline(), baseline());
        a.model.source = "GGUF file /data/m.gguf".into();
        b.model.source = "GGUF file ./m.gguf".into();
        merge(&[("a.json".into(), a), ("b.json".into(), b)]).unwrap();
        let mut other = baseline();
        other.tool.git_commit = None;
        let err = merge(&[("a.json".into(), baseline()), ("b.json".into(), other)]).unwrap_err().to_string();
        assert!(err.contains("at commit unknown") && !err.contains("Some("), "{err}");
    }
}
