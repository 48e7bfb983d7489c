#!/usr/bin/env python3
"""How far transformers' own bf16 forward is from a golden (tests/golden/<name>, made in float64 by
tools/make_goldens.py or tools/make_goldens_families.py): the yardstick of the CUDA golden tests' bound.

    python3 tools/hf_bf16_errors.py [--golden tests/golden] [--only target_qwen3_5_moe,...] [--device cuda]

For each golden directory: the model saved there, loaded by transformers in bfloat16 (eager attention and experts:
the paths every family has), run on the golden's input_ids; then, with exactly the CUDA test's rule
(tests/cuda/test_ops.cpp golden_case): the tokens whose experts (sorted) equal the golden's at every MoE layer are
kept, and the relative RMS error over the kept tokens is taken for every layer's output (the worst layer) and the
logits. Written to <dir>/hf_bf16.json. Why: in bf16 a token whose top-k router logits nearly tie can choose another
expert than the float64 golden, and in the hybrid models the linear attention's state carries that difference to
every later token, kept or not; a bf16 implementation is then held to max(3e-2, 1.25 x transformers' own bf16 error)
instead of 3e-2 alone (tests/cuda/test_ops.cpp). Needs torch and transformers (the GPU machine; the CPU works too).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens_families as mgf  # noqa: E402

# the goldens the CUDA op table compares with golden_case (the MXFP4 one: transformers' MXFP4 loader wants kernels
# this machine may not have; its test keeps the plain bound)
DEFAULT = ["target_qwen3_moe", "target_gpt_oss", "target_qwen3_next", "target_qwen3_5", "target_qwen3_5_moe",
           "target_qwen3_5_vl"]


def rel_rms_rows(got: torch.Tensor, want: torch.Tensor, keep: torch.Tensor) -> float:
    """sqrt(sum over kept rows (got - want)^2 / sum over kept rows want^2), as the CUDA test's rel_rms_rows."""
    g, w = got.double()[keep], want.double()[keep]
    return float(torch.sqrt(((g - w) ** 2).sum() / max(float((w ** 2).sum()), 1e-300)))


def measure(d: str, device: str) -> dict:
    import transformers
    from safetensors.torch import load_file

    cfg = json.load(open(os.path.join(d, "config.json")))
    cls = getattr(transformers, cfg["architectures"][0])
    model = cls.from_pretrained(d, dtype=torch.bfloat16).to(device).eval()
    mgf.eager(model)
    gold = load_file(os.path.join(d, "golden.safetensors"))
    ids = gold["input_ids"].long().to(device)
    cap = mgf.hf_forward(model, ids)
    S = ids.numel()
    keep = torch.ones(S, dtype=torch.bool)
    same = total = 0
    for l in cap["router_layers"]:
        key = f"router_topk.{l}"
        if f"router_out.{l}" not in cap or key not in gold:
            continue
        mine = mgf.router_topk(cap[f"router_out.{l}"]).cpu().sort(dim=-1).values
        want = gold[key].sort(dim=-1).values
        eq = (mine == want).all(dim=-1)
        same += int(eq.sum())
        total += S
        keep &= eq
    L = len(mgf.decoder(model).layers)
    worst = max(rel_rms_rows(cap[f"layer_output.{l}"].cpu(), gold[f"layer_output.{l}"], keep) for l in range(L))
    logits = rel_rms_rows(cap["logits"].cpu(), gold["logits"], keep)
    return {"experts_same": same, "experts_total": total, "tokens_kept": int(keep.sum()), "tokens": S,
            "worst_layer_rel": worst, "logits_rel": logits}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", default="tests/golden")
    ap.add_argument("--only", default="")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    import transformers

    names = [n for n in a.only.split(",") if n] or DEFAULT
    for n in names:
        d = os.path.join(a.golden, n)
        r = measure(d, a.device)
        out = {"transformers_bf16": r, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
               "transformers_version": transformers.__version__, "torch_version": torch.__version__,
               "rule": "tokens whose sorted experts equal the golden's at every MoE layer; relative RMS error over "
                       "them (tests/cuda/test_ops.cpp golden_case)"}
        with open(os.path.join(d, "hf_bf16.json"), "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        print(f"RESULT name=hf_bf16_{n} experts={r['experts_same']}/{r['experts_total']} "
              f"kept={r['tokens_kept']}/{r['tokens']} worst_layer_rel={r['worst_layer_rel']:.3e} "
              f"logits_rel={r['logits_rel']:.3e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
