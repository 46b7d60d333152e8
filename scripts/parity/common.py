"""Shared pieces of the parity harness: folio's `parity` example as a subprocess, and
llama.cpp (through llama-cpp-python's ctypes bindings, the C API itself, not the
`Llama.detokenize` wrapper, which strips a space after BOS on its own)."""

import ctypes
import json
import os
import subprocess
import sys
import threading

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


class Folio:
    """folio's tokenizer and template: `cargo run --example parity`, one JSON line per
    request and answer."""

    def __init__(self, model, build=True, exe=None):
        exe = exe or os.path.join(ROOT, "target", "release", "examples", "parity")
        if build:
            subprocess.run(
                ["cargo", "build", "--release", "-q", "-p", "folio", "--example", "parity"],
                cwd=ROOT, check=True)
        self.proc = subprocess.Popen(
            [exe, model], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
            bufsize=1 << 20)

    def batch(self, requests):
        """Answers to `requests`, in order (written from a thread so neither pipe fills)."""
        def write():
            for r in requests:
                self.proc.stdin.write(json.dumps(r, ensure_ascii=False).encode() + b"\n")
            self.proc.stdin.flush()
        t = threading.Thread(target=write)
        t.start()
        out = []
        for _ in requests:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("folio's parity example exited")
            out.append(json.loads(line))
        t.join()
        return out

    def one(self, request):
        return self.batch([request])[0]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


class Llama:
    """llama.cpp's tokenizer for a GGUF (vocabulary only)."""

    def __init__(self, model):
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", "/work/llama/build/bin")
        import llama_cpp  # noqa: E402  (after the library path is set)
        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(model, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self._pieces = {}

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool):
        n_max = len(text) + 16
        buf = (self.lib.llama_token * n_max)()
        n = self.lib.llama_tokenize(self.vocab, text, len(text), buf, n_max, add_special, parse_special)
        if n < 0:
            buf = (self.lib.llama_token * -n)()
            n = self.lib.llama_tokenize(self.vocab, text, len(text), buf, -n, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool) -> bytes:
        key = (token, special)
        if key not in self._pieces:
            buf = ctypes.create_string_buffer(256)
            n = self.lib.llama_token_to_piece(self.vocab, token, buf, 256, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self.lib.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            self._pieces[key] = buf.raw[:n]
        return self._pieces[key]

    def detokenize(self, ids, unparse_special: bool) -> bytes:
        """llama_detokenize, nothing removed (`remove_special` off)."""
        arr = (self.lib.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 16 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = self.lib.llama_detokenize(self.vocab, arr, len(ids), buf, size, False, unparse_special)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = self.lib.llama_detokenize(self.vocab, arr, len(ids), buf, size, False, unparse_special)
        return buf.raw[:n]

    def metadata(self, key):
        return self.llm.metadata.get(key)


def log(*a):
    print(*a, file=sys.stderr, flush=True)
