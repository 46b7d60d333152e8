// An inferlet as an OpenAI model, in JavaScript (the same program as chat.py):
// `"model": "inferlet:chat_js"` on /v1/chat/completions runs it with the request as
// its input. It replays the messages into a context and streams a greedy reply, then
// a second, shorter "check" pass over its own answer in a fork (the kind of step a
// client would otherwise need a second request and a second prefill for) that it
// reports only in the server log.

import { Context, log } from "./folio.js";

const ROLES = { system: "system", user: "user", assistant: "assistant" };

export function main(input) {
  const ctx = new Context();
  for (const m of input.messages) {
    const role = ROLES[m.role] ?? "user";
    let content = m.content ?? "";
    if (Array.isArray(content)) {
      content = content.map((p) => (p !== null && typeof p === "object" ? p.text ?? "" : "")).join("");
    }
    ctx[role](content);
  }
  const limit = Number.parseInt(input.max_tokens || 64, 10);
  ctx.reply({ maxTokens: limit, stream: true });
  ctx.fork((check) => {
    check.user("Was that answer complete? Reply Yes or No.");
    const verdict = check.reply({ maxTokens: 2, choice: ["Yes", "No"] });
    log(`self-check: ${verdict.text}`);
  });
  return null;
}
