#!/usr/bin/env python3
"""Makes crates/folio/tests/fixtures/llama_cpp.json: llama.cpp's view of the default model.

For each prompt: llama.cpp's prompt token ids, its 48-token greedy continuation, and its
top-5 log-probabilities at every position of prompt + continuation (teacher forcing).
folio's integration tests compare against this file; llama.cpp is never needed to run
them.

    pip install llama-cpp-python numpy      # builds llama.cpp from source
    python3 scripts/make_fixtures.py models/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 scripts/make_fixtures.py models/SmolLM2-135M-Instruct.Q4_1.gguf \
        crates/folio/tests/fixtures/llama_cpp_fa_off.json --no-flash-attn
    python3 scripts/make_fixtures.py models/gemma-3-270m-q4_k_m.gguf \
        crates/folio/tests/fixtures/llama_cpp_gemma3.json \
        --cases=short,code,non_ascii,chat_gemma --n-gen=24

--cases picks prompts by name (PROMPTS, then the ones only picked by name, OTHER_PROMPTS:
a chat in another model's template), --n-gen the length of the greedy continuation.

Which llama.cpp numbers: its generation path. Tokens are fed one per step (teacher
forcing over prompt + continuation), with flash attention on as in llama.cpp's own tools
(flash_attn_type=auto turns it on for the CPU backend) and one thread, so the attention
of every step runs in one KV chunk whatever the length. llama.cpp's batched prompt pass
is not used as the reference: for batches of 64+ tokens it switches to a tiled attention
whose logits differ from its own one-step logits, and with flash attention off its
batched logits differ from its one-step ones by ~0.045 nats on average.
"""
import hashlib
import json
import sys

from llama_cpp import Llama, __version__
from llama_teacher import teacher_forced

LONG = " ".join(
    [
        "The history of the printing press begins long before Gutenberg.",
        "In the eleventh century, the Chinese artisan Bi Sheng made movable type from",
        "baked clay, and later craftsmen in Korea cast type in bronze. In Europe, the",
        "demand for books grew with the universities, and scribes could not keep up.",
        "Around 1440, Johannes Gutenberg combined several known techniques: a screw",
        "press adapted from wine making, an oil-based ink that clung to metal, and a",
        "hand mould that could cast thousands of identical letters quickly. The result",
        "was a system that could print hundreds of pages a day. Within fifty years,",
        "printing shops had spread to more than two hundred cities, and millions of",
        "volumes were in circulation. Prices fell, literacy rose, and ideas travelled",
        "faster than ever before. Scholars could compare identical copies of a text,",
        "which made errors easier to find and correct. Religious reformers used",
        "pamphlets to reach ordinary people, and governments soon tried to control",
        "what could be printed. Newspapers appeared in the seventeenth century,",
        "followed by journals devoted to science, where researchers shared results",
        "and argued about them in public. The press also changed languages: printers",
        "chose one spelling among many, and their choices slowly became standards.",
        "Over the following centuries, steam power, rotary presses and mechanical",
        "typesetting made printing faster and cheaper still. The linotype machine,",
        "invented in the 1880s, let a single operator set a whole line of type at",
        "once. Photographic methods followed, and then computers, which replaced",
        "metal type with digital fonts. Today most text is read on screens, yet the",
        "basic ideas of the printing revolution remain: a text can be copied exactly,",
        "distributed widely, and read by anyone who has learned the letters. Some",
        "historians argue that the press was the most important invention of the",
        "second millennium, because it multiplied the effect of every other idea.",
        "Others point out that printing alone did not create modern science or",
        "democracy; it amplified the social changes that were already under way.",
        "Either way, the story shows how a technology can reshape the habits of a",
        "whole civilisation, often in ways that its inventors never imagined. When",
        "we think about the networks that carry our words today, it is worth",
        "remembering how much changed the last time copying became cheap. Libraries",
        "grew from dozens of manuscripts to thousands of printed books, and the idea",
        "of a personal library became possible for merchants and craftsmen, not only",
        "for monasteries and kings. Maps, tables and diagrams could be reproduced",
        "without the small errors that every copyist introduced, which mattered a",
        "great deal for navigation, astronomy and medicine. In short, the history of",
        "printing is a history of trust in copies, and of what people do with it.",
        "The same pattern returned with photography, with recorded sound and with",
        "radio: each new way of copying was first a curiosity, then a trade, and",
        "finally a part of daily life that nobody thought about. Teachers, clerks",
        "and engineers learned to rely on identical copies of manuals and forms,",
        "and whole professions grew up around editing, proofreading and binding.",
    ]
)

PROMPTS = {
    "short": "The capital of France is",
    "long": LONG,
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n",
    "digits": "Compute 12345 + 67890 = 80235, then 3.14159 * 2 = 6.28318; on 2026-11-25 we had 1,000,000 visits and 42 errors.",
    "non_ascii": "Café, naïve, résumé — Zürich straße. 日本語のテキストです。Ελληνικά κείμενα. Emoji: 🎉🚀 and ¿qué tal?",
    "json": '{ "name" :  "folio",\n\t"pages":[ 1 ,2,\n   3 ],   "nested" : {  "ok":true , "none": null }  }\n\n',
    "chat": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n",
    "whitespace": "I can't believe it's   not   butter!\n\n  They'll say we've done it.   \t Isn't it?\r\nYES'S  ",
    "rust": "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{:?}\", v);\n}\n// TODO:",
}

OTHER_PROMPTS = {
    "chat_gemma": "<start_of_turn>user\nWhat is the tallest mountain in the world?<end_of_turn>\n<start_of_turn>model\n",
}

N_GEN = 48
TOP = 5


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    flash = "--no-flash-attn" not in sys.argv
    n_gen = int(opts.get("n-gen", N_GEN))
    every = {**PROMPTS, **OTHER_PROMPTS}
    names = opts["cases"].split(",") if "cases" in opts else list(PROMPTS)
    path = args[0]
    out = args[1] if len(args) > 1 else "crates/folio/tests/fixtures/llama_cpp.json"
    llm = Llama(model_path=path, n_ctx=2048, n_batch=2048, logits_all=True,
                n_threads=1, n_threads_batch=1, verbose=False, seed=0, flash_attn=flash)
    cases = []
    for name in names:
        text = every[name]
        toks, gen, top, _ = teacher_forced(llm, text, n_gen, TOP)
        cases.append({"name": name, "text": text, "prompt_ids": toks,
                      "greedy_ids": gen, "top5": top})
        print(f"{name}: {len(toks)} prompt tokens, {len(gen)} generated", file=sys.stderr)
    doc = {
        "made_by": "python3 " + " ".join(sys.argv),
        "flash_attn": flash,
        "llama_cpp_python": __version__,
        "model_sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
        "note": "top5[i] = llama.cpp's 5 most likely next tokens after seq[..=i] as [id, logprob]; "
                "seq = prompt_ids + greedy_ids; fed one token per step.",
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
