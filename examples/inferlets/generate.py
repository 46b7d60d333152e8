"""Plain generation through an inferlet (the figure against /v1/completions): the
prompt, `max_tokens` greedy tokens, each piece streamed as it comes. Input:
{"prompt": str, "max_tokens": int, "ignore_eos": bool}."""

import folio


def main(input):
    ctx = folio.Context()
    ctx.append(input["prompt"])
    g = ctx.generate(max_tokens=int(input.get("max_tokens", 64)), stream=bool(input.get("stream", True)))
    return {"tokens": len(g.tokens), "finish": g.finish}
