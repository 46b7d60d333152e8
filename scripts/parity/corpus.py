"""Text corpora for the tokenizer parity harness: deterministic (seeded) generators of
(category, text) pairs. Every text is a Python str without surrogates, so it is valid
UTF-8 and travels through JSON to folio unchanged (folio's API takes &str).

Categories:
  files      chunks of the system's own files: /usr/share/doc, /usr/include, man pages
             (gzip), Rust sources (this repository, the cargo registry)
  blocks     every Unicode block (the system's Blocks.txt) and every 128-code-point
             window of the whole code space, assigned or not: runs, shuffles, and the
             characters mixed with ASCII words, digits, spaces and punctuation
  bytes      random bytes decoded lossily, ASCII control characters (the bytes the
             vocabulary lacks among them) between letters, digits and punctuation
  runs       long runs of whitespace (every kind) and digits (every script), mixed
  special    special-token text, whole and broken, with text around it
"""

import glob
import gzip
import os
import random
import unicodedata

BLOCKS_TXT = "/usr/share/perl/5.36.0/unicore/Blocks.txt"

WHITESPACE = [
    " ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x85", "\xa0", "\u1680",
    "\u2000", "\u2003", "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
    "\u3000", "\u200b", "\ufeff", "\u180e",
]
DIGITS = [
    "0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯",
    "๐๑๒๓๔๕๖๗๘๙", "０１２３４５６７８９", "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗", "ⅠⅡⅢⅣⅫ", "½¼¾²³¹",
    "①②③⑳", "〇一二三",
]
ASCII_WORDS = ["the", "The", "a", "Hello", "x1", "foo_bar", "I", "can't", "it's",
               "we'LL", "'re", "'ve", "'d", "'m", "'s", "'t", "'ll"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "->", "::", "{{", "}}", "//"]
CONTROLS = [chr(c) for c in list(range(0, 32)) + [0x7F] + list(range(0x80, 0xA0))]


def no_surrogates(s):
    return "".join(c for c in s if not 0xD800 <= ord(c) <= 0xDFFF)


def _chunks(rng, text, n, max_len):
    """Up to n random slices of text (code point boundaries), 1..max_len long."""
    out = []
    if not text:
        return out
    for _ in range(n):
        start = rng.randrange(len(text))
        length = int(rng.paretovariate(1.2) * 40)
        out.append(text[start:start + min(length, max_len)])
    return [c for c in out if c]


def _read(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read(1 << 20)
        else:
            with open(path, "rb") as f:
                raw = f.read(1 << 20)
    except (OSError, EOFError):
        return ""
    if b"\0" in raw[:4096]:
        return ""  # binary
    return no_surrogates(raw.decode("utf-8", errors="replace"))


def file_texts(rng, count):
    """count chunks of system files, whole small files among them."""
    pools = {
        "doc": [p for p in glob.glob("/usr/share/doc/**/*", recursive=True) if os.path.isfile(p)],
        "include": glob.glob("/usr/include/**/*.h", recursive=True),
        "man": glob.glob("/usr/share/man/**/*.gz", recursive=True),
        "rust": glob.glob(os.path.expanduser("~/.cargo/registry/src/**/*.rs"), recursive=True)
        + glob.glob(os.path.join(os.path.dirname(__file__), "../../crates/**/*.rs"), recursive=True),
    }
    for k in pools:
        pools[k].sort()
    per = count // len(pools)
    for name, paths in pools.items():
        made = 0
        rng.shuffle(paths)
        i = 0
        while made < per and paths:
            text = _read(paths[i % len(paths)])
            i += 1
            if not text:
                if i > 50 * len(paths):
                    break
                continue
            if len(text) < 3000 and rng.random() < 0.3:
                yield f"files/{name}", text
                made += 1
            for c in _chunks(rng, text, 12, 6000):
                if made >= per:
                    break
                yield f"files/{name}", c
                made += 1


def _blocks():
    out = []
    with open(BLOCKS_TXT) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if ".." in line:
                rng_, name = line.split(";")
                a, b = rng_.split("..")
                out.append((name.strip(), int(a, 16), int(b, 16)))
    return out


def _mix(rng, chars, n):
    """n atoms: the given characters (in runs) between ASCII words, digits, spaces, punct."""
    parts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.45:
            parts.append("".join(rng.choice(chars) for _ in range(1 + int(rng.expovariate(0.5)))))
        elif r < 0.6:
            parts.append(rng.choice(ASCII_WORDS))
        elif r < 0.75:
            parts.append(rng.choice(WHITESPACE[:5]) * (1 + int(rng.expovariate(1.5))))
        elif r < 0.85:
            d = rng.choice(DIGITS)
            parts.append("".join(rng.choice(d) for _ in range(1 + rng.randrange(4))))
        else:
            parts.append(rng.choice(PUNCT))
    return "".join(parts)


def block_texts(rng, per_window):
    """Every named block, then every 128-code-point window of the code space."""
    for name, a, b in _blocks():
        chars = [chr(c) for c in range(a, b + 1) if not 0xD800 <= c <= 0xDFFF]
        if not chars:
            continue
        yield f"blocks/named", "".join(chars[:512])
        for _ in range(per_window * 2):
            yield f"blocks/named", _mix(rng, chars, 1 + rng.randrange(30))
    for base in range(0, 0x110000, 128):
        chars = [chr(c) for c in range(base, base + 128) if not 0xD800 <= c <= 0xDFFF]
        if not chars:
            continue
        # Assigned as far as this Python knows (its Unicode may be older than both
        # tokenizers'): half the mixes draw from every code point of the window.
        assigned = [c for c in chars if unicodedata.category(c) != "Cn"]
        # Sparse: the unassigned planes get one text per window (4, 5, ... 13 alike).
        if not assigned and base >= 0x40000 and rng.random() < 0.9:
            continue
        yield "blocks/window", "".join(chars)
        for i in range(per_window):
            pool = chars if i % 2 else (assigned or chars)
            yield "blocks/window", _mix(rng, pool, 1 + rng.randrange(20))


def byte_texts(rng, count):
    """Random bytes (decoded lossily) and control characters among everything else."""
    for i in range(count):
        r = i % 4
        if r == 0:
            raw = bytes(rng.randrange(256) for _ in range(1 + rng.randrange(200)))
            yield "bytes/random", no_surrogates(raw.decode("utf-8", errors="replace"))
        elif r == 1:
            # Bytes biased towards valid multi-byte sequences: the lossy decode keeps many.
            raw = bytearray()
            while len(raw) < 1 + rng.randrange(200):
                c = rng.choice([rng.randrange(0x80), rng.randrange(0x80, 0x800),
                                rng.randrange(0x800, 0x10000), rng.randrange(0x10000, 0x110000)])
                if not 0xD800 <= c <= 0xDFFF:
                    raw += chr(c).encode()
                if rng.random() < 0.05:
                    raw += bytes([rng.randrange(256)])
            yield "bytes/utf8ish", no_surrogates(raw.decode("utf-8", errors="replace"))
        elif r == 2:
            atoms = CONTROLS + PUNCT + ASCII_WORDS + [" ", "é", "中", "😀", "1"]
            yield "bytes/controls", "".join(rng.choice(atoms) for _ in range(1 + rng.randrange(60)))
        else:
            # Two of anything around one control character: "}\x14$".
            pool = PUNCT + list("aZ9 é中😀\n") + CONTROLS
            yield "bytes/between", "".join(
                rng.choice(pool) + rng.choice(CONTROLS) + rng.choice(pool)
                for _ in range(1 + rng.randrange(8)))


def run_texts(rng, count):
    """Long runs of whitespace and digits, alone and mixed."""
    for i in range(count):
        n = int(rng.paretovariate(0.8) * 2) + 1
        n = min(n, 20000)
        r = i % 5
        if r == 0:
            yield "runs/space", rng.choice(WHITESPACE) * n
        elif r == 1:
            d = rng.choice(DIGITS)
            yield "runs/digits", "".join(rng.choice(d) for _ in range(n))
        elif r == 2:
            yield "runs/whitespace-mix", "".join(rng.choice(WHITESPACE) for _ in range(n))
        elif r == 3:
            prefix = rng.choice(["", "a", "x", "1", "!", "中", "é", "'s"])
            suffix = rng.choice(["", "a", "b", "2", "?", "中", " ", "\n"])
            unit = rng.choice(WHITESPACE[:6] + ["0", "7", " 1", "\t1"])
            yield "runs/around", prefix + unit * n + suffix
        else:
            parts = []
            while sum(map(len, parts)) < n:
                k = 1 + int(rng.expovariate(0.1))
                parts.append(rng.choice([rng.choice(WHITESPACE) * k,
                                         "".join(rng.choice(rng.choice(DIGITS)) for _ in range(k)),
                                         rng.choice(ASCII_WORDS)]))
            yield "runs/alternating", "".join(parts)


def special_texts(rng, specials, count):
    """Special-token text, whole and broken, among words."""
    broken = []
    for s in specials:
        broken += [s[:-1], s[1:], s[: len(s) // 2], s.upper(), s.replace("|", "")]
    for i in range(count):
        parts = []
        for _ in range(1 + rng.randrange(12)):
            r = rng.random()
            if r < 0.35:
                parts.append(rng.choice(specials))
            elif r < 0.5:
                parts.append(rng.choice(broken))
            elif r < 0.7:
                parts.append(rng.choice(ASCII_WORDS))
            elif r < 0.85:
                parts.append(rng.choice(WHITESPACE[:5]))
            else:
                parts.append(rng.choice(PUNCT + ["é", "中", "😀", "\x14", "\x04", "\n\n"]))
        yield "special", "".join(parts)


def corpus(seed, specials, scale=1.0):
    """All categories; about 105,000 texts at scale 1."""
    rng = random.Random(seed)
    k = lambda n: max(1, int(n * scale))
    yield from file_texts(rng, k(48000))
    yield from block_texts(rng, max(1, round(2 * scale)))
    yield from byte_texts(rng, k(20000))
    yield from run_texts(rng, k(10000))
    yield from special_texts(rng, specials, k(14000))


def random_id_sequences(rng, vocab, count):
    """Token id sequences for decoding: random ids (byte tokens among them, so invalid
    UTF-8 happens), each a list of 1..60 ids."""
    for _ in range(count):
        n = 1 + rng.randrange(60)
        yield [rng.randrange(vocab) if rng.random() < 0.6 else rng.randrange(300)
               for _ in range(n)]
