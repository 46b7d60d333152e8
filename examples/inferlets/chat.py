"""An inferlet as an OpenAI model: `"model": "inferlet:chat"` on
/v1/chat/completions runs it with the request as its input. This one replays the
messages into a context and streams a greedy reply, then a second, shorter "check"
pass over its own answer in a fork (the kind of step a client would otherwise need a
second request and a second prefill for) that it reports only in the server log."""

import folio

ROLES = {"system": "system", "user": "user", "assistant": "assistant"}


def main(input):
    msgs = input["messages"]
    ctx = folio.Context()
    for m in msgs:
        role = ROLES.get(m.get("role"), "user")
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        getattr(ctx, role)(content)
    limit = int(input.get("max_tokens") or 64)
    reply = ctx.reply(max_tokens=limit, stream=True)
    with ctx.fork() as check:
        check.user("Was that answer complete? Reply Yes or No.")
        verdict = check.reply(max_tokens=2, choice=["Yes", "No"])
        folio.log(f"self-check: {verdict.text}")
    return None
