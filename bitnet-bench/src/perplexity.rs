//! `perplexity`: llama.cpp's `llama-perplexity` method on our engine, and a KL-divergence
//! comparison against a saved reference run (`--kl-base` / `--kl-ref`).
//!
//! The method (llama.cpp `tools/perplexity/perplexity.cpp`, `perplexity()`): the text is
//! tokenized once (with BOS where the vocabulary adds one), cut into `n = tokens / ctx` chunks
//! of `ctx` tokens; each chunk is evaluated from position 0 with a fresh context, its first
//! token replaced by BOS when the vocabulary adds BOS; the logits at positions
//! `j = ctx/2 .. ctx-2` are scored against token `j+1` (the second half of the window, so every
//! scored token has at least `ctx/2` tokens of context). PPL = exp(mean NLL), and its standard
//! error is `ppl · sqrt((mean(nll²) − mean(nll)²) / (count − 1))`.
//!
//! The scoring core ([`score`]) takes any [`LogitsSource`], so tests feed it known logits.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bitnet_engine::model::FfnActivation;
use bitnet_engine::{Kernel, KernelFamily, KvPrecision, LogitsFor, Model, State, StateOptions, WeightFormat};
use bitnet_report::perplexity::{ChunkEstimate, KlReport, ModelId, PerplexityResult, TextId, SCHEMA_VERSION};

/// Vocabularies up to this size are stored whole in a KL base, larger ones as top-k + rest.
pub const FULL_VOCAB_MAX: usize = 4096;
/// Magic and version of the KL base file (see `docs/perplexity.md`).
pub const KL_MAGIC: &[u8; 8] = b"BNKLBASE";
pub const KL_VERSION: u32 = 1;

/// Options of a perplexity run on the engine.
#[derive(Debug, Clone)]
pub struct PerplexityOptions {
    /// Tokens per chunk (llama.cpp's `-c`).
    pub ctx: usize,
    /// At most this many chunks (default: all the text holds).
    pub chunks: Option<usize>,
    /// Rows per forward call (llama.cpp's `-b`), ≤ ctx.
    pub batch: usize,
    pub threads: usize,
    pub kv: KvPrecision,
    pub kernel: Option<Kernel>,
    /// Tokens kept per position in a KL base when the vocabulary is larger than
    /// [`FULL_VOCAB_MAX`].
    pub kl_top_k: usize,
}

/// Something that gives logits for a chunk.
pub trait LogitsSource {
    fn vocab(&self) -> usize;
    /// Evaluates `tokens` (one chunk, positions `0..tokens.len()`, from an empty context) and
    /// calls `row(pos, logits)` for every position `pos ≥ first`, in order. Returns false if
    /// `stop` was set before the chunk finished (the chunk then counts for nothing).
    fn chunk(
        &mut self,
        tokens: &[u32],
        first: usize,
        stop: &AtomicBool,
        row: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
    ) -> Result<bool>;
}

/// The engine as a [`LogitsSource`]: one sequence; each chunk restarts at position 0, which
/// overwrites the cache (a row attends to positions `0..=pos` only, all written by this chunk).
pub struct EngineSource<'m> {
    model: &'m Model,
    state: State,
}

impl<'m> EngineSource<'m> {
    pub fn new(model: &'m Model, opts: &PerplexityOptions) -> Result<Self> {
        let mut so = StateOptions::new(1, opts.ctx, opts.kv, opts.threads);
        so.kernel = opts.kernel;
        so.max_rows = opts.batch.clamp(1, opts.ctx);
        let state = State::new(model, &so).context("building the perplexity state")?;
        Ok(Self { model, state })
    }
    pub fn kernel(&self) -> Kernel {
        self.state.kernel(self.model)
    }
}

impl LogitsSource for EngineSource<'_> {
    fn vocab(&self) -> usize {
        self.model.config.vocab
    }
    fn chunk(
        &mut self,
        tokens: &[u32],
        first: usize,
        stop: &AtomicBool,
        row: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
    ) -> Result<bool> {
        let b = self.state.max_rows();
        let seqs = vec![0usize; b];
        let mut positions = Vec::with_capacity(b);
        for (c, part) in tokens.chunks(b).enumerate() {
            if stop.load(Ordering::SeqCst) {
                return Ok(false);
            }
            let p0 = c * b;
            positions.clear();
            positions.extend(p0..p0 + part.len());
            let want = if p0 + part.len() > first { LogitsFor::All } else { LogitsFor::None };
            self.state.forward(self.model, part, &seqs[..part.len()], &positions, want)?;
            if want == LogitsFor::All {
                for (i, &pos) in positions.iter().enumerate().filter(|(_, p)| **p >= first) {
                    row(pos, self.state.logits(i).expect("all rows have logits"))?;
                }
            }
        }
        Ok(true)
    }
}

/// Chunks of `ctx` tokens the text holds (llama.cpp: `tokens / ctx`).
pub fn chunks_available(tokens: usize, ctx: usize) -> usize {
    tokens / ctx
}

/// Tokens scored per chunk: positions `ctx/2 ..= ctx-2`.
pub fn scored_per_chunk(ctx: usize) -> usize {
    ctx - ctx / 2 - 1
}

/// Chunk `i` as the model sees it: BOS in place of its first token when the vocabulary adds one.
fn fed_chunk(tokens: &[u32], ctx: usize, i: usize, add_bos: bool, bos: Option<u32>) -> Vec<u32> {
    let mut c = tokens[i * ctx..(i + 1) * ctx].to_vec();
    if let (true, Some(b)) = (add_bos, bos) {
        c[0] = b;
    }
    c
}

/// FNV-1a 64 of the little-endian token ids the first `chunks` chunks feed the model (BOS
/// included): what a KL base is checked against.
pub fn fed_tokens_hash(tokens: &[u32], ctx: usize, chunks: usize, add_bos: bool, bos: Option<u32>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..chunks {
        for t in fed_chunk(tokens, ctx, i, add_bos, bos) {
            for b in t.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    h
}

/// Max and ln Σ exp(l − max), in f64.
fn log_sum_exp(logits: &[f32]) -> (f64, f64) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    (max, sum.ln())
}

/// First index of the largest logit.
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// ln of the probability mass of the tokens not in `listed`, summed in index order (the base
/// and a comparison compute it with this same function, so equal logits give equal bits).
fn ln_rest(logits: &[f32], max: f64, lse: f64, listed: &[bool]) -> f32 {
    let s: f64 = logits.iter().zip(listed).filter(|(_, &l)| !l).map(|(&v, _)| (v as f64 - max).exp()).sum();
    (s.ln() - lse) as f32
}

/// The header of a KL base file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KlHeader {
    pub vocab: usize,
    pub ctx: usize,
    pub chunks: usize,
    /// 0: full distributions; else tokens kept per position.
    pub top_k: usize,
    pub tokens_hash: u64,
}

const HEADER_BYTES: usize = 8 + 4 * 5 + 8;

impl KlHeader {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES);
        b.extend_from_slice(KL_MAGIC);
        for v in [KL_VERSION, self.vocab as u32, self.ctx as u32, self.chunks as u32, self.top_k as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.tokens_hash.to_le_bytes());
        b
    }
    /// Bytes of one position's record.
    pub fn record_bytes(&self) -> usize {
        if self.top_k == 0 {
            4 + 4 * self.vocab
        } else {
            4 + 4 + 4 + 8 * self.top_k
        }
    }
    /// "full" or "top-K + rest".
    pub fn support(&self) -> String {
        if self.top_k == 0 {
            "full".into()
        } else {
            format!("top-{} + rest", self.top_k)
        }
    }
    /// Refuses a base that was not made from the same tokens, context and vocabulary.
    pub fn check(&self, name: &str, vocab: usize, ctx: usize, tokens_hash: u64) -> Result<()> {
        if self.vocab != vocab {
            bail!("--kl-ref {name}: vocab is {} in the base, {vocab} in this model", self.vocab);
        }
        if self.ctx != ctx {
            bail!("--kl-ref {name}: ctx is {} in the base, --ctx {ctx} in this run", self.ctx);
        }
        if self.tokens_hash != tokens_hash {
            bail!(
                "--kl-ref {name}: tokens differ: the base's {} chunks hash to {:016x}, this text's to {tokens_hash:016x} (another --text, tokenizer or --ctx)",
                self.chunks,
                self.tokens_hash
            );
        }
        Ok(())
    }
}

/// Tokens kept per position of a KL base: 0 (the full distribution) for a vocabulary of at
/// most [`FULL_VOCAB_MAX`] tokens or a `top_k` that covers it, else `top_k`.
pub fn base_top_k(vocab: usize, top_k: usize) -> usize {
    if vocab <= FULL_VOCAB_MAX || top_k >= vocab {
        0
    } else {
        top_k
    }
}

/// Writes a KL base through a temporary file, renamed into place by [`KlBaseWriter::finish`].
pub struct KlBaseWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    header: KlHeader,
    listed: Vec<bool>,
    order: Vec<u32>,
}

impl KlBaseWriter {
    pub fn create(path: &Path, header: KlHeader) -> Result<Self> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let f = File::create(&tmp).with_context(|| format!("--kl-base {}: cannot create", path.display()))?;
        let mut out = BufWriter::new(f);
        out.write_all(&header.to_bytes())?;
        let vocab = header.vocab;
        Ok(Self { path: path.to_path_buf(), tmp, out, header, listed: vec![false; vocab], order: Vec::new() })
    }

    /// One scored position: its logits and the right token.
    pub fn record(&mut self, logits: &[f32], right: u32) -> Result<()> {
        let (max, lse) = log_sum_exp(logits);
        let lp = |v: f32| (v as f64 - max - lse) as f32;
        let o = &mut self.out;
        o.write_all(&argmax(logits).to_le_bytes())?;
        if self.header.top_k == 0 {
            for &v in logits {
                o.write_all(&lp(v).to_le_bytes())?;
            }
        } else {
            let k = self.header.top_k;
            self.order.clear();
            self.order.extend(0..logits.len() as u32);
            let by = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
            self.order.select_nth_unstable_by(k - 1, by);
            self.order[..k].sort_unstable_by(by);
            self.listed.fill(false);
            for &i in &self.order[..k] {
                self.listed[i as usize] = true;
            }
            o.write_all(&lp(logits[right as usize]).to_le_bytes())?;
            o.write_all(&ln_rest(logits, max, lse, &self.listed).to_le_bytes())?;
            for &i in &self.order[..k] {
                o.write_all(&i.to_le_bytes())?;
                o.write_all(&lp(logits[i as usize]).to_le_bytes())?;
            }
        }
        Ok(())
    }

    /// Sets the chunk count actually written (fewer if interrupted) and renames into place.
    pub fn finish(mut self, chunks: usize) -> Result<()> {
        self.header.chunks = chunks;
        self.out.flush()?;
        let mut f = self.out.into_inner().map_err(|e| e.into_error())?;
        // An interruption mid-chunk may have written part of a chunk: cut it off.
        let h = &self.header;
        f.set_len(HEADER_BYTES as u64 + (chunks * scored_per_chunk(h.ctx) * h.record_bytes()) as u64)?;
        f.seek(SeekFrom::Start(0))?;
        f.write_all(&self.header.to_bytes())?;
        f.sync_all()?;
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("--kl-base {}: cannot write", self.path.display()))
    }

    /// Removes the temporary file.
    pub fn abandon(self) {
        let tmp = self.tmp.clone();
        drop(self);
        let _ = std::fs::remove_file(tmp);
    }
}

/// Reads a KL base: the header at once, then one record per scored position.
pub struct KlBaseReader {
    name: String,
    input: BufReader<File>,
    pub header: KlHeader,
    buf: Vec<u8>,
}

impl KlBaseReader {
    pub fn open(path: &Path) -> Result<Self> {
        let name = path.display().to_string();
        let f = File::open(path).with_context(|| format!("--kl-ref {name}: cannot open"))?;
        let len = f.metadata()?.len();
        let mut input = BufReader::new(f);
        let mut h = [0u8; HEADER_BYTES];
        input.read_exact(&mut h).map_err(|_| anyhow::anyhow!("--kl-ref {name}: too short for a KL base header"))?;
        if &h[..8] != KL_MAGIC {
            bail!(
                "--kl-ref {name}: not a KL base (magic {:?}, expected {:?})",
                &h[..8],
                std::str::from_utf8(KL_MAGIC)?
            );
        }
        let u = |i: usize| u32::from_le_bytes(h[8 + 4 * i..12 + 4 * i].try_into().unwrap()) as usize;
        if u(0) != KL_VERSION as usize {
            bail!("--kl-ref {name}: version {} (this build reads {KL_VERSION})", u(0));
        }
        let header = KlHeader {
            vocab: u(1),
            ctx: u(2),
            chunks: u(3),
            top_k: u(4),
            tokens_hash: u64::from_le_bytes(h[28..36].try_into().unwrap()),
        };
        if header.ctx < 3 || header.vocab == 0 {
            bail!("--kl-ref {name}: ctx {} / vocab {} make no sense", header.ctx, header.vocab);
        }
        let want =
            HEADER_BYTES as u64 + (header.chunks * scored_per_chunk(header.ctx)) as u64 * header.record_bytes() as u64;
        if len != want {
            bail!("--kl-ref {name}: {len} bytes, but its header ({} chunks) needs {want}", header.chunks);
        }
        let buf = vec![0; header.record_bytes()];
        Ok(Self { name, input, header, buf })
    }
    fn next(&mut self) -> Result<&[u8]> {
        self.input.read_exact(&mut self.buf).with_context(|| format!("--kl-ref {}: cut short", self.name))?;
        Ok(&self.buf)
    }
}

/// Per-position comparison values, gathered during the run.
#[derive(Default)]
struct KlAccum {
    kl: Vec<f64>,
    dp: Vec<f64>,
    same_top: usize,
    nll_base: Vec<f64>,
    /// This run's NLL from the f32-rounded log-prob, as the base's is stored.
    nll_this: Vec<f64>,
    listed: Vec<bool>,
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

impl KlAccum {
    fn add(&mut self, rec: &[u8], h: &KlHeader, logits: &[f32], right: u32) {
        let (max, lse) = log_sum_exp(logits);
        // This run's log-probs rounded to f32 as the base's are: equal logits, equal bits.
        let lp = |v: f32| (v as f64 - max - lse) as f32 as f64;
        let base_top = u32_at(rec, 0);
        let mut kl = 0.0;
        let lpb_right;
        if h.top_k == 0 {
            for (i, &v) in logits.iter().enumerate() {
                let lpb = f32_at(rec, 4 + 4 * i) as f64;
                let p = lpb.exp();
                if p > 0.0 {
                    kl += p * (lpb - lp(v));
                }
            }
            lpb_right = f32_at(rec, 4 + 4 * right as usize) as f64;
        } else {
            lpb_right = f32_at(rec, 4) as f64;
            let ln_rest_b = f32_at(rec, 8) as f64;
            self.listed.resize(logits.len(), false);
            self.listed.fill(false);
            for j in 0..h.top_k {
                let id = u32_at(rec, 12 + 8 * j) as usize;
                let lpb = f32_at(rec, 16 + 8 * j) as f64;
                self.listed[id.min(logits.len() - 1)] = true;
                kl += lpb.exp() * (lpb - lp(logits[id.min(logits.len() - 1)]));
            }
            let rest_b = ln_rest_b.exp();
            if rest_b > 0.0 {
                kl += rest_b * (ln_rest_b - ln_rest(logits, max, lse, &self.listed) as f64);
            }
        }
        self.kl.push(kl);
        self.dp.push(lp(logits[right as usize]).exp() - lpb_right.exp());
        self.nll_base.push(-lpb_right);
        self.nll_this.push(-lp(logits[right as usize]));
        if argmax(logits) == base_top {
            self.same_top += 1;
        }
    }
}

/// llama.cpp's mean and its uncertainty: sqrt((mean(x²) − mean²) / (n − 1)).
fn mean_and_error(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let m = xs.iter().sum::<f64>() / n;
    let m2 = xs.iter().map(|x| x * x).sum::<f64>() / n;
    let var = m2 - m * m;
    (m, if var > 0.0 && xs.len() > 1 { (var / (n - 1.0)).sqrt() } else { 0.0 })
}

/// Linear interpolation between order statistics at `f · (n − 1)`.
fn quantile(sorted: &[f64], f: f64) -> f64 {
    let p = f * (sorted.len() - 1) as f64;
    let i = p.floor() as usize;
    let t = p - i as f64;
    let j = (i + 1).min(sorted.len() - 1);
    (1.0 - t) * sorted[i] + t * sorted[j]
}

/// Where the KL data go.
pub enum Kl<'a> {
    None,
    /// Record this run as a base.
    Base(&'a mut KlBaseWriter),
    /// Compare with a base (its header already checked by the caller or by [`score`]).
    Ref(&'a mut KlBaseReader, String),
}

/// What [`score`] measured.
#[derive(Debug, Clone)]
pub struct Scored {
    pub chunks: usize,
    pub tokens_scored: usize,
    pub nll_sum: f64,
    pub nll2_sum: f64,
    pub running: Vec<ChunkEstimate>,
    pub complete: bool,
    pub eval_seconds: f64,
    pub kl: Option<KlReport>,
}

impl Scored {
    /// (PPL, standard error) as llama.cpp computes them.
    pub fn estimate(&self) -> (Option<f64>, Option<f64>) {
        estimate(self.nll_sum, self.nll2_sum, self.tokens_scored)
    }
}

fn estimate(nll: f64, nll2: f64, count: usize) -> (Option<f64>, Option<f64>) {
    if count == 0 {
        return (None, None);
    }
    let n = count as f64;
    let mean = nll / n;
    let ppl = mean.exp();
    let var = nll2 / n - mean * mean;
    let se = (count > 1 && var > 0.0).then(|| (var / (n - 1.0)).sqrt() * ppl);
    (Some(ppl), se.or((count > 1).then_some(0.0)))
}

/// The scoring loop: `chunks` chunks of `ctx` tokens from `tokens`.
#[allow(clippy::too_many_arguments)]
pub fn score(
    source: &mut dyn LogitsSource,
    tokens: &[u32],
    ctx: usize,
    chunks: usize,
    add_bos: bool,
    bos: Option<u32>,
    mut kl: Kl<'_>,
    stop: &AtomicBool,
    on_chunk: &mut dyn FnMut(&ChunkEstimate),
) -> Result<Scored> {
    if ctx < 3 {
        bail!("--ctx {ctx}: at least 3 (a chunk scores ctx − ctx/2 − 1 tokens)");
    }
    if chunks == 0 || chunks * ctx > tokens.len() {
        bail!("{} tokens hold {} chunks of {ctx}, not {chunks}", tokens.len(), tokens.len() / ctx);
    }
    let vocab = source.vocab();
    if let Some(t) = tokens[..chunks * ctx].iter().find(|t| **t as usize >= vocab) {
        bail!("token id {t} is outside the model's vocabulary of {vocab}");
    }
    if let Kl::Ref(r, name) = &kl {
        r.header.check(name, vocab, ctx, fed_tokens_hash(tokens, ctx, r.header.chunks, add_bos, bos))?;
        if r.header.chunks != chunks {
            bail!("--kl-ref {name}: the base has {} chunks, this run {chunks} (--chunks)", r.header.chunks);
        }
    }
    let first = ctx / 2;
    let mut out = Scored {
        chunks: 0,
        tokens_scored: 0,
        nll_sum: 0.0,
        nll2_sum: 0.0,
        running: Vec::with_capacity(chunks),
        complete: true,
        eval_seconds: 0.0,
        kl: None,
    };
    let mut acc = KlAccum::default();
    let t_all = Instant::now();
    for i in 0..chunks {
        if stop.load(Ordering::SeqCst) {
            out.complete = false;
            break;
        }
        let fed = fed_chunk(tokens, ctx, i, add_bos, bos);
        // The next token of the text, as llama.cpp scores it (the original, not BOS).
        let text = &tokens[i * ctx..(i + 1) * ctx];
        let (mut nll, mut nll2, mut n) = (0.0f64, 0.0f64, 0usize);
        let acc_len = acc.kl.len();
        let t0 = Instant::now();
        let done = source.chunk(&fed, first, stop, &mut |pos, logits| {
            if pos + 1 >= ctx {
                return Ok(());
            }
            if logits.len() != vocab {
                bail!("logits row of {} values, vocabulary {vocab}", logits.len());
            }
            let right = text[pos + 1];
            let (max, lse) = log_sum_exp(logits);
            let v = max + lse - logits[right as usize] as f64;
            nll += v;
            nll2 += v * v;
            n += 1;
            match &mut kl {
                Kl::None => {}
                Kl::Base(w) => w.record(logits, right)?,
                Kl::Ref(r, _) => {
                    let h = r.header.clone();
                    acc.add(r.next()?, &h, logits, right);
                }
            }
            Ok(())
        })?;
        if !done {
            // Interrupted mid-chunk: its positions count for nothing (a KL base stops at the
            // last whole chunk; see finish).
            acc.kl.truncate(acc_len);
            out.complete = false;
            break;
        }
        if n != scored_per_chunk(ctx) {
            bail!("chunk {}: {n} positions scored, expected {}", i + 1, scored_per_chunk(ctx));
        }
        out.chunks += 1;
        out.tokens_scored += n;
        out.nll_sum += nll;
        out.nll2_sum += nll2;
        let (ppl, se) = out.estimate();
        let e = ChunkEstimate {
            chunk: i + 1,
            perplexity: ppl.expect("tokens were scored"),
            standard_error: se,
            chunk_nll_mean: nll / n as f64,
            seconds: t0.elapsed().as_secs_f64(),
        };
        on_chunk(&e);
        out.running.push(e);
    }
    out.eval_seconds = t_all.elapsed().as_secs_f64();
    if let Kl::Ref(r, name) = &kl {
        if out.complete && !acc.kl.is_empty() {
            out.kl = Some(kl_report(&mut acc, &r.header, name));
        }
    }
    Ok(out)
}

fn kl_report(acc: &mut KlAccum, h: &KlHeader, name: &str) -> KlReport {
    let n = acc.kl.len();
    let (kl_mean, kl_se) = mean_and_error(&acc.kl);
    let (dp_mean, dp_se) = mean_and_error(&acc.dp);
    let dp2: Vec<f64> = acc.dp.iter().map(|d| d * d).collect();
    let (msq, msq_se) = mean_and_error(&dp2);
    let rms = msq.sqrt();
    let (nll_b, nll_b_se) = mean_and_error(&acc.nll_base);
    let same = acc.same_top as f64 / n as f64;
    let mut sorted = acc.kl.clone();
    sorted.sort_by(f64::total_cmp);
    let file = Path::new(name).file_name().map_or(name.to_string(), |f| f.to_string_lossy().into_owned());
    KlReport {
        base_file: file,
        kl_support: h.support(),
        positions: n,
        base_perplexity: nll_b.exp(),
        base_standard_error: nll_b.exp() * nll_b_se,
        // Both sides from f32-rounded log-probs, so a run against its own base gives 0.
        ln_ppl_ratio: acc.nll_this.iter().sum::<f64>() / n as f64 - nll_b,
        kl_mean,
        kl_standard_error: kl_se,
        kl_median: quantile(&sorted, 0.5),
        kl_p10: quantile(&sorted, 0.1),
        kl_p90: quantile(&sorted, 0.9),
        kl_p99: quantile(&sorted, 0.99),
        kl_max: sorted[n - 1],
        same_top: same,
        same_top_standard_error: if n > 1 { (same * (1.0 - same) / (n - 1) as f64).sqrt() } else { 0.0 },
        delta_p_mean: dp_mean,
        delta_p_standard_error: dp_se,
        delta_p_rms: rms,
        delta_p_rms_standard_error: if rms > 0.0 { 0.5 / rms * msq_se } else { 0.0 },
    }
}

/// A perplexity run on the engine. `tokens` is the whole text tokenized once (with BOS where
/// `add_bos`); `on_chunk` gets each running estimate. Identification fields the model does not
/// know (file names, the text's hash) are left empty for the caller.
#[allow(clippy::too_many_arguments)]
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    add_bos: bool,
    bos: Option<u32>,
    opts: &PerplexityOptions,
    kl: Kl<'_>,
    stop: &AtomicBool,
    on_chunk: &mut dyn FnMut(&ChunkEstimate),
) -> Result<PerplexityResult> {
    let available = chunks_available(tokens.len(), opts.ctx);
    let chunks = opts.chunks.map_or(available, |c| c.min(available));
    let mut src = EngineSource::new(model, opts)?;
    let s = score(&mut src, tokens, opts.ctx, chunks, add_bos, bos, kl, stop, on_chunk)?;
    let (ppl, se) = s.estimate();
    let cfg = &model.config;
    Ok(PerplexityResult {
        schema_version: SCHEMA_VERSION,
        perplexity: ppl,
        standard_error: se,
        nll_mean: (s.tokens_scored > 0).then(|| s.nll_sum / s.tokens_scored as f64),
        chunks: s.chunks,
        chunks_available: available,
        ctx: opts.ctx,
        batch: opts.batch.clamp(1, opts.ctx),
        tokens_scored: s.tokens_scored,
        tokens_evaluated: s.chunks * opts.ctx,
        eval_seconds: s.eval_seconds,
        tokens_per_sec: if s.eval_seconds > 0.0 { (s.chunks * opts.ctx) as f64 / s.eval_seconds } else { 0.0 },
        add_bos,
        bos,
        model: ModelId {
            name: cfg.name.clone(),
            vocab: cfg.vocab,
            ffn_activation: cfg.activation.name().to_string(),
            kernel: src.kernel().name(),
            kv: opts.kv.name().to_string(),
            threads: opts.threads,
            ..Default::default()
        },
        text: TextId { tokens: tokens.len(), ..Default::default() },
        running: s.running,
        complete: s.complete,
        kl: s.kl,
    })
}

/// `--ctx` by default: llama-perplexity's.
pub const DEFAULT_CTX: usize = 512;
/// `--kl-top-k` by default.
pub const DEFAULT_KL_TOP_K: usize = 32;

/// What `bitnet-bench perplexity` measures: a text file on a GGUF model (with its tokenizer),
/// the engine's settings, and the KL base to write or compare with. [`prepare`] checks it all.
#[derive(Debug, Clone)]
pub struct TextPerplexityOptions {
    /// A GGUF file with a tokenizer (a preset has none).
    pub model: String,
    /// The text to score (UTF-8).
    pub text: PathBuf,
    /// Tokens per chunk; at most the model's context length.
    pub ctx: usize,
    /// At most this many chunks (`None`: all the text holds).
    pub chunks: Option<usize>,
    /// Tokens per forward call (`None`: min(ctx, 128)).
    pub batch: Option<usize>,
    /// `None`: all available.
    pub threads: Option<usize>,
    pub kv: KvPrecision,
    /// Kernel family of the linear layers, at its best ISA here (`None`: the format's best).
    pub kernel: Option<KernelFamily>,
    /// Overrides the model's FFN gating.
    pub ffn_activation: Option<FfnActivation>,
    /// Save this run's log-probabilities here as a KL base.
    pub kl_base: Option<PathBuf>,
    /// Compare this run with the KL base here.
    pub kl_ref: Option<PathBuf>,
    /// Tokens kept per position in a KL base of a vocabulary larger than [`FULL_VOCAB_MAX`].
    pub kl_top_k: usize,
    /// Where the caller writes the result as JSON: checked writable before the model loads,
    /// so that a long run does not fail only at its end.
    pub json: Option<PathBuf>,
}

impl Default for TextPerplexityOptions {
    /// The command's defaults; `model` and `text` are left empty for the caller.
    fn default() -> Self {
        Self {
            model: String::new(),
            text: PathBuf::new(),
            ctx: DEFAULT_CTX,
            chunks: None,
            batch: None,
            threads: None,
            kv: KvPrecision::F16,
            kernel: None,
            ffn_activation: None,
            kl_base: None,
            kl_ref: None,
            kl_top_k: DEFAULT_KL_TOP_K,
            json: None,
        }
    }
}

/// A checked perplexity run, its model loaded and its KL base open, ready to [`run`]: its
/// figures say what is about to be measured.
///
/// [`run`]: PreparedPerplexity::run
pub struct PreparedPerplexity {
    /// Tokens the whole text encodes to.
    pub tokens: usize,
    /// Chunks to score, and how many the text holds.
    pub chunks: usize,
    pub chunks_available: usize,
    pub options: PerplexityOptions,
    model: Model,
    model_path: PathBuf,
    text_path: PathBuf,
    text: String,
    token_ids: Vec<u32>,
    add_bos: bool,
    bos: Option<u32>,
    kl_base: Option<KlBaseWriter>,
    kl_ref: Option<(KlBaseReader, String)>,
}

/// What [`PreparedPerplexity::run`] gives: the result, and what became of a `kl_base`.
pub struct PerplexityOutcome {
    pub result: PerplexityResult,
    /// A KL base was asked for but no chunk finished, so none was written.
    pub kl_base_empty: bool,
}

/// Checks every input (files, tokenizer, ctx, text length, KL base) before the model loads,
/// then loads it and opens the KL base. Errors name the flag (`--ctx`, `--kl-ref`, ...).
pub fn prepare(o: &TextPerplexityOptions) -> Result<PreparedPerplexity> {
    use crate::model_cmds;
    let threads = o.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        bail!("--threads must be ≥ 1");
    }
    if o.ctx < 3 {
        bail!("--ctx {}: at least 3 (a chunk scores ctx − ctx/2 − 1 tokens)", o.ctx);
    }
    let batch = o.batch.unwrap_or(o.ctx.min(128));
    if batch == 0 || batch > o.ctx {
        bail!("--batch {batch}: between 1 and --ctx ({})", o.ctx);
    }
    if o.chunks == Some(0) {
        bail!("--chunks must be ≥ 1");
    }
    if o.kl_top_k == 0 {
        bail!("--kl-top-k must be ≥ 1");
    }
    for (flag, p) in [("--json", &o.json), ("--kl-base", &o.kl_base)] {
        if let Some(p) = p {
            model_cmds::check_writable(p).with_context(|| flag.to_string())?;
        }
    }
    let text = model_cmds::read_text(&o.text, "--text")?;
    let model_path = match model_cmds::resolve(&o.model)? {
        model_cmds::ModelSource::Gguf(p) => p,
        model_cmds::ModelSource::Preset(_) => bail!(
            "--model {}: a preset has no tokenizer (metadata key tokenizer.ggml.model); give a GGUF file",
            o.model
        ),
    };
    let tokenizer = model_cmds::tokenizer(&o.model)?;
    let max_context = bitnet_engine::gguf::read_config(&model_path)
        .with_context(|| format!("--model {}", model_path.display()))?
        .max_context;
    if o.ctx > max_context {
        bail!("--ctx {}: the model's context length is {max_context}", o.ctx);
    }
    let (add_bos, bos) = (tokenizer.add_bos(), tokenizer.bos());
    let tokens = tokenizer.encode(&text, true, false);
    if tokens.len() < 2 * o.ctx {
        bail!(
            "--text {}: {} tokens; --ctx {} needs at least {} (2 × ctx, llama-perplexity's rule)",
            o.text.display(),
            tokens.len(),
            o.ctx,
            2 * o.ctx
        );
    }
    let available = chunks_available(tokens.len(), o.ctx);
    let mut chunks = o.chunks.map_or(available, |c| c.min(available));
    let kl_ref = match &o.kl_ref {
        None => None,
        Some(p) => {
            let r = KlBaseReader::open(p)?;
            if r.header.chunks > available || o.chunks.is_some_and(|c| c != r.header.chunks) {
                bail!(
                    "--kl-ref {}: the base has {} chunks; this run has {} (--chunks, or the text holds {available})",
                    p.display(),
                    r.header.chunks,
                    chunks
                );
            }
            chunks = r.header.chunks;
            let hash = fed_tokens_hash(&tokens, o.ctx, chunks, add_bos, bos);
            r.header.check(&p.display().to_string(), tokenizer.vocab_size(), o.ctx, hash)?;
            Some((r, p.display().to_string()))
        }
    };
    let kernel = o
        .kernel
        .map(|f| {
            let isa = Kernel::best(f).isa();
            Kernel::new(f, isa, f.default_form(isa)).with_context(|| format!("--kernel {f}"))
        })
        .transpose()?;
    let (model, _) = model_cmds::load(&o.model, WeightFormat::I2, 42, threads, o.ffn_activation)?;
    if model.config.vocab != tokenizer.vocab_size() {
        bail!(
            "--model {}: the tokenizer has {} tokens, the model's output {}",
            model_path.display(),
            tokenizer.vocab_size(),
            model.config.vocab
        );
    }
    let kl_base = match &o.kl_base {
        None => None,
        Some(p) => Some(KlBaseWriter::create(
            p,
            KlHeader {
                vocab: model.config.vocab,
                ctx: o.ctx,
                chunks,
                top_k: base_top_k(model.config.vocab, o.kl_top_k),
                tokens_hash: fed_tokens_hash(&tokens, o.ctx, chunks, add_bos, bos),
            },
        )?),
    };
    Ok(PreparedPerplexity {
        tokens: tokens.len(),
        chunks,
        chunks_available: available,
        options: PerplexityOptions {
            ctx: o.ctx,
            chunks: Some(chunks),
            batch,
            threads,
            kv: o.kv,
            kernel,
            kl_top_k: o.kl_top_k,
        },
        model,
        model_path,
        text_path: o.text.clone(),
        text,
        token_ids: tokens,
        add_bos,
        bos,
        kl_base,
        kl_ref,
    })
}

impl PreparedPerplexity {
    /// Scores the chunks (`on_chunk` gets each running estimate) until done or `stop` is set,
    /// writes the KL base if one was asked for and a chunk finished (else removes it), and
    /// fills in the model's and the text's file names, sizes and hash.
    pub fn run(self, stop: &AtomicBool, on_chunk: &mut dyn FnMut(&ChunkEstimate)) -> Result<PerplexityOutcome> {
        let Self {
            options, model, model_path, text_path, text, token_ids, add_bos, bos, mut kl_base, mut kl_ref, ..
        } = self;
        let kl = match (&mut kl_base, &mut kl_ref) {
            (Some(w), _) => Kl::Base(w),
            (_, Some((r, name))) => Kl::Ref(r, name.clone()),
            _ => Kl::None,
        };
        let result = perplexity(&model, &token_ids, add_bos, bos, &options, kl, stop, on_chunk);
        let mut result = match result {
            Ok(r) => r,
            Err(e) => {
                if let Some(w) = kl_base {
                    w.abandon();
                }
                return Err(e);
            }
        };
        let mut kl_base_empty = false;
        if let Some(w) = kl_base {
            if result.chunks == 0 {
                w.abandon();
                kl_base_empty = true;
            } else {
                w.finish(result.chunks)?;
            }
        }
        use sha2::Digest;
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        result.model.file = name(&model_path);
        result.model.file_bytes = std::fs::metadata(&model_path).map_or(0, |m| m.len());
        result.text.file = name(&text_path);
        result.text.bytes = text.len() as u64;
        result.text.sha256 = sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        Ok(PerplexityOutcome { result, kl_base_empty })
    }
}

/// The text summary printed after the run (also on interruption).
pub fn summary(r: &PerplexityResult) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    match (r.perplexity, r.standard_error) {
        (Some(p), Some(e)) => {
            let _ = writeln!(s, "Final estimate: PPL = {p:.4} +/- {e:.5}");
        }
        (Some(p), None) => {
            let _ = writeln!(s, "Final estimate: PPL = {p:.4}");
        }
        _ => {
            let _ = writeln!(s, "Final estimate: none (no chunk finished)");
        }
    }
    let per = scored_per_chunk(r.ctx);
    let _ = writeln!(
        s,
        "{} tokens scored ({} of {} chunks × {per}, ctx {}), {:.1} tokens/s evaluated ({} tokens in {:.2} s){}",
        r.tokens_scored,
        r.chunks,
        r.chunks_available,
        r.ctx,
        r.tokens_per_sec,
        r.tokens_evaluated,
        r.eval_seconds,
        if r.complete { "" } else { " — INTERRUPTED, partial" }
    );
    if let Some(k) = &r.kl {
        let _ = writeln!(s, "KL divergence vs {} ({}, {} positions):", k.base_file, k.kl_support, k.positions);
        let _ = writeln!(s, "  Mean PPL(base)      : {:10.6} ± {:.6}", k.base_perplexity, k.base_standard_error);
        let _ = writeln!(s, "  ln(PPL/PPL(base))   : {:10.6}", k.ln_ppl_ratio);
        let _ = writeln!(s, "  Mean    KLD         : {:10.6} ± {:.6}", k.kl_mean, k.kl_standard_error);
        let _ = writeln!(s, "  99.0%   KLD         : {:10.6}", k.kl_p99);
        let _ = writeln!(s, "  90.0%   KLD         : {:10.6}", k.kl_p90);
        let _ = writeln!(s, "  Median  KLD         : {:10.6}", k.kl_median);
        let _ = writeln!(s, "  10.0%   KLD         : {:10.6}", k.kl_p10);
        let _ = writeln!(s, "  Maximum KLD         : {:10.6}", k.kl_max);
        let _ = writeln!(
            s,
            "  Same top p          : {:7.3} ± {:.3} %",
            100.0 * k.same_top,
            100.0 * k.same_top_standard_error
        );
        let _ = writeln!(
            s,
            "  Mean    Δp          : {:7.3} ± {:.3} %",
            100.0 * k.delta_p_mean,
            100.0 * k.delta_p_standard_error
        );
        let _ = writeln!(
            s,
            "  RMS Δp              : {:7.3} ± {:.3} %",
            100.0 * k.delta_p_rms,
            100.0 * k.delta_p_rms_standard_error
        );
    }
    s
}

/// One running-estimate line: `[3/8] PPL 12.3456 ± 0.4321 (chunk NLL 2.5012, 0.41 s)`.
pub fn chunk_line(e: &ChunkEstimate, chunks: usize) -> String {
    let se = e.standard_error.map_or(String::new(), |s| format!(" ± {s:.4}"));
    format!(
        "[{}/{chunks}] PPL {:.4}{se} (chunk NLL {:.4}, {:.2} s)",
        e.chunk, e.perplexity, e.chunk_nll_mean, e.seconds
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits given by a closure of (fed tokens, position, vocab index); records what it was fed.
    struct Fake<F: Fn(&[u32], usize, usize) -> f32> {
        vocab: usize,
        f: F,
        fed: Vec<Vec<u32>>,
    }

    impl<F: Fn(&[u32], usize, usize) -> f32> LogitsSource for Fake<F> {
        fn vocab(&self) -> usize {
            self.vocab
        }
        fn chunk(
            &mut self,
            tokens: &[u32],
            first: usize,
            _stop: &AtomicBool,
            row: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
        ) -> Result<bool> {
            self.fed.push(tokens.to_vec());
            for pos in first..tokens.len() {
                let l: Vec<f32> = (0..self.vocab).map(|v| (self.f)(tokens, pos, v)).collect();
                row(pos, &l)?;
            }
            Ok(true)
        }
    }

    fn go<F: Fn(&[u32], usize, usize) -> f32>(
        src: &mut Fake<F>,
        tokens: &[u32],
        ctx: usize,
        chunks: usize,
        kl: Kl<'_>,
    ) -> Scored {
        score(src, tokens, ctx, chunks, true, Some(1), kl, &AtomicBool::new(false), &mut |_| {}).unwrap()
    }

    /// A fresh scratch directory per test, removed when dropped (pass or fail), so tests
    /// running in parallel never share files.
    fn scratch() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("bitnet-ppl-unit-").tempdir().unwrap()
    }

    #[test]
    fn ppl_and_standard_error_match_a_hand_computation() {
        // Vocabulary 4; logit of token v at position p is (v * (p + 1)) % 5 as a float, so
        // probabilities differ per position; two chunks of ctx 6 (score positions 3 and 4).
        let vocab = 4;
        let logit = |pos: usize, v: usize| ((v * (pos + 1)) % 5) as f32;
        let tokens: Vec<u32> = vec![1, 2, 3, 0, 1, 2, 3, 3, 2, 1, 0, 2, 3];
        let mut src = Fake { vocab, f: |_: &[u32], p: usize, v: usize| logit(p, v), fed: vec![] };
        let s = go(&mut src, &tokens, 6, 2, Kl::None);
        // By hand: positions 3..=4 of each chunk predict the next token of the text.
        let mut nlls = Vec::new();
        for c in 0..2 {
            for pos in 3..=4 {
                let z: f64 = (0..vocab).map(|v| (logit(pos, v) as f64).exp()).sum();
                let right = tokens[c * 6 + pos + 1] as usize;
                nlls.push(-((logit(pos, right) as f64).exp() / z).ln());
            }
        }
        let n = nlls.len() as f64;
        let mean = nlls.iter().sum::<f64>() / n;
        let var = nlls.iter().map(|x| x * x).sum::<f64>() / n - mean * mean;
        let ppl = mean.exp();
        let se = ppl * (var / (n - 1.0)).sqrt();
        let (p, e) = s.estimate();
        assert_eq!((s.chunks, s.tokens_scored), (2, 4));
        assert!((p.unwrap() - ppl).abs() < 1e-12 * ppl, "{p:?} vs {ppl}");
        assert!((e.unwrap() - se).abs() < 1e-12 * se.max(1e-300), "{e:?} vs {se}");
        // Each chunk starts with BOS (id 1) in place of its first token; the rest is the text.
        assert_eq!(src.fed, vec![vec![1, 2, 3, 0, 1, 2], vec![1, 3, 2, 1, 0, 2]]);
        assert_eq!(s.running.len(), 2);
        assert!((s.running[1].perplexity - ppl).abs() < 1e-12 * ppl);
    }

    #[test]
    fn uniform_logits_give_the_vocabulary_size_and_zero_error() {
        let mut src = Fake { vocab: 7, f: |_: &[u32], _, _| 0.5, fed: vec![] };
        let tokens: Vec<u32> = (0..40).map(|i| i % 7).collect();
        let s = go(&mut src, &tokens, 8, 5, Kl::None);
        let (p, e) = s.estimate();
        assert!((p.unwrap() - 7.0).abs() < 1e-12);
        // llama.cpp's mean(nll²) − mean² leaves only rounding here.
        assert!(e.unwrap() < 1e-6, "{e:?}");
        assert_eq!(s.tokens_scored, 5 * 3);
    }

    #[test]
    fn kl_against_its_own_base_is_zero_and_against_other_logits_is_the_exact_kl() {
        // Vocabulary 5000 > FULL_VOCAB_MAX: the base keeps the top 8 + rest.
        let vocab = 5000;
        let base_logit = |pos: usize, v: usize| (((v * 7919 + pos * 31) % 1000) as f32) / 100.0;
        let tokens: Vec<u32> = (0..64u32).map(|i| (i * 37) % 5000).collect();
        let k = base_top_k(vocab, 8);
        assert_eq!(k, 8);
        let dir = scratch();
        for (top_k, path) in [(k, dir.path().join("topk.kl")), (0, dir.path().join("full.kl"))] {
            let hash = fed_tokens_hash(&tokens, 16, 4, true, Some(1));
            let h = KlHeader { vocab, ctx: 16, chunks: 4, top_k, tokens_hash: hash };
            let mut w = KlBaseWriter::create(&path, h).unwrap();
            let mut src = Fake { vocab, f: |_: &[u32], p, v| base_logit(p, v), fed: vec![] };
            let base = go(&mut src, &tokens, 16, 4, Kl::Base(&mut w));
            w.finish(4).unwrap();
            // Against itself: exactly 0 and the same top token everywhere.
            let mut r = KlBaseReader::open(&path).unwrap();
            let mut src = Fake { vocab, f: |_: &[u32], p, v| base_logit(p, v), fed: vec![] };
            let s = go(&mut src, &tokens, 16, 4, Kl::Ref(&mut r, "b".into()));
            let kl = s.kl.unwrap();
            assert_eq!(kl.kl_support, if top_k == 0 { "full" } else { "top-8 + rest" });
            assert_eq!((kl.kl_mean, kl.kl_max, kl.same_top, kl.delta_p_rms), (0.0, 0.0, 1.0, 0.0));
            assert_eq!(kl.positions, 4 * 7);
            assert!((kl.base_perplexity / base.estimate().0.unwrap() - 1.0).abs() < 1e-6);
            // Against shifted logits: the KL by hand over the same support.
            let other = |p: usize, v: usize| base_logit(p, v) + if v.is_multiple_of(3) { 2.0 } else { 0.0 };
            let mut r = KlBaseReader::open(&path).unwrap();
            let mut src = Fake { vocab, f: |_: &[u32], p, v| other(p, v), fed: vec![] };
            let s = go(&mut src, &tokens, 16, 4, Kl::Ref(&mut r, "b".into()));
            let kl = s.kl.unwrap();
            let mut want = Vec::new();
            for _c in 0..4 {
                for pos in 8..15 {
                    let lp = |f: &dyn Fn(usize, usize) -> f32| {
                        let z: f64 = (0..vocab).map(|v| (f(pos, v) as f64).exp()).sum();
                        (0..vocab).map(|v| f(pos, v) as f64 - z.ln()).collect::<Vec<f64>>()
                    };
                    let (pb, pt) = (lp(&base_logit), lp(&other));
                    let mut ids: Vec<usize> = (0..vocab).collect();
                    ids.sort_by(|a, b| pb[*b].total_cmp(&pb[*a]).then(a.cmp(b)));
                    let keep = if top_k == 0 { vocab } else { top_k };
                    let mut d = 0.0;
                    for &i in &ids[..keep] {
                        d += pb[i].exp() * (pb[i] - pt[i]);
                    }
                    let rb: f64 = ids[keep..].iter().map(|&i| pb[i].exp()).sum();
                    let rt: f64 = ids[keep..].iter().map(|&i| pt[i].exp()).sum();
                    if rb > 0.0 {
                        d += rb * (rb.ln() - rt.ln());
                    }
                    want.push(d);
                }
            }
            let mean = want.iter().sum::<f64>() / want.len() as f64;
            assert!(mean > 1e-3, "{mean}");
            assert!((kl.kl_mean - mean).abs() < 1e-5 * mean, "{} vs {mean} ({top_k})", kl.kl_mean);
            assert!(kl.kl_mean > 0.0 && kl.delta_p_rms > 0.0);
        }
    }

    #[test]
    fn a_base_from_other_tokens_or_ctx_is_refused_naming_the_field() {
        let vocab = 10;
        let tokens: Vec<u32> = (0..40u32).map(|i| i % 10).collect();
        let dir = scratch();
        let path = dir.path().join("refuse.kl");
        let h =
            KlHeader { vocab, ctx: 8, chunks: 3, top_k: 0, tokens_hash: fed_tokens_hash(&tokens, 8, 3, true, Some(1)) };
        let mut w = KlBaseWriter::create(&path, h).unwrap();
        let mut src = Fake { vocab, f: |_: &[u32], p, v| (p * v % 3) as f32, fed: vec![] };
        go(&mut src, &tokens, 8, 3, Kl::Base(&mut w));
        w.finish(3).unwrap();
        let run = |toks: &[u32], ctx: usize, chunks: usize| {
            let mut r = KlBaseReader::open(&path).unwrap();
            let mut src = Fake { vocab, f: |_: &[u32], p, v| (p * v % 3) as f32, fed: vec![] };
            let stop = AtomicBool::new(false);
            score(&mut src, toks, ctx, chunks, true, Some(1), Kl::Ref(&mut r, "b.kl".into()), &stop, &mut |_| {})
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(run(&tokens, 8, 3), Ok(()));
        let mut other = tokens.clone();
        other[20] = 9 - other[20];
        assert!(run(&other, 8, 3).unwrap_err().contains("tokens differ"));
        assert!(run(&tokens, 10, 3).unwrap_err().contains("ctx is 8 in the base, --ctx 10"));
        assert!(run(&tokens, 8, 2).unwrap_err().contains("the base has 3 chunks"));
        // A file that is not a base.
        let junk = dir.path().join("junk.kl");
        std::fs::write(&junk, b"hello world, this is not a base file at all....").unwrap();
        let e = KlBaseReader::open(&junk).err().unwrap().to_string();
        assert!(e.contains("not a KL base"), "{e}");
    }

    #[test]
    fn quantiles_interpolate_and_errors_follow_llama_cpp() {
        let v: Vec<f64> = (0..11).map(|i| i as f64).collect();
        assert_eq!((quantile(&v, 0.5), quantile(&v, 0.99), quantile(&v, 0.1)), (5.0, 9.9, 1.0));
        let (m, e) = mean_and_error(&[1.0, 3.0]);
        // mean 2, mean of squares 5, variance 1, / (n − 1) = 1.
        assert_eq!((m, e), (2.0, 1.0));
    }
}
