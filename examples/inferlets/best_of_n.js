// Best-of-n with forks and a scoring pass, in JavaScript (the same program as
// best_of_n.py).
//
// The question is prefilled once; each candidate is a fork of that context (its
// committed pages shared, never recomputed) sampled with its own seed. A scoring
// pass then asks a judge context, forked per candidate, how likely "Yes" is as the
// next token (one forward pass: `nextLogprobs`), and adds the candidate's own mean
// token log-probability. Input: {"prompt": str, "n": int, "max_tokens": int}.

import { Context, emit } from "./folio.js";

// log P("Yes") that the answer is good, from one forward pass.
function judgeScore(judge, question, answer) {
  return judge.fork((j) => {
    j.user(`Question: ${question}\nAnswer: ${answer}\nIs this answer correct and helpful? Reply Yes or No.`);
    j.append("<|im_start|>assistant\n");
    const yes = j.nextLogprobs(20).find((t) => t.text.trim().toLowerCase() === "yes");
    return yes ? yes.logprob : -30.0;
  });
}

export function main(input) {
  const prompt = input.prompt;
  const n = input.n ?? 4;
  const maxTokens = input.max_tokens ?? 32;
  const base = new Context({ system: "You are a helpful assistant. Answer briefly." });
  base.user(prompt).flush();
  const judge = new Context({ system: "You grade answers." }).flush();
  let best = null;
  for (let i = 0; i < n; i++) {
    const g = base.fork((cand) => cand.reply({ maxTokens, temperature: 0.8, seed: 1000 + i, logprobs: true }));
    const mean = g.logprobs.reduce((a, b) => a + b, 0) / Math.max(1, g.logprobs.length);
    const yes = judgeScore(judge, prompt, g.text);
    const score = mean + yes;
    emit({ candidate: i, text: g.text, mean_logprob: mean, judge_yes_logprob: yes, score });
    if (best === null || score > best.score) best = { candidate: i, text: g.text, score };
  }
  return { best };
}
