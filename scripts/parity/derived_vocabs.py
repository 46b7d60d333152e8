#!/usr/bin/env python3
"""Vocab-only GGUFs of families that have no vocabulary file here, derived from llama.cpp's
own (`models/vocab/`, fetched by scripts/setup.sh): Gemma's SentencePiece (gemma, gemma2,
gemma3: no space prefix, Gemma's control and user-defined tokens, byte fallback),
Qwen2.5's tool-call and fill-in-the-middle tokens, Mistral Nemo's tekken pre-tokenizer, and every other `tokenizer.ggml.pre` name that
folio maps, each on Llama 3's byte-level BPE vocabulary.

Each derivation is a small spec (DERIVED below): a base vocabulary, metadata to set,
tokens to rename, tokens to append. make_family_fixtures.py writes the specs into
crates/folio/tests/fixtures/family_tokenizers.json beside llama.cpp's answers, and the
Rust test (crates/folio/tests/it/family_tokenizers.rs) applies the same spec with
folio's GgufWriter: no llama.cpp, no Python needed to run the tests, and the derived
files (7.8 MB for the BPE ones) are not committed.

Spec fields (all optional but base):
  base      the vocabulary in models/vocab/ (ggml-vocab-BASE.gguf)
  arch      general.architecture; the base's `llama.*` keys are renamed to ARCH.*
  set       {key: [type, value]}: metadata set (replaced in place, else appended);
            type is one of bool, string, u32, i32, f32, or template: the string in
            crates/folio/tests/fixtures/templates/VALUE
  rename    {id: text}: tokens whose text changes (type and score kept)
  append    [[text, type, score], ...]: tokens added after the last (GGUF token types:
            1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)

    /work/llama/venv/bin/python scripts/parity/derived_vocabs.py [--out-dir DIR]

writes each derived GGUF to DIR (default /tmp/parity/vocab/), for the parity harness
(`tokenizer_parity.py --model DIR/ggml-vocab-NAME.gguf`).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import ROOT  # noqa: E402

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Gemma's tokenizer as its GGUFs have it (convert_hf_to_gguf's SentencePiece path): added
# tokens that are special (or look special) are control tokens, the others user-defined
# with U+2581 turned back into spaces (so runs of spaces, newlines and tabs, and HTML
# tags, are matched whole in the text before SentencePiece sees it).
GEMMA_TOKENS = [
    ["<pad>", CONTROL, 0.0],
    ["<mask>", CONTROL, 0.0],
    ["[multimodal]", USER_DEFINED, 0.0],
    ["<unused0>", CONTROL, 0.0],
    ["<unused1>", USER_DEFINED, 0.0],
    ["<start_of_turn>", CONTROL, 0.0],
    ["<end_of_turn>", CONTROL, 0.0],
    ["\n\n", USER_DEFINED, 0.0],
    ["\n\n\n", USER_DEFINED, 0.0],
    ["\n\n\n\n", USER_DEFINED, 0.0],
    ["  ", USER_DEFINED, 0.0],
    ["   ", USER_DEFINED, 0.0],
    ["    ", USER_DEFINED, 0.0],
    ["\t\t", USER_DEFINED, 0.0],
    ["\t\t\t", USER_DEFINED, 0.0],
    ["<table>", USER_DEFINED, 0.0],
    ["</table>", USER_DEFINED, 0.0],
    ["<h1>", USER_DEFINED, 0.0],
    ["<br>", USER_DEFINED, 0.0],
]
GEMMA_BASE = {
    "base": "llama-spm",
    # Gemma's names for BOS and EOS (ids 1, 2 of the base).
    "rename": {"1": "<bos>", "2": "<eos>"},
}
N_SPM = 32000  # tokens in llama-spm


TEMPLATES = os.path.join(ROOT, "crates", "folio", "tests", "fixtures", "templates")


def gemma(arch, extra_tokens=(), extra_set=None):
    tokens = GEMMA_TOKENS + list(extra_tokens)
    ids = {t[0]: N_SPM + i for i, t in enumerate(tokens)}
    s = {
        "general.name": ["string", f"{arch}-derived"],
        "tokenizer.ggml.add_space_prefix": ["bool", False],
        "tokenizer.ggml.add_bos_token": ["bool", True],
        "tokenizer.ggml.add_eos_token": ["bool", False],
        "tokenizer.ggml.padding_token_id": ["u32", ids["<pad>"]],
        "tokenizer.ggml.eot_token_id": ["u32", ids["<end_of_turn>"]],
    }
    s.update(extra_set(ids) if extra_set else {})
    return dict(GEMMA_BASE, arch=arch, set=s, append=tokens)


# CodeGemma's fill-in-the-middle tokens, which Gemma's converter names by id.
FIM = [
    ["<|fim_prefix|>", CONTROL, 0.0],
    ["<|fim_middle|>", CONTROL, 0.0],
    ["<|fim_suffix|>", CONTROL, 0.0],
    ["<|file_separator|>", CONTROL, 0.0],
]
GEMMA3_IMAGE = [
    ["<start_of_image>", CONTROL, 0.0],
    ["<end_of_image>", CONTROL, 0.0],
    ["<image_soft_token>", CONTROL, 0.0],
]


def fim_keys(ids):
    # The deprecated names for three of them, which llama.cpp still reads.
    return {
        "tokenizer.ggml.prefix_token_id": ["u32", ids["<|fim_prefix|>"]],
        "tokenizer.ggml.middle_token_id": ["u32", ids["<|fim_middle|>"]],
        "tokenizer.ggml.suffix_token_id": ["u32", ids["<|fim_suffix|>"]],
        "tokenizer.ggml.fim_sep_token_id": ["u32", ids["<|file_separator|>"]],
    }


def bpe(pre, **extra):
    return dict({"base": "llama-bpe", "set": {"tokenizer.ggml.pre": ["string", pre]}}, **extra)


def meta_value(ty, val):
    """A `set` entry's value (a template's source for `template`) and its writer type."""
    if ty == "template":
        with open(os.path.join(TEMPLATES, val), encoding="utf-8") as f:
            return "string", f.read()
    return ty, val


DERIVED = {
    "gemma": gemma("gemma", FIM, fim_keys),
    "gemma2": gemma("gemma2", extra_set=lambda ids: {
        "tokenizer.chat_template": ["template", "google-gemma-2-2b-it.jinja"]}),
    "gemma3": gemma("gemma3", GEMMA3_IMAGE, lambda ids: {
        "tokenizer.chat_template": ["template", "google-gemma-2-2b-it.jinja"]}),
    # Qwen2.5: its tool-call and fill-in-the-middle tokens in place of the base's
    # placeholders (user-defined there, as in Qwen2.5's own files); llama.cpp finds the
    # FIM ones by text, makes them control tokens and stops on pad, repo and file_sep.
    "qwen2.5": {"base": "qwen2", "rename": {
        "151657": "<tool_call>", "151658": "</tool_call>", "151659": "<|fim_prefix|>",
        "151660": "<|fim_middle|>", "151661": "<|fim_suffix|>", "151662": "<|fim_pad|>",
        "151663": "<|repo_name|>", "151664": "<|file_sep|>",
    }},
    # Mistral Nemo / Small 3: tekken, and Mistral's control tokens in place of some of
    # Llama 3's (control-typed already).
    "tekken": bpe("tekken", set={
        "tokenizer.ggml.pre": ["string", "tekken"],
        "tokenizer.chat_template": ["template", "mistralai-Mistral-Nemo-Instruct-2407.jinja"],
    }, rename={
        "128000": "<s>", "128001": "</s>", "128002": "[INST]", "128003": "[/INST]",
        "128004": "[TOOL_CALLS]", "128005": "[AVAILABLE_TOOLS]", "128008": "[/AVAILABLE_TOOLS]",
        "128010": "[TOOL_RESULTS]", "128011": "[IMG]",
    }),
}
# Every other pre-tokenizer name folio maps (pretok.rs), as llama.cpp spells them.
PRE_NAMES = [
    "llama3", "llama-v3", "falcon3", "pixtral", "dbrx", "smaug-bpe",
    "qwen2", "deepseek-r1-qwen", "megrez", "stablelm2",
    "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
    "gpt-2", "mpt", "olmo", "jais", "default",
    # llama.cpp's other names for those regexes.
    "falcon-h1", "midm-2.0", "lfm2", "jina-v5-nano", "kormo", "f2llmv2", "hunyuan",
    "solar-open", "grok-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "exaone4", "trillion",
    "granite-docling", "mellum2",
]
for _p in PRE_NAMES:
    DERIVED[f"pre-{_p}"] = bpe(_p)

TYPES = {"bool": "add_bool", "string": "add_string", "u32": "add_uint32", "i32": "add_int32",
         "f32": "add_float32"}


_BASES = {}


def read_base(path):
    """A base file's metadata as (key, value, types), read once."""
    if path not in _BASES:
        import gguf
        r = gguf.GGUFReader(path)
        _BASES[path] = [(k, f.contents(), f.types) for k, f in r.fields.items()]
    return _BASES[path]


def derive(spec, vocab_dir, out_path):
    """Writes the GGUF that `spec` derives from its base in `vocab_dir`."""
    import gguf
    from gguf import GGUFValueType as T

    fields = read_base(os.path.join(vocab_dir, f"ggml-vocab-{spec['base']}.gguf"))
    arch = spec.get("arch") or dict((k, v) for k, v, _ in fields)["general.architecture"]
    w = gguf.GGUFWriter(out_path, arch)  # writes general.architecture itself
    sets = dict(spec.get("set", {}))
    rename = {int(k): v for k, v in spec.get("rename", {}).items()}
    append = spec.get("append", [])
    for key, val, types in fields:
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key in sets:
            ty, val = meta_value(*sets.pop(key))
            getattr(w, TYPES[ty])(key, val)
            continue
        name = key
        if key.startswith("llama.") and arch != "llama":
            name = arch + key[len("llama"):]
        if key == "tokenizer.ggml.tokens":
            val = [rename.get(i, t) for i, t in enumerate(val)] + [a[0] for a in append]
        elif key == "tokenizer.ggml.token_type":
            val = val + [a[1] for a in append]
        elif key == "tokenizer.ggml.scores":
            val = val + [a[2] for a in append]
        elif name.endswith(".vocab_size"):
            val = val + len(append)
        if types[0] == T.ARRAY:
            w.add_key_value(name, val, T.ARRAY, sub_type=types[-1])
        else:
            w.add_key_value(name, val, types[0])
    for key, (ty, val) in sets.items():
        ty, val = meta_value(ty, val)
        getattr(w, TYPES[ty])(key, val)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-dir", default=os.path.join(ROOT, "models", "vocab"))
    ap.add_argument("--out-dir", default="/tmp/parity/vocab")
    ap.add_argument("names", nargs="*", help="derived vocabularies to write (default: all)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for name in args.names or DERIVED:
        out = os.path.join(args.out_dir, f"ggml-vocab-{name}.gguf")
        derive(DERIVED[name], args.vocab_dir, out)
        print(out, file=sys.stderr)


if __name__ == "__main__":
    main()
