#!/usr/bin/env python3
"""An independent float64 reading of MiniMax-M2's forward (transformers' models/minimax_m2, vLLM's minimax_m2.py as
served), in plain PyTorch (no transformers: runs with Debian's torch 1.13), and the tiny golden it makes:

    python3 tools/ref_minimax_m2.py [--out tests/golden/target_minimax_m2]

What it reads the model as (transformers' MiniMaxM2DecoderLayer, MiniMaxM2Attention, MiniMaxM2TopKRouter,
MiniMaxM2Experts; the published config.json's keys):
  h = embed(ids)
  per layer:  x = RMSNorm_in(h)
              q = RMSNorm_q(x Wq^T) over all nh*d channels at once (qk_norm_type "per_layer": weight [nh d]),
              k = RMSNorm_k(x Wk^T) over all nkv*d channels (weight [nkv d]), v = x Wv^T
              RoPE (rotate_half) on the first rotary_dim dims of every head, theta rope_theta,
              inv_freq[i] = theta^(-2i / rotary_dim); causal GQA softmax attention, scale d^-1/2; h += o Wo^T
              x = RMSNorm_post(h); p = sigmoid(x Wr^T); chosen = top k of p + e_score_correction_bias;
              w_j = p[chosen_j] / sum_j p[chosen_j]; h += sum_j w_j W2_e (silu(W1_e x) * W3_e x)
  final RMSNorm, lm_head.  RMSNorm: y = w * x / sqrt(mean(x^2) + eps).

The directory it writes (tests/golden/target_minimax_m2):
  config.json          the published key layout (MiniMaxAI/MiniMax-M2.5's config.json, shapes made tiny): rotary_dim,
                       use_qk_norm, qk_norm_type per_layer, scoring_func sigmoid, use_routing_bias, attn_type_list,
                       shared_intermediate_size 0, num_mtp_modules 1 / mtp_transformer_layers 1 / use_mtp
  model.safetensors    F32 weights under the published names (block_sparse_moe.gate.weight,
                       block_sparse_moe.e_score_correction_bias, block_sparse_moe.experts.{e}.w1/w3/w2.weight, ...)
                       plus the MTP module's tensors model.layers.{L}.* (zeros), which a reader must ignore by name
  golden.safetensors   tools/make_goldens.py's format: input_ids, hidden_states.k (k = 0..L, the last normed),
                       layer_output.l, final_hidden, logits, kv_decode_logits (prefill 36, then 4 tokens one at a time
                       through this script's own KV cache), router_topk.l (the experts chosen, in descending order of
                       p + bias, ties to the lower index), rope_inv_freq
The correction bias is drawn large enough to change the choice: the script checks that in every layer the experts
chosen with the bias differ from those of p alone for some tokens, and that no token's k-th and (k+1)-th choice
values are closer than 1e-4 (so an fp32 reader chooses the same experts).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct

import torch

torch.set_default_dtype(torch.float64)

SEQ, PREFILL = 40, 36
CFG = {
    "architectures": ["MiniMaxM2ForCausalLM"],
    "attn_type_list": [1, 1, 1, 1],
    "auto_map": {"AutoConfig": "configuration_minimax_m2.MiniMaxM2Config",
                 "AutoModelForCausalLM": "modeling_minimax_m2.MiniMaxM2ForCausalLM"},
    "bos_token_id": None,
    "eos_token_id": 1,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 32,
    "max_position_embeddings": 128,
    "model_type": "minimax_m2",
    "mtp_transformer_layers": 1,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "num_mtp_modules": 1,
    "qk_norm_type": "per_layer",
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "rotary_dim": 16,
    "scoring_func": "sigmoid",
    "shared_intermediate_size": 0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_cache": True,
    "use_mtp": True,
    "use_qk_norm": True,
    "use_routing_bias": True,
    "vocab_size": 512,
}


# ------------------------------------------------------------------------------------------------------------
# safetensors by hand (no safetensors package here)
# ------------------------------------------------------------------------------------------------------------

def write_safetensors(path: str, tensors: dict, metadata: dict | None = None) -> None:
    """Tensors in the dict's order: bfloat16 as BF16, other floats as F32, integers as I32 (also used by
    ref_deepseek_v3.py and ref_int4.py)."""
    header, chunks, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if t.dtype == torch.bfloat16:
            data, dt = t.view(torch.int16).numpy().tobytes(), "BF16"
        elif t.is_floating_point():
            data, dt = t.to(torch.float32).numpy().tobytes(), "F32"
        else:
            data, dt = t.to(torch.int32).numpy().tobytes(), "I32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


# ------------------------------------------------------------------------------------------------------------
# weights
# ------------------------------------------------------------------------------------------------------------

def f32_round(t: torch.Tensor) -> torch.Tensor:
    """What the F32 file holds, back in float64."""
    return t.to(torch.float32).to(torch.float64)


def make_weights(cfg: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    H, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh, nkv, d, V, E = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"],
                        cfg["num_local_experts"])

    def rn(*shape, std=1.0, mean=0.0):
        return f32_round(mean + std * torch.randn(*shape, generator=g))

    w = {"model.embed_tokens.weight": rn(V, H), "model.norm.weight": rn(H, std=0.1, mean=1.0),
         "lm_head.weight": rn(V, H, std=H ** -0.5)}
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = rn(H, std=0.1, mean=1.0)
        w[p + "post_attention_layernorm.weight"] = rn(H, std=0.1, mean=1.0)
        w[p + "self_attn.q_proj.weight"] = rn(nh * d, H, std=H ** -0.5)
        w[p + "self_attn.k_proj.weight"] = rn(nkv * d, H, std=H ** -0.5)
        w[p + "self_attn.v_proj.weight"] = rn(nkv * d, H, std=H ** -0.5)
        w[p + "self_attn.o_proj.weight"] = rn(H, nh * d, std=(nh * d) ** -0.5)
        w[p + "self_attn.q_norm.weight"] = rn(nh * d, std=0.2, mean=1.0)  # over all heads: [nh d]
        w[p + "self_attn.k_norm.weight"] = rn(nkv * d, std=0.2, mean=1.0)
        m = p + "block_sparse_moe."
        w[m + "gate.weight"] = rn(E, H, std=1.5 * H ** -0.5)
        w[m + "e_score_correction_bias"] = rn(E, std=0.15)
        for e in range(E):
            w[m + f"experts.{e}.w1.weight"] = rn(I, H, std=H ** -0.5)
            w[m + f"experts.{e}.w3.weight"] = rn(I, H, std=H ** -0.5)
            w[m + f"experts.{e}.w2.weight"] = rn(H, I, std=I ** -0.5)
    return w


# ------------------------------------------------------------------------------------------------------------
# the forward
# ------------------------------------------------------------------------------------------------------------

def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def inv_freq(cfg: dict) -> torch.Tensor:
    rd = cfg["rotary_dim"]
    return 1.0 / (float(cfg["rope_theta"]) ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))


def rope(x: torch.Tensor, pos: torch.Tensor, cfg: dict) -> torch.Tensor:
    """x [T, heads, d]: the first rotary_dim dims turned as transformers' rotate_half (pairs i, i + rd/2)."""
    rd = cfg["rotary_dim"]
    ang = pos.to(torch.float64)[:, None] * inv_freq(cfg)[None, :]           # [T, rd/2]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    x1, x2, rest = x[..., :rd // 2], x[..., rd // 2:rd], x[..., rd:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def route(x: torch.Tensor, w: dict, m: str, k: int):
    """p = sigmoid(x Wr^T); the top k of p + bias (descending, ties to the lower index); weights p renormalised."""
    p = torch.sigmoid(x @ w[m + "gate.weight"].T)                            # [T, E]
    c = p + w[m + "e_score_correction_bias"][None, :]
    E = p.shape[1]
    idx = torch.empty(x.shape[0], k, dtype=torch.int64)
    margin = math.inf
    for t in range(x.shape[0]):
        order = sorted(range(E), key=lambda e: (-float(c[t, e]), e))
        idx[t] = torch.tensor(order[:k])
        margin = min(margin, float(c[t, order[k - 1]] - c[t, order[k]]))
    pw = p.gather(1, idx)
    return idx, pw / pw.sum(-1, keepdim=True), p, margin


def moe(x: torch.Tensor, w: dict, m: str, k: int):
    idx, wt, p, margin = route(x, w, m, k)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            e = int(idx[t, j])
            ex = m + f"experts.{e}."
            a = torch.nn.functional.silu(x[t] @ w[ex + "w1.weight"].T) * (x[t] @ w[ex + "w3.weight"].T)
            out[t] += wt[t, j] * (a @ w[ex + "w2.weight"].T)
    # the choice without the bias, to show the bias matters
    plain = torch.topk(p, k, dim=-1).indices.sort(-1).values
    differs = int((plain != idx.sort(-1).values).any(-1).sum())
    return out, idx, margin, differs


class Cache:
    def __init__(self, L: int):
        self.k = [None] * L
        self.v = [None] * L


def forward(cfg: dict, w: dict, ids: torch.Tensor, start: int = 0, cache: Cache | None = None) -> dict:
    """ids [T] at positions start .. start + T - 1; with a cache, the keys / values of earlier positions come from it
    and these rows' are appended."""
    H, L, nh, nkv, d, k = (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                           cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_experts_per_tok"])
    eps = cfg["rms_norm_eps"]
    T = ids.numel()
    pos = torch.arange(start, start + T)
    h = w["model.embed_tokens.weight"][ids.long()]
    hs, outs, topk, margins, differs = [h.clone()], [], [], [], []
    for l in range(L):
        p = f"model.layers.{l}."
        x = rmsnorm(h, w[p + "input_layernorm.weight"], eps)
        q = rmsnorm(x @ w[p + "self_attn.q_proj.weight"].T, w[p + "self_attn.q_norm.weight"], eps).reshape(T, nh, d)
        kk = rmsnorm(x @ w[p + "self_attn.k_proj.weight"].T, w[p + "self_attn.k_norm.weight"], eps).reshape(T, nkv, d)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, d)
        q, kk = rope(q, pos, cfg), rope(kk, pos, cfg)
        if cache is not None:
            if cache.k[l] is not None:
                kk = torch.cat([cache.k[l], kk])
                v = torch.cat([cache.v[l], v])
            cache.k[l], cache.v[l] = kk, v
        S = kk.shape[0]
        kpos = torch.arange(S)
        o = torch.empty(T, nh, d)
        for hd in range(nh):
            g = hd // (nh // nkv)
            s = (q[:, hd, :] @ kk[:, g, :].T) / math.sqrt(d)                    # [T, S]
            s = s.masked_fill(kpos[None, :] > pos[:, None], -math.inf)
            o[:, hd, :] = torch.softmax(s, -1) @ v[:, g, :]
        h = h + o.reshape(T, nh * d) @ w[p + "self_attn.o_proj.weight"].T
        x = rmsnorm(h, w[p + "post_attention_layernorm.weight"], eps)
        y, idx, margin, dif = moe(x, w, p + "block_sparse_moe.", k)
        h = h + y
        outs.append(h.clone())
        topk.append(idx)
        margins.append(margin)
        differs.append(dif)
        if l + 1 < L:
            hs.append(h.clone())
    fin = rmsnorm(h, w["model.norm.weight"], eps)
    hs.append(fin)
    return {"hidden_states": hs, "layer_output": outs, "final_hidden": fin, "logits": fin @ w["lm_head.weight"].T,
            "router_topk": topk, "margins": margins, "differs": differs}


# ------------------------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/golden/target_minimax_m2")
    ap.add_argument("--seed", type=int, default=3001)
    a = ap.parse_args()
    return main_for(a.out, a.seed)


def main_for(out: str, seed: int = 3001) -> int:
    """Writes the directory `out` (config.json, model.safetensors, golden.safetensors); 0 on success."""
    a = argparse.Namespace(out=out, seed=seed)
    cfg = CFG
    w = make_weights(cfg, a.seed)
    ids = torch.randint(0, cfg["vocab_size"], (SEQ,), generator=torch.Generator().manual_seed(a.seed + 7))
    full = forward(cfg, w, ids)
    k, L = cfg["num_experts_per_tok"], cfg["num_hidden_layers"]
    ok = True
    for l in range(L):
        print(f"layer {l}: tokens whose experts the bias changes {full['differs'][l]}/{SEQ}, "
              f"smallest choice margin {full['margins'][l]:.2e}")
        if full["differs"][l] == 0 or full["margins"][l] < 1e-4:
            ok = False
    if not ok:
        print("FAILED: the correction bias must change the choice in every layer, with margins >= 1e-4")
        return 1
    # the cached decode: prefill, then one token at a time through this script's own KV cache
    cache = Cache(L)
    forward(cfg, w, ids[:PREFILL], 0, cache)
    dec = []
    for t in range(PREFILL, SEQ):
        dec.append(forward(cfg, w, ids[t:t + 1], t, cache)["logits"][0])
    kv = torch.stack(dec)
    dkv = float((kv - full["logits"][PREFILL:]).abs().max())
    print(f"cached decode vs full forward: max abs diff {dkv:.2e}")
    if dkv > 1e-10:
        print("FAILED: cached decode differs")
        return 1

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    weights = dict(w)
    # the MTP module the published checkpoints carry after the decoder's layers: to be ignored by name
    H = cfg["hidden_size"]
    mtp = f"model.layers.{L}."
    weights[mtp + "input_layernorm.weight"] = torch.zeros(H)
    weights[mtp + "self_attn.q_proj.weight"] = torch.zeros(cfg["num_attention_heads"] * cfg["head_dim"], H)
    write_safetensors(os.path.join(a.out, "model.safetensors"), weights, {"format": "pt"})
    g = {"input_ids": ids.to(torch.int32)}
    for i, h in enumerate(full["hidden_states"]):
        g[f"hidden_states.{i}"] = h
    for l in range(L):
        g[f"layer_output.{l}"] = full["layer_output"][l]
    g["final_hidden"] = full["final_hidden"]
    g["logits"] = full["logits"]
    g["kv_decode_logits"] = kv
    for l in range(L):
        g[f"router_topk.{l}"] = full["router_topk"][l].to(torch.int32)
    g["rope_inv_freq"] = inv_freq(cfg)
    md = {
        "description": "tools/ref_minimax_m2.py: an independent float64 plain-PyTorch forward of MiniMax-M2 "
                       "(transformers' models/minimax_m2) on the F32 weights of this directory; stored as F32",
        "input_ids": f"I32 [{SEQ}] random ids, torch.Generator seed {a.seed + 7}",
        "hidden_states.k": "HF output_hidden_states[k], k = 0..L (the last normed)",
        "layer_output.l": "residual stream after decoder layer l",
        "kv_decode_logits": f"[{SEQ - PREFILL}, V]: prefill {PREFILL} tokens into a KV cache, then one at a time",
        "router_topk.l": f"I32 [S, {k}]: the experts chosen (top k of sigmoid + correction bias, descending, ties to "
                         "the lower index)",
        "tokens_whose_choice_the_bias_changes": json.dumps(full["differs"]),
        "smallest_choice_margin": json.dumps([float(f"{m:.3e}") for m in full["margins"]]),
        "max_abs_diff_kv_decode_vs_forward": f"{dkv:.3e}",
        "torch_version": torch.__version__,
    }
    write_safetensors(os.path.join(a.out, "golden.safetensors"), g, md)
    print(f"wrote {a.out}: config.json, model.safetensors, golden.safetensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
