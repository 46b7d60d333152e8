#!/usr/bin/env python3
"""Writes crates/folio/tests/fixtures/family_tokenizers.json: llama.cpp's answers for
the tokenizers of the model families, on llama.cpp's own vocab-only GGUFs (fetched by
scripts/setup.sh into models/vocab/): Llama 3 (llama-bpe), Qwen2/2.5/3 (qwen2), Llama 2
and Mistral-style SentencePiece with byte fallback (llama-spm), Phi-3 (phi-3); and the
vocabularies derived from them by derived_vocabs.py (Gemma 1/2/3's SentencePiece,
Mistral's tekken, every pre-tokenizer name folio maps), each with its derivation spec,
which the Rust test applies itself. Checked by
crates/folio/tests/it/family_tokenizers.rs without llama.cpp.

    LLAMA_CPP_LIB_PATH=/work/llama/build/bin /work/llama/venv/bin/python \\
        scripts/parity/make_family_fixtures.py [--vocab-dir models/vocab]

Per vocabulary:
  encode  text, add_special, parse_special → llama_tokenize's ids: texts sampled from
          the parity corpus (corpus.py, short ones), the cases written below (each a
          difference the parity harness found), every control token's text in words;
  decode  ids → the pieces joined (hex), their lossy text, with control tokens as text,
          and the stream pieces (the definition in tokenizer_parity.py): random id
          sequences and byte-token sequences that split characters;
  eog     every id that ends a generation (llama_vocab_is_eog);
  chat    (vocabularies with a chat template) conversations rendered as llama.cpp's
          server renders them (jinja2 as in family_templates.py, then the leading BOS
          text removed when the vocabulary adds a BOS: common_chat_templates_apply) and
          the prompt's ids (llama_tokenize with add_special and parse_special);
  derive  (derived vocabularies) the spec of derived_vocabs.py.
The pre-tokenizer variants (pre-NAME) get fewer corpus texts and the PRE_CASES, and
few decode cases (their pieces are llama-bpe's).
"""

import argparse
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import corpus  # noqa: E402
from derived_vocabs import DERIVED  # noqa: E402
from family_templates import reference_env, render_reference  # noqa: E402
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

# Gemma: no space prefix, user-defined runs of spaces, newlines and tabs and HTML tags
# matched whole before SentencePiece, its turn markers.
GEMMA_CASES = [
    " leading", "  two leading", "trailing ", "a  b   c    d     e", "\n\n\n\n\nx",
    "\t\t\tindent\t\t\t\t", "<table><h1>x</h1></table><br>", "<start_of_turn>user\nHi<end_of_turn>\n",
    "<start_of_turn>model\n", "<bos><start_of_turn>user\n  x  <end_of_turn>", "<eos>", "<pad><mask>",
    "[multimodal]<unused0><unused1>", "<start_of_image><image_soft_token><end_of_image>",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|><|file_separator|>", "▁", "▁▁x", " ▁ x",
    "<start_of_turn> x", "<end_of_turn>  ", "x<start_of_turn>", "\u3000全角", "\n \n  \n",
]

# Pre-tokenizers: letter case runs (tekken), digit groups, contractions, whitespace runs
# before words and newlines, punctuation runs with newlines and slashes.
PRE_CASES = [
    "HelloWorld ABCdef abcDEF aBcDeF", "ÀÉÎõü ÕüÊ ǅungla Ǆ ǆ", "ΑβΓδ МоСкВа", "ʰʲ ꜰᴀᴋᴇ",
    "12345 1234567 ١٢٣٤ ½⅓", "x1y22z333", "don't I'LL we've 'S 'Re", "a/b//c http://x.y/z\n/",
    "?!\n\n ...\r\n", "  \n  x", "\t\t y", "a \n\n\n b", "$+<=>^~|` &*", "日本語 テキスト 한국어",
    "e\u0301 n\u0303", "  ", "\n", "x   ", "<|begin_of_text|>x", "[INST] hi [/INST]</s>",
    "snake_case camelCase PascalCase SCREAMING_CASE", "3.14159 1,000,000 -42", "ﬁ ﬀ Ⅻ ⅻ",
]

# Qwen2.5's tool-call (user-defined) and FIM (control by text) tokens.
QWEN25_CASES = [
    "<|fim_prefix|>def f():<|fim_suffix|>\n    return 1<|fim_middle|>", "<|repo_name|>r\n<|file_sep|>a.py\nx",
    "<|fim_pad|><|fim_pad|>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", " <tool_call> <|file_sep|> ",
]

# Byte tokens (SentencePiece) that split characters across tokens.
BYTE_SEQS = [
    [0xE4, 0xB8], [0xE4, 0xB8, 0xAD], [0xE4, 0x20, 0xC3, 0xA9], [0xF0, 0x9F, 0x98, 0x80, 0xE4],
    [0xFF, 0xC3], [0x80, 0x80, 0xE2, 0x82, 0xAC],
]


CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "user", "content": "  What is 2+2?\n"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3? <end_of_turn> [INST]"}],
]


def chat_cases(llama, source):
    """The conversations as llama.cpp's server prompts them: rendered, the leading BOS
    text dropped when the vocabulary adds a BOS, tokenized with special tokens."""
    vocab = llama.vocab
    bos_id = llama.lib.llama_vocab_bos(vocab)
    bos = llama.piece(bos_id, True).decode() if bos_id >= 0 else ""
    eos = llama.piece(llama.lib.llama_vocab_eos(vocab), True).decode()
    add_bos = llama.lib.llama_vocab_get_add_bos(vocab)
    out = []
    for msgs in CONVERSATIONS:
        r = render_reference(reference_env(), source, bos, eos, msgs, True, None)
        text = r["text"]  # these conversations render in every template used here
        if add_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        out.append({"messages": msgs, "text": text, "ids": llama.tokenize(text.encode(), True, True)})
    return out


def read_tests(path):
    """The .inp texts as test-tokenizer-0 splits them."""
    raw = open(path, encoding="utf-8").read()
    return raw.split("\n__ggml_vocab_test__\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-dir", default=os.path.join(ROOT, "models", "vocab"))
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--texts", type=int, default=70, help="corpus texts per vocabulary")
    ap.add_argument("--only", nargs="*", help="redo these vocabularies, keep the fixture's others")
    args = ap.parse_args()
    old = {}
    if args.only:
        with open(args.out, encoding="utf-8") as f:
            old = json.load(f)["vocabs"]

    fixture = {
        "about": "llama.cpp's tokenization (llama-cpp-python 0.3.36's vendored llama.cpp, "
                 "vocab only) of the model families' vocabularies: ids of llama_tokenize, "
                 "and llama_token_to_piece's pieces joined. Made by "
                 "scripts/parity/make_family_fixtures.py; checked by "
                 "crates/folio/tests/it/family_tokenizers.rs.",
        "vocabs": {},
    }
    tmp = tempfile.mkdtemp(prefix="family-vocab-")
    corpora = {}
    for v in VOCABS + list(DERIVED):
        if args.only and v not in args.only:
            fixture["vocabs"][v] = old[v]  # each vocabulary's cases depend on it alone
            continue
        spec = DERIVED.get(v)
        if spec:
            from derived_vocabs import derive
            path = os.path.join(tmp, f"ggml-vocab-{v}.gguf")
            derive(spec, args.vocab_dir, path)
        else:
            path = os.path.join(args.vocab_dir, f"ggml-vocab-{v}.gguf")
        pre_variant = v.startswith("pre-")
        llama = Llama(path)
        specials = [llama.piece(i, True).decode() for i in range(llama.n_vocab)
                    if llama.lib.llama_vocab_get_attr(llama.vocab, i) & 0b1000]
        rng = random.Random(f"family-{v}")
        key = tuple(specials)
        if key not in corpora:  # the pre-tokenizer variants share llama-bpe's
            corpora[key] = [t for _, t in corpus.corpus(18, specials, 0.02) if len(t) <= 160]
        texts = list(corpora[key])
        rng.shuffle(texts)
        base = spec["base"] if spec else v
        inp = os.path.join(args.vocab_dir, f"ggml-vocab-{base}.gguf.inp")
        if pre_variant:
            texts = texts[:12] + PRE_CASES + CASES[:14] + read_tests(inp)[:8]
        else:
            texts = texts[: args.texts] + CASES + read_tests(inp)[:8]
        if v.startswith("gemma"):
            texts += GEMMA_CASES
        if v == "tekken":
            texts += PRE_CASES
        if v == "qwen2.5":
            texts += QWEN25_CASES
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
        seqs = list(corpus.random_id_sequences(rng, llama.n_vocab, 2 if pre_variant else 24))
        byte_ids = {}
        for b in range(256):
            ids = llama.tokenize(f"<0x{b:02X}>".encode(), False, True)
            if len(ids) == 1 and llama.piece(ids[0], False) == bytes([b]):
                byte_ids[b] = ids[0]
        if len(byte_ids) == 256 and not pre_variant:
            seqs += [[byte_ids[b] for b in s] for s in BYTE_SEQS]
        seqs += [e["ids"] for e in encode[: 2 if pre_variant else 8]]
        decode = []
        for ids in seqs:
            pieces = [llama.piece(i, False) for i in ids]
            joined = b"".join(pieces)
            decode.append({"ids": ids, "bytes": joined.hex(), "text": lossy(joined),
                           "special_text": lossy(b"".join(llama.piece(i, True) for i in ids)),
                           "stream": stream_pieces(pieces)})
        eog = [i for i in range(llama.n_vocab) if llama.lib.llama_vocab_is_eog(llama.vocab, i)]
        fixture["vocabs"][v] = {"encode": encode, "decode": decode, "eog": eog}
        if spec:
            fixture["vocabs"][v]["derive"] = spec
        source = llama.metadata("tokenizer.chat_template")
        if source:
            fixture["vocabs"][v]["chat"] = chat_cases(llama, source)
        print(f"{v}: {len(encode)} encode, {len(decode)} decode cases", file=sys.stderr)

    with open(args.out, "w") as f:
        f.write('{\n "about": ' + json.dumps(fixture["about"]) + ',\n "vocabs": {\n')
        for k, (v, cases) in enumerate(fixture["vocabs"].items()):
            f.write(f'  "{v}": {{\n')
            f.write(f'   "eog": {json.dumps(cases["eog"])},\n')
            for extra in ("derive", "chat"):
                if extra in cases:
                    f.write(f'   "{extra}": {json.dumps(cases[extra], ensure_ascii=False)},\n')
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
