//! A persistent worker pool: no thread is spawned per matmul, and dispatching a job neither
//! allocates nor locks while the workers are awake.
//!
//! `split` hands every thread (the caller is thread 0) one contiguous chunk of an output slice
//! and its own scratch object; the chunks are disjoint by construction. `split_blocks` starts
//! each thread on the same contiguous run, but a thread that finishes takes the blocks others
//! have not reached yet, so a thread that loses its core mid-step no longer holds up the rest. Workers spin briefly
//! on a generation counter for the next job (decode dispatches jobs every few microseconds),
//! then sleep on a condition variable, which the caller only touches when someone sleeps.
//!
//! A job may name an [`Ahead`] for each worker: bytes the worker asks for in L2 once its part
//! is done, until the next job arrives. Decode steps pass the worker's first rows of the next
//! matmul, so that the memory bus, idle while the caller runs the serial stages between two
//! matmuls (norms, quantization, the residual), already streams the next weights.

use std::any::Any;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::simd::PrefetchRange;

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// A job as stored for the workers, its lifetime erased (see `run`): runs thread i's part and
/// returns what that thread asks for afterwards.
type Job = dyn Fn(usize) -> Ahead + Sync + 'static;

/// What a worker asks for in L2 once its part of a job is done, while it waits for the next
/// job: up to two ranges (the same rows of a gate and an up projection), asked for a
/// KiB of each in turn, and no more once the next job has been published (the
/// worker then runs it at once, and the job reads the rest as it would have anyway).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ahead(pub [PrefetchRange; 2]);

/// Bytes a worker asks for between two looks at the job counter.
const AHEAD_CHUNK: usize = 1024;

impl Ahead {
    pub const NONE: Self = Self([PrefetchRange::EMPTY; 2]);

    pub fn one(r: PrefetchRange) -> Self {
        Self([r, PrefetchRange::EMPTY])
    }

    /// Asks for the ranges' lines, a chunk of each in turn, while `go_on()` holds.
    fn prefetch_while(self, go_on: impl Fn() -> bool) {
        let longest = self.0[0].len().max(self.0[1].len());
        let mut at = 0;
        while at < longest && go_on() {
            for r in self.0 {
                r.prefetch_l2(at..at + AHEAD_CHUNK);
            }
            at += AHEAD_CHUNK;
        }
    }
}

struct Shared {
    /// Bumped once per job; workers run the job when they see it change.
    generation: AtomicUsize,
    /// The current job, valid while `remaining > 0` (see `run`).
    job: UnsafeCell<Option<*const Job>>,
    /// Workers that have not finished the current job.
    remaining: AtomicUsize,
    /// Workers asleep on `wake`.
    sleepers: AtomicUsize,
    stop: AtomicBool,
    panicked: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by `run` before it publishes the generation (SeqCst) and read by
// workers only after they observe that generation; `run` does not return (and so does not
// write `job` again) until every worker has finished with it (`remaining == 0`).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of worker threads, driven by one thread: the pool is not `Sync`, since jobs
/// share one slot and two threads dispatching at once would race on it (it had been `Sync`,
/// which safe code could turn into a data race).
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<bitnet_engine::model::WorkerPool>();
/// ```
pub struct WorkerPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    threads: usize,
    pinned: bool,
    /// One per thread: its blocks of the current [`WorkerPool::split_blocks`].
    shares: Box<[Share]>,
    /// Makes the pool `!Sync` (see above); it stays `Send`.
    not_sync: PhantomData<std::cell::Cell<()>>,
}

/// A thread's blocks in a [`WorkerPool::split_blocks`]: `front` (the next block its owner
/// takes) in the low 32 bits and `back` (one past the last block nobody has taken) in the high
/// 32 bits, in one word so that the owner (taking from the front) and a thief (taking from the
/// back) agree on the last block with one compare-and-swap. A cache line each, so that owners
/// do not slow each other down.
#[repr(align(64))]
struct Share(AtomicU64);

impl Share {
    fn pack(front: usize, back: usize) -> u64 {
        front as u64 | (back as u64) << 32
    }
}

/// One thread's view of a [`WorkerPool::split_blocks`]: hands out blocks of the output, its own
/// from the front, then, when those are gone, other threads' from their backs.
pub struct Blocks<'s, 'a, T> {
    parts: &'s DisjointParts<'a, T>,
    shares: &'s [Share],
    me: usize,
    /// 0 while taking its own blocks, then k for thread `me + k` (mod threads).
    victim: usize,
    unit: usize,
    block_units: usize,
    units: usize,
}

impl<'a, T> Blocks<'_, 'a, T> {
    /// Whether this is the calling thread's view (thread 0, which goes on alone after the split).
    pub fn is_caller(&self) -> bool {
        self.me == 0
    }

    /// The next block this thread computes, as (first unit, its part of the output), or `None`
    /// when every block of every thread is taken.
    pub fn next_block(&mut self) -> Option<(usize, &'a mut [T])> {
        let n = self.shares.len();
        while self.victim < n {
            let share = &self.shares[(self.me + self.victim) % n].0;
            let mut v = share.load(Acquire);
            loop {
                let (front, back) = (v as u32 as usize, (v >> 32) as usize);
                if front >= back {
                    break;
                }
                // The owner takes half of what is left of its run (at least one block), so its
                // first pieces are long streams and later ones short; a thief takes half of
                // what is left from the back, so an owner that lost its core keeps the front.
                let take = if self.victim == 0 { (back - front).div_ceil(2) } else { ((back - front) / 2).max(1) };
                let (next, blocks) = if self.victim == 0 {
                    (Share::pack(front + take, back), front..front + take)
                } else {
                    (Share::pack(front, back - take), back - take..back)
                };
                match share.compare_exchange_weak(v, next, AcqRel, Acquire) {
                    Ok(_) => {
                        let start = blocks.start * self.block_units;
                        let end = (blocks.end * self.block_units).min(self.units);
                        // SAFETY: each block index leaves its share exactly once (the CAS above
                        // moves front or back past it, and front < back was read in the same
                        // word), so no two threads get the same units; the output stays
                        // exclusively borrowed by `split_blocks` until every thread is done.
                        let part = unsafe { self.parts.slice(start * self.unit..end * self.unit) };
                        return Some((start, part));
                    }
                    Err(now) => v = now,
                }
            }
            self.victim += 1;
        }
        None
    }
}

impl WorkerPool {
    /// A pool of `threads` threads in all (the caller counts as one). With `pin`, thread i is
    /// pinned to the i-th core this process may run on, or the pool is an error naming why not
    /// (fewer cores than threads, or the OS refusing): a run asked to be pinned is never
    /// quietly measured unpinned.
    pub fn new(threads: usize, pin: bool) -> Result<Self> {
        if threads == 0 {
            return Err(Error::Shape("worker pool needs at least 1 thread".into()));
        }
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let cores = if pin { process_cores() } else { &[] };
        if pin {
            check_pinnable(threads)?;
        }
        if pin && !core_affinity::set_for_current(cores[0]) {
            return Err(Error::Unsupported(format!(
                "pinning the calling thread to core {}: the OS refused",
                cores[0].id
            )));
        }
        // Workers that have tried to pin themselves, and those the OS refused.
        let tried = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::with_capacity(threads - 1);
        for i in 1..threads {
            let s = Arc::clone(&shared);
            let core = if pin { Some(cores[i]) } else { None };
            let (tried, refused) = (Arc::clone(&tried), Arc::clone(&refused));
            let h = std::thread::Builder::new()
                .name(format!("bitnet-worker-{i}"))
                .spawn(move || {
                    if let Some(c) = core {
                        if !core_affinity::set_for_current(c) {
                            refused.fetch_add(1, SeqCst);
                        }
                        tried.fetch_add(1, SeqCst);
                    }
                    worker_loop(&s, i)
                })
                .map_err(|e| Error::Unsupported(format!("cannot start worker thread: {e}")))?;
            handles.push(h);
        }
        let shares = (0..threads).map(|_| Share(AtomicU64::new(0))).collect();
        let pool = Self { shared, handles, threads, pinned: pin, shares, not_sync: PhantomData };
        if pin {
            while tried.load(SeqCst) < threads - 1 {
                std::thread::yield_now();
            }
            if refused.load(SeqCst) > 0 {
                // Dropping the pool stops and joins its workers.
                return Err(Error::Unsupported(format!(
                    "pinning {threads} threads to cores: the OS refused {} of the workers",
                    refused.load(SeqCst)
                )));
            }
        }
        Ok(pool)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether threads were pinned to cores (as asked: pinning that fails is an error).
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// Runs `f(i)` on every thread i in 0..threads (i = 0 on the caller) and returns when all
    /// are done. A panic in any of them is re-raised here.
    fn run<'a>(&self, f: &'a (dyn Fn(usize) -> Ahead + Sync + 'a)) {
        if self.threads == 1 {
            f(0);
            return;
        }
        let s = &*self.shared;
        // SAFETY: no worker reads `job` now: the previous job finished (`remaining` reached 0
        // before the last `run` returned) and the generation has not been bumped yet. The
        // lifetime is erased, but the pointer is only used until `remaining` reaches 0 below,
        // while `f` is still borrowed by this call.
        unsafe {
            *s.job.get() = Some(std::mem::transmute::<*const (dyn Fn(usize) -> Ahead + Sync + 'a), *const Job>(f));
        }
        s.remaining.store(self.threads - 1, SeqCst);
        s.generation.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        while s.remaining.load(Acquire) > 0 {
            std::hint::spin_loop();
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a bitnet worker thread panicked");
        }
    }

    /// Runs `f(i)` once on every thread i of the pool, all released by one dispatch (as a
    /// decode step's matmul is); returns each thread's result and the seconds from the first
    /// thread's start to the last one's end. The timing of the machine probes (read bandwidth,
    /// int8 peak), measured on the threads and cores a decode uses.
    pub fn timed_on_each<T: Send + Default + Clone>(&self, f: impl Fn(usize) -> T + Sync) -> (Vec<T>, f64) {
        let mut results = vec![T::default(); self.threads];
        let now = Instant::now();
        let mut spans = vec![(now, now); self.threads];
        self.split(&mut results, 1, 1, &mut spans, |i, result, span| {
            let t0 = Instant::now();
            result[0] = f(i);
            *span = (t0, Instant::now());
        });
        let first = spans.iter().map(|s| s.0).min().expect("a pool has a thread");
        let last = spans.iter().map(|s| s.1).max().expect("a pool has a thread");
        (results, last.duration_since(first).as_secs_f64().max(1e-9))
    }

    /// Splits `out` into one contiguous chunk per thread, each a whole number of `unit`s and
    /// (except the last) a multiple of `align` units, and runs
    /// `f(first_unit, chunk, &mut scratch[i])` on thread i. `scratch` needs ≥ `threads` items.
    pub fn split<T: Send, S: Send>(
        &self,
        out: &mut [T],
        unit: usize,
        align: usize,
        scratch: &mut [S],
        f: impl Fn(usize, &mut [T], &mut S) + Sync,
    ) {
        assert!(unit > 0 && out.len().is_multiple_of(unit), "split: output length is not a whole number of units");
        assert!(scratch.len() >= self.threads, "split: need one scratch per thread");
        let units = out.len() / unit;
        let parts = DisjointParts::new(out);
        let scratch = DisjointParts::new(scratch);
        let threads = self.threads;
        self.run(&|i| {
            let r = chunk_range(units, threads, align.max(1), i);
            // SAFETY: `chunk_range` gives each thread index a disjoint range of units, each
            // thread index runs exactly once per `run`, and scratch item i is used by thread i
            // only; `run` returns only when all threads are done, while `out` and `scratch` are
            // still exclusively borrowed by this call.
            let (chunk, s) = unsafe { (parts.slice(r.start * unit..r.end * unit), scratch.item(i)) };
            if !chunk.is_empty() {
                f(r.start, chunk, s);
            }
            Ahead::NONE
        });
    }
}

impl WorkerPool {
    /// Splits `out` into blocks of `block_units` units (a unit is `unit` elements) and runs
    /// `f(&mut blocks, &mut scratch[i])` on every thread i, which computes the blocks
    /// `blocks.next_block()` hands it. Each thread starts on its own contiguous run of blocks
    /// (as [`split`](Self::split) would give it), front to back, so its reads stream; a thread
    /// that runs out takes blocks from the back of the others' runs. On a shared machine a
    /// thread can lose its core for a millisecond mid-step: with a static split the others
    /// then wait for it, here they take over what it has not started. Once it has no block
    /// left, worker i asks for `ahead(i)` (see [`Ahead`]).
    pub fn split_blocks<'a, T: Send, S: Send>(
        &self,
        out: &'a mut [T],
        unit: usize,
        block_units: usize,
        scratch: &mut [S],
        ahead: impl Fn(usize) -> Ahead + Sync,
        f: impl Fn(&mut Blocks<'_, 'a, T>, &mut S) + Sync,
    ) {
        assert!(
            unit > 0 && out.len().is_multiple_of(unit),
            "split_blocks: output length is not a whole number of units"
        );
        assert!(scratch.len() >= self.threads, "split_blocks: need one scratch per thread");
        let units = out.len() / unit;
        // One thread has nobody to balance against: one block, one uninterrupted stream.
        let block_units = if self.threads == 1 { units.max(1) } else { block_units.max(1) };
        let blocks = units.div_ceil(block_units);
        assert!(blocks < u32::MAX as usize, "split_blocks: too many blocks");
        let threads = self.threads;
        for (i, share) in self.shares.iter().enumerate() {
            let r = chunk_range(blocks, threads, 1, i);
            // Published to the workers by `run`'s generation bump (SeqCst).
            share.0.store(Share::pack(r.start, r.end), Relaxed);
        }
        let parts = DisjointParts::new(out);
        let scratch = DisjointParts::new(scratch);
        let shares = &*self.shares;
        self.run(&|i| {
            let mut b = Blocks { parts: &parts, shares, me: i, victim: 0, unit, block_units, units };
            // SAFETY: scratch item i is used by thread i only, and `run` returns only when all
            // threads are done, while `scratch` is still exclusively borrowed by this call.
            f(&mut b, unsafe { scratch.item(i) });
            ahead(i)
        });
    }
}

/// A `[tokens, n]` output that the blocks of a [`WorkerPool::split_blocks_scatter`] write a
/// few columns at a time: its column c is unit `offset + c` of the split, so the thread given
/// a block writes that block's columns for every token. A matmul's `[n, tokens]` block goes
/// straight into the `[tokens, n]` layout the next stage reads, where the whole result had
/// been transposed on the caller afterwards while the other threads waited.
pub struct ScatterTarget<'a, T> {
    parts: DisjointParts<'a, T>,
    n: usize,
    offset: usize,
}

impl<'a, T> ScatterTarget<'a, T> {
    /// `out` is `[tokens, n]`; its columns are units `offset..offset + n` of the split.
    pub fn new(out: &'a mut [T], n: usize, offset: usize) -> Self {
        assert!(n > 0 && out.len().is_multiple_of(n), "scatter target: length is not a whole number of rows of {n}");
        Self { parts: DisjointParts::new(out), n, offset }
    }

    /// The columns of units `units` (empty where they miss this target).
    fn columns(&self, units: Range<usize>) -> Range<usize> {
        let lo = units.start.clamp(self.offset, self.offset + self.n) - self.offset;
        let hi = units.end.clamp(self.offset, self.offset + self.n) - self.offset;
        lo..hi
    }
}

/// One block's columns of a [`ScatterTarget`] (see [`ScatterBlocks::next_block`]).
pub struct Columns<'s, 'a, T> {
    parts: &'s DisjointParts<'a, T>,
    n: usize,
    cols: Range<usize>,
}

impl<T> Columns<'_, '_, T> {
    /// The block's columns in the target's numbering (empty where the block misses it).
    pub fn cols(&self) -> Range<usize> {
        self.cols.clone()
    }

    /// Rows of the target.
    pub fn tokens(&self) -> usize {
        self.parts.len / self.n
    }

    /// Rows `first..first + N`'s parts in these columns, all at once.
    pub fn token_group<const N: usize>(&mut self, first: usize) -> [&mut [T]; N] {
        assert!(first + N <= self.tokens(), "tokens {first}..{} of {}", first + N, self.tokens());
        let (n, cols) = (self.n, self.cols.clone());
        // SAFETY: as in `token`; the N rows are distinct, so their parts are disjoint too.
        std::array::from_fn(|i| unsafe { self.parts.slice((first + i) * n + cols.start..(first + i) * n + cols.end) })
    }

    /// Row `t`'s part in these columns.
    pub fn token(&mut self, t: usize) -> &mut [T] {
        assert!(t < self.tokens(), "token {t} of {}", self.tokens());
        // SAFETY: the columns are those of one block's units, which no other thread is given
        // (see `Blocks::next_block`), so no two threads' parts overlap; a thread's blocks are
        // disjoint too, and `&mut self` keeps one part of this block alive at a time. The
        // target stays exclusively borrowed until `split_blocks_scatter` returns.
        unsafe { self.parts.slice(t * self.n + self.cols.start..t * self.n + self.cols.end) }
    }
}

impl WorkerPool {
    /// [`split_blocks`](Self::split_blocks) over `out` and, where given, `second` of the same
    /// length (each block the same units of both: e.g. the gate and up projections of the same
    /// rows, so that the thread can combine them without another barrier), with `P` scatter
    /// targets whose columns each block also gets (see [`ScatterTarget`]).
    #[allow(clippy::too_many_arguments)]
    pub fn split_blocks_scatter<'a, T: Send, U: Send, S: Send, const P: usize>(
        &self,
        (out, second): (&'a mut [T], Option<&'a mut [T]>),
        unit: usize,
        block_units: usize,
        targets: [ScatterTarget<'a, U>; P],
        scratch: &mut [S],
        ahead: impl Fn(usize) -> Ahead + Sync,
        f: impl Fn(&mut ScatterBlocks<'_, '_, 'a, T, U, P>, &mut S) + Sync,
    ) {
        if let Some(b) = &second {
            assert_eq!(out.len(), b.len(), "split_blocks_scatter: outputs differ in length");
        }
        let second = second.map(DisjointParts::new);
        let targets = &targets;
        self.split_blocks(out, unit, block_units, scratch, ahead, |blocks, s| {
            f(&mut ScatterBlocks { a: blocks, second: second.as_ref(), targets }, s)
        });
    }
}

/// [`Blocks`] with a second output and scatter targets (see
/// [`WorkerPool::split_blocks_scatter`]).
pub struct ScatterBlocks<'r, 's, 'a, T, U, const P: usize> {
    a: &'r mut Blocks<'s, 'a, T>,
    second: Option<&'r DisjointParts<'a, T>>,
    targets: &'r [ScatterTarget<'a, U>; P],
}

/// A block of a [`ScatterBlocks`]: its first unit, its part of the output and of the second
/// output, and its columns of each target.
pub type ScatterBlock<'r, 'a, T, U, const P: usize> =
    (usize, &'a mut [T], Option<&'a mut [T]>, [Columns<'r, 'a, U>; P]);

impl<'r, 'a, T, U, const P: usize> ScatterBlocks<'r, '_, 'a, T, U, P> {
    /// See [`Blocks::is_caller`].
    pub fn is_caller(&self) -> bool {
        self.a.is_caller()
    }

    /// The next block, or `None` when every block is taken.
    pub fn next_block(&mut self) -> Option<ScatterBlock<'r, 'a, T, U, P>> {
        let (first, a) = self.a.next_block()?;
        let units = first..first + a.len() / self.a.unit;
        let r = first * self.a.unit..first * self.a.unit + a.len();
        // SAFETY: the block's units of `out` are this thread's alone (see `Blocks::next_block`),
        // so the same range of `second`, of equal length, is too; `second` stays exclusively
        // borrowed until `split_blocks_scatter` returns.
        let b = self.second.map(|b| unsafe { b.slice(r) });
        let cols = std::array::from_fn(|i| {
            let t = &self.targets[i];
            Columns { parts: &t.parts, n: t.n, cols: t.columns(units.clone()) }
        });
        Some((first, a, b, cols))
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.shared.generation.fetch_add(1, SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// How many cores a pinned pool can use: the most threads [`WorkerPool::new`] can pin.
pub fn pinnable_cores() -> usize {
    process_cores().len()
}

/// Whether [`WorkerPool::new`] can pin `threads` threads, one to a core of this process; the
/// error says why not, for tools to check their flags before any work.
pub fn check_pinnable(threads: usize) -> Result<()> {
    let cores = pinnable_cores();
    if threads > cores {
        return Err(Error::Unsupported(format!(
            "pinning {threads} threads to cores: this process may run on {cores} core(s)"
        )));
    }
    Ok(())
}

/// The cores this process may run on, read once, before the first pinned pool pins its caller:
/// the OS answers for the calling thread, and asked again on a caller pinned by an earlier
/// pool it names that one core, which had left every later pinned pool of a sweep (and the
/// probes beside it) unpinned without a word.
fn process_cores() -> &'static [core_affinity::CoreId] {
    static CORES: OnceLock<Vec<core_affinity::CoreId>> = OnceLock::new();
    CORES.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default())
}

/// Units `[start, end)` of thread `i` when `units` are shared by `threads`, boundaries on
/// multiples of `align`.
pub fn chunk_range(units: usize, threads: usize, align: usize, i: usize) -> Range<usize> {
    let blocks = units.div_ceil(align);
    let (per, extra) = (blocks / threads, blocks % threads);
    let b0 = i * per + i.min(extra);
    let b1 = b0 + per + usize::from(i < extra);
    (b0 * align).min(units)..(b1 * align).min(units)
}

fn worker_loop(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        // Wait for a new generation: spin, then sleep.
        let start = Instant::now();
        let mut gen = s.generation.load(SeqCst);
        let mut spins = 0u32;
        while gen == seen {
            spins = spins.wrapping_add(1);
            // The clock is read every 64 spins only: a read costs ~20 ns, which would delay
            // noticing a new job by that much on every iteration.
            if !spins.is_multiple_of(64) || start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, SeqCst);
                while s.generation.load(SeqCst) == seen {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, SeqCst);
            }
            gen = s.generation.load(SeqCst);
        }
        seen = gen;
        if s.stop.load(SeqCst) {
            return;
        }
        // SAFETY: the generation was published after `job` was written (SeqCst) and `run`
        // keeps the job alive until `remaining` reaches 0, which happens only after this call.
        let job = unsafe { (*s.job.get()).expect("job set before the generation bump") };
        let r: std::result::Result<Ahead, Box<dyn Any + Send>> =
            catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(index) }));
        let ahead = r.unwrap_or_else(|_| {
            s.panicked.store(true, SeqCst);
            Ahead::NONE
        });
        s.remaining.fetch_sub(1, Release);
        // The job may be gone now; `ahead` is plain addresses, only ever prefetched.
        ahead.prefetch_while(|| s.generation.load(Relaxed) == seen);
    }
}

/// Hands out disjoint mutable parts of a slice to threads (see the SAFETY notes at the uses).
struct DisjointParts<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: parts are only handed out for disjoint ranges (callers' contract), so sharing the
// handle across threads is like sending disjoint `&mut` slices, which needs `T: Send`.
unsafe impl<T: Send> Sync for DisjointParts<'_, T> {}

impl<'a, T> DisjointParts<'a, T> {
    fn new(s: &'a mut [T]) -> Self {
        Self { ptr: s.as_mut_ptr(), len: s.len(), _borrow: PhantomData }
    }

    /// SAFETY: no two live results may overlap.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, r: Range<usize>) -> &'a mut [T] {
        assert!(r.start <= r.end && r.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start)
    }

    /// SAFETY: no two live results may be the same item.
    #[allow(clippy::mut_from_ref)]
    unsafe fn item(&self, i: usize) -> &'a mut T {
        assert!(i < self.len);
        &mut *self.ptr.add(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker asks for a chunk of each of its ranges in turn, looking at the job counter
    /// before each chunk, and stops when told to (a new job): the longer range decides how
    /// many chunks there are.
    #[test]
    fn ahead_asks_a_chunk_of_each_range_in_turn_until_told_to_stop() {
        let data = vec![1u8; 10 * AHEAD_CHUNK + 1];
        let ahead = Ahead([PrefetchRange::of(&data[..100]), PrefetchRange::of(&data)]);
        let looks = std::cell::Cell::new(0);
        ahead.prefetch_while(|| {
            looks.set(looks.get() + 1);
            true
        });
        assert_eq!(looks.get(), 11, "one look before each of the longer range's 11 chunks");
        looks.set(0);
        ahead.prefetch_while(|| {
            looks.set(looks.get() + 1);
            looks.get() <= 3
        });
        assert_eq!(looks.get(), 4, "3 chunks, then the look that saw the next job");
        Ahead::NONE.prefetch_while(|| panic!("nothing to ask for, so no look"));
    }

    /// What workers ask for is only ever prefetched: ranges of memory freed before the jobs
    /// run (as a finished step's weights may be) neither fault nor disturb the jobs.
    #[test]
    fn ahead_ranges_of_freed_memory_are_harmless() {
        let pool = WorkerPool::new(3, false).unwrap();
        let freed = {
            let big = vec![7u8; 16 << 20];
            PrefetchRange::of(&big)
        };
        let mut scratch = vec![(); 3];
        for round in 0..20 {
            let mut out = vec![0usize; 300];
            pool.split_blocks(
                &mut out,
                1,
                7,
                &mut scratch,
                |_| Ahead([freed, freed.window(1 << 20, 1 << 20)]),
                |blocks, _| {
                    while let Some((first, chunk)) = blocks.next_block() {
                        for (j, v) in chunk.iter_mut().enumerate() {
                            *v = first + j + round;
                        }
                    }
                },
            );
            assert!(out.iter().enumerate().all(|(i, &v)| v == i + round), "round {round}");
        }
    }

    #[test]
    fn chunks_cover_everything_once_and_respect_alignment() {
        for units in [0, 1, 5, 64, 100, 641] {
            for threads in 1..5 {
                for align in [1, 2, 16] {
                    let mut next = 0;
                    for i in 0..threads {
                        let r = chunk_range(units, threads, align, i);
                        assert_eq!(r.start, next);
                        if r.end < units {
                            assert_eq!(r.end % align, 0);
                        }
                        next = r.end;
                    }
                    assert_eq!(next, units);
                }
            }
        }
    }

    #[test]
    fn split_runs_every_chunk_on_its_own_thread() {
        for threads in [1, 2, 3] {
            let pool = WorkerPool::new(threads, false).unwrap();
            let mut out = vec![0usize; 3 * 100];
            let mut scratch = vec![0usize; threads];
            for round in 0..50 {
                pool.split(&mut out, 3, 2, &mut scratch, |first, chunk, s| {
                    *s += 1;
                    for (j, v) in chunk.iter_mut().enumerate() {
                        *v = (first * 3 + j) * 1000 + round;
                    }
                });
                assert!(out.iter().enumerate().all(|(j, v)| *v == j * 1000 + round));
            }
            assert!(scratch.iter().all(|s| *s == 50), "{scratch:?}");
        }
    }

    #[test]
    fn timed_on_each_runs_once_per_thread_on_distinct_threads_and_spans_them_all() {
        for threads in [1, 2, 3] {
            let pool = WorkerPool::new(threads, false).unwrap();
            let (got, secs) = pool.timed_on_each(|i| {
                // The last thread is slowest: the span runs to its end.
                std::thread::sleep(Duration::from_millis(if i + 1 == threads { 20 } else { 1 }));
                (i, format!("{:?}", std::thread::current().id()))
            });
            assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), (0..threads).collect::<Vec<_>>());
            let ids: std::collections::BTreeSet<&String> = got.iter().map(|g| &g.1).collect();
            assert_eq!(ids.len(), threads, "one result per thread, each from its own: {got:?}");
            assert!(secs >= 0.020, "from the first start to the last end: {secs} s");
        }
    }

    #[test]
    fn split_blocks_hands_out_every_unit_exactly_once() {
        for threads in [1, 2, 3, 4] {
            let pool = WorkerPool::new(threads, false).unwrap();
            for (units, block) in [(0, 4), (1, 4), (37, 4), (100, 7), (64, 64), (1000, 16), (1000, 1)] {
                // Each element counts the times its unit was handed out (in steps of 2, so
                // the value also says which unit it is).
                let mut out = vec![0u32; 3 * units];
                let mut scratch = vec![0usize; threads];
                pool.split_blocks(
                    &mut out,
                    3,
                    block,
                    &mut scratch,
                    |_| Ahead::NONE,
                    |blocks, s| {
                        while let Some((first, chunk)) = blocks.next_block() {
                            assert!(chunk.len() % 3 == 0 && (threads == 1 || first % block == 0));
                            for (j, v) in chunk.iter_mut().enumerate() {
                                *v += 1 + (first * 3 + j) as u32 * 2;
                            }
                            *s += chunk.len() / 3;
                        }
                    },
                );
                assert!(
                    out.iter().enumerate().all(|(j, v)| *v == 1 + j as u32 * 2),
                    "{threads} threads, {units} units"
                );
                assert_eq!(scratch.iter().sum::<usize>(), units);
            }
        }
    }

    #[test]
    fn a_thread_that_stalls_has_its_blocks_taken_by_the_others() {
        // Thread 0 stalls in its first block until the last block of its own run is done (by
        // someone else, necessarily), or 10 s pass: without stealing it would never be.
        for threads in [2, 3] {
            let pool = WorkerPool::new(threads, false).unwrap();
            let own = chunk_range(64, threads, 1, 0);
            let done: Vec<AtomicBool> = (0..64).map(|_| AtomicBool::new(false)).collect();
            let mut out = vec![usize::MAX; 64];
            let mut scratch = vec![0usize; threads];
            pool.split_blocks(
                &mut out,
                1,
                1,
                &mut scratch,
                |_| Ahead::NONE,
                |blocks, s| {
                    while let Some((first, chunk)) = blocks.next_block() {
                        let start = Instant::now();
                        while first == 0 && !done[own.end - 1].load(SeqCst) && start.elapsed() < Duration::from_secs(10)
                        {
                            std::thread::yield_now();
                        }
                        for (j, v) in chunk.iter_mut().enumerate() {
                            *v = first + j;
                            done[first + j].store(true, SeqCst);
                        }
                        *s += chunk.len();
                    }
                },
            );
            assert!(out.iter().enumerate().all(|(j, v)| *v == j));
            assert!(scratch[0] < own.len(), "thread 0 did all of its run itself: {scratch:?}");
        }
    }

    /// Each block gets its columns of every scatter target, and of the target its units
    /// fall in only: writing (token, unit) into each column of each token fills both
    /// targets exactly, and the second output gets the same units as the first.
    #[test]
    fn split_blocks_scatter_gives_each_block_its_columns_of_every_target() {
        let pool = WorkerPool::new(3, false).unwrap();
        let tokens = 3;
        for block in [1, 7, 64] {
            let (mut a, mut b) = (vec![0usize; 100 * 2], vec![0usize; 100 * 2]);
            let (mut lo, mut hi) = (vec![(0, 0); tokens * 60], vec![(0, 0); tokens * 40]);
            let mut scratch = vec![(); 3];
            let targets = [ScatterTarget::new(&mut lo, 60, 0), ScatterTarget::new(&mut hi, 40, 60)];
            pool.split_blocks_scatter(
                (&mut a, Some(&mut b)),
                2,
                block,
                targets,
                &mut scratch,
                |_| Ahead::NONE,
                |blocks, _| {
                    while let Some((first, ca, cb, mut cols)) = blocks.next_block() {
                        let cb = cb.expect("a second output");
                        assert_eq!((ca.len(), cb.len()), (cb.len(), ca.len()));
                        ca.fill(first);
                        cb.fill(first + 1);
                        let units = first..first + ca.len() / 2;
                        for (c, offset) in cols.iter_mut().zip([0, 60]) {
                            let cs = c.cols();
                            assert!(
                                cs.is_empty() || (units.contains(&(cs.start + offset)) && cs.end + offset <= units.end)
                            );
                            for t in 0..tokens {
                                for (j, v) in c.token(t).iter_mut().enumerate() {
                                    *v = (t, offset + cs.start + j);
                                }
                            }
                        }
                    }
                },
            );
            for (target, offset, n) in [(&lo, 0, 60), (&hi, 60, 40)] {
                for t in 0..tokens {
                    for c in 0..n {
                        assert_eq!(target[t * n + c], (t, offset + c), "block {block} token {t} column {c}");
                    }
                }
            }
            assert!(a.chunks(2).zip(b.chunks(2)).all(|(x, y)| x[0] + 1 == y[0] && x == [x[0]; 2]));
        }
    }

    #[test]
    fn split_blocks_scatter_gives_both_outputs_the_same_units() {
        let pool = WorkerPool::new(2, false).unwrap();
        let (mut a, mut b) = (vec![0usize; 2 * 37], vec![0usize; 2 * 37]);
        let mut scratch = vec![(); 2];
        let no_targets: [ScatterTarget<usize>; 0] = [];
        pool.split_blocks_scatter(
            (&mut a, Some(&mut b)),
            2,
            5,
            no_targets,
            &mut scratch,
            |_| Ahead::NONE,
            |blocks, _| {
                while let Some((first, ca, cb, _)) = blocks.next_block() {
                    let cb = cb.expect("a second output");
                    assert_eq!(ca.len(), cb.len());
                    for (j, (x, y)) in ca.iter_mut().zip(cb.iter_mut()).enumerate() {
                        *x = first * 2 + j;
                        *y = 1000 + first * 2 + j;
                    }
                }
            },
        );
        assert!(a.iter().enumerate().all(|(j, v)| *v == j));
        assert!(b.iter().enumerate().all(|(j, v)| *v == 1000 + j));
    }

    #[test]
    fn a_pinned_pool_after_another_on_the_same_thread_is_pinned_too() {
        // Asked on a fresh thread, before anything pinned it.
        std::thread::spawn(|| {
            let cores = core_affinity::get_core_ids().map_or(0, |c| c.len());
            assert_eq!(pinnable_cores(), cores);
            if cores < 2 {
                eprintln!("skipped: fewer than 2 cores to pin to");
                return;
            }
            match WorkerPool::new(2, true) {
                Ok(first) => {
                    assert!(first.pinned());
                    drop(first);
                    let second = WorkerPool::new(2, true).expect("the caller's own pin hid the other cores");
                    assert!(second.pinned());
                }
                // A machine whose OS refuses pinning: an error that says so, not a quiet
                // unpinned pool.
                Err(e) => assert!(e.to_string().contains("refused"), "{e}"),
            }
            assert!(!WorkerPool::new(2, false).unwrap().pinned());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pinning_more_threads_than_cores_is_an_error_that_says_so() {
        let n = pinnable_cores() + 1;
        let e = WorkerPool::new(n, true).err().expect("more threads than cores cannot be pinned").to_string();
        assert!(e.contains(&format!("pinning {n} threads")) && e.contains(&format!("{} core(s)", n - 1)), "{e}");
        assert!(WorkerPool::new(n, false).is_ok());
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = WorkerPool::new(2, false).unwrap();
        let mut out = vec![0u8; 2];
        let mut scratch = vec![(); 2];
        std::thread::sleep(SPIN * 5);
        pool.split(&mut out, 1, 1, &mut scratch, |first, chunk, _| chunk[0] = first as u8 + 1);
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn a_worker_panic_reaches_the_caller_and_the_pool_survives() {
        let pool = WorkerPool::new(2, false).unwrap();
        let mut out = vec![0u8; 2];
        let mut scratch = vec![(); 2];
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.split(&mut out, 1, 1, &mut scratch, |first, _, _| assert!(first == 0, "boom"));
        }));
        assert!(r.is_err());
        pool.split(&mut out, 1, 1, &mut scratch, |first, chunk, _| chunk[0] = first as u8 + 7);
        assert_eq!(out, [7, 8]);
    }
}
