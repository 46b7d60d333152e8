// Beam search with forks, in JavaScript (the same program as beam.py): `width`
// beams, each a context; every step asks each beam for its `width` likeliest next
// tokens (one forward pass: `nextLogprobs`), keeps the `width` best extensions by
// total log-probability, and forks the chosen parents (committed pages shared) to
// append each new token. Each step's beams are emitted. Width 1 is greedy decoding.
// Input: {"prompt": str, "width": int, "max_tokens": int}.

import { Context, detokenize, emit } from "./folio.js";

export function main(input) {
  const width = Number.parseInt(input.width ?? 3, 10);
  const maxTokens = Number.parseInt(input.max_tokens ?? 8, 10);
  const root = new Context();
  root.append(input.prompt).flush();
  let beams = [{ score: 0.0, tokens: [], ctx: root }];
  for (let step = 0; step < maxTokens; step++) {
    const cands = [];
    beams.forEach((b, i) => {
      for (const t of b.ctx.nextLogprobs(width)) cands.push({ score: b.score + t.logprob, parent: i, token: t.token });
    });
    // A stable sort, best first (ties keep their order, as Python's sort does).
    cands.sort((x, y) => y.score - x.score);
    const next = cands.slice(0, width).map((c) => {
      const p = beams[c.parent];
      return { score: c.score, tokens: [...p.tokens, c.token], ctx: p.ctx.fork().appendTokens([c.token]) };
    });
    for (const b of beams) b.ctx.drop();
    beams = next;
    emit({ step: step + 1, scores: beams.map((b) => b.score) });
  }
  return { beams: beams.map((b) => ({ text: detokenize(b.tokens), tokens: b.tokens, score: b.score })) };
}
