/**
 * folio's inferlet SDK for JavaScript.
 *
 * A program is an ES module that exports `main(input)`: `input` is the caller's
 * JSON input (parsed), and what `main` returns (if not undefined or null) is emitted
 * last. Inside, contexts live in the server's KV cache:
 *
 *     import { Context, emit } from "./folio.js";
 *
 *     export function main(input) {
 *       const ctx = new Context({ system: "You are terse." });
 *       ctx.user(input.question);
 *       const answer = ctx.reply({ maxTokens: 64 });
 *       emit({ answer: answer.text });
 *     }
 *
 * Build it with `scripts/build_inferlet.sh prog.js prog.wasm` (componentize-js; the
 * build puts this file next to the program as `./folio.js`) and upload it to
 * `POST /v1/inferlets`. Every call that fails throws a `FolioError` (its `kind` is
 * one of invalid, not-found, busy, limit, unavailable, internal). The API mirrors
 * the Python SDK's (crates/folio-inferlet/sdk/python/folio.py) with JavaScript's
 * names: options objects for keyword arguments, camelCase.
 */

import { Context as RawContext, generateAll as rawGenerateAll } from "folio:inferlet/contexts@0.1.0";
import * as host from "folio:inferlet/host@0.1.0";

/** A host call failed: `kind` says whose fault, `message` what happened. */
export class FolioError extends Error {
  constructor(kind, message) {
    super(`${kind}: ${message}`);
    this.name = "FolioError";
    this.kind = kind;
    this.detail = message;
  }
}

// A failed import throws an Error whose `payload` is the WIT `error` record.
function call(f) {
  try {
    return f();
  } catch (e) {
    const p = e && e.payload;
    if (p && typeof p === "object" && "kind" in p) {
      throw new FolioError(p.kind, p.message);
    }
    throw e;
  }
}

/** A generation's text, token ids, log-probabilities (when asked) and why it ended
 * (`"eos"`, `"stop"` or `"length"`). */
export class Generation {
  constructor(raw) {
    this.text = raw.text;
    this.tokens = Array.from(raw.tokens);
    this.logprobs = Array.from(raw.logprobs);
    this.finish = raw.finish;
  }

  toString() {
    return this.text;
  }
}

function str(text, what) {
  if (typeof text !== "string") throw new TypeError(`${what} takes a string, not ${text === null ? "null" : typeof text}`);
  return text;
}

function grammarOf(o) {
  if (o.jsonSchema !== undefined && o.jsonSchema !== null) {
    const s = typeof o.jsonSchema === "string" ? o.jsonSchema : JSON.stringify(o.jsonSchema);
    return { tag: "json-schema", val: s };
  }
  if (o.jsonObject) return { tag: "json-object" };
  if (o.regex !== undefined && o.regex !== null) return { tag: "regex", val: String(o.regex) };
  if (o.choice !== undefined && o.choice !== null) return { tag: "choice", val: Array.from(o.choice, String) };
  return undefined;
}

const tokenLogprob = (t) => ({ token: t.token, text: t.text, logprob: t.logprob });

// The WIT `gen-params` of `Context.generate`'s options.
function paramsOf(opts) {
  const {
    maxTokens = 128,
    temperature = 0,
    topK = 0,
    topP = 1,
    minP = 0,
    seed = 0,
    stop = [],
    chat = false,
    logprobs = false,
    stream = false,
  } = opts;
  const sampling =
    temperature > 0
      ? { temperature: Number(temperature), topK: topK >>> 0, topP: Number(topP), minP: Number(minP), seed: BigInt(seed) }
      : undefined;
  return {
    maxTokens: maxTokens >>> 0,
    sampling,
    stop: typeof stop === "string" ? [stop] : Array.from(stop, String),
    grammar: grammarOf(opts),
    chat: Boolean(chat),
    logprobs: Boolean(logprobs),
    stream: Boolean(stream),
  };
}

/**
 * A sequence in the engine's paged KV cache, owned by this run.
 *
 * `new Context({ system, salt })` makes an empty one (with a system message, in a
 * tenant's salt). Its pages return to the pool when it is dropped (`ctx.drop()`,
 * the end of a `ctx.fork(fn)` callback, or the run's end).
 */
export class Context {
  constructor({ system, salt } = {}, raw) {
    this._raw = raw !== undefined ? raw : call(() => RawContext.create(system ?? undefined, salt ?? undefined));
  }

  get raw() {
    if (this._raw === null) throw new FolioError("invalid", "the context was dropped");
    return this._raw;
  }

  // Building the sequence.

  /** Appends text (tokenized; a BOS first when the context is empty). */
  append(text) {
    call(() => this.raw.appendText(str(text, "append")));
    return this;
  }

  appendTokens(tokens) {
    call(() => this.raw.appendTokens(Uint32Array.from(tokens)));
    return this;
  }

  /** Appends a system message (the model's chat template). */
  system(text) {
    call(() => this.raw.appendMessage("system", str(text, "system")));
    return this;
  }

  user(text) {
    call(() => this.raw.appendMessage("user", str(text, "user")));
    return this;
  }

  assistant(text) {
    call(() => this.raw.appendMessage("assistant", str(text, "assistant")));
    return this;
  }

  /** Computes every pending token now (their full pages become shareable). */
  flush() {
    call(() => this.raw.flush());
    return this;
  }

  /** A new context with the same tokens; committed pages are shared. Given a
   * function, runs it with the fork, drops the fork after and returns what the
   * function returned. */
  fork(fn) {
    const f = new Context({}, call(() => this.raw.fork()));
    if (fn === undefined) return f;
    try {
      return fn(f);
    } finally {
      f.drop();
    }
  }

  /** Drops the last `n` tokens. */
  truncate(n) {
    call(() => this.raw.truncate(n));
    return this;
  }

  tokens() {
    return Array.from(call(() => this.raw.tokens()));
  }

  /** `{seqLen, pageSize, committedPages, workingPages, pendingTokens, sparePages}`. */
  info() {
    const i = call(() => this.raw.info());
    return {
      seqLen: i.seqLen,
      pageSize: i.pageSize,
      committedPages: i.committedPages,
      workingPages: i.workingPages,
      pendingTokens: i.pendingTokens,
      sparePages: i.sparePages,
    };
  }

  /** Tokens held, computed or pending. */
  get length() {
    return call(() => this.raw.info()).seqLen;
  }

  // Generation.

  /**
   * Generates a continuation (greedy unless `temperature` > 0); its tokens stay in
   * the context. Options: `maxTokens` (128), `temperature` (0), `topK` (0), `topP`
   * (1), `minP` (0), `seed` (0), `stop` (a string or strings), at most one of
   * `jsonSchema` (an object or JSON text), `jsonObject`, `regex` and `choice`;
   * `chat`, `logprobs`, `stream` (send each piece to the caller as it comes).
   */
  generate(opts = {}) {
    return new Generation(call(() => this.raw.generate(paramsOf(opts))));
  }

  /** The assistant's reply in a chat (recorded as its message). */
  reply(opts = {}) {
    return this.generate({ ...opts, chat: true });
  }

  /** One forward pass: the `k` most likely next tokens as `{token, text,
   * logprob}`, best first. The context is unchanged. */
  nextLogprobs(k = 5) {
    return call(() => this.raw.nextLogprobs(k)).map(tokenLogprob);
  }

  /**
   * Appends `tokens` and computes them in one forward pass: `{tokens: [{logprob,
   * top}], next}`, each drafted token's log-probability given what precedes it with
   * the `k` (at most 20) likeliest tokens in its place (`top`, best first, as
   * `{token, text, logprob}`), and the `k` likeliest after the last (`next`). The
   * tokens stay in the context: truncate the ones you reject.
   */
  score(tokens, k = 1) {
    const s = call(() => this.raw.score(Uint32Array.from(tokens), k >>> 0));
    return {
      tokens: s.tokens.map((t) => ({ logprob: t.logprob, top: t.top.map(tokenLogprob) })),
      next: s.next.map(tokenLogprob),
    };
  }

  // Snapshots.

  /** Saves the context as the named snapshot (its pages pinned; the same store as
   * `POST /v1/contexts/{id}/save`). */
  save(name) {
    call(() => this.raw.save(str(name, "save")));
    return this;
  }

  /** A new context restored from the named snapshot. */
  static open(name) {
    return new Context({}, call(() => RawContext.open(str(name, "open"))));
  }

  // Raw page operations, for hand-written loops.

  /** Reserves `n` working pages ahead (later input does not wait on allocation). */
  reservePages(n) {
    call(() => this.raw.reservePages(n >>> 0));
    return this;
  }

  /** Commits the first `k` full working pages (shareable from then on). */
  commitPages(k) {
    call(() => this.raw.commitPages(k >>> 0));
    return this;
  }

  /** Releases `n` working pages from the tail (reserved spares first). */
  releasePages(n) {
    call(() => this.raw.releasePages(n >>> 0));
    return this;
  }

  /** Drops the last `n` tokens within the working pages (never a committed one). */
  truncateWorking(n) {
    call(() => this.raw.truncateWorking(n >>> 0));
    return this;
  }

  // Lifetime.

  /** Returns the context's pages now. */
  drop() {
    if (this._raw !== null) {
      this._raw[Symbol.dispose]();
      this._raw = null;
    }
  }

  [Symbol.dispose]() {
    this.drop();
  }
}

/** Sends a chunk to the caller: a string as text, anything else as JSON. */
export function emit(chunk) {
  if (typeof chunk === "string") call(() => host.emit(chunk));
  else call(() => host.emitJson(JSON.stringify(chunk)));
}

/** A line in the server's log. */
export function log(message) {
  host.log(String(message));
}

export function tokenize(text) {
  return Array.from(call(() => host.tokenize(str(text, "tokenize"))));
}

export function detokenize(tokens) {
  return call(() => host.detokenize(Uint32Array.from(tokens)));
}

/**
 * Generates on several contexts at once, batched by the engine (one weight read per
 * step for all, as a request's `n` samples). `jobs` is a list of `[context, opts]`
 * with `Context.generate`'s options; returns one `Generation` per job, in order (a
 * job that failed throws once all are done).
 */
export function generateAll(jobs) {
  const raw = rawGenerateAll(jobs.map(([c, o]) => [c.raw, paramsOf(o ?? {})]));
  return raw.map((r) => {
    if (r.tag === "err") throw new FolioError(r.val.kind, r.val.message);
    return new Generation(r.val);
  });
}

/** The tokens that end a generation (EOS and its kin). */
export function endTokens() {
  return Array.from(host.endTokens());
}

/** Microseconds since the run started. */
export function elapsedUs() {
  return Number(host.elapsedUs());
}
