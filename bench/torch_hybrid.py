#!/usr/bin/env python3
"""bench/torch_hybrid.py — Hugging Face transformers' hybrid linear-attention prefill (issue 37), the reference rows of
bench/bench_hybrid.cpp, on the GPU machine:

  python3 bench/torch_hybrid.py [--model both] [--seqs 4] [--T 3072] [--budget-s 20] [--impl grouped_mm]

Qwen3_5TextModel / Qwen3_5MoeTextModel (no lm_head) at the shapes of transformers' default configs (Qwen3_5TextConfig
= Qwen3.5-9B: H 4096, 32 layers; Qwen3_5MoeTextConfig = Qwen3.5-35B-A3B: H 2048, 40 layers, 256 experts top-8), random
bf16 weights built on the GPU (Linear N(0, 0.02), 1-D parameters 1), sdpa attention, over --seqs x --T random tokens
with output_hidden_states=True and the 5 default target layers gathered (the trainer's capture). The linear attention
runs whatever transformers picks: its torch path (torch_chunk_gated_delta_rule, torch causal conv) unless
flash-linear-attention / causal-conv1d are installed (printed). MoE experts: each --impl
(model.set_experts_implementation). Then the gated delta rule alone (transformers' torch_chunk_gated_delta_rule, and
flash-linear-attention's chunk_gated_delta_rule when installed) on the shapes of bench_hybrid's gdr rows.
Prints RESULT lines in bench/torch_ref.py's format with the FLOPs of bench_hybrid.cpp (hybrid_prefill_flops below).
"""
import argparse
import importlib.util
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import PEAK_TFLOPS, bench_events, note, result  # noqa: E402

CHUNK_FLOP = 11534336.0  # bench_hybrid.cpp kChunkFlop: the chunked form's matmuls per chunk of 64 and value head


def default_target_layer_ids(L, nf):
    if nf == 1:
        return [L // 2]
    return [int(1 + i * (L - 4) / (nf - 1) + 0.5) for i in range(nf)]


def hybrid_prefill_flops(c, lens):
    """bench_hybrid.cpp's formula: per token and layer 2 x the matmul parameters a token uses, plus causal attention
    4 d nh T (T + 1) / 2 per full-attention layer and sequence; no lm_head, no recurrence term."""
    H, nh, nkv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    kd = c.linear_num_key_heads * c.linear_key_head_dim
    vd = c.linear_num_value_heads * c.linear_value_head_dim
    f = 0.0
    for lt in c.layer_types:
        if lt == "linear_attention":
            p = H * (2 * kd + vd + vd + 2 * c.linear_num_value_heads) + vd * H
        else:
            p = H * nh * d * 2 + 2 * H * nkv * d + nh * d * H
        if getattr(c, "num_experts", 0):
            p += H * c.num_experts + c.num_experts_per_tok * 3 * H * c.moe_intermediate_size
            p += 3 * H * c.shared_expert_intermediate_size + H
        else:
            p += 3 * H * c.intermediate_size
        for t in lens:
            f += 2.0 * p * t + (4.0 * d * nh * t * (t + 1) / 2.0 if lt == "full_attention" else 0.0)
    return f


def build(model_cls, cfg):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = model_cls(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    torch.cuda.synchronize()
    return model


def bench_prefill(name, model_cls, cfg, a, impls):
    import transformers
    if a.layers:
        cfg.num_hidden_layers = a.layers
        cfg.layer_types = cfg.layer_types[: a.layers]
    cfg._attn_implementation = "sdpa"
    t0 = time.perf_counter()
    model = build(model_cls, cfg)
    nparams = sum(p.numel() for p in model.parameters())
    note(f"HF {model_cls.__name__} (transformers {transformers.__version__}, torch {torch.__version__}): "
         f"{nparams / 1e9:.2f}B params, built in {time.perf_counter() - t0:.1f} s, "
         f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB")
    L = cfg.num_hidden_layers
    layer_ids = default_target_layer_ids(L, 5)
    g = torch.Generator(device="cuda")
    g.manual_seed(a.seed)
    ids = torch.randint(0, cfg.vocab_size, (a.seqs, a.T), device="cuda", generator=g)
    flops = hybrid_prefill_flops(cfg, [a.T] * a.seqs)

    def run():
        with torch.inference_mode():
            o = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            return torch.cat([o.hidden_states[l + 1] for l in layer_ids], dim=-1)

    for impl in impls:
        if impl != "-":
            try:
                model.set_experts_implementation(impl)
            except Exception as e:  # noqa: BLE001
                note(f"experts implementation {impl!r} refused: {e!r}")
                continue
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        torch.cuda.reset_peak_memory_stats()
        ms, reps = bench_events(run, a.budget_s, max_reps=10, min_reps=2, warmup=1)
        tf = flops / ms / 1e9
        result(f"hybrid_{name}_prefill_{a.seqs}x{a.T}", experts=impl, ms=ms, tokens_per_s=a.seqs * a.T / ms * 1e3,
               tflops=tf, mfu_989=tf / PEAK_TFLOPS, layers=L, reps=reps, first_ms=first * 1e3,
               peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    del model
    torch.cuda.empty_cache()


def bench_gdr(a):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    nk, nv, d = 16, 32, 128
    g = torch.Generator(device="cuda")
    g.manual_seed(a.seed)
    B, T = a.seqs, a.T
    q = torch.randn(B, T, nk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, T, nk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, T, nv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    beta = torch.sigmoid(torch.randn(B, T, nv, device="cuda", generator=g)).to(torch.bfloat16)
    gg = -torch.exp(torch.tensor(-1.0)) * torch.nn.functional.softplus(
        torch.randn(B, T, nv, device="cuda", generator=g) - 1.0)
    # the model repeats q, k over the value heads before the call (repeat_interleave): time that layout
    qr, kr = q.repeat_interleave(nv // nk, dim=2), k.repeat_interleave(nv // nk, dim=2)
    chunks = B * ((T + 63) // 64) * nv
    fn = getattr(m.torch_chunk_gated_delta_rule, "__wrapped__", m.torch_chunk_gated_delta_rule)
    torch_fn = m.torch_chunk_gated_delta_rule
    note(f"transformers' chunk_gated_delta_rule resolves to {torch_fn.__module__}.{getattr(torch_fn, '__qualname__', '?')}")

    def run_torch():
        with torch.inference_mode():
            return fn(qr, kr, v, g=gg, beta=beta, use_qk_l2norm_in_kernel=True)[0]

    ms, reps = bench_events(run_torch, a.budget_s, max_reps=10, min_reps=2, warmup=1)
    result(f"gdr_chunk_{B}x{T}", impl="transformers_torch", ms=ms, tflops=chunks * CHUNK_FLOP / ms / 1e9,
           heads=nv, reps=reps)
    if importlib.util.find_spec("fla") is not None:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule

            def run_fla():
                with torch.inference_mode():
                    return chunk_gated_delta_rule(qr, kr, v, g=gg, beta=beta, use_qk_l2norm_in_kernel=True)[0]

            ms, reps = bench_events(run_fla, a.budget_s, max_reps=10, min_reps=2, warmup=2)
            result(f"gdr_chunk_{B}x{T}", impl="fla", ms=ms, tflops=chunks * CHUNK_FLOP / ms / 1e9, heads=nv, reps=reps)
        except Exception as e:  # noqa: BLE001
            note(f"flash-linear-attention present but failed: {e!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="both", choices=["dense", "moe", "both", "none"])
    ap.add_argument("--impl", default="grouped_mm", help="MoE experts implementations, comma-separated")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--T", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (smoke tests)")
    ap.add_argument("--budget-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeTextModel
    note("flash-linear-attention: " + ("installed" if importlib.util.find_spec("fla") else "not installed") +
         "; causal-conv1d: " + ("installed" if importlib.util.find_spec("causal_conv1d") else "not installed"))
    bench_gdr(a)
    if a.model in ("dense", "both"):
        bench_prefill("dense", Qwen3_5TextModel, Qwen3_5TextConfig(use_cache=False), a, ["-"])
    if a.model in ("moe", "both"):
        bench_prefill("moe", Qwen3_5MoeTextModel, Qwen3_5MoeTextConfig(use_cache=False), a,
                      [x for x in a.impl.split(",") if x])


if __name__ == "__main__":
    main()
