#!/usr/bin/env python3
"""Makes crates/folio/tests/fixtures/llama_cpp_formats.json: llama.cpp's view of the
wide tiny models stored in each weight format of issue 15 (Q5_0, Q5_1, IQ4_NL, Q2_K,
Q3_K, Q5_K) and in Q4_K_M- and Q5_K_M-like mixes.

The models are random (folio::tiny::wide_model_bytes): folio's example `tiny_formats`
writes them, and the integration test `tests/it/formats.rs` builds the same bytes
itself (it checks the FNV-1a hash recorded here), so the test needs neither Python nor
llama.cpp. For each model and prompt: llama.cpp's prompt ids, its greedy continuation
and its top-5 log-probabilities at every position (teacher forcing, one token per step,
flash attention on, one thread: as scripts/make_fixtures.py runs the default model).

Each case also holds "exact_top5": the exact model's log-probabilities of the same five
ids at every position (scripts/reference_f64.py's float64 forward pass over the weights
as gguf-py dequantizes them), and each model llama.cpp's mean and max distance from it,
so the test can hold folio to llama.cpp's own distance from the exact model.

    pip install llama-cpp-python numpy
    python3 scripts/make_format_fixtures.py
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf.quants import dequantize
from llama_cpp import Llama, __version__

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_f64  # noqa: E402
from llama_teacher import teacher_forced  # noqa: E402

# The formats here have no hand-written exact float64 path in reference_f64: take
# gguf-py's float32 dequantization (d * scale rounds once, far below the 8-bit
# activation rounding both engines add).
reference_f64.weight64 = lambda t: dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)

PROMPTS = {
    "plain": "the cat sat on the mat, and then the tiny model began to speak in tongues",
    "chat": "<|im_start|>user\nWhat is in a name?<|im_end|>\n<|im_start|>assistant\n",
}
N_GEN = 16
TOP = 5
OUT = "crates/folio/tests/fixtures/llama_cpp_formats.json"


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def add_exact(path, cases):
    """Adds exact_top5 to each case; returns llama.cpp's (mean, max) distance from it."""
    model = reference_f64.Model(path)
    diffs = []
    for c in cases:
        seq = c["prompt_ids"] + c["greedy_ids"]
        lp = reference_f64.log_softmax(model.forward(seq[:-1], []))
        c["exact_top5"] = [[round(float(lp[i][j]), 5) for j, _ in top]
                           for i, top in enumerate(c["top5"])]
        diffs += [abs(lp[i][j] - v) for i, top in enumerate(c["top5"]) for j, v in top]
    return float(np.mean(diffs)), float(np.max(diffs))


def run(path):
    llm = Llama(model_path=path, n_ctx=256, n_batch=256, logits_all=True, n_threads=1,
                n_threads_batch=1, verbose=False, seed=0, flash_attn=True)
    cases = []
    for name, text in PROMPTS.items():
        toks, gen, top, _ = teacher_forced(llm, text, N_GEN, TOP)
        cases.append({"name": name, "text": text, "prompt_ids": toks, "greedy_ids": gen,
                      "top5": top})
    return cases


def main():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["cargo", "run", "--release", "-q", "-p", "folio", "--example",
                        "tiny_formats", "--", d], check=True, stdout=subprocess.DEVNULL)
        models = []
        for f in sorted(os.listdir(d)):
            path = os.path.join(d, f)
            with open(path, "rb") as fh:
                h = fnv1a64(fh.read())
            cases = run(path)
            mean, mx = add_exact(path, cases)
            models.append({"name": f[:-len(".gguf")], "fnv1a64": f"{h:016x}",
                           "llama_vs_exact": {"mean": round(mean, 5), "max": round(mx, 5)},
                           "cases": cases})
            print(f"{f}: llama.cpp vs exact: mean {mean:.4f}, max {mx:.4f}", file=sys.stderr)
    doc = {
        "made_by": "python3 " + " ".join(sys.argv),
        "llama_cpp_python": __version__,
        "note": "per model: top5[i] = llama.cpp's 5 most likely next tokens after seq[..=i] "
                "as [id, logprob]; seq = prompt_ids + greedy_ids; fed one token per step, "
                "flash attention on, one thread.",
        "models": models,
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
