"""Beam search with forks: `width` beams, each a context; every step asks each beam
for its `width` likeliest next tokens (one forward pass: `next_logprobs`), keeps the
`width` best extensions by total log-probability, and forks the chosen parents
(committed pages shared) to append each new token. Each step's beams are emitted.
Width 1 is greedy decoding. Input: {"prompt": str, "width": int, "max_tokens": int}.
"""

import folio


def main(input):
    width = int(input.get("width", 3))
    max_tokens = int(input.get("max_tokens", 8))
    root = folio.Context()
    root.append(input["prompt"]).flush()
    # (total log-probability, tokens, context)
    beams = [(0.0, [], root)]
    for step in range(max_tokens):
        cands = []
        for i, (score, _toks, ctx) in enumerate(beams):
            for tok, _text, lp in ctx.next_logprobs(width):
                cands.append((score + lp, i, tok))
        cands.sort(key=lambda c: -c[0])
        new = []
        for score, i, tok in cands[:width]:
            _, toks, parent = beams[i]
            child = parent.fork().append_tokens([tok])
            new.append((score, toks + [tok], child))
        for _, _, ctx in beams:
            ctx.drop()
        beams = new
        folio.emit({"step": step + 1, "scores": [s for s, _, _ in beams]})
    out = [{"text": folio.detokenize(t), "tokens": t, "score": s} for s, t, _ in beams]
    return {"beams": out}
