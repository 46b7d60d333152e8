#!/usr/bin/env python3
"""Makes crates/folio/tests/fixtures/arch/: one tiny random GGUF per architecture and
llama.cpp's view of each (arch.json).

    LLAMA_CPP_LIB_PATH=/work/llama/build/bin /work/llama/venv/bin/python \
        scripts/make_arch_fixtures.py [crates/folio/tests/fixtures/arch]

Each model: a few layers of width 64, F32 weights (no quantization noise on either
side), the byte-level BPE vocabulary of folio's tiny model (256 bytes, 5 merges, two
control tokens), drawn from a seeded generator, with the output head scaled so the top
logits are well apart. For each prompt, llama.cpp (llama-cpp-python) gives its prompt
ids, a greedy continuation and the top-5 log-probabilities at every position of
prompt + continuation, teacher-forced one token per step with flash attention on, as
scripts/make_fixtures.py does for the default model. folio's tests
(tests/it/architectures.rs) read the files; llama.cpp is never needed to run them.

Files that llama.cpp cannot read (a metadata spelling only folio accepts) are written
with `"reference": <the file whose llama.cpp numbers they must equal>` and no cases.
An entry with `"n_ctx"` was run by llama.cpp with that context (Phi-3's long-context
RoPE picks its divisor set by it; folio's test configures the model the same way); a
second run of one file at another context is an entry of its own naming the same file.
"""
import json
import os
import sys

import numpy as np
import gguf
from llama_cpp import Llama, __version__
from llama_teacher import log_softmax, teacher_forced

DIM = 64
FFN = 128
HEADS = 4
KV_HEADS = 2
CONTEXT = 256
N_GEN = 24
# phi3_longrope: its context_length, and the original context its short set is for.
LONGROPE_CONTEXT = 1024
LONGROPE_ORIGINAL = 256
# Runs at a context other than CONTEXT: {entry: (model, llama.cpp's n_ctx)}; an entry
# that names another model runs that model's file.
CONTEXTS = {
    "phi3_longrope": ("phi3_longrope", LONGROPE_CONTEXT),
    "phi3_longrope_short": ("phi3_longrope", LONGROPE_ORIGINAL),
}
TOP = 5

PROMPTS = {
    "short": "The capital of France is",
    "long": "In the eleventh century, the artisan Bi Sheng made movable type from baked clay, "
            "and later craftsmen cast type in bronze.",
    "chat": "<|im_start|>user\nWhat is the tallest mountain?<|im_end|>\n<|im_start|>assistant\n",
}


def byte_chars():
    """GPT-2's printable stand-in for every byte (the order folio's tokenizer uses)."""
    out, n = [], 0
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF:
            out.append(chr(b))
        else:
            n += 1
            out.append(chr(255 + n))
    return out


MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]


def vocab():
    toks = byte_chars() + [m.replace(" ", "") for m in MERGES] + ["<|im_start|>", "<|im_end|>"]
    types = [1] * len(toks)
    types[-2] = types[-1] = 3
    return toks, types


class Model:
    """A GGUF under construction: metadata and F32 tensors from one seeded generator."""

    def __init__(self, arch, seed, head_dim=None, layers=2, context=CONTEXT):
        self.arch = arch
        self.context = context
        self.rng = np.random.default_rng(seed)
        self.layers = layers
        self.head_dim = head_dim or DIM // HEADS
        self.meta = []
        self.tensors = []
        toks, _ = vocab()
        self.vocab = len(toks)

    def key(self, name, value, kind):
        self.meta.append((f"{self.arch}.{name}", value, kind))

    def mat(self, name, rows, cols, gain=1.0):
        w = self.rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))
        self.tensors.append((name, w.astype(np.float32)))

    def vec(self, name, n, around=1.0, spread=0.1):
        v = around + self.rng.uniform(-spread, spread, n)
        self.tensors.append((name, v.astype(np.float32)))

    def write(self, path):
        w = gguf.GGUFWriter(path, self.arch)
        # Not the architecture's name: llama.cpp sets token attributes by it (phi3).
        w.add_name("folio-tiny")
        hd = self.head_dim
        w.add_uint32(f"{self.arch}.block_count", self.layers)
        w.add_uint32(f"{self.arch}.context_length", self.context)
        w.add_uint32(f"{self.arch}.embedding_length", DIM)
        w.add_uint32(f"{self.arch}.feed_forward_length", FFN)
        w.add_uint32(f"{self.arch}.attention.head_count", HEADS)
        w.add_uint32(f"{self.arch}.attention.head_count_kv", KV_HEADS)
        w.add_float32(f"{self.arch}.attention.layer_norm_rms_epsilon", 1e-6)
        if hd != DIM // HEADS:
            w.add_uint32(f"{self.arch}.attention.key_length", hd)
            w.add_uint32(f"{self.arch}.attention.value_length", hd)
        for key, value, kind in self.meta:
            {"u32": w.add_uint32, "f32": w.add_float32, "str": w.add_string,
             "arr": w.add_array}[kind](key, value)
        toks, types = vocab()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges(MERGES)
        w.add_bos_token_id(len(toks) - 2)
        w.add_eos_token_id(len(toks) - 1)
        w.add_add_bos_token(False)
        for name, t in self.tensors:
            w.add_tensor(name, t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def standard(m, qkv_bias=False, qk_norm=False, fused=False, post_norms=False, tied=True):
    """The tensors of a pre-norm transformer of `m`'s shape, named as llama.cpp names them."""
    hd = m.head_dim
    qd, kvd = HEADS * hd, KV_HEADS * hd
    # Embedding rows of RMS 1.25: a tied head then spreads the logits with a standard
    # deviation of about 10 (Gemma's about 4, under its soft cap), top-1 gaps ~1 nat.
    m.mat("token_embd.weight", m.vocab, DIM, gain=np.sqrt(DIM) * (0.5 if post_norms else 1.25))
    for i in range(m.layers):
        b = f"blk.{i}."
        m.vec(b + "attn_norm.weight", DIM)
        if fused:
            m.mat(b + "attn_qkv.weight", qd + 2 * kvd, DIM)
        else:
            m.mat(b + "attn_q.weight", qd, DIM)
            m.mat(b + "attn_k.weight", kvd, DIM)
            m.mat(b + "attn_v.weight", kvd, DIM)
        if qkv_bias:
            m.vec(b + "attn_q.bias", qd, 0.0, 0.5)
            m.vec(b + "attn_k.bias", kvd, 0.0, 0.5)
            m.vec(b + "attn_v.bias", kvd, 0.0, 0.5)
        if qk_norm:
            m.vec(b + "attn_q_norm.weight", hd)
            m.vec(b + "attn_k_norm.weight", hd)
        m.mat(b + "attn_output.weight", DIM, qd)
        if post_norms:
            # Post-norm gains of ~2, so the layers weigh about as much as the (scaled) embedding.
            m.vec(b + "post_attention_norm.weight", DIM, 2.0, 0.25)
        m.vec(b + "ffn_norm.weight", DIM)
        if fused:
            m.mat(b + "ffn_up.weight", 2 * FFN, DIM)
        else:
            m.mat(b + "ffn_gate.weight", FFN, DIM)
            m.mat(b + "ffn_up.weight", FFN, DIM)
        m.mat(b + "ffn_down.weight", DIM, FFN)
        if post_norms:
            m.vec(b + "post_ffw_norm.weight", DIM, 2.0, 0.25)
    m.vec("output_norm.weight", DIM)
    if not tied:
        m.mat("output.weight", m.vocab, DIM, gain=10.0)


def llama3_factors(dims, base, factor, low, high, orig):
    """Llama 3's per-frequency divisors (transformers' rope_type "llama3")."""
    freqs = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def build(out_dir):
    """Every fixture model: {name: (path, Model, runs_in_llama_cpp)}."""
    models = {}

    m = Model("qwen2", 1)
    m.key("rope.freq_base", 1000000.0, "f32")
    standard(m, qkv_bias=True)
    models["qwen2"] = m

    m = Model("qwen3", 2, head_dim=32)
    m.key("rope.freq_base", 1000000.0, "f32")
    standard(m, qk_norm=True, tied=False)
    models["qwen3"] = m

    m = Model("llama", 3)
    m.key("rope.freq_base", 500000.0, "f32")
    m.key("rope.dimension_count", DIM // HEADS, "u32")
    standard(m, tied=False)
    m.tensors.append(("rope_freqs.weight",
                      llama3_factors(DIM // HEADS, 500000.0, 8.0, 1.0, 4.0, 32)))
    models["llama3"] = m

    m = Model("llama", 4)
    m.key("rope.scaling.type", "linear", "str")
    m.key("rope.scaling.factor", 4.0, "f32")
    standard(m)
    models["llama_linear"] = m

    m = Model("qwen2", 5)
    m.key("rope.freq_base", 10000.0, "f32")
    m.key("rope.scaling.type", "yarn", "str")
    m.key("rope.scaling.factor", 4.0, "f32")
    m.key("rope.scaling.original_context_length", 32, "u32")
    standard(m, qkv_bias=True)
    models["qwen2_yarn"] = m

    m = Model("phi3", 6)
    m.key("rope.dimension_count", DIM // HEADS, "u32")
    standard(m, fused=True, tied=False)
    models["phi3"] = m

    m = Model("gemma2", 7, head_dim=32, layers=4)
    m.key("attention.sliding_window", 8, "u32")
    m.key("attn_logit_softcapping", 5.0, "f32")
    m.key("final_logit_softcapping", 20.0, "f32")
    standard(m, post_norms=True)
    models["gemma2"] = m

    m = Model("gemma3", 8, head_dim=32, layers=3)
    m.key("attention.sliding_window", 8, "u32")
    m.key("attention.sliding_window_pattern", 3, "u32")
    m.key("rope.freq_base", 1000000.0, "f32")
    m.key("rope.freq_base_swa", 10000.0, "f32")
    m.key("rope.scaling.type", "linear", "str")
    m.key("rope.scaling.factor", 2.0, "f32")
    standard(m, qk_norm=True, post_norms=True)
    models["gemma3"] = m

    # Mistral-style: llama with every layer sliding. llama.cpp ignores the window of
    # the llama architecture, so this one's numbers come from exact() below.
    m = Model("llama", 9)
    m.key("attention.sliding_window", 8, "u32")
    standard(m)
    models["llama_swa"] = m

    # Phi-3's long-context RoPE, as the converter writes a 128k file: context_length the
    # extended context, original_context_length the trained one, attn_factor
    # sqrt(1 + ln(scale) / ln(original)), and two divisor sets well away from 1 (the
    # short set's fastest frequency near 1, the long set's several times it), so the
    # set llama.cpp picks shows in every logit. The original context is 256, not
    # smaller: llama.cpp rounds its context up to a multiple of 256 before comparing, so
    # a run at n_ctx 256 takes the short set and one at 1024 the long set.
    m = Model("phi3", 10, context=LONGROPE_CONTEXT)
    rot = DIM // HEADS
    m.key("rope.dimension_count", rot, "u32")
    m.key("rope.scaling.original_context_length", LONGROPE_ORIGINAL, "u32")
    scale = LONGROPE_CONTEXT / LONGROPE_ORIGINAL
    m.key("rope.scaling.attn_factor",
          float(np.sqrt(1 + np.log(scale) / np.log(LONGROPE_ORIGINAL))), "f32")
    standard(m, fused=True, tied=False)
    m.tensors.append(("rope_factors_short.weight",
                      np.sort(m.rng.uniform(1.05, 2.0, rot // 2)).astype(np.float32)))
    m.tensors.append(("rope_factors_long.weight",
                      np.sort(m.rng.uniform(2.5, 16.0, rot // 2)).astype(np.float32)))
    models["phi3_longrope"] = m

    out = {}
    for name, m in models.items():
        path = os.path.join(out_dir, f"{name}.gguf")
        m.write(path)
        out[name] = path

    # llama 3 again, its scaling spelled in metadata (folio computes the same divisors);
    # llama.cpp has no such spelling, so its reference is the rope_freqs file above.
    m = models["llama3"]
    m.tensors = [t for t in m.tensors if t[0] != "rope_freqs.weight"]
    m.key("rope.scaling.type", "llama3", "str")
    m.key("rope.scaling.factor", 8.0, "f32")
    m.key("rope.scaling.low_freq_factor", 1.0, "f32")
    m.key("rope.scaling.high_freq_factor", 4.0, "f32")
    m.key("rope.scaling.original_context_length", 32, "u32")
    path = os.path.join(out_dir, "llama3_meta.gguf")
    m.write(path)
    return models, out, {"llama3_meta": (path, "llama3")}


def reference(path, n_ctx=CONTEXT):
    llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                n_threads=1, n_threads_batch=1, verbose=False, seed=0, flash_attn=True)
    cases = []
    for name, text in PROMPTS.items():
        toks, gen, top, gaps = teacher_forced(llm, text, N_GEN, TOP, add_bos=False,
                                              stop_at_eos=False, digits=6)
        cases.append({"name": name, "text": text, "prompt_ids": toks,
                      "greedy_ids": gen, "top5": top})
        print(f"{os.path.basename(path)} {name}: {len(toks)} prompt tokens, smallest top-1 gap "
              f"{min(gaps):.4f} nats", file=sys.stderr)
    return cases


def exact(m, window):
    """A float64 evaluation of llama-architecture model `m` (adjacent-pair RoPE, no
    scaling, tied head), every layer's queries seeing the `window` keys up to their
    own (None: all): logits of every position of a token sequence."""
    t = dict(m.tensors)
    hd = m.head_dim
    group = HEADS // KV_HEADS

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    def rope(x, pos):  # x: [n, heads, hd]
        i = np.arange(hd // 2)
        ang = pos[:, None] * 10000.0 ** (-2.0 * i / hd)  # [n, hd/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def logits(tokens):
        n = len(tokens)
        f = {k: v.astype(np.float64) for k, v in t.items()}
        x = f["token_embd.weight"][tokens]
        pos = np.arange(n, dtype=np.float64)
        p = np.arange(n)
        mask = p[None, :] <= p[:, None]
        if window is not None:
            mask &= p[:, None] - p[None, :] < window
        for l in range(m.layers):
            b = f"blk.{l}."
            h = norm(x, f[b + "attn_norm.weight"])
            q = rope((h @ f[b + "attn_q.weight"].T).reshape(n, HEADS, hd), pos)
            k = rope((h @ f[b + "attn_k.weight"].T).reshape(n, KV_HEADS, hd), pos)
            v = (h @ f[b + "attn_v.weight"].T).reshape(n, KV_HEADS, hd)
            att = np.empty((n, HEADS, hd))
            for hh in range(HEADS):
                s = q[:, hh] @ k[:, hh // group].T / np.sqrt(hd)
                s = np.where(mask, s, -np.inf)
                s = np.exp(s - s.max(-1, keepdims=True))
                att[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh // group]
            x = x + att.reshape(n, -1) @ f[b + "attn_output.weight"].T
            h = norm(x, f[b + "ffn_norm.weight"])
            g = h @ f[b + "ffn_gate.weight"].T
            u = h @ f[b + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ f[b + "ffn_down.weight"].T
        return norm(x, f["output_norm.weight"]) @ f["token_embd.weight"].T

    return logits


def exact_cases(m, window, like):
    """Cases as reference() writes them, from exact(); `like` (llama.cpp's cases on the
    same file, which it runs without the window) gives the prompt ids."""
    run = exact(m, window)
    cases = []
    for case in like:
        toks = case["prompt_ids"]
        seq = list(toks)
        for _ in range(N_GEN):
            seq.append(int(np.argmax(run(seq)[-1])))
        rows = run(seq[:-1])
        top = []
        for row in rows:
            lp = log_softmax(row)
            idx = np.argsort(-lp)[:TOP]
            top.append([[int(j), round(float(lp[j]), 6)] for j in idx])
        cases.append({"name": case["name"], "text": case["text"], "prompt_ids": toks,
                      "greedy_ids": seq[len(toks):], "top5": top})
    return cases


def check_exact(m, cases):
    """exact() without a window must agree with llama.cpp (which ignores it) on the
    same file: the reference is checked before it is trusted. They differ by llama.cpp's
    f16 K/V, query and value accumulator: 2.5e-2 nats at most here."""
    run = exact(m, None)
    worst = 0.0
    for case in cases:
        seq = case["prompt_ids"] + case["greedy_ids"]
        rows = run(seq[:-1])
        for row, top in zip(rows, case["top5"]):
            lp = log_softmax(row)
            worst = max(worst, max(abs(lp[j] - v) for j, v in top))
    print(f"exact() vs llama.cpp without the window: max |diff| {worst:.2e}", file=sys.stderr)
    assert worst < 5e-2, worst


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "crates/folio/tests/fixtures/arch"
    os.makedirs(out_dir, exist_ok=True)
    models, files, aliases = build(out_dir)
    doc = {
        "made_by": "python3 " + " ".join(sys.argv),
        "llama_cpp_python": __version__,
        "flash_attn": True,
        "note": "top5[i] = llama.cpp's 5 most likely next tokens after seq[..=i] as [id, logprob]; "
                "seq = prompt_ids + greedy_ids; fed one token per step.",
        "models": {},
    }
    for name, path in files.items():
        if name in CONTEXTS:
            continue
        doc["models"][name] = {"file": os.path.basename(path), "cases": reference(path)}
    for name, (model, n_ctx) in CONTEXTS.items():
        path = files[model]
        doc["models"][name] = {"file": os.path.basename(path), "n_ctx": n_ctx,
                               "cases": reference(path, n_ctx)}
    # The two divisor sets must give llama.cpp different numbers, or the fixture would
    # not show which set runs.
    short, long = (doc["models"][n]["cases"] for n in ("phi3_longrope_short", "phi3_longrope"))
    assert all(a["top5"][0] != b["top5"][0] or a["greedy_ids"] != b["greedy_ids"]
               for a, b in zip(short, long)), "longrope: both sets give the same numbers"
    # llama.cpp ran llama_swa without its window; replace its numbers by exact()'s.
    swa = doc["models"]["llama_swa"]
    check_exact(models["llama_swa"], swa["cases"])
    swa["cases"] = exact_cases(models["llama_swa"], 8, swa["cases"])
    swa["by"] = "exact(): float64 evaluation in this script (llama.cpp ignores llama's window)"
    for name, (path, ref) in aliases.items():
        doc["models"][name] = {"file": os.path.basename(path), "reference": ref}
    with open(os.path.join(out_dir, "arch.json"), "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
