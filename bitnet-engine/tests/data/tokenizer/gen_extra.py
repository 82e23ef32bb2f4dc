#!/usr/bin/env python3
"""Writes extra-<vocab>.json: our extra cases tokenized by llama.cpp's llama-tokenize.

usage: gen_extra.py LLAMA_TOKENIZE MODELS_DIR NOPRE_GGUF OUT_DIR

Each text goes to llama-tokenize on stdin, verbatim:
    llama-tokenize -m FILE --stdin --no-escape --ids --log-disable [--no-parse-special]
llama-tokenize passes the file's add_bos as add_special (BOS/EOS per the file); `add_special`
in the JSON records it (found by tokenizing the empty text: non-empty output means true).
"""
import json
import subprocess
import sys

LONG = "The quick brown fox jumps over the lazy dog; " * 40 + "0123456789" * 20

TEXTS = [
    "",
    " ",
    "   ",
    "\t",
    "\n",
    "   leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    "\t\ttabs\tand\n\nnewlines\r\n mixed \n\t \n end",
    "line one\nline two\n\n\nline five\r\n",
    "1234567",
    "12 345 6789 1,234,567.89 3.14159 -42 +7",
    "٣٤٥ ١٢ ⅷ ²³",
    "don't",
    "I'LL DON'T We'Ve they're 'll 'd 's 'S",
    "emoji 🦙🚀👍🏽 👨‍👩‍👧 ✅",
    "CJK 我想在apple工作 日本語のテキスト 한국어 텍스트",
    "accented: café naïve résumé Ångström Ελληνικά Ünïcödé",
    "e\u0301 a\u0308 combining marks",
    "a\u200bb zero\u200dwidth \u00a0nbsp\u3000ideographic",
    "$$$ +++ <=> ^^^ ~~~ ||| ``` ... !!! ???",
    "fn main() {\n    println!(\"{}\", x + 1);\n}\n",
    "<|begin_of_text|>Hello<|eot_id|>",
    "<|endoftext|> after",
    "<s>Hello</s>",
    "<unk> <s> </s>",
    LONG,
]


def tokenize(exe, model, text, parse_special):
    cmd = [exe, "-m", model, "--stdin", "--no-escape", "--ids", "--log-disable"]
    if not parse_special:
        cmd.append("--no-parse-special")
    out = subprocess.run(cmd, input=text.encode(), capture_output=True, check=True).stdout.decode()
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def cases(exe, model, texts, parse_modes):
    add_special = len(tokenize(exe, model, "", False)) > 0
    return [
        {"text": t, "add_special": add_special, "parse_special": p, "ids": tokenize(exe, model, t, p)}
        for t in texts
        for p in parse_modes
    ]


def vectors(path):
    raw = open(path, encoding="utf-8").read()
    sep = "\n__ggml_vocab_test__\n"
    parts = raw.split(sep)
    return parts[:-1] if parts and parts[-1] == "" else parts


def write(out_dir, name, vocab, cs):
    doc = {
        "vocab": vocab,
        "generated_by": "llama-tokenize of llama-cpp-python 0.3.36 (llama.cpp 0c1e570), see README.md",
        "cases": cs,
    }
    with open(f"{out_dir}/extra-{name}.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"extra-{name}.json: {len(cs)} cases")


def main():
    exe, models, nopre, out_dir = sys.argv[1:5]
    for name in ["llama-bpe", "llama-spm", "gpt-2"]:
        model = f"{models}/ggml-vocab-{name}.gguf"
        write(out_dir, name, f"ggml-vocab-{name}.gguf", cases(exe, model, TEXTS, [False, True]))
    # llama-bpe without tokenizer.ggml.pre: the extra cases and llama.cpp's own inputs.
    cs = cases(exe, nopre, TEXTS, [False, True])
    cs += cases(exe, nopre, vectors(f"{models}/ggml-vocab-llama-bpe.gguf.inp"), [False])
    write(out_dir, "llama-bpe-nopre", "ggml-vocab-llama-bpe.gguf without tokenizer.ggml.pre", cs)


if __name__ == "__main__":
    main()
