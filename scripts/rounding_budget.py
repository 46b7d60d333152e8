#!/usr/bin/env python3
"""Where the 8-bit rounding of matmul inputs costs fidelity: the float64 exact model
(scripts/reference_f64.py) with folio's roundings put back in, input by input, scored
against the exact model's top-5 on a case of reference_f64_long.json (mean and max
|Δ logprob|, as tests/it/fidelity_f64_long.rs scores folio).

Each variant is a comma list of site=mode (sites: qkv, o, gu, down, head; modes:
q = round to 8 bits per block of 32 as folio and llama.cpp do (the default),
x = exact, hl = a second 8-bit pass over every block, tK = a second pass over each
row's K largest blocks, sK = over the K blocks a calibration prompt picks (the other
case's first CAL tokens, as model/outliers.rs does at load)), plus kv16=1 and q16=1
for K/V and the query rounded to f16. An empty variant rounds every input.

    venv/bin/python scripts/rounding_budget.py long_2k 2048 "kv16=1,q16=1" \\
        "kv16=1,q16=1,head=x" "kv16=1,q16=1,qkv=s1,gu=s1,head=s4"

What issue 20's closing note measured with it (long_2k, 2048 tokens, kv16 and q16 on):
every input rounded 0.0715; head exact 0.0619; qkv exact 0.0616; gate/up exact 0.0602;
o exact 0.0678; down exact 0.0687; K/V and query rounding alone 0.0020.
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_f64 as R  # noqa: E402


def q8(x):
    """x rounded as folio's 8-bit activations: per block of 32, d = max|x|/127 (an f16)."""
    b = x.reshape(-1, 32)
    d = (np.abs(b).max(axis=1, keepdims=True) / 127.0).astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.round(b / np.where(d > 0, d, 1)), 0)
    return (np.clip(q, -127, 127) * d).reshape(x.shape)


def second_pass(x, mask):
    """x rounded, plus its residual rounded again on the blocks mask selects."""
    a = q8(x)
    lo = q8(x - a).reshape(x.shape[0], -1, 32)
    return a + (lo * mask[..., None]).reshape(x.shape)


class Rounded(R.Model):
    def q(self, site, x):
        mode = self.flags.get(site, "q")
        if mode == "x":
            return x
        if mode == "q":
            return q8(x)
        if mode == "hl":
            return second_pass(x, np.ones((x.shape[0], x.shape[1] // 32), bool))
        k = int(mode[1:])
        amax = np.abs(x.reshape(x.shape[0], -1, 32)).max(axis=2)
        if mode[0] == "t":
            mask = np.zeros(amax.shape, bool)
            np.put_along_axis(mask, np.argsort(-amax, axis=1)[:, :k], True, axis=1)
            return second_pass(x, mask)
        key = (site, self.layer)
        if self.calibrating:
            self.picked[key] = np.argsort(-(amax ** 2).sum(axis=0))[:k]
            return q8(x)
        mask = np.zeros(amax.shape, bool)
        mask[:, self.picked[key]] = True
        return second_pass(x, mask)

    def forward(self, ids, cache):
        W, f = self.w, self.flags
        T = len(ids)
        pos = np.arange(T)
        x = W["token_embd.weight"][np.asarray(ids)]
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        mask = np.where(pos[None, :] <= pos[:, None], 0.0, -np.inf)
        f16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
        for l in range(self.n_layer):
            self.layer = l
            b = f"blk.{l}."
            h = self.q("qkv", self.norm(x, W[b + "attn_norm.weight"]))
            q = self.rope((h @ W[b + "attn_q.weight"].T).reshape(T, nh, hd), pos)
            k = self.rope((h @ W[b + "attn_k.weight"].T).reshape(T, nkv, hd), pos)
            v = (h @ W[b + "attn_v.weight"].T).reshape(T, nkv, hd)
            if f.get("kv16"):
                k, v = f16(k), f16(v)
            if f.get("q16"):
                q = f16(q)
            o = np.empty((T, nh, hd))
            for hh in range(nh):
                kv = hh // (nh // nkv)
                s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                o[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
            x = x + self.q("o", o.reshape(T, nh * hd)) @ W[b + "attn_output.weight"].T
            h = self.q("gu", self.norm(x, W[b + "ffn_norm.weight"]))
            g, u = h @ W[b + "ffn_gate.weight"].T, h @ W[b + "ffn_up.weight"].T
            with np.errstate(over="ignore"):
                act = g / (1.0 + np.exp(-g))
            x = x + self.q("down", act * u) @ W[b + "ffn_down.weight"].T
        self.layer = -1
        return self.q("head", self.norm(x, W["output_norm.weight"])) @ W["output.weight"].T


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    name, limit, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    here = os.path.dirname(os.path.abspath(__file__))
    fx = json.load(open(os.path.join(here, "../crates/folio/tests/fixtures/reference_f64_long.json")))
    case = next(c for c in fx["cases"] if c["name"] == name)
    calib = next(c for c in fx["cases"] if c["name"] != name)["prompt_ids"][: int(os.environ.get("CAL", "128"))]
    ids = case["prompt_ids"][:limit]
    positions = [p for p in case["positions"] if p < limit]
    tops = case["top5"][: len(positions)]
    m = Rounded(os.path.join(here, "../models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    for spec in variants:
        t = time.time()
        m.flags = dict(kv.split("=") for kv in spec.split(",") if kv)
        m.picked, m.calibrating = {}, True
        m.forward(calib, [])
        m.calibrating = False
        lp = R.log_softmax(m.forward(ids, [])[positions])
        d = np.array([abs(row[tid] - ref) for row, top in zip(lp, tops) for tid, ref in top])
        print(f"{spec or 'every input rounded'}: mean {d.mean():.4f} max {d.max():.4f} "
              f"over {len(d)} values ({time.time() - t:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
