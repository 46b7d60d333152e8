// Snapshots and the raw page calls, in JavaScript: a prefilled context is saved
// under a name, dropped, and opened again; the opened one holds the same tokens and
// continues exactly as the original would have (greedy). The raw page calls then
// run on it, each reported with the context's info before and after. The caller
// deletes the snapshot (`DELETE /v1/snapshots/{name}`). Input: {"prompt": str,
// "name": str, "max_tokens": int}.

import { Context } from "./folio.js";

export function main(input) {
  const maxTokens = Number.parseInt(input.max_tokens ?? 16, 10);
  const ctx = new Context().append(input.prompt).flush();
  ctx.save(input.name);
  const saved = ctx.tokens();
  const original = ctx.fork((f) => f.generate({ maxTokens }).text);
  ctx.drop();
  const back = Context.open(input.name);
  const sameTokens = JSON.stringify(back.tokens()) === JSON.stringify(saved);
  const restored = back.fork((f) => f.generate({ maxTokens }).text);
  // The raw page calls, each with the info around it.
  const ops = [];
  const op = (name, f) => {
    const before = back.info();
    let error = null;
    try {
      f();
    } catch (e) {
      error = e.message;
    }
    ops.push({ op: name, before, after: back.info(), error });
  };
  // Past the saved pages: the last page is a working one holding a token or more.
  back.generate({ maxTokens });
  back.flush();
  op("reservePages(2)", () => back.reservePages(2));
  op("releasePages(2)", () => back.releasePages(2));
  op("truncateWorking(1)", () => back.truncateWorking(1));
  op("commitPages(1)", () => back.commitPages(1));
  return { same_tokens: sameTokens, original, restored, ops };
}
