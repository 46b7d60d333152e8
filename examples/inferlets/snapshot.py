"""A long system prompt computed once, saved as a snapshot and reused: the first
run builds the context and saves it under `name`; later runs (on this replica, or
another sharing its snapshot directory) open it instead. Each question is answered
in a fork of it (plain text turns), with pages reserved ahead for the answer.
Input: {"name": str, "system": str, "questions": [str], "max_tokens": int}.
With {"raw": true} instead, it walks the raw page operations and reports the page
counts after each.
"""

import folio


def raw_pages():
    ctx = folio.Context()
    ctx.append("one two three four five six seven eight nine ten " * 4).flush()
    steps = [("flushed", ctx.info())]
    ctx.reserve_pages(2)
    steps.append(("reserved 2", ctx.info()))
    ctx.release_pages(2)
    steps.append(("released 2", ctx.info()))
    try:
        # The working page is partial (flush committed the full ones).
        ctx.commit_pages(1)
        refused = None
    except folio.FolioError as e:
        refused = e.kind
    ctx.truncate_working(1)
    steps.append(("truncated 1", ctx.info()))
    return {"steps": [{"step": s, **i} for s, i in steps], "commit_partial": refused}


def main(input):
    if input.get("raw"):
        return raw_pages()
    name = input["name"]
    try:
        base = folio.Context.open(name)
        opened = True
    except folio.FolioError as e:
        if e.kind != "not-found":
            raise
        base = folio.Context().append(input["system"] + "\n").flush()
        base.save(name)
        opened = False
    answers = []
    for q in input["questions"]:
        # Plain text turns: a snapshot keeps tokens, not the chat helpers' record.
        c = base.fork()
        c.reserve_pages(2)
        c.append(f"Q: {q}\nA:")
        g = c.generate(max_tokens=int(input.get("max_tokens", 16)), stop="\n")
        answers.append(g.text)
        c.drop()
    return {"opened": opened, "answers": answers, "base_len": len(base)}
