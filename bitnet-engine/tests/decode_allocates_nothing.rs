//! After warm-up, a decode step allocates nothing on the heap (single and batched, every
//! kernel family in both forms, quantized KV), with per-stage spans off, aggregated or on a
//! timeline. A counting global allocator, alone in this test binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bitnet_engine::instrument::Level;
use bitnet_engine::{
    IsaLevel, Kernel, KernelFamily, KernelForm, KvPrecision, LogitsFor, Model, State, StateOptions, WeightFormat,
};

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
        let mut model = Model::synthetic("tiny", format, 7, 2).unwrap();
        if format == WeightFormat::Tq2_0 {
            // A GGUF's Q6_K embedding and LM head, run as stored.
            let (vocab, hidden) = (model.config.vocab, model.config.hidden);
            model.weights.token_embd = bitnet_engine::formats::Q6kRows::random(vocab, hidden, 1e-4, 3).unwrap().into();
        }
        let mut cases = vec![
            (1usize, KvPrecision::F16, KernelForm::Fused, Level::Off),
            (4, KvPrecision::Int4, KernelForm::Fused, Level::Aggregate),
            (1, KvPrecision::F32, KernelForm::Split, Level::Timeline),
            (2, KvPrecision::Int8, KernelForm::Split, Level::Aggregate),
            // Eight tokens: the projections' blocks are scattered as 8 × 8 tiles.
            (8, KvPrecision::F16, KernelForm::Fused, Level::Timeline),
        ];
        if family == KernelFamily::Tq1 {
            // Each thread builds its lookup tables into scratch made with the state (for up to
            // LUT_MAX_BATCH tokens of the widest rows); a perm case times its `tables` spans.
            cases.push((1, KvPrecision::F16, KernelForm::Lut, Level::Off));
            cases.push((3, KvPrecision::Int4, KernelForm::Lut, Level::Aggregate));
            cases.push((2, KvPrecision::F16, KernelForm::Perm, Level::Off));
            cases.push((4, KvPrecision::F16, KernelForm::Perm, Level::Timeline));
        }
        for (batch, kv, form, level) in cases {
            let mut opts = StateOptions::new(batch, 64, kv, 2);
            // (perm: portable where the CPU lacks AVX-512 VBMI)
            let kernel =
                Kernel::new(family, IsaLevel::best(), form).or_else(|_| Kernel::new(family, IsaLevel::Scalar, form));
            opts.kernel = Some(kernel.unwrap());
            let mut st = State::new(&model, &opts).unwrap();
            st.set_instrument(level, 100_000);
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
                st.time_sample(|st| {
                    for (b, t) in tokens.iter_mut().enumerate() {
                        *t = bitnet_engine::model::argmax(st.logits(b).unwrap());
                    }
                });
            }
            let allocated = ALLOCATIONS.load(Ordering::SeqCst) - before;
            assert_eq!(
                allocated,
                0,
                "{format} / {family} {form} B={batch} {kv} spans {}: {allocated} allocations in 37 decode steps",
                level.name()
            );
            if level != Level::Off && bitnet_engine::instrument::ENABLED {
                assert!(st.recorders().next().unwrap().totals().count() > 0, "spans were recorded");
            }
        }
    }
}
