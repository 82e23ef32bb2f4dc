"""A LLaMA-style BitNet b1.58 decoder in JAX, as the BitNet b1.58 2B4T report describes it and as
bitnet-engine runs it (bitnet-engine/src/model/reference.rs is the function this must equal):

- BitLinear: weights ternarized by absmean with one scale per tensor (s = mean|W|, stored as f16
  because TQ1_0/TQ2_0 blocks keep their scale in f16; W_q = clip(round(W / s), -1, 1) * s), inputs
  quantized per token to int8 by absmax (q = round_half_even(x * 127 / absmax), clamped to +-127,
  dequantized by absmax / 127); straight-through estimators for both in training.
- RMSNorm (eps 1e-5) before attention and FFN, and the sub-norms: attn_sub_norm on the attention
  output before attn_output, ffn_sub_norm on the gated product before ffn_down.
- FFN relu(gate)^2 * up (or silu(gate) * up with ffn_activation = "silu"); RoPE NEOX-style (pairs i and i + head_dim/2) with base rope_theta;
  grouped-query attention (query head h reads key/value head h // (heads / kv_heads)).
- Tied embedding. The engine holds the embedding (stored as F16) as int8 rows with one f32 scale per
  row (absmax / 127) and quantizes the LM head's input per token to int8; this model does the same
  (with straight-through estimators), so the trained function is the one the engine runs.

Parameters are a dict of f32 arrays; linear weights are [out, in] like GGUF's rows x cols.
"""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np

LINEARS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 4096
    hidden: int = 256
    ffn: int = 768
    layers: int = 6
    heads: int = 4
    kv_heads: int = 2
    context: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # "relu2" (BitNet b1.58 2B4T) or "silu" (what llama.cpp's `bitnet` graph runs; for a twin model
    # that llama.cpp can be compared on).
    ffn_activation: str = "relu2"

    @property
    def head_dim(self):
        return self.hidden // self.heads

    def shapes(self):
        """Linear shapes [rows, cols] by name."""
        q, kv, h, f = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.ffn
        return {"attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q),
                "ffn_gate": (f, h), "ffn_up": (f, h), "ffn_down": (h, f)}

    def check(self):
        assert self.hidden % self.heads == 0 and self.heads % self.kv_heads == 0
        assert self.head_dim % 2 == 0
        assert self.ffn_activation in ("relu2", "silu"), f"ffn_activation {self.ffn_activation!r}: relu2 or silu"
        # TQ1_0/TQ2_0 blocks are 256 weights along a row; I2_S packs 128.
        for name, (rows, cols) in self.shapes().items():
            assert cols % 256 == 0, f"{name}: {cols} columns; TQ1_0/TQ2_0 need a multiple of 256"
        return self

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=1)

    @staticmethod
    def from_dict(d):
        return Config(**d)


def init_params(cfg, key):
    """Normal(0, 0.02) linears and embedding, ones for the norms."""
    keys = iter(jax.random.split(key, 1 + cfg.layers * len(LINEARS)))
    p = {"token_embd": 0.02 * jax.random.normal(next(keys), (cfg.vocab, cfg.hidden), jnp.float32),
         "output_norm": jnp.ones((cfg.hidden,), jnp.float32)}
    shapes = cfg.shapes()
    q_dim = cfg.heads * cfg.head_dim
    for l in range(cfg.layers):
        for name in LINEARS:
            p[f"blk.{l}.{name}"] = 0.02 * jax.random.normal(next(keys), shapes[name], jnp.float32)
        p[f"blk.{l}.attn_norm"] = jnp.ones((cfg.hidden,), jnp.float32)
        p[f"blk.{l}.attn_sub_norm"] = jnp.ones((q_dim,), jnp.float32)
        p[f"blk.{l}.ffn_norm"] = jnp.ones((cfg.hidden,), jnp.float32)
        p[f"blk.{l}.ffn_sub_norm"] = jnp.ones((cfg.ffn,), jnp.float32)
    return p


def ste(x, q):
    """Forward q, gradient of x."""
    return x + jax.lax.stop_gradient(q - x)


def f16(x):
    return x.astype(jnp.float16).astype(jnp.float32)


def weight_scale(w):
    """absmean, rounded to f16 (what TQ blocks store); never 0."""
    return f16(jnp.maximum(jnp.mean(jnp.abs(w)), 1e-5))


def ternary(w):
    """(values in {-1, 0, 1}, scale) of a weight matrix: the exported tensor."""
    s = weight_scale(w)
    return jnp.clip(jnp.round(w / s), -1, 1), s


def quant_weight(w):
    v, s = ternary(w)
    return ste(w, v * s)


def quant_act(x):
    """Per-token (last axis) absmax int8, dequantized; 0 stays 0."""
    absmax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    safe = jnp.where(absmax > 0, absmax, 1.0)
    q = jnp.clip(jnp.round(x * (127.0 / safe)), -127, 127) * (safe / 127.0)
    return ste(x, jnp.where(absmax > 0, q, 0.0))


def quant_rows(e):
    """int8 rows with one absmax / 127 scale per row, of the F16-stored embedding (as the engine loads it)."""
    e16 = f16(e)
    absmax = jnp.max(jnp.abs(e16), axis=-1, keepdims=True)
    safe = jnp.where(absmax > 0, absmax, 1.0)
    q = jnp.clip(jnp.round(e16 * (127.0 / safe)), -127, 127) * (safe / 127.0)
    return ste(e, jnp.where(absmax > 0, q, 0.0))


def bitlinear(x, w):
    return quant_act(x) @ quant_weight(w).T


def rms_norm(x, g, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope(x, theta):
    """x: [..., T, heads, hd]; NEOX pairs (i, i + hd/2)."""
    t, hd = x.shape[-3], x.shape[-1]
    half = hd // 2
    freq = 1.0 / (theta ** (2.0 * np.arange(half) / hd))
    ang = np.arange(t)[:, None] * freq[None, :]
    cos = jnp.asarray(np.cos(ang), jnp.float32)[:, None, :]
    sin = jnp.asarray(np.sin(ang), jnp.float32)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def forward(params, tokens, cfg):
    """Logits [B, T, vocab] of token ids [B, T] (position 0 is the first of each row)."""
    b, t = tokens.shape
    hd, nh, nkv = cfg.head_dim, cfg.heads, cfg.kv_heads
    emb = quant_rows(params["token_embd"])
    x = emb[tokens]
    mask = jnp.tril(jnp.ones((t, t), bool))
    for l in range(cfg.layers):
        p = lambda n: params[f"blk.{l}.{n}"]
        xn = rms_norm(x, p("attn_norm"), cfg.norm_eps)
        q = bitlinear(xn, p("attn_q")).reshape(b, t, nh, hd)
        k = bitlinear(xn, p("attn_k")).reshape(b, t, nkv, hd)
        v = bitlinear(xn, p("attn_v")).reshape(b, t, nkv, hd)
        q, k = rope(q, cfg.rope_theta), rope(k, cfg.rope_theta)
        q = q.reshape(b, t, nkv, nh // nkv, hd)
        s = jnp.einsum("bqgrd,bkgd->bgrqk", q, k) / math.sqrt(hd)
        s = jnp.where(mask, s, -jnp.inf)
        a = jnp.einsum("bgrqk,bkgd->bqgrd", jax.nn.softmax(s, axis=-1), v).reshape(b, t, nh * hd)
        a = rms_norm(a, p("attn_sub_norm"), cfg.norm_eps)
        x = x + bitlinear(a, p("attn_output"))
        xn = rms_norm(x, p("ffn_norm"), cfg.norm_eps)
        g = bitlinear(xn, p("ffn_gate"))
        g = jnp.square(jax.nn.relu(g)) if cfg.ffn_activation == "relu2" else jax.nn.silu(g)
        h = g * bitlinear(xn, p("ffn_up"))
        h = rms_norm(h, p("ffn_sub_norm"), cfg.norm_eps)
        x = x + bitlinear(h, p("ffn_down"))
    x = rms_norm(x, params["output_norm"], cfg.norm_eps)
    return quant_act(x) @ emb.T


def loss_fn(params, tokens, cfg):
    """Mean next-token cross entropy over tokens[:, 1:]."""
    logits = forward(params, tokens[:, :-1], cfg)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.mean(nll)
