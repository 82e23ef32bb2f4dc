//! `bitnet-trace`: per-stage spans, flamegraphs, timelines, hardware counters and profiles of
//! `bitnet-engine` runs. Not built yet: the engine's kernels (with their stage functions) come
//! first; see the tracker issue "Per-stage spans in the engine and bitnet-trace".
