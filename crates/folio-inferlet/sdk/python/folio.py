"""folio's inferlet SDK for Python.

A program is a Python file with ``def main(input)``: ``input`` is the caller's JSON
input (decoded), and what ``main`` returns (if not None) is emitted last. Inside,
contexts live in the server's KV cache::

    import folio

    def main(input):
        ctx = folio.Context(system="You are terse.")
        ctx.user(input["question"])
        answer = ctx.reply(max_tokens=64)
        folio.emit({"answer": answer.text})

Build it with ``scripts/build_inferlet.sh prog.py prog.wasm`` and upload it to
``POST /v1/inferlets``. Every call that fails raises :class:`FolioError` (its
``kind`` is one of invalid, not-found, busy, limit, unavailable, internal).
"""

import json as _json

from componentize_py_types import Err as _Err
from wit_world.imports import contexts as _contexts
from wit_world.imports import host as _host
from wit_world.imports import types as _types

__all__ = [
    "Context",
    "FolioError",
    "Generation",
    "generate_all",
    "emit",
    "log",
    "tokenize",
    "detokenize",
    "end_tokens",
    "elapsed_us",
]


class FolioError(Exception):
    """A host call failed: ``kind`` says whose fault, ``message`` what happened."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


_KINDS = {
    _types.ErrorKind.INVALID: "invalid",
    _types.ErrorKind.NOT_FOUND: "not-found",
    _types.ErrorKind.BUSY: "busy",
    _types.ErrorKind.LIMIT: "limit",
    _types.ErrorKind.UNAVAILABLE: "unavailable",
    _types.ErrorKind.INTERNAL: "internal",
}


def _call(f, *args):
    try:
        return f(*args)
    except _Err as e:
        v = e.value
        raise FolioError(_KINDS.get(v.kind, "internal"), v.message) from None


_FINISH = {
    _types.Finish.EOS: "eos",
    _types.Finish.STOP: "stop",
    _types.Finish.LENGTH: "length",
}


class Generation:
    """A generation's text, token ids, log-probabilities (when asked) and why it
    ended (``"eos"``, ``"stop"`` or ``"length"``)."""

    def __init__(self, raw):
        self.text = raw.text
        self.tokens = list(raw.tokens)
        self.logprobs = list(raw.logprobs)
        self.finish = _FINISH.get(raw.finish, "length")

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"Generation(text={self.text!r}, finish={self.finish!r})"


def _params(
    max_tokens=128,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    seed=0,
    stop=(),
    json_schema=None,
    json_object=False,
    regex=None,
    choice=None,
    chat=False,
    logprobs=False,
    stream=False,
):
    grammar = None
    if json_schema is not None:
        if not isinstance(json_schema, str):
            json_schema = _json.dumps(json_schema)
        grammar = _types.Grammar_JsonSchema(json_schema)
    elif json_object:
        grammar = _types.Grammar_JsonObject()
    elif regex is not None:
        grammar = _types.Grammar_Regex(regex)
    elif choice is not None:
        grammar = _types.Grammar_Choice(list(choice))
    sampling = None
    if temperature > 0:
        sampling = _types.Sampling(
            temperature=float(temperature),
            top_k=int(top_k),
            top_p=float(top_p),
            min_p=float(min_p),
            seed=int(seed),
        )
    if isinstance(stop, str):
        stop = [stop]
    return _types.GenParams(
        max_tokens=int(max_tokens),
        sampling=sampling,
        stop=list(stop),
        grammar=grammar,
        chat=bool(chat),
        logprobs=bool(logprobs),
        stream=bool(stream),
    )


def generate_all(jobs):
    """Generates on several contexts at once, batched by the engine (one weight
    read per step for all, as a request's ``n`` samples). ``jobs`` is a list of
    ``(context, keywords)`` with :meth:`Context.generate`'s keywords; returns one
    :class:`Generation` per job, in order (a job that failed raises when all are
    done)."""
    raw = _contexts.generate_all([(c._raw, _params(**kw)) for c, kw in jobs])
    out = []
    for r in raw:
        if isinstance(r, _Err):
            v = r.value
            raise FolioError(_KINDS.get(v.kind, "internal"), v.message)
        out.append(Generation(r.value))
    return out


class Context:
    """A sequence in the engine's paged KV cache, owned by this run.

    ``Context(system=None, salt=None)`` makes an empty one (with a system message,
    in a tenant's salt). Its pages return to the pool when it is dropped
    (``ctx.drop()``, a ``with`` block's end, or the run's end).
    """

    def __init__(self, system=None, salt=None, _raw=None):
        self._raw = _raw if _raw is not None else _call(_contexts.Context.create, system, salt)

    # Building the sequence.
    def append(self, text):
        """Appends text (tokenized; a BOS first when the context is empty)."""
        _call(self._raw.append_text, text)
        return self

    def append_tokens(self, tokens):
        _call(self._raw.append_tokens, list(tokens))
        return self

    def system(self, text):
        """Appends a system message (the model's chat template)."""
        _call(self._raw.append_message, _types.Role.SYSTEM, text)
        return self

    def user(self, text):
        _call(self._raw.append_message, _types.Role.USER, text)
        return self

    def assistant(self, text):
        _call(self._raw.append_message, _types.Role.ASSISTANT, text)
        return self

    def flush(self):
        """Computes every pending token now (their full pages become shareable)."""
        _call(self._raw.flush)
        return self

    def fork(self):
        """A new context with the same tokens; committed pages are shared."""
        return Context(_raw=_call(self._raw.fork))

    def truncate(self, n):
        """Drops the last ``n`` tokens."""
        _call(self._raw.truncate, n)
        return self

    def tokens(self):
        return list(_call(self._raw.tokens))

    def info(self):
        i = _call(self._raw.info)
        return {
            "seq_len": i.seq_len,
            "page_size": i.page_size,
            "committed_pages": i.committed_pages,
            "working_pages": i.working_pages,
            "pending_tokens": i.pending_tokens,
            "spare_pages": i.spare_pages,
        }

    def __len__(self):
        return _call(self._raw.info).seq_len

    # Generation.
    def generate(self, **kw):
        """Generates a continuation (greedy unless ``temperature`` > 0); its tokens
        stay in the context. Keywords: ``max_tokens`` (128), ``temperature``,
        ``top_k``, ``top_p``, ``min_p``, ``seed``, ``stop`` (a str or list), at most
        one of ``json_schema`` (a dict or JSON text), ``json_object``, ``regex`` and
        ``choice`` to constrain the output, ``chat`` (the assistant's turn),
        ``logprobs`` (each token's), ``stream`` (each piece sent to the caller as it
        comes)."""
        return Generation(_call(self._raw.generate, _params(**kw)))

    def reply(self, **kw):
        """The assistant's reply in a chat (recorded as its message)."""
        kw["chat"] = True
        return self.generate(**kw)

    def next_logprobs(self, k=5):
        """One forward pass: the ``k`` most likely next tokens as
        ``(token, text, logprob)``, best first. The context is unchanged."""
        return [(t.token, t.text, t.logprob) for t in _call(self._raw.next_logprobs, k)]

    def score(self, tokens, k=1):
        """Appends ``tokens`` and computes them in one forward pass. Returns
        ``(scored, next)``: for each token, ``(logprob, top)`` (its log-probability
        given what precedes it, and the ``k`` most likely tokens in its place as
        ``(token, text, logprob)``), and the ``k`` most likely after the last. The
        tokens stay in the context: truncate those you reject."""
        s = _call(self._raw.score, list(tokens), k)
        top = lambda lst: [(t.token, t.text, t.logprob) for t in lst]  # noqa: E731
        return [(t.logprob, top(t.top)) for t in s.tokens], top(s.next)

    # Snapshots.
    def save(self, name):
        """Saves the context as snapshot ``name`` (the server's snapshot store)."""
        _call(self._raw.save, name)
        return self

    @classmethod
    def open(cls, name):
        """A new context restored from snapshot ``name``."""
        return cls(_raw=_call(_contexts.Context.open, name))

    # Raw page operations.
    def reserve_pages(self, n):
        """Reserves ``n`` working pages ahead."""
        _call(self._raw.reserve_pages, n)
        return self

    def commit_pages(self, k):
        """Commits the first ``k`` full working pages."""
        _call(self._raw.commit_pages, k)
        return self

    def release_pages(self, n):
        """Releases ``n`` working pages from the tail (reserved spares first)."""
        _call(self._raw.release_pages, n)
        return self

    def truncate_working(self, n):
        """Drops the last ``n`` tokens within the working pages."""
        _call(self._raw.truncate_working, n)
        return self

    # Lifetime.
    def drop(self):
        """Returns the context's pages now."""
        if self._raw is not None:
            self._raw.__exit__(None, None, None)
            self._raw = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.drop()
        return False


def emit(chunk):
    """Sends a chunk to the caller: a str as text, anything else as JSON."""
    if isinstance(chunk, str):
        _call(_host.emit, chunk)
    else:
        _call(_host.emit_json, _json.dumps(chunk))


def log(message):
    """A line in the server's log."""
    _host.log(str(message))


def tokenize(text):
    return list(_call(_host.tokenize, text))


def detokenize(tokens):
    return _call(_host.detokenize, list(tokens))


def end_tokens():
    """The tokens that end a generation (EOS and its kin)."""
    return list(_host.end_tokens())


def elapsed_us():
    """Microseconds since the run started."""
    return _host.elapsed_us()
