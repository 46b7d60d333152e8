"""llama.cpp's view of a prompt, as every fixture script records it (imported by
make_fixtures.py, make_format_fixtures.py and make_arch_fixtures.py).

Tokens are fed one per step (llama.cpp's generation path): the prompt, then a greedy
continuation; the top-k log-probabilities of every step are read back (teacher
forcing over prompt + continuation).
"""
import numpy as np


def log_softmax(row):
    row = row.astype(np.float64)
    m = row.max()
    return row - (m + np.log(np.exp(row - m).sum()))


def teacher_forced(llm, text, n_gen, top, add_bos=True, stop_at_eos=True, digits=5):
    """(prompt ids, greedy ids, top-k [id, logprob] per step, top-1 gap per step)."""
    toks = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
    llm.reset()
    for t in toks:
        llm.eval([t])
    eos = llm.token_eos()
    gen = []
    for _ in range(n_gen):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(nxt)
        if stop_at_eos and nxt == eos:
            break
        llm.eval([nxt])
    tops, gaps = [], []
    for i in range(len(toks) + len(gen) - 1):
        lp = log_softmax(llm.scores[i])
        idx = np.argsort(-lp)[:top]
        tops.append([[int(j), round(float(lp[j]), digits)] for j in idx])
        gaps.append(float(lp[idx[0]] - lp[idx[1]]))
    return toks, gen, tops, gaps
