#!/usr/bin/env python3
"""Writes a random-weight GGUF in the shape of a real model, for speed and memory
figures on weights that do not fit in a cache (no such real weights can be downloaded
here). Run by scripts/shape_models.sh, which quantizes the result with llama.cpp's
llama-quantize; the weights are random, so only speed and memory mean anything.

usage: make_shape_model.py SHAPE VOCAB_GGUF OUT_GGUF [--q4_k]
  SHAPE: llama-1b (Llama 3.2 1B: 16 layers, 2048 wide, 32 heads, 8 K/V heads, FFN 8192,
         tied embeddings), llama-8b (Llama 3.1 8B: 32 layers, 4096 wide, 32 heads, 8 K/V
         heads, FFN 14336, its own head) or qwen-3b (Qwen2.5 3B: 36 layers, 2048 wide,
         16 heads, 2 K/V heads, FFN 11008, Q/K/V biases, tied embeddings)
  VOCAB_GGUF: a vocab-only GGUF whose tokenizer the model takes (its vocabulary sets the
         embedding's rows): llama.cpp's ggml-vocab-llama-bpe.gguf / -qwen2.gguf, which
         scripts/setup.sh puts in models/vocab/.
Tensors are written in F16 (norms in F32), N(0, 0.02) with a fixed seed. With --q4_k
every matrix is written straight in random Q4_K blocks (no llama-quantize: an 8B shape
in half a minute, as a lent GPU machine's minutes need): random scales, mins and values, d and
dmin fixed so a weight has mean ~0 and deviation ~0.02.
"""
import sys

import numpy as np
import gguf

SHAPES = {
    "llama-1b": dict(arch="llama", layers=16, dim=2048, heads=32, kv_heads=8, ffn=8192,
                     rope_base=500000.0, eps=1e-5, bias=False, ctx=8192),
    "llama-8b": dict(arch="llama", layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336,
                     rope_base=500000.0, eps=1e-5, bias=False, ctx=8192, head=True),
    "qwen-3b": dict(arch="qwen2", layers=36, dim=2048, heads=16, kv_heads=2, ffn=11008,
                    rope_base=1000000.0, eps=1e-6, bias=True, ctx=8192),
}


def main():
    args = [a for a in sys.argv[1:] if a != "--q4_k"]
    q4_k = len(args) < len(sys.argv) - 1
    if len(args) != 3 or args[0] not in SHAPES:
        sys.exit(__doc__)
    shape, vocab_path, out = args
    s = SHAPES[shape]
    reader = gguf.GGUFReader(vocab_path)
    w = gguf.GGUFWriter(out, s["arch"])
    arch = s["arch"]
    head_dim = s["dim"] // s["heads"]
    w.add_name(f"folio random {shape}")
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_S if q4_k else gguf.LlamaFileType.MOSTLY_F16)
    # The tokenizer: every tokenizer.* field of the vocab file, as it is.
    n_vocab = None
    for field in reader.fields.values():
        name = field.name
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
            w.add_array(name, vals)
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            w.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)
    assert n_vocab, "the vocab file has no tokenizer.ggml.tokens"
    w.add_vocab_size(n_vocab)

    rng = np.random.default_rng(7)

    def f16_mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    # Q4_K: 144 bytes a block of 256 (d, dmin as f16, 12 bytes of 6-bit scales and
    # mins, 128 of nibbles); weight = d * scale * q - dmin * min, q and the 6-bit
    # fields uniform: dmin = 7.5 d centres it, d = 8e-5 makes its deviation ~0.02.
    head_bytes = np.array([8e-5, 6e-4], dtype=np.float16).view(np.uint8)

    def q4_k_mat(rows, cols):
        blocks = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)
        blocks[:, :, :4] = head_bytes
        return blocks.reshape(rows, cols // 256 * 144)

    def add_mat(name, rows, cols):
        if q4_k:
            w.add_tensor(name, q4_k_mat(rows, cols), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        else:
            w.add_tensor(name, f16_mat(rows, cols))

    d, kv = s["dim"], s["kv_heads"] * head_dim
    add_mat("token_embd.weight", n_vocab, d)
    for i in range(s["layers"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(d, dtype=np.float32))
        add_mat(p + "attn_q.weight", d, d)
        add_mat(p + "attn_k.weight", kv, d)
        add_mat(p + "attn_v.weight", kv, d)
        if s["bias"]:
            for t, n in (("q", d), ("k", kv), ("v", kv)):
                w.add_tensor(p + f"attn_{t}.bias", np.zeros(n, dtype=np.float32))
        add_mat(p + "attn_output.weight", d, d)
        w.add_tensor(p + "ffn_norm.weight", np.ones(d, dtype=np.float32))
        add_mat(p + "ffn_gate.weight", s["ffn"], d)
        add_mat(p + "ffn_up.weight", s["ffn"], d)
        add_mat(p + "ffn_down.weight", d, s["ffn"])
    w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    if s.get("head"):
        add_mat("output.weight", n_vocab, d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
