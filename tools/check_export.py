#!/usr/bin/env python3
"""Case C11, the independent half: load a drafter exported by `dflash` (z-lab format, spec 3) with the PyTorch
reference of the spec (tools/ref_dflash.py) and check it gives the reference logits.

    python3 tools/check_export.py [--export tests/golden/export_qwen3] [--step tests/golden/step_qwen3]

tests/golden/export_qwen3 is the C++ export of the step golden's initial drafter (the C++ test
StepGolden.ExportOfTheInitialDrafterIsReproduced keeps it in sync). The check reads only the export's config.json
(spec 3 keys) and model.safetensors (bf16, top-level names), computes the drafter logits of the step golden's two
sequences in float64, and compares them
  (a) with the reference run on the initial weights rounded to bf16 (the same weights): rel. error < 1e-6, and
  (b) with the step golden's float32-weight logits: rel. error < 3e-2 (bf16 rounding of the weights).
Prints one line per check and exits non-zero on a failure."""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_dflash as R  # noqa: E402

SPEC3_KEYS = {"architectures", "model_type", "block_size", "num_target_layers", "dflash_config", "hidden_size",
              "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings", "attention_bias",
              "layer_types", "tie_word_embeddings", "vocab_size", "torch_dtype", "dtype"}


def rel(a, b):
    return float((a - b).norm() / b.norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export", default="tests/golden/export_qwen3")
    ap.add_argument("--step", default="tests/golden/step_qwen3")
    a = ap.parse_args()
    ok = True
    with open(os.path.join(a.export, "config.json")) as f:
        c = json.load(f)
    missing = SPEC3_KEYS - set(c)
    print(f"config keys: missing {sorted(missing)}; architectures {c['architectures']}")
    ok &= not missing and c["architectures"] == ["DFlashDraftModel"]
    dc = R.DraftConfig(hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                       num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
                       num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
                       block_size=c["block_size"], target_layer_ids=c["dflash_config"]["target_layer_ids"],
                       mask_token_id=c["dflash_config"]["mask_token_id"], rms_norm_eps=c["rms_norm_eps"],
                       rope_theta=c["rope_theta"], rope_scaling=c["rope_scaling"])
    W = load_file(os.path.join(a.export, "model.safetensors"))
    names = dict(R.drafter_param_shapes(dc))
    bad = [k for k in W if k not in names] + [k for k in names if k not in W]
    wrong = [k for k, v in W.items() if k in names and (list(v.shape) != names[k] or v.dtype != torch.bfloat16)]
    print(f"tensors: {len(W)}, unexpected/missing {bad}, wrong shape or dtype {wrong}")
    ok &= not bad and not wrong
    P = {k: v.to(torch.float64) for k, v in W.items()}

    with open(os.path.join(a.step, "config.json")) as f:
        sc = json.load(f)
    target_dir = os.path.normpath(os.path.join(a.step, sc["target_dir"]))
    TW = R.load_target_weights(target_dir)
    case = load_file(os.path.join(a.step, "case.safetensors"))
    init = load_file(os.path.join(a.step, "init.safetensors"))
    P_ref = {k: v.to(torch.bfloat16).to(torch.float64) for k, v in init.items()}
    expected = load_file(os.path.join(a.step, "expected_ce.safetensors"))
    for s in range(2):
        p = f"seq{s}."
        args = (TW["embed_tokens.weight"], TW["lm_head.weight"], case[p + "features"].to(torch.float64),
                case[p + "input_ids"].tolist(), case[p + "anchors"].tolist(), case[p + "valid"].tolist())
        got = R.drafter_forward(P, dc, *args)["logits"]
        same = R.drafter_forward(P_ref, dc, *args)["logits"]
        valid = torch.tensor(case[p + "valid"].tolist()).repeat_interleave(dc.block_size).bool()
        f32 = expected[f"logits.seq{s}"].to(torch.float64)
        e1, e2 = rel(got, same), rel(got[valid], f32[valid])
        print(f"seq{s}: logits vs reference on the same bf16 weights {e1:.2e} (< 1e-6), "
              f"vs the f32-weight golden {e2:.2e} (< 3e-2)")
        ok &= e1 < 1e-6 and e2 < 3e-2
    print("CHECK_EXPORT", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
