//! Driving the forward pass: prefill in chunks, greedy generation (one or B sequences in
//! lock-step), and the KV-precision quality measurement.

use crate::attention::KvPrecision;
use crate::error::{Error, Result};
use crate::model::forward::{argmax, LogitsFor, Model, State, StateOptions};

/// Feeds `tokens` to sequence `seq` from position `start`, `max_rows` at a time, and returns
/// the row (in the last chunk) of the last position. With `logits_out`, every position's
/// logits are appended to it; otherwise only the last position's logits are computed (read
/// them with `State::logits(returned row)`).
pub fn prefill(
    model: &Model,
    state: &mut State,
    seq: usize,
    start: usize,
    tokens: &[u32],
    mut logits_out: Option<&mut Vec<Vec<f32>>>,
) -> Result<usize> {
    if tokens.is_empty() {
        return Err(Error::Shape("prefill needs at least one token".into()));
    }
    let chunk = state.max_rows();
    // The state's own row buffers (preallocated), taken out while `forward` borrows the state.
    let mut seqs = std::mem::take(&mut state.row_seqs);
    let mut positions = std::mem::take(&mut state.row_positions);
    let mut result = Ok(0);
    for (c, part) in tokens.chunks(chunk).enumerate() {
        let p0 = start + c * chunk;
        seqs.clear();
        seqs.extend(std::iter::repeat_n(seq, part.len()));
        positions.clear();
        positions.extend(p0..p0 + part.len());
        let is_last = (c + 1) * chunk >= tokens.len();
        let which = match (&logits_out, is_last) {
            (Some(_), _) => LogitsFor::All,
            (None, true) => LogitsFor::Last,
            (None, false) => LogitsFor::None,
        };
        if let Err(e) = state.forward(model, part, &seqs, &positions, which) {
            result = Err(e);
            break;
        }
        if let Some(out) = logits_out.as_deref_mut() {
            for i in 0..part.len() {
                out.push(state.logits(i).expect("all rows have logits").to_vec());
            }
        }
        result = Ok(part.len() - 1);
    }
    state.row_seqs = seqs;
    state.row_positions = positions;
    result
}

/// What greedy generation produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Generated token ids (not including the prompt).
    pub tokens: Vec<u32>,
    /// With `keep_logits`: one row of logits per fed and generated position.
    pub logits: Vec<Vec<f32>>,
}

/// Greedy decoding of one sequence (sequence 0 of `state`): prefill `prompt`, then generate
/// `n_predict` tokens.
pub fn greedy(
    model: &Model,
    state: &mut State,
    prompt: &[u32],
    n_predict: usize,
    keep_logits: bool,
) -> Result<Generation> {
    let mut logits = Vec::new();
    let last = prefill(model, state, 0, 0, prompt, keep_logits.then_some(&mut logits))?;
    let mut next = argmax(state.logits(last).expect("last prefill row has logits"));
    let mut tokens = Vec::with_capacity(n_predict);
    for step in 0..n_predict {
        tokens.push(next);
        if step + 1 == n_predict {
            break;
        }
        let pos = prompt.len() + step;
        state.forward(model, &[next], &[0], &[pos], LogitsFor::All)?;
        if keep_logits {
            logits.push(state.logits(0).expect("decode row has logits").to_vec());
        }
        next = state.time_sample(|s| argmax(s.logits(0).expect("decode row has logits")));
    }
    Ok(Generation { tokens, logits })
}

/// Greedy decoding of B sequences in lock-step (one forward call per step for all of them, so
/// weights are read once per step). Prompts must have equal lengths.
pub fn greedy_batch(model: &Model, state: &mut State, prompts: &[Vec<u32>], n_predict: usize) -> Result<Vec<Vec<u32>>> {
    let b = prompts.len();
    let len = prompts.first().map_or(0, |p| p.len());
    if b == 0 || prompts.iter().any(|p| p.len() != len) {
        return Err(Error::Shape("batched generation needs ≥ 1 prompt, all of the same length".into()));
    }
    let mut next = Vec::with_capacity(b);
    for (s, p) in prompts.iter().enumerate() {
        let last = prefill(model, state, s, 0, p, None)?;
        next.push(argmax(state.logits(last).expect("last prefill row has logits")));
    }
    let seqs: Vec<usize> = (0..b).collect();
    let mut out: Vec<Vec<u32>> = vec![Vec::with_capacity(n_predict); b];
    let mut positions = vec![0usize; b];
    for step in 0..n_predict {
        for s in 0..b {
            out[s].push(next[s]);
        }
        if step + 1 == n_predict {
            break;
        }
        positions.iter_mut().for_each(|p| *p = len + step);
        state.forward(model, &next, &seqs, &positions, LogitsFor::All)?;
        state.time_sample(|st| {
            for s in 0..b {
                next[s] = argmax(st.logits(s).expect("every row has logits"));
            }
        });
    }
    Ok(out)
}

/// The quality cost of a KV precision against f32 on one token sequence (teacher-forced: both
/// runs see the same tokens).
#[derive(Debug, Clone, PartialEq)]
pub struct KvQuality {
    pub precision: KvPrecision,
    /// Positions compared.
    pub positions: usize,
    /// Mean over positions of KL(p_f32 ‖ p_precision) of the next-token distributions (nats).
    pub kl_divergence: f64,
    /// Largest KL over the positions.
    pub kl_max: f64,
    /// Fraction of positions whose most likely next token agrees with f32's.
    pub top1_agreement: f64,
    /// Perplexity of the sequence's own next tokens (positions 0..n−1 each predicting the
    /// token after it) with f32 KV, and with `precision`: meaningful when the tokens are text.
    pub perplexity_f32: f64,
    pub perplexity: f64,
}

/// Runs `tokens` with f32 KV and with `precision` and compares the next-token distributions
/// at every position.
pub fn kv_quality(model: &Model, tokens: &[u32], precision: KvPrecision, threads: usize) -> Result<KvQuality> {
    let run = |p: KvPrecision| -> Result<Vec<Vec<f32>>> {
        let mut opts = StateOptions::new(1, tokens.len(), p, threads);
        opts.max_rows = tokens.len().min(64);
        let mut st = State::new(model, &opts)?;
        let mut logits = Vec::new();
        prefill(model, &mut st, 0, 0, tokens, Some(&mut logits))?;
        Ok(logits)
    };
    let reference = run(KvPrecision::F32)?;
    let test = run(precision)?;
    let (mut kl_sum, mut kl_max, mut agree) = (0f64, 0f64, 0usize);
    let (mut nll_f32, mut nll) = (0f64, 0f64);
    for (i, (a, b)) in reference.iter().zip(&test).enumerate() {
        let kl = kl_divergence(a, b);
        kl_sum += kl;
        kl_max = kl_max.max(kl);
        agree += usize::from(argmax(a) == argmax(b));
        if let Some(next) = tokens.get(i + 1) {
            nll_f32 -= log_softmax_at(a, *next as usize);
            nll -= log_softmax_at(b, *next as usize);
        }
    }
    let n = reference.len();
    let scored = n.saturating_sub(1).max(1) as f64;
    Ok(KvQuality {
        precision,
        positions: n,
        kl_divergence: kl_sum / n as f64,
        kl_max,
        top1_agreement: agree as f64 / n as f64,
        perplexity_f32: (nll_f32 / scored).exp(),
        perplexity: (nll / scored).exp(),
    })
}

/// `ln softmax(logits)[i]`, in f64.
pub fn log_softmax_at(logits: &[f32], i: usize) -> f64 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + logits.iter().map(|x| (*x as f64 - m).exp()).sum::<f64>().ln();
    logits[i] as f64 - lse
}

/// KL(softmax(p) ‖ softmax(q)) in nats.
pub fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let lse = |v: &[f32]| {
        let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        m + v.iter().map(|x| (*x as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p), lse(q));
    p.iter()
        .zip(q)
        .map(|(a, b)| {
            let la = *a as f64 - lp;
            la.exp() * (la - (*b as f64 - lq))
        })
        .sum::<f64>()
        .max(0.0)
}
