//! Kernel throughput sweep: every kernel on one model's matrix shapes (BitNet b1.58 2B4T's by
//! default), in cache and streaming from DRAM, quoted against the memory-bandwidth probe and the
//! scalar oracle measured in the same run (these machines are shared and noisy: ratios, not
//! absolutes). Also the LM head as llama.cpp's quantizer stores it (Q6_K rows, vocabulary ×
//! hidden), a sizeable share of a decode step.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bitnet_engine::formats::Q6kRows;
use bitnet_engine::matmul::{q6k_groups_used, q6k_rows_matmul};
use bitnet_engine::probes::bandwidth::{measure_read_bandwidth, BandwidthReport};
use bitnet_engine::probes::compute_peak::{self, ComputePeakReport};
use bitnet_engine::{ActivationBatch, IsaLevel, Kernel, KernelFamily, KernelScratch, ModelConfig, PackedWeights};

/// The preset whose linear-layer shapes the sweep runs unless told otherwise.
pub const DEFAULT_SHAPES: &str = "bitnet-b1.58-2b-4t";

/// The linear-layer shapes (name, N outputs, K inputs) of the preset `name`.
pub fn preset_shapes(name: &str) -> Result<Vec<(String, usize, usize)>> {
    Ok(ModelConfig::preset(name).with_context(|| format!("--shapes {name}"))?.linear_shapes())
}

/// The LM head's shape (vocabulary rows, hidden columns) of the preset `name`.
pub fn preset_head(name: &str) -> Result<(usize, usize)> {
    let c = ModelConfig::preset(name).with_context(|| format!("--shapes {name}"))?;
    Ok((c.vocab, c.hidden))
}

/// Rows of the head's in-cache case: 2048 × 2560 Q6_K is 4.3 MB, in the LLC like the linear
/// shapes' in-cache cases.
pub const HEAD_CACHE_ROWS: usize = 2048;

/// Name of the head's kernel at an ISA level on `batch` tokens, as the table shows it: the
/// level whose code runs. AVX-512 has its own kernel from two tokens (`q6k_groups_used`); one
/// token there runs the AVX2 loop and is named so.
pub fn head_kernel_name(isa: IsaLevel, batch: usize) -> String {
    format!("q6k_head/{}", head_kernel_isa(isa, batch).name())
}

/// The level whose head kernel runs at `isa` on `batch` tokens (see [`head_kernel_name`]).
pub fn head_kernel_isa(isa: IsaLevel, batch: usize) -> IsaLevel {
    if q6k_groups_used(isa, batch) {
        IsaLevel::Avx512
    } else if isa >= IsaLevel::Avx2 {
        IsaLevel::Avx2
    } else {
        IsaLevel::Scalar
    }
}

/// `batch` tokens of activations for the head at `isa`, with the offsets its AVX-512 kernel
/// reads where it runs (as the model builds them; the matrix's 16-row groups are made too).
fn head_activations(isa: IsaLevel, batch: usize, hidden: usize) -> Result<ActivationBatch> {
    let mut x = activations(batch, hidden)?;
    if q6k_groups_used(isa, batch) {
        x.build_q6k_offsets();
    }
    Ok(x)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// Batch sizes (B).
    pub batches: Vec<usize>,
    /// Kernels to run (default: every kernel this CPU supports).
    pub kernels: Vec<Kernel>,
    /// Minimum measuring time per case.
    pub min_time: Duration,
    /// Timed samples per case (median reported).
    pub samples: usize,
    /// Bytes of weights in the streaming case (0 = skip it).
    pub streaming_bytes: usize,
    /// Bytes of the bandwidth probe buffer.
    pub probe_bytes: usize,
    /// Shapes to run in cache (name, N, K); the streaming case uses the one with most weights.
    pub shapes: Vec<(String, usize, usize)>,
    /// The LM head's (vocabulary, hidden), or None to skip it: [`HEAD_CACHE_ROWS`] rows in
    /// cache at each of `head_isas` (scalar included: the head's own oracle), and the whole head
    /// streamed at the fastest of them.
    pub head: Option<(usize, usize)>,
    /// ISA levels of the head's runs.
    pub head_isas: Vec<IsaLevel>,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            batches: vec![1, 8],
            kernels: Kernel::all_supported(),
            min_time: Duration::from_millis(40),
            samples: 7,
            streaming_bytes: 512 << 20,
            probe_bytes: bitnet_engine::probes::bandwidth::DEFAULT_PROBE_BYTES,
            shapes: preset_shapes(DEFAULT_SHAPES).expect("a known preset"),
            head: Some(preset_head(DEFAULT_SHAPES).expect("a known preset")),
            head_isas: vec![IsaLevel::Scalar, IsaLevel::best()],
        }
    }
}

/// One measured case.
#[derive(Debug, Clone)]
pub struct KernelResult {
    pub kernel: String,
    /// The ISA level whose code ran (the one in `kernel`'s name).
    pub isa: IsaLevel,
    /// The weight format's name (`WeightFormat::name`, or `q6_k` for the head).
    pub format: String,
    pub shape: String,
    pub rows: usize,
    pub cols: usize,
    pub batch: usize,
    /// Whether weights streamed from DRAM (a set larger than the LLC) or stayed in cache.
    pub streaming: bool,
    /// Packed weight bytes read per call.
    pub bytes_per_call: usize,
    /// Median seconds per call.
    pub secs_per_call: f64,
    /// Packed weight bytes per second / 1e9.
    pub gbps: f64,
    /// Weight rows × batch per second (row-vector products per second).
    pub row_products_per_sec: f64,
}

impl KernelResult {
    /// G multiply-adds per second: rows × columns × batch a call.
    pub fn gmacs(&self) -> f64 {
        (self.rows * self.cols * self.batch) as f64 / self.secs_per_call / 1e9
    }
}

/// Everything one sweep measured.
#[derive(Debug, Clone)]
pub struct SweepReport {
    /// Bandwidth probes before and after the kernels ran (shared machines drift; the roofline
    /// is the better of the two, so percentages are never flattered by one slow probe).
    pub probes: Vec<BandwidthReport>,
    /// One thread's int8 multiply-add peak at each SIMD level the cases ran, measured before
    /// them (the compute roofline of the batched cases).
    pub peaks: Vec<ComputePeakReport>,
    pub results: Vec<KernelResult>,
}

impl SweepReport {
    /// The roofline: the best probe's GB/s.
    pub fn roofline_gbps(&self) -> f64 {
        self.probes.iter().map(|p| p.best_gbps).fold(0.0, f64::max)
    }

    /// The int8 peak (G multiply-adds/s, one thread) at `isa`, if measured.
    pub fn peak_gmacs(&self, isa: IsaLevel) -> Option<f64> {
        self.peaks.iter().find(|p| p.isa == isa).map(|p| p.best_gmacs)
    }
}

fn activations(batch: usize, cols: usize) -> Result<ActivationBatch> {
    let mut g = bitnet_engine::rng::SplitMix64::new(42);
    let x: Vec<f32> = (0..batch * cols).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
    let mut a = ActivationBatch::new(batch, cols)?;
    a.quantize(&x)?;
    a.build_planes();
    Ok(a)
}

/// Median seconds per call of `f`, each sample running it enough times to last `min_time`.
fn time_calls(min_time: Duration, samples: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up (and page-in)
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < min_time / 4 || calls == 0 {
        f()?;
        calls += 1;
    }
    let per_call = start.elapsed().as_secs_f64() / calls as f64;
    let reps = ((min_time.as_secs_f64() / per_call).ceil() as u64).max(1);
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        for _ in 0..reps {
            f()?;
        }
        v.push(t.elapsed().as_secs_f64() / reps as f64);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// [`time_calls`] of `f(i)` over copies `i` = 0, 1, … in turn, so that each call finds its
/// weights evicted from the LLC by the others (as batch-1 decode does); at least 200 ms a sample.
fn time_streamed(opts: &SweepOptions, copies: usize, mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    let mut i = 0usize;
    time_calls(opts.min_time.max(Duration::from_millis(200)), opts.samples, || {
        i = (i + 1) % copies;
        f(i)
    })
}

fn result(kernel: Kernel, w: &PackedWeights, shape: &str, batch: usize, streaming: bool, secs: f64) -> KernelResult {
    let bytes = kernel.bytes_read(w);
    KernelResult {
        kernel: kernel.name(),
        isa: kernel.isa(),
        format: w.format().name().to_string(),
        shape: shape.to_string(),
        rows: w.rows(),
        cols: w.cols(),
        batch,
        streaming,
        bytes_per_call: bytes,
        secs_per_call: secs,
        gbps: bytes as f64 / secs / 1e9,
        row_products_per_sec: (w.rows() * batch) as f64 / secs,
    }
}

/// Runs the sweep; `progress` gets one line per finished case.
pub fn run(opts: &SweepOptions, mut progress: impl FnMut(&KernelResult)) -> Result<SweepReport> {
    if opts.batches.contains(&0) {
        bail!("--batch: batch sizes must be ≥ 1, got {:?}", opts.batches);
    }
    let mut probes = vec![measure_read_bandwidth(opts.probe_bytes, 1, 5, false).context("bandwidth probe")?];
    let mut levels: Vec<IsaLevel> = opts.kernels.iter().map(|k| k.isa()).collect();
    if opts.head.is_some() {
        for &isa in &opts.head_isas {
            levels.extend(opts.batches.iter().map(|&b| head_kernel_isa(isa, b)));
        }
    }
    levels.sort();
    levels.dedup();
    let peaks = levels
        .into_iter()
        .filter(|&isa| compute_peak::loop_of(isa).is_some())
        .map(|isa| compute_peak::measure_int8_peak(isa, 1, 5, false).context("compute probe"))
        .collect::<Result<Vec<_>>>()?;
    let mut results = Vec::new();
    let mut scratch = KernelScratch::new();
    for (name, n, k) in &opts.shapes {
        for kernel in &opts.kernels {
            let format = kernel.family().native_format();
            let w = format.random(*n, *k, 0.02, 7)?;
            kernel.prepare(&w);
            for &b in &opts.batches {
                // What runs at this batch (the lut form runs its fused form above LUT_MAX_BATCH
                // tokens): labelled as such, and measured once if both forms were selected.
                let ran = kernel.for_batch(b);
                if results.iter().any(|r: &KernelResult| r.kernel == ran.name() && r.shape == *name && r.batch == b) {
                    continue;
                }
                let x = activations(b, *k)?;
                let mut out = vec![0f32; n * b];
                // The oracle is ~100× slower: give it one short sample set.
                let (min_time, samples) = if kernel.family() == KernelFamily::Scalar {
                    (Duration::from_millis(1), 3)
                } else {
                    (opts.min_time, opts.samples)
                };
                let secs =
                    time_calls(min_time, samples, || Ok(kernel.matmul(&w, &x, 0..*n, &mut out, &mut scratch)?))?;
                let r = result(ran, &w, name, b, false, secs);
                progress(&r);
                results.push(r);
            }
        }
    }
    if opts.streaming_bytes > 0 {
        // The largest shape (the first of equals: gate/up), enough distinct matrices that the set
        // is ≫ LLC: each call reads weights the previous ~500 MiB of calls have evicted, as
        // batch-1 decode does.
        let Some(&(_, n, k)) = opts.shapes.iter().rev().max_by_key(|(_, n, k)| n * k) else {
            bail!("no shapes to run");
        };
        // Each family's best kernel (best ISA, default form) among those selected.
        let mut best: Vec<Kernel> = opts
            .kernels
            .iter()
            .filter(|k| k.family() != KernelFamily::Scalar && k.form() == k.family().default_form(k.isa()))
            .copied()
            .collect();
        best.sort_by_key(|k| (k.family().name(), std::cmp::Reverse(k.isa())));
        best.dedup_by_key(|k| k.family());
        for kernel in best {
            let format = kernel.family().native_format();
            let one = format.random(n, k, 0.02, 0)?;
            kernel.prepare(&one); // the copies below copy the repack too
            let count = opts.streaming_bytes.div_ceil(one.byte_len()).max(2);
            // Distinct copies in memory; kernel timing does not depend on the values.
            let set: Vec<PackedWeights> = vec![one; count];
            for &b in &opts.batches {
                let x = activations(b, k)?;
                let mut out = vec![0f32; n * b];
                let secs = time_streamed(opts, set.len(), |i| {
                    Ok(kernel.matmul(&set[i], &x, 0..n, &mut out, &mut scratch)?)
                })?;
                let r = result(kernel.for_batch(b), &set[0], &format!("stream {count}x {n}x{k}"), b, true, secs);
                progress(&r);
                results.push(r);
            }
        }
    }
    if let Some((vocab, hidden)) = opts.head {
        head_cases(opts, vocab, hidden, &mut |r| {
            progress(&r);
            results.push(r);
        })?;
    }
    probes.push(measure_read_bandwidth(opts.probe_bytes, 1, 5, false).context("bandwidth probe")?);
    Ok(SweepReport { probes, peaks, results })
}

/// The LM head's cases (see [`SweepOptions::head`]).
fn head_cases(opts: &SweepOptions, vocab: usize, hidden: usize, push: &mut impl FnMut(KernelResult)) -> Result<()> {
    let mut isas: Vec<IsaLevel> = opts.head_isas.clone();
    isas.sort();
    isas.dedup();
    let case = |m: &Q6kRows, isa: IsaLevel, shape: &str, b: usize, streaming: bool, secs: f64| KernelResult {
        kernel: head_kernel_name(isa, b),
        isa: head_kernel_isa(isa, b),
        format: "q6_k".to_string(),
        shape: shape.to_string(),
        rows: m.rows(),
        cols: m.cols(),
        batch: b,
        streaming,
        bytes_per_call: m.byte_len(),
        secs_per_call: secs,
        gbps: m.byte_len() as f64 / secs / 1e9,
        row_products_per_sec: (m.rows() * b) as f64 / secs,
    };
    let rows = HEAD_CACHE_ROWS.min(vocab);
    let m = Q6kRows::random(rows, hidden, 0.02, 7)?;
    // As a batched model state does: AVX-512 multiplies batches on the 16-row groups.
    m.prepare_groups();
    let shape = format!("head {rows}x{hidden}");
    for (i, &isa) in isas.iter().enumerate() {
        for &b in &opts.batches {
            // A level that runs a lower one's code on this batch (AVX-512 on one token) was
            // measured under that name already.
            if isas[..i].iter().any(|&lower| head_kernel_name(lower, b) == head_kernel_name(isa, b)) {
                continue;
            }
            let x = head_activations(isa, b, hidden)?;
            let mut out = vec![0f32; rows * b];
            let (min_time, samples) =
                if isa == IsaLevel::Scalar { (Duration::from_millis(1), 3) } else { (opts.min_time, opts.samples) };
            let secs = time_calls(min_time, samples, || Ok(q6k_rows_matmul(isa, &m, &x, 0..rows, &mut out)?))?;
            push(case(&m, isa, &shape, b, false, secs));
        }
    }
    // The whole head, streamed as in decode, at the fastest level (the scalar loop streamed
    // would take seconds per call). Copies up to the streaming size, at least two, so no call
    // finds its head in the LLC (large's head is 40 MB).
    let fastest = *isas.last().expect("at least one level");
    if opts.streaming_bytes == 0 || fastest == IsaLevel::Scalar {
        return Ok(());
    }
    let one = Q6kRows::random(vocab, hidden, 0.02, 0)?;
    if opts.batches.iter().any(|&b| q6k_groups_used(fastest, b)) {
        one.prepare_groups();
    }
    let count = opts.streaming_bytes.div_ceil(one.byte_len()).max(2);
    let set: Vec<Q6kRows> = vec![one; count];
    let shape = format!("stream {count}x head {vocab}x{hidden}");
    for &b in &opts.batches {
        let x = head_activations(fastest, b, hidden)?;
        let mut out = vec![0f32; vocab * b];
        let secs = time_streamed(opts, set.len(), |i| Ok(q6k_rows_matmul(fastest, &set[i], &x, 0..vocab, &mut out)?))?;
        push(case(&set[0], fastest, &shape, b, true, secs));
    }
    Ok(())
}

/// A plain-text table of a sweep, with ratios against the probe and the oracle.
pub fn table(report: &SweepReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let bw = report.roofline_gbps();
    let p = &report.probes[0];
    let each: Vec<String> = report.probes.iter().map(|p| format!("{:.1}", p.best_gbps)).collect();
    let _ = writeln!(
        s,
        "memory read bandwidth (probe, {} MiB, {} thread, best of {} passes; before/after the kernels: {} GB/s): {:.1} GB/s",
        p.bytes >> 20,
        p.threads,
        p.passes,
        each.join(" / "),
        bw
    );
    if !report.peaks.is_empty() {
        let each: Vec<String> =
            report.peaks.iter().map(|p| format!("{} {:.1} ({})", p.isa.name(), p.best_gmacs, p.instruction)).collect();
        let _ = writeln!(s, "int8 multiply-add peak (probe, 1 thread, best of 5 passes): {} G/s", each.join(", "));
    }
    let _ = writeln!(
        s,
        "| {:<24} | {:<9} | {:<26} | {:>3} | {:>9} | {:>7} | {:>9} | {:>10} | {:>7} | {:>9} | {:>9} |",
        "kernel", "format", "shape", "B", "µs/call", "GB/s", "% of bw", "Mrow·tok/s", "GMAC/s", "% of peak", "× oracle"
    );
    let _ = writeln!(
        s,
        "|{:-<26}|{:-<11}|{:-<28}|{:->5}|{:->11}|{:->9}|{:->11}|{:->12}|{:->9}|{:->11}|{:->11}|",
        "", "", "", "", "", "", "", "", "", "", ""
    );
    for r in &report.results {
        // The scalar family's kernels; for the head, its own scalar loop.
        let is_oracle = |o: &KernelResult| {
            if r.format == "q6_k" {
                o.kernel == head_kernel_name(IsaLevel::Scalar, 1)
            } else {
                o.kernel.starts_with("scalar/")
            }
        };
        let oracle =
            report.results.iter().find(|o| is_oracle(o) && o.shape == r.shape && o.batch == r.batch).or_else(|| {
                report
                    .results
                    .iter()
                    .find(|o| is_oracle(o) && o.rows == r.rows && o.cols == r.cols && o.batch == r.batch)
            });
        let speedup = oracle.map(|o| format!("{:.1}", o.secs_per_call / r.secs_per_call)).unwrap_or_else(|| "-".into());
        let of_peak = report.peak_gmacs(r.isa).map_or_else(|| "-".into(), |p| format!("{:.0}%", 100.0 * r.gmacs() / p));
        let _ = writeln!(
            s,
            "| {:<24} | {:<9} | {:<26} | {:>3} | {:>9.1} | {:>7.2} | {:>8.0}% | {:>10.1} | {:>7.1} | {:>9} | {:>9} |",
            r.kernel,
            r.format,
            r.shape,
            r.batch,
            r.secs_per_call * 1e6,
            r.gbps,
            100.0 * r.gbps / bw,
            r.row_products_per_sec / 1e6,
            r.gmacs(),
            of_peak,
            speedup
        );
    }
    s
}
