// An agent loop whose tools run inside the program, in JavaScript (the same program
// as agent.py).
//
// The model is asked to sum a list of numbers using a calculator, one call per step;
// each call is generated under a regex grammar (so it always parses), run by the
// calculator here in the guest, and its result appended to the same context: no
// round trip to a client between steps and no re-prefill (each turn appends only the
// new tokens). A lookup table tool gives the numbers' names. Input:
// {"items": ["apples", ...], "max_steps": int}.

import { Context, emit } from "./folio.js";

// The lookup tool's table.
const PRICES = { apples: 3, pears: 5, plums: 7, figs: 11, kiwis: 13, limes: 17 };

// Evaluates `a OP b` with integers (no eval: a tiny parser).
function calculator(expr) {
  const parts = expr.trim().split(/\s+/);
  if (parts.length !== 3) throw new RangeError(`not a OP b: ${expr}`);
  const [a, op, b] = [Number.parseInt(parts[0], 10), parts[1], Number.parseInt(parts[2], 10)];
  if (op === "+") return a + b;
  if (op === "-") return a - b;
  if (op === "*") return a * b;
  throw new RangeError(`unknown operator ${op}`);
}

function lookup(name) {
  return PRICES[name.trim()] ?? 0;
}

export function main(input) {
  const items = input.items ?? ["apples", "pears", "plums", "figs", "kiwis"];
  const maxSteps = Number.parseInt(input.max_steps ?? 8, 10);
  const ctx = new Context({ system: "You are a careful accountant. Use the calculator for every addition." });
  ctx.user(`Add up the prices of: ${items.join(", ")}. Use calc(a + b), one addition per step.`);
  let total = lookup(items[0]);
  ctx.assistant(`lookup(${items[0]}) = ${total}`);
  const steps = [];
  for (const item of items.slice(1, maxSteps + 1)) {
    const price = lookup(item);
    ctx.user(`lookup(${item}) = ${price}. Next step.`);
    // The model writes the call; the grammar keeps it a well-formed addition.
    const g = ctx.reply({ maxTokens: 16, regex: String.raw`calc\([0-9]{1,5} \+ [0-9]{1,5}\)` });
    const expr = g.text.slice("calc(".length, -1);
    let got;
    try {
      got = calculator(expr);
    } catch (e) {
      got = e.message;
    }
    ctx.user(`calc(${expr}) = ${got}`);
    total += price;
    steps.push({ item, call: g.text, result: got });
    emit({ step: steps.length, call: g.text, result: got, context_tokens: ctx.length });
  }
  ctx.user("What is the total?");
  const answer = ctx.reply({ maxTokens: 24, regex: String.raw`The total is [0-9]{1,6}\.` });
  return { steps: steps.length, answer: answer.text, true_total: total, context_tokens: ctx.length };
}
