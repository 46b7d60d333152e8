"""An agent loop whose tools run inside the program.

The model is asked to sum a list of numbers using a calculator, one call per step;
each call is generated under a regex grammar (so it always parses), run by the
calculator here in the guest, and its result appended to the same context: no
round trip to a client between steps and no re-prefill (each turn appends only the
new tokens). A lookup table tool gives the numbers' names. Input:
{"items": ["apples", ...], "max_steps": int}.
"""

import folio

# The lookup tool's table.
PRICES = {"apples": 3, "pears": 5, "plums": 7, "figs": 11, "kiwis": 13, "limes": 17}


def calculator(expr):
    """Evaluates `a OP b` with integers (no eval: a tiny parser)."""
    a, op, b = expr.split()
    a, b = int(a), int(b)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op}")


def lookup(name):
    return PRICES.get(name.strip(), 0)


def main(input):
    items = input.get("items", ["apples", "pears", "plums", "figs", "kiwis"])
    max_steps = int(input.get("max_steps", 8))
    ctx = folio.Context(system="You are a careful accountant. Use the calculator for every addition.")
    ctx.user("Add up the prices of: " + ", ".join(items) + ". Use calc(a + b), one addition per step.")
    total = lookup(items[0])
    ctx.assistant(f"lookup({items[0]}) = {total}")
    steps = []
    for item in items[1:max_steps + 1]:
        price = lookup(item)
        ctx.user(f"lookup({item}) = {price}. Next step.")
        # The model writes the call; the grammar keeps it a well-formed addition.
        g = ctx.reply(max_tokens=16, regex=r"calc\([0-9]{1,5} \+ [0-9]{1,5}\)")
        expr = g.text[len("calc("):-1]
        try:
            got = calculator(expr)
        except ValueError as e:
            got = str(e)
        ctx.user(f"calc({expr}) = {got}")
        total = total + price
        steps.append({"item": item, "call": g.text, "result": got})
        folio.emit({"step": len(steps), "call": g.text, "result": got, "context_tokens": len(ctx)})
    ctx.user("What is the total?")
    answer = ctx.reply(max_tokens=24, regex=r"The total is [0-9]{1,6}\.")
    return {"steps": len(steps), "answer": answer.text, "true_total": total, "context_tokens": len(ctx)}
