#!/usr/bin/env python3
"""Writes a trained model (train.py's params.npz + config.json) and its tokenizer as GGUF.

Linear layers hold exactly the ternary values and per-tensor scale of model.ternary() — the
weights the JAX forward uses — in one of:
- TQ2_0 / TQ1_0 (llama.cpp's types; gguf-py's quantizer; every 256-weight block of a tensor stores
  the same f16 scale, or 0 where the block is all zeros) under `bitnet-25` (ReLU²) or `bitnet` (SiLU);
- I2_S (bitnet.cpp's type 36: 2-bit codes 0/1/2 = -1/0/+1, weight j of 128-weight block i in byte
  32*i + j%32 at shift 6 - 2*(j//32), then the f32 scale and 28 zero bytes) under `bitnet-b1.58`,
  as the official BitNet b1.58 2B4T file.
The embedding is F16 (tied: no output.weight), the norms F32, `<arch>.hidden_activation` the
model's FFN activation ("relu2" or "silu", config.json's ffn_activation).

Why `bitnet-25` and not llama.cpp's `bitnet` for ReLU² TQ files: llama.cpp's `bitnet` graph is
SiLU-gated unconditionally and ignores `hidden_activation`, so a ReLU²-gated model would run there
as a different function; bitnet-engine writes ReLU² TQ models under `bitnet-25` for that reason
(bitnet-engine/src/gguf/writer.rs, saved_architecture). A SiLU-gated model's TQ files go under
`bitnet`, which llama.cpp runs as trained. `--arch` overrides the choice.

    python3 export.py --format tq2_0 --out out/model/rustdocs-bitnet-tq2_0.gguf
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

I2_S = 36


def ternary_np(w):
    """model.ternary itself (the JAX forward's weights): (int8 values, f16-representable f32 scale)."""
    import jax.numpy as jnp

    import model

    v, s = model.ternary(jnp.asarray(w, jnp.float32))
    return np.asarray(v).astype(np.int8), np.float32(s)


def encode_i2s(values, scale):
    v = values.reshape(-1)
    assert v.size % 128 == 0
    codes = (v.astype(np.int16) + 1).astype(np.uint8).reshape(-1, 4, 32)  # [block, j//32, j%32]
    shifts = np.array([6, 4, 2, 0], np.uint8)[None, :, None]
    packed = np.bitwise_or.reduce(codes << shifts, axis=1).reshape(-1)
    tail = np.zeros(32, np.uint8)
    tail[:4] = np.frombuffer(np.float32(scale).tobytes(), np.uint8)
    return np.concatenate([packed, tail])


def export(params, cfg, tokenizer_json, fmt, out, arch=None, name=None):
    import gguf

    from tokenizer import add_tokenizer_metadata

    act = cfg.get("ffn_activation", "relu2")
    arch = arch or ("bitnet-b1.58" if fmt == "i2_s" else "bitnet-25" if act == "relu2" else "bitnet")
    w = gguf.GGUFWriter(out, arch)
    w.add_name(name or f"bitnet-perf rust-docs BitNet b1.58 {fmt}")
    w.add_vocab_size(cfg["vocab"])
    w.add_context_length(cfg["context"])
    w.add_embedding_length(cfg["hidden"])
    w.add_feed_forward_length(cfg["ffn"])
    w.add_block_count(cfg["layers"])
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["norm_eps"])
    w.add_rope_dimension_count(cfg["hidden"] // cfg["heads"])
    w.add_string(f"{arch}.hidden_activation", act)
    w.add_license("Apache-2.0 OR MIT")
    add_tokenizer_metadata(w, tokenizer_json)

    def f32(n, v):
        w.add_tensor(n, np.ascontiguousarray(v, np.float32))

    def linear(n, m):
        vals, s = ternary_np(m)
        rows, cols = vals.shape
        if fmt == "i2_s":
            w.add_tensor(n, encode_i2s(vals, s).view(np.int8), raw_shape=(rows, cols), raw_dtype=I2_S)
        else:
            qt = {"tq2_0": gguf.GGMLQuantizationType.TQ2_0, "tq1_0": gguf.GGMLQuantizationType.TQ1_0}[fmt]
            data = gguf.quants.quantize(vals.astype(np.float32) * s, qt)
            # Each block's scale is its absmax: s itself (an f16 value), or 0 for an all-zero block.
            back = gguf.quants.dequantize(data, qt).reshape(rows, cols)
            assert np.array_equal(back, vals.astype(np.float32) * s), f"{n}: {fmt} does not hold the weights exactly"
            w.add_tensor(n, data, raw_dtype=qt)  # uint8 [rows, row bytes]: gguf-py derives [rows, cols]

    w.add_tensor("token_embd.weight", np.ascontiguousarray(params["token_embd"], np.float16))
    for l in range(cfg["layers"]):
        for part in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_sub_norm", "attn_output",
                     "ffn_norm", "ffn_gate", "ffn_up", "ffn_sub_norm", "ffn_down"]:
            key = f"blk.{l}.{part}"
            (f32 if params[key].ndim == 1 else linear)(key + ".weight", params[key])
    f32("output_norm.weight", params["output_norm"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(HERE, "out/model"), help="train.py's --out")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "out/tokenizer.json"))
    ap.add_argument("--format", choices=["tq2_0", "tq1_0", "i2_s"], default="tq2_0")
    ap.add_argument("--arch", default=None, help="default: bitnet-b1.58 for I2_S; for TQ bitnet-25 (ReLU²) or bitnet (SiLU)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    params = dict(np.load(os.path.join(a.model, "params.npz")))
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    export(params, cfg, a.tokenizer, a.format, a.out, a.arch)
    print(f"{a.out}: {os.path.getsize(a.out)} bytes")


if __name__ == "__main__":
    sys.exit(main())
