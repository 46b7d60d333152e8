#!/usr/bin/env python3
"""Plots and docs/BENCHMARKS.md from the JSON record of `folio bench --all --json`.

    python3 scripts/bench_plots.py docs/bench/latest.json docs/bench docs/BENCHMARKS.md

Needs matplotlib (scripts/bench.sh makes a venv with it). Writes, in the plot folder:
throughput.svg (aggregate decode vs batch size, serving output tok/s vs clients),
ttft.svg (the TTFT of every request at each load), ttft_cold_warm.svg and
kv_memory.svg (sequences per GiB of KV, KV bytes per sequence); then the markdown
page with the machine, the command and every table with its ratios.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FOLIO, LLAMA = "#1f6feb", "#d97706"


def med(fig):
    return None if fig is None else fig["median"]


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}x"


def num(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def throughput(rec, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if "batch" in rec:
        sizes = rec["batch"]["sizes"]
        xs = [s["batch"] for s in sizes]
        axes[0].plot(xs, [med(s["folio"]) for s in sizes], "o-", color=FOLIO, label="folio")
        ll = [med(s["llama"]) for s in sizes]
        if any(v is not None for v in ll):
            axes[0].plot(xs, ll, "s--", color=LLAMA, label="llama.cpp (llama-batched-bench)")
        axes[0].set_xscale("log", base=2)
        axes[0].set_xticks(xs, [str(x) for x in xs])
        axes[0].set_xlabel("sequences decoding together")
        axes[0].set_ylabel("aggregate decode tok/s")
        axes[0].set_title("Batched decode (in process)")
        axes[0].legend()
        axes[0].grid(alpha=0.3)
    if "serve" in rec:
        for server, color in (("folio", FOLIO), ("llama.cpp", LLAMA)):
            for shared, style in ((False, "o-"), (True, "s--")):
                pts = [(l["clients"], l["output_tok_s"]) for l in rec["serve"]["loads"]
                       if l["server"] == server and l["shared_prefix"] == shared]
                if pts:
                    label = f"{server}, {'shared 1000-token prefix' if shared else 'distinct prompts'}"
                    axes[1].plot(*zip(*pts), style, color=color, label=label,
                                 alpha=1.0 if not shared else 0.7)
        axes[1].set_xlabel("concurrent HTTP clients")
        axes[1].set_ylabel("output tok/s")
        axes[1].set_title("Serving over HTTP (/v1/completions, streamed)")
        axes[1].legend(fontsize=8)
        axes[1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def ttft(rec, path):
    loads = rec["serve"]["loads"]
    fig, ax = plt.subplots(figsize=(11, 4))
    labels, data, colors = [], [], []
    for l in loads:
        labels.append(f"{l['server']}\n{l['clients']} cl.{' shared' if l['shared_prefix'] else ''}")
        data.append(l["ttfts_s"])
        colors.append(FOLIO if l["server"] == "folio" else LLAMA)
    for i, (d, c) in enumerate(zip(data, colors)):
        ax.scatter([i + 1] * len(d), d, s=8, color=c, alpha=0.5)
    bp = ax.boxplot(data, widths=0.5, showfliers=False)
    for med_line in bp["medians"]:
        med_line.set_color("black")
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("time to first token, s (log)")
    ax.set_title("TTFT of every request at each load (box: quartiles)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def cold_warm(rec, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    names, cold, warm = [], [], []
    for server, v in rec["serve"]["prefix_ttft"].items():
        names.append(server)
        cold.append(v["cold_s"])
        warm.append(v["warm_s"])
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], cold, 0.4, label="cold", color="#9ca3af")
    ax.bar([x + 0.2 for x in xs], warm, 0.4, label="warm (prefix cached)", color=FOLIO)
    for x, c, w in zip(xs, cold, warm):
        ax.text(x + 0.2, w, f"{w * 1e3:.0f} ms", ha="center", va="bottom", fontsize=8)
        ax.text(x - 0.2, c, f"{c:.2f} s", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), names)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT, s (log)")
    ax.set_title(f"{rec['serve']['prefix_tokens']}-token prefix + new question, over HTTP")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def kv_memory(rec, path):
    kv = rec["kv"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    kinds = ["paged", "contiguous"]
    colors = [FOLIO, "#9ca3af"]
    per_gib = [kv["sequences_per_gib"][k] for k in kinds]
    axes[0].bar(kinds, per_gib, color=colors)
    for i, v in enumerate(per_gib):
        axes[0].text(i, v, str(v), ha="center", va="bottom")
    axes[0].set_ylabel("sequences")
    axes[0].set_title("Sequences per GiB of KV")
    mib = [kv["bytes_per_sequence"][k] / 2**20 for k in kinds]
    axes[1].bar(kinds, mib, color=colors)
    for i, v in enumerate(mib):
        axes[1].text(i, v, f"{v:.1f}", ha="center", va="bottom")
    axes[1].set_ylabel("MiB")
    axes[1].set_title(f"KV per sequence (mean {kv['mean_tokens']:.0f} tokens)")
    fig.suptitle(f"{kv['sequences']} sequences of 1-2048 tokens; contiguous = "
                 f"max context ({kv['model_context']}) preallocated", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(rec, plots):
    m = rec["machine"]
    out = ["# Benchmarks", "",
           "folio and llama.cpp on the same GGUF file, the same threads and the same loads, "
           "taking turns round by round; medians of the rounds (every round is in "
           "[bench/latest.json](bench/latest.json), the full output in "
           "[bench/latest.txt](bench/latest.txt)). Reproduce with `scripts/bench.sh`.", "",
           "## Machine and command", "",
           f"- CPU: {m['cpu']} (family {m['cpu_family']}, model {m['cpu_model']}), "
           f"{m['cores']} cores, {m['memory_gib']:.0f} GiB",
           f"- folio's kernels: {m['kernels']}; threads: {m['threads']}",
           f"- measured read bandwidth: {m['read_bandwidth_gb_s']:.1f} GB/s",
           f"- command: `{rec['command']}` (commit {rec.get('commit')}, {rec.get('date')})", ""]
    s = rec["single"]
    out += ["## One sequence", "", "| test | folio tok/s | llama.cpp tok/s | folio / llama.cpp |",
            "|---|---|---|---|"]
    for key in ("pp", "tg"):
        f, l = med(s[key]["folio"]), med(s[key]["llama"])
        out.append(f"| {key}{s[key]['tokens']} | {num(f)} | {num(l)} | {ratio(f, l)} |")
    out += ["", f"Decode reads {s['weights_bytes_per_token'] / 1e6:.1f} MB of weights per "
            f"token: the bandwidth ceiling is {s['decode_ceiling_tok_s']:.0f} tok/s, folio "
            f"reaches {100 * med(s['tg']['folio']) / s['decode_ceiling_tok_s']:.0f}% of it.", ""]
    if "long" in rec:
        out += ["## Long context", "", "| test | folio tok/s | llama.cpp tok/s (llama-bench) | folio / llama.cpp |",
                "|---|---|---|---|"]
        for name, v in rec["long"].items():
            if isinstance(v, dict):
                f, l = med(v["folio"]), med(v["llama"])
                out.append(f"| {name} | {num(f)} | {num(l)} | {ratio(f, l)} |")
        out.append("")
    if "batch" in rec:
        out += ["## Batched decode", "", "![throughput](bench/throughput.svg)", "",
                "| batch | folio aggregate tok/s | llama.cpp (llama-batched-bench) | folio / llama.cpp |",
                "|---|---|---|---|"]
        for r in rec["batch"]["sizes"]:
            f, l = med(r["folio"]), med(r["llama"])
            out.append(f"| {r['batch']} | {num(f)} | {num(l)} | {ratio(f, l)} |")
        vs = rec["batch"].get("vs_prefill")
        if vs:
            out += ["", f"Batch {vs['batch']} against our own pp512 measured just before it in "
                    f"the same round: {vs['ratio']:.2f}x (the rounds: "
                    f"{' '.join(f'{r:.2f}' for r in vs['ratios'])})."]
        out.append("")
    if "serve" in rec:
        sv = rec["serve"]
        out += ["## Serving over HTTP", "",
                f"`{sv['route']}`, streamed, greedy, {sv['max_tokens']} output tokens per "
                f"request; llama.cpp: {sv['llama_server'] or 'not measured'}.", "",
                "![ttft](bench/ttft.svg)", "",
                "| prompts | clients | server | output tok/s | TTFT p50 s | TTFT p95 s | folio / llama.cpp |",
                "|---|---|---|---|---|---|---|"]
        by = {(l["shared_prefix"], l["clients"], l["server"]): l for l in sv["loads"]}
        for l in sv["loads"]:
            other = by.get((l["shared_prefix"], l["clients"], "llama.cpp"))
            r = ratio(l["output_tok_s"], other["output_tok_s"]) if l["server"] == "folio" and other else ""
            out.append(f"| {l['prompts']} | {l['clients']} | {l['server']} | {l['output_tok_s']:.1f} | "
                       f"{l['ttft_p50_s']:.2f} | {l['ttft_p95_s']:.2f} | {r} |")
        out += ["", "![cold vs warm](bench/ttft_cold_warm.svg)", "",
                f"| server | TTFT cold ({sv['prefix_tokens']}-token prefix) | warm (prefix cached) | peak RSS MiB |",
                "|---|---|---|---|"]
        for server, v in sv["prefix_ttft"].items():
            rss = sv["peak_rss_mib"].get(server)
            out.append(f"| {server} | {v['cold_s']:.2f} s | {v['warm_s'] * 1e3:.0f} ms | {num(rss, 0)} |")
        out.append("")
    if "kv" in rec:
        kv = rec["kv"]
        out += ["## KV memory", "", "![kv](bench/kv_memory.svg)", "",
                "| | paged | contiguous (max context preallocated) |", "|---|---|---|",
                f"| KV bytes per sequence | {kv['bytes_per_sequence']['paged'] / 2**20:.2f} MiB | "
                f"{kv['bytes_per_sequence']['contiguous'] / 2**20:.2f} MiB |",
                f"| sequences per GiB | {kv['sequences_per_gib']['paged']} | {kv['sequences_per_gib']['contiguous']} |",
                f"| slots wasted | {kv['slots_wasted_pct']['paged']:.2f}% | {kv['slots_wasted_pct']['contiguous']:.1f}% |",
                "", f"Fork of a 32k-token sequence: {kv.get('fork_us_at_32768', 0):.2f} µs.", ""]
    if "grammar" in rec:
        g = rec["grammar"]
        out += ["## Structured output", "",
                f"Schema compile {g['schema_compile_ms']:.2f} ms; token table {g['token_table_ms']:.0f} ms once per model.", "",
                "| requests at once | constrained tok/s | unconstrained tok/s | ratio |", "|---|---|---|---|"]
        for k, v in g.items():
            if k.startswith("batch_"):
                c, u = med(v["constrained"]), med(v["unconstrained"])
                out.append(f"| {k[6:]} | {c:.1f} | {u:.1f} | {100 * c / u:.1f}% |")
        out.append("")
    return "\n".join(out)


def main():
    src, plots, page = sys.argv[1], sys.argv[2], sys.argv[3]
    rec = json.load(open(src))
    os.makedirs(plots, exist_ok=True)
    if "batch" in rec or "serve" in rec:
        throughput(rec, os.path.join(plots, "throughput.svg"))
    if "serve" in rec:
        ttft(rec, os.path.join(plots, "ttft.svg"))
        cold_warm(rec, os.path.join(plots, "ttft_cold_warm.svg"))
    if "kv" in rec:
        kv_memory(rec, os.path.join(plots, "kv_memory.svg"))
    # The hand-kept sections follow the run's figures: measurements made with other
    # commands (docs/bench/measured.md: real models, 8-bit K/V, speculative decoding),
    # then the design measurements (docs/bench/design.md).
    extra = ""
    for name in ("measured.md", "design.md"):
        kept = os.path.join(plots, name)
        if os.path.exists(kept):
            extra += ("\n" if extra else "") + open(kept).read()
    with open(page, "w") as f:
        f.write(markdown(rec, plots) + "\n")
        if extra:
            f.write("\n" + extra)
    print(f"wrote {page} and the plots in {plots}")


if __name__ == "__main__":
    main()
