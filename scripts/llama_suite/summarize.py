"""summary.md from the two JUnit files of scripts/llama_suite.sh.

usage: summarize.py OUT_DIR FILE... (reads OUT_DIR/{llama,folio}.xml, writes markdown
to stdout). Each folio failure gets a category, first rule that applies: OVERRIDES
(test-name regexes, reviewed by hand against both runs), (d) when the server did not
start, (c) when llama-server fails it too on this model, (b) when the test calls one of
llama.cpp's own routes, fields or metrics, else (a) (to review).
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

CATEGORIES = {
    "a": "(a) OpenAI/Anthropic surface gap",
    "b": "(b) llama.cpp's own API",
    "c": "(c) model-specific",
    "d": "(d) launcher/flag gap",
}
# llama.cpp's own routes (folio serves the OpenAI ones, /tokenize, /detokenize, /health,
# /metrics and the aliases /completions, /chat/completions, /models).
NATIVE = re.compile(r'"(/completion|/apply-template|/slots[^"]*|/props|/infill|/rerank|'
                    r'/reranking|/v1/rerank|/embedding|/embeddings|/lora-adapters|'
                    r'/v1/health|/chat/completion)"|llamacpp:|"n_probs"|"n_predict"|'
                    r'"id_slot"|"cache_prompt"|"return_tokens"|'
                    r'"timings_per_token"|"post_sampling_probs"|"return_progress"|'
                    r'"n_cmpl"|"n_indent"|"t_max_predict_ms"')
# Reviewed by hand: (test-name regex, category, reason). First match wins.
OVERRIDES = [
    (r"test_responses_stream_with_llama_telemetry", "b",
     "llama.cpp's timings in a Responses stream, on its /responses alias"),
    (r"test_embedding_(mixed_input|content_text_same_as_string)", "b",
     "llama.cpp's embedding inputs: token ids mixed with strings, {\"content\": parts}, "
     "{\"prompt_string\"}, \"\" (OpenAI's are a string, strings, ids or lists of ids)"),
    (r"test_embedding_pooling_none", "d",
     "--pooling none server-wide must make /v1/embeddings a 400; folio's pooling is per "
     "request (`pooling`), the launcher has nothing to map it to"),
    (r"test_anthropic_thinking_history_in_count_tokens", "d",
     "needs Qwen3's template (--chat-template-file), which renders reasoning_content; "
     "folio serves the model's own template (SmolLM2's ignores it), and has no such flag"),
    (r"test_metrics_embedding_prompt_is_counted", "b",
     "llama.cpp's Process-Start-Time-Unix header and llamacpp: prompt metrics"),
    (r"test_(chat_)?completion_with_openai_library$", "b",
     "system_fingerprint must start with \"b\" (llama.cpp's build number); folio sends "
     "OpenAI's fp_..."),
    (r"test_chat_completion_stream\[|test_logprobs_stream|test_chat_completion_with_timings"
     r"|test_tool_call\.py::.*STREAMED", "b",
     "first stream chunk: llama.cpp sends delta.content null (the suite asserts null or "
     "non-empty); folio sends \"\" as OpenAI does"),
    (r"test_chat_completions_token_count", "b", "POST /chat/completions/input_tokens"),
    (r"test_chat_template(_assistant_prefill|_continue_final_message_vllm_compat)?(\[|$)"
     r"|test_verbose_debug", "b", "`__verbose` (llama-server --verbose's debug object)"),
    (r"test_chat_template_continue_final_message_mutual_exclusion", "b",
     "continue_final_message with add_generation_prompt must be a 400 (vLLM's fields, "
     "ignored by folio)"),
    (r"test_completion_with_response_format\[response_format[01]-", "b",
     "a `schema` inside response_format json_object (llama.cpp's extension; OpenAI's "
     "json_object has none, folio ignores it)"),
    (r"test_completion_with_(invalid_)?grammar", "b", "llama.cpp's `grammar` (GBNF) field"),
    (r"test_context_size_exceeded", "b",
     "error type exceed_context_size_error with n_prompt_tokens/n_ctx (llama.cpp); folio "
     "answers OpenAI's invalid_request_error, code context_length_exceeded"),
    (r"test_metrics_disabled", "b", "/metrics must be 501 without --metrics; folio always serves it"),
    (r"test_anthropic_empty_messages", "b",
     "llama.cpp accepts empty messages; folio answers 400 as Anthropic's API does"),
    (r"test_anthropic_(tool_result_with_image|vision_format_accepted)", "b",
     "expects llama-server's 500 for an image without a projector; folio answers 400 "
     "(image blocks unsupported)"),
    (r"test_anthropic_vision_base64_with_multimodal_model", "c",
     "downloads a vision model itself (no network here)"),
    (r"test_access_static_assets", "b", "llama.cpp's web UI files (/sw.js, manifest)"),
    (r"test_correct_api_key", "b",
     "/completions is llama.cpp's native route (`content`); folio serves OpenAI's completions there"),
    (r"test_cors_proxy", "b", "/cors-proxy (llama.cpp web UI's MCP proxy)"),
    (r"test_cors_options", "b", "llama.cpp's CORS answer (reflected origin, credentials, methods, headers)"),
    (r"test_cors_origins_localhost_reflects|test_cors_origins_defaults_to_localhost", "d",
     "--cors-origins localhost means any localhost port in llama.cpp; folio's --cors-origin "
     "matches whole origins (and has no --tools default)"),
    (r"test_local_media_file", "c", "needs a vision model (tinygemma3 + projector)"),
    (r"test_tokenize_with_pieces", "b",
     "/tokenize with_pieces: llama.cpp answers tokens as [{id, piece}]"),
    (r"test_invalid_chat_completion_req\[messages7\]", "b",
     "two assistant messages in a row must be refused (llama.cpp's prefill rule); OpenAI "
     "and folio accept them"),
    (r"test_no_ui", "d", "folio has no flag to turn its web page off (--no-ui)"),
    (r"test_server_multiple_addresses", "d", "--host A,B: folio listens on one address"),
    (r"test_server_model_aliases_and_tags", "b", "/models `aliases` and `tags` (--alias A,B --tags)"),
]


def load(path):
    results = {}
    if not os.path.exists(path):
        return results
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "")
        name = case.get("name", "")
        module = cls.split(".")[-1] if cls else "?"
        key = f"{module}.py::{name}"
        failure = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            outcome, node = "failed", failure
        elif error is not None:
            outcome, node = "error", error
        elif skipped is not None:
            outcome, node = "skipped", skipped
        else:
            outcome, node = "passed", None
        message = (node.get("message") or "") if node is not None else ""
        text = (node.text or "") if node is not None else ""
        results[key] = (outcome, message, text)
    return results


def one_line(message, text):
    line = message.strip().splitlines()[0] if message.strip() else ""
    if not line:
        errs = [l for l in text.splitlines() if l.startswith("E ")]
        line = errs[0][1:].strip() if errs else ""
    src = [l[1:].strip() for l in text.splitlines() if l.startswith(">")]
    if src and len(line) < 40:  # "assert False": name the failing line
        line = f"{src[-1]} → {line}"
    line = re.sub(r"\s+", " ", line)
    return line[:160]


def categorize(key, llama_result, message, text):
    outcome_llama = llama_result[0]
    for pattern, cat, reason in OVERRIDES:
        if re.search(pattern, key):
            return cat, reason
    brief = one_line(message, text)
    if "Server process died" in text or "did not start" in text:
        return "d", f"server did not start: {brief}"
    m = NATIVE.search(text)
    if outcome_llama in ("failed", "error"):
        theirs = one_line(llama_result[1], llama_result[2])
        ours = f"uses {m.group(0)}" if m else brief
        return "c", f"llama-server fails it too ({theirs}); folio: {ours}"
    if m:
        return "b", f"uses {m.group(0)}: {brief}"
    return "a", brief


def main():
    out, files = sys.argv[1], sys.argv[2:]
    llama = load(os.path.join(out, "llama.xml"))
    folio = load(os.path.join(out, "folio.xml"))
    kinds = ("passed", "failed", "skipped", "error")

    def count(results, module):
        c = dict.fromkeys(kinds, 0)
        for key, (outcome, _, _) in results.items():
            if module is None or key.startswith(module + "::"):
                c[outcome] += 1
        return c

    print("# llama.cpp's server tests: llama-server vs folio\n")
    print(f"Model: `{os.environ.get('FOLIO_SUITE_MODEL', '?')}` for both servers. "
          "Tests marked slow deselected. Cells: passed / failed / skipped / errors.\n")
    print("| file | tests | llama-server | folio |")
    print("|---|---:|---|---|")
    fmt = lambda c: " / ".join(str(c[k]) for k in kinds)
    modules = [f for f in files]
    for module in modules:
        cl, cf = count(llama, module), count(folio, module)
        n = max(sum(cl.values()), sum(cf.values()))
        print(f"| {module} | {n} | {fmt(cl)} | {fmt(cf)} |")
    cl, cf = count(llama, None), count(folio, None)
    print(f"| **total** | {max(sum(cl.values()), sum(cf.values()))} | **{fmt(cl)}** | "
          f"**{fmt(cf)}** |\n")

    unit = os.path.join(out, "tests", "unit")
    if os.path.isdir(unit):
        rest = sorted(f for f in os.listdir(unit)
                      if f.startswith("test_") and f.endswith(".py") and f not in files)
        print("Not run (other models, llama-server's router/MCP/slots/sleep modes; "
              "reasons in scripts/llama_suite.sh): " + ", ".join(rest) + ".\n")

    both = sum(1 for k, v in folio.items() if v[0] == "passed"
               and llama.get(k, ("",))[0] == "passed")
    only_llama = sorted(k for k, v in llama.items() if v[0] == "passed"
                        and folio.get(k, ("",))[0] != "passed")
    only_folio = sorted(k for k, v in folio.items() if v[0] == "passed"
                        and llama.get(k, ("",))[0] != "passed")
    print(f"Passed on both: {both}; only on llama-server: {len(only_llama)}; "
          f"only on folio: {len(only_folio)}.\n")

    rows = []
    for key, (outcome, message, text) in sorted(folio.items()):
        if outcome not in ("failed", "error"):
            continue
        cat, reason = categorize(key, llama.get(key, ("not run", "", "")), message, text)
        rows.append((cat, key, llama.get(key, ("not run",))[0], reason))
    by_cat = {c: sum(1 for r in rows if r[0] == c) for c in CATEGORIES}
    print("## folio's failures by category\n")
    for c, title in CATEGORIES.items():
        print(f"- {title}: {by_cat[c]}")
    print()
    for c, title in CATEGORIES.items():
        sel = [r for r in rows if r[0] == c]
        if not sel:
            continue
        print(f"### {title}\n")
        print("| test | llama-server | reason |")
        print("|---|---|---|")
        for _, key, lo, reason in sel:
            reason = reason.replace("|", "\\|")
            print(f"| `{key}` | {lo} | {reason} |")
        print()
    if only_folio:
        print("## Passed on folio, not on llama-server\n")
        for k in only_folio:
            print(f"- `{k}` (llama-server: {llama.get(k, ('not run',))[0]})")


if __name__ == "__main__":
    main()
