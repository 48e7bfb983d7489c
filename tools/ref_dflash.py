"""An independent, float64 PyTorch reference of docs/spec.md (the DFlash drafter and its targets).

Clarity over speed: dense masks, explicit loops over layers, no fused kernels. It is the oracle behind the
golden files of tests/golden (written by tools/make_goldens.py) and can be imported from other tools:

    import sys; sys.path.insert(0, "tools"); import ref_dflash as ref

Sections named "spec N" refer to docs/spec.md. Everything here is plain torch on the CPU; call it with
float64 tensors (the rule functions are plain Python).

Contents
  rules (spec 1, 2.1, 2.3, 2.4): default_target_layer_ids, anchor_candidates, mask_allowed, dense_mask,
        block_input_ids, block_positions, labels_and_weights
  math: rms_norm, rope_inv_freq, apply_rope, masked_softmax, attention
  target (spec 1): load_hf_config, load_target_weights, target_forward
  drafter (spec 1, 2.4, 3): DraftConfig, drafter_param_shapes, init_drafter_params, context_features,
        drafter_forward, dflash_loss
  optimizer (spec 2.5): clip_grad_norm, adamw_step
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch

# ----------------------------------------------------------------------------------------------------------
# Rules
# ----------------------------------------------------------------------------------------------------------


def default_target_layer_ids(num_target_layers: int, nf: int) -> list[int]:
    """Spec 1: nf == 1 -> [Lt/2]; else ids[i] = round(1 + i*(Lt-4)/(nf-1)) (evenly from layer 1 to Lt-3).

    Python's round() rounds half to even; the spec's examples (Qwen3-8B -> [1, 9, 17, 25, 33],
    Llama-3.1-8B -> [1, 8, 15, 22, 29]) have no .5 cases, so half-up is used here (floor(x + 0.5)).
    """
    if nf == 1:
        return [num_target_layers // 2]
    return [int(math.floor(1 + i * (num_target_layers - 4) / (nf - 1) + 0.5)) for i in range(nf)]


def anchor_candidates(loss_mask: list[int]) -> list[int]:
    """Spec 2.1 step 2: positions a with loss_mask[a] = 1 and loss_mask[a+1] = 1 and a <= S-2."""
    S = len(loss_mask)
    return [a for a in range(S - 1) if loss_mask[a] == 1 and loss_mask[a + 1] == 1]


def mask_allowed(q: int, k: int, S: int, anchors: list[int], valid: list[int], B: int) -> bool:
    """Spec 2.3, the exact rule, for one (query, key) pair.

    Query q is row q of Q = [block_0 | ... | block_{N-1}] (block j = q div B, slot i = q mod B).
    Key k indexes KV = [context 0..S-1 | block_0 | ... | block_{N-1}].
        ctx_ok  = k < S and k < a_j                      (STRICTLY before the anchor)
        blk_ok  = k >= S and (k - S) div B == j          (own block, all B keys, bidirectional)
        allowed = valid_j and (ctx_ok or blk_ok)
    """
    j = q // B
    if not valid[j]:
        return False
    ctx_ok = k < S and k < anchors[j]
    blk_ok = k >= S and (k - S) // B == j
    return bool(ctx_ok or blk_ok)


def dense_mask(S: int, anchors: list[int], valid: list[int], B: int) -> torch.Tensor:
    """Spec 2.3 as a dense bool matrix [N*B, S + N*B], built with tensor ops (a second implementation of
    the rule; make_goldens.py asserts it equals mask_allowed() pair by pair). Small shapes only."""
    N = len(anchors)
    q = torch.arange(N * B)
    k = torch.arange(S + N * B)
    j = q // B
    a = torch.tensor(anchors, dtype=torch.long)[j]
    v = torch.tensor([bool(x) for x in valid], dtype=torch.bool)[j]
    ctx_ok = (k[None, :] < S) & (k[None, :] < a[:, None])
    blk_ok = (k[None, :] >= S) & (torch.div(k[None, :] - S, B, rounding_mode="floor") == j[:, None])
    return v[:, None] & (ctx_ok | blk_ok)


def block_input_ids(ids: list[int], anchors: list[int], B: int, mask_token_id: int) -> list[int]:
    """Spec 1 "Draft input": block j is [x[a_j], MASK, ..., MASK] (length B). Padding blocks use their
    anchor value too (0 by convention), they are invalid and see nothing."""
    out = []
    for a in anchors:
        out.append(int(ids[a]))
        out.extend([int(mask_token_id)] * (B - 1))
    return out


def block_positions(anchors: list[int], B: int) -> list[int]:
    """Spec 1 "Positions for RoPE": block j slot i has position a_j + i (may exceed S-1)."""
    return [a + i for a in anchors for i in range(B)]


def labels_and_weights(ids, loss_mask, anchors, valid, B: int, gamma: float | None):
    """Spec 2.4 (same-position prediction; slot 0 never trained).

        y[j,i] = x[a_j + i]                       (0 where a_j + i >= S; its weight is 0)
        m[j,i] = valid_j * [i > 0] * [a_j + i < S] * loss_mask[a_j + i]
        w[j,i] = m[j,i] * exp(-(i-1)/gamma)       (gamma None -> uniform weights)

    Returns (y [N,B] long, m [N,B] float64, w [N,B] float64).
    """
    S = len(ids)
    N = len(anchors)
    y = torch.zeros(N, B, dtype=torch.long)
    m = torch.zeros(N, B, dtype=torch.float64)
    w = torch.zeros(N, B, dtype=torch.float64)
    for j, a in enumerate(anchors):
        for i in range(B):
            p = a + i
            if p < S:
                y[j, i] = int(ids[p])
            mm = 1.0 if (valid[j] and i > 0 and p < S and loss_mask[p] == 1) else 0.0
            m[j, i] = mm
            decay = 1.0 if gamma is None else math.exp(-(i - 1) / gamma)
            w[j, i] = mm * decay
    return y, m, w


# ----------------------------------------------------------------------------------------------------------
# Math
# ----------------------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: weight * x / sqrt(mean(x^2) + eps) (Llama/Qwen)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies in float64: 1 / theta^(2i/d), i < d/2, then the rope_scaling rule.

    Supported scaling rope_type: None/"default", "linear" (handled in apply_rope by dividing positions,
    equivalent to inv_freq / factor), "llama3" (Llama-3.1: low-frequency bands divided by factor, a smooth
    blend in the middle band, high frequencies unchanged; same formula as transformers).
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        lo = float(scaling["low_freq_factor"])
        hi = float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        low_wl = old / lo
        high_wl = old / hi
        wl = 2 * math.pi / inv
        out = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = (wl >= high_wl) & (wl <= low_wl)
        return torch.where(medium, smoothed, out)
    raise ValueError(f"unsupported rope_type {kind!r}")


def apply_rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (HF convention). x [T, heads, d], pos [T] -> [T, heads, d]."""
    ang = pos.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, d/2]
    emb = torch.cat([ang, ang], dim=-1)  # [T, d]
    cos = emb.cos()[:, None, :].to(x.dtype)
    sin = emb.sin()[:, None, :].to(x.dtype)
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim restricted to `allowed`; a row with no allowed key gives all zeros
    (never NaN, also in the backward pass)."""
    filled = scores.masked_fill(~allowed, float("-inf"))
    rowmax = filled.amax(dim=-1, keepdim=True)
    rowmax = torch.where(torch.isfinite(rowmax), rowmax, torch.zeros_like(rowmax)).detach()
    e = torch.where(allowed, torch.exp(filled - rowmax), torch.zeros_like(scores))
    den = e.sum(dim=-1, keepdim=True)
    den = torch.where(den > 0, den, torch.ones_like(den))
    return e / den


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """GQA attention. q [T, nh, d], k/v [K, nkv, d], allowed [T, K] bool -> [T, nh*d].
    Query head h reads kv head h // (nh/nkv) (HF repeat_kv)."""
    T, nh, d = q.shape
    nkv = k.shape[1]
    rep = nh // nkv
    kk = k.repeat_interleave(rep, dim=1)  # [K, nh, d]
    vv = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,khd->htk", q, kk) / math.sqrt(d)  # [nh, T, K]
    p = masked_softmax(scores, allowed[None, :, :].expand(nh, T, -1))
    o = torch.einsum("htk,khd->thd", p, vv)
    return o.reshape(T, nh * d)


# ----------------------------------------------------------------------------------------------------------
# Target (spec 1): Llama / Qwen2 / Qwen3 dense decoder in Hugging Face format
# ----------------------------------------------------------------------------------------------------------


def load_hf_config(path: str) -> dict:
    """Reads <dir>/config.json into a flat dict with the fields the reference needs. Accepts both the
    transformers 5 form ("rope_parameters": {rope_theta, rope_type, ...}) and the older one (top-level
    "rope_theta" + "rope_scaling")."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        c = json.load(f)
    mt = c["model_type"]
    if mt not in ("llama", "qwen2", "qwen3", "qwen3_moe"):
        raise ValueError(f"{path}: unsupported model_type {mt!r}")
    H = int(c["hidden_size"])
    nh = int(c["num_attention_heads"])
    theta = float(c.get("rope_theta", 10000.0))
    scaling = c.get("rope_scaling")
    rp = c.get("rope_parameters")
    if isinstance(rp, dict) and rp:
        theta = float(rp.get("rope_theta", theta))
        kind = rp.get("rope_type", rp.get("type", "default"))
        scaling = None if kind == "default" else dict(rp)
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            scaling = None
    return {
        "model_type": mt,
        "hidden_size": H,
        "num_hidden_layers": int(c["num_hidden_layers"]),
        "num_attention_heads": nh,
        "num_key_value_heads": int(c.get("num_key_value_heads") or nh),
        "head_dim": int(c.get("head_dim") or H // nh),
        "intermediate_size": int(c["intermediate_size"]),
        "vocab_size": int(c["vocab_size"]),
        "rms_norm_eps": float(c.get("rms_norm_eps", 1e-6)),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
        "qk_norm": mt in ("qwen3", "qwen3_moe"),
        "qkv_bias": mt == "qwen2" or bool(c.get("attention_bias", False)),
        "o_bias": mt != "qwen2" and bool(c.get("attention_bias", False)),
        # Qwen3-MoE (Qwen3MoeConfig defaults): layer l is MoE when l not in mlp_only_layers and (l+1) % step == 0
        # transformers 5 writes num_local_experts (Qwen3MoeConfig's alias of num_experts)
        "num_experts": int(c.get("num_experts", c.get("num_local_experts", 128))) if mt == "qwen3_moe" else 0,
        "num_experts_per_tok": int(c.get("num_experts_per_tok", 8)),
        "moe_intermediate_size": int(c.get("moe_intermediate_size", 768)),
        "norm_topk_prob": bool(c.get("norm_topk_prob", False)),
        "decoder_sparse_step": int(c.get("decoder_sparse_step", 1)),
        "mlp_only_layers": list(c.get("mlp_only_layers") or []),
    }


def is_moe_layer(cfg: dict, l: int) -> bool:
    return (cfg.get("num_experts", 0) > 0 and l not in cfg.get("mlp_only_layers", [])
            and (l + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def moe_block(cfg: dict, W: dict, p: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3MoeSparseMoeBlock written out (in x's dtype throughout, float64 here): p = softmax(x Wr^T) over all
    experts, the top-k by p (ties: lower index first), renormalised when norm_topk_prob; out = sum_j p_j
    expert_j(x). Experts from per-expert tensors (mlp.experts.{e}.gate_proj.weight, ...) or transformers 5's fused
    ones (mlp.experts.gate_up_proj [E, 2I, H] gate rows first, mlp.experts.down_proj [E, H, I]). Returns (out,
    chosen experts [S, k])."""
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    probs = torch.softmax(x @ W[p + "mlp.gate.weight"].T, dim=-1)
    # stable descending sort: equal probabilities keep the lower expert index first
    order = torch.sort(-probs, dim=-1, stable=True).indices[:, :k]
    w = torch.gather(probs, 1, order)
    if cfg["norm_topk_prob"]:
        w = w / w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    fused = p + "mlp.experts.gate_up_proj" in W
    for e in range(E):
        if fused:
            gu = W[p + "mlp.experts.gate_up_proj"][e]
            I = gu.shape[0] // 2
            g_w, u_w, d_w = gu[:I], gu[I:], W[p + "mlp.experts.down_proj"][e]
        else:
            q = p + f"mlp.experts.{e}."
            g_w, u_w, d_w = W[q + "gate_proj.weight"], W[q + "up_proj.weight"], W[q + "down_proj.weight"]
        hit = order == e  # [S, k]
        tok = hit.any(dim=-1)
        if not bool(tok.any()):
            continue
        xe = x[tok]
        ye = (torch.nn.functional.silu(xe @ g_w.T) * (xe @ u_w.T)) @ d_w.T
        out[tok] += (w * hit).sum(dim=-1)[tok, None] * ye
    return out, order


def load_target_weights(path: str, dtype=torch.float64) -> dict:
    """Loads every *.safetensors of the directory, strips a leading "model.", converts to `dtype`, and adds
    "lm_head.weight" = "embed_tokens.weight" when the file has no lm_head (tied embeddings)."""
    from safetensors.torch import load_file

    W = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            for k, v in load_file(os.path.join(path, fn)).items():
                W[k[6:] if k.startswith("model.") else k] = v.to(dtype)
    if "lm_head.weight" not in W:
        W["lm_head.weight"] = W["embed_tokens.weight"]
    return W


def target_forward(cfg: dict, W: dict, ids) -> dict:
    """Causal forward of the target over one sequence (no KV cache).

    Returns {"embed": [S,H], "layer_outputs": [h_after_layer(0), ..., h_after_layer(Lt-1)] each [S,H]
    (the residual stream AFTER decoder layer l, before the final norm; spec 1), "final_hidden": [S,H]
    (final-norm output, the lm_head input), "logits": [S,V], and for MoE targets "router_topk": {l: [S, k]}}."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    S = ids.numel()
    eps = cfg["rms_norm_eps"]
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inv = rope_inv_freq(d, cfg["rope_theta"], cfg["rope_scaling"])
    pos = torch.arange(S)
    causal = torch.tril(torch.ones(S, S, dtype=torch.bool))
    h = W["embed_tokens.weight"][ids]
    out = {"embed": h, "layer_outputs": []}
    for l in range(cfg["num_hidden_layers"]):
        p = f"layers.{l}."
        x = rms_norm(h, W[p + "input_layernorm.weight"], eps)

        def proj(name, bias_ok):
            y = x @ W[p + f"self_attn.{name}.weight"].T
            b = W.get(p + f"self_attn.{name}.bias")
            if b is not None and bias_ok:
                y = y + b
            return y

        q = proj("q_proj", True).view(S, nh, d)
        k = proj("k_proj", True).view(S, nkv, d)
        v = proj("v_proj", True).view(S, nkv, d)
        if cfg["qk_norm"]:
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q = apply_rope(q, pos, inv)
        k = apply_rope(k, pos, inv)
        o = attention(q, k, v, causal) @ W[p + "self_attn.o_proj.weight"].T
        if W.get(p + "self_attn.o_proj.bias") is not None:
            o = o + W[p + "self_attn.o_proj.bias"]
        h = h + o
        xn = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(cfg, l):
            y, chosen = moe_block(cfg, W, p, xn)
            h = h + y
            out.setdefault("router_topk", {})[l] = chosen
        else:
            gate = xn @ W[p + "mlp.gate_proj.weight"].T
            up = xn @ W[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
        out["layer_outputs"].append(h)
    fh = rms_norm(h, W["norm.weight"], eps)
    out["final_hidden"] = fh
    out["logits"] = fh @ W["lm_head.weight"].T
    return out


# ----------------------------------------------------------------------------------------------------------
# Drafter (spec 1, 2.2-2.4, 3)
# ----------------------------------------------------------------------------------------------------------


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    block_size: int
    target_layer_ids: list
    mask_token_id: int
    gamma: float | None = 7.0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    rope_scaling: dict | None = None
    extra: dict = field(default_factory=dict)

    @property
    def nf(self) -> int:
        return len(self.target_layer_ids)


def drafter_param_shapes(dc: DraftConfig) -> list[tuple[str, list[int]]]:
    """Trainable tensors with the export names of spec 3 (no embedding, no lm_head), in a fixed order."""
    H, I, d = dc.hidden_size, dc.intermediate_size, dc.head_dim
    nh, nkv = dc.num_attention_heads, dc.num_key_value_heads
    out = [("fc.weight", [H, dc.nf * H]), ("hidden_norm.weight", [H])]
    for l in range(dc.num_hidden_layers):
        p = f"layers.{l}."
        out += [
            (p + "input_layernorm.weight", [H]),
            (p + "self_attn.q_proj.weight", [nh * d, H]),
            (p + "self_attn.k_proj.weight", [nkv * d, H]),
            (p + "self_attn.v_proj.weight", [nkv * d, H]),
            (p + "self_attn.o_proj.weight", [H, nh * d]),
            (p + "self_attn.q_norm.weight", [d]),
            (p + "self_attn.k_norm.weight", [d]),
            (p + "post_attention_layernorm.weight", [H]),
            (p + "mlp.gate_proj.weight", [I, H]),
            (p + "mlp.up_proj.weight", [I, H]),
            (p + "mlp.down_proj.weight", [H, I]),
        ]
    out.append(("norm.weight", [H]))
    return out


def init_drafter_params(dc: DraftConfig, seed: int, linear_std: float, norm_std: float) -> dict:
    """Deterministic float32 init: Linear ~ N(0, linear_std); norm weights 1 + norm_std * N(0,1)
    (spec 1 says N(0, 0.02) and 1; the goldens use larger values so gradients are not tiny)."""
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape in drafter_param_shapes(dc):
        if len(shape) == 1:
            P[name] = 1.0 + norm_std * torch.randn(shape, generator=g, dtype=torch.float32)
        else:
            P[name] = linear_std * torch.randn(shape, generator=g, dtype=torch.float32)
    return P


def context_features(layer_outputs: list, target_layer_ids: list) -> torch.Tensor:
    """Spec 1: F = concat over l in target_layer_ids of h_after_layer(l), [S, nf*H]."""
    return torch.cat([layer_outputs[l] for l in target_layer_ids], dim=-1)


def drafter_forward(P: dict, dc: DraftConfig, embed: torch.Tensor, lm_head: torch.Tensor, F: torch.Tensor,
                    ids, anchors, valid) -> dict:
    """Spec 1 + 2.2 + 2.3 for one sequence. Returns {"logits": [N*B, V], "ctx": Ht [S,H], "mask": [N*B, S+N*B],
    "positions": [N*B]}.

        Ht = RMSNorm_hidden(F @ fc^T)                       (shared by every layer, never normed again)
        per layer: x = RMSNorm_in(h); q = RoPE(q_norm(x Wq^T)); k = RoPE(k_norm([Ht; x] Wk^T));
                   v = [Ht; x] Wv^T; h += attn(q,k,v; mask) Wo^T; h += down(silu(gate(n)) * up(n)), n = RMSNorm_post(h)
        logits = lm_head(RMSNorm_final(h))
    Context key p has position p; block j slot i has position a_j + i."""
    ids = [int(t) for t in ids]
    S = len(ids)
    N = len(anchors)
    B = dc.block_size
    eps = dc.rms_norm_eps
    nh, nkv, d = dc.num_attention_heads, dc.num_key_value_heads, dc.head_dim
    inv = rope_inv_freq(d, dc.rope_theta, dc.rope_scaling)
    Ht = rms_norm(F @ P["fc.weight"].T, P["hidden_norm.weight"], eps)
    h = embed[torch.tensor(block_input_ids(ids, anchors, B, dc.mask_token_id), dtype=torch.long)]
    qpos = torch.tensor(block_positions(anchors, B), dtype=torch.long)
    kpos = torch.cat([torch.arange(S), qpos])
    allowed = dense_mask(S, anchors, valid, B)
    T = N * B
    for l in range(dc.num_hidden_layers):
        p = f"layers.{l}."
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = (x @ P[p + "self_attn.q_proj.weight"].T).view(T, nh, d)
        q = apply_rope(rms_norm(q, P[p + "self_attn.q_norm.weight"], eps), qpos, inv)
        kv_in = torch.cat([Ht, x], dim=0)  # [S + N*B, H]
        k = (kv_in @ P[p + "self_attn.k_proj.weight"].T).view(S + T, nkv, d)
        k = apply_rope(rms_norm(k, P[p + "self_attn.k_norm.weight"], eps), kpos, inv)
        v = (kv_in @ P[p + "self_attn.v_proj.weight"].T).view(S + T, nkv, d)
        h = h + attention(q, k, v, allowed) @ P[p + "self_attn.o_proj.weight"].T
        n = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        mlp = (torch.nn.functional.silu(n @ P[p + "mlp.gate_proj.weight"].T) * (n @ P[p + "mlp.up_proj.weight"].T))
        h = h + mlp @ P[p + "mlp.down_proj.weight"].T
    logits = rms_norm(h, P["norm.weight"], eps) @ lm_head.T
    return {"logits": logits, "ctx": Ht, "mask": allowed, "positions": qpos}


def dflash_loss(P: dict, dc: DraftConfig, embed, lm_head, seqs: list[dict], kl_weight: float = 0.0) -> dict:
    """Spec 2.4 over several sequences with GLOBAL normalization:

        L = sum_all w*CE / sum_all w  +  kl_weight * sum_all w*KL(p || q) / sum_all w
        p = softmax(lm_head(target_final_hidden[a_j + i - 1]))   (target's prediction of position a_j + i)

    Each seq dict: ids, loss_mask, anchors, valid, features [S, nf*H], target_final_hidden [S, H].
    Returns loss, sum_w, ce_sum, kl_sum, per-seq logits/y/m/w/ctx/mask, and per-slot acc/count."""
    B = dc.block_size
    sum_w = 0.0
    ce_sum = 0.0
    kl_sum = 0.0
    correct = torch.zeros(B, dtype=torch.float64)
    count = torch.zeros(B, dtype=torch.float64)
    per_seq = []
    for s in seqs:
        fw = drafter_forward(P, dc, embed, lm_head, s["features"], s["ids"], s["anchors"], s["valid"])
        logits = fw["logits"]
        y, m, w = labels_and_weights(s["ids"], s["loss_mask"], s["anchors"], s["valid"], B, dc.gamma)
        logq = torch.log_softmax(logits, dim=-1)
        ce = -logq.gather(1, y.reshape(-1, 1)).reshape(-1)
        wf = w.reshape(-1)
        sum_w = sum_w + wf.sum()
        ce_sum = ce_sum + (wf * ce).sum()
        if kl_weight:
            S = len(s["ids"])
            src = torch.tensor([min(max(a + i - 1, 0), S - 1) for a in s["anchors"] for i in range(B)])
            logp = torch.log_softmax(s["target_final_hidden"][src] @ lm_head.T, dim=-1)
            kl = (logp.exp() * (logp - logq)).sum(-1)
            kl_sum = kl_sum + (wf * kl).sum()
        with torch.no_grad():
            hit = (logits.argmax(-1).reshape(-1, B) == y).to(torch.float64) * m
            correct += hit.sum(0)
            count += m.sum(0)
        per_seq.append({"logits": logits, "y": y, "m": m, "w": w, "ctx": fw["ctx"], "mask": fw["mask"],
                        "positions": fw["positions"]})
    loss = ce_sum / sum_w
    if kl_weight:
        loss = loss + kl_weight * kl_sum / sum_w
    acc = torch.where(count > 0, correct / count.clamp_min(1), torch.zeros_like(count))
    acc[0] = 0.0
    return {"loss": loss, "sum_w": sum_w, "ce_sum": ce_sum, "kl_sum": kl_sum, "seqs": per_seq,
            "acc": acc, "count": count}


# ----------------------------------------------------------------------------------------------------------
# Optimizer (spec 2.5), written out so the C++ can be checked against plain formulas
# ----------------------------------------------------------------------------------------------------------


def clip_grad_norm(grads: dict, max_norm: float) -> tuple[float, float, dict]:
    """As torch.nn.utils.clip_grad_norm_: total = ||all grads||_2; coef = min(1, max_norm / (total + 1e-6));
    every grad is multiplied by coef (also when coef == 1). Returns (total, coef, clipped grads)."""
    total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
    coef = min(1.0, max_norm / (total + 1e-6))
    return total, coef, {k: g * coef for k, g in grads.items()}


def adamw_step(params: dict, grads: dict, state: dict, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.0) -> dict:
    """One step of torch.optim.AdamW (decoupled decay, bias correction, eps outside the sqrt):
        p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; t += 1
        p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    `state` maps name -> {"m", "v", "t"} (created when missing). Returns the new params."""
    b1, b2 = betas
    out = {}
    for k, p in params.items():
        st = state.setdefault(k, {"m": torch.zeros_like(p), "v": torch.zeros_like(p), "t": 0})
        g = grads[k]
        st["t"] += 1
        t = st["t"]
        st["m"] = b1 * st["m"] + (1 - b1) * g
        st["v"] = b2 * st["v"] + (1 - b2) * g * g
        p = p * (1 - lr * weight_decay)
        denom = st["v"].sqrt() / math.sqrt(1 - b2 ** t) + eps
        out[k] = p - (lr / (1 - b1 ** t)) * st["m"] / denom
    return out
