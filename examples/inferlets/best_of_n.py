"""Best-of-n with forks and a scoring pass.

The question is prefilled once; each candidate is a fork of that context (its
committed pages shared, never recomputed) sampled with its own seed, all of them at
once (`generate_all`: the engine batches them, as a request's `n`). A scoring pass
then asks a judge context, forked per candidate, how likely "Yes" is as the next
token (one forward pass: `next_logprobs`), and adds the candidate's own mean token
log-probability. Input: {"prompt": str, "n": int, "max_tokens": int, "judge": bool}
(with "judge": false, candidates are ranked by their mean log-probability alone).
"""

import folio


def judge_score(judge, question, answer):
    """log P("Yes") that the answer is good, from one forward pass."""
    with judge.fork() as j:
        j.user(f"Question: {question}\nAnswer: {answer}\nIs this answer correct and helpful? Reply Yes or No.")
        j.append("<|im_start|>assistant\n")
        for _tok, text, lp in j.next_logprobs(20):
            if text.strip().lower() == "yes":
                return lp
    return -30.0


def main(input):
    prompt = input["prompt"]
    n = int(input.get("n", 4))
    max_tokens = int(input.get("max_tokens", 32))
    use_judge = bool(input.get("judge", True))
    base = folio.Context(system="You are a helpful assistant. Answer briefly.")
    base.user(prompt).flush()
    judge = folio.Context(system="You grade answers.").flush()
    forks = [base.fork() for _ in range(n)]
    gens = folio.generate_all(
        [
            (c, dict(chat=True, max_tokens=max_tokens, temperature=0.8, seed=1000 + i, logprobs=True))
            for i, c in enumerate(forks)
        ]
    )
    for c in forks:
        c.drop()
    best = None
    for i, g in enumerate(gens):
        mean = sum(g.logprobs) / max(1, len(g.logprobs))
        yes = judge_score(judge, prompt, g.text) if use_judge else 0.0
        score = mean + yes
        folio.emit({"candidate": i, "text": g.text, "mean_logprob": mean, "judge_yes_logprob": yes, "score": score})
        if best is None or score > best["score"]:
            best = {"candidate": i, "text": g.text, "score": score}
    return {"best": best}
