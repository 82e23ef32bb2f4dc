//! Tiny vocabularies built here, one behaviour per test.

use super::*;

/// A GGUF header with no metadata or tensors; the tests push the keys they need.
const EMPTY_GGUF: [u8; 24] = *b"GGUF\x03\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

fn strings(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| Value::String((*s).to_owned())).collect())
}

fn build(keys: Vec<(&str, Value)>) -> Result<Tokenizer> {
    let mut f = GgufFile::parse(&EMPTY_GGUF).expect("empty file parses");
    f.metadata = keys.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    Tokenizer::from_gguf(&f)
}

/// Byte-level BPE: ids 0..256 are the byte characters (id = byte), then `extra` tokens.
fn gpt2(extra: &[(&str, i32)], merges: &[&str], more: Vec<(&str, Value)>) -> Tokenizer {
    let bytes = bpe::byte_to_char();
    let mut tokens: Vec<String> = bytes.iter().map(|c| c.to_string()).collect();
    let mut types = vec![Value::I32(1); 256];
    for (t, ty) in extra {
        tokens.push((*t).to_owned());
        types.push(Value::I32(*ty));
    }
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut keys = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("gpt-2".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.merges", strings(merges)),
    ];
    keys.extend(more);
    build(keys).expect("gpt2 vocabulary builds")
}

const EOT: &str = "<|eot|>";

/// ids: 256 "ab", 257 "abc", 258 "bc", 259 "aa", 260 "<|eot|>" (control), 261 "<|endoftext|>".
fn gpt2_abc(merges: &[&str]) -> Tokenizer {
    gpt2(&[("ab", 1), ("abc", 1), ("bc", 1), ("aa", 1), (EOT, 3), ("<|endoftext|>", 1)], merges, vec![])
}

#[test]
fn bpe_merges_by_rank_not_by_position() {
    let by_ab = gpt2_abc(&["a b", "ab c", "b c"]);
    assert_eq!(by_ab.encode("abc", false, false), [257]);
    // With "b c" ranked first the pair (a, bc) has no merge.
    let by_bc = gpt2_abc(&["b c", "a b", "ab c"]);
    assert_eq!(by_bc.encode("abc", false, false), [b'a' as u32, 258]);
}

#[test]
fn bpe_merges_the_leftmost_of_equal_pairs_first() {
    let tok = gpt2_abc(&["a a"]);
    assert_eq!(tok.encode("aaa", false, false), [259, b'a' as u32]);
}

#[test]
fn bpe_special_tokens_are_matched_only_when_asked() {
    let tok = gpt2_abc(&["a b"]);
    assert_eq!(tok.encode("ab<|eot|>ab", false, true), [256, 260, 256]);
    let plain: Vec<u32> = "<|eot|>".bytes().map(u32::from).collect();
    assert_eq!(tok.encode("<|eot|>", false, false), plain);
    // "<|endoftext|>" is normal in the file but llama.cpp makes it a control EOG token by its text.
    assert!(tok.is_eog(261));
    assert_eq!(tok.encode("<|endoftext|>", false, true), [261]);
    assert!(tok.piece(261, false).is_empty());
    assert_eq!(tok.piece(261, true), b"<|endoftext|>");
}

#[test]
fn bpe_defaults_are_llama_cpp_s() {
    // No add_bos key and a gpt-2 pre-tokenizer: no BOS; ids default to 11 as in llama.cpp.
    let tok = gpt2_abc(&[]);
    assert!(!tok.add_bos());
    assert_eq!((tok.bos(), tok.eos()), (Some(11), Some(11)));
    assert_eq!(tok.encode("a", true, false), [b'a' as u32]);
    let with_bos = gpt2(
        &[(EOT, 3)],
        &[],
        vec![
            ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
            ("tokenizer.ggml.bos_token_id", Value::U32(256)),
            ("tokenizer.ggml.add_eos_token", Value::Bool(true)),
            ("tokenizer.ggml.eos_token_id", Value::U32(256)),
        ],
    );
    assert_eq!(with_bos.encode("a", true, false), [256, b'a' as u32, 256]);
    assert_eq!(with_bos.encode("a", false, false), [b'a' as u32]);
    assert!(with_bos.is_eog(256));
}

#[test]
fn bpe_decode_round_trips_and_streams_split_characters() {
    let tok = gpt2_abc(&["a b"]);
    let text = "ab héllo wörld 🦙\n\t";
    let ids = tok.encode(text, false, false);
    assert_eq!(tok.decode(&ids), text);
    // The llama emoji is four byte tokens here: nothing shows until the last arrives.
    let llama: Vec<u32> = "🦙".bytes().map(u32::from).collect();
    let mut stream = StreamDecoder::new(&tok);
    let shown: Vec<String> = llama.iter().map(|&id| stream.push(id)).collect();
    assert_eq!(shown, ["", "", "", "🦙"]);
    assert_eq!(stream.finish(), "");
    // A sequence cut short is shown lossily at the end.
    let mut cut = StreamDecoder::new(&tok);
    assert_eq!(cut.push(llama[0]), "");
    assert_eq!(cut.finish(), "\u{FFFD}");
}

/// SentencePiece: 0 <unk>, 1 <s>, 2 </s>, 3..259 <0x00>..<0xFF>, then `normal` with scores.
fn spm(normal: &[(&str, f32)], more: Vec<(&str, Value)>) -> Tokenizer {
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    let mut scores = vec![Value::F32(0.0); 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(Value::I32(6));
        scores.push(Value::F32(0.0));
    }
    for (t, s) in normal {
        tokens.push((*t).to_owned());
        types.push(Value::I32(1));
        scores.push(Value::F32(*s));
    }
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut keys = vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.scores", Value::Array(scores)),
    ];
    keys.extend(more);
    build(keys).expect("llama vocabulary builds")
}

const SP: u32 = 259; // "▁"
const BYTE0: u32 = 3;

#[test]
fn spm_merges_by_score() {
    // 259 ▁, 260 h, 261 i, 262 hi, 263 ▁h
    let hi_first = spm(&[("▁", 0.0), ("h", 0.0), ("i", 0.0), ("hi", -1.0), ("▁h", -2.0)], vec![]);
    assert_eq!(hi_first.encode("hi", false, false), [SP, 262]);
    let sp_h_first = spm(&[("▁", 0.0), ("h", 0.0), ("i", 0.0), ("hi", -2.0), ("▁h", -1.0)], vec![]);
    assert_eq!(sp_h_first.encode("hi", false, false), [263, 261]);
}

#[test]
fn spm_falls_back_to_bytes_and_adds_bos_by_default() {
    let tok = spm(&[("▁", 0.0)], vec![]);
    assert!(tok.add_bos());
    assert_eq!(tok.bos(), Some(1));
    let e_acute: Vec<u32> = "é".bytes().map(|b| BYTE0 + b as u32).collect();
    let mut expected = vec![1, SP];
    expected.extend(&e_acute);
    assert_eq!(tok.encode("é", true, false), expected);
    assert_eq!(tok.piece(BYTE0 + 0xC3, false), [0xC3]);
}

#[test]
fn spm_special_tokens_and_the_space_after_them() {
    let tok = spm(&[("▁", 0.0), ("h", 0.0), ("i", 0.0), ("▁hi", 1.0), ("hi", 0.5)], vec![]);
    let hi = 262; // "▁hi"
    assert_eq!(tok.encode("<s>hi", false, true), [1, hi]);
    let unparsed = tok.encode("<s>", false, false);
    assert_eq!(unparsed[0], SP);
    assert_eq!(unparsed[1], BYTE0 + b'<' as u32);
    // llama_detokenize drops the prefix space of a first token, but not after BOS.
    assert_eq!(tok.decode(&[hi]), "hi");
    assert_eq!(tok.decode(&[1, hi]), " hi");
    assert_eq!(tok.decode(&[hi, hi]), "hi hi");
}

#[test]
fn spm_streams_an_emoji_split_over_byte_tokens() {
    let tok = spm(&[("▁", 0.0)], vec![]);
    let ids = tok.encode("🦙", false, false);
    assert_eq!(ids.len(), 5);
    let mut stream = StreamDecoder::new(&tok);
    let shown: Vec<String> = ids.iter().map(|&id| stream.push(id)).collect();
    assert_eq!(shown, ["", "", "", "", "🦙"]);
    assert_eq!(tok.decode(&ids), "🦙");
}

#[test]
fn errors_name_the_key_and_index() {
    let err = build(vec![]).unwrap_err();
    assert_eq!(err.to_string(), "metadata key 'tokenizer.ggml.model' is missing: this model has no tokenizer");
    let err = build(vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", Value::Array(vec![Value::String("a".into()), Value::U32(7)])),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("'tokenizer.ggml.tokens': entry 1 is 7"), "{err}");
    let err =
        build(vec![("tokenizer.ggml.model", Value::String("gpt2".into())), ("tokenizer.ggml.tokens", strings(&["a"]))])
            .unwrap_err();
    assert!(err.to_string().contains("'tokenizer.ggml.merges' is missing"), "{err}");
    let err = build(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("klingon".into())),
        ("tokenizer.ggml.tokens", strings(&["a"])),
        ("tokenizer.ggml.merges", strings(&[])),
    ])
    .unwrap_err();
    assert!(matches!(&err, Error::Unsupported(m) if m.contains("'klingon'")), "{err}");
    let err = build(vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b", "a"])),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("token 2 \"a\" repeats"), "{err}");
    let err = build(vec![("tokenizer.ggml.model", Value::String("t5".into()))]).unwrap_err();
    assert!(matches!(&err, Error::Unsupported(m) if m.contains("'t5'")), "{err}");
}
