// Plain generation through an inferlet, in JavaScript: the prompt, `max_tokens`
// greedy tokens, each piece streamed as it comes (the same program as
// generate.py). Input: {"prompt": str, "max_tokens": int, "stream": bool}.

import { Context } from "./folio.js";

export function main(input) {
  const ctx = new Context();
  ctx.append(input.prompt);
  const g = ctx.generate({ maxTokens: input.max_tokens ?? 64, stream: input.stream ?? true });
  return { tokens: g.tokens.length, finish: g.finish };
}
