//! Byte-level BPE (`tokenizer.ggml.model` "gpt2"): GPT-2's byte-to-character mapping, then merges
//! by rank within each pre-tokenized word.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::pretokenize::PreTokenizer;
use super::{Symbol, Vocab};
use crate::error::{Error, Result};

/// GPT-2's reversible mapping of the 256 byte values to printable characters: bytes that are
/// printable Latin-1 map to themselves, the others to U+0100.. in byte order.
pub(crate) fn byte_to_char() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        map[b as usize] = char::from_u32(c).expect("below U+0200");
    }
    map
}

#[derive(Debug)]
pub(crate) struct Bpe {
    pub(crate) pre: PreTokenizer,
    /// Merge text as stored ("left right") → (rank, byte length of left). Keyed by the whole text so
    /// a lookup needs no allocation; the length tells "a b c" as ("a", "b c") from ("a b", "c").
    merges: HashMap<String, (u32, u32)>,
    /// llama.cpp's `ignore_merges` (llama-3): a word that is a token as a whole is emitted as is.
    ignore_merges: bool,
    byte_char: [char; 256],
    char_byte: HashMap<char, u8>,
}

impl Bpe {
    pub(crate) fn new(pre: PreTokenizer, merges: &[String], ignore_merges: bool) -> Result<Self> {
        let mut map = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let rank = u32::try_from(rank)
                .map_err(|_| Error::Format("metadata key 'tokenizer.ggml.merges' has more than 2^32 entries".into()))?;
            // llama.cpp splits at the first space after the first byte; a merge without one can
            // never apply, and the first of duplicated merges keeps its rank.
            if let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) {
                map.entry(m.clone()).or_insert((rank, pos as u32));
            }
        }
        let byte_char = byte_to_char();
        let char_byte = byte_char.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        Ok(Self { pre, merges: map, ignore_merges, byte_char, char_byte })
    }

    /// Appends the tokens of `text` (one fragment between special tokens).
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut word = String::new();
        let mut key = String::new();
        let mut symbols = Vec::new();
        let mut queue = BinaryHeap::new();
        for raw in self.pre.split(text) {
            word.clear();
            word.extend(raw.bytes().map(|b| self.byte_char[b as usize]));
            if self.ignore_merges {
                if let Some(id) = vocab.id(&word) {
                    out.push(id);
                    continue;
                }
            }
            self.merge(&word, &mut symbols, &mut queue, &mut key);
            let mut at = (!symbols.is_empty()).then_some(0);
            while let Some(i) = at {
                let s: Symbol = symbols[i];
                let text = &word[s.start..s.start + s.len];
                match vocab.id(text) {
                    Some(id) => out.push(id),
                    // As llama.cpp: each byte of the symbol looked up alone; bytes of a multi-byte
                    // character are not tokens and are dropped.
                    None => out.extend(
                        text.char_indices()
                            .filter_map(|(i, c)| (c.len_utf8() == 1).then(|| vocab.id(&text[i..i + 1])).flatten()),
                    ),
                }
                at = s.next;
            }
        }
    }

    /// Merges the characters of `word` into `symbols`: always the pair of lowest rank, the leftmost
    /// of equal ranks first, as llama.cpp's queue does. Stale queue entries (a side that has since
    /// grown or been absorbed) are skipped when popped.
    fn merge(
        &self,
        word: &str,
        symbols: &mut Vec<Symbol>,
        queue: &mut BinaryHeap<Reverse<(u32, usize, usize, usize)>>,
        key: &mut String,
    ) {
        symbols.clear();
        queue.clear();
        let n = word.chars().count();
        for (i, (start, c)) in word.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
            });
        }
        let push = |queue: &mut BinaryHeap<_>, key: &mut String, symbols: &[Symbol], left: usize, right: usize| {
            let (l, r) = (symbols[left], symbols[right]);
            key.clear();
            key.push_str(&word[l.start..l.start + l.len]);
            key.push(' ');
            key.push_str(&word[r.start..r.start + r.len]);
            if let Some(&(rank, left_len)) = self.merges.get(key.as_str()) {
                if left_len as usize == l.len {
                    queue.push(Reverse((rank, left, l.len, r.len)));
                }
            }
        };
        for i in 1..symbols.len() {
            push(queue, key, symbols, i - 1, i);
        }
        while let Some(Reverse((_, left, left_len, right_len))) = queue.pop() {
            let Some(right) = symbols[left].next else { continue };
            if symbols[left].len != left_len || symbols[right].len != right_len {
                continue;
            }
            symbols[left].len += right_len;
            symbols[right].len = 0;
            let after = symbols[right].next;
            symbols[left].next = after;
            if let Some(a) = after {
                symbols[a].prev = Some(left);
            }
            if let Some(p) = symbols[left].prev {
                push(queue, key, symbols, p, left);
            }
            if let Some(a) = after {
                push(queue, key, symbols, left, a);
            }
        }
    }

    /// The bytes a byte-level token text stands for. A character outside the mapping is rendered
    /// as llama.cpp does: `[UNK_BYTE_0x<its UTF-8 in hex><the token text>]`.
    pub(crate) fn decode_text(&self, text: &str, out: &mut Vec<u8>) {
        for c in text.chars() {
            match self.char_byte.get(&c) {
                Some(&b) => out.push(b),
                None => {
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text.as_bytes());
                    out.push(b']');
                }
            }
        }
    }
}
