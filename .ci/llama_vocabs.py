#!/usr/bin/env python3
"""Extracts llama.cpp's tokenizer test vocabularies (ggml-vocab-*.gguf with their .inp/.out
vectors) from the llama-cpp-python source distribution on PyPI, which vendors llama.cpp.

The tokenizer tests compare our ids with these vectors and with ids llama-tokenize printed for
the same files (bitnet-engine/tests/data/tokenizer/README.md): the version is pinned to the one
those ids came from. Usage: llama_vocabs.py OUT_DIR
"""
import hashlib
import io
import json
import sys
import tarfile
import urllib.request

VERSION = "0.3.36"
VOCABS = ("llama-bpe", "llama-spm", "gpt-2")


def main(out_dir: str) -> None:
    req = urllib.request.Request(
        "https://pypi.org/simple/llama-cpp-python/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        files = json.load(r)["files"]
    name = f"llama_cpp_python-{VERSION}.tar.gz"
    entry = next((f for f in files if f["filename"] == name), None)
    if entry is None:
        sys.exit(f"llama_vocabs.py: {name} is not on PyPI's index")
    with urllib.request.urlopen(entry["url"], timeout=600) as r:
        data = r.read()
    want = entry["hashes"].get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        sys.exit(f"llama_vocabs.py: {name}: sha256 differs from PyPI's index")
    wanted = {f"ggml-vocab-{v}.gguf{ext}" for v in VOCABS for ext in ("", ".inp", ".out")}
    found = set()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar.getmembers():
            base = m.name.rsplit("/", 1)[-1]
            if base in wanted and "/vendor/llama.cpp/models/" in m.name and m.isfile():
                with open(f"{out_dir}/{base}", "wb") as out:
                    out.write(tar.extractfile(m).read())
                found.add(base)
    missing = wanted - found
    if missing:
        sys.exit(f"llama_vocabs.py: {name} lacks {sorted(missing)}")
    print(f"llama.cpp vocabularies from {name}: {len(found)} files in {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1])
