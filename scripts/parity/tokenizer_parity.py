#!/usr/bin/env python3
"""folio's tokenizer against llama.cpp's on a large corpus (see corpus.py): encode,
decode and the streaming decoder must all agree. A dev tool, not a dependency of folio.

    LLAMA_CPP_LIB_PATH=/work/llama/build/bin nice -n 19 \\
        /work/llama/venv/bin/python scripts/parity/tokenizer_parity.py [--scale 1] [--model M]

What agreement means (checked for every text, and for random id sequences):
  encode   folio's ids == llama_tokenize's, with special-token parsing on and off
           (`Tokenizer::encode` / `encode_literal` against parse_special true / false),
           add_special alternating.
  pieces   each token's bytes (`Tokenizer::token_bytes`) == llama_token_to_piece
           (special off): byte-exact, invalid UTF-8 included.
  bytes    all of them == the llama.cpp pieces joined (what its server streams; not
           llama_detokenize, which also strips a SentencePiece leading space and
           "cleans" spaces before punctuation for most BPE vocabularies).
  decode   `Tokenizer::decode` == those bytes decoded with every maximal invalid
           subsequence as one U+FFFD (Python's errors="replace" and Rust's
           from_utf8_lossy follow the same rule); decode_special likewise against
           the pieces with special on.
  stream   the engine's StreamDecoder, fed token by token then finished: the pieces
           concatenate to the decode, and after each token the text shown so far is
           exactly the lossy decode of the bytes so far minus a trailing incomplete
           character (one a later byte could still complete): nothing is held back
           longer, and nothing shown ever changes.

Prints counts per category and check, the time, and writes the mismatches (each
encode mismatch also shrunk to a minimal text that still disagrees) to --out.
"""

import argparse
import json
import os
import random
import sys
import time
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(__file__))
import corpus  # noqa: E402
from common import DEFAULT_MODEL, Folio, Llama, log  # noqa: E402


def lossy(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def incomplete_tail(b: bytes) -> int:
    """How many bytes at the end of b are an unfinished UTF-8 character (0 to 3)."""
    for k in range(1, min(4, len(b) + 1)):
        lead = b[-k]
        if 0x80 <= lead <= 0xBF:
            continue  # a continuation byte: look further back
        if 0xC2 <= lead <= 0xDF:
            need = 2
        elif 0xE0 <= lead <= 0xEF:
            need = 3
        elif 0xF0 <= lead <= 0xF4:
            need = 4
        else:
            return 0
        if k >= need:
            return 0
        second = b[-k + 1] if k > 1 else None
        if second is not None:
            lo, hi = 0x80, 0xBF
            if lead == 0xE0:
                lo = 0xA0
            elif lead == 0xED:
                hi = 0x9F
            elif lead == 0xF0:
                lo = 0x90
            elif lead == 0xF4:
                hi = 0x8F
            if not lo <= second <= hi:
                return 0
        return k
    return 0


def check_decode(llama, ids, answer, bad):
    """Appends (check, detail) for every disagreement of folio's decode answer."""
    pieces = [llama.piece(i, False) for i in ids]
    # The text is the pieces joined, as llama.cpp's server streams it: its
    # llama_detokenize also drops a SentencePiece first token's leading space and, for
    # most byte-level BPE vocabularies, "cleans" spaces before punctuation (" ." and
    # " 's"), which would change the text a model wrote.
    want_bytes = b"".join(pieces)
    got_pieces = [bytes.fromhex(p) for p in answer["pieces"]]
    if got_pieces != pieces:
        i = next(k for k in range(len(ids)) if got_pieces[k] != pieces[k])
        bad.append(("pieces", {"id": ids[i], "folio": got_pieces[i].hex(), "llama": pieces[i].hex()}))
    if bytes.fromhex(answer["bytes"]) != want_bytes:
        bad.append(("bytes", {"folio": answer["bytes"], "llama": want_bytes.hex()}))
    text = lossy(want_bytes)
    if answer["text"] != text:
        bad.append(("decode", {"folio": answer["text"], "llama": text}))
    special = lossy(b"".join(llama.piece(i, True) for i in ids))
    if answer["special_text"] != special:
        bad.append(("decode_special", {"folio": answer["special_text"], "llama": special}))
    stream = answer["stream"]
    if "".join(stream) != text:
        bad.append(("stream", {"folio": stream, "llama": text}))
    else:
        so_far, shown = b"", ""
        for k, p in enumerate(pieces):
            so_far += p
            shown += stream[k]
            want = lossy(so_far[: len(so_far) - incomplete_tail(so_far)])
            if shown != want:
                bad.append(("stream_prefix", {"after": k, "folio": shown, "want": want}))
                break


def encode_mismatch(folio, llama, text, parse, add):
    got = folio.one({"op": "encode", "text": text, "add_special": add, "parse_special": parse})["ids"]
    return got != llama.tokenize(text.encode(), add, parse)


def shrink(folio, llama, text, parse, add):
    """A shorter text that still disagrees: drop chunks, then characters, while it does."""
    cur = text
    n = max(1, len(cur) // 2)
    while n >= 1:
        i, changed = 0, False
        while i < len(cur):
            cand = cur[:i] + cur[i + n:]
            if cand and encode_mismatch(folio, llama, cand, parse, add):
                cur, changed = cand, True
            else:
                i += n
        if not changed:
            n //= 2
    return cur


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--scale", type=float, default=1.0, help="corpus size (1: about 105,000 texts)")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--random-ids", type=int, default=20000, help="random id sequences to decode")
    ap.add_argument("--out", default="/tmp/parity/tokenizer_mismatches.json")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--exe", help="a parity binary other than this tree's (e.g. an older build)")
    ap.add_argument("--max-shrink", type=int, default=60, help="encode mismatches to shrink")
    args = ap.parse_args()

    t0 = time.time()
    folio = Folio(args.model, build=not (args.no_build or args.exe), exe=args.exe)
    llama = Llama(args.model)
    info = folio.one({"op": "info"})
    assert info["vocab"] == llama.n_vocab, (info, llama.n_vocab)
    specials = [llama.piece(i, True).decode() for i in range(llama.n_vocab)
                if llama.lib.llama_vocab_get_attr(llama.vocab, i) & 0b1000]  # CONTROL
    log(f"model {os.path.basename(args.model)}: {info['vocab']} tokens, {len(specials)} control tokens")

    counts = Counter()          # (category, check) -> texts checked
    misses = Counter()          # (category, check) -> mismatches
    examples = defaultdict(list)
    total_texts = total_bytes = 0
    t_folio = t_llama = 0.0
    bad_items = set()           # texts and id sequences with any mismatch

    def record(cat, check, detail, item):
        bad_items.add(item)
        misses[(cat, check)] += 1
        if len(examples[check]) < 200:
            examples[check].append(dict(category=cat, **detail))

    def run_batch(batch):
        nonlocal t_folio, t_llama
        reqs, want = [], []
        t = time.time()
        for i, (cat, text) in enumerate(batch):
            add = i % 2 == 0
            b = text.encode()
            ids_p = llama.tokenize(b, add, True)
            ids_l = llama.tokenize(b, add, False)
            want.append((ids_p, ids_l, add))
            reqs.append({"op": "encode", "text": text, "add_special": add, "parse_special": True})
            reqs.append({"op": "encode", "text": text, "add_special": add, "parse_special": False})
            reqs.append({"op": "decode", "ids": ids_p})
        t_llama += time.time() - t
        t = time.time()
        answers = folio.batch(reqs)
        t_folio += time.time() - t
        t = time.time()
        for i, (cat, text) in enumerate(batch):
            ids_p, ids_l, add = want[i]
            a_p, a_l, a_d = answers[3 * i: 3 * i + 3]
            for check, got, ids, parse in (("encode", a_p, ids_p, True), ("encode_literal", a_l, ids_l, False)):
                counts[(cat, check)] += 1
                if got.get("ids") != ids:
                    record(cat, check, {"text": text, "add_special": add, "parse_special": parse,
                                        "folio": got.get("ids"), "llama": ids}, ("text", text))
            bad = []
            check_decode(llama, ids_p, a_d, bad)
            counts[(cat, "decode")] += 1
            for check, detail in bad:
                record(cat, check, detail, ("text", text))
        t_llama += time.time() - t

    batch = []
    for cat, text in corpus.corpus(args.seed, specials, args.scale):
        batch.append((cat, text))
        total_texts += 1
        total_bytes += len(text.encode())
        if len(batch) == 500:
            run_batch(batch)
            batch = []
            if total_texts % 10000 == 0:
                log(f"  {total_texts} texts, {sum(misses.values())} mismatches, {time.time() - t0:.0f} s")
    if batch:
        run_batch(batch)

    # Random id sequences: decode only.
    rng = random.Random(args.seed)
    seqs = list(corpus.random_id_sequences(rng, llama.n_vocab, args.random_ids))
    for s in range(0, len(seqs), 500):
        chunk = seqs[s: s + 500]
        answers = folio.batch([{"op": "decode", "ids": ids} for ids in chunk])
        for ids, a in zip(chunk, answers):
            counts[("random-ids", "decode")] += 1
            bad = []
            check_decode(llama, ids, a, bad)
            for check, detail in bad:
                record("random-ids", check, dict(ids=ids, **detail), ("ids", tuple(ids)))
    elapsed = time.time() - t0

    # Shrink the encode mismatches to minimal texts, deduplicated.
    minimal = {}
    for check in ("encode", "encode_literal"):
        for ex in examples[check][: args.max_shrink]:
            m = shrink(folio, llama, ex["text"], ex["parse_special"], ex["add_special"])
            key = (m, ex["parse_special"])
            if key not in minimal:
                ids = llama.tokenize(m.encode(), ex["add_special"], ex["parse_special"])
                got = folio.one({"op": "encode", "text": m, "add_special": ex["add_special"],
                                 "parse_special": ex["parse_special"]})["ids"]
                minimal[key] = {"text": m, "parse_special": ex["parse_special"],
                                "add_special": ex["add_special"], "llama": ids, "folio": got,
                                "category": ex["category"]}
    folio.close()

    cats = sorted({c for c, _ in counts})
    checks = ["encode", "encode_literal", "decode"]
    print(f"\n{'category':24} " + " ".join(f"{c:>16}" for c in checks))
    for cat in cats:
        row = []
        for c in checks:
            n = counts.get((cat, c), 0)
            m = sum(v for (cc, k), v in misses.items() if cc == cat and (k == c or (c == "decode" and k not in checks)))
            row.append(f"{m:>6}/{n:<9}" if n else f"{'':>16}")
        print(f"{cat:24} " + " ".join(row))
    by_check = Counter()
    for (_, k), v in misses.items():
        by_check[k] += v
    print(f"\ntexts: {total_texts} ({total_bytes / 1e6:.1f} MB), random id sequences: {len(seqs)}")
    print(f"mismatches by check: {dict(by_check) or 0}")
    print(f"texts or id sequences with any mismatch: {len(bad_items)}")
    print(f"time: {elapsed:.0f} s (folio {t_folio:.0f} s incl. pipes, llama.cpp and checks {t_llama:.0f} s)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"counts": {f"{a}|{b}": v for (a, b), v in counts.items()},
                   "mismatches": {f"{a}|{b}": v for (a, b), v in misses.items()},
                   "minimal_encode_cases": list(minimal.values()),
                   "examples": examples}, f, ensure_ascii=False, indent=1)
    print(f"details: {args.out} ({len(minimal)} minimal encode cases)")
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
