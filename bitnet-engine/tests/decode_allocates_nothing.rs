//! After warm-up, a decode step allocates nothing on the heap (single and batched, every
//! kernel family, quantized KV). A counting global allocator, alone in this test binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bitnet_engine::{Kernel, KernelFamily, KvPrecision, LogitsFor, Model, State, StateOptions, WeightFormat};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    for (format, family) in [
        (WeightFormat::I2, KernelFamily::I2s),
        (WeightFormat::Tq2_0, KernelFamily::Tq2),
        (WeightFormat::Tq1_0, KernelFamily::Tq1),
        (WeightFormat::BitPlanes, KernelFamily::Xnor),
    ] {
        let model = Model::synthetic("tiny", format, 7, 2).unwrap();
        for (batch, kv) in [(1usize, KvPrecision::F16), (4, KvPrecision::Int4)] {
            let mut opts = StateOptions::new(batch, 64, kv, 2);
            opts.kernel = Some(Kernel::best(family));
            let mut st = State::new(&model, &opts).unwrap();
            let seqs: Vec<usize> = (0..batch).collect();
            let mut tokens: Vec<u32> = (0..batch as u32).map(|b| 3 + b).collect();
            let mut positions = vec![0usize; batch];
            // Warm-up: first uses of every buffer and code path.
            for pos in 0..3 {
                positions.fill(pos);
                st.forward(&model, &tokens, &seqs, &positions, LogitsFor::All).unwrap();
            }
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            for pos in 3..40 {
                positions.fill(pos);
                st.forward(&model, &tokens, &seqs, &positions, LogitsFor::All).unwrap();
                for (b, t) in tokens.iter_mut().enumerate() {
                    *t = bitnet_engine::model::argmax(st.logits(b).unwrap());
                }
            }
            let allocated = ALLOCATIONS.load(Ordering::SeqCst) - before;
            assert_eq!(allocated, 0, "{format} / {family} B={batch} {kv}: {allocated} allocations in 37 decode steps");
        }
    }
}
