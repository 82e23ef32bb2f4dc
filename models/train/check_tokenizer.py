#!/usr/bin/env python3
"""Do the Python tokenizer (tokenizers' BPE) and bitnet-engine's (through a GGUF file's
tokenizer.ggml.* metadata, as llama.cpp reads it) give the same ids for the same text?

    python3 check_tokenizer.py --gguf out/vocab-only.gguf data/heldout.txt data/train.txt

Compares `bitnet-bench tokenize --ids` with tokenizer.encode_ids per file; on a difference prints
the first position and the pieces around it. Exits 1 unless every file agrees.
"""

import argparse
from pathlib import Path
import json
import os
import subprocess
import sys

# The workspace's release build (`cargo build --release -p bitnet-bench` at the repository root).
DEFAULT_BENCH = Path(__file__).resolve().parents[2] / "target" / "release" / "bitnet-bench"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--gguf", default=os.path.join(HERE, "out/vocab-only.gguf"))
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "out/tokenizer.json"))
    ap.add_argument("--bench", default=str(DEFAULT_BENCH))
    a = ap.parse_args()
    from tokenizers import Tokenizer

    from tokenizer import encode_ids

    tok = Tokenizer.from_file(a.tokenizer)
    ok = True
    for path in a.files:
        with open(path, encoding="utf-8", newline="") as f:
            ours = encode_ids(a.tokenizer, f.read())
        out = subprocess.run([a.bench, "tokenize", "--model", a.gguf, "--file", path, "--ids", "--no-parse-special"],
                             check=True, capture_output=True, text=True).stdout
        theirs = json.loads(out)
        same = ours == theirs
        ok &= same
        line = f"{path}: python {len(ours)} ids, engine {len(theirs)} ids: {'identical' if same else 'DIFFERENT'}"
        if not same:
            i = next((k for k, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
            show = lambda ids: [tok.id_to_token(t) for t in ids[max(0, i - 3):i + 4]]
            line += f"; first difference at {i}: python {show(ours)} engine {show(theirs)}"
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
