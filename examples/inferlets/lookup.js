// Prompt-lookup speculative decoding (greedy), in JavaScript, with `score`: the
// draft is what followed the last earlier occurrence of the sequence's final `ngram`
// tokens (in the prompt or the text so far), up to `draft` tokens. One `score` pass
// appends the draft and checks every drafted position at once: the longest prefix
// whose tokens each equal the model's top-1 at their position is accepted, the rest
// truncated, and the model's own next token appended (the top-1 at the first
// mismatch, or after the last drafted token when all were accepted). With no draft,
// one plain greedy step. The output is exactly greedy decoding's, in fewer forward
// passes than tokens when drafts are accepted. Input: {"prompt": str, "max_tokens":
// int, "ngram": int, "draft": int, "salt": str (optional)}; output {text, tokens,
// drafted, accepted, passes, finish}.

import { Context, detokenize, log } from "./folio.js";

// The tokens after the last earlier occurrence of seq's final `ngram` tokens.
function lookup(seq, ngram, size) {
  if (seq.length <= ngram) return [];
  const tail = seq.length - ngram;
  for (let start = tail - 1; start >= 0; start--) {
    let same = true;
    for (let i = 0; i < ngram && same; i++) same = seq[start + i] === seq[tail + i];
    if (same) return seq.slice(start + ngram, start + ngram + size);
  }
  return [];
}

export function main(input) {
  const maxTokens = Number.parseInt(input.max_tokens ?? 32, 10);
  const ngram = Number.parseInt(input.ngram ?? 3, 10);
  const size = Number.parseInt(input.draft ?? 4, 10);
  // A salt of the run's own: the scored tokens must be computed in the pass, not
  // found in the prefix cache (a page another request computed gives no scores).
  const salt = input.salt ?? `lookup-${Array.from(crypto.getRandomValues(new Uint32Array(4))).join("-")}`;
  const ctx = new Context({ salt });
  ctx.append(input.prompt);
  const seq = ctx.tokens();
  const out = [];
  let drafted = 0;
  let accepted = 0;
  let passes = 0;
  let finish = "length";
  const take = (tok) => {
    seq.push(tok);
    out.push(tok);
  };
  // One plain greedy step (the host decides end of sequence).
  const step = () => {
    passes += 1;
    const g = ctx.generate({ maxTokens: 1 });
    if (g.finish === "eos" || g.tokens.length === 0) return false;
    take(g.tokens[0]);
    return true;
  };
  while (out.length < maxTokens && finish === "length") {
    const draft = lookup(seq, ngram, Math.min(size, maxTokens - out.length));
    if (draft.length === 0) {
      if (!step()) finish = "eos";
      continue;
    }
    passes += 1;
    const s = ctx.score(draft, 1);
    if (s.tokens.length !== draft.length) {
      // Not every drafted position was scored: check none, take a greedy step.
      log(`lookup: ${s.tokens.length} of ${draft.length} drafted tokens scored`);
      ctx.truncate(draft.length);
      if (!step()) finish = "eos";
      continue;
    }
    drafted += draft.length;
    let n = 0;
    while (n < draft.length && s.tokens[n].top[0].token === draft[n]) n++;
    accepted += n;
    if (n < draft.length) ctx.truncate(draft.length - n);
    for (const t of draft.slice(0, n)) take(t);
    if (out.length >= maxTokens) break;
    // The model's own token after the accepted prefix.
    const own = n < draft.length ? s.tokens[n].top[0] : s.next[0];
    if (own.text === "") {
      // A control token (an end of sequence, perhaps): let a greedy step decide.
      if (!step()) finish = "eos";
      continue;
    }
    ctx.appendTokens([own.token]);
    take(own.token);
  }
  return { text: detokenize(out), tokens: out.length, drafted, accepted, passes, finish };
}
