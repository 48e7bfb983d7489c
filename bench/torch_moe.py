#!/usr/bin/env python3
"""bench/torch_moe.py — Hugging Face transformers' Qwen3-MoE prefill, the reference row of bench/bench_moe.cpp
(issue 40), on the GPU machine:

  python3 bench/torch_moe.py [--impl grouped_mm,eager] [--seqs 4] [--T 3072] [--budget-s 20] [--family gpt_oss]

--family gpt_oss (issue 36): GptOssModel at gpt-oss-20b's shapes (24 layers, H 2880, 64/8 heads of 64, 32 experts
top-4 of width 2880, vocab 201088, sliding window 128 on every other layer, YaRN), bf16 experts, eager attention
(transformers' only attention with sinks); FLOPs by gptoss_prefill_flops (the sliding layers' attention counts the
keys inside the window).

Qwen3MoeModel (no lm_head) at the shapes of Qwen3-30B-A3B's config.json (48 layers, H 2048, 32/4 heads of 128, 128
experts top-8 of width 768, vocab 151936), random bf16 weights built on the GPU, sdpa attention, over --seqs x --T
random tokens with output_hidden_states=True and the 5 default target layers gathered (the trainer's capture), for
each experts implementation asked (model.set_experts_implementation: "grouped_mm" is transformers' fastest,
torch._grouped_mm; "eager" its per-expert loop). Prints RESULT lines in bench/torch_ref.py's format:
tokens/s, TFLOP/s and MFU against 989 TFLOP/s with the FLOPs of bench_moe.cpp (moe_prefill_flops below).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import PEAK_TFLOPS, bench_events, note, result  # noqa: E402

# Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json), the shapes of issue 40's benchmark
QWEN3_30B_A3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                     num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                     num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
                     mlp_only_layers=[], max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False)


# gpt-oss-20b (openai/gpt-oss-20b config.json) with bf16 experts
GPT_OSS_20B = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                   num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                   num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
                   attention_bias=True, tie_word_embeddings=False,
                   layer_types=["sliding_attention", "full_attention"] * 12)
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


def gptoss_prefill_flops(c, lens):
    """As moe_prefill_flops with gpt-oss's names; a sliding layer's query t sees min(t + 1, window) keys."""
    H, nh, nkv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    p_layer = H * nh * d * 2 + 2 * H * nkv * d + H * c["num_local_experts"] + \
        c["num_experts_per_tok"] * 3 * H * c["intermediate_size"]
    f = 0.0
    for t in lens:
        for kind in c["layer_types"][:c["num_hidden_layers"]]:
            W = c["sliding_window"] if kind == "sliding_attention" else t
            keys = sum(min(i + 1, W) for i in range(t))
            f += 2.0 * p_layer * t + 4.0 * d * nh * keys
    return f


def default_target_layer_ids(L, nf):
    if nf == 1:
        return [L // 2]
    return [int(1 + i * (L - 4) / (nf - 1) + 0.5) for i in range(nf)]


def moe_prefill_flops(c, lens):
    """Matmul FLOPs of the prefill as executed (bench_moe.cpp: the same formula): per token and layer 2 x (q, k, v, o
    + router + top_k experts x 3 H I) and causal attention 4 d nh T (T + 1) / 2 per sequence; no lm_head."""
    H, nh, nkv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    p_layer = H * nh * d * 2 + 2 * H * nkv * d + H * c["num_experts"] + \
        c["num_experts_per_tok"] * 3 * H * c["moe_intermediate_size"]
    L = c["num_hidden_layers"]
    return sum(L * (2.0 * p_layer * t + 4.0 * d * nh * t * (t + 1) / 2.0) for t in lens)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", default="grouped_mm,eager")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--T", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (smoke tests)")
    ap.add_argument("--budget-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--family", default="qwen3_moe", choices=["qwen3_moe", "gpt_oss"])
    a = ap.parse_args()
    import transformers

    gpt_oss = a.family == "gpt_oss"
    if gpt_oss:
        from transformers import GptOssConfig as Cfg, GptOssModel as Model
        c = dict(GPT_OSS_20B)
        if a.layers:
            c["num_hidden_layers"] = a.layers
            c["layer_types"] = c["layer_types"][:a.layers]
        cfg = Cfg(**c, rope_parameters=GPT_OSS_ROPE, use_cache=False)
        cfg._attn_implementation = "eager"
    else:
        from transformers import Qwen3MoeConfig as Cfg, Qwen3MoeModel as Model
        c = dict(QWEN3_30B_A3B)
        if a.layers:
            c["num_hidden_layers"] = a.layers
        cfg = Cfg(**c, rope_theta=1e6, use_cache=False)
        cfg._attn_implementation = "sdpa"
    t0 = time.perf_counter()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Model(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():  # the C++ bench's random target: Linear N(0, 0.02), norms 1
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    torch.cuda.synchronize()
    nparams = sum(p.numel() for p in model.parameters())
    note(f"HF {type(model).__name__} (transformers {transformers.__version__}, torch {torch.__version__}): "
         f"{nparams / 1e9:.2f}B params, built in {time.perf_counter() - t0:.1f} s, "
         f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB")
    L = c["num_hidden_layers"]
    layer_ids = default_target_layer_ids(L, 5)
    g = torch.Generator(device="cuda")
    g.manual_seed(a.seed)
    ids = torch.randint(0, c["vocab_size"], (a.seqs, a.T), device="cuda", generator=g)
    flops = (gptoss_prefill_flops if gpt_oss else moe_prefill_flops)(c, [a.T] * a.seqs)

    def run():
        with torch.inference_mode():
            o = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            return torch.cat([o.hidden_states[l + 1] for l in layer_ids], dim=-1)

    for impl in [x for x in a.impl.split(",") if x]:
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
        result(f"{'gptoss' if gpt_oss else 'moe'}_prefill_{a.seqs}x{a.T}", experts=impl, ms=ms, tokens_per_s=a.seqs * a.T / ms * 1e3,
               tflops=tf, mfu_989=tf / PEAK_TFLOPS, layers=L, reps=reps, first_ms=first * 1e3,
               peak_gib=torch.cuda.max_memory_allocated() / 2**30)


if __name__ == "__main__":
    main()
