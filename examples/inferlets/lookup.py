"""Prompt-lookup speculative decoding (greedy): the draft is what followed the last
earlier occurrence of the sequence's final `ngram` tokens (in the prompt or the
text so far), up to `draft` tokens; each drafted token is checked against the
model's greedy choice and accepted while they agree; the first disagreement is
replaced by the model's own token. The output is exactly greedy decoding's.

The interface's forward pass (`next_logprobs`) scores one position, so each drafted
token is verified by its own one-token pass: this shows the scheme and measures how
many tokens the lookup would have saved (`accepted`), but is not faster than plain
generation until the interface gains a pass that scores every drafted position at
once. Input: {"prompt": str, "max_tokens": int, "ngram": int, "draft": int}.
"""

import folio


def lookup(seq, ngram, size):
    """The tokens after the last earlier occurrence of seq's final `ngram` tokens."""
    if len(seq) <= ngram:
        return []
    tail = seq[-ngram:]
    for start in range(len(seq) - ngram - 1, -1, -1):
        if seq[start : start + ngram] == tail:
            return seq[start + ngram : start + ngram + size]
    return []


def main(input):
    max_tokens = int(input.get("max_tokens", 32))
    ngram = int(input.get("ngram", 3))
    size = int(input.get("draft", 4))
    ctx = folio.Context()
    ctx.append(input["prompt"])
    seq = ctx.tokens()
    out = []
    drafted = accepted = 0
    finish = "length"
    while len(out) < max_tokens and finish == "length":
        draft = lookup(seq, ngram, min(size, max_tokens - len(out))) or [None]
        for d in draft:
            # The model's greedy next token (its pass computes what is pending).
            g = ctx.generate(max_tokens=1)
            if g.finish == "eos" or not g.tokens:
                finish = "eos"
                break
            tok = g.tokens[0]
            seq.append(tok)
            out.append(tok)
            if d is None:
                break
            drafted += 1
            if tok != d or len(out) >= max_tokens:
                accepted += tok == d
                break
            accepted += 1
    text = folio.detokenize(out)
    return {"text": text, "tokens": len(out), "drafted": drafted, "accepted": accepted, "finish": finish}
