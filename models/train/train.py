#!/usr/bin/env python3
"""Trains the BitNet b1.58 model of model.py on data/train.txt with the tokenizer of tokenizer.py.

Each training row is BOS followed by --context tokens of the training text from a random offset
(the whole text is one token stream), as llama-perplexity scores a chunk: BOS in place of the
chunk's first token. AdamW (betas 0.9/0.95, weight decay on the matrices only), linear warm-up then
cosine decay to a tenth, gradient clipping at 1. Seeded (weights and batches): the defaults are meant
to reproduce the committed model on the same JAX version and CPU kind. Two 20-step runs on one
machine gave byte-identical params.npz; the full run was not repeated (models/README.md lists the
committed files' SHA-256 to compare a rerun's exports with).

    python3 train.py                      # the full run (the defaults)
    python3 train.py --steps 200 --out out/smoke --layers 2 --hidden 256 --ffn 512   # a smoke run

Writes <out>/params.npz (f32 master weights), <out>/config.json, <out>/log.jsonl (loss, held-out
loss, tokens/s) and <out>/ckpt.pkl (everything needed to --resume).
"""

import argparse
import dataclasses
import json
import math
import os
import pickle
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def token_stream(tokenizer_json, text_path, cache):
    """The ids of a text file (no BOS), cached as .npy next to the tokenizer."""
    if os.path.exists(cache) and os.path.getmtime(cache) > max(os.path.getmtime(text_path),
                                                                os.path.getmtime(tokenizer_json)):
        return np.load(cache)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    tok.encode_special_tokens = True  # special-token text is plain text (parse_special=False)
    with open(text_path, encoding="utf-8", newline="") as f:
        ids = np.asarray(tok.encode(f.read(), add_special_tokens=False).ids, np.int32)
    np.save(cache, ids)
    return ids


def eval_windows(ids, context, bos, limit):
    """Non-overlapping rows [BOS, ids[i*c : (i+1)*c]] of the held-out stream (at most `limit`)."""
    n = min(len(ids) // context, limit)
    rows = ids[: n * context].reshape(n, context)
    return np.concatenate([np.full((n, 1), bos, np.int32), rows], axis=1)


def main():
    import jax
    import jax.numpy as jnp
    import optax

    import model as M

    d = M.Config()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    for f in dataclasses.fields(M.Config):
        if f.name != "vocab":
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "out/tokenizer.json"))
    ap.add_argument("--train-text", default=os.path.join(HERE, "data/train.txt"))
    ap.add_argument("--heldout-text", default=os.path.join(HERE, "data/heldout.txt"))
    ap.add_argument("--out", default=os.path.join(HERE, "out/model"))
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-rows", type=int, default=32, help="held-out rows per evaluation")
    ap.add_argument("--ckpt-every", type=int, default=200)
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a.tokenizer)
    bos = tok.token_to_id("<|begin_of_text|>")
    cfg = M.Config(vocab=tok.get_vocab_size(), **{f.name: getattr(a, f.name) for f in dataclasses.fields(M.Config)
                                                  if f.name != "vocab"}).check()
    os.makedirs(a.out, exist_ok=True)
    tdir = os.path.dirname(a.tokenizer)
    train_ids = token_stream(a.tokenizer, a.train_text, os.path.join(tdir, "train_ids.npy"))
    held_ids = token_stream(a.tokenizer, a.heldout_text, os.path.join(tdir, "heldout_ids.npy"))
    held = jnp.asarray(eval_windows(held_ids, cfg.context, bos, a.eval_rows))

    def schedule(step):
        warm = jnp.minimum(1.0, (step + 1) / max(1, a.warmup))
        prog = jnp.clip((step - a.warmup) / max(1, a.steps - a.warmup), 0.0, 1.0)
        return a.lr * warm * (0.1 + 0.9 * 0.5 * (1 + jnp.cos(math.pi * prog)))

    decay_mask = lambda p: {k: v.ndim == 2 for k, v in p.items()}
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=a.weight_decay, mask=decay_mask))

    ckpt = os.path.join(a.out, "ckpt.pkl")
    if a.resume and os.path.exists(ckpt):
        with open(ckpt, "rb") as f:
            st = pickle.load(f)
        assert st["config"] == dataclasses.asdict(cfg), "checkpoint of another config"
        params = jax.tree.map(jnp.asarray, st["params"])
        opt_state = jax.tree.map(jnp.asarray, st["opt_state"])
        start, rng = st["step"], np.random.default_rng()
        rng.bit_generator.state = st["rng"]
        print(f"resumed at step {start}")
    else:
        params = M.init_params(cfg, jax.random.PRNGKey(a.seed))
        opt_state = opt.init(params)
        start, rng = 0, np.random.default_rng(a.seed)
        open(os.path.join(a.out, "log.jsonl"), "w").close()
    with open(os.path.join(a.out, "config.json"), "w") as f:
        f.write(cfg.to_json())
    n_params = sum(int(np.prod(v.shape)) for v in params.values())
    print(f"config {dataclasses.asdict(cfg)}; {n_params} parameters; {len(train_ids)} training tokens, "
          f"{len(held_ids)} held-out tokens ({held.shape[0]} eval rows)", flush=True)

    @jax.jit
    def step_fn(params, opt_state, batch):
        loss, grads = jax.value_and_grad(M.loss_fn)(params, batch, cfg)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    eval_fn = jax.jit(lambda p, b: M.loss_fn(p, b, cfg))

    def save(step):
        st = {"params": jax.tree.map(np.asarray, params), "opt_state": jax.tree.map(np.asarray, opt_state),
              "step": step, "rng": rng.bit_generator.state, "config": dataclasses.asdict(cfg)}
        with open(ckpt + ".tmp", "wb") as f:
            pickle.dump(st, f)
        os.replace(ckpt + ".tmp", ckpt)
        np.savez(os.path.join(a.out, "params.npz"), **st["params"])

    log = open(os.path.join(a.out, "log.jsonl"), "a")
    t0, tokens_done, last = time.time(), 0, None
    for step in range(start, a.steps):
        offs = rng.integers(0, len(train_ids) - cfg.context, size=a.batch)
        rows = np.stack([train_ids[o:o + cfg.context] for o in offs])
        batch = jnp.asarray(np.concatenate([np.full((a.batch, 1), bos, np.int32), rows], axis=1))
        params, opt_state, loss = step_fn(params, opt_state, batch)
        tokens_done += a.batch * cfg.context
        done = step + 1
        if done % 10 == 0 or done == a.steps or done == start + 1:
            loss = float(loss)
            el = time.time() - t0
            rec = {"step": done, "loss": round(loss, 4), "lr": float(schedule(step)), "elapsed_s": round(el, 1),
                   "tokens_per_s": round(tokens_done / el, 1)}
            if done % a.eval_every == 0 or done == a.steps:
                rec["heldout_loss"] = round(float(eval_fn(params, held)), 4)
                rec["heldout_ppl"] = round(math.exp(rec["heldout_loss"]), 2)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            if done % 50 == 0 or "heldout_loss" in rec or done == start + 1:
                print(json.dumps(rec), flush=True)
            last = rec
        if done % a.ckpt_every == 0 or done == a.steps:
            save(done)
    print(f"done: {last}")


if __name__ == "__main__":
    sys.exit(main())
