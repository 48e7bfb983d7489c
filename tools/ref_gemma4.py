#!/usr/bin/env python3
"""An independent float64 reading of transformers' Gemma 4 text forward (models/gemma4/modeling_gemma4.py,
Gemma4TextModel / Gemma4ForCausalLM / Gemma4ForConditionalGeneration's language model) in plain PyTorch, and the
tiny random checkpoints + goldens the C++ tests read. Runs anywhere with torch (1.13 is enough); no transformers.

    python3 tools/ref_gemma4.py [--out tests/golden] [--only target_gemma4,...]

Each directory gets config.json (the published key layout), model.safetensors (the published tensor names, F32) and
golden.safetensors in the format of tools/make_goldens.py: input_ids, hidden_states.k, layer_output.l, final_hidden,
logits, kv_decode_logits (prefill 36 tokens with an explicit KV cache, then 4 one at a time), and router_topk.l for
the MoE layers. tools/make_goldens_families.py makes the same directories with transformers itself (GPU machine),
to confirm this reading.

  target_gemma4       Gemma4ForConditionalGeneration (the published class): text weights under model.language_model.,
                      two vision tensors to be ignored, config under text_config; 5 layers sliding (window 8) / full
                      (sliding, sliding, full, sliding, full), head_dim 16 / global_head_dim 32, kv heads 2 / global 1
                      with attention_k_eq_v, proportional RoPE (partial 0.25: 8 of 32 dims turn), GELU-tanh MLP,
                      tied embedding, final_logit_softcapping 15 (the tiny logits reach its bend), layer_scalar != 1.
  target_gemma4_text  Gemma4ForCausalLM (model.* names), attention_k_eq_v false (v_proj on full layers, kv heads 2),
                      untied lm_head, no softcap.
  target_gemma4_moe   Gemma4ForConditionalGeneration with enable_moe_block: every layer's dense MLP beside 8 experts
                      top-2 (router: weightless RMSNorm x scale x H^-0.5, softmax, top-k renormalised, x
                      per_expert_scale), each side with its own norms.

What the reading follows (transformers 5.x modeling_gemma4.py):
  h0 = embed[ids] * float32(sqrt(H))                          Gemma4TextScaledWordEmbedding (a float32 buffer)
  per layer: h += RMS_po(attn(RMS_in(h)));  r = h
             m = mlp(RMS_pre(h))  [MoE: m = RMS_pf1(m) + RMS_pf2(experts(RMS_pre2(r)), router(r))]
             h = r + RMS_pf(m);  h *= layer_scalar
  attn: q = RoPE(RMS_q(x Wq)); k = RoPE(RMS_k(x Wk)); v = RMS(x Wv or, k_eq_v, x Wk) without weight; scores q k^T
        (scale 1); sliding layers: key j visible from query i iff i - W < j <= i; GQA.
  RMSNorm: x (mean(x^2) + eps)^-1/2 w (w, not 1 + w). logits = cap tanh(final @ lm_head^T / cap).
  RoPE: rotate-half; angles pos * inv_freq computed in float32 and cos / sin in float32 as transformers does (the only
  float32 here); sliding: inv_freq[i] = theta^(-2i/d); full ("proportional"): theta^(-2i/gd) for i < rope_angles =
  int(partial * gd // 2), 0 after.
Metadata records that transformers itself computes its RMSNorms in float32 inside a float64 model (the GPU golden will
carry ~1e-7 of that); this reference does not.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys

import torch

SEQ, PREFILL = 40, 36
F64 = torch.float64


# ------------------------------------------------------------------------------------------------------------
# safetensors (written by hand: the format is an 8-byte header size, a JSON header, then the raw data)
# ------------------------------------------------------------------------------------------------------------

def save_safetensors(tensors: dict, path: str, metadata: dict | None = None) -> None:
    names = {torch.float32: "F32", torch.int32: "I32", torch.float64: "F64"}
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu()
        b = t.numpy().tobytes()
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ------------------------------------------------------------------------------------------------------------
# The tiny configs (Gemma4TextConfig keys as published)
# ------------------------------------------------------------------------------------------------------------

def text_config(name: str) -> dict:
    moe = name == "target_gemma4_moe"
    k_eq_v = name != "target_gemma4_text"
    c = {
        "model_type": "gemma4_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": k_eq_v,
        "bos_token_id": 2,
        "enable_moe_block": moe,
        "eos_token_id": [1, 106],
        "final_logit_softcapping": 15.0 if name != "target_gemma4_text" else None,
        "global_head_dim": 32,
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "hidden_size_per_layer_input": 0,
        "initializer_range": 0.02,
        "intermediate_size": 96 if not moe else 48,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                        "full_attention"],
        "max_position_embeddings": 256,
        "num_attention_heads": 4,
        "num_global_key_value_heads": 1 if k_eq_v else None,
        "num_hidden_layers": 5,
        "num_key_value_heads": 2,
        "num_kv_shared_layers": 0,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 8,
        "tie_word_embeddings": name != "target_gemma4_text",
        "use_bidirectional_attention": "vision" if name != "target_gemma4_text" else None,
        "use_cache": True,
        "use_double_wide_mlp": False,
        "vocab_size": 512,
        "vocab_size_per_layer_input": 512,
    }
    if moe:
        c.update({"num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 32})
    else:
        c.update({"num_experts": None, "top_k_experts": None, "moe_intermediate_size": None})
    return c


def full_config(name: str) -> tuple[dict, bool]:
    """config.json and whether the weights sit under model.language_model. (the image-text class)."""
    t = text_config(name)
    if name == "target_gemma4_text":
        c = dict(t)
        c["architectures"] = ["Gemma4ForCausalLM"]
        c["dtype"] = "float32"
        return c, False
    c = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "dtype": "float32",
        "boi_token_id": 255999, "eoi_token_id": 258882, "image_token_id": 258880, "video_token_id": 258884,
        "audio_token_id": 258881,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "text_config": t,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "head_dim": 8, "intermediate_size": 32},
        "audio_config": None,
    }
    return c, True


# ------------------------------------------------------------------------------------------------------------
# Weights
# ------------------------------------------------------------------------------------------------------------

def make_weights(name: str, cfg: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def n(*shape, std=0.02):
        return (torch.randn(*shape, generator=g, dtype=F64) * std).to(torch.float32)

    def norm(*shape):  # around 1, so a wrong convention (1 + w) or a missed norm shows
        return (1.0 + 0.2 * torch.randn(*shape, generator=g, dtype=F64)).to(torch.float32)

    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nkv, d, gd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["global_head_dim"]
    I = cfg["intermediate_size"]
    w = {"embed": n(V, H, std=0.5), "norm": norm(H)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head"] = n(V, H, std=0.5)
    for l in range(L):
        full = cfg["layer_types"][l] == "full_attention"
        dh = gd if full else d
        kv_eq = cfg["attention_k_eq_v"] and full
        kvh = cfg["num_global_key_value_heads"] if kv_eq else nkv
        p = f"layers.{l}."
        w[p + "input_layernorm"] = norm(H)
        w[p + "post_attention_layernorm"] = norm(H)
        w[p + "pre_feedforward_layernorm"] = norm(H)
        w[p + "post_feedforward_layernorm"] = norm(H)
        w[p + "q_proj"] = n(nh * dh, H, std=0.2)
        w[p + "k_proj"] = n(kvh * dh, H, std=0.2)
        if not kv_eq:
            w[p + "v_proj"] = n(kvh * dh, H, std=0.2)
        w[p + "o_proj"] = n(H, nh * dh, std=0.1)
        w[p + "q_norm"] = norm(dh)
        w[p + "k_norm"] = norm(dh)
        w[p + "gate_proj"] = n(I, H, std=0.2)
        w[p + "up_proj"] = n(I, H, std=0.2)
        w[p + "down_proj"] = n(H, I, std=0.1)
        w[p + "layer_scalar"] = (0.6 + 0.8 * torch.rand(1, generator=g, dtype=F64)).to(torch.float32)
        if cfg["enable_moe_block"]:
            E, Ie = cfg["num_experts"], cfg["moe_intermediate_size"]
            w[p + "router.proj"] = n(E, H, std=0.5)
            w[p + "router.scale"] = norm(H)
            w[p + "router.per_expert_scale"] = (0.5 + torch.rand(E, generator=g, dtype=F64)).to(torch.float32)
            w[p + "experts.gate_up_proj"] = n(E, 2 * Ie, H, std=0.2)
            w[p + "experts.down_proj"] = n(E, H, Ie, std=0.1)
            w[p + "post_feedforward_layernorm_1"] = norm(H)
            w[p + "post_feedforward_layernorm_2"] = norm(H)
            w[p + "pre_feedforward_layernorm_2"] = norm(H)
    return w


def hf_names(w: dict, cfg: dict, image_text: bool) -> dict:
    """Our short keys -> the published tensor names."""
    pre = "model.language_model." if image_text else "model."
    out = {}
    for k, t in w.items():
        if k == "embed":
            out[pre + "embed_tokens.weight"] = t
        elif k == "norm":
            out[pre + "norm.weight"] = t
        elif k == "lm_head":
            out["lm_head.weight"] = t
        else:
            _, l, rest = k.split(".", 2)
            base = f"{pre}layers.{l}."
            if rest in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                out[base + "self_attn." + rest + ".weight"] = t
            elif rest in ("gate_proj", "up_proj", "down_proj"):
                out[base + "mlp." + rest + ".weight"] = t
            elif rest == "layer_scalar":
                out[base + "layer_scalar"] = t
            elif rest == "router.proj":
                out[base + "router.proj.weight"] = t
            elif rest in ("router.scale", "router.per_expert_scale", "experts.gate_up_proj", "experts.down_proj"):
                out[base + rest] = t
            else:  # the norms
                out[base + rest + ".weight"] = t
    if image_text:  # a tensor of each tower the published checkpoints carry, to be ignored by name
        out["model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"] = torch.zeros(16, 16)
        out["model.embed_vision.embedding_projection.weight"] = torch.zeros(64, 16)
    return out


# ------------------------------------------------------------------------------------------------------------
# The forward
# ------------------------------------------------------------------------------------------------------------

def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return y * w.to(F64) if w is not None else y


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def inv_freq_of(cfg: dict, full: bool) -> torch.Tensor:
    rp = cfg["rope_parameters"]["full_attention" if full else "sliding_attention"]
    base = rp["rope_theta"]
    if not full:
        d = cfg["head_dim"]
        return 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).to(torch.float32) / d))
    gd = cfg["global_head_dim"]
    angles = int(rp.get("partial_rotary_factor", 1.0) * gd // 2)
    rot = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(torch.float32) / gd))
    return torch.cat([rot, torch.zeros(gd // 2 - angles, dtype=torch.float32)])


def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] float64, rotate-half; angles and cos / sin in float32 as transformers."""
    freqs = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, d/2] float32
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(F64)[:, None, :], emb.sin().to(F64)[:, None, :]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class Cache:
    def __init__(self, L):
        self.k = [None] * L
        self.v = [None] * L
        self.len = 0


def forward(w: dict, cfg: dict, ids: torch.Tensor, cache: Cache | None = None) -> dict:
    """ids [T] at positions cache.len .. (0 without a cache). Returns layer outputs, final hidden, logits, experts."""
    H, L, eps = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    nh, nkv, d, gd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["global_head_dim"]
    T = ids.numel()
    start = cache.len if cache else 0
    pos = torch.arange(start, start + T)
    scale = float(torch.tensor(H ** 0.5, dtype=torch.float32))
    h = w["embed"].to(F64)[ids] * scale
    out = {"hidden_states": [h.clone()], "layer_output": [], "router_topk": {}}
    for l in range(L):
        p = f"layers.{l}."
        full = cfg["layer_types"][l] == "full_attention"
        dh = gd if full else d
        kv_eq = cfg["attention_k_eq_v"] and full
        kvh = cfg["num_global_key_value_heads"] if kv_eq else nkv
        W = None if full else cfg["sliding_window"]
        inv = inv_freq_of(cfg, full)
        # attention
        x = rms(h, w[p + "input_layernorm"], eps)
        q = (x @ w[p + "q_proj"].to(F64).T).view(T, nh, dh)
        q = rope(rms(q, w[p + "q_norm"], eps), pos, inv)
        kraw = (x @ w[p + "k_proj"].to(F64).T).view(T, kvh, dh)
        vraw = kraw if kv_eq else (x @ w[p + "v_proj"].to(F64).T).view(T, kvh, dh)
        k = rope(rms(kraw, w[p + "k_norm"], eps), pos, inv)
        v = rms(vraw, None, eps)
        if cache is not None:
            cache.k[l] = k if cache.k[l] is None else torch.cat([cache.k[l], k])
            cache.v[l] = v if cache.v[l] is None else torch.cat([cache.v[l], v])
            K, Vv = cache.k[l], cache.v[l]
        else:
            K, Vv = k, v
        kpos = torch.arange(K.shape[0])
        ok = kpos[None, :] <= pos[:, None]
        if W is not None:
            ok = ok & (kpos[None, :] > pos[:, None] - W)
        rep = nh // kvh
        Kr = K.repeat_interleave(rep, dim=1)  # [Tk, nh, dh]: query head j reads kv head j // rep
        Vr = Vv.repeat_interleave(rep, dim=1)
        s = torch.einsum("thd,khd->htk", q, Kr)  # scaling 1.0
        s = s.masked_fill(~ok[None], float("-inf"))
        a = torch.softmax(s, -1)
        o = torch.einsum("htk,khd->thd", a, Vr).reshape(T, nh * dh)
        attn = o @ w[p + "o_proj"].to(F64).T
        h = h + rms(attn, w[p + "post_attention_layernorm"], eps)
        # channel mixers
        r = h
        x = rms(r, w[p + "pre_feedforward_layernorm"], eps)
        m = (gelu_tanh(x @ w[p + "gate_proj"].to(F64).T) * (x @ w[p + "up_proj"].to(F64).T)) @ w[p + "down_proj"].to(F64).T
        if cfg["enable_moe_block"]:
            E, k_top, Ie = cfg["num_experts"], cfg["top_k_experts"], cfg["moe_intermediate_size"]
            m1 = rms(m, w[p + "post_feedforward_layernorm_1"], eps)
            z = rms(r, None, eps) * w[p + "router.scale"].to(F64) * (H ** -0.5)
            probs = torch.softmax(z @ w[p + "router.proj"].to(F64).T, -1)
            tw, ti = torch.topk(probs, k_top, dim=-1)
            tw = tw / tw.sum(-1, keepdim=True)
            tw = tw * w[p + "router.per_expert_scale"].to(F64)[ti]
            out["router_topk"][l] = ti.to(torch.int32)
            x2 = rms(r, w[p + "pre_feedforward_layernorm_2"], eps)
            gu, dn = w[p + "experts.gate_up_proj"].to(F64), w[p + "experts.down_proj"].to(F64)
            m2 = torch.zeros_like(r)
            for t in range(T):
                for j in range(k_top):
                    e = int(ti[t, j])
                    y = gu[e] @ x2[t]
                    m2[t] += tw[t, j] * (dn[e] @ (gelu_tanh(y[:Ie]) * y[Ie:]))
            m = m1 + rms(m2, w[p + "post_feedforward_layernorm_2"], eps)
        h = r + rms(m, w[p + "post_feedforward_layernorm"], eps)
        h = h * w[p + "layer_scalar"].to(F64)
        out["layer_output"].append(h.clone())
        if l + 1 < L:
            out["hidden_states"].append(h.clone())
    final = rms(h, w["norm"], eps)
    out["hidden_states"].append(final.clone())  # HF returns the last hidden state normed
    out["final_hidden"] = final
    lm = w["lm_head"] if "lm_head" in w else w["embed"]
    logits = final @ lm.to(F64).T
    cap = cfg.get("final_logit_softcapping")
    if cap:
        logits = cap * torch.tanh(logits / cap)
    out["logits"] = logits
    if cache is not None:
        cache.len += T
    return out


def build(name: str, root: str, seed: int) -> None:
    cfg_json, image_text = full_config(name)
    cfg = text_config(name)
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    w = make_weights(name, cfg, seed)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
        f.write("\n")
    save_safetensors(hf_names(w, cfg, image_text), os.path.join(d, "model.safetensors"), {"format": "pt"})
    ids = torch.randint(0, cfg["vocab_size"], (SEQ,), generator=torch.Generator().manual_seed(seed + 7))
    o = forward(w, cfg, ids)
    cache = Cache(cfg["num_hidden_layers"])
    forward(w, cfg, ids[:PREFILL], cache)
    dec = torch.cat([forward(w, cfg, ids[t:t + 1], cache)["logits"] for t in range(PREFILL, SEQ)])
    dkv = float((dec - o["logits"][PREFILL:]).abs().max())
    assert dkv < 1e-12, f"{name}: cached decode differs from the full forward by {dkv}"
    lg = o["logits"]
    cap = cfg.get("final_logit_softcapping")
    if cap:  # the tiny logits must reach the cap's bend, or the test would not see it
        assert float(lg.abs().max()) > 0.3 * cap, f"{name}: logits {float(lg.abs().max())} too small for cap {cap}"
    t = {"input_ids": ids.to(torch.int32), "final_hidden": o["final_hidden"].float(), "logits": lg.float(),
         "kv_decode_logits": dec.float()}
    for k, hs in enumerate(o["hidden_states"]):
        t[f"hidden_states.{k}"] = hs.float()
    for l, lo in enumerate(o["layer_output"]):
        t[f"layer_output.{l}"] = lo.float()
    for l, ti in o["router_topk"].items():
        t[f"router_topk.{l}"] = ti
    md = {
        "description": "tools/ref_gemma4.py: an independent float64 reading of transformers' Gemma 4 text forward "
                       "(plain PyTorch, no transformers) of the model in this directory on input_ids; stored as F32",
        "input_ids": f"I32 [{SEQ}] random ids, torch.Generator seed {seed + 7}",
        "hidden_states.k": "HF output_hidden_states[k]: 0 = scaled embedding, k = layer k-1's output, L = normed",
        "layer_output.l": "residual stream after decoder layer l (after layer_scalar), pre final norm",
        "final_hidden": "output of the final norm (input of lm_head)",
        "logits": f"[{SEQ}, V], soft-capped when final_logit_softcapping is set",
        "kv_decode_logits": f"[{SEQ - PREFILL}, V]: prefill input_ids[0:{PREFILL}] with an explicit KV cache, then one "
                            f"token at a time; row t = logits at position {PREFILL}+t",
        "router_topk.l": "I32 [S, k]: the experts chosen at MoE layer l (torch.topk of the router's softmax)",
        "float32_inside": "RoPE angles and cos / sin in float32 (as transformers); transformers also computes its "
                          "RMSNorms in float32 inside a float64 model (~1e-7), which this reference does not",
        "max_abs_diff_kv_decode_vs_forward": f"{dkv:.3e}",
        "torch_version": torch.__version__,
        "num_hidden_layers": str(cfg["num_hidden_layers"]),
    }
    save_safetensors(t, os.path.join(d, "golden.safetensors"), md)
    print(f"{name}: wrote {d} (max |logit| {float(lg.abs().max()):.3f}, decode vs forward {dkv:.1e})")


ALL = {"target_gemma4": 4101, "target_gemma4_text": 4102, "target_gemma4_moe": 4103}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--only", default="", help="comma list of " + ",".join(ALL))
    a = ap.parse_args()
    for n in [x for x in a.only.split(",") if x] or list(ALL):
        build(n, a.out, ALL[n])
    return 0


if __name__ == "__main__":
    sys.exit(main())
