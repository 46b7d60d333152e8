#!/usr/bin/env python3
"""Makes crates/folio/tests/fixtures/reference_f64_long.json: the exact model's view of
two long prompts (~2k and ~8k tokens), for issue 20's fidelity at long context.

The exact model is scripts/reference_f64.py's (float64 over the exact dequantized
weights; its Model class is reused here); only the forward pass differs in how it is
organised, not in what it computes: attention runs one block of query rows at a time
against the keys up to the block's end (the scores of 8k x 8k in float64 do not fit
comfortably), and the output head runs only on the scored positions.

A prompt is the first N tokens of a text file on this machine, tokenized by the default
model's own tokenizer (llama.cpp's, through llama-cpp-python with vocab_only; no BOS,
as llama.cpp adds none for this model), shortened if needed until detokenizing and
retokenizing the ids gives the same ids back (so the ids are what the text tokenizes
to). Only the ids are committed, with the file's path and sha256.

Scored positions (to keep the fixture small): every i with i % 64 == 63, and the last 64
positions of the prompt. top5[k] is the exact model's five most likely next tokens after
prompt[..=positions[k]], as [id, logprob] (float64 log-softmax, 6 decimals). No greedy
continuation: the long test does not use one.

    LLAMA_CPP_LIB_PATH=/work/llama/build/bin OPENBLAS_NUM_THREADS=2 nice -n 19 \\
      /work/llama/venv/bin/python scripts/reference_f64_long.py \\
      models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      long_2k=/usr/share/common-licenses/Apache-2.0:2048 \\
      long_8k=/usr/share/doc/nodejs/api/fs.md:8000

then scripts/llama_vs_reference.py --long (its doc) adds llama.cpp's figures.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_f64 import Model, log_softmax, top5  # noqa: E402

OUT = "crates/folio/tests/fixtures/reference_f64_long.json"
EVERY = 64
TAIL = 64
QBLOCK = 512


def scored_positions(n):
    return sorted({i for i in range(n) if i % EVERY == EVERY - 1} | set(range(n - TAIL, n)))


def forward_scored(model, ids, positions):
    """Logits (len(positions), vocab) after prompt[..=p] for each p: the same function as
    Model.forward, attention blocked by query rows, output head on the scored rows only."""
    W = model.w
    T = len(ids)
    pos = np.arange(T)
    x = W["token_embd.weight"][np.asarray(ids)]
    hd, nh, nkv = model.head_dim, model.n_head, model.n_head_kv
    group = nh // nkv
    scale = 1.0 / np.sqrt(hd)
    for l in range(model.n_layer):
        t0 = time.time()
        b = f"blk.{l}."
        h = model.norm(x, W[b + "attn_norm.weight"])
        q = model.rope((h @ W[b + "attn_q.weight"].T).reshape(T, nh, hd), pos)
        k = model.rope((h @ W[b + "attn_k.weight"].T).reshape(T, nkv, hd), pos)
        v = (h @ W[b + "attn_v.weight"].T).reshape(T, nkv, hd)
        o = np.empty((T, nh, hd))
        for a in range(0, T, QBLOCK):
            e = min(a + QBLOCK, T)
            # Row r (position a + r) sees keys 0..=a + r.
            mask = np.where(np.arange(e)[None, :] <= pos[a:e, None], 0.0, -np.inf)
            for hh in range(nh):
                kv = hh // group
                s = q[a:e, hh, :] @ k[:e, kv, :].T * scale + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                o[a:e, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:e, kv, :]
        x = x + o.reshape(T, nh * hd) @ W[b + "attn_output.weight"].T
        h = model.norm(x, W[b + "ffn_norm.weight"])
        g = h @ W[b + "ffn_gate.weight"].T
        u = h @ W[b + "ffn_up.weight"].T
        with np.errstate(over="ignore"):
            act = g / (1.0 + np.exp(-g))
        x = x + (act * u) @ W[b + "ffn_down.weight"].T
        del q, k, v, o, h, g, u, act
        print(f"  layer {l}: {time.time() - t0:.1f}s", file=sys.stderr)
    x = model.norm(x[np.asarray(positions)], W["output_norm.weight"])
    return x @ W["output.weight"].T


def detokenize(tok, ids):
    """The token pieces joined (llama-cpp-python's own detokenize reads pieces through a
    32-byte buffer and drops longer ones, e.g. a newline and 32 spaces)."""
    import ctypes

    import llama_cpp

    out = b""
    buf = (ctypes.c_char * 256)()
    for t in ids:
        n = llama_cpp.llama_token_to_piece(tok._model.vocab, t, buf, 256, 0, False)
        assert 0 <= n <= 256, (t, n)
        out += bytes(buf[:n])
    return out


def prompt_ids(model_path, path, n):
    """The first n tokens of the file (fewer if the cut does not retokenize the same)."""
    from llama_cpp import Llama

    tok = Llama(model_path=model_path, vocab_only=True, verbose=False)
    text = open(path, encoding="utf-8").read()
    ids = tok.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    if len(ids) < n:
        sys.exit(f"{path}: {len(ids)} tokens, fewer than {n}")
    while n > 0:
        cut = ids[:n]
        back = detokenize(tok, cut).decode("utf-8", errors="strict")
        if tok.tokenize(back.encode("utf-8"), add_bos=False, special=False) == cut:
            return cut
        n -= 1
    sys.exit(f"{path}: no prefix retokenizes to itself")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("cases", nargs="+", help="name=path:n_tokens")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    t0 = time.time()
    model = Model(args.model)
    ctx = 8192
    print(f"loaded in {time.time() - t0:.1f}s: {model.hparams}", file=sys.stderr)
    cases = []
    for spec in args.cases:
        name, rest = spec.split("=", 1)
        path, n = rest.rsplit(":", 1)
        ids = prompt_ids(args.model, path, int(n))
        if len(ids) > ctx:
            sys.exit(f"{name}: {len(ids)} tokens exceed the context length {ctx}")
        positions = scored_positions(len(ids))
        t0 = time.time()
        lp = log_softmax(forward_scored(model, ids, positions))
        secs = time.time() - t0
        print(f"{name}: {len(ids)} tokens, {len(positions)} scored positions, {secs:.0f}s",
              file=sys.stderr)
        sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
        cases.append({"name": name, "source": {"path": path, "sha256": sha,
                                               "first_tokens": len(ids)},
                      "seconds": round(secs), "prompt_ids": ids, "positions": positions,
                      "top5": [top5(row) for row in lp]})
    doc = {}
    if os.path.exists(args.out):  # keep llama_vs_reference.py's figures
        old = json.load(open(args.out))
        if "llama_cpp" in old:
            doc["llama_cpp"] = old["llama_cpp"]
    doc = {
        "made_by": "scripts/reference_f64_long.py " + " ".join(sys.argv[1:]),
        "model_sha256": hashlib.sha256(open(args.model, "rb").read()).hexdigest(),
        "note": "float64 evaluation of the quantized weights (scripts/reference_f64.py's exact "
                "model) on long prompts: prompt_ids = the first tokens of source.path (default "
                "model's tokenizer, no BOS; only the ids are committed). positions = the scored "
                f"positions: every i with i % {EVERY} == {EVERY - 1}, and the last {TAIL}. "
                "top5[k] = the exact model's 5 most likely next tokens after "
                "prompt_ids[..=positions[k]] as [id, logprob]. seconds = the float64 forward's "
                "wall time on a shared 2-core Zen 4 (OpenBLAS, 2 threads, niced). llama_cpp: "
                "each llama.cpp build's distance from top5 (scripts/llama_vs_reference.py --long).",
        "hparams": model.hparams,
        "cases": cases,
        **doc,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
