#!/usr/bin/env python3
"""Makes crates/folio/tests/fixtures/quant_blocks.json: random blocks of every quantized
format folio reads, with their values as gguf-py (ggml's Python reference) dequantizes
them. folio's dequantization is tested against it.

    pip install gguf numpy
    python3 scripts/make_quant_fixtures.py
"""
import json
import random

import numpy as np
from gguf import GGMLQuantizationType as T
import gguf
from gguf.quants import dequantize

random.seed(1234)
BLOCKS = {T.Q4_0: (32, 18, [0]), T.Q4_1: (32, 20, [0, 2]), T.Q8_0: (32, 34, [0]),
          T.Q4_K: (256, 144, [0, 2]), T.Q6_K: (256, 210, [208]),
          # Added later, after the first five so that their random blocks stay the same.
          T.Q5_0: (32, 22, [0]), T.Q5_1: (32, 24, [0, 2]), T.IQ4_NL: (32, 18, [0]),
          T.Q2_K: (256, 84, [80, 82]), T.Q3_K: (256, 110, [108]), T.Q5_K: (256, 176, [0, 2])}


def f16(x):
    return np.array([x], dtype=np.float16).tobytes()


out = {}
for ty, (n, size, scale_at) in BLOCKS.items():
    blocks = []
    for _ in range(4):
        b = bytearray(random.getrandbits(8) for _ in range(size))
        for at in scale_at:
            b[at:at + 2] = f16(random.uniform(-0.05, 0.05))
        blocks.append(bytes(b))
    raw = b"".join(blocks)
    vals = dequantize(np.frombuffer(raw, dtype=np.uint8), ty).astype(np.float32).reshape(-1)
    out[ty.name] = {"hex": raw.hex(), "values": [float(v) for v in vals]}
with open("crates/folio/tests/fixtures/quant_blocks.json", "w") as f:
    json.dump({"made_by": "python3 scripts/make_quant_fixtures.py", "gguf_py": "0.19.0",
               "formats": out}, f)
    f.write("\n")
