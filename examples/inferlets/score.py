"""Scores a text under the model: after `prompt`, each token of `text` with its
log-probability and the model's top choice in its place, in one forward pass, and
the text's perplexity. Input: {"prompt": str, "text": str}.
"""

import math

import folio


def main(input):
    ctx = folio.Context()
    ctx.append(input["prompt"])
    tokens = folio.tokenize(input["text"])
    scored, nxt = ctx.score(tokens, 1)
    total = sum(lp for lp, _ in scored)
    return {
        "tokens": tokens,
        "logprobs": [lp for lp, _ in scored],
        "top": [top[0][0] for _, top in scored],
        "next": nxt[0][0],
        "perplexity": math.exp(-total / max(len(tokens), 1)),
        "len": len(ctx),
    }
