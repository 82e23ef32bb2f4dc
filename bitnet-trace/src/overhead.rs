//! What the spans cost: decode tokens/s with spans off, aggregated and on a timeline, in one
//! process on one state, in interleaved rounds (the level order rotates every round) so that
//! machine drift cancels; reported as the median of per-round ratios to `off`.

use std::time::Instant;

use anyhow::{Context, Result};
use bitnet_engine::instrument::Level;
use bitnet_engine::model::{argmax, prefill};
use bitnet_engine::{Kernel, LogitsFor, State};

use crate::run::{load_model, prompt, state_options, TraceOptions};

/// Decode tokens/s samples of one level, and its median ratio to `off`.
#[derive(Debug, Clone)]
pub struct LevelResult {
    pub level: Level,
    pub tokens_per_sec: Vec<f64>,
    /// Median over rounds of (this level's tok/s / off's tok/s in the same round).
    pub ratio_to_off: f64,
}

pub const LEVELS: [Level; 3] = [Level::Off, Level::Aggregate, Level::Timeline];

/// Runs `rounds` rounds of `steps` decode steps at each level; returns the results and the
/// kernel that ran (`--kernel`, or the one for the model's weights).
pub fn measure(opts: &TraceOptions, rounds: usize, steps: usize) -> Result<(Vec<LevelResult>, Kernel)> {
    anyhow::ensure!(rounds >= 1 && steps >= 1, "--rounds and --steps must be at least 1");
    let (model, _, kernel) = load_model(opts)?;
    // Checked here too, to name this command's flag (the trace's check says --tokens).
    let max = model.config.max_context;
    anyhow::ensure!(
        opts.context_length + steps <= max,
        "--context-length {} + --steps {steps} exceeds {}'s maximum context of {max}",
        opts.context_length,
        model.config.name
    );
    let opts = &TraceOptions { tokens: steps, ..opts.clone() };
    let mut state = State::new(&model, &state_options(opts, kernel, &model)?).context("--kernel")?;
    let vocab = model.config.vocab;
    let prompts: Vec<Vec<u32>> = (0..opts.batch).map(|s| prompt(opts.seed, s, opts.context_length, vocab)).collect();
    let mut next = vec![0u32; opts.batch];
    for (s, p) in prompts.iter().enumerate() {
        let row = prefill(&model, &mut state, s, 0, p, None)?;
        next[s] = argmax(state.logits(row).expect("last prompt row has logits"));
    }
    let seqs: Vec<usize> = (0..opts.batch).collect();
    let mut positions = vec![0usize; opts.batch];
    let mut samples = vec![Vec::new(); LEVELS.len()];
    // One untimed round first, so every level starts warm.
    for round in 0..=rounds {
        for k in 0..LEVELS.len() {
            let li = (k + round) % LEVELS.len();
            state.set_instrument(LEVELS[li], opts.timeline_capacity);
            let t = Instant::now();
            for step in 0..steps {
                positions.fill(opts.context_length + step);
                state.forward(&model, &next, &seqs, &positions, LogitsFor::All)?;
                state.time_sample(|st| {
                    for (b, n) in next.iter_mut().enumerate() {
                        *n = argmax(st.logits(b).expect("every decode row has logits"));
                    }
                });
            }
            if round > 0 {
                samples[li].push((steps * opts.batch) as f64 / t.elapsed().as_secs_f64());
            }
        }
    }
    let off = samples[0].clone();
    let results = LEVELS
        .iter()
        .zip(samples)
        .map(|(&level, s)| {
            let ratios: Vec<f64> = s.iter().zip(&off).map(|(a, b)| a / b).collect();
            LevelResult { level, ratio_to_off: bitnet_report::stats::median(&ratios), tokens_per_sec: s }
        })
        .collect();
    Ok((results, kernel))
}

/// The results as a table.
pub fn table(results: &[LevelResult], what: &str) -> String {
    let mut o = format!("span overhead, {what}\n| level     | median tok/s |      min tok/s |      max tok/s | median ratio to off | overhead |\n|-----------|--------------|----------------|----------------|---------------------|----------|\n");
    for r in results {
        let min = r.tokens_per_sec.iter().copied().fold(f64::INFINITY, f64::min);
        let max = r.tokens_per_sec.iter().copied().fold(0.0, f64::max);
        o.push_str(&format!(
            "| {:<9} | {:>12.2} | {:>14.2} | {:>14.2} | {:>19.4} | {:>7.2}% |\n",
            r.level.name(),
            bitnet_report::stats::median(&r.tokens_per_sec),
            min,
            max,
            r.ratio_to_off,
            (1.0 - r.ratio_to_off) * 100.0
        ));
    }
    o
}
