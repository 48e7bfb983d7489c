#!/usr/bin/env python3
# bench/chat_template_engine.py — the engine choice of issue 35, measured: how many rows per second Python's
# Jinja2 (the engine Hugging Face runs, in its environment: tests/oracle/render_chat.py) renders and masks by the
# rule of docs/spec.md 2.6 — the work `dflash prepare` does in C++ before tokenizing. One process (Python's GIL
# allows no more for rendering); tokenization is not counted, so this is an upper bound for an embedded-Python
# `prepare`. Compare with `dflash prepare` rows/s on the same rows (bench/RESULTS.md).
# Usage: python3 bench/chat_template_engine.py --template FILE.jinja --input rows.jsonl [--max-rows N]
#   rows: {"messages": [...]} or {"prompt", "completion"} (as prepare --format chat turns them into two turns)
#        python3 bench/chat_template_engine.py --write-multi-turn OUT.jsonl --input demo.jsonl
#   writes the multi-turn set of bench/RESULTS.md: each demo row i as a conversation of a system turn and the
#   prompt / completion pairs of rows i, i+1, i+2 as three user / assistant turns
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
from render_chat import Renderer, supervised_spans  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template")
    ap.add_argument("--write-multi-turn")
    ap.add_argument("--input", required=True)
    ap.add_argument("--max-rows", type=int, default=0)
    a = ap.parse_args()
    if a.write_multi_turn:
        pairs = [json.loads(line) for line in open(a.input, encoding="utf-8")]
        with open(a.write_multi_turn, "w", encoding="utf-8") as out:
            for i in range(len(pairs) - 2):
                ms = [{"role": "system", "content": "You complete Python code."}]
                for r in pairs[i:i + 3]:
                    ms += [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}]
                out.write(json.dumps({"messages": ms}) + "\n")
        return
    if not a.template:
        ap.error("--template is required")
    rows = []
    with open(a.input, encoding="utf-8") as f:
        for line in f:
            j = json.loads(line)
            if "messages" in j:
                rows.append(j["messages"])
            elif "prompt" in j:
                rows.append([{"role": "user", "content": j["prompt"]}, {"role": "assistant", "content": j["completion"]}])
            if a.max_rows and len(rows) >= a.max_rows:
                break
    r = Renderer(open(a.template, encoding="utf-8").read(), 1767225600)
    variables = {"enable_thinking": True}
    t0 = time.perf_counter()
    ok = 0
    for ms in rows:
        try:
            supervised_spans(r, ms, None, variables, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
            ok += 1
        except Exception:  # noqa: BLE001 (bad rows are skipped, as prepare does)
            pass
    dt = time.perf_counter() - t0
    print(json.dumps({"rows": len(rows), "rendered": ok, "seconds": round(dt, 3), "rows_per_s": round(len(rows) / dt, 1),
                      "jinja2": __import__("jinja2").__version__}))


if __name__ == "__main__":
    main()
