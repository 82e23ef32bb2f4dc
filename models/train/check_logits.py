#!/usr/bin/env python3
"""Does bitnet-engine compute the trained model's function? Compares the JAX forward of model.py
(the training framework's own quantized forward: ternary weights, int8 activations, int8
embedding rows — there is no separate train mode, the straight-through estimators only change
gradients) with the logits `bitnet-bench run --logits-out` writes for the same tokens of an
exported GGUF file.

    python3 check_logits.py --gguf out/model/m-tq2_0.gguf --bench target/release/bitnet-bench

Tokens: BOS and the first --tokens - 1 tokens of the held-out text. The engine runs with
--kv f32 so that no KV-cache rounding enters. Prints max |diff|, that over max |logit|, the
smallest per-position cosine similarity, top-1 agreement, and both sides' mean next-token loss;
exits 1 when max |diff| / max |logit| exceeds --tolerance.
"""

import argparse
from pathlib import Path
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

# The workspace's release build (`cargo build --release -p bitnet-bench` at the repository root).
DEFAULT_BENCH = Path(__file__).resolve().parents[2] / "target" / "release" / "bitnet-bench"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def nll(logits, tokens):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.mean(logp[np.arange(len(tokens) - 1), tokens[1:]]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--model", default=os.path.join(HERE, "out/model"), help="train.py's --out")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "out/tokenizer.json"))
    ap.add_argument("--text", default=os.path.join(HERE, "data/heldout.txt"))
    ap.add_argument("--tokens", type=int, default=255, help="at most the context length - 1")
    ap.add_argument("--bench", default=str(DEFAULT_BENCH))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tolerance", type=float, default=1e-2)
    a = ap.parse_args()

    import jax.numpy as jnp

    import model as M
    from tokenizer import encode_ids

    with open(os.path.join(a.model, "config.json")) as f:
        cfg = M.Config.from_dict(json.load(f))
    # The engine generates one token after them, within the context length.
    with open(a.text, encoding="utf-8", newline="") as f:
        ids = encode_ids(a.tokenizer, f.read())[: min(a.tokens, cfg.context - 1)]
    params = {k: jnp.asarray(v) for k, v in np.load(os.path.join(a.model, "params.npz")).items()}
    ours = np.asarray(M.forward(params, jnp.asarray([ids], jnp.int32), cfg)[0], np.float64)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.json")
        cmd = [a.bench, "run", "--model", a.gguf, "--tokens", ",".join(map(str, ids)), "--n-predict", "1",
               "--kv", "f32", "--threads", str(a.threads), "--logits-out", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            got = json.load(f)
    assert got["tokens"][: len(ids)] == ids, "the engine fed other tokens"
    theirs = np.asarray(got["logits"][: len(ids)], np.float64)

    diff = np.abs(ours - theirs)
    scale = np.abs(ours).max()
    cos = (ours * theirs).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(theirs, axis=-1))
    top1 = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    rel = diff.max() / scale
    print(json.dumps({
        "gguf": os.path.basename(a.gguf), "positions": len(ids), "vocab": ours.shape[1],
        "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()), "max_abs_logit": float(scale),
        "max_diff_over_max_logit": float(rel), "min_cosine": float(cos.min()), "top1_agreement": top1,
        "jax_nll": nll(ours, ids), "engine_nll": nll(theirs, ids),
        "worst_position": int(diff.max(-1).argmax()),
    }, indent=1))
    return 0 if rel <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
