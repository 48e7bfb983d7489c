#!/usr/bin/env python3
"""Greedy completions with Hugging Face transformers (KV cache), a reference for `dflash generate`.

    python3 tools/demo/hf_generate.py --model assets/demo/target --prompts assets/demo/prompts_eval.jsonl.gz \
        --out /tmp/hf_completions.jsonl --max-new-tokens 64 --limit 8 [--ids] [--dtype bfloat16|float32]

Each output row: {"prompt": ..., "completion": ...} (+ "prompt_ids", "completion_ids", "stop" with --ids).
The prompt is tokenized with tokenizer.json as is (no special tokens added, no chat template); generation is
greedy, one prompt at a time (no padding), and stops at the tokenizer's eos token or after --max-new-tokens.
The completion text excludes the eos token. Note: a bf16 model run by two implementations can legitimately
differ where two logits are within rounding of each other; compare with --dtype float32 for exactness.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time


def read_prompts(path: str, limit: int) -> list[str]:
    op = gzip.open if path.endswith(".gz") else open
    out = []
    with op(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            out.append(json.loads(line)["prompt"])
            if limit and len(out) >= limit:
                break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="assets/demo/target")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="first N prompts (0 = all)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float64"])
    ap.add_argument("--device", default="")
    ap.add_argument("--ids", action="store_true", help="also write token ids and the stop reason")
    args = ap.parse_args()

    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=dtype)
    model = model.to(dev).eval()
    tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    with open(f"{args.model}/tokenizer_config.json") as f:
        tcfg = json.load(f)
    eos = tok.token_to_id(tcfg.get("eos_token") or "<|endoftext|>")
    prompts = read_prompts(args.prompts, args.limit)
    t0 = time.time()
    n_tok = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for p in prompts:
            ids = tok.encode(p, add_special_tokens=False).ids
            x = torch.tensor([ids], device=dev)
            with torch.no_grad():
                g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                   do_sample=False, num_beams=1, eos_token_id=eos, pad_token_id=eos)
            new = g[0, len(ids):].tolist()
            stop = "length"
            if eos in new:
                new = new[:new.index(eos) + 1]
                stop = "eos"
            n_tok += len(new)
            text_ids = new[:-1] if stop == "eos" else new
            row = {"prompt": p, "completion": tok.decode(text_ids, skip_special_tokens=False)}
            if args.ids:
                row.update(prompt_ids=ids, completion_ids=new, stop=stop)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    dt = time.time() - t0
    print(f"hf_generate: {len(prompts)} prompts, {n_tok} new tokens in {dt:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
