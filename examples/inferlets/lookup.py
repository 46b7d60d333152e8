"""Prompt-lookup speculative decoding (greedy): the draft is what followed the last
earlier occurrence of the sequence's final `ngram` tokens (in the prompt or the
text so far), up to `draft` tokens. One `score` pass checks every drafted position
at once: the drafted tokens are accepted while each is the model's greedy choice in
its place; the rest are truncated, and the model's own token at the first mismatch
(or after the last accepted one) is appended. The output is exactly greedy
decoding's, in fewer forward passes than tokens when the text repeats itself.
Input: {"prompt": str, "max_tokens": int, "ngram": int, "draft": int}.
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
    size = int(input.get("draft", 8))
    ends = set(folio.end_tokens())
    ctx = folio.Context()
    ctx.append(input["prompt"])
    seq = ctx.tokens()
    out = []
    drafted = accepted = passes = 0
    finish = "length"
    while len(out) < max_tokens:
        # Room for the draft and the model's own token after it.
        draft = lookup(seq, ngram, min(size, max_tokens - len(out) - 1))
        scored, nxt = ctx.score(draft, 1)
        passes += 1
        drafted += len(draft)
        good = 0
        while good < len(draft) and scored[good][1][0][0] == draft[good]:
            good += 1
        if good < len(draft):
            ctx.truncate(len(draft) - good)
        # The model's own token after the accepted ones.
        mine = scored[good][1][0][0] if good < len(draft) else nxt[0][0]
        accepted += good
        new = draft[:good] + [mine]
        end = next((i for i, t in enumerate(new) if t in ends), None)
        if end is not None:
            # The model's end: greedy decoding stops before it.
            if end < good:
                ctx.truncate(good - end)
            out.extend(new[:end])
            finish = "eos"
            break
        ctx.append_tokens([mine])
        seq.extend(new)
        out.extend(new)
    out = out[:max_tokens]
    text = folio.detokenize(out)
    return {
        "text": text,
        "tokens": len(out),
        "drafted": drafted,
        "accepted": accepted,
        "passes": passes,
        "finish": finish,
    }
