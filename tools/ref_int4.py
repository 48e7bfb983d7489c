#!/usr/bin/env python3
"""INT4 weights as compressed-tensors' "pack-quantized" format stores them (Kimi-K2-Thinking / Kimi-K2.5's routed
experts), written independently of dflash in plain PyTorch (no compressed-tensors, no transformers, no safetensors:
runs with Debian's torch 1.13), and the tiny golden it makes:

    python3 tools/ref_int4.py [--src tests/golden/target_qwen3_moe] [--out tests/golden/target_qwen3_moe_int4]

The format (neuralmagic/compressed-tensors: compressors/quantized_compressors/pack_quantized.py pack_to_int32 /
unpack_from_int32, quantization/lifecycle/forward.py quantize / dequantize), for a linear of weight [N, K]:
  q = clamp(round(w / s), -8, 7) per group of `group_size` columns with its scale s (symmetric: no zero point)
  <module>.weight_packed  I32 [N, ceil(K / 8)]: word j of a row = sum_i (q[8 j + i] + 8) << 4 i, i = 0 .. 7
                          (the unsigned code c = q + 8, offset 2^(num_bits - 1); nibble i = column 8 j + i)
  <module>.weight_scale   [N, K / group_size] in the model's dtype (BF16 for Kimi-K2; BF16 here)
  <module>.weight_shape   I32 [2] = [N, K]
  w_dequantised[n, k] = (c - 8) * weight_scale[n, k // group_size]
and the quantization_config of Kimi-K2-Thinking's config.json (quant_method compressed-tensors, format pack-quantized,
one config group targeting Linear with weights {num_bits 4, type int, symmetric, strategy group, group_size 32}).

Here the scale of a group is the symmetric min-max rule, max |w| / 7.5 rounded to bf16 (so that +-max reach the codes
7 and -8), which is one choice among others: the reader does not depend on how the scale was chosen.

The directory it writes (tests/golden/target_qwen3_moe_int4), from the Qwen3-MoE golden `--src` (4 layers, 8 experts
top-2, layer 2 dense):
  config.json          the source's, plus that quantization_config with ignore ["lm_head", "re:.*self_attn.*",
                       "re:.*mlp\\.gate$"] (attention and the router stay as they are, as in Kimi-K2)
  model.safetensors    every routed expert's gate / up / down projection (mlp.experts.{e}.*_proj) and the dense
                       layer's MLP (mlp.gate_proj / up_proj / down_proj) pack-quantized in groups of 32; the other
                       tensors as in the source (F32)
  golden.safetensors   tools/make_goldens.py's format, from tools/ref_dflash.py's float64 target_forward on the
                       dequantised weights: input_ids (the source golden's), hidden_states.k, layer_output.l,
                       final_hidden, logits, kv_decode_logits (= logits[36:40]: the causal forward's rows, which a
                       cached decode must reproduce), router_topk.l, rope_inv_freq; and for the unpacking test, the
                       signed integers and the dequantised values of two projections: int4_codes.<module> I32 [N, K],
                       int4_dequantised.<module> F32 [N, K] (exact: a 4-bit integer times a bf16 scale)
The script checks that in every MoE layer no token's k-th and (k+1)-th router probabilities are closer than 1e-4 (so
an fp32 reader chooses the same experts).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_dflash  # noqa: E402  (the float64 target forward, checked against transformers by make_goldens.py)
from ref_minimax_m2 import write_safetensors  # noqa: E402  (F32, BF16 and I32 by hand)
from ref_dflash2 import read_safetensors  # noqa: E402  (safetensors read by hand, any stored dtype)

torch.set_default_dtype(torch.float64)

GROUP = 32
PREFILL = 36
IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"]
UNPACK_CHECKS = ["model.layers.0.mlp.experts.3.gate_proj", "model.layers.2.mlp.down_proj"]


# ------------------------------------------------------------------------------------------------------------
# INT4, pack-quantized
# ------------------------------------------------------------------------------------------------------------

def quantize(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q int64 [N, K] in [-8, 7], scales bfloat16 [N, K / group])."""
    N, K = w.shape
    g = w.to(torch.float64).reshape(N, K // group, group)
    amax = g.abs().amax(dim=-1)
    scale = (amax / 7.5).to(torch.bfloat16)
    s = scale.to(torch.float64)
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.clamp(torch.round(g / s[..., None]), -8, 7).to(torch.int64)
    return q.reshape(N, K), scale


def pack(q: torch.Tensor) -> torch.Tensor:
    """q int64 [N, K] in [-8, 7], K % 8 == 0 -> I32 [N, K / 8]: nibble i of word j = q[:, 8 j + i] + 8."""
    N, K = q.shape
    c = (q + 8).reshape(N, K // 8, 8)
    words = torch.zeros(N, K // 8, dtype=torch.int64)
    for i in range(8):
        words |= c[:, :, i] << (4 * i)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)  # the uint32 bits as int32
    return words.to(torch.int32)


def dequantise(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """(q, scales) -> float64 [N, K] = q * scale of its group."""
    return q.to(torch.float64) * scale.to(torch.float64).repeat_interleave(group, dim=1)


def is_quantized(name: str) -> bool:
    """The linears this golden packs: the routed experts' and the dense MLP's projections."""
    return name.startswith("model.layers.") and name.endswith("_proj.weight") and ".mlp." in name


# ------------------------------------------------------------------------------------------------------------
# the golden
# ------------------------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default="tests/golden/target_qwen3_moe")
    ap.add_argument("--out", default="tests/golden/target_qwen3_moe_int4")
    a = ap.parse_args()

    src_w = read_safetensors(os.path.join(a.src, "model.safetensors"))
    src_g = read_safetensors(os.path.join(a.src, "golden.safetensors"))
    with open(os.path.join(a.src, "config.json")) as f:
        cfg_json = json.load(f)
    cfg_json["quantization_config"] = {
        "config_groups": {"group_0": {
            "input_activations": None, "output_activations": None, "targets": ["Linear"],
            "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": GROUP,
                        "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                        "symmetric": True, "type": "int"}}},
        "format": "pack-quantized",
        "ignore": IGNORE,
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }

    packed, W, checks, n_q = {}, {}, {}, 0
    for name, t in src_w.items():
        key = name[6:] if name.startswith("model.") else name
        if not is_quantized(name):
            packed[name] = t
            W[key] = t.to(torch.float64)
            continue
        q, scale = quantize(t, GROUP)
        base = name[: -len("weight")]
        packed[base + "weight_packed"] = pack(q)
        packed[base + "weight_scale"] = scale
        packed[base + "weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int32)
        W[key] = dequantise(q, scale, GROUP)
        n_q += 1
        if base[:-1] in UNPACK_CHECKS:
            checks["int4_codes." + base[:-1]] = q.to(torch.int32)
            checks["int4_dequantised." + base[:-1]] = W[key]
        # the packing reads back (nibble i of word j is column 8 j + i, minus 8)
        words = packed[base + "weight_packed"].to(torch.int64) & 0xFFFFFFFF
        back = torch.stack([((words >> (4 * i)) & 15) - 8 for i in range(8)], dim=-1).reshape(q.shape)
        assert torch.equal(back, q), name
    if "lm_head.weight" not in W:
        W["lm_head.weight"] = W["embed_tokens.weight"]

    os.makedirs(a.out, exist_ok=True)
    cfg_path = os.path.join(a.out, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg_json, f, indent=2)
        f.write("\n")
    cfg = ref_dflash.load_hf_config(cfg_path)

    # the forward, recording the router's margins (k-th vs (k+1)-th probability) of every MoE layer
    margins = {}
    moe_block = ref_dflash.moe_block

    def recording_moe_block(c, Wd, p, x):
        probs = torch.softmax(x @ Wd[p + "mlp.gate.weight"].T, dim=-1)
        top = torch.sort(probs, dim=-1, descending=True).values
        k = c["num_experts_per_tok"]
        margins[p] = float((top[:, k - 1] - top[:, k]).min())
        return moe_block(c, Wd, p, x)

    ref_dflash.moe_block = recording_moe_block
    ids = src_g["input_ids"].to(torch.int64)
    out = ref_dflash.target_forward(cfg, W, ids.tolist())
    ref_dflash.moe_block = moe_block
    for p, m in margins.items():
        print(f"{p}: smallest router margin {m:.2e}")
    if min(margins.values()) < 1e-4:
        print("FAILED: a router margin below 1e-4 (an fp32 reader could choose other experts)")
        return 1

    L = cfg["num_hidden_layers"]
    g = {"input_ids": ids.to(torch.int32), "hidden_states.0": out["embed"]}
    for l in range(L - 1):
        g[f"hidden_states.{l + 1}"] = out["layer_outputs"][l]
    g[f"hidden_states.{L}"] = out["final_hidden"]
    for l in range(L):
        g[f"layer_output.{l}"] = out["layer_outputs"][l]
    g["final_hidden"] = out["final_hidden"]
    g["logits"] = out["logits"]
    g["kv_decode_logits"] = out["logits"][PREFILL:]
    for l, chosen in sorted(out.get("router_topk", {}).items()):
        g[f"router_topk.{l}"] = chosen.to(torch.int32)
    g["rope_inv_freq"] = ref_dflash.rope_inv_freq(cfg["head_dim"], cfg["rope_theta"], cfg["rope_scaling"])
    g.update(checks)
    md = {
        "description": "tools/ref_int4.py: tools/ref_dflash.py's float64 target_forward on the dequantised weights "
                       "(w = (c - 8) * scale of each pack-quantized linear) of the model in this directory; stored "
                       "as F32",
        "source": a.src,
        "quantized": f"{n_q} linears (routed experts and the dense MLP), groups of {GROUP}, bf16 scales",
        "hidden_states.k": "HF output_hidden_states[k], k = 0..L (the last normed)",
        "layer_output.l": "residual stream after decoder layer l",
        "kv_decode_logits": f"logits[{PREFILL}:]: the rows a cached decode after a {PREFILL}-token prefill computes",
        "router_topk.l": "I32 [S, k]: the experts chosen (softmax, descending, lower index first on ties)",
        "smallest_router_margin": json.dumps({p: float(f"{m:.3e}") for p, m in margins.items()}),
        "int4_codes.m": "I32 [N, K]: the signed integers q in [-8, 7] of linear m",
        "int4_dequantised.m": "F32 [N, K]: q * weight_scale of its group (exact)",
        "torch_version": torch.__version__,
    }
    write_safetensors(os.path.join(a.out, "model.safetensors"), packed, {"format": "pt"})
    write_safetensors(os.path.join(a.out, "golden.safetensors"), g, md)
    print(f"wrote {a.out}: config.json, model.safetensors ({n_q} INT4 linears), golden.safetensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
