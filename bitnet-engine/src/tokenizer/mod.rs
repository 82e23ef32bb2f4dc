//! Tokenizers read from GGUF metadata, giving the token ids llama.cpp gives.
//!
//! - `tokenizer.ggml.model` "gpt2": byte-level BPE (`bpe`) after the pre-tokenizer named by
//!   `tokenizer.ggml.pre` (`pretokenize`; llama.cpp's "default" list when the key is absent).
//! - "llama": SentencePiece-style merges by score with byte fallback (`spm`).
//!
//! Special tokens are matched before either (`special`). Defaults for absent keys (BOS/EOS ids,
//! `add_bos`, `add_space_prefix`) are llama.cpp's, which differ between the two models.

mod bpe;
mod pretokenize;
mod special;
mod spm;

use std::collections::{BTreeSet, HashMap};

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};
use special::Fragment;

/// One symbol of a piece being merged (BPE and SPM alike): a byte range of the piece, linked to
/// its neighbours, so a merge is O(1) and merged symbols drop out of the list.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// llama.cpp's token attributes (`llama_token_attr`), from `tokenizer.ggml.token_type`.
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;

    /// The attribute of a GGUF token type (`llama_token_type`); undefined or unknown types get none.
    pub fn from_token_type(t: i64) -> u16 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0,
        }
    }
}

/// The token texts and what belongs to each.
#[derive(Debug)]
pub(crate) struct Vocab {
    texts: Vec<String>,
    ids: HashMap<String, u32>,
    attrs: Vec<u16>,
    scores: Vec<f32>,
}

impl Vocab {
    fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The token of one byte in SentencePiece vocabularies: `<0xXX>`, else the byte itself.
    fn byte_token(&self, b: u8) -> Option<u32> {
        self.id(&format!("<0x{b:02X}>")).or_else(|| if b.is_ascii() { self.id(&(b as char).to_string()) } else { None })
    }
}

#[derive(Debug)]
enum Model {
    Bpe(Box<bpe::Bpe>),
    Spm,
}

/// A tokenizer as llama.cpp builds it from a GGUF file's `tokenizer.ggml.*` metadata.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    kind: String,
    pre: String,
    /// Special tokens in the order the partition tries them.
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    eog: BTreeSet<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl Tokenizer {
    /// From GGUF metadata: `tokenizer.ggml.model` "gpt2" (byte-level BPE with merges) or "llama"
    /// (SentencePiece with scores and byte fallback). Errors name the missing or malformed key.
    pub fn from_gguf(f: &GgufFile<'_>) -> Result<Self> {
        let kind = match f.get("tokenizer.ggml.model") {
            None => {
                return Err(Error::Format(
                    "metadata key 'tokenizer.ggml.model' is missing: this model has no tokenizer".into(),
                ))
            }
            Some(v) => v.as_str().ok_or_else(|| wrong_type("tokenizer.ggml.model", v, "a string"))?.to_owned(),
        };
        let pre_key = match f.get("tokenizer.ggml.pre") {
            None => None,
            Some(v) => Some(v.as_str().ok_or_else(|| wrong_type("tokenizer.ggml.pre", v, "a string"))?),
        };
        let is_bpe = match kind.as_str() {
            "gpt2" => true,
            "llama" => false,
            other => {
                return Err(Error::Unsupported(format!(
                    "metadata key 'tokenizer.ggml.model' is '{other}'; this tokenizer knows 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)"
                )))
            }
        };

        let texts = string_array(f, "tokenizer.ggml.tokens")?.ok_or_else(|| {
            Error::Format("metadata key 'tokenizer.ggml.tokens' is missing: the vocabulary is needed".into())
        })?;
        let n = texts.len();
        let texts: Vec<String> =
            texts.into_iter().enumerate().map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { t }).collect();
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            if ids.insert(t.clone(), i as u32).is_some() {
                return Err(Error::Format(format!(
                    "metadata key 'tokenizer.ggml.tokens': token {i} {t:?} repeats an earlier token"
                )));
            }
        }
        let scores = match number_array(f, "tokenizer.ggml.scores", n, |v| v.as_f64().map(|x| x as f32))? {
            Some(s) => s,
            None => vec![0.0; n],
        };
        let attrs = match number_array(f, "tokenizer.ggml.token_type", n, |v| match *v {
            Value::I32(t) => Some(t as i64),
            _ => v.as_u64().map(|t| t as i64),
        })? {
            Some(types) => types.into_iter().map(attr::from_token_type).collect(),
            None => vec![attr::NORMAL; n],
        };
        let mut vocab = Vocab { texts, ids, attrs, scores };

        let llama3 = pre_key.is_some_and(|p| pretokenize::LLAMA3_NAMES.contains(&p));
        let (model, pre) = if is_bpe {
            let merges = string_array(f, "tokenizer.ggml.merges")?.ok_or_else(|| {
                Error::Format(
                    "metadata key 'tokenizer.ggml.merges' is missing: a gpt2 tokenizer needs its BPE merges".into(),
                )
            })?;
            let pre = pretokenize::PreTokenizer::for_pre(pre_key)?;
            (Model::Bpe(Box::new(bpe::Bpe::new(pre, &merges, llama3)?)), pre_key.unwrap_or("default").to_owned())
        } else {
            (Model::Spm, "default".to_owned())
        };

        // llama.cpp's defaults: LLaMA's ids for SentencePiece, 11 for both BOS and EOS in BPE; a
        // default outside the vocabulary is dropped, a given id outside it ignored.
        let in_range = |id: u32| ((id as usize) < n).then_some(id);
        let (bos_default, eos_default, unk_default) =
            if is_bpe { (Some(11), Some(11), None) } else { (Some(1), Some(2), Some(0)) };
        let id_key = |key: &str, default: Option<u32>| -> Result<Option<u32>> {
            let default = default.and_then(in_range);
            Ok(match f.get(key) {
                None => default,
                Some(v) => {
                    let id = v.as_u64().ok_or_else(|| wrong_type(key, v, "a token id"))?;
                    u32::try_from(id).ok().and_then(in_range).or(default)
                }
            })
        };
        let bos = id_key("tokenizer.ggml.bos_token_id", bos_default)?;
        let eos = id_key("tokenizer.ggml.eos_token_id", eos_default)?;
        let unk = id_key("tokenizer.ggml.unknown_token_id", unk_default)?;
        let eot = id_key("tokenizer.ggml.eot_token_id", None)?;
        let eom = id_key("tokenizer.ggml.eom_token_id", None)?;
        let fim = |new: &str, old: Option<&str>| -> Result<Option<u32>> {
            Ok(match old {
                Some(old) if f.get(new).is_none() => id_key(old, None)?,
                _ => id_key(new, None)?,
            })
        };
        let fim_pre = fim("tokenizer.ggml.fim_pre_token_id", Some("tokenizer.ggml.prefix_token_id"))?;
        let fim_suf = fim("tokenizer.ggml.fim_suf_token_id", Some("tokenizer.ggml.suffix_token_id"))?;
        let fim_mid = fim("tokenizer.ggml.fim_mid_token_id", Some("tokenizer.ggml.middle_token_id"))?;
        let fim_pad = fim("tokenizer.ggml.fim_pad_token_id", None)?;
        let fim_rep = fim("tokenizer.ggml.fim_rep_token_id", None)?;
        let fim_sep = fim("tokenizer.ggml.fim_sep_token_id", None)?;

        let add_bos = bool_key(f, "tokenizer.ggml.add_bos_token")?.unwrap_or(!is_bpe || llama3);
        let add_eos = bool_key(f, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let add_space_prefix = bool_key(f, "tokenizer.ggml.add_space_prefix")?.unwrap_or(!is_bpe);
        if add_bos && bos.is_none() {
            return Err(Error::Format(
                "the tokenizer adds a BOS token but has none: 'tokenizer.ggml.bos_token_id' is missing or out of range"
                    .into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(Error::Format("the tokenizer adds an EOS token but has none: 'tokenizer.ggml.eos_token_id' is missing or out of range".into()));
        }

        // Roles found by text make their tokens control tokens, which changes what the partition
        // matches, so this precedes the special-token order.
        let eot = special::find_role(&mut vocab, eot, special::EOT_TEXTS);
        let eom = special::find_role(&mut vocab, eom, special::EOM_TEXTS);
        special::find_role(&mut vocab, fim_pre, special::FIM_PRE_TEXTS);
        special::find_role(&mut vocab, fim_suf, special::FIM_SUF_TEXTS);
        special::find_role(&mut vocab, fim_mid, special::FIM_MID_TEXTS);
        let fim_pad = special::find_role(&mut vocab, fim_pad, special::FIM_PAD_TEXTS);
        let fim_rep = special::find_role(&mut vocab, fim_rep, special::FIM_REP_TEXTS);
        let fim_sep = special::find_role(&mut vocab, fim_sep, special::FIM_SEP_TEXTS);
        let eog = special::eog_set(&mut vocab, &[fim_pad, fim_rep, fim_sep, eos, eot, eom]);
        let specials = special::special_order(&vocab);

        Ok(Self { vocab, model, kind, pre, specials, bos, eos, unk, eog, add_bos, add_eos, add_space_prefix })
    }

    /// The token ids of `text`, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS where the vocabulary asks for them; `parse_special` matches
    /// control tokens written in the text (user-defined tokens are matched either way).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let fragments = special::partition(&self.vocab, &self.specials, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Bpe(bpe) => {
                for f in fragments {
                    match f {
                        Fragment::Text(t) => bpe.encode(&self.vocab, t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm => {
                // SentencePiece sees a space before the text and after every special token.
                let mut after_special = true;
                let mut buf = String::new();
                for f in fragments {
                    match f {
                        Fragment::Text(t) => {
                            buf.clear();
                            if self.add_space_prefix && after_special {
                                buf.push('▁');
                            }
                            buf.extend(t.chars().map(|c| if c == ' ' { '▁' } else { c }));
                            spm::encode(&self.vocab, self.unk, &buf, &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The bytes of one token as `llama_token_to_piece(id, lstrip = 0, special)`: control and
    /// unknown tokens are empty unless `special`; byte tokens are their byte; an id outside the
    /// vocabulary is empty.
    pub fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_piece(id, special, &mut out);
        out
    }

    fn append_piece(&self, id: u32, special: bool, out: &mut Vec<u8>) {
        let (Some(&a), Some(text)) = (self.vocab.attrs.get(id as usize), self.vocab.texts.get(id as usize)) else {
            return;
        };
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return;
        }
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            match &self.model {
                Model::Bpe(bpe) => bpe.decode_text(text, out),
                Model::Spm => out.extend_from_slice(text.replace('▁', " ").as_bytes()),
            }
        } else if a & attr::BYTE != 0 {
            // "<0xXX>"; llama.cpp reads the two hex digits at offset 3.
            if let Some(b) = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
            }
        }
    }

    /// The text of `ids` as llama.cpp's `llama_detokenize(remove_special = false, unparse_special =
    /// false)` gives it, without its `clean_spaces` pass (which is lossy and not what streaming
    /// shows): control tokens render as nothing and, with `add_space_prefix`, one leading space of
    /// the first token is dropped. Invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut stream = StreamDecoder::new(self);
        let mut text: String = ids.iter().map(|&id| stream.push(id)).collect();
        text.push_str(&stream.finish());
        text
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    pub fn vocab_size(&self) -> usize {
        self.vocab.texts.len()
    }
    /// The model: "gpt2" or "llama".
    pub fn kind(&self) -> &str {
        &self.kind
    }
    /// The pre-tokenizer used: `tokenizer.ggml.pre`, or "default" when absent (always "default"
    /// for "llama", which has none).
    pub fn pre(&self) -> &str {
        &self.pre
    }
    /// Whether generation ends at `id`: EOS, EOT, EOM and the tokens llama.cpp recognises by text.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
}

/// Streams text out of token ids, holding back an incomplete UTF-8 sequence until the tokens that
/// complete it arrive. The concatenated output equals [`Tokenizer::decode`] of all ids.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
    first: bool,
}

impl<'t> StreamDecoder<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        Self { tokenizer, pending: Vec::new(), first: true }
    }

    /// The text that `id` completes: possibly empty, while a character is split across tokens.
    pub fn push(&mut self, id: u32) -> String {
        let start = self.pending.len();
        self.tokenizer.append_piece(id, false, &mut self.pending);
        if std::mem::take(&mut self.first) && self.tokenizer.add_space_prefix && self.pending.get(start) == Some(&b' ')
        {
            self.pending.remove(start);
        }
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).expect("checked valid"));
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// What is still held back, lossily (an incomplete sequence becomes U+FFFD).
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

/// The tokenizer in `path`'s metadata. Errors name the file (and the missing key of a model
/// that has no tokenizer).
pub fn load_tokenizer(path: &std::path::Path) -> Result<Tokenizer> {
    crate::gguf::with_parsed(path, Tokenizer::from_gguf)
}

fn wrong_type(key: &str, v: &Value, expected: &str) -> Error {
    Error::Format(format!("metadata key '{key}' is {v}; expected {expected}"))
}

fn bool_key(f: &GgufFile<'_>, key: &str) -> Result<Option<bool>> {
    match f.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong_type(key, v, "a bool")),
    }
}

/// An array of strings, or `None` when the key is absent.
fn string_array(f: &GgufFile<'_>, key: &str) -> Result<Option<Vec<String>>> {
    let Some(v) = f.get(key) else { return Ok(None) };
    let Value::Array(items) = v else { return Err(wrong_type(key, v, "an array of strings")) };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_str()
                .map(str::to_owned)
                .ok_or_else(|| Error::Format(format!("metadata key '{key}': entry {i} is {item}; expected a string")))
        })
        .collect::<Result<_>>()
        .map(Some)
}

/// A numeric array with at least `n` entries (one per token), or `None` when the key is absent.
fn number_array<T>(f: &GgufFile<'_>, key: &str, n: usize, get: impl Fn(&Value) -> Option<T>) -> Result<Option<Vec<T>>> {
    let Some(v) = f.get(key) else { return Ok(None) };
    let Value::Array(items) = v else { return Err(wrong_type(key, v, "an array of numbers")) };
    if items.len() < n {
        return Err(Error::Format(format!(
            "metadata key '{key}' has {} entries; the vocabulary has {n} tokens",
            items.len()
        )));
    }
    items[..n]
        .iter()
        .enumerate()
        .map(|(i, item)| {
            get(item)
                .ok_or_else(|| Error::Format(format!("metadata key '{key}': entry {i} is {item}; expected a number")))
        })
        .collect::<Result<_>>()
        .map(Some)
}

#[cfg(test)]
mod tests;
