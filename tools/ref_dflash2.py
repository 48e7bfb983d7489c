#!/usr/bin/env python3
"""tools/ref_dflash2.py - an independent float64 PyTorch reading of the SERVED DFlash2 drafter: vLLM's
vllm/model_executor/models/qwen3_dflash2.py (DFlashGroupedConv, DFlash2Qwen3DecoderLayer, CandidateSelector,
DFlash2Qwen3ForCausalLM.compute_candidates) over its DFlash base qwen3_dflash.py (context K/V precompute, the
attention of the query block), and the greedy walk of vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py. The
sources read are listed in docs/dflash2_sources.md; the rules are docs/spec.md 1.1, 1.2, 3 and 4.

It drafts ONE block at inference (spec 4) from a DFlash2 export directory (config.json with architectures
["DFlash2DraftModel"] and model.safetensors with spec 3's names):
  context: target features F [S, nf*H] of positions 0..S-1 -> fc -> hidden_norm -> per layer k_proj, k_norm,
           RoPE at 0..S-1 and v_proj (vLLM precompute_and_store_context_kv; never convolved);
  block:   [anchor, MASK x (B-1)] at positions S..S+B-1, embedded with the target's table (x input_embedding_scale);
  layer:   vLLM's residual convention (RMSNorm with a residual argument adds, then norms):
           a = in_norm(h); a', cA = attention_conv.prepare(a); o = attn(a'); o' = attention_conv.finish(o, cA);
           m = post_norm(h + o'); m', cM = mlp_conv.prepare(m); f = mlp(m'); f' = mlp_conv.finish(f, cM); h += o' + f'
           attention: q from the block, k/v from [context ; block], the block non-causal (is_causal resolution of
           qwen3_dflash.py _dflash_layer_causal), full attention over all S context keys;
  output:  h = norm(h) [B, H];
  selector (slots 1..B-1): z = h @ lm_head^T (raw logits), the top-k (ties to the lower id), values x
           output_multiplier (then softcapped when set); pair scores
           e_t(prev, c) = U_t(c) + sum_q P[prev, q] (W h_t)_q S[c, q] over the lattice (slot 1: prev = the anchor,
           slot t > 1: prev = each candidate of slot t-1), then the greedy walk from the anchor (first on ties).

Plain torch on the CPU in float64; helpers (rms_norm, rope, attention) come from tools/ref_dflash.py.

Usage:
  python3 tools/ref_dflash2.py --export DIR --inputs FILE.safetensors   # draft one block, print h and the path
  python3 tools/ref_dflash2.py --make-golden tests/golden/dflash2_served
      writes a tiny random DFlash2 case (F32 tensors, computed here in float64):
        export/{config.json, model.safetensors}   the drafter (H 32, 2 layers, 4 heads / 2 kv of 8, I 48, V 64, B 4,
                                                  nf 2, 2 taps, group 4, rank 8, top-k 5)
        inputs.safetensors                        features [S, nf*H], embed [V, H], lm_head [V, H], anchor_token [1]
        expected.json                             h [B, H], the candidates and their logits per slot, the greedy
                                                  path's score rows, the path (and the plain argmax path)
      checked by tests/model/dflash2_golden.cpp (Drafter::draft_block and select_path).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_dflash as ref  # noqa: E402

# ----------------------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header, raw little-endian data
# ----------------------------------------------------------------------------------------------------------

_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def read_safetensors(path: str) -> dict:
    """Every tensor of the file as a torch tensor of its stored dtype (read by hand: no safetensors package)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_DTYPES[e["dtype"]]
        b, en = e["data_offsets"]
        buf = bytearray(blob[base + b:base + en])
        t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None) -> None:
    """F32 (float tensors) or I32 (integer tensors), in the dict's order."""
    header, chunks, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if t.is_floating_point():
            data = struct.pack(f"<{t.numel()}f", *t.to(torch.float64).reshape(-1).tolist())
            dt = "F32"
        else:
            data = struct.pack(f"<{t.numel()}i", *t.to(torch.int64).reshape(-1).tolist())
            dt = "I32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)  # data aligned to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


# ----------------------------------------------------------------------------------------------------------
# The export
# ----------------------------------------------------------------------------------------------------------


def load_export(path: str) -> tuple[dict, dict]:
    """(config, weights as float64) of a DFlash2 export directory. The config keeps every key; `dflash_config` is
    required with vLLM's keys (conv_kernel_size, conv_group_size, selector_rank, selector_top_k)."""
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    if c.get("architectures", [None])[0] != "DFlash2DraftModel":
        raise ValueError(f"{path}: architectures {c.get('architectures')} is not ['DFlash2DraftModel']")
    W = {k: v.to(torch.float64) for k, v in read_safetensors(os.path.join(path, "model.safetensors")).items()}
    return c, W


def _rope_of(c: dict) -> tuple[float, dict | None]:
    theta = float(c.get("rope_theta", 1e6))  # qwen3_dflash.py set_default_rope_theta: 1e6 when absent
    scaling = c.get("rope_scaling")
    rp = c.get("rope_parameters")
    if isinstance(rp, dict) and rp:
        theta = float(rp.get("rope_theta", theta))
        scaling = dict(rp)
    if scaling is not None and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "yarn":
        raise NotImplementedError("YaRN RoPE (an attention factor on cos/sin) is not read here")
    return theta, scaling


def layer_causal(c: dict, l: int) -> bool:
    """qwen3_dflash.py _dflash_layer_causal: is_causal, else dflash_config.causal, else 'sliding_attention'."""
    if c.get("is_causal") is not None:
        return bool(c["is_causal"])
    dc = c.get("dflash_config") or {}
    if dc.get("causal") is not None:
        return bool(dc["causal"])
    lt = c.get("layer_types")
    return bool(lt) and lt[l] == "sliding_attention"


# ----------------------------------------------------------------------------------------------------------
# Grouped dynamic convolution (qwen3_dflash2.py _grouped_conv, DFlashGroupedConv)
# ----------------------------------------------------------------------------------------------------------


def grouped_conv(u: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int, num_groups: int,
                 group_size: int, taps: int) -> torch.Tensor:
    """u [N, H] (N a multiple of block_size, block-aligned rows), delta [N, taps, G] (one side), base [taps, H]:
        coeff[t, k, c] = base[k, c] + delta[t, k, c // g]
        y[t, c] = coeff[t, 0, c] u[t, c] + sum_{k >= 1, (t mod block_size) >= k} coeff[t, k, c] u[t - k, c]"""
    N = u.shape[0]
    blocks = u.reshape(N, num_groups, group_size)
    coeff = base.reshape(1, taps, num_groups, group_size) + delta.unsqueeze(-1)  # [N, taps, G, g]
    y = coeff[:, 0] * blocks
    pos = torch.arange(N) % block_size
    for k in range(1, taps):
        shifted = torch.cat([torch.zeros(k, num_groups, group_size, dtype=u.dtype), blocks[:-k]], dim=0)
        y = y + coeff[:, k] * shifted * (pos >= k).to(u.dtype).reshape(-1, 1, 1)
    return y.reshape(N, -1)


def conv_prepare(W: dict, prefix: str, x: torch.Tensor, block_size: int, taps: int, group_size: int):
    """DFlashGroupedConv.prepare: the coefficients of both sides from x (the sublayer's normed input); returns
    (side-0 convolution of x, side-1 coefficients)."""
    H = x.shape[-1]
    G = H // group_size
    coeff = (x @ W[prefix + "kernel_projection.weight"].T).reshape(x.shape[0], 2, taps, G)
    y = grouped_conv(x, coeff[:, 0], W[prefix + "base_kernel"][0], block_size, G, group_size, taps)
    return y, coeff[:, 1]


def conv_finish(W: dict, prefix: str, u: torch.Tensor, coeff: torch.Tensor, block_size: int, taps: int,
                group_size: int) -> torch.Tensor:
    """DFlashGroupedConv.finish: side 1 over the sublayer's output with the coefficients prepare kept."""
    G = u.shape[-1] // group_size
    return grouped_conv(u, coeff, W[prefix + "base_kernel"][1], block_size, G, group_size, taps)


def grouped_conv_loops(u, delta, base, block_size, group_size):
    """Spec 1.1's formula written with loops (a second reading of grouped_conv for the self-check)."""
    N, H = u.shape
    taps = base.shape[0]
    y = torch.zeros_like(u)
    for t in range(N):
        for c in range(H):
            s = 0.0
            for k in range(taps):
                if t % block_size >= k:
                    s += (float(base[k, c]) + float(delta[t, k, c // group_size])) * float(u[t - k, c])
            y[t, c] = s
    return y


# ----------------------------------------------------------------------------------------------------------
# The draft of one block (spec 4; qwen3_dflash.py + qwen3_dflash2.py)
# ----------------------------------------------------------------------------------------------------------


def rms_add(x: torch.Tensor, residual: torch.Tensor | None, w: torch.Tensor, eps: float):
    """vLLM's RMSNorm(x, residual): (norm(x + residual), x + residual); without residual (norm(x), x)."""
    r = x if residual is None else x + residual
    return ref.rms_norm(r, w, eps), r


def context_kv(c: dict, W: dict, features: torch.Tensor) -> list:
    """precompute_and_store_context_kv: Ht = hidden_norm(fc(F)); per layer k = RoPE(k_norm(Ht Wk^T)) at positions
    0..S-1, v = Ht Wv^T. Returns [(k [S, nkv, d], v [S, nkv, d])] per layer."""
    eps = float(c.get("rms_norm_eps", 1e-6))
    nkv, d = int(c["num_key_value_heads"]), int(c["head_dim"])
    theta, scaling = _rope_of(c)
    inv = ref.rope_inv_freq(d, theta, scaling)
    S = features.shape[0]
    Ht = ref.rms_norm(features @ W["fc.weight"].T, W["hidden_norm.weight"], eps)
    pos = torch.arange(S)
    out = []
    for l in range(int(c["num_hidden_layers"])):
        p = f"layers.{l}.self_attn."
        k = ref.rms_norm((Ht @ W[p + "k_proj.weight"].T).reshape(S, nkv, d), W[p + "k_norm.weight"], eps)
        out.append((ref.apply_rope(k, pos, inv), (Ht @ W[p + "v_proj.weight"].T).reshape(S, nkv, d)))
    return out


def block_attention(c: dict, W: dict, l: int, x: torch.Tensor, positions: torch.Tensor, kv) -> torch.Tensor:
    """DFlashQwen3Attention.forward over the query block with the context K/V already cached: q/k/v from x, per-head
    q_norm / k_norm, RoPE at the block positions, attention over [context ; block], o_proj."""
    eps = float(c.get("rms_norm_eps", 1e-6))
    nh, nkv, d = int(c["num_attention_heads"]), int(c["num_key_value_heads"]), int(c["head_dim"])
    theta, scaling = _rope_of(c)
    inv = ref.rope_inv_freq(d, theta, scaling)
    p = f"layers.{l}.self_attn."
    B = x.shape[0]
    q = ref.apply_rope(ref.rms_norm((x @ W[p + "q_proj.weight"].T).reshape(B, nh, d), W[p + "q_norm.weight"], eps),
                       positions, inv)
    kb = ref.apply_rope(ref.rms_norm((x @ W[p + "k_proj.weight"].T).reshape(B, nkv, d), W[p + "k_norm.weight"], eps),
                        positions, inv)
    vb = (x @ W[p + "v_proj.weight"].T).reshape(B, nkv, d)
    kc, vc = kv
    S = kc.shape[0]
    lt = c.get("layer_types")
    if lt and lt[l] == "sliding_attention" and c.get("use_sliding_window", True):
        win = int((c.get("dflash_config") or {}).get("swa_window_size", c.get("sliding_window") or 0))
        if win < S + B:
            raise NotImplementedError(f"layer {l}: a sliding window ({win}) shorter than context + block is not read")
    allowed = torch.ones(B, S + B, dtype=torch.bool)
    if layer_causal(c, l):
        allowed[:, S:] = torch.ones(B, B, dtype=torch.bool).tril()
    o = ref.attention(q, torch.cat([kc, kb]), torch.cat([vc, vb]), allowed)
    return o @ W[p + "o_proj.weight"].T


def draft_block(c: dict, W: dict, features: torch.Tensor, anchor_token: int, embed: torch.Tensor) -> torch.Tensor:
    """The final-normed hidden [B, H] of the block [anchor, MASK x (B-1)] at positions S..S+B-1 drafted after the
    context features [S, nf*H] (DFlash2Qwen3Model.forward with DFlash2Qwen3DecoderLayer). The convolutions' block
    is the served one, 1 + num_speculative_tokens = B query rows."""
    dc = c["dflash_config"]
    B = int(dc.get("block_size", c.get("block_size")))
    taps, g = int(dc["conv_kernel_size"]), int(dc["conv_group_size"])
    eps = float(c.get("rms_norm_eps", 1e-6))
    S = features.shape[0]
    kv = context_kv(c, W, features)
    ids = torch.tensor([anchor_token] + [int(dc["mask_token_id"])] * (B - 1), dtype=torch.long)
    positions = torch.arange(S, S + B)
    hidden = embed[ids] * float(dc.get("input_embedding_scale", 1.0))
    residual = None
    for l in range(int(c["num_hidden_layers"])):
        p = f"layers.{l}."
        hidden, residual = rms_add(hidden, residual, W[p + "input_layernorm.weight"], eps)
        hidden, coeff = conv_prepare(W, p + "attention_conv.", hidden, B, taps, g)
        hidden = block_attention(c, W, l, hidden, positions, kv[l])
        hidden = conv_finish(W, p + "attention_conv.", hidden, coeff, B, taps, g)
        hidden, residual = rms_add(hidden, residual, W[p + "post_attention_layernorm.weight"], eps)
        hidden, coeff = conv_prepare(W, p + "mlp_conv.", hidden, B, taps, g)
        hidden = (torch.nn.functional.silu(hidden @ W[p + "mlp.gate_proj.weight"].T)
                  * (hidden @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
        hidden = conv_finish(W, p + "mlp_conv.", hidden, coeff, B, taps, g)
    h, _ = rms_add(hidden, residual, W["norm.weight"], eps)
    return h


# ----------------------------------------------------------------------------------------------------------
# The candidate selector and the greedy walk (spec 1.2)
# ----------------------------------------------------------------------------------------------------------


def topk_low_id(z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row in descending order, equal values by the lower id first (a stable sort)."""
    order = torch.sort(-z, dim=-1, stable=True).indices[:, :k]
    return z.gather(1, order), order


def compute_candidates(c: dict, h: torch.Tensor, lm_head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DFlash2Qwen3ForCausalLM.compute_candidates over rows h [n, H]: (ids [n, K], unary values [n, K])."""
    dc = c["dflash_config"]
    values, ids = topk_low_id(h @ lm_head.T, int(dc["selector_top_k"]))
    values = values * float(dc.get("output_multiplier", 1.0))
    cap = float(dc.get("final_logit_softcapping") or 0.0)
    if cap > 0:
        values = torch.tanh(values / cap) * cap
    return ids, values


def score_edges(W: dict, ids: torch.Tensor, values: torch.Tensor, h: torch.Tensor, anchor_token: int) -> torch.Tensor:
    """CandidateSelector.forward / _score_edges for one request: e [n, K(prev), K(cand)] with
    e[t, p, j] = values[t, j] + sum_q P[prev(t, p), q] (W h_t)_q S[ids[t, j], q]; prev(0, .) = the anchor,
    prev(t, p) = ids[t-1, p]."""
    n, K = ids.shape
    g = h @ W["candidate_selector.hidden_projection.weight"].T  # [n, r]
    prev = torch.cat([torch.full((1, K), anchor_token, dtype=torch.long), ids[:-1]], dim=0)  # [n, K]
    P = W["candidate_selector.predecessor_codebook"][prev]  # [n, K, r]
    Sc = W["candidate_selector.successor_codebook"][ids]  # [n, K, r]
    return values[:, None, :] + torch.einsum("lpr,lcr->lpc", P * g[:, None, :], Sc)


def greedy_walk(e: torch.Tensor, ids: torch.Tensor) -> tuple[list, list]:
    """speculator.py _selector_walk_kernel at temperature 0: from row 0 (the anchor) take the first maximum of the
    row, and its candidate's row at the next slot. Returns (path tokens, the row index p used at each slot)."""
    path, rows, p = [], [], 0
    for t in range(e.shape[0]):
        row = e[t, p]
        j = int(torch.nonzero(row == row.max())[0])
        rows.append(p)
        path.append(int(ids[t, j]))
        p = j
    return path, rows


def draft_tokens(c: dict, W: dict, features, anchor_token: int, embed, lm_head) -> dict:
    """The whole draft of one block: h, the candidates of slots 1..B-1, the lattice, the greedy path."""
    h = draft_block(c, W, features, anchor_token, embed)
    ids, values = compute_candidates(c, h[1:], lm_head)
    e = score_edges(W, ids, values, h[1:], anchor_token)
    path, rows = greedy_walk(e, ids)
    return {"h": h, "ids": ids, "values": values, "edges": e, "path": path, "rows": rows,
            "logits": h[1:] @ lm_head.T}


# ----------------------------------------------------------------------------------------------------------
# The golden case
# ----------------------------------------------------------------------------------------------------------

H, L, NH, NKV, D, I, V, B, TAPS, GROUP, RANK, TOPK = 32, 2, 4, 2, 8, 48, 64, 4, 2, 4, 8, 5
S_CTX, LAYER_IDS, NUM_TARGET_LAYERS, MASK_ID = 9, [1, 3], 4, 63
MARGIN = 0.05  # every order the C++ must reproduce (top-k ranks, the walk's choices) is separated by at least this


def golden_config() -> dict:
    """config.json as model/export.cpp writes it (drafter_hf_config), with F32 weights."""
    return {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "block_size": B,
        "num_target_layers": NUM_TARGET_LAYERS,
        "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": LAYER_IDS, "block_size": B,
                          "conv_kernel_size": TAPS, "conv_group_size": GROUP, "selector_rank": RANK,
                          "selector_top_k": TOPK},
        "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH,
        "num_key_value_heads": NKV, "head_dim": D, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 64, "attention_bias": False,
        "layer_types": ["full_attention"] * L, "tie_word_embeddings": False, "vocab_size": V,
        "torch_dtype": "float32", "dtype": "float32",
    }


def golden_weights(seed: int) -> dict:
    """Random weights, rounded to F32 (the values the C++ reads), as float64: matrices N(0, 0.2), norm weights
    1 + N(0, 0.2), base kernels the identity plus N(0, 0.2) noise, codebooks N(0, 1) so that the pair terms are as
    large as the logits' gaps."""
    gen = torch.Generator().manual_seed(seed)

    def n(shape, std):
        return std * torch.randn(shape, generator=gen, dtype=torch.float64)

    W = {"fc.weight": n([H, len(LAYER_IDS) * H], 0.2), "hidden_norm.weight": 1 + n([H], 0.2)}
    G = H // GROUP
    for l in range(L):
        p = f"layers.{l}."
        W[p + "input_layernorm.weight"] = 1 + n([H], 0.2)
        W[p + "self_attn.q_proj.weight"] = n([NH * D, H], 0.2)
        W[p + "self_attn.k_proj.weight"] = n([NKV * D, H], 0.2)
        W[p + "self_attn.v_proj.weight"] = n([NKV * D, H], 0.2)
        W[p + "self_attn.o_proj.weight"] = n([H, NH * D], 0.2)
        W[p + "self_attn.q_norm.weight"] = 1 + n([D], 0.2)
        W[p + "self_attn.k_norm.weight"] = 1 + n([D], 0.2)
        W[p + "post_attention_layernorm.weight"] = 1 + n([H], 0.2)
        W[p + "mlp.gate_proj.weight"] = n([I, H], 0.2)
        W[p + "mlp.up_proj.weight"] = n([I, H], 0.2)
        W[p + "mlp.down_proj.weight"] = n([H, I], 0.2)
        for conv in ("attention_conv", "mlp_conv"):
            base = n([2, TAPS, H], 0.2)
            base[:, 0] += 1.0
            W[p + conv + ".base_kernel"] = base
            W[p + conv + ".kernel_projection.weight"] = n([2 * TAPS * G, H], 0.2)
    W["norm.weight"] = 1 + n([H], 0.2)
    W["candidate_selector.hidden_projection.weight"] = n([RANK, H], 0.2)
    W["candidate_selector.predecessor_codebook"] = n([V, RANK], 1.0)
    W["candidate_selector.successor_codebook"] = n([V, RANK], 1.0)
    return {k: v.to(torch.float32).to(torch.float64) for k, v in W.items()}


def golden_inputs(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed + 1000)

    def n(shape, std):
        return (std * torch.randn(shape, generator=gen, dtype=torch.float64)).to(torch.float32).to(torch.float64)

    anchor = int(torch.randint(0, MASK_ID, (1,), generator=gen))
    return {"features": n([S_CTX, len(LAYER_IDS) * H], 1.0), "embed": n([V, H], 1.0), "lm_head": n([V, H], 0.3),
            "anchor": anchor}


def separations(out: dict) -> tuple[float, float, bool]:
    """(smallest gap among each slot's K+1 largest logits, smallest gap between the walk's choice and the runner-up
    of its row, whether the walk differs from the argmax of the logits somewhere)."""
    z = torch.sort(out["logits"], dim=-1, descending=True).values[:, :TOPK + 1]
    gap_z = float((z[:, :-1] - z[:, 1:]).min())
    gap_e = math.inf
    for t, p in enumerate(out["rows"]):
        s = torch.sort(out["edges"][t, p], descending=True).values
        gap_e = min(gap_e, float(s[0] - s[1]))
    argmax = [int(i) for i in out["logits"].argmax(-1)]
    return gap_z, gap_e, argmax != out["path"]


def self_checks(c: dict, W: dict, inp: dict) -> None:
    """(1) grouped_conv equals spec 1.1's loops; (2) with identity convolutions the served block forward gives the
    logits of tools/ref_dflash.py's training forward for the block anchored at S (features of 0..S-1 visible)."""
    gen = torch.Generator().manual_seed(5)
    u = torch.randn(2 * B, H, generator=gen, dtype=torch.float64)
    delta = torch.randn(2 * B, TAPS, H // GROUP, generator=gen, dtype=torch.float64)
    base = torch.randn(TAPS, H, generator=gen, dtype=torch.float64)
    got = grouped_conv(u, delta, base, B, H // GROUP, GROUP, TAPS)
    assert float((got - grouped_conv_loops(u, delta, base, B, GROUP)).abs().max()) < 1e-12, "grouped_conv"

    Wi = dict(W)
    for l in range(L):
        for conv in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, TAPS, H, dtype=torch.float64)
            base[:, 0] = 1
            Wi[f"layers.{l}.{conv}.base_kernel"] = base
            Wi[f"layers.{l}.{conv}.kernel_projection.weight"] = torch.zeros_like(
                W[f"layers.{l}.{conv}.kernel_projection.weight"])
    h = draft_block(c, Wi, inp["features"], inp["anchor"], inp["embed"])
    dc = ref.DraftConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                         num_key_value_heads=NKV, head_dim=D, block_size=B, target_layer_ids=LAYER_IDS,
                         mask_token_id=MASK_ID, rope_theta=10000.0)
    # the training forward over ids[0..S] with the block anchored at S: context keys 0..S-1 (k < a), block at S..
    ids = [0] * S_CTX + [inp["anchor"]]
    F = torch.cat([inp["features"], torch.zeros(1, len(LAYER_IDS) * H, dtype=torch.float64)])
    fw = ref.drafter_forward(Wi, dc, inp["embed"], inp["lm_head"], F, ids, [S_CTX], [1])
    diff = float((h @ inp["lm_head"].T - fw["logits"]).abs().max())
    assert diff < 1e-10, f"identity convolutions: served forward differs from ref_dflash's by {diff}"


def make_golden(out_dir: str) -> None:
    c = golden_config()
    for seed in range(200):  # the first seed whose orders are well separated and whose pair terms change a choice
        W = golden_weights(seed)
        inp = golden_inputs(seed)
        out = draft_tokens(c, W, inp["features"], inp["anchor"], inp["embed"], inp["lm_head"])
        gap_z, gap_e, changed = separations(out)
        if gap_z > MARGIN and gap_e > MARGIN and changed:
            break
    else:
        raise RuntimeError("no seed in 0..199 gives separated orders with a path the pair terms change")
    self_checks(c, W, inp)
    os.makedirs(os.path.join(out_dir, "export"), exist_ok=True)
    with open(os.path.join(out_dir, "export", "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "export", "model.safetensors"), W, {"format": "pt"})
    write_safetensors(os.path.join(out_dir, "inputs.safetensors"),
                      {"features": inp["features"], "embed": inp["embed"], "lm_head": inp["lm_head"],
                       "anchor_token": torch.tensor([inp["anchor"]], dtype=torch.int32)},
                      {"written_by": "tools/ref_dflash2.py --make-golden", "seed": seed})
    n = B - 1
    expected = {
        "about": "tools/ref_dflash2.py --make-golden: the served DFlash2 draft of one block (vLLM qwen3_dflash2.py), "
                 "float64 from the F32 tensors of export/ and inputs.safetensors",
        "seed": seed, "S": S_CTX, "block_size": B, "anchor_token": inp["anchor"],
        "h": out["h"].tolist(),
        "candidates": out["ids"].tolist(),
        "candidate_logits": out["values"].tolist(),
        "path_rows": [{"slot": t + 1, "prev": inp["anchor"] if t == 0 else out["path"][t - 1],
                       "scores": out["edges"][t, out["rows"][t]].tolist()} for t in range(n)],
        "path": out["path"],
        "argmax_path": [int(i) for i in out["logits"].argmax(-1)],
        "min_logit_gap": gap_z, "min_choice_gap": gap_e,
    }
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(f"seed {seed}: path {out['path']} (argmax {expected['argmax_path']}), gaps {gap_z:.3g} / {gap_e:.3g}; "
          f"wrote {out_dir}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--make-golden", metavar="OUT", help="write the golden case into OUT")
    ap.add_argument("--export", help="a DFlash2 export directory")
    ap.add_argument("--inputs", help="safetensors with features [S, nf*H], embed [V, H], lm_head [V, H], anchor_token")
    a = ap.parse_args()
    if a.make_golden:
        make_golden(a.make_golden)
        return 0
    if not (a.export and a.inputs):
        ap.error("give --make-golden OUT, or --export DIR and --inputs FILE")
    c, W = load_export(a.export)
    t = read_safetensors(a.inputs)
    f64 = {k: v.to(torch.float64) for k, v in t.items() if v.is_floating_point()}
    out = draft_tokens(c, W, f64["features"], int(t["anchor_token"][0]), f64["embed"], f64["lm_head"])
    print(json.dumps({"h": out["h"].tolist(), "candidates": out["ids"].tolist(), "path": out["path"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
