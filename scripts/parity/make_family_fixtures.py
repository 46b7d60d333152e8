#!/usr/bin/env python3
"""Writes crates/folio/tests/fixtures/family_tokenizers.json: llama.cpp's answers for
the tokenizers of the model families, on llama.cpp's own vocab-only GGUFs (fetched by
scripts/setup.sh into models/vocab/): Llama 3 (llama-bpe), Qwen2/2.5/3 (qwen2), Llama 2
and Mistral-style SentencePiece with byte fallback (llama-spm), Phi-3 (phi-3). Checked
by crates/folio/tests/it/family_tokenizers.rs without llama.cpp.

    LLAMA_CPP_LIB_PATH=/work/llama/build/bin /work/llama/venv/bin/python \\
        scripts/parity/make_family_fixtures.py [--vocab-dir models/vocab]

Per vocabulary:
  encode  text, add_special, parse_special → llama_tokenize's ids: texts sampled from
          the parity corpus (corpus.py, short ones), the cases written below (each a
          difference the parity harness found), every control token's text in words;
  decode  ids → the pieces joined (hex), their lossy text, with control tokens as text,
          and the stream pieces (the definition in tokenizer_parity.py): random id
          sequences and byte-token sequences that split characters.
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
import corpus  # noqa: E402
from common import ROOT, Llama  # noqa: E402
from make_fixtures import stream_pieces  # noqa: E402
from tokenizer_parity import lossy  # noqa: E402

OUT = os.path.join(ROOT, "crates", "folio", "tests", "fixtures", "family_tokenizers.json")
VOCABS = ["llama-bpe", "qwen2", "llama-spm", "phi-3"]

# Each a difference between folio and llama.cpp that the harness found, and neighbours.
CASES = [
    # BPE whole words (llama3's ignore_merges) and its default BOS.
    "Hello world", " Hello World!", "supercalifragilistic", "internationalization",
    "  indented\n\tcode();", "def f(x):\n    return x**2\n",
    # Contractions are ASCII only: 'ſ and 'K (Kelvin sign) are no contractions.
    "it's", "IT'S", "we'LL", "'ſ", "x'ſt", "'K", "'Ve 're 'D 'M", "Ǆ'S",
    # Phi-3: special tokens swallow the whitespace after them.
    "<|user|>\nhi<|end|>\n<|assistant|>\n", "<|system|> \t\n x<|end|>  ", "</s> a", "<s> a",
    "<|endoftext|> x", "<unk>  y", "<|placeholder1|>\r\nz",
    # Control-typed by text (</s> is user-defined in Phi-3's file, control in llama.cpp).
    "a</s>b", "<|eot_id|>x<|end_of_text|>", "<|im_start|>user\nhi<|im_end|>\n",
    # SentencePiece: byte fallback, leading space, runs of spaces.
    "🦙 llama", "\u0000\u0001", "日本語のテキスト", "   three spaces", "tab\tafter",
    "\n\n\nnewlines", "Ⅻ½٣", "e\u0301", "\U0001f469\u200d\U0001f4bb",
]

# Byte tokens (SentencePiece) that split characters across tokens.
BYTE_SEQS = [
    [0xE4, 0xB8], [0xE4, 0xB8, 0xAD], [0xE4, 0x20, 0xC3, 0xA9], [0xF0, 0x9F, 0x98, 0x80, 0xE4],
    [0xFF, 0xC3], [0x80, 0x80, 0xE2, 0x82, 0xAC],
]


def read_tests(path):
    """The .inp texts as test-tokenizer-0 splits them."""
    raw = open(path, encoding="utf-8").read()
    return raw.split("\n__ggml_vocab_test__\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-dir", default=os.path.join(ROOT, "models", "vocab"))
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--texts", type=int, default=70, help="corpus texts per vocabulary")
    args = ap.parse_args()

    fixture = {
        "about": "llama.cpp's tokenization (llama-cpp-python 0.3.36's vendored llama.cpp, "
                 "vocab only) of the model families' vocabularies: ids of llama_tokenize, "
                 "and llama_token_to_piece's pieces joined. Made by "
                 "scripts/parity/make_family_fixtures.py; checked by "
                 "crates/folio/tests/it/family_tokenizers.rs.",
        "vocabs": {},
    }
    for v in VOCABS:
        path = os.path.join(args.vocab_dir, f"ggml-vocab-{v}.gguf")
        llama = Llama(path)
        specials = [llama.piece(i, True).decode() for i in range(llama.n_vocab)
                    if llama.lib.llama_vocab_get_attr(llama.vocab, i) & 0b1000]
        rng = random.Random(f"family-{v}")
        texts = [t for _, t in corpus.corpus(18, specials, 0.02) if len(t) <= 160]
        rng.shuffle(texts)
        texts = texts[: args.texts] + CASES + read_tests(path + ".inp")[:8]
        for s in rng.sample(specials, min(6, len(specials))):
            texts.append(f"a {s} b{s}\n{s[:-1]}")
        encode = []
        for i, text in enumerate(texts):
            b = text.encode()
            add = i % 2 == 0
            with_special = any(s in text for s in specials)
            for parse in ((True, False) if with_special else (True,)):
                encode.append({"text": text, "add_special": add, "parse_special": parse,
                               "ids": llama.tokenize(b, add, parse)})
        seqs = list(corpus.random_id_sequences(rng, llama.n_vocab, 24))
        byte_ids = {}
        for b in range(256):
            ids = llama.tokenize(f"<0x{b:02X}>".encode(), False, True)
            if len(ids) == 1 and llama.piece(ids[0], False) == bytes([b]):
                byte_ids[b] = ids[0]
        if len(byte_ids) == 256:
            seqs += [[byte_ids[b] for b in s] for s in BYTE_SEQS]
        seqs += [e["ids"] for e in encode[:8]]
        decode = []
        for ids in seqs:
            pieces = [llama.piece(i, False) for i in ids]
            joined = b"".join(pieces)
            decode.append({"ids": ids, "bytes": joined.hex(), "text": lossy(joined),
                           "special_text": lossy(b"".join(llama.piece(i, True) for i in ids)),
                           "stream": stream_pieces(pieces)})
        fixture["vocabs"][v] = {"encode": encode, "decode": decode}
        print(f"{v}: {len(encode)} encode, {len(decode)} decode cases", file=sys.stderr)

    with open(args.out, "w") as f:
        f.write('{\n "about": ' + json.dumps(fixture["about"]) + ',\n "vocabs": {\n')
        for k, (v, cases) in enumerate(fixture["vocabs"].items()):
            f.write(f'  "{v}": {{\n')
            for j, key in enumerate(("encode", "decode")):
                f.write(f'   "{key}": [\n')
                rows = [json.dumps(c, ensure_ascii=False) for c in cases[key]]
                f.write(",\n".join("    " + r for r in rows))
                f.write("\n   ]" + ("," if j == 0 else "") + "\n")
            f.write("  }" + ("," if k + 1 < len(fixture["vocabs"]) else "") + "\n")
        f.write(" }\n}\n")
    print(f"{args.out}: {os.path.getsize(args.out)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
