#!/usr/bin/env python3
"""Writes crates/folio/tests/fixtures/tokenizer_parity.json: the distinct cases the
parity harness found (and their neighbours), with the reference's answers, so the
normal test suite (tests/it/tokenizer_parity.rs) checks them without llama.cpp or
jinja2:

  encode     text, parse_special → llama.cpp's ids
  decode     ids → llama.cpp's bytes, their lossy text (and with control tokens as text),
             and the stream pieces the definition in tokenizer_parity.py implies
  templates  conversation → jinja2's string (transformers' settings), or an error

    LLAMA_CPP_LIB_PATH=/work/llama/build/bin /work/llama/venv/bin/python \\
        scripts/parity/make_fixtures.py [--before-exe OLD_PARITY_BINARY]

With --before-exe (a `parity` example built from the code before the fixes), each case
also records whether that build disagreed (`failed_before`), for the record; the test
does not read it.
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
import template_parity as tp  # noqa: E402
from common import DEFAULT_MODEL, ROOT, Folio, Llama  # noqa: E402
from tokenizer_parity import incomplete_tail, lossy  # noqa: E402

OUT = os.path.join(ROOT, "crates", "folio", "tests", "fixtures", "tokenizer_parity.json")

MISSING_CONTROLS = [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D]  # bytes SmolLM2 has no token for

ENCODE = {
    "a byte with no token between pieces that merge (the issue's case): llama.cpp drops "
    "it and keeps its neighbours apart": [
        "}\x14$", "]\x14-", ")\x13/", "{\x13'", "|\x06'", "?\x14.", "[\x04-", ">\x1d,",
        "_\x16(", ":\x1d.", " \x14\x83", "}\x14\x14$}$", "\x14", "\x04\x06\x13\x14\x16\x1d",
        "a\x04b c\x06d", "x = {\x13'k': 1}\x1d;",
    ] + [f"->{chr(b)}->" for b in MISSING_CONTROLS],
    "a character whose UTF-8 lead byte (F1, F2) has no token: the lead byte is dropped, "
    "the continuation bytes keep apart": [
        "\U000422e6\U000422e7", "\U000422a6\U000422d8", "\U0004b3de\U0004b3df",
        "\U000828e6\U000828e7", "\U0006535f\U0006537f", "x\U00050000y", "\U000bffff!",
    ],
    "a character assigned after Unicode 15.1 (llama.cpp's tables): a symbol there, not a "
    "letter or number as in the regex crate's Unicode 16": [
        "\U0001366c't", "\U000135f8's", "\U00011bc1'd", "\U00016104'd", "!\U00013460\U00013461?",
        "\U000105c0's \U000105c1", " \U00010d40", "x \U0001ccf0\U0001ccf1", " \U00016d70",
        " \U00011bf0 \U00016130", "a\U00010d40\U00010d41 1",
    ],
    "control characters and special-token text (regression guard)": [
        f"a{chr(c)}b" for c in range(0x20)
    ] + ["<|im_start|>\x14<|im_end|>", "|>\x06<|", "<|im_start|>user\nhi\x13!<|im_end|>",
         "<|endoftext|><repo_name>x<file_sep>", "<|im_start", "im_end|>"],
}

# (why, token ids): the stream must hold back only an unfinished character.
DECODE = {
    "an invalid byte then a lead byte in one step: only the invalid byte becomes U+FFFD, "
    "the lead byte waits for its continuation": [
        [175, 5549, 119],        # E4 | 20 C3 | A9  → "\ufffd é"
        [218, 4636, 218, 218],   # 80 | 20 E2 | 80 | 80 → "\ufffd €"
        [175, 5549],             # ends unfinished: the flush gives U+FFFD
        [187, 249, 242, 5549, 119, 218],
    ],
    "control tokens (empty) and normal text (regression guard)": [
        [1, 216, 2, 0, 5345], [142, 119, 173, 218, 218],
    ],
}


def stream_pieces(pieces):
    """The stream's pieces per the harness's definition (one per token, then the flush)."""
    out, shown, so_far = [], "", b""
    for p in pieces:
        so_far += p
        now = lossy(so_far[: len(so_far) - incomplete_tail(so_far)])
        out.append(now[len(shown):])
        shown = now
    out.append(lossy(so_far)[len(shown):])
    return out


def template_cases(rng, special, gguf_source):
    """A few conversations per template: edge cases, then random ones. `special` holds
    the variables folio passes (bos_token, eos_token)."""
    fixed = [
        ([{"role": "user", "content": "hi"}], True, None),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "日本語 😀"},
          {"role": "assistant", "content": ""}, {"role": "user", "content": "\n  x  \n"}], False, None),
        ([], True, None),
        ([{"role": "user", "content": "<|im_start|>{{ x }}{% if %}\x00\r\n"}], True, None),
    ]
    templates = {"gguf": (gguf_source, None), "chatml": (tp.rust_chatml(), tp.rust_chatml()),
                 "probe": (tp.PROBE, tp.PROBE), "probe2": (tp.PROBE2, tp.PROBE2)}
    env = tp.reference_env()
    cases = []
    for name, (source, sent) in templates.items():
        convs = list(fixed)
        for _ in range(4):
            msgs = tp.random_conversation(rng, roles_extra=name.startswith("probe"))
            tools = tp.random_tools(rng) if name.startswith("probe") else None
            convs.append((msgs, rng.random() < 0.5, tools))
        if name.startswith("probe"):
            convs.append(([{"role": "narrator", "content": "x"}], False, None))  # raises
        ref = env.from_string(source)
        for msgs, gen, tools in convs:
            try:
                want = {"text": ref.render(messages=msgs, tools=tools, documents=None,
                                           add_generation_prompt=gen, **special)}
            except Exception as e:  # noqa: BLE001
                want = {"error": str(e)}
            case = {"template": name, "messages": msgs, "add_generation_prompt": gen,
                    "tools": tools, **want}
            if sent is not None:
                case["source"] = sent
            cases.append(case)
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--before-exe")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()

    llama = Llama(args.model)
    before = Folio(args.model, build=False, exe=args.before_exe) if args.before_exe else None

    encode = []
    for why, texts in ENCODE.items():
        for text in texts:
            for parse in (True, False):
                if not parse and "<|" not in text and "|>" not in text and why.startswith("control"):
                    continue
                ids = llama.tokenize(text.encode(), False, parse)
                case = {"why": why, "text": text, "parse_special": parse, "ids": ids}
                if before:
                    got = before.one({"op": "encode", "text": text, "add_special": False,
                                      "parse_special": parse})["ids"]
                    case["failed_before"] = got != ids
                encode.append(case)

    decode = []
    for why, seqs in DECODE.items():
        for ids in seqs:
            pieces = [llama.piece(i, False) for i in ids]
            full = llama.detokenize(ids, False)
            assert full == b"".join(pieces)
            case = {"why": why, "ids": ids, "bytes": full.hex(), "text": lossy(full),
                    "special_text": lossy(llama.detokenize(ids, True)),
                    "stream": stream_pieces(pieces)}
            if before:
                got = before.one({"op": "decode", "ids": ids})
                case["failed_before"] = (got["stream"] != case["stream"] or got["text"] != case["text"])
            decode.append(case)

    import gguf
    reader = gguf.GGUFReader(args.model)
    meta = lambda k: reader.fields[k].contents() if k in reader.fields else None
    tokens = meta("tokenizer.ggml.tokens")
    tok = lambda k: tokens[meta(k)] if meta(k) is not None else ""
    special = {"bos_token": tok("tokenizer.ggml.bos_token_id"),
               "eos_token": tok("tokenizer.ggml.eos_token_id")}
    templates = template_cases(random.Random(18), special, meta("tokenizer.chat_template"))
    if before:
        for c in templates:
            req = {"op": "render", "messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
                   "tools": c["tools"]}
            if "source" in c:
                req["template"] = c["source"]
            got = before.one(req)
            c["failed_before"] = ("text" in c) != ("text" in got) or ("text" in c and got["text"] != c["text"])
        before.close()

    fixture = {
        "about": "folio's tokenizer and chat template against the references, for the default "
                 "model: encode/decode ids and bytes from llama.cpp (llama-cpp-python 0.3.36's "
                 "vendored llama.cpp, vocab only), templates from Python's jinja2 set up as "
                 "transformers renders chat templates. Made by scripts/parity/make_fixtures.py; "
                 "checked by crates/folio/tests/it/tokenizer_parity.rs.",
        "model": os.path.basename(args.model),
        "encode": encode,
        "decode": decode,
        "templates": templates,
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    fb = lambda xs: sum(1 for x in xs if x.get("failed_before"))
    print(f"{args.out}: {len(encode)} encode ({fb(encode)} failed before), {len(decode)} decode "
          f"({fb(decode)}), {len(templates)} template cases ({fb(templates)})")


if __name__ == "__main__":
    main()
