//! SentencePiece-style BPE (`tokenizer.ggml.model` "llama"): characters merged by token score,
//! with bytes (`<0xXX>`) for what no token covers.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{Symbol, Vocab};

/// A pair of adjacent symbols whose concatenation is a token.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// Byte length of the concatenation when queued; a mismatch later means a side has changed.
    size: usize,
}

// The queue pops the highest score first and, among equal scores, the leftmost pair.
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// Appends the tokens of `text`, whose spaces the caller has already replaced by '▁'.
pub(crate) fn encode(vocab: &Vocab, unk: Option<u32>, text: &str, out: &mut Vec<u32>) {
    let n = text.chars().count();
    let mut symbols: Vec<Symbol> = text
        .char_indices()
        .enumerate()
        .map(|(i, (start, c))| Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: (i + 1 < n).then_some(i + 1),
        })
        .collect();
    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: usize, right: usize| {
        let (l, r) = (symbols[left], symbols[right]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(id) = vocab.id(joined) {
            queue.push(Bigram { left, right, score: vocab.scores[id as usize], size: joined.len() });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, i - 1, i);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(a) = r.next {
            symbols[a].prev = Some(b.left);
        }
        if let Some(p) = symbols[b.left].prev {
            try_add(&mut queue, &symbols, p, b.left);
        }
        if let Some(a) = r.next {
            try_add(&mut queue, &symbols, b.left, a);
        }
    }
    // Every merged symbol is a token; a single character that is not one becomes its bytes
    // (llama.cpp's resegment reduces to this, as its merge map only holds multi-character texts).
    let mut at = (!symbols.is_empty()).then_some(0);
    while let Some(i) = at {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    // llama.cpp throws when a byte has no token; the unknown token stands in here.
                    if let Some(id) = vocab.byte_token(b).or(unk) {
                        out.push(id);
                    }
                }
            }
        }
        at = s.next;
    }
}
