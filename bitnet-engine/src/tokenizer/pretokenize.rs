//! Pre-tokenization of byte-level BPE: the expression lists llama.cpp uses per `tokenizer.ggml.pre`.
//!
//! llama.cpp applies a list of expressions in sequence: each one splits every piece the previous
//! one left, and the text between two matches stays a piece of its own (nothing is dropped). For
//! the gpt-2 and llama-3 expressions it runs hand-written splitters, for the others std::regex over
//! the text with each code point collapsed to a byte naming its category. Both behave exactly as the
//! plain expressions with Unicode categories (its "no match" path covers the same single code points
//! a regex leaves between matches), so fancy-regex over the same expressions gives the same pieces, up
//! to code points whose category changed between llama.cpp's Unicode tables and the regex crate's.

use fancy_regex::Regex;

use crate::error::{Error, Result};

/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_DEFAULT`: used when `tokenizer.ggml.pre` is absent or "default".
const DEFAULT: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// `LLAMA_VOCAB_PRE_TYPE_LLAMA3`, with llama.cpp's case-insensitive contractions spelt out.
const LLAMA3: [&str; 1] = [
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// `LLAMA_VOCAB_PRE_TYPE_GPT2`.
const GPT2: [&str; 1] = [r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"];

/// `tokenizer.ggml.pre` values llama.cpp maps to the llama-3 expression (it also sets
/// `ignore_merges` and a default `add_bos` of true for them).
pub(crate) const LLAMA3_NAMES: [&str; 9] =
    ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"];

/// `tokenizer.ggml.pre` values llama.cpp maps to the gpt-2 expression with no other flag.
const GPT2_NAMES: [&str; 10] = [
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
];

/// The expressions of one pre-tokenizer, compiled.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value (`None`: the key is absent).
    pub(crate) fn for_pre(pre: Option<&str>) -> Result<Self> {
        let exprs: &[&str] = match pre {
            None | Some("default") => &DEFAULT,
            Some(p) if LLAMA3_NAMES.contains(&p) => &LLAMA3,
            Some(p) if GPT2_NAMES.contains(&p) => &GPT2,
            Some(p) => {
                return Err(Error::Unsupported(format!(
                    "metadata key 'tokenizer.ggml.pre' is '{p}'; this tokenizer knows 'default' (or no key), {} and {}",
                    LLAMA3_NAMES.join(", "),
                    GPT2_NAMES.join(", ")
                )))
            }
        };
        let regexes = exprs
            .iter()
            .map(|e| Regex::new(e).map_err(|err| Error::Value(format!("pre-tokenizer expression {e:?}: {err}"))))
            .collect::<Result<_>>()?;
        Ok(Self { regexes })
    }

    /// Splits `text` into the words BPE merges within; the words concatenate back to `text`.
    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut pieces = if text.is_empty() { Vec::new() } else { vec![text] };
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                split_one(re, piece, &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

/// Matches of `re` in `piece` and the text between them, in order.
fn split_one<'a>(re: &Regex, piece: &'a str, out: &mut Vec<&'a str>) {
    let mut last = 0;
    for m in re.find_iter(piece) {
        match m {
            Ok(m) => {
                if m.start() > last {
                    out.push(&piece[last..m.start()]);
                }
                if m.end() > m.start() {
                    out.push(m.as_str());
                }
                last = m.end();
            }
            // Only the backtracking limit fails here (none of these expressions backtracks much);
            // the rest of the piece then stays whole rather than the call failing.
            Err(_) => break,
        }
    }
    if last < piece.len() {
        out.push(&piece[last..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: Option<&str>, text: &str) -> Vec<String> {
        PreTokenizer::for_pre(pre).unwrap().split(text).into_iter().map(str::to_owned).collect()
    }

    #[test]
    fn llama3_splits_digits_by_three_and_keeps_contractions() {
        assert_eq!(split(Some("llama-bpe"), "1234567 don't"), ["123", "456", "7", " don", "'t"]);
        assert_eq!(split(Some("llama-bpe"), "I'LL  go\n\n x"), ["I", "'LL", " ", " go", "\n\n", " x"]);
    }

    #[test]
    fn gpt2_is_case_sensitive_and_keeps_digit_runs() {
        assert_eq!(split(Some("gpt-2"), "I'LL 1234567"), ["I", "'", "LL", " 1234567"]);
    }

    #[test]
    fn default_splits_punctuation_then_digits_by_three_from_the_left() {
        assert_eq!(split(None, "a+=b 1234567"), ["a", "+=", "b", " ", "123", "456", "7"]);
    }

    #[test]
    fn unknown_pre_names_the_value() {
        let err = PreTokenizer::for_pre(Some("klingon")).unwrap_err();
        assert!(matches!(&err, Error::Unsupported(m) if m.contains("'klingon'")), "{err}");
    }
}
