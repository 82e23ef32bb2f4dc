#!/usr/bin/env python3
"""A byte-level BPE tokenizer trained on the training split, and the GGUF metadata that carries it.

Trained with the `tokenizers` package (Hugging Face's, Rust inside, from PyPI): a ByteLevel
pre-tokenizer with GPT-2's expression (`'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|
?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`, no prefix space) and GPT-2's byte-to-character map, then
BPE merges applied by rank with no dropout and no `ignore_merges`. That is exactly what llama.cpp
does for `tokenizer.ggml.model = "gpt2"` with `tokenizer.ggml.pre = "gpt-2"` (and this project's
tokenizer, bitnet-engine/src/tokenizer/pretokenize.rs: GPT2). The trailing `|\\s+` of the
Hugging Face expression is not in llama.cpp's, but text between two matches stays a piece of its
own there, so both give the same pieces. `llama-bpe` would not do: it sets `ignore_merges` and
splits digits by three, which the ByteLevel pre-tokenizer does not.

Vocabulary: the two special tokens first (<|begin_of_text|> = 0, BOS; <|end_of_text|> = 1, EOS),
the 256 byte characters, then the merges, --vocab tokens in all.

    python3 tokenizer.py train            # data/train.txt -> out/tokenizer.json
    python3 tokenizer.py vocab-gguf       # out/tokenizer.json -> out/vocab-only.gguf
    python3 tokenizer.py ids FILE         # token ids of FILE as JSON (BOS first)
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
PRE = "gpt-2"


def train(train_txt, out_json, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([train_txt], trainer)
    tok.save(out_json)
    return tok


def load(path):
    """(tokens, merges) of a tokenizer.json: tokens by id, merges as "a b" strings in rank order."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    vocab = j["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert None not in tokens, "token ids are not dense"
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, merges


def add_tokenizer_metadata(w, tokenizer_json):
    """The `tokenizer.ggml.*` keys llama.cpp and bitnet-engine read for a gpt2 BPE vocabulary."""
    tokens, merges = load(tokenizer_json)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(PRE)
    w.add_token_list(tokens)
    # llama_token_type: 1 normal, 3 control.
    w.add_token_types([3 if t in (BOS, EOS) else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(BOS))
    w.add_eos_token_id(tokens.index(EOS))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    return tokens


def encode_ids(tokenizer_json, text):
    """Ids as llama.cpp's llama_tokenize(text, add_special=True, parse_special=False): BOS, then the text's BPE ids."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    # Special-token text in the input is plain text, as in llama_tokenize(..., parse_special=False)
    # (what llama-perplexity and bitnet-bench perplexity do).
    tok.encode_special_tokens = True
    return [tok.token_to_id(BOS)] + tok.encode(text, add_special_tokens=False).ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["train", "vocab-gguf", "ids"])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--train-text", default=os.path.join(HERE, "data/train.txt"))
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "out/tokenizer.json"))
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--out", default=os.path.join(HERE, "out/vocab-only.gguf"))
    a = ap.parse_args()
    if a.cmd == "train":
        os.makedirs(os.path.dirname(a.tokenizer), exist_ok=True)
        tok = train(a.train_text, a.tokenizer, a.vocab)
        with open(a.train_text, encoding="utf-8") as f:
            text = f.read()
        n = len(tok.encode(text).ids)
        print(f"{a.tokenizer}: {tok.get_vocab_size()} tokens; training text {len(text.encode())} bytes "
              f"-> {n} tokens ({len(text.encode()) / n:.2f} bytes/token)")
    elif a.cmd == "vocab-gguf":
        import gguf

        w = gguf.GGUFWriter(a.out, "bitnet-25")
        w.add_name("bitnet-perf rust-docs tokenizer (vocabulary only)")
        add_tokenizer_metadata(w, a.tokenizer)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(a.out)
    else:
        with open(a.file, encoding="utf-8", newline="") as f:
            print(json.dumps(encode_ids(a.tokenizer, f.read())))


if __name__ == "__main__":
    sys.exit(main())
