#!/usr/bin/env python3
"""Writes what the JAX forward of model.py computes on the held-out text, for bitnet-engine's tests
to compare against (models/rustdocs-bitnet.reference.json): the training framework's own quantized
forward is the independent reference for the engine's whole forward pass on the trained weights.

    python3 reference.py --out ../rustdocs-bitnet.reference.json

What it holds (all from JAX and Hugging Face `tokenizers`, none from bitnet-engine):
- `heldout`: the held-out text's token count and the FNV-1a 64 of the ids the perplexity method
  feeds the model (as `bitnet-bench perplexity` reports it in `tokens_fnv1a64`), so a test sees that
  our tokenizer gives Hugging Face's ids on the whole text;
- `window`: BOS and the first `context - 1` held-out tokens, and at every position the logits'
  log-sum-exp, the next token's logit and the top --top-k (id, logit);
- `perplexity`: llama-perplexity's method at ctx = the model's context over the whole held-out
  text (each chunk's first token replaced by BOS, positions ctx/2 .. ctx-2 scored), and a unigram
  model's perplexity (training-token counts, add-one) on the same scored tokens;
- `greedy`: a prompt, its ids, and JAX's greedy continuation with each step's top-1 − top-2 margin.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PROMPT = "In Rust, a trait"


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for t in ids:
        for b in int(t).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(HERE, "out/model"), help="train.py's --out")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "out/tokenizer.json"))
    ap.add_argument("--heldout-text", default=os.path.join(HERE, "data/heldout.txt"))
    ap.add_argument("--train-text", default=os.path.join(HERE, "data/train.txt"))
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--greedy-tokens", type=int, default=48)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import jax
    import jax.numpy as jnp

    import model as M
    from tokenizer import encode_ids

    with open(os.path.join(a.model, "config.json")) as f:
        cfg = M.Config.from_dict(json.load(f))
    params = {k: jnp.asarray(v) for k, v in np.load(os.path.join(a.model, "params.npz")).items()}
    fwd = jax.jit(lambda t: M.forward(params, t, cfg))
    bos = encode_ids(a.tokenizer, "")[0]
    with open(a.heldout_text, encoding="utf-8", newline="") as f:
        held = encode_ids(a.tokenizer, f.read())[1:]  # without the BOS encode_ids puts first
    with open(a.train_text, encoding="utf-8", newline="") as f:
        train = encode_ids(a.tokenizer, f.read())[1:]
    ctx = cfg.context

    # The perplexity method over the whole held-out text (BOS first, as the vocabulary adds it).
    full = [bos] + held
    chunks = len(full) // ctx
    fed = []
    nll, scored = [], []
    for i in range(chunks):
        c = full[i * ctx:(i + 1) * ctx]
        c[0] = bos
        fed += c
        logits = np.asarray(fwd(jnp.asarray([c], jnp.int32))[0], np.float64)
        for j in range(ctx // 2, ctx - 1):
            z = logits[j] - logits[j].max()
            nll.append(-(z[c[j + 1]] - math.log(np.exp(z).sum())))
            scored.append(c[j + 1])
    nll = np.asarray(nll)
    ppl = math.exp(nll.mean())
    se = ppl * math.sqrt((np.mean(nll ** 2) - nll.mean() ** 2) / (len(nll) - 1))
    counts = np.bincount(np.asarray(train), minlength=cfg.vocab).astype(np.float64) + 1.0
    uni_p = counts / counts.sum()
    uni_ppl = math.exp(-np.mean(np.log(uni_p[np.asarray(scored)])))

    # One window, every position.
    win = [bos] + held[: ctx - 1]
    logits = np.asarray(fwd(jnp.asarray([win], jnp.int32))[0], np.float64)
    positions = []
    for j in range(len(win)):
        row = logits[j]
        m = row.max()
        lse = m + math.log(np.exp(row - m).sum())
        top = sorted(range(cfg.vocab), key=lambda t: (-row[t], t))[: a.top_k]
        pos = {"lse": lse, "top": [[t, float(row[t])] for t in top]}
        if j + 1 < len(win):
            pos["next_logit"] = float(row[win[j + 1]])
        positions.append(pos)

    # Greedy from the prompt (BOS first), re-running the whole sequence each step, padded to the
    # context (the forward is causal: what follows a position does not change its logits).
    seq = encode_ids(a.tokenizer, a.prompt)
    prompt_ids = seq[1:]
    assert len(seq) + a.greedy_tokens <= ctx
    out, margins = [], []
    for _ in range(a.greedy_tokens):
        padded = seq + [bos] * (ctx - len(seq))
        row = np.asarray(fwd(jnp.asarray([padded], jnp.int32))[0, len(seq) - 1], np.float64)
        order = np.argsort(-row, kind="stable")
        out.append(int(order[0]))
        margins.append(float(row[order[0]] - row[order[1]]))
        seq.append(int(order[0]))

    ref = {
        "about": "JAX forward of models/train/model.py on the trained weights (models/train/reference.py)",
        "config": json.loads(cfg.to_json()),
        "heldout": {"tokens": len(held), "fed_tokens_fnv1a64": f"{fnv1a64(fed):016x}"},
        "perplexity": {"ctx": ctx, "chunks": chunks, "scored": len(nll), "ppl": ppl, "ppl_se": se,
                       "unigram_ppl": uni_ppl},
        "window": {"tokens": win, "top_k": a.top_k, "positions": positions},
        "greedy": {"prompt": a.prompt, "prompt_ids": prompt_ids, "tokens": out, "margins": margins},
    }
    with open(a.out, "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"{a.out}: {os.path.getsize(a.out)} bytes; held-out PPL {ppl:.3f} +/- {se:.3f} "
          f"(unigram {uni_ppl:.1f}) over {chunks} chunks of {ctx}")


if __name__ == "__main__":
    sys.exit(main())
