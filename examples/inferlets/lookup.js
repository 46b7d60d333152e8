// Prompt-lookup speculative decoding (greedy), in JavaScript, with `score`: the
// draft is what followed the last earlier occurrence of the sequence's final `ngram`
// tokens (in the prompt or the text so far), up to `draft` tokens. One `score` pass
// appends the draft and checks every drafted position at once: the longest prefix
// whose tokens each equal the model's top-1 at their position is accepted, the rest
// truncated, and the model's own next token appended (the top-1 at the first
// mismatch, or after the last drafted token when all were accepted). With no draft
// the pass scores nothing and gives the next token. The output is exactly greedy
// decoding's, in fewer forward passes than tokens when drafts are accepted. Input:
// {"prompt": str, "max_tokens": int, "ngram": int, "draft": int}; output {text,
// tokens, drafted, accepted, passes, finish}.

import { Context, detokenize, endTokens } from "./folio.js";

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
  const size = Number.parseInt(input.draft ?? 8, 10);
  const ends = new Set(endTokens());
  const ctx = new Context();
  ctx.append(input.prompt);
  const seq = ctx.tokens();
  let out = [];
  let drafted = 0;
  let accepted = 0;
  let passes = 0;
  let finish = "length";
  while (out.length < maxTokens) {
    // Room for the draft and the model's own token after it.
    const draft = lookup(seq, ngram, Math.min(size, maxTokens - out.length - 1));
    const s = ctx.score(draft, 1);
    passes += 1;
    drafted += draft.length;
    let good = 0;
    while (good < draft.length && s.tokens[good].top[0].token === draft[good]) good++;
    if (good < draft.length) ctx.truncate(draft.length - good);
    // The model's own token after the accepted ones.
    const mine = good < draft.length ? s.tokens[good].top[0].token : s.next[0].token;
    accepted += good;
    const fresh = [...draft.slice(0, good), mine];
    const end = fresh.findIndex((t) => ends.has(t));
    if (end >= 0) {
      // The model's end: greedy decoding stops before it.
      if (end < good) ctx.truncate(good - end);
      out.push(...fresh.slice(0, end));
      finish = "eos";
      break;
    }
    ctx.appendTokens([mine]);
    seq.push(...fresh);
    out.push(...fresh);
  }
  out = out.slice(0, maxTokens);
  return { text: detokenize(out), tokens: out.length, drafted, accepted, passes, finish };
}
