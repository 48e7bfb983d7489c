#!/usr/bin/env python3
"""An independent float64 reading of DeepSeek-V3's forward (transformers 5's models/deepseek_v3: DeepseekV3Attention,
DeepseekV3MoE, DeepseekV3TopkRouter; vLLM's deepseek_v2.py as served), in plain PyTorch (no transformers: runs with
Debian's torch 1.13), and the tiny goldens it makes:

    python3 tools/ref_deepseek_v3.py [--out tests/golden]      # writes target_deepseek_v3 and target_deepseek_v3_kimi

What it reads the model as:
  h = embed(ids)
  per layer:  x = RMSNorm_in(h)
              q = q_b_proj(RMSNorm_qa(q_a_proj x)) (or q_proj x without q_lora_rank), per head [q_pass (nope) | q_rot]
              c, k_rot = split(kv_a_proj_with_mqa x, [kv_lora_rank, rope]); kv = kv_b_proj(RMSNorm_kva(c)), per head
              [k_pass (nope) | v (dv)]; RMSNorm_qa / RMSNorm_kva with eps 1e-6 (DeepseekV3RMSNorm's default)
              rope_interleave: q_rot, k_rot reordered view(r/2, 2).transpose -> [evens | odds] (transformers'
              apply_rotary_pos_emb_interleave), then rotate-half RoPE with cos, sin = cos(pos inv_freq) af,
              sin(pos inv_freq) af (af: YaRN's attention factor); k_rot one head, broadcast to all
              q = [q_pass | q_rot], k = [k_pass | k_rot]; softmax(q k^T s + causal) v, s = (nope + rope)^-1/2 x
              yarn_get_mscale(factor, mscale_all_dim)^2; h += o_proj(o)
              x = RMSNorm_post(h); layers < first_k_dense_replace: h += down(silu(gate x) * up x)
              else p = sigmoid(x Wg^T); c = p + e_score_correction_bias; group score = the sum of each group's two
              largest c; the topk_group best groups kept; the top k of c among their experts; w = p[chosen] /
              (sum + 1e-20) x routed_scaling_factor; h += sum_j w_j expert_j(x) + shared_experts(x)
  final RMSNorm, lm_head.  RMSNorm: y = w * x / sqrt(mean(x^2) + eps).
  RoPE frequencies and angles in float32 as transformers forms them (_compute_yarn_parameters, the rotary
  embedding's inv_freq @ position_ids in float32); everything else float64.

Two directories (tests/golden/<name>: config.json with the published key layout, model.safetensors, golden.safetensors
in tools/make_goldens.py's format, as tools/ref_minimax_m2.py):
  target_deepseek_v3       DeepSeek-V3's config.json shapes made tiny: q_lora_rank 24, YaRN with mscale 1.0 and
                           mscale_all_dim 0.707 (an attention factor != 1 and a scale != (nope+rope)^-1/2),
                           rope_interleave, 16 experts top-4 in 4 groups top-2, one dense layer, one MTP layer
  target_deepseek_v3_kimi  Kimi-K2's layout (model_type kimi_k2): q_lora_rank null (q_proj), rope_interleave false,
                           default RoPE, n_group 1, routed_scaling_factor 2.827, no MTP layer
golden.safetensors: input_ids, hidden_states.k, layer_output.l, final_hidden, logits, kv_decode_logits (prefill 36,
then 4 tokens one at a time through this script's own KV cache of expanded k / v), router_topk.l (MoE layers: the
experts chosen, in descending order of c, ties to the lower index), rope_inv_freq.
The script checks in every MoE layer that the choice margins (k-th vs (k+1)-th c among the kept experts; the kept vs
the first dropped group's score) are >= 1e-4, that the bias changes the choice of some tokens, that with groups the
group limit changes the choice of some tokens, and that transformers' masked_fill(0.0) and the served -inf mask
choose the same experts.
"""
from __future__ import annotations

import argparse
import json
import math
import os

import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# safetensors by hand, the F32 rounding of the weights, RMSNorm, the per-layer KV cache
from ref_minimax_m2 import Cache, f32_round, rmsnorm, write_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)

SEQ, PREFILL = 40, 36

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "kv_lora_rank": 32,
    "max_position_embeddings": 64,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 16,
    "moe_layer_freq": 1,
    "n_group": 4,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1,
    "pretraining_tp": 1,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4, "mscale": 1.0, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 16, "type": "yarn"},
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "torch_dtype": "float32",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 16,
    "vocab_size": 512,
}


def kimi_config() -> dict:
    c = dict(DEEPSEEK_V3)
    c.update({"model_type": "kimi_k2", "q_lora_rank": None, "rope_interleave": False, "n_group": 1, "topk_group": 1,
              "routed_scaling_factor": 2.827, "num_nextn_predict_layers": 0, "rope_theta": 50000.0})
    del c["rope_scaling"]
    return c


# ------------------------------------------------------------------------------------------------------------
# weights
# ------------------------------------------------------------------------------------------------------------

def make_weights(cfg: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nh, E, Ie = cfg["num_attention_heads"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    nope, r, dv, kvr, qr = (cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"],
                            cfg["q_lora_rank"])
    dq = nope + r

    def rn(*shape, std=1.0, mean=0.0):
        return f32_round(mean + std * torch.randn(*shape, generator=g))

    w = {"model.embed_tokens.weight": rn(V, H), "model.norm.weight": rn(H, std=0.1, mean=1.0),
         "lm_head.weight": rn(V, H, std=H ** -0.5)}
    for l in range(L):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        w[p + "input_layernorm.weight"] = rn(H, std=0.1, mean=1.0)
        w[p + "post_attention_layernorm.weight"] = rn(H, std=0.1, mean=1.0)
        if qr is None:
            w[a + "q_proj.weight"] = rn(nh * dq, H, std=H ** -0.5)
        else:
            w[a + "q_a_proj.weight"] = rn(qr, H, std=H ** -0.5)
            w[a + "q_a_layernorm.weight"] = rn(qr, std=0.1, mean=1.0)
            w[a + "q_b_proj.weight"] = rn(nh * dq, qr, std=qr ** -0.5)
        w[a + "kv_a_proj_with_mqa.weight"] = rn(kvr + r, H, std=H ** -0.5)
        w[a + "kv_a_layernorm.weight"] = rn(kvr, std=0.1, mean=1.0)
        w[a + "kv_b_proj.weight"] = rn(nh * (nope + dv), kvr, std=kvr ** -0.5)
        w[a + "o_proj.weight"] = rn(H, nh * dv, std=(nh * dv) ** -0.5)
        m = p + "mlp."
        if l < cfg["first_k_dense_replace"]:
            w[m + "gate_proj.weight"] = rn(I, H, std=H ** -0.5)
            w[m + "up_proj.weight"] = rn(I, H, std=H ** -0.5)
            w[m + "down_proj.weight"] = rn(H, I, std=I ** -0.5)
            continue
        w[m + "gate.weight"] = rn(E, H, std=1.5 * H ** -0.5)
        w[m + "gate.e_score_correction_bias"] = rn(E, std=0.1, mean=0.3)
        for e in range(E):
            w[m + f"experts.{e}.gate_proj.weight"] = rn(Ie, H, std=H ** -0.5)
            w[m + f"experts.{e}.up_proj.weight"] = rn(Ie, H, std=H ** -0.5)
            w[m + f"experts.{e}.down_proj.weight"] = rn(H, Ie, std=Ie ** -0.5)
        Is = Ie * cfg["n_shared_experts"]
        w[m + "shared_experts.gate_proj.weight"] = rn(Is, H, std=H ** -0.5)
        w[m + "shared_experts.up_proj.weight"] = rn(Is, H, std=H ** -0.5)
        w[m + "shared_experts.down_proj.weight"] = rn(H, Is, std=Is ** -0.5)
    return w


# ------------------------------------------------------------------------------------------------------------
# RoPE: transformers' _compute_default_rope_parameters / _compute_yarn_parameters, in float32
# ------------------------------------------------------------------------------------------------------------

def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_params(cfg: dict):
    """(inv_freq float32 [r/2], attention_factor) over dim = qk_rope_head_dim (DeepseekV3Config.head_dim)."""
    dim, base = cfg["qk_rope_head_dim"], float(cfg["rope_theta"])
    rs = cfg.get("rope_scaling")
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim)
    if not rs:
        return 1.0 / pos_freqs, 1.0
    factor = float(rs["factor"])
    mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
    af = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all) if mscale and mscale_all else \
        yarn_get_mscale(factor)
    orig = rs["original_max_position_embeddings"]

    def corr(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = math.floor(corr(rs.get("beta_fast") or 32)), math.ceil(corr(rs.get("beta_slow") or 1))
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, af


def softmax_scale(cfg: dict) -> float:
    s = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        m = yarn_get_mscale(float(rs["factor"]), rs["mscale_all_dim"])
        s = s * m * m
    return s


def rope(x: torch.Tensor, pos: torch.Tensor, cfg: dict) -> torch.Tensor:
    """x [T, heads, r] turned as transformers (interleaved pairs reordered first when rope_interleave)."""
    inv, af = rope_params(cfg)
    ang = (pos.to(torch.float32)[:, None] * inv[None, :]).to(torch.float64)  # float32 angles, as transformers
    emb = torch.cat([ang, ang], -1)
    cos, sin = (torch.cos(emb) * af)[:, None, :], (torch.sin(emb) * af)[:, None, :]
    T, nh, r = x.shape
    if cfg.get("rope_interleave", True):
        x = x.reshape(T, nh, r // 2, 2).transpose(2, 3).reshape(T, nh, r)
    rot = torch.cat([-x[..., r // 2:], x[..., :r // 2]], -1)
    return x * cos + rot * sin


# ------------------------------------------------------------------------------------------------------------
# the forward
# ------------------------------------------------------------------------------------------------------------

def mlp(x: torch.Tensor, w: dict, p: str) -> torch.Tensor:
    return (torch.nn.functional.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ \
        w[p + "down_proj.weight"].T


def route(x: torch.Tensor, w: dict, m: str, cfg: dict):
    """DeepseekV3MoE.route_tokens_to_experts, with the margins and the checks of the docstring."""
    E, k, ng, tg = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]
    gs = E // ng
    p = torch.sigmoid(x @ w[m + "gate.weight"].T)                              # [T, E]
    c = p + w[m + "gate.e_score_correction_bias"][None, :]
    T = x.shape[0]
    idx = torch.empty(T, k, dtype=torch.int64)
    st = {"margin": math.inf, "gmargin": math.inf, "bias": 0, "groups": 0, "mask0": 0}
    for t in range(T):
        gsc = [sorted([float(c[t, g * gs + i]) for i in range(gs)], reverse=True) for g in range(ng)]
        gsc = [v[0] + v[1] if gs >= 2 else v[0] for v in gsc]
        gord = sorted(range(ng), key=lambda g: (-gsc[g], g))
        kept = set(gord[:tg])
        if tg < ng:
            st["gmargin"] = min(st["gmargin"], gsc[gord[tg - 1]] - gsc[gord[tg]])
        cand = [e for e in range(E) if e // gs in kept]
        order = sorted(cand, key=lambda e: (-float(c[t, e]), e))
        idx[t] = torch.tensor(order[:k])
        if len(order) > k:
            st["margin"] = min(st["margin"], float(c[t, order[k - 1]] - c[t, order[k]]))
        # transformers' masked_fill(0.0): the same choice?
        masked = torch.where(torch.tensor([e // gs in kept for e in range(E)]), c[t], torch.zeros(E))
        z = sorted(range(E), key=lambda e: (-float(masked[e]), e))[:k]
        st["mask0"] += sorted(z) != sorted(order[:k])
        plain = sorted(sorted(range(E), key=lambda e: (-float(p[t, e]), e))[:k])
        st["bias"] += plain != sorted(order[:k])
        free = sorted(sorted(range(E), key=lambda e: (-float(c[t, e]), e))[:k])
        st["groups"] += free != sorted(order[:k])
    pw = p.gather(1, idx)
    if cfg["norm_topk_prob"]:
        pw = pw / (pw.sum(-1, keepdim=True) + 1e-20)
    return idx, pw * cfg["routed_scaling_factor"], st


def moe(x: torch.Tensor, w: dict, m: str, cfg: dict):
    idx, wt, st = route(x, w, m, cfg)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            out[t] += wt[t, j] * mlp(x[t], w, m + f"experts.{int(idx[t, j])}.")
    return out + mlp(x, w, m + "shared_experts."), idx, st


def attention(x: torch.Tensor, w: dict, a: str, pos: torch.Tensor, cfg: dict, cache: Cache | None, l: int):
    nh, nope, r, dv, kvr = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                            cfg["v_head_dim"], cfg["kv_lora_rank"])
    T = x.shape[0]
    if cfg["q_lora_rank"] is None:
        q = x @ w[a + "q_proj.weight"].T
    else:
        q = rmsnorm(x @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], 1e-6) @ w[a + "q_b_proj.weight"].T
    q = q.reshape(T, nh, nope + r)
    ckv = x @ w[a + "kv_a_proj_with_mqa.weight"].T
    c, k_rot = ckv[:, :kvr], ckv[:, kvr:]
    kv = (rmsnorm(c, w[a + "kv_a_layernorm.weight"], 1e-6) @ w[a + "kv_b_proj.weight"].T).reshape(T, nh, nope + dv)
    k_pass, v = kv[..., :nope], kv[..., nope:]
    q = torch.cat([q[..., :nope], rope(q[..., nope:], pos, cfg)], -1)
    k_rot = rope(k_rot.reshape(T, 1, r), pos, cfg).expand(T, nh, r)
    k = torch.cat([k_pass, k_rot], -1)
    if cache is not None:
        if cache.k[l] is not None:
            k, v = torch.cat([cache.k[l], k]), torch.cat([cache.v[l], v])
        cache.k[l], cache.v[l] = k, v
    kpos = torch.arange(k.shape[0])
    o = torch.empty(T, nh, dv)
    s = softmax_scale(cfg)
    for hd in range(nh):
        sc = (q[:, hd, :] @ k[:, hd, :].T) * s
        sc = sc.masked_fill(kpos[None, :] > pos[:, None], -math.inf)
        o[:, hd, :] = torch.softmax(sc, -1) @ v[:, hd, :]
    return o.reshape(T, nh * dv) @ w[a + "o_proj.weight"].T


def forward(cfg: dict, w: dict, ids: torch.Tensor, start: int = 0, cache: Cache | None = None) -> dict:
    L, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    T = ids.numel()
    pos = torch.arange(start, start + T)
    h = w["model.embed_tokens.weight"][ids.long()]
    hs, outs, topk, stats = [h.clone()], [], {}, {}
    for l in range(L):
        p = f"model.layers.{l}."
        h = h + attention(rmsnorm(h, w[p + "input_layernorm.weight"], eps), w, p + "self_attn.", pos, cfg, cache, l)
        x = rmsnorm(h, w[p + "post_attention_layernorm.weight"], eps)
        if l < cfg["first_k_dense_replace"]:
            h = h + mlp(x, w, p + "mlp.")
        else:
            y, idx, st = moe(x, w, p + "mlp.", cfg)
            h = h + y
            topk[l], stats[l] = idx, st
        outs.append(h.clone())
        if l + 1 < L:
            hs.append(h.clone())
    fin = rmsnorm(h, w["model.norm.weight"], eps)
    hs.append(fin)
    return {"hidden_states": hs, "layer_output": outs, "final_hidden": fin, "logits": fin @ w["lm_head.weight"].T,
            "router_topk": topk, "stats": stats}


# ------------------------------------------------------------------------------------------------------------

def write_dir(out: str, cfg: dict, seed: int) -> int:
    """Writes the directory `out` (config.json, model.safetensors, golden.safetensors); 0 on success."""
    w = make_weights(cfg, seed)
    ids = torch.randint(0, cfg["vocab_size"], (SEQ,), generator=torch.Generator().manual_seed(seed + 7))
    full = forward(cfg, w, ids)
    ok = True
    for l, st in full["stats"].items():
        print(f"{out} layer {l}: the bias changes the experts of {st['bias']}/{SEQ} tokens, the groups of "
              f"{st['groups']}/{SEQ}; masked_fill(0.0) differs for {st['mask0']}; margins {st['margin']:.2e} "
              f"(groups {st['gmargin']:.2e})")
        if st["bias"] == 0 or st["mask0"] or st["margin"] < 1e-4 or st["gmargin"] < 1e-4 or \
                (cfg["n_group"] > 1 and st["groups"] == 0):
            ok = False
    if not ok:
        print("FAILED: the choice checks of the docstring")
        return 1
    L = cfg["num_hidden_layers"]
    cache = Cache(L)
    forward(cfg, w, ids[:PREFILL], 0, cache)
    dec = [forward(cfg, w, ids[t:t + 1], t, cache)["logits"][0] for t in range(PREFILL, SEQ)]
    kv = torch.stack(dec)
    dkv = float((kv - full["logits"][PREFILL:]).abs().max())
    print(f"cached decode vs full forward: max abs diff {dkv:.2e}")
    if dkv > 1e-10:
        print("FAILED: cached decode differs")
        return 1

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    weights = dict(w)
    H = cfg["hidden_size"]
    for i in range(cfg.get("num_nextn_predict_layers", 0)):  # the MTP layer: to be ignored by name
        mtp = f"model.layers.{L + i}."
        weights[mtp + "enorm.weight"] = torch.zeros(H)
        weights[mtp + "eh_proj.weight"] = torch.zeros(H, 2 * H)
    write_safetensors(os.path.join(out, "model.safetensors"), weights, {"format": "pt"})
    g = {"input_ids": ids.to(torch.int32)}
    for i, h in enumerate(full["hidden_states"]):
        g[f"hidden_states.{i}"] = h
    for l in range(L):
        g[f"layer_output.{l}"] = full["layer_output"][l]
    g["final_hidden"] = full["final_hidden"]
    g["logits"] = full["logits"]
    g["kv_decode_logits"] = kv
    for l, idx in full["router_topk"].items():
        g[f"router_topk.{l}"] = idx.to(torch.int32)
    g["rope_inv_freq"] = rope_params(cfg)[0]
    st = full["stats"]
    md = {
        "description": "tools/ref_deepseek_v3.py: an independent float64 plain-PyTorch forward of DeepSeek-V3 "
                       "(transformers' models/deepseek_v3) on the F32 weights of this directory; stored as F32",
        "input_ids": f"I32 [{SEQ}] random ids, torch.Generator seed {seed + 7}",
        "hidden_states.k": "HF output_hidden_states[k], k = 0..L (the last normed)",
        "layer_output.l": "residual stream after decoder layer l",
        "kv_decode_logits": f"[{SEQ - PREFILL}, V]: prefill {PREFILL} tokens into a KV cache, then one at a time",
        "router_topk.l": f"I32 [S, {cfg['num_experts_per_tok']}] (MoE layers): the experts chosen (top k of sigmoid + "
                         "correction bias within the kept groups, descending, ties to the lower index)",
        "tokens_whose_choice_the_bias_changes": json.dumps({l: s["bias"] for l, s in st.items()}),
        "tokens_whose_choice_the_groups_change": json.dumps({l: s["groups"] for l, s in st.items()}),
        "softmax_scale": f"{softmax_scale(cfg):.17g}",
        "rope_attention_factor": f"{rope_params(cfg)[1]:.17g}",
        "max_abs_diff_kv_decode_vs_forward": f"{dkv:.3e}",
        "torch_version": torch.__version__,
    }
    write_safetensors(os.path.join(out, "golden.safetensors"), g, md)
    print(f"wrote {out}: config.json, model.safetensors, golden.safetensors")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--seed", type=int, default=4001)
    a = ap.parse_args()
    rc = write_dir(os.path.join(a.out, "target_deepseek_v3"), DEEPSEEK_V3, a.seed)
    return rc or write_dir(os.path.join(a.out, "target_deepseek_v3_kimi"), kimi_config(), a.seed + 100)


if __name__ == "__main__":
    raise SystemExit(main())
