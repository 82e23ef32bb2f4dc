//! Special tokens: llama.cpp's partition of the text around them, and its recognition of
//! end-of-generation and other control tokens by their text.

use std::collections::BTreeSet;

use super::{attr, Vocab};

/// A piece of the input: text still to tokenize, or a special token matched verbatim.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Splits `text` around occurrences of the special tokens, longest tokens first (the order of
/// `specials`), each token splitting every text fragment left by the previous ones, as llama.cpp's
/// `tokenizer_st_partition`. Without `parse_special` only user-defined tokens are matched.
pub(crate) fn partition<'a>(vocab: &Vocab, specials: &[u32], text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
    let mut fragments = if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
    for &id in specials {
        if !parse_special && vocab.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let pat = vocab.texts[id as usize].as_str();
        if !fragments.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(pat))) {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for f in fragments {
            let Fragment::Text(mut rest) = f else {
                next.push(f);
                continue;
            };
            while let Some(at) = rest.find(pat) {
                if at > 0 {
                    next.push(Fragment::Text(&rest[..at]));
                }
                next.push(Fragment::Token(id));
                rest = &rest[at + pat.len()..];
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        fragments = next;
    }
    fragments
}

/// Ids of the special tokens llama.cpp matches (control, user-defined, unknown), longest text
/// first; equal lengths by id (llama.cpp's sort leaves their order unspecified).
pub(crate) fn special_order(vocab: &Vocab) -> Vec<u32> {
    let mask = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
    let mut ids: Vec<u32> = (0..vocab.texts.len() as u32).filter(|&i| vocab.attrs[i as usize] & mask != 0).collect();
    ids.sort_by_key(|&i| std::cmp::Reverse(vocab.texts[i as usize].len()));
    ids
}

/// Token roles llama.cpp finds by text when the metadata does not give their ids.
pub(crate) const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
pub(crate) const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
pub(crate) const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
pub(crate) const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
pub(crate) const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
pub(crate) const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
pub(crate) const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
pub(crate) const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Texts that end generation wherever they are in the vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Tokens gpt-oss needs rendered, which llama.cpp makes user-defined whatever the file says.
const ALWAYS_USER_DEFINED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The id of a role: the metadata's if given, else the lowest id whose text is one of `texts`
/// (which llama.cpp then marks as a control token).
pub(crate) fn find_role(vocab: &mut Vocab, given: Option<u32>, texts: &[&str]) -> Option<u32> {
    if given.is_some() {
        return given;
    }
    let id = texts.iter().filter_map(|t| vocab.id(t)).min()?;
    vocab.attrs[id as usize] |= attr::CONTROL;
    Some(id)
}

/// The end-of-generation set, as llama.cpp builds it: the FIM pad/repo/separator tokens, every
/// token with an EOG text (made a control token), and eos/eot/eom. Its two exceptions follow:
/// `<|end|>` is not EOG beside `<|return|>`+`<|call|>` (or `<|calls|>`+`<|flush|>`), and `</s>` is
/// a normal token beside `<|tool_response>` or `<|plamo:eos|>`.
pub(crate) fn eog_set(vocab: &mut Vocab, always: &[Option<u32>]) -> BTreeSet<u32> {
    let mut set: BTreeSet<u32> = BTreeSet::new();
    for t in EOG_TEXTS {
        if let Some(id) = vocab.id(t) {
            vocab.attrs[id as usize] |= attr::CONTROL;
            set.insert(id);
        }
    }
    for t in ALWAYS_USER_DEFINED {
        if let Some(id) = vocab.id(t) {
            vocab.attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    set.extend(always.iter().flatten());
    let has = |vocab: &Vocab, set: &BTreeSet<u32>, t: &str| vocab.id(t).filter(|id| set.contains(id));
    if let Some(end) = has(vocab, &set, "<|end|>") {
        let calls = has(vocab, &set, "<|call|>").is_some() || has(vocab, &set, "<|calls|>").is_some();
        if calls && (has(vocab, &set, "<|return|>").is_some() || has(vocab, &set, "<|flush|>").is_some()) {
            set.remove(&end);
            vocab.attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    if let Some(s) = has(vocab, &set, "</s>") {
        if has(vocab, &set, "<|tool_response>").is_some() || has(vocab, &set, "<|plamo:eos|>").is_some() {
            set.remove(&s);
            vocab.attrs[s as usize] = attr::NORMAL;
        }
    }
    set
}
