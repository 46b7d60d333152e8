#!/usr/bin/env python3
"""Makes crates/folio/tests/fixtures/reference_f64.json: the exact model's view of the
fixture prompts.

"Exact model": the function the quantized weights of the GGUF define, evaluated in
float64 with numpy. Every weight is the float64 value its block encodes (Q4_1: d*q + m,
Q8_0: d*q, Q5_0: d*(q - 16), Q4_K: d*sc*q - dmin*m, Q6_K: d*sc*(q - 32), F32 as
stored), and nothing is rounded on the way: no 8-bit quantization of
matmul inputs, no f16 K/V, no f32 accumulation, exact powers in RoPE. folio and every
llama.cpp build are approximations of this function; tests/it/fidelity_f64.rs measures
how far folio is from it, against how far llama.cpp is (scripts/llama_vs_reference.py
writes llama.cpp's figures into the same file).

    python3 -m venv venv && venv/bin/pip install numpy gguf   # gguf: llama.cpp's gguf-py
    venv/bin/python scripts/reference_f64.py models/SmolLM2-135M-Instruct.Q4_1.gguf
    venv/bin/python scripts/llama_vs_reference.py ...           # see its doc

Gemma 3 270M (crates/folio/tests/fixtures/reference_f64_gemma3.json, for
tests/it/fidelity_f64_gemma.rs; the sequences of llama_cpp_gemma3.json, which
scripts/make_fixtures.py's doc makes, 24-token continuations):

    venv/bin/python scripts/reference_f64.py models/gemma-3-270m-q4_k_m.gguf \
        crates/folio/tests/fixtures/reference_f64_gemma3.json \
        --fixtures crates/folio/tests/fixtures/llama_cpp_gemma3.json --n-gen 24

The sequences are the ones crates/folio/tests/fixtures/llama_cpp.json holds (prompt ids
+ llama.cpp's greedy continuation), teacher-forced: top5[i] is the exact model's five
most likely next tokens after seq[..=i], as [id, logprob] (float64 log-softmax, rounded
to 6 decimals), for every i < len(seq) - 1, as in llama_cpp.json. Each case also holds
the exact model's own free-running greedy continuation of the prompt
("reference_greedy_ids", 48 tokens (--n-gen) or up to end of generation).

The forward pass is the llama architecture as GGUF stores it: token embedding; per layer
RMSNorm (the file's epsilon), Q/K/V projections, RoPE in ggml's "normal" layout (rotate
the adjacent pairs (x[2i], x[2i+1]) of each head by pos * base^(-2i/n_rot); the
converter permutes Hugging Face's Q/K rows so that this is the model's rotation),
causal softmax attention with scale 1/sqrt(head_dim) and grouped-query heads (query
head h reads KV head h // (n_head / n_head_kv)), output projection, residual; RMSNorm,
SwiGLU (silu(gate) * up, then down), residual; final RMSNorm and the output head
(output.weight, or the tied token embedding when the file has none).

The gemma3 architecture as llama.cpp runs it (src/models/gemma3.cpp; folio's
model/config.rs reads the same keys): the token embedding times sqrt(n_embd); head size
attention.key_length; RMSNorm weights as stored (the converter has added Gemma's 1 to
them already); per-head RMSNorm of Q and K (attn_q_norm, attn_k_norm) before RoPE; RoPE
in the NEOX layout (rotate (x[i], x[i + n_rot/2])); Q times 1/sqrt(key_length) (the
GGUF has no query_pre_attn_scalar; llama.cpp uses 1/sqrt(n_embd/n_head) instead only
for the 62-layer 27B), no further score scale; the attention output and the FFN output each RMS-normed
(post_attention_norm, post_ffw_norm) before their residual adds; GELU, tanh form
(0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))), times up; sliding layers: with
attention.sliding_window, layer l slides unless l % P == P - 1 (P from
attention.sliding_window_pattern, default 6, or a flag per layer); a sliding layer masks
keys with q_pos - k_pos >= window and uses rope.freq_base_swa (default 10000; global
layers rope.freq_base); the tied head; logits soft-capped only when
final_logit_softcapping is in the file (Gemma 3 270M has none, nor rope scaling).

Checks run every time: each dequantized tensor against gguf-py's own float32
dequantization (the formats whose float32 dequantization can round are built from
exact integer parts times their float64 scales), and --check-rope compares this rotation
with the other layout on the llama.cpp fixtures (the right one agrees with llama.cpp's
top token almost everywhere; the wrong one does not: on Gemma 3 270M, NEOX 160 of 164
positions, adjacent pairs 75).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize

N_GEN = 48
TOP = 5


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _scaled(data, qt, block, fields):
    """dequantize() of the blocks with the f16 fields at byte offsets `fields` replaced:
    each pattern of (offset, f16 value) gives the block's integer part for that scale."""
    raw = data.view(np.uint8).reshape(-1, block).copy()
    for off, val in fields:
        raw[:, off:off + 2] = np.array([val], dtype=np.float16).view(np.uint8)
    return dequantize(raw.reshape(data.shape), qt).astype(np.float64)


def _f16(data, block, off):
    raw = data.view(np.uint8).reshape(-1, block)
    return raw[:, off:off + 2].copy().view(np.float16).astype(np.float64)


def weight64(t):
    """The exact float64 values of tensor t, shaped (rows, row length)."""
    data = np.asarray(t.data)
    qt = t.tensor_type
    if qt == QT.Q4_1:
        # A block is f16 d, f16 m, 16 bytes of nibbles: value = d * q + m. gguf-py
        # computes that sum in float32, which can round; so dequantize with m zeroed
        # (d * q: 11 x 4 significant bits, exact in float32) and add m in float64.
        dq = _scaled(data, qt, 20, [(2, 0.0)])
        w = (dq.reshape(-1, 32) + _f16(data, 20, 2)).reshape(dq.shape)
    elif qt == QT.Q4_K:
        # 256-value super-block: f16 d, f16 dmin, 6-bit scales sc and mins m, nibbles q:
        # value = d * sc * q - dmin * m. In float32 the difference can round, so take
        # the integer parts sc * q (d = 1, dmin = 0) and -m (d = 0, dmin = 1) exactly
        # and scale them by d and dmin in float64.
        a = _scaled(data, qt, 144, [(0, 1.0), (2, 0.0)]).reshape(-1, 256)
        b = _scaled(data, qt, 144, [(0, 0.0), (2, 1.0)]).reshape(-1, 256)
        w = (a * _f16(data, 144, 0) + b * _f16(data, 144, 2)).reshape(-1, t.shape[0])
    elif qt == QT.Q6_K:
        # 256-value super-block, f16 d last (byte 208): value = d * sc * (q - 32), int8
        # sc, 6-bit q: 11 + 8 + 6 bits can round in float32; the integer part with d = 1
        # is exact, scaled by d in float64.
        a = _scaled(data, qt, 210, [(208, 1.0)]).reshape(-1, 256)
        w = (a * _f16(data, 210, 208)).reshape(-1, t.shape[0])
    elif qt in (QT.F32, QT.F16, QT.Q8_0, QT.Q4_0, QT.Q5_0):
        # Exact in float32 already: F32/F16 as stored, Q8_0 d * q (11 x 7 bits),
        # Q4_0 d * (q - 8) (11 x 4 bits), Q5_0 d * (q - 16) (11 x 5 bits).
        w = dequantize(data, qt).astype(np.float64)
    else:
        sys.exit(f"{t.name}: {qt.name} has no exact float64 path here")
    ref = dequantize(data, qt).astype(np.float64)
    err = np.abs(w - ref).max() if w.size else 0.0
    assert err <= 2.0**-23 * max(np.abs(ref).max(), 1e-30), (t.name, err)
    return w


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        arch = field(r, "general.architecture")
        if arch not in ("llama", "gemma3"):
            sys.exit(f"architecture {arch!r}: only llama and gemma3 are written here")
        self.arch = arch
        gemma = arch == "gemma3"
        p = arch + "."
        self.n_layer = int(field(r, p + "block_count"))
        self.n_embd = int(field(r, p + "embedding_length"))
        self.n_head = int(field(r, p + "attention.head_count"))
        self.n_head_kv = int(field(r, p + "attention.head_count_kv", self.n_head))
        self.head_dim = int(field(r, p + "attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(field(r, p + "rope.dimension_count", self.head_dim))
        self.eps = float(field(r, p + "attention.layer_norm_rms_epsilon"))
        self.base = float(field(r, p + "rope.freq_base", 10000.0))
        self.eos = int(field(r, "tokenizer.ggml.eos_token_id"))
        if field(r, p + "rope.scaling.type") not in (None, "none"):
            sys.exit("rope scaling is not written here")
        self.hparams = {
            "arch": arch, "n_layer": self.n_layer, "n_embd": self.n_embd,
            "n_head": self.n_head, "n_head_kv": self.n_head_kv, "head_dim": self.head_dim,
            "n_rot": self.n_rot, "rms_eps": self.eps, "rope_base": self.base, "eos": self.eos,
        }
        # Per layer: sliding window (None: global) and RoPE base. Gemma 3 as llama.cpp
        # reads it (src/models/gemma3.cpp): with attention.sliding_window, layer l slides
        # unless l % P == P - 1 (P = attention.sliding_window_pattern, default 6; or a
        # flag per layer), a sliding layer masks keys with q_pos - k_pos >= window and
        # rotates with rope.freq_base_swa (default 10000, no scaling); Q is scaled by
        # 1/sqrt(key_length), the embedding by sqrt(n_embd); no final soft-cap unless
        # final_logit_softcapping.
        self.window = [None] * self.n_layer
        self.bases = [self.base] * self.n_layer
        self.softcap = None
        if gemma:
            win = field(r, p + "attention.sliding_window")
            pat = field(r, p + "attention.sliding_window_pattern", 6)
            slides = (list(pat) if isinstance(pat, list)
                      else [l % int(pat) < int(pat) - 1 for l in range(self.n_layer)])
            base_swa = float(field(r, p + "rope.freq_base_swa", 10000.0))
            for l in range(self.n_layer):
                if win and slides[l]:
                    self.window[l] = int(win)
                    self.bases[l] = base_swa
            self.softcap = field(r, p + "final_logit_softcapping") or None
            self.hparams.update({
                "sliding_window": win, "sliding_layers": [l for l in range(self.n_layer)
                                                          if self.window[l]],
                "rope_base_swa": base_swa, "final_logit_softcapping": self.softcap,
            })
        self.q_scale = 1.0 / np.sqrt(self.head_dim)
        self.embd_scale = np.sqrt(self.n_embd) if gemma else 1.0
        self.w = {t.name: weight64(t) for t in r.tensors}
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]
        # RoPE layout as llama.cpp's: "normal" (adjacent pairs) for llama, NEOX (halves)
        # for Gemma; --check-rope flips it to show the other one disagreeing.
        self.neox = gemma

    def rope(self, x, pos, base):
        """x: (T, heads, head_dim), rotated in place of its first n_rot dims."""
        half = self.n_rot // 2
        inv = base ** (-2.0 * np.arange(half, dtype=np.float64) / self.n_rot)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if self.neox:  # rotate (x[i], x[i + n_rot/2])
            a, b = x[..., :half].copy(), x[..., half:self.n_rot].copy()
            x[..., :half] = a * cos - b * sin
            x[..., half:self.n_rot] = a * sin + b * cos
        else:  # rotate (x[2i], x[2i + 1])
            a, b = x[..., 0:self.n_rot:2].copy(), x[..., 1:self.n_rot:2].copy()
            x[..., 0:self.n_rot:2] = a * cos - b * sin
            x[..., 1:self.n_rot:2] = a * sin + b * cos
        return x

    def norm(self, x, w):
        """RMSNorm with the weight as the GGUF stores it (Gemma's converter has added the
        1 of its (1 + w) already)."""
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def forward(self, ids, cache):
        """Logits (T, vocab) of ids appended to cache (a list of per-layer (K, V))."""
        W = self.w
        T = len(ids)
        gemma = self.arch == "gemma3"
        p0 = cache[0][0].shape[0] if cache else 0
        pos = np.arange(p0, p0 + T)
        x = W["token_embd.weight"][np.asarray(ids)] * self.embd_scale
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        group = nh // nkv
        kpos = np.arange(p0 + T)[None, :]
        new_cache = []
        for l in range(self.n_layer):
            b = f"blk.{l}."
            h = self.norm(x, W[b + "attn_norm.weight"])
            q = (h @ W[b + "attn_q.weight"].T).reshape(T, nh, hd)
            k = (h @ W[b + "attn_k.weight"].T).reshape(T, nkv, hd)
            v = (h @ W[b + "attn_v.weight"].T).reshape(T, nkv, hd)
            if gemma:  # per-head RMSNorm of Q and K before RoPE
                q = self.norm(q, W[b + "attn_q_norm.weight"])
                k = self.norm(k, W[b + "attn_k_norm.weight"])
            q = self.rope(q, pos, self.bases[l]) * self.q_scale
            k = self.rope(k, pos, self.bases[l])
            if cache:
                k = np.concatenate([cache[l][0], k])
                v = np.concatenate([cache[l][1], v])
            new_cache.append((k, v))
            seen = kpos <= pos[:, None]
            if self.window[l] is not None:
                seen &= pos[:, None] - kpos < self.window[l]
            mask = np.where(seen, 0.0, -np.inf)
            o = np.empty((T, nh, hd))
            for hh in range(nh):
                kv = hh // group
                s = q[:, hh, :] @ k[:, kv, :].T + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                o[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
            a = o.reshape(T, nh * hd) @ W[b + "attn_output.weight"].T
            if gemma:
                a = self.norm(a, W[b + "post_attention_norm.weight"])
            x = x + a
            h = self.norm(x, W[b + "ffn_norm.weight"])
            g = h @ W[b + "ffn_gate.weight"].T
            u = h @ W[b + "ffn_up.weight"].T
            if gemma:  # GELU, tanh approximation (ggml_gelu)
                act = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3)))
            else:
                with np.errstate(over="ignore"):
                    act = g / (1.0 + np.exp(-g))
            f = (act * u) @ W[b + "ffn_down.weight"].T
            if gemma:
                f = self.norm(f, W[b + "post_ffw_norm.weight"])
            x = x + f
        cache[:] = new_cache
        x = self.norm(x, W["output_norm.weight"])
        logits = x @ W["output.weight"].T
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits


def log_softmax(logits):
    m = logits.max(axis=-1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))


def top5(lp):
    idx = np.argsort(-lp, kind="stable")[:TOP]
    return [[int(j), round(float(lp[j]), 6)] for j in idx]


def greedy(model, prompt, n_gen):
    cache = []
    logits = model.forward(prompt, cache)[-1]
    out = []
    for _ in range(n_gen):
        t = int(np.argmax(logits))
        out.append(t)
        if t == model.eos:
            break
        logits = model.forward([t], cache)[-1]
    return out


def check_rope(model, cases):
    """Top-token agreement with llama.cpp's fixtures under either rotation layout."""
    own = model.neox
    for neox in (False, True):
        model.neox = neox
        same = total = 0
        for c in cases:
            seq = c["prompt_ids"] + c["greedy_ids"]
            lp = log_softmax(model.forward(seq[:-1], []))
            for i, t in enumerate(c["top5"]):
                same += int(np.argmax(lp[i])) == t[0][0]
                total += 1
        print(f"rope {'neox' if neox else 'normal (adjacent pairs)'}: top token as "
              f"llama.cpp's at {same}/{total} positions{' (the one used)' if neox == own else ''}",
              file=sys.stderr)
    model.neox = own


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("out", nargs="?", default="crates/folio/tests/fixtures/reference_f64.json")
    ap.add_argument("--fixtures", default="crates/folio/tests/fixtures/llama_cpp.json")
    ap.add_argument("--n-gen", type=int, default=N_GEN,
                    help="length of the free-running greedy continuation (the fixtures')")
    ap.add_argument("--check-rope", action="store_true",
                    help="only compare the two RoPE layouts against llama.cpp's fixtures")
    args = ap.parse_args()
    fx = json.load(open(args.fixtures))
    t0 = time.time()
    model = Model(args.model)
    print(f"loaded in {time.time() - t0:.1f}s: {model.hparams}", file=sys.stderr)
    if args.check_rope:
        check_rope(model, fx["cases"][:3])
        return
    cases = []
    for c in fx["cases"]:
        t0 = time.time()
        seq = c["prompt_ids"] + c["greedy_ids"]
        lp = log_softmax(model.forward(seq[:-1], []))
        top = [top5(row) for row in lp]
        ref_greedy = greedy(model, c["prompt_ids"], args.n_gen)
        agree = sum(int(np.argmax(row)) == t[0][0] for row, t in zip(lp, c["top5"]))
        print(f"{c['name']}: {len(seq) - 1} positions, top token as llama_cpp.json's at "
              f"{agree}, own greedy {'=' if ref_greedy == c['greedy_ids'] else '!='} "
              f"llama_cpp.json's ({time.time() - t0:.1f}s)", file=sys.stderr)
        cases.append({"name": c["name"], "prompt_ids": c["prompt_ids"],
                      "greedy_ids": c["greedy_ids"], "reference_greedy_ids": ref_greedy,
                      "top5": top})
    doc = {}
    if os.path.exists(args.out):  # keep llama_vs_reference.py's figures
        old = json.load(open(args.out))
        if "llama_cpp" in old:
            doc["llama_cpp"] = old["llama_cpp"]
    doc = {
        "made_by": "python3 scripts/reference_f64.py " + " ".join(sys.argv[1:]),
        "model_sha256": fx.get("model_sha256"),
        "note": "float64 evaluation of the quantized weights (exact dequantized values, no "
                "activation or K/V rounding). seq = prompt_ids + greedy_ids (llama_cpp.json's "
                "sequences); top5[i] = the exact model's 5 most likely next tokens after "
                "seq[..=i] as [id, logprob], every position i < len(seq) - 1; "
                "reference_greedy_ids = its own free-running greedy continuation of the prompt. "
                "llama_cpp: each llama.cpp build's distance from top5 "
                "(scripts/llama_vs_reference.py).",
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
