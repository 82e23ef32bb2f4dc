//! Performance counters per thread of the run, read around each forward call.
//!
//! Attribution: a counter read is a system call (about 1 µs), and a decode step has
//! thousands of spans, so counters are not read per span. They are read around whole
//! forward calls (per decode step and per phase), where the reads cost well under 0.1% of the
//! time, and stage-level figures come from the spans. Each event is a separate counter opened
//! on each thread of the process (perf's per-thread mode), so one event the PMU refuses
//! cannot break the others. When the kernel multiplexes hardware counters, counts are scaled
//! by time enabled / time running and flagged as scaled.
//!
//! Where the PMU is missing (these VMs: ENOENT), forbidden (CI runners: EPERM/EACCES, see
//! `perf_event_paranoid`) or unsupported (some hypervisors: EOPNOTSUPP), hardware events are
//! reported as missing with the OS error, and the software events (task-clock, page-faults,
//! context-switches, cpu-migrations) still count.

use std::collections::BTreeMap;

use perf_event::events::{Cache, CacheOp, CacheResult, Event, Hardware, Software, WhichCache};
use perf_event::{Builder, Counter};
use serde::{Deserialize, Serialize};

/// A counter the tool asks for.
#[derive(Debug, Clone, Copy)]
pub struct CounterDef {
    pub name: &'static str,
    pub hardware: bool,
    event: fn() -> Event,
}

/// Every counter asked for, hardware first.
pub fn definitions() -> Vec<CounterDef> {
    fn l1d() -> Event {
        Cache { which: WhichCache::L1D, operation: CacheOp::READ, result: CacheResult::MISS }.into()
    }
    fn llc() -> Event {
        Cache { which: WhichCache::LL, operation: CacheOp::READ, result: CacheResult::MISS }.into()
    }
    vec![
        CounterDef { name: "cycles", hardware: true, event: || Hardware::CPU_CYCLES.into() },
        CounterDef { name: "instructions", hardware: true, event: || Hardware::INSTRUCTIONS.into() },
        CounterDef { name: "cache-references", hardware: true, event: || Hardware::CACHE_REFERENCES.into() },
        CounterDef { name: "cache-misses", hardware: true, event: || Hardware::CACHE_MISSES.into() },
        CounterDef { name: "branch-misses", hardware: true, event: || Hardware::BRANCH_MISSES.into() },
        CounterDef { name: "L1-dcache-load-misses", hardware: true, event: l1d },
        CounterDef { name: "LLC-load-misses", hardware: true, event: llc },
        CounterDef { name: "task-clock", hardware: false, event: || Software::TASK_CLOCK.into() },
        CounterDef { name: "page-faults", hardware: false, event: || Software::PAGE_FAULTS.into() },
        CounterDef { name: "context-switches", hardware: false, event: || Software::CONTEXT_SWITCHES.into() },
        CounterDef { name: "cpu-migrations", hardware: false, event: || Software::CPU_MIGRATIONS.into() },
    ]
}

/// Whether a counter counts, and if not why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterStatus {
    pub name: String,
    pub kind: String,
    /// "counting", or "missing".
    pub status: String,
    /// The OS error when missing.
    pub error: Option<String>,
}

/// Scaled totals of one counter over an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CounterValue {
    pub value: f64,
    /// Whether the kernel multiplexed it (value scaled by enabled / running time).
    pub scaled: bool,
}

/// Counters open on every thread of the process.
pub struct Counters {
    /// (definition, one counter per thread) for the counters that opened.
    open: Vec<(CounterDef, Vec<Counter>)>,
    pub status: Vec<CounterStatus>,
    /// Last raw readings per counter per thread: (count, enabled, running).
    last: Vec<Vec<(u64, u64, u64)>>,
}

/// Thread ids of this process (from /proc/self/task).
pub fn thread_ids() -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn open_one(def: &CounterDef, tid: i32) -> std::io::Result<Counter> {
    let mut c = Builder::new().kind((def.event)()).observe_pid(tid).any_cpu().build()?;
    c.enable()?;
    Ok(c)
}

/// What the user can do about an OS error from perf_event_open.
fn advice(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(2) => "this CPU or VM exposes no hardware PMU (ENOENT); run on bare metal or a VM with vPMU enabled",
        Some(1) | Some(13) => {
            "not permitted (EPERM/EACCES); lower /proc/sys/kernel/perf_event_paranoid (e.g. to 1) or grant CAP_PERFMON"
        }
        Some(95) => "the hypervisor does not support this event (EOPNOTSUPP)",
        _ => "perf_event_open failed",
    }
}

impl Counters {
    /// Opens every counter on every thread in `tids`; counters that fail on the first thread
    /// are reported missing and not tried again.
    pub fn open(tids: &[i32]) -> Self {
        let mut open = Vec::new();
        let mut status = Vec::new();
        for def in definitions() {
            let kind = if def.hardware { "hardware" } else { "software" }.to_string();
            let mut per_thread = Vec::new();
            let mut err = None;
            for &tid in tids {
                match open_one(&def, tid) {
                    Ok(c) => per_thread.push(c),
                    Err(e) => {
                        err = Some(format!("{e} — {}", advice(&e)));
                        break;
                    }
                }
            }
            if tids.is_empty() {
                err = Some("no threads to observe (/proc/self/task unreadable)".into());
            }
            match err {
                None => {
                    status.push(CounterStatus { name: def.name.into(), kind, status: "counting".into(), error: None });
                    open.push((def, per_thread));
                }
                Some(e) => {
                    status.push(CounterStatus { name: def.name.into(), kind, status: "missing".into(), error: Some(e) })
                }
            }
        }
        let last = open.iter().map(|(_, cs)| vec![(0, 0, 0); cs.len()]).collect();
        let mut c = Self { open, status, last };
        c.delta();
        c
    }

    /// One line for the user when hardware counters are missing, naming the OS error.
    pub fn fallback_note(&self) -> Option<String> {
        let missing: Vec<&CounterStatus> =
            self.status.iter().filter(|s| s.kind == "hardware" && s.status == "missing").collect();
        let first = missing.first()?;
        let soft: Vec<&str> = self.status.iter().filter(|s| s.status == "counting").map(|s| s.name.as_str()).collect();
        Some(format!(
            "hardware counters unavailable: {}; continuing with software counters ({})",
            first.error.as_deref().unwrap_or("unknown error"),
            if soft.is_empty() { "none".to_string() } else { soft.join(", ") }
        ))
    }

    /// Counts since the last call, summed over threads and scaled for multiplexing.
    pub fn delta(&mut self) -> Vec<(&'static str, CounterValue)> {
        let mut out = Vec::with_capacity(self.open.len());
        for ((def, cs), last) in self.open.iter_mut().zip(&mut self.last) {
            let mut v = CounterValue::default();
            for (c, l) in cs.iter_mut().zip(last.iter_mut()) {
                let Ok(r) = c.read_count_and_time() else { continue };
                let (dc, de, dr) = (r.count - l.0, r.time_enabled - l.1, r.time_running - l.2);
                *l = (r.count, r.time_enabled, r.time_running);
                if dr > 0 && dr < de {
                    v.value += dc as f64 * de as f64 / dr as f64;
                    v.scaled = true;
                } else {
                    v.value += dc as f64;
                }
            }
            out.push((def.name, v));
        }
        out
    }
}

/// Ratios derived from counter totals, where both inputs count.
pub fn derived(values: &[(String, CounterValue)]) -> Vec<(String, f64)> {
    let get = |n: &str| values.iter().find(|(k, _)| k == n).map(|(_, v)| v.value);
    let mut out = Vec::new();
    let mut ratio = |name: &str, a: Option<f64>, b: Option<f64>, k: f64| {
        if let (Some(a), Some(b)) = (a, b) {
            if b > 0.0 {
                out.push((name.to_string(), a / b * k));
            }
        }
    };
    ratio("ipc", get("instructions"), get("cycles"), 1.0);
    ratio("cache_miss_rate", get("cache-misses"), get("cache-references"), 1.0);
    ratio("branch_misses_per_kinstr", get("branch-misses"), get("instructions"), 1e3);
    ratio("l1d_misses_per_kinstr", get("L1-dcache-load-misses"), get("instructions"), 1e3);
    ratio("llc_misses_per_kinstr", get("LLC-load-misses"), get("instructions"), 1e3);
    out
}

/// The calling thread's id (for counters on this thread alone).
pub fn current_tid() -> Option<i32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// One stage's run over a matmul: (scratch, output) → checksum.
type StageRun<'a> = Box<dyn FnMut(&mut bitnet_engine::KernelScratch, &mut [f32]) -> u64 + 'a>;

/// Counters of one stage run alone: per call, on the calling thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IsolatedStage {
    /// Linear layer of layer 0 (`q`, `k`, ..., `down`).
    pub op: String,
    /// `unpack`, `dot`, `xnor`, `popcount`, or `unpack_dot` (the fused form, for comparison).
    pub stage: String,
    pub calls: u64,
    pub ns_per_call: f64,
    /// Counter values per call.
    pub per_call: BTreeMap<String, CounterValue>,
    /// IPC, miss rates ... where both inputs count.
    pub derived: BTreeMap<String, f64>,
}

/// Runs each stage of `kernel` alone on the linear layers of layer 0 (batch `batch`, one
/// thread: the caller) with counters open on this thread only, so every count belongs to one
/// stage: the attribution of counters to fine stages. Each is repeated for at least 20 ms.
pub fn isolated_stages(
    model: &bitnet_engine::Model,
    kernel: bitnet_engine::Kernel,
    batch: usize,
) -> Vec<IsolatedStage> {
    use bitnet_engine::matmul::SplitStage;
    use bitnet_engine::{ActivationBatch, KernelScratch};
    let Some(tid) = current_tid() else { return Vec::new() };
    let lw = &model.weights.layers[0];
    let ops = [
        ("q", &lw.wq),
        ("k", &lw.wk),
        ("v", &lw.wv),
        ("o", &lw.wo),
        ("gate", &lw.w_gate),
        ("up", &lw.w_up),
        ("down", &lw.w_down),
    ];
    let mut out = Vec::new();
    let mut scratch = KernelScratch::new();
    for (op, w) in ops {
        let cols = w.cols();
        let Ok(mut x) = ActivationBatch::new(batch, cols) else { continue };
        let mut rng = bitnet_engine::rng::SplitMix64::new(7);
        let v: Vec<f32> = (0..batch * cols).map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0).collect();
        if x.quantize(&v).is_err() {
            continue;
        }
        if kernel.family() == bitnet_engine::KernelFamily::Xnor {
            x.build_planes();
        }
        // (The lookup forms build their tables on the first call, in the scratch, and reuse
        // them for these activations: the runs below time lookups only.)
        kernel.prepare(w);
        let mut y = vec![0f32; w.rows() * batch];
        let mut runs: Vec<(String, StageRun<'_>)> = Vec::new();
        for stage in SplitStage::of(kernel.family()) {
            let x = &x;
            runs.push((
                stage.name().into(),
                Box::new(move |s, y| kernel.run_stage_alone(stage, w, x, 0..w.rows(), y, s).unwrap_or(0)),
            ));
        }
        let xr = &x;
        // The whole kernel in one piece: the lut form itself, or the family's fused form.
        let (whole, name) = if kernel.uses_lut() {
            (Ok(kernel), "lookup")
        } else {
            (bitnet_engine::Kernel::new(kernel.family(), kernel.isa(), bitnet_engine::KernelForm::Fused), "unpack_dot")
        };
        if let Ok(f) = whole {
            runs.push((
                name.into(),
                Box::new(move |s, y| {
                    let _ = f.matmul(w, xr, 0..w.rows(), y, s);
                    y[0].to_bits() as u64
                }),
            ));
        }
        for (stage, mut run) in runs {
            let mut c = Counters::open(&[tid]);
            std::hint::black_box(run(&mut scratch, &mut y)); // warm
            c.delta();
            let t = std::time::Instant::now();
            let mut calls = 0u64;
            while t.elapsed() < std::time::Duration::from_millis(20) {
                std::hint::black_box(run(&mut scratch, &mut y));
                calls += 1;
            }
            let ns = t.elapsed().as_nanos() as f64 / calls as f64;
            let per_call: BTreeMap<String, CounterValue> = c
                .delta()
                .into_iter()
                .map(|(k, v)| (k.to_string(), CounterValue { value: v.value / calls as f64, scaled: v.scaled }))
                .collect();
            let list: Vec<(String, CounterValue)> = per_call.iter().map(|(k, v)| (k.clone(), *v)).collect();
            out.push(IsolatedStage {
                op: op.into(),
                stage,
                calls,
                ns_per_call: ns,
                derived: derived(&list).into_iter().collect(),
                per_call,
            });
        }
    }
    out
}
