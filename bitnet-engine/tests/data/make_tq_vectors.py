#!/usr/bin/env python3
"""Generate byte-exact golden vectors for llama.cpp TQ1_0 / TQ2_0 using the
official `gguf` Python package (pip install gguf numpy).

Writes, beside this script:
  tq_vectors_ternary.i8   3*512 int8, row-major, values in {-1,0,+1}
  tq_vectors_scales.f32   3 little-endian f32 per-row scales
  tq_vectors.tq2_0        3 rows x 2 blocks x 66 bytes = 396 bytes
  tq_vectors.tq1_0        3 rows x 2 blocks x 54 bytes = 324 bytes

The float matrix that was quantized is  ternary[r, c] * scales[r]  (f32).
Each 256-weight block gets d = f16(absmax of block) (0 for an all-zero block).

Self-checks (fails loudly on any mismatch):
  * gguf.quants.dequantize(...) == ternary * f16(scale)  exactly
  * an independent pure-Python packer/unpacker written from the documented
    index formulas reproduces the gguf bytes exactly.
"""
import os
import sys
from importlib.metadata import version

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize, dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS, COLS, QK = 3, 512, 256
SCALES = np.array([0.5, 1.0, 0.0123], dtype=np.float32)


def build_ternary() -> np.ndarray:
    rng = np.random.default_rng(1234)
    # P(-1)=P(0)=P(+1)=1/3
    t = rng.integers(-1, 2, size=(ROWS, COLS), dtype=np.int64).astype(np.int8)
    t[1, 256:512] = 0      # row 1, block 1: entirely zero  -> d = 0
    t[2, 0:256] = 1        # row 2, block 0: all +1
    return t


# ---------------- independent reference implementation -----------------
def f16_bytes(x: float) -> bytes:
    return np.array([x], dtype=np.float32).astype("<f2").tobytes()


def ref_pack_tq2_0(q: list[int], d: float) -> bytes:
    """q: 256 digits in {0,1,2} (= ternary + 1)."""
    out = bytearray(66)
    for i in range(256):
        j, rem = divmod(i, 128)   # which 32-byte half
        l, m = divmod(rem, 32)    # l = 2-bit lane (shift 2*l), m = byte within half
        out[32 * j + m] |= q[i] << (2 * l)
    out[64:66] = f16_bytes(d)
    return bytes(out)


def ref_pack_tq1_0(q: list[int], d: float) -> bytes:
    out = bytearray(54)

    def enc(digits):  # most significant base-3 digit first, padded to 5 digits
        v = 0
        for x in digits + [0] * (5 - len(digits)):
            v = v * 3 + x
        return (v * 256 + 242) // 243   # ceil(v * 256 / 243)

    for m in range(32):    # qs[0..32): weights m + 32n, n=0..4
        out[m] = enc([q[m + 32 * n] for n in range(5)])
    for m in range(16):    # qs[32..48): weights 160 + m + 16n, n=0..4
        out[32 + m] = enc([q[160 + m + 16 * n] for n in range(5)])
    for m in range(4):     # qh[0..4) (bytes 48..52): weights 240 + m + 4n, n=0..3
        out[48 + m] = enc([q[240 + m + 4 * n] for n in range(4)])
    out[52:54] = f16_bytes(d)
    return bytes(out)


def ref_unpack_tq1_0(b: bytes) -> list[int]:
    t = [0] * 256

    def digit(byte, n):
        return (((byte * 3 ** n) & 0xFF) * 3) >> 8   # in {0,1,2}

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


def ref_unpack_tq2_0(b: bytes) -> list[int]:
    return [((b[32 * (i // 128) + i % 32] >> (2 * ((i % 128) // 32))) & 3) - 1
            for i in range(256)]


def main() -> int:
    gv = version("gguf")
    print(f"gguf package version: {gv} ({gguf.__file__})")
    print(f"numpy version: {np.__version__}")

    tern = build_ternary()
    w = tern.astype(np.float32) * SCALES[:, None]
    assert w.dtype == np.float32

    zeros = int((tern == 0).sum())
    print(f"ternary: {ROWS}x{COLS}, zeros={zeros} ({zeros / tern.size:.3f}), "
          f"+1={int((tern == 1).sum())}, -1={int((tern == -1).sum())}")

    # Expected per-block d (f32 absmax, then stored as f16).
    nb = COLS // QK
    blk_absmax = np.abs(w.reshape(ROWS, nb, QK)).max(axis=-1)
    blk_d16 = blk_absmax.astype(np.float16).astype(np.float32)
    expected = (tern.reshape(ROWS, nb, QK).astype(np.float32) * blk_d16[..., None]).reshape(ROWS, COLS)

    ok = True
    for name, qt, tsize, pack, unpack, ext in (
        ("TQ2_0", QT.TQ2_0, 66, ref_pack_tq2_0, ref_unpack_tq2_0, "tq2_0"),
        ("TQ1_0", QT.TQ1_0, 54, ref_pack_tq1_0, ref_unpack_tq1_0, "tq1_0"),
    ):
        assert gguf.GGML_QUANT_SIZES[qt] == (QK, tsize), gguf.GGML_QUANT_SIZES[qt]
        qb = quantize(w, qt)
        assert qb.dtype == np.uint8 and qb.shape == (ROWS, nb * tsize), qb.shape
        deq = dequantize(qb, qt)
        err = float(np.abs(deq - expected).max())
        err_vs_input = float(np.abs(deq - w).max())
        print(f"{name}: bytes shape {qb.shape}, max|deq - ternary*f16(d)| = {err:.3e}, "
              f"max|deq - input| = {err_vs_input:.3e} (f16 rounding of d)")
        if err != 0.0:
            print(f"FAIL: {name} dequantize mismatch", file=sys.stderr)
            ok = False

        # Independent reference packer/unpacker must agree byte-for-byte.
        raw = qb.tobytes()
        for r in range(ROWS):
            for b in range(nb):
                blk = raw[(r * nb + b) * tsize:(r * nb + b + 1) * tsize]
                q = [int(x) + 1 for x in tern[r, b * QK:(b + 1) * QK]]
                ref = pack(q, float(blk_absmax[r, b]))
                if ref != blk:
                    print(f"FAIL: {name} ref packer mismatch at row {r} block {b}", file=sys.stderr)
                    ok = False
                if unpack(blk) != [int(x) for x in tern[r, b * QK:(b + 1) * QK]]:
                    print(f"FAIL: {name} ref unpacker mismatch at row {r} block {b}", file=sys.stderr)
                    ok = False
                d_bits = int.from_bytes(blk[-2:], "little")
                print(f"  {name} row {r} block {b}: d=0x{d_bits:04x} "
                      f"({float(np.frombuffer(blk[-2:], '<f2')[0])!r}) first bytes {blk[:4].hex()}")

        path = os.path.join(HERE, f"tq_vectors.{ext}")
        with open(path, "wb") as f:
            f.write(raw)

    with open(os.path.join(HERE, "tq_vectors_ternary.i8"), "wb") as f:
        f.write(tern.astype(np.int8).tobytes(order="C"))
    with open(os.path.join(HERE, "tq_vectors_scales.f32"), "wb") as f:
        f.write(SCALES.astype("<f4").tobytes())

    for fn, size in (("tq_vectors_ternary.i8", ROWS * COLS),
                     ("tq_vectors_scales.f32", ROWS * 4),
                     ("tq_vectors.tq2_0", ROWS * nb * 66),
                     ("tq_vectors.tq1_0", ROWS * nb * 54)):
        actual = os.path.getsize(os.path.join(HERE, fn))
        print(f"wrote {fn}: {actual} bytes (expected {size})")
        if actual != size:
            ok = False

    if not ok:
        print("GOLDEN VECTOR GENERATION FAILED", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
