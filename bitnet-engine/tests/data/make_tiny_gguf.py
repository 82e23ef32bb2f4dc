#!/usr/bin/env python3
"""Generate a tiny BitNet b1.58 GGUF fixture with the official `gguf` Python
package (pip install gguf numpy), plus golden Q6_K decoder vectors.

Writes, beside this script (re-runnable from any cwd, deterministic):
  tiny-bitnet.gguf             GGUF v3, general.architecture = "bitnet",
                               hyperparameters of the `tiny` preset,
                               "llama" tokenizer with 512 tokens <t0>..<t511>,
                               24 tensors (layer 0 linears TQ2_0, layer 1
                               linears TQ1_0, norms F32, token_embd Q6_K if
                               gguf-py can quantize Q6_K, else F16; tied head,
                               no output.weight).
  tiny-bitnet.expected.json    per-tensor name / type / ne (fastest first) /
                               byte size / offset / sha256 of decoded values /
                               scale / first 8 decoded values, all metadata
                               (except the token list), alignment, offsets.
  q6k_vectors.bin              4 random-but-valid Q6_K blocks (4 x 210 bytes)
  q6k_vectors.f32              gguf.quants.dequantize of them (4 x 256 f32 LE)

Decoded-value hashing (sha256_decoded in the JSON):
  TQ1_0 / TQ2_0 : the ternary values {-1,0,+1} as int8, row-major (out, in)
  F32 / F16     : values as float32 little-endian (F16 widened to f32)
  Q6_K          : gguf.quants.dequantize(...) as float32 little-endian

Linear weights are ternary[out, in] * s with ONE f32 scale s per tensor, so
every 256-weight block's d is f16(s) and dequantize == ternary * f16(s).

Exits non-zero if any self-check fails.
"""
import hashlib
import json
import os
import struct
import sys
from importlib.metadata import version

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf.quants import quantize, dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF_PATH = os.path.join(HERE, "tiny-bitnet.gguf")
JSON_PATH = os.path.join(HERE, "tiny-bitnet.expected.json")
Q6K_BIN = os.path.join(HERE, "q6k_vectors.bin")
Q6K_F32 = os.path.join(HERE, "q6k_vectors.f32")

# `tiny` preset
N_CTX, N_EMBD, N_FF, N_LAYER = 256, 256, 512, 2
N_HEAD, N_HEAD_KV, N_VOCAB = 4, 2, 512
ROPE_BASE, RMS_EPS = 10000.0, 1e-5
HEAD_DIM = N_EMBD // N_HEAD
N_KV = N_HEAD_KV * HEAD_DIM  # 128

ARCH = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BITNET]
QK_K = 256
Q6K_BLOCKS = 4

FAILS: list[str] = []


def check(cond: bool, msg: str) -> None:
    if not cond:
        FAILS.append(msg)
        print(f"FAIL: {msg}", file=sys.stderr)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def f32le(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def f16_of(x: float) -> float:
    return float(np.float32(x).astype(np.float16))


def f16_bits(x: float) -> str:
    return "0x%04x" % int(np.array([x], dtype=np.float32).astype("<f2").view("<u2")[0])


def f32_bits(x: float) -> str:
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


# ---------------- independent reference decoders (from ggml C index formulas) ----------------
def ref_dequant_q6_k_block(b: bytes) -> np.ndarray:
    """Block: ql[128] | qh[64] | scales[16] (int8) | d (f16)  = 210 bytes.
    y[i], i in 0..256: h=i//128, r=i%128, k=r//32, l=r%32
      low4  = (ql[64h + l + 32*(k&1)] >> (4*(k>>1))) & 0xF
      high2 = (qh[32h + l] >> (2k)) & 3
      q     = (low4 | high2 << 4) - 32
      y[i]  = (f32(d) * f32(scales[i//16])) * q        (f32 arithmetic)
    """
    assert len(b) == 210
    ql, qh = b[0:128], b[128:192]
    sc = np.frombuffer(b[192:208], dtype=np.int8)
    d = np.frombuffer(b[208:210], dtype="<f2")[0].astype(np.float32)
    y = np.zeros(QK_K, dtype=np.float32)
    for i in range(QK_K):
        h, r = divmod(i, 128)
        k, l = divmod(r, 32)
        low4 = (ql[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xF
        high2 = (qh[32 * h + l] >> (2 * k)) & 3
        q = np.float32((low4 | (high2 << 4)) - 32)
        y[i] = np.float32(d * np.float32(sc[i // 16])) * q
    return y


def ref_unpack_tq2_0_block(b: bytes) -> list[int]:
    return [((b[32 * (i // 128) + i % 32] >> (2 * ((i % 128) // 32))) & 3) - 1 for i in range(256)]


def ref_unpack_tq1_0_block(b: bytes) -> list[int]:
    t = [0] * 256

    def digit(byte, n):
        return (((byte * 3 ** n) & 0xFF) * 3) >> 8

    for m in range(32):
        for n in range(5):
            t[m + 32 * n] = digit(b[m], n) - 1
    for m in range(16):
        for n in range(5):
            t[160 + m + 16 * n] = digit(b[32 + m], n) - 1
    for m in range(4):
        for n in range(4):
            t[240 + m + 4 * n] = digit(b[48 + m], n) - 1
    return t


# ---------------- tensor construction ----------------
def build_tensors(rng: np.random.Generator):
    """Returns list of dicts in file order. Each dict: name, qtype, array
    (what is passed to GGUFWriter.add_tensor), plus decode info."""
    out = []

    # token_embd: (n_vocab, n_embd) numpy shape -> ne = [256, 512]
    emb = (rng.standard_normal((N_VOCAB, N_EMBD)) * 0.02).astype(np.float32)
    try:
        q = quantize(emb, QT.Q6_K)
        emb_type, emb_arr = QT.Q6_K, q
        emb_dec = dequantize(q, QT.Q6_K).astype(np.float32)
    except NotImplementedError as e:
        print(f"Q6_K quantization not available in gguf-py ({type(e).__name__}: {e!s}); token_embd -> F16")
        emb_type = QT.F16
        emb_arr = emb.astype(np.float16)
        emb_dec = emb_arr.astype(np.float32)
    out.append(dict(name="token_embd.weight", qtype=emb_type, array=emb_arr, decoded=emb_dec))

    def norm(name, n):
        a = rng.uniform(0.9, 1.1, size=(n,)).astype(np.float32)
        out.append(dict(name=name, qtype=QT.F32, array=a, decoded=a))

    def linear(name, rows, cols, qt):
        s = np.float32(rng.uniform(0.01, 0.05))
        tern = rng.integers(-1, 2, size=(rows, cols), dtype=np.int64).astype(np.int8)
        w = tern.astype(np.float32) * s
        qb = quantize(w, qt)
        out.append(dict(name=name, qtype=qt, array=qb, ternary=tern, scale=float(s)))

    for l in range(N_LAYER):
        qt = QT.TQ2_0 if l == 0 else QT.TQ1_0
        p = f"blk.{l}."
        norm(p + "attn_norm.weight", N_EMBD)
        linear(p + "attn_q.weight", N_EMBD, N_EMBD, qt)
        linear(p + "attn_k.weight", N_KV, N_EMBD, qt)
        linear(p + "attn_v.weight", N_KV, N_EMBD, qt)
        norm(p + "attn_sub_norm.weight", N_EMBD)
        linear(p + "attn_output.weight", N_EMBD, N_EMBD, qt)
        norm(p + "ffn_norm.weight", N_EMBD)
        linear(p + "ffn_gate.weight", N_FF, N_EMBD, qt)
        linear(p + "ffn_up.weight", N_FF, N_EMBD, qt)
        norm(p + "ffn_sub_norm.weight", N_FF)
        linear(p + "ffn_down.weight", N_EMBD, N_FF, qt)
    norm("output_norm.weight", N_EMBD)
    return out


def logical_shape(t) -> tuple[int, ...]:
    """numpy (row-major) logical shape, i.e. reversed GGUF ne."""
    a = t["array"]
    if a.dtype == np.uint8:
        return gguf.quants.quant_shape_from_byte_shape(a.shape, t["qtype"])
    return tuple(a.shape)


def build_q6k_vectors(rng: np.random.Generator) -> bytes:
    blocks = []
    for b in range(Q6K_BLOCKS):
        ql = rng.integers(0, 256, size=128, dtype=np.int64).astype(np.uint8)
        qh = rng.integers(0, 256, size=64, dtype=np.int64).astype(np.uint8)
        sc = rng.integers(-128, 128, size=16, dtype=np.int64).astype(np.int8)
        if b == 0:  # exercise the int8 extremes and zero
            sc[0], sc[1], sc[2] = -128, 127, 0
        d = np.array([rng.uniform(0.01, 0.1)], dtype=np.float32).astype("<f2")
        blk = ql.tobytes() + qh.tobytes() + sc.tobytes() + d.tobytes()
        assert len(blk) == 210
        blocks.append(blk)
    return b"".join(blocks)


# ---------------- JSON helpers ----------------
def json_value(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


def dump_json(obj: dict) -> str:
    """Top-level keys one per line; list entries one compact JSON object per line."""
    lines = ["{"]
    items = list(obj.items())
    for i, (k, v) in enumerate(items):
        comma = "," if i + 1 < len(items) else ""
        if isinstance(v, list) and v and isinstance(v[0], dict):
            lines.append(f"  {json.dumps(k)}: [")
            for j, e in enumerate(v):
                lines.append("    " + json.dumps(e) + ("," if j + 1 < len(v) else ""))
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    gv = version("gguf")
    print(f"gguf package version: {gv} ({gguf.__file__})")
    print(f"numpy version: {np.__version__}")
    for qt in (QT.F32, QT.F16, QT.Q6_K, QT.TQ1_0, QT.TQ2_0):
        print(f"  type {qt.name:6s} id={int(qt):2d} (block, bytes)={gguf.GGML_QUANT_SIZES[qt]}")
    check(gguf.GGML_QUANT_SIZES[QT.Q6_K] == (256, 210), "Q6_K size")
    check(gguf.GGML_QUANT_SIZES[QT.TQ2_0] == (256, 66), "TQ2_0 size")
    check(gguf.GGML_QUANT_SIZES[QT.TQ1_0] == (256, 54), "TQ1_0 size")

    rng = np.random.default_rng(7)
    tensors = build_tensors(rng)
    q6k_raw = build_q6k_vectors(rng)

    # ---------------- write the GGUF ----------------
    w = gguf.GGUFWriter(GGUF_PATH, ARCH)
    w.add_name("tiny-bitnet-fixture")
    w.add_vocab_size(N_VOCAB)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    tokens = [f"<t{i}>" for i in range(N_VOCAB)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * N_VOCAB)
    w.add_token_types([int(gguf.TokenType.NORMAL)] * N_VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    for t in tensors:
        if t["qtype"] in (QT.F32, QT.F16):
            w.add_tensor(t["name"], t["array"])
        else:
            w.add_tensor(t["name"], t["array"], raw_dtype=t["qtype"])

    kv_written = [(k, v.type, v.sub_type, v.value) for k, v in w.kv_data[0].items()]
    alignment = w.data_alignment

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    with open(Q6K_BIN, "wb") as f:
        f.write(q6k_raw)
    q6k_blocks = np.frombuffer(q6k_raw, dtype=np.uint8).reshape(Q6K_BLOCKS, 210)
    q6k_deq = dequantize(q6k_blocks, QT.Q6_K).astype(np.float32)
    check(q6k_deq.shape == (Q6K_BLOCKS, 256), f"q6k deq shape {q6k_deq.shape}")
    with open(Q6K_F32, "wb") as f:
        f.write(f32le(q6k_deq))

    # independent Q6_K reference must match gguf-py bit-exactly
    for b in range(Q6K_BLOCKS):
        ref = ref_dequant_q6_k_block(q6k_raw[210 * b:210 * (b + 1)])
        check(np.array_equal(ref.view(np.uint32), q6k_deq[b].view(np.uint32)),
              f"Q6_K reference decoder != gguf-py for block {b}")
        check(bool(np.isfinite(q6k_deq[b]).all()), f"Q6_K block {b} non-finite")
        d = float(np.frombuffer(q6k_raw[210 * b + 208:210 * b + 210], "<f2")[0])
        print(f"q6k block {b}: d={d!r} ({f16_bits(d)}), max|y|={float(np.abs(q6k_deq[b]).max()):.4f}")

    # ---------------- re-read & verify ----------------
    r = gguf.GGUFReader(GGUF_PATH)
    file_size = os.path.getsize(GGUF_PATH)
    ver = int(r.fields["GGUF.version"].parts[-1][0])
    n_tensors_hdr = int(r.fields["GGUF.tensor_count"].parts[-1][0])
    n_kv_hdr = int(r.fields["GGUF.kv_count"].parts[-1][0])
    check(ver == 3, f"GGUF version {ver}")
    check(n_tensors_hdr == len(tensors) == 24, f"tensor count {n_tensors_hdr}")
    check(len(r.tensors) == len(tensors), "reader tensor count")
    check(n_kv_hdr == len(kv_written), f"kv count {n_kv_hdr} vs {len(kv_written)}")
    check(r.alignment == alignment == 32, f"alignment {r.alignment}")
    check(r.data_offset % alignment == 0, "data section not aligned")
    print(f"GGUF v{ver}: {n_tensors_hdr} tensors, {n_kv_hdr} KV pairs, alignment {r.alignment}, "
          f"data section at {r.data_offset}, file size {file_size}")

    # metadata round trip
    meta_json = []
    for key, vtype, sub_type, value in kv_written:
        field = r.fields.get(key)
        check(field is not None, f"missing key {key}")
        if field is None:
            continue
        back = field.contents()
        entry = {"key": key, "type": vtype.name}
        if vtype == VT.ARRAY:
            st = sub_type if sub_type is not None else VT.get_type(value[0])
            entry["type"] = f"ARRAY[{st.name}]"
            entry["len"] = len(value)
            check(list(back) == list(value), f"array {key} round trip")
            if key == gguf.Keys.Tokenizer.LIST:
                entry["value"] = "<t{i}> for i in 0..%d (omitted)" % len(value)
            else:
                entry["value"] = [json_value(x) for x in value]
        else:
            if vtype == VT.FLOAT32:
                stored = float(np.float32(value))
                check(float(back) == stored, f"{key}: {back} != {stored}")
                entry["value"] = stored
                entry["as_written"] = value
                entry["f32_bits"] = f32_bits(value)
            else:
                check(back == value, f"{key}: {back!r} != {value!r}")
                entry["value"] = json_value(value)
        meta_json.append(entry)

    by_name = {t.name: t for t in r.tensors}
    tensor_json = []
    prev_end = r.data_offset
    for t in tensors:
        rt = by_name.get(t["name"])
        check(rt is not None, f"missing tensor {t['name']}")
        if rt is None:
            continue
        shp = logical_shape(t)
        ne = [int(x) for x in reversed(shp)]
        raw = np.ascontiguousarray(t["array"]).tobytes()
        check(rt.tensor_type == t["qtype"], f"{t['name']}: type {rt.tensor_type.name}")
        check([int(x) for x in rt.shape] == ne, f"{t['name']}: ne {list(rt.shape)} vs {ne}")
        check(int(rt.n_bytes) == len(raw), f"{t['name']}: n_bytes {rt.n_bytes} vs {len(raw)}")
        check(rt.data.tobytes() == raw, f"{t['name']}: data bytes differ")
        check(rt.data_offset % alignment == 0, f"{t['name']}: offset not aligned")
        check(rt.data_offset >= prev_end, f"{t['name']}: overlaps previous tensor")
        prev_end = rt.data_offset + len(raw)

        e = {"name": t["name"], "type": t["qtype"].name, "type_id": int(t["qtype"]), "ne": ne,
             "nbytes": len(raw), "offset": int(rt.data_offset - r.data_offset)}
        if t["qtype"] in (QT.TQ1_0, QT.TQ2_0):
            tern = t["ternary"]
            s = t["scale"]
            d16 = np.float32(f16_of(s))
            deq = dequantize(rt.data, t["qtype"])
            expected = tern.astype(np.float32) * d16
            err = float(np.abs(deq - expected).max())
            check(deq.shape == shp and err == 0.0, f"{t['name']}: dequant max err {err}")
            # recover ternary from the file itself
            tern_back = np.rint(deq / d16).astype(np.int8)
            check(np.array_equal(tern_back, tern), f"{t['name']}: ternary round trip")
            # independent unpacker on the first and last block
            unpack = ref_unpack_tq2_0_block if t["qtype"] == QT.TQ2_0 else ref_unpack_tq1_0_block
            bs = gguf.GGML_QUANT_SIZES[t["qtype"]][1]
            flat_t = tern.reshape(-1)
            nblk = len(raw) // bs
            for bi in (0, nblk - 1):
                check(unpack(raw[bi * bs:(bi + 1) * bs]) == [int(x) for x in flat_t[bi * 256:(bi + 1) * 256]],
                      f"{t['name']}: reference unpack block {bi}")
                check(raw[(bi + 1) * bs - 2:(bi + 1) * bs] == np.array([s], np.float32).astype("<f2").tobytes(),
                      f"{t['name']}: block {bi} d != f16(scale)")
            zf = float((tern == 0).mean())
            print(f"{t['name']:26s} {t['qtype'].name:5s} ne={ne} bytes={len(raw):6d} scale={s:.6f} "
                  f"f16={float(d16):.6f} zeros={zf:.3f} max|deq - tern*f16(s)|={err:.1e}")
            e.update(sha256_decoded=sha(tern.astype(np.int8).tobytes(order="C")),
                     decoded_as="ternary int8 row-major (out, in)",
                     scale=s, scale_f32_bits=f32_bits(s), scale_f16=float(d16), scale_f16_bits=f16_bits(s),
                     first8=[int(x) for x in flat_t[:8]],
                     first8_dequant=[float(x) for x in expected.reshape(-1)[:8]])
        else:
            if t["qtype"] in (QT.F32, QT.F16):
                dec = rt.data.astype(np.float32)
            else:
                dec = dequantize(rt.data, t["qtype"]).astype(np.float32)
            check(np.array_equal(dec.reshape(-1), t["decoded"].reshape(-1)), f"{t['name']}: decoded differs")
            print(f"{t['name']:26s} {t['qtype'].name:5s} ne={ne} bytes={len(raw):6d}")
            e.update(sha256_decoded=sha(f32le(dec.reshape(-1))), decoded_as="float32 LE",
                     first8=[float(x) for x in dec.reshape(-1)[:8]])
        e["sha256_raw"] = sha(raw)
        tensor_json.append(e)

    expected_end = r.data_offset + gguf.GGUFWriter.ggml_pad(prev_end - r.data_offset, alignment)
    check(file_size == expected_end, f"file size {file_size} vs expected {expected_end}")

    doc = {
        "generator": "make_tiny_gguf.py",
        "gguf_package_version": gv,
        "gguf_version": ver,
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "file_size": file_size,
        "file_sha256": sha(open(GGUF_PATH, "rb").read()),
        "tensor_count": n_tensors_hdr,
        "kv_count": n_kv_hdr,
        "token_embd_type": tensors[0]["qtype"].name,
        "q6k_quantize_supported": tensors[0]["qtype"] == QT.Q6_K,
        "metadata": meta_json,
        "tensors": tensor_json,
        "q6k_vectors": {"blocks": Q6K_BLOCKS, "block_bytes": 210,
                        "layout": "ql[128] qh[64] scales[16] int8 d f16",
                        "bin_sha256": sha(q6k_raw), "f32_sha256": sha(f32le(q6k_deq)),
                        "first8": [float(x) for x in q6k_deq.reshape(-1)[:8]]},
    }
    with open(JSON_PATH, "w") as f:
        f.write(dump_json(doc))
    json.load(open(JSON_PATH))  # must parse

    total = 0
    for fn in (GGUF_PATH, JSON_PATH, Q6K_BIN, Q6K_F32):
        sz = os.path.getsize(fn)
        total += sz
        print(f"wrote {os.path.basename(fn)}: {sz} bytes")
    print(f"total: {total} bytes")
    check(os.path.getsize(Q6K_BIN) == Q6K_BLOCKS * 210, "q6k bin size")
    check(os.path.getsize(Q6K_F32) == Q6K_BLOCKS * 256 * 4, "q6k f32 size")
    check(total < 700 * 1024, f"total size {total} too big")

    if FAILS:
        print(f"FIXTURE GENERATION FAILED ({len(FAILS)} checks)", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
