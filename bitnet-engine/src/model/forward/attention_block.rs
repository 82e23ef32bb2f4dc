//! Causal grouped-query attention of a forward call's rows over the KV cache, split across
//! the worker pool by (row, head), or by head in tiles of a prompt's consecutive rows.

use super::*;

/// From this many rows on (a prompt chunk), attention over an encoded KV cache runs head by
/// head, so that a thread's items are consecutive rows of one head, and each head's rows are
/// decoded once per thread for all of them. Row by row, every key and value was decoded once per
/// query row (prefill measured faster this way: docs/perf-notes.md). A prompt chunk (one
/// sequence, consecutive positions) also attends in tiles of consecutive rows ([`prompt_tile`])
/// at every precision, unless row-major items already share each key among as many query heads.
pub(super) const HEAD_MAJOR_ROWS: usize = 4;

/// Most query heads one attention work item reads its KV head's rows for ([`heads_per_item`]).
pub(super) const GROUP_HEADS_MAX: usize = 4;

/// Query rows of one prompt that attend together in [`prompt_tile`]: the grouped-query
/// kernels' four heads a pass (measured faster for long prompts at f16, int8 and fp8:
/// docs/perf-notes.md; 2B4T with f16 keeps its row-major items of four heads).
pub(super) const PROMPT_TILE_ROWS: usize = 4;

/// Whether the rows are one sequence at consecutive positions (a prompt chunk).
pub(super) fn is_one_prompt(seqs: &[usize], positions: &[usize]) -> bool {
    seqs.iter().all(|&s| s == seqs[0]) && positions.iter().enumerate().all(|(i, &p)| p == positions[0] + i)
}

/// What every [`prompt_tile`] of one attention call shares.
pub(super) struct PromptTileArgs<'a> {
    kv: &'a KvCache,
    layer: usize,
    q: &'a [f32],
    seqs: &'a [usize],
    positions: &'a [usize],
    heads: usize,
    group: usize,
    scale: f32,
    ctx: SpanCtx,
}

/// Attention of query head `head` for the prompt rows `rows` (consecutive positions of one
/// sequence, at most [`PROMPT_TILE_ROWS`]) into `out` (`rows.len()` × hd): the rows' query
/// vectors go through the grouped-query kernels as if they were heads of one group, so each key
/// and value is loaded (and converted) once for the tile instead of once per row. Every float is
/// the row-by-row path's:
/// - the scores of all rows run over the last row's keys; row j uses its own first `n_j`
///   (each score is computed alone, so the extra ones change nothing), then its softmax;
/// - the weighted sums run over the keys every row sees together, then each row's few more on
///   its own, continuing the same per-element sum in the same order.
///
/// With an encoded cache the head's rows are decoded into f32 once per thread and (sequence,
/// KV head) as far as needed (`decoded`: which, and how many rows), as the head-major rows do.
pub(super) fn prompt_tile(
    a: &PromptTileArgs<'_>,
    head: usize,
    rows: Range<usize>,
    out: &mut [f32],
    s: &mut Worker,
    decoded: &mut DecodedRows,
) {
    let Worker { scores, q_tile, prompt_keys, prompt_values, rec, decoded: buf, .. } = s;
    let (t, hd) = (rows.len(), out.len() / rows.len());
    let (seq, kh) = (a.seqs[rows.start], head / a.group);
    // Keys row j sees: n0 + j.
    let (n0, n) = (a.positions[rows.start] + 1, a.positions[rows.end - 1] + 1);
    let t0 = rec.start();
    let (mut keys, mut values) = (a.kv.key_rows(a.layer, seq, kh, n), a.kv.value_rows(a.layer, seq, kh, n));
    let precision = a.kv.precision();
    if let (KvRows::Encoded(k), KvRows::Encoded(v)) = (&keys, &values) {
        decode_rows_once(precision, (seq, kh), k, v, hd, n, prompt_keys, prompt_values, decoded);
        keys = KvRows::F32(&prompt_keys[..n * hd]);
        values = KvRows::F32(&prompt_values[..n * hd]);
    }
    for (j, r) in rows.clone().enumerate() {
        q_tile[j * hd..(j + 1) * hd].copy_from_slice(&a.q[(r * a.heads + head) * hd..][..hd]);
    }
    let qs = &q_tile[..t * hd];
    let sc = &mut scores[..t * n];
    keys.scores(precision, qs, t, a.scale, sc, Some(&values), buf);
    // Each row's share of its KV head's bytes, as the row-by-row path counts them.
    let kv_bytes = rows.clone().map(|r| (a.positions[r] + 1) as u64).sum::<u64>()
        * precision.bytes_per_vector(hd) as u64
        / a.group as u64;
    let t1 = rec.end(a.ctx, Stage::Qk, t0, kv_bytes);
    // Row j's weights beyond the first n0 (j of them), kept aside, then the rows' first n0
    // weights packed n0 apart for the grouped sum.
    let mut tails = [[0f32; PROMPT_TILE_ROWS]; PROMPT_TILE_ROWS];
    for j in 0..t {
        let w = &mut sc[j * n..j * n + n0 + j];
        softmax_in_place(w);
        tails[j][..j].copy_from_slice(&w[n0..]);
    }
    for j in 1..t {
        sc.copy_within(j * n..j * n + n0, j * n0);
    }
    let t2 = rec.end(a.ctx, Stage::Softmax, t1, 0);
    out.fill(0.0);
    let ws = &sc[..t * n0];
    values.positions(0..n0, hd, precision).weighted_sum(precision, ws, t, out, None, buf);
    for j in 1..t {
        let tail = values.positions(n0..n0 + j, hd, precision);
        tail.weighted_sum(precision, &tails[j][..j], 1, &mut out[j * hd..(j + 1) * hd], None, buf);
    }
    rec.chunk_end = rec.end(a.ctx, Stage::Av, t2, kv_bytes);
}

/// Which (sequence, KV head) a thread's f32 copies of encoded keys and values hold, and how
/// many of its rows (`None`: nothing yet).
pub(super) type DecodedRows = Option<((usize, usize), usize)>;

/// Makes the first `n` keys and values of `of` (encoded `k`, `v`) f32 in `keys_f32` /
/// `values_f32`, decoding only the rows `decoded` says are not there yet: a thread's prompt
/// items of one head each need a few rows more than the last.
#[allow(clippy::too_many_arguments)]
pub(super) fn decode_rows_once(
    precision: KvPrecision,
    of: (usize, usize),
    k: &[u8],
    v: &[u8],
    hd: usize,
    n: usize,
    keys_f32: &mut [f32],
    values_f32: &mut [f32],
    decoded: &mut DecodedRows,
) {
    let done = match *decoded {
        Some((held, rows)) if held == of => rows,
        _ => 0,
    };
    if n > done {
        let vb = precision.bytes_per_vector(hd);
        decode_kv_rows(precision, &k[done * vb..], hd, &mut keys_f32[done * hd..n * hd]);
        decode_kv_rows(precision, &v[done * vb..], hd, &mut values_f32[done * hd..n * hd]);
    }
    *decoded = Some((of, n.max(done)));
}

/// Query heads per attention item (f32 and f16 caches, and encoded ones where their group
/// kernels decode each row once for the group: AVX-512, decode steps): the largest of 4, 2 that divides the
/// group and still leaves the `kv_items` × (group / that) items evenly or finely split over the
/// threads (2B4T, one token, 2 threads: 5 KV heads → 10 items of 2 heads), else 1. An item
/// reads its KV head's keys and values once for all its heads (each head's floats unchanged),
/// where one item per head had read them once per head.
pub(super) fn heads_per_item(kv_items: usize, group: usize, threads: usize) -> usize {
    for sg in [4, 2] {
        let items = kv_items * (group / sg);
        if group.is_multiple_of(sg) && (items.is_multiple_of(threads) || items >= 8 * threads) {
            return sg;
        }
    }
    1
}

/// What [`attention`] reads: the model's shape, the cache and layer, the `[rows, heads × hd]`
/// queries, each row's sequence and position, and the span context.
pub(super) struct AttentionInputs<'a> {
    pub(super) cfg: &'a ModelConfig,
    pub(super) kv: &'a KvCache,
    pub(super) layer: usize,
    pub(super) q: &'a [f32],
    pub(super) seqs: &'a [usize],
    pub(super) positions: &'a [usize],
    pub(super) ctx: SpanCtx,
}

/// Causal grouped-query attention of every (row, head), split across threads by (row, head):
/// row-major, or head-major (see [`HEAD_MAJOR_ROWS`]) into the dispatch's `mm` and then copied into `out`
/// (`[rows, heads × hd]`). Each (row, head) is the same floats either way.
pub(super) fn attention(d: Dispatch<'_>, inputs: &AttentionInputs<'_>, out: &mut [f32], upcoming: Upcoming) {
    let Dispatch { pool, mm: scratch, workers, .. } = d;
    let AttentionInputs { cfg, kv, layer, q, seqs, positions, ctx } = *inputs;
    let (hd, heads) = (cfg.head_dim(), cfg.heads);
    let rows = seqs.len();
    let group = heads / cfg.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let precision = kv.precision();
    // One prompt's rows: tiles of consecutive rows of one head ([`prompt_tile`]), head-major,
    // unless row-major items already share each key among as many query heads (f32 and f16
    // caches of a model whose KV heads serve 4 query heads each, as 2B4T's: there the tiles
    // measured slower, for their copies and extra scores).
    let row_major_heads =
        if precision.is_encoded() { 1 } else { heads_per_item(rows * cfg.kv_heads, group, pool.threads()) };
    let tiled = rows >= HEAD_MAJOR_ROWS && row_major_heads < PROMPT_TILE_ROWS && is_one_prompt(seqs, positions);
    let head_major = tiled || (precision.is_encoded() && rows >= HEAD_MAJOR_ROWS);
    // Query heads per work item: 1, or a share of a KV head's group read in one pass (encoded
    // rows only where the group kernels decode them once, and not for a prompt's head-major
    // items, which decode each head's rows once into f32 first).
    let grouped = !tiled && (!precision.is_encoded() || (!head_major && encoded_groups_read_once()));
    let sg = if grouped { heads_per_item(rows * cfg.kv_heads, group, pool.threads()) } else { 1 };
    let items_per_row = heads / sg;
    // Item i's (row, first head).
    let at = |i: usize| if head_major { (i % rows, i / rows) } else { (i / items_per_row, i % items_per_row * sg) };
    let on = workers[0].rec.on();
    let t_split = workers[0].rec.start();
    workers[0].rec.begin_split(t_split);
    let vec_bytes = precision.bytes_per_vector(hd) as u64;
    let dst = if head_major { &mut scratch[..out.len()] } else { &mut *out };
    let block_items = if tiled { PROMPT_TILE_ROWS } else { 1 };
    let tile_args = PromptTileArgs { kv, layer, q, seqs, positions, heads, group, scale, ctx };
    let threads = pool.threads();
    pool.split_blocks(
        dst,
        sg * hd,
        block_items,
        workers,
        |i| upcoming.ahead(threads, i),
        |blocks, s| {
            if tiled {
                // Items are (head, row), head-major: each block's items in runs of up to
                // PROMPT_TILE_ROWS consecutive rows of one head.
                let mut decoded = None;
                let mut started = false;
                while let Some((first, chunk)) = blocks.next_block() {
                    let items = chunk.len() / hd;
                    let mut j = 0;
                    while j < items {
                        let (row, head) = ((first + j) % rows, (first + j) / rows);
                        let t = (items - j).min(rows - row).min(PROMPT_TILE_ROWS);
                        if !started {
                            s.rec.chunk_start = s.rec.start();
                            started = true;
                        }
                        prompt_tile(&tile_args, head, row..row + t, &mut chunk[j * hd..(j + t) * hd], s, &mut decoded);
                        j += t;
                    }
                }
                return;
            }
            let mut started = false;
            // With an encoded cache and head-major items: what `s.prompt_keys` / `s.prompt_values`
            // hold ([`DecodedRows`]).
            let mut decoded = None;
            while let Some((first, chunk)) = blocks.next_block() {
                let items = chunk.len() / (sg * hd);
                for (j, o) in chunk.chunks_exact_mut(sg * hd).enumerate() {
                    let item = first + j;
                    let (row, head) = at(item);
                    let (seq, pos, kh) = (seqs[row], positions[row], head / group);
                    let t0 = s.rec.start();
                    if j == 0 {
                        if !started {
                            s.rec.chunk_start = t0;
                            started = true;
                        }
                        kv.key_rows(layer, seq, kh, pos + 1).prefetch();
                    }
                    let (mut keys, mut values) =
                        (kv.key_rows(layer, seq, kh, pos + 1), kv.value_rows(layer, seq, kh, pos + 1));
                    let next_keys = (j + 1 < items).then(|| {
                        let (row, head) = at(item + 1);
                        kv.key_rows(layer, seqs[row], head / group, positions[row] + 1)
                    });
                    // The KV head's bytes counted once per row however many items share it (sg of
                    // its group's query heads each), as `bitnet-bench` counts them per step: a stage's
                    // GB/s is then memory traffic, not bytes touched again in cache.
                    let kv_bytes = vec_bytes * (pos + 1) as u64 * sg as u64 / group as u64;
                    let n = pos + 1;
                    if let (KvRows::Encoded(k), KvRows::Encoded(v), true) = (&keys, &values, head_major) {
                        // Head-major items are one head each (sg = 1): decode only the rows this
                        // item needs beyond those already decoded, then attend over the f32 rows
                        // as over an f32 cache.
                        decode_rows_once(
                            precision,
                            (seq, kh),
                            k,
                            v,
                            hd,
                            n,
                            &mut s.prompt_keys,
                            &mut s.prompt_values,
                            &mut decoded,
                        );
                        keys = KvRows::F32(&s.prompt_keys[..n * hd]);
                        values = KvRows::F32(&s.prompt_values[..n * hd]);
                    }
                    // The sg query heads over their KV head's rows (each read once for all of
                    // them: every head's scores, softmax and sum are the floats of the one-head
                    // path). The cache is cold at every step (the weights streamed since evicted
                    // it), and one head's rows are a few KiB, too short for the hardware
                    // prefetcher: the scores ask for this head's values a share at a time while
                    // they run, and the weighted sum for the next item's keys, so that memory
                    // streams under the arithmetic throughout.
                    let qs = &q[row * heads * hd + head * hd..][..sg * hd];
                    let scores = &mut s.scores[..sg * n];
                    keys.scores(precision, qs, sg, scale, scores, Some(&values), &mut s.decoded);
                    let t1 = s.rec.end(ctx, Stage::Qk, t0, kv_bytes);
                    for w in scores.chunks_exact_mut(n) {
                        softmax_in_place(w);
                    }
                    let t2 = s.rec.end(ctx, Stage::Softmax, t1, 0);
                    o.fill(0.0);
                    values.weighted_sum(precision, scores, sg, o, next_keys.as_ref(), &mut s.decoded);
                    s.rec.chunk_end = s.rec.end(ctx, Stage::Av, t2, kv_bytes);
                }
            }
        },
    );
    let rec = &mut workers[0].rec;
    if on {
        rec.end_split(ctx, t_split);
    }
    if head_major {
        rec.time(ctx, Stage::Transpose, 0, || {
            for (head, src) in scratch[..out.len()].chunks_exact(rows * hd).enumerate() {
                for (row, v) in src.chunks_exact(hd).enumerate() {
                    out[(row * heads + head) * hd..][..hd].copy_from_slice(v);
                }
            }
        });
    }
}
