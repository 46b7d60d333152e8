// Attacks on the host from a JavaScript guest (the JavaScript side of hostile.py),
// one per input {"attack": name}; each must end the run with an error (never take
// the server down, never leak a page). "pages" scores batches of tokens in forks
// until the run's page quota refuses them.

import { Context } from "./folio.js";

export function main(input) {
  const attack = input.attack;
  // Every attack holds a computed context first: its pages must come back.
  const held = new Context({ system: "You are a target." });
  held.user("Hold these pages. ".repeat(20)).flush();
  if (attack === "throw") {
    throw new RangeError("thrown on purpose");
  }
  if (attack === "spin") {
    for (;;) {
      // Nothing: only the epoch deadline ends this.
    }
  }
  if (attack === "alloc") {
    const hog = [];
    for (;;) hog.push(new Uint8Array(16 << 20).fill(1));
  }
  if (attack === "dropped") {
    const ctx = new Context();
    const handle = ctx.raw;
    ctx.drop();
    handle.flush();
    return "unreachable";
  }
  if (attack === "dropped_sdk") {
    // Through the SDK: its own check, a FolioError.
    const ctx = new Context();
    ctx.drop();
    ctx.append("after the drop");
    return "unreachable";
  }
  if (attack === "pages") {
    // Two forks grow by 64 scored tokens a pass, each pass's tokens its own (one
    // appended first, so the pass computes the row that scores the first).
    const toks = held.tokens();
    const forks = [held.fork(), held.fork()];
    for (let i = 0; ; i++) {
      const batch = Array.from({ length: 64 }, (_, j) => toks[(i * 64 + j * 7) % toks.length]);
      forks[i % 2].appendTokens([toks[i % toks.length]]).score(batch, 1);
    }
  }
  throw new Error(`unknown attack ${attack}`);
}
