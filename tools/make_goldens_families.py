#!/usr/bin/env python3
"""Golden files of today's target families beyond part 1 (issues 36 and 37), made by transformers on the GPU
machine (the CPU is enough):

    python3 tools/make_goldens_families.py [--out tests/golden] [--only target_gpt_oss,...]

Each directory holds config.json, the weights (model.safetensors) and golden.safetensors in the format of
tools/make_goldens.py (input_ids, hidden_states.k, layer_output.l, final_hidden, logits, kv_decode_logits; MoE
targets also router_topk.l), computed by transformers' own forward in float64 (model.double()). Where transformers
computes in float32 inside a float64 model (RMSNorm, RoPE angles, the gated delta rule, the gated RMSNorm of
Qwen3.5), the golden carries that rounding (~1e-6); __metadata__ says so.

  target_gpt_oss        GptOssForCausalLM: 4 layers sliding (window 16) / full alternating, sinks, q/k/v/o biases,
                        YaRN (factor 4, original 16 positions), 8 experts top-2 with biases; 40 tokens, so positions
                        past the window and past YaRN's original length are exercised. Experts saved in HF's layout
                        (gate_up_proj [E, H, 2I], gate and up interleaved along 2I; down_proj [E, I, H]).
  target_gpt_oss_mxfp4  the same model with its experts in the published MXFP4 layout (*_blocks [E, N, K/32, 16]
                        uint8, two e2m1 per byte, low nibble first; *_scales [E, N, K/32] e8m0) written by
                        mxfp4_quantize below, config.json with quantization_config {quant_method: mxfp4}; its
                        golden is transformers' forward with the experts dequantised by transformers' own
                        convert_moe_packed_tensors (checked equal to ours, mxfp4_dequantize).
  target_qwen3_next     Qwen3NextForCausalLM: 4 layers (3 Gated DeltaNet + 1 gated full attention), MoE 8 experts
                        top-2 with a shared expert, layer 1 dense (mlp_only_layers); 150 tokens (> the 64-token chunk).
  target_qwen3_5        Qwen3_5ForCausalLM (text, dense), 4 layers, 150 tokens.
  target_qwen3_5_moe    Qwen3_5MoeForCausalLM (text, MoE with a shared expert), 4 layers, 150 tokens.
  target_qwen3_5_vl     Qwen3_5ForConditionalGeneration (the published image-text checkpoints' class): text
                        weights under model.language_model., a tiny vision tower under model.visual., config under
                        text_config, plus two mtp.* tensors (as the published checkpoints carry) that must be
                        ignored; golden = the forward on text tokens only.

  target_gemma4         Gemma4ForConditionalGeneration (the published class): 5 layers sliding (window 8) / full
                        (sliding, sliding, full, sliding, full), head_dim 16 / global_head_dim 32, kv heads 2 / global
                        1 with attention_k_eq_v, proportional RoPE (partial 0.25), GELU-tanh MLP, tied embedding,
                        final_logit_softcapping 15, a tiny vision tower to be ignored; 40 tokens (past the window).
  target_gemma4_text    Gemma4ForCausalLM: attention_k_eq_v false (v_proj on the full layers), untied lm_head, no
                        softcap.
  target_gemma4_moe     target_gemma4 with enable_moe_block: 8 experts top-2 of width 32 beside the dense MLP.
                        The three Gemma 4 directories are also made by tools/ref_gemma4.py (an independent float64
                        reading without transformers, on any machine): the same configs, other random weights; this
                        script's files replace those and the C++ tests must pass on either.

  target_minimax_m2     MiniMaxM2ForCausalLM on the checkpoint tools/ref_minimax_m2.py writes (the published
                        config.json keys and tensor names: block_sparse_moe.gate, .e_score_correction_bias,
                        .experts.{e}.w1/w3/w2, the MTP module's model.layers.4.* to be ignored), loaded into
                        transformers' modules by hand (w1 and w3 stacked into gate_up_proj); 40 tokens. The golden is
                        transformers' forward; it is compared with the one ref_minimax_m2.py wrote (printed and
                        checked at 1e-9) and replaces it. router_topk.l is sorted as dflash chooses (descending
                        sigmoid + correction bias, ties to the lower index): transformers' topk is unsorted.
                        config.json keeps rotary_dim and adds rope_parameters.partial_rotary_factor, which is what
                        transformers' rotary embedding reads (checked: inv_freq has rotary_dim / 2 entries).

  target_deepseek_v3    DeepseekV3ForCausalLM on the checkpoint tools/ref_deepseek_v3.py writes (q_lora_rank, YaRN with
                        mscale / mscale_all_dim, rope_interleave, 16 experts top-4 in 4 groups top-2, a shared expert,
                        one dense layer, the MTP layer model.layers.4.* to be ignored), per-expert weights stacked into
                        gate_up_proj / down_proj; 40 tokens. Compared with the reference's golden (1e-5; the experts
                        chosen equal), then replaces it. router_topk.l: transformers' choice (route_tokens_to_experts
                        on the router's logits) in dflash's order.
  target_deepseek_v3_kimi  the same for the reference's Kimi-K2 layout (model_type kimi_k2, q_proj, rotate-half RoPE,
                        one group).

Linear-attention parameters are drawn so that decay and norms are non-trivial: A_log = log U(0.05, 1.5),
dt_bias ~ N(-1, 0.5) (per-step decay exp(g) spread over ~0.4 .. 0.99, so the state carries across chunks), the
zero-centred norms' weights N(0, 0.1).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402

check, maxdiff, save_st, f32 = mg.check, mg.maxdiff, mg.save_st, mg.f32

GPT_OSS_SEQ, GPT_OSS_PREFILL = 40, 36
HYBRID_SEQ, HYBRID_PREFILL = 150, 140

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


# ------------------------------------------------------------------------------------------------------------
# MXFP4 (OCP Microscaling Formats v1.0: e2m1 elements, one e8m0 scale per block of 32)
# ------------------------------------------------------------------------------------------------------------

def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, N, K] (K % 32 == 0) -> blocks uint8 [E, N, K/32, 16], scales uint8 [E, N, K/32].
    Scale exponent per block: floor(log2(amax)) - 2 (e2m1's largest exponent is 2, OCP MX 6.3), so amax / 2^e is
    in [4, 8) and values above 6 saturate to 6; elements round to the nearest e2m1 value (ties to the even code).
    Byte j of a block holds elements 2j (low nibble) and 2j + 1 (high nibble), as transformers reads them."""
    E, N, K = w.shape
    assert K % 32 == 0
    g = w.double().reshape(E, N, K // 32, 32)
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-300))) - 2, torch.full_like(amax, -127))
    e = e.clamp(-127, 127)
    x = g / torch.pow(2.0, e)[..., None]
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    a = x.abs().clamp(max=6.0)
    d = (a[..., None] - grid).abs()
    # nearest; on an exact tie take the even code (round half to even in the e2m1 encoding)
    best = d.min(-1, keepdim=True).values
    cand = (d == best)
    codes = torch.arange(8)
    even_pref = torch.where(cand, torch.where(codes % 2 == 0, codes, codes + 8), torch.full_like(codes, 99))
    mag = even_pref.min(-1).values % 8
    sign = ((x < 0) & (mag > 0)).to(torch.int64)
    code = (mag + 8 * sign).to(torch.uint8)  # [E, N, G, 32]
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    scales = (e + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def mxfp4_dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Ours (independent of transformers): blocks [E, N, G, 16], scales [E, N, G] -> float64 [E, N, G*32]."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float64)
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    v = torch.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)
    v = v * torch.pow(2.0, scales.double() - 127)[..., None]
    return v.reshape(blocks.shape[0], blocks.shape[1], -1)


# ------------------------------------------------------------------------------------------------------------
# Model specs
# ------------------------------------------------------------------------------------------------------------

def gpt_oss_config():
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=512, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=64, rms_norm_eps=1e-5,
        attention_bias=True, tie_word_embeddings=False, bos_token_id=None, eos_token_id=1, pad_token_id=None,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})


def hybrid_text_kw(moe: bool) -> dict:
    kw = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
              linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
              linear_num_value_heads=4,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
              bos_token_id=None, eos_token_id=1, pad_token_id=None)
    if moe:
        kw.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
    else:
        kw.update(intermediate_size=128)
    return kw


def gemma4_text_kw(name: str) -> dict:
    """Gemma4TextConfig keys of tools/ref_gemma4.py's tiny models (the published key layout)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ref_gemma4

    kw = ref_gemma4.text_config(name)
    kw.pop("model_type", None)
    return kw


def make_model(name: str):
    import transformers as T

    if name.startswith("target_gemma4"):
        kw = gemma4_text_kw(name)
        if name == "target_gemma4_text":
            return T.Gemma4ForCausalLM(T.Gemma4TextConfig(**kw)), 2011
        vis = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                   intermediate_size=32)
        cfg = T.Gemma4Config(text_config=kw, vision_config=vis, audio_config=None, tie_word_embeddings=True)
        return T.Gemma4ForConditionalGeneration(cfg), 2012 if name == "target_gemma4" else 2013

    if name == "target_gpt_oss":
        return T.GptOssForCausalLM(gpt_oss_config()), 2001
    if name == "target_qwen3_next":
        kw = hybrid_text_kw(True)
        kw.update(intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])
        return T.Qwen3NextForCausalLM(T.Qwen3NextConfig(**kw)), 2002
    if name == "target_qwen3_5":
        return T.Qwen3_5ForCausalLM(T.Qwen3_5TextConfig(**hybrid_text_kw(False))), 2003
    if name == "target_qwen3_5_moe":
        return T.Qwen3_5MoeForCausalLM(T.Qwen3_5MoeTextConfig(**hybrid_text_kw(True))), 2004
    if name == "target_qwen3_5_vl":
        vis = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                   spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
        cfg = T.Qwen3_5Config(text_config=hybrid_text_kw(False), vision_config=vis, tie_word_embeddings=False)
        return T.Qwen3_5ForConditionalGeneration(cfg), 2005
    raise KeyError(name)


def decoder(model):
    """The text decoder (its .layers, .norm, .embed_tokens) of a CausalLM or an image-text model."""
    m = model.model
    return getattr(m, "language_model", m)


def reinit_(model, seed: int) -> None:
    """make_goldens.reinit_ plus the families' own parameters: sinks N(0, 1) (some above, some below the scores),
    A_log = log U(0.05, 1.5), dt_bias N(-1, 0.5), zero-centred RMSNorm weights N(0, 0.1), expert biases N(0, 0.02)."""
    mg.reinit_(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    zero_centred = ("Qwen3NextRMSNorm", "Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm")
    with torch.no_grad():
        for mname, mod in model.named_modules():
            cls = type(mod).__name__
            if cls in zero_centred and hasattr(mod, "weight"):
                mod.weight.copy_(0.1 * torch.randn(mod.weight.shape, generator=g))
            if hasattr(mod, "A_log") and isinstance(mod.A_log, torch.nn.Parameter):
                n = mod.A_log.numel()
                mod.A_log.copy_(torch.log(0.05 + 1.45 * torch.rand(n, generator=g)))
                mod.dt_bias.copy_(-1.0 + 0.5 * torch.randn(n, generator=g))
            if hasattr(mod, "sinks") and isinstance(mod.sinks, torch.nn.Parameter):
                mod.sinks.copy_(torch.randn(mod.sinks.shape, generator=g))
            if cls == "Gemma4TextScaledWordEmbedding" and "per_layer" not in mname:
                mod.weight.copy_(0.5 * torch.randn(mod.weight.shape, generator=g))  # logits reach the softcap's bend
            if hasattr(mod, "layer_scalar") and torch.is_tensor(mod.layer_scalar):
                mod.layer_scalar.copy_(0.6 + 0.8 * torch.rand(mod.layer_scalar.shape, generator=g))
            for bn in ("gate_up_proj_bias", "down_proj_bias"):
                if hasattr(mod, bn) and isinstance(getattr(mod, bn), torch.nn.Parameter):
                    p = getattr(mod, bn)
                    p.copy_(0.02 * torch.randn(p.shape, generator=g))


def eager(model) -> None:
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as e:  # noqa: BLE001
            print(f"  note: set_experts_implementation: {e!r}")
    try:
        model.set_attn_implementation("eager")
    except Exception as e:  # noqa: BLE001
        print(f"  note: set_attn_implementation: {e!r}")


def hf_forward(model, ids: torch.Tensor) -> dict:
    dec = decoder(model)
    cap, hooks = {}, []
    for l, layer in enumerate(dec.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, i, o, l=l: cap.__setitem__(f"layer_output.{l}", mg.layer_out(o)[0].detach().clone())))
    hooks.append(dec.norm.register_forward_hook(
        lambda m, i, o: cap.__setitem__("final_hidden", mg.layer_out(o)[0].detach().clone())))
    routers = []
    for l, layer in enumerate(dec.layers):
        r = getattr(getattr(layer, "mlp", None), "router", None) or getattr(getattr(layer, "mlp", None), "gate", None)
        r = r or getattr(layer, "router", None)  # Gemma 4: the router beside the dense MLP
        if r is not None:
            routers.append(l)
            hooks.append(r.register_forward_hook(
                lambda m, i, o, l=l: cap.__setitem__(f"router_out.{l}", o)))
    try:
        with torch.no_grad():
            out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    cap["logits"] = out.logits[0].detach().clone()
    cap["hidden_states"] = [h[0].detach().clone() for h in out.hidden_states]
    cap["router_layers"] = routers
    return cap


def router_topk(o) -> torch.Tensor:
    """The experts chosen, from a router's output tuple (transformers 5: (logits, scores, indices))."""
    if isinstance(o, (tuple, list)):
        for t in reversed(o):
            if torch.is_tensor(t) and t.dtype in (torch.int64, torch.int32):
                return t.to(torch.int32)
    raise RuntimeError(f"router output without indices: {type(o)}")


def write_golden(name: str, model, cfg_seed: int, d: str, seq: int, prefill: int, extra_md: dict,
                 ids: torch.Tensor | None = None, sort_topk=None) -> dict:
    import transformers

    dec = decoder(model)
    vocab = dec.embed_tokens.weight.shape[0]
    if ids is None:
        g = torch.Generator().manual_seed(cfg_seed + 7)
        ids = torch.randint(0, vocab, (seq,), generator=g)
    cap = hf_forward(model, ids)
    kv = mg.hf_kv_decode(model, ids, prefill)
    L = len(dec.layers)
    hs = cap["hidden_states"]
    check(len(hs) == L + 1, f"{name}: len(hidden_states) = {len(hs)} (want {L + 1})")
    sem = {
        "hidden_states_0_is_embedding": maxdiff(hs[0], dec.embed_tokens.weight[ids]) < 1e-12,
        "hidden_states_k_is_layer_output_k_minus_1_for_k_lt_L": all(
            maxdiff(hs[k], cap[f"layer_output.{k - 1}"]) < 1e-12 for k in range(1, L)),
        "hidden_states_last_is_normed": maxdiff(hs[-1], cap["final_hidden"]) < 1e-12,
    }
    lm = model.get_output_embeddings().weight.detach()
    want = cap["final_hidden"] @ lm.T
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if softcap:  # Gemma: cap tanh(logits / cap)
        want = softcap * torch.tanh(want / softcap)
    check(maxdiff(want, cap["logits"]) < 1e-9, f"{name}: logits = final_hidden @ lm_head^T (soft-capped)")
    dkv = maxdiff(kv, cap["logits"][prefill:])
    # Hybrids decode with the recurrent form, prefill with the chunked one (both float32 inside): ~1e-6.
    check(dkv < 1e-4, f"{name}: cached decode logits equal the full forward (max diff {dkv:.2e})")
    tensors = {"input_ids": ids.to(torch.int32), "final_hidden": f32(cap["final_hidden"]),
               "logits": f32(cap["logits"]), "kv_decode_logits": f32(kv)}
    for k, h in enumerate(hs):
        tensors[f"hidden_states.{k}"] = f32(h)
    for l in range(L):
        tensors[f"layer_output.{l}"] = f32(cap[f"layer_output.{l}"])
    for l in cap["router_layers"]:
        if f"router_out.{l}" in cap:
            o = cap[f"router_out.{l}"]
            # routers returning only their logits (DeepseekV3TopkRouter): sort_topk chooses from them
            idx = router_topk(o) if isinstance(o, (tuple, list)) or sort_topk is None else None
            tensors[f"router_topk.{l}"] = idx if sort_topk is None else sort_topk(l, o, idx)
    md = {
        "description": "transformers forward in float64 (model.double(), eager attention and experts) of the model "
                       "in this directory on input_ids; stored as F32",
        "input_ids": f"I32 [{seq}] random ids, torch.Generator seed {cfg_seed + 7}",
        "hidden_states.k": "HF output_hidden_states[k], k = 0..L, exactly as returned",
        "layer_output.l": "residual stream after decoder layer l (forward hook), pre final norm",
        "final_hidden": "output of the decoder's final norm (input of lm_head)",
        "logits": "[S, V]",
        "kv_decode_logits": f"[{seq - prefill}, V]: prefill input_ids[0:{prefill}] with use_cache=True, then one "
                            f"token at a time; row t = logits at position {prefill}+t",
        "router_topk.l": "I32 [S, k]: the experts chosen at layer l, in transformers' order",
        "float32_inside": "transformers computes RMSNorm, RoPE angles, the gated delta rule and the gated RMSNorm in "
                          "float32 even in a float64 model: ~1e-6 relative",
        "max_abs_diff_kv_decode_vs_forward": f"{dkv:.3e}",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "num_hidden_layers": str(L),
    }
    md.update({k: ("true" if v else "false") for k, v in sem.items()})
    md.update(extra_md)
    save_st(tensors, os.path.join(d, "golden.safetensors"), md)
    return cap


def build(name: str, out_root: str) -> None:
    import transformers

    t0 = time.time()
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(1)
    model, seed = make_model(name)
    model.eval()
    reinit_(model, seed)
    model = model.float()
    mg.save_pretrained(model, d)
    extra = {}
    if name == "target_qwen3_5_vl":
        # The published image-text checkpoints also carry the MTP head's weights (mtp.*): add two, to be ignored.
        from safetensors.torch import load_file, save_file

        p = os.path.join(d, "model.safetensors")
        sd = load_file(p)
        check(any(k.startswith("model.language_model.") for k in sd), f"{name}: text weights under model.language_model.")
        check(any(k.startswith("model.visual.") for k in sd), f"{name}: vision weights under model.visual.")
        sd["mtp.fc.weight"] = torch.zeros(64, 128)
        sd["mtp.layers.0.mlp.gate_proj.weight"] = torch.zeros(128, 64)
        save_file(sd, p, metadata={"format": "pt"})
        extra["mtp"] = "mtp.fc.weight and mtp.layers.0.mlp.gate_proj.weight added (zeros) to be ignored"
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    model = model.double()
    eager(model)
    short = "gpt_oss" in name or "gemma4" in name
    seq, pre = (GPT_OSS_SEQ, GPT_OSS_PREFILL) if short else (HYBRID_SEQ, HYBRID_PREFILL)
    cap = write_golden(name, model, seed, d, seq, pre, extra)
    # Reload what was saved: the directory alone must reproduce the golden.
    try:
        cls = type(model)
        m2 = cls.from_pretrained(d).double().eval()
        eager(m2)
        ids = torch.randint(0, decoder(model).embed_tokens.weight.shape[0], (seq,),
                            generator=torch.Generator().manual_seed(seed + 7))
        with torch.no_grad():
            lg2 = m2(input_ids=ids[None], use_cache=False).logits[0]
        drl = maxdiff(lg2, cap["logits"])
        check(drl < 1e-9, f"{name}: reloaded directory reproduces the logits (max diff {drl:.2e})")
    except Exception as e:  # noqa: BLE001
        check(False, f"{name}: reload failed: {e!r}")
    if name.startswith("target_gemma4"):
        compare_gemma4_reference(name, model, d, seed, seq, pre, cap)
    print(f"SUMMARY golden {name}: files={sorted(os.listdir(d))} model_type={cj.get('model_type')} "
          f"({time.time() - t0:.1f}s)", flush=True)
    if name == "target_gpt_oss":
        build_gpt_oss_mxfp4(model, seed, out_root)


def compare_gemma4_reference(name: str, model, d: str, seed: int, seq: int, pre: int, cap: dict) -> None:
    """tools/ref_gemma4.py's independent reading on the weights transformers saved in d: its logits, layer outputs and
    experts must equal transformers' (what confirms the reading the CPU goldens of ref_gemma4.py rest on)."""
    import ref_gemma4
    from safetensors.torch import load_file

    sd = load_file(os.path.join(d, "model.safetensors"))
    pre_lm = "model.language_model." if any(k.startswith("model.language_model.") for k in sd) else "model."
    w = {"embed": sd[pre_lm + "embed_tokens.weight"], "norm": sd[pre_lm + "norm.weight"]}
    if "lm_head.weight" in sd:
        w["lm_head"] = sd["lm_head.weight"]
    for k, t in sd.items():
        if not k.startswith(pre_lm + "layers."):
            continue
        _, l, rest = k[len(pre_lm):].split(".", 2)
        rest = rest.replace("self_attn.", "").replace("mlp.", "")
        if rest.endswith(".weight"):
            rest = rest[: -len(".weight")]
        w[f"layers.{l}.{rest}"] = t
    cfg = ref_gemma4.text_config(name)
    ids = torch.randint(0, cfg["vocab_size"], (seq,), generator=torch.Generator().manual_seed(seed + 7))
    o = ref_gemma4.forward(w, cfg, ids)
    # relative to each tensor's largest value: transformers computes its RMSNorms in float32 inside the float64 model
    dl = maxdiff(o["logits"], cap["logits"]) / float(cap["logits"].abs().max())
    dh = max(maxdiff(o["layer_output"][l], cap[f"layer_output.{l}"]) / float(cap[f"layer_output.{l}"].abs().max())
             for l in range(cfg["num_hidden_layers"]))
    print(f"  {name}: ref_gemma4 vs transformers (max abs diff / max abs): logits {dl:.2e}, layer outputs {dh:.2e}")
    check(dl < 1e-5 and dh < 1e-5, f"{name}: tools/ref_gemma4.py equals transformers (logits {dl:.2e}, layers {dh:.2e})")
    for l, ti in o["router_topk"].items():
        if f"router_out.{l}" in cap:
            check(torch.equal(ti, router_topk(cap[f"router_out.{l}"])), f"{name}: layer {l} experts equal transformers'")


def build_gpt_oss_mxfp4(model, seed: int, out_root: str) -> None:
    """The MXFP4 twin of target_gpt_oss: experts quantised by mxfp4_quantize, written in the published layout."""
    import transformers
    from safetensors.torch import save_file

    name = "target_gpt_oss_mxfp4"
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    try:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    except Exception as e:  # noqa: BLE001
        convert_moe_packed_tensors = None
        check(False, f"{name}: transformers.integrations.mxfp4.convert_moe_packed_tensors missing: {e!r}")
    model = model.float()
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    worst_ours_vs_hf = 0.0
    for l, layer in enumerate(decoder(model).layers):
        ex = layer.mlp.experts
        for proj in ("gate_up_proj", "down_proj"):
            w = getattr(ex, proj).detach()          # HF [E, in, out]
            wt = w.transpose(1, 2).contiguous()     # [E, out, in]: rows = outputs, blocks along the input
            blocks, scales = mxfp4_quantize(wt)
            ours = mxfp4_dequantize(blocks, scales)  # [E, out, in] float64
            if convert_moe_packed_tensors is not None:
                hf = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
                dv = maxdiff(hf.transpose(1, 2), ours)
                worst_ours_vs_hf = max(worst_ours_vs_hf, dv)
                deq = hf
            else:
                deq = ours.transpose(1, 2).float()
            qerr = float((ours - wt.double()).abs().max() / wt.abs().max())
            # OCP scale rule (floor(log2 amax) - 2) saturates block maxima in (6, 8) x 2^e to 6: at most 1/4 of amax.
            check(qerr <= 0.25 + 1e-12, f"{name}: layer {l} {proj} quantisation error {qerr:.3f} of amax")
            key = f"model.layers.{l}.mlp.experts.{proj}"
            del sd[key]
            sd[key + "_blocks"] = blocks
            sd[key + "_scales"] = scales
            with torch.no_grad():
                getattr(ex, proj).copy_(deq.to(getattr(ex, proj).dtype))
    check(worst_ours_vs_hf == 0.0, f"{name}: our dequantisation equals transformers' (max diff {worst_ours_vs_hf:.2e})")
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    cfg["architectures"] = ["GptOssForCausalLM"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, default=str)
    model = model.double()
    eager(model)
    extra = {"experts": "MXFP4: golden = transformers' forward with the experts dequantised by "
                        "transformers.integrations.mxfp4.convert_moe_packed_tensors",
             "max_abs_diff_ours_vs_hf_dequant": f"{worst_ours_vs_hf:.3e}"}
    cap = write_golden(name, model, seed, d, GPT_OSS_SEQ, GPT_OSS_PREFILL, extra)
    # Does transformers load the directory itself (MXFP4 -> dequantised on a machine without its kernels)?
    try:
        m2 = transformers.GptOssForCausalLM.from_pretrained(d, device_map="cpu").double().eval()
        eager(m2)
        ids = torch.randint(0, 512, (GPT_OSS_SEQ,), generator=torch.Generator().manual_seed(seed + 7))
        with torch.no_grad():
            lg2 = m2(input_ids=ids[None], use_cache=False).logits[0]
        drl = maxdiff(lg2, cap["logits"])
        print(f"  {name}: transformers' own load of the MXFP4 directory: logits max diff {drl:.2e}")
        check(drl < 1e-3, f"{name}: transformers loads the MXFP4 directory to the same logits ({drl:.2e})")
    except Exception as e:  # noqa: BLE001
        print(f"  note: {name}: transformers' from_pretrained of the MXFP4 directory: {e!r}")
    print(f"SUMMARY golden {name}: files={sorted(os.listdir(d))} ours_vs_hf_dequant={worst_ours_vs_hf:.1e}",
          flush=True)


def self_check_mxfp4() -> None:
    """Hand-made bytes: 0x21 = elements 0.5 (low nibble 1) and 1.0 (high nibble 2); 0xF8 = -0.0 and -6.0;
    scale 128 doubles them."""
    blocks = torch.zeros(1, 1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x21
    blocks[0, 0, 0, 1] = 0xF8
    scales = torch.tensor([[[128]]], dtype=torch.uint8)
    v = mxfp4_dequantize(blocks, scales)[0, 0]
    check(v[:4].tolist() == [1.0, 2.0, -0.0, -12.0], f"mxfp4 hand bytes: {v[:4].tolist()}")
    w = torch.randn(2, 3, 64, dtype=torch.float64)
    b, s = mxfp4_quantize(w)
    back = mxfp4_dequantize(b, s)
    b2, s2 = mxfp4_quantize(back)
    check(torch.equal(b, b2) and torch.equal(s, s2), "mxfp4: quantise(dequantise(q)) == q")


# ------------------------------------------------------------------------------------------------------------
# Goldens on a reference script's checkpoint (MiniMax-M2, DeepSeek-V3)
# ------------------------------------------------------------------------------------------------------------

def compare_with_reference(name: str, d: str, ref_golden: dict, L: int, ref: str) -> None:
    """The golden transformers just wrote in d against the one the reference script `ref` wrote before (ref_golden):
    the final norm, the logits, the cached decode and every layer's output within 1e-5, the experts chosen equal in
    every layer the reference records."""
    from safetensors.torch import load_file

    new = load_file(os.path.join(d, "golden.safetensors"))
    worst = 0.0
    for key in ("final_hidden", "logits", "kv_decode_logits"):
        worst = max(worst, maxdiff(new[key].double(), ref_golden[key].double()))
    for l in range(L):
        worst = max(worst, maxdiff(new[f"layer_output.{l}"].double(), ref_golden[f"layer_output.{l}"].double()))
        if f"router_topk.{l}" in ref_golden:
            check(torch.equal(new[f"router_topk.{l}"], ref_golden[f"router_topk.{l}"]),
                  f"{name}: layer {l}: transformers chooses other experts than {ref}")
    print(f"  {name}: transformers vs {ref}: max abs diff {worst:.2e}")
    check(worst < 1e-5, f"{name}: transformers' golden differs from the reference's ({worst:.2e})")


# ------------------------------------------------------------------------------------------------------------
# MiniMax-M2: transformers on the checkpoint of tools/ref_minimax_m2.py
# ------------------------------------------------------------------------------------------------------------

def build_minimax_m2(out_root: str) -> None:
    import transformers as T
    from safetensors.torch import load_file

    import ref_minimax_m2 as ref

    t0 = time.time()
    name = "target_minimax_m2"
    d = os.path.join(out_root, name)
    if not os.path.exists(os.path.join(d, "model.safetensors")):  # the checkpoint comes from the reference script
        check(ref.main_for(d) == 0, f"{name}: tools/ref_minimax_m2.py failed")
    with open(os.path.join(d, "config.json")) as f:
        pub = json.load(f)
    sd = load_file(os.path.join(d, "model.safetensors"))
    ref_golden = load_file(os.path.join(d, "golden.safetensors"))
    L, E, rd, hd = pub["num_hidden_layers"], pub["num_local_experts"], pub["rotary_dim"], pub["head_dim"]
    rope = {"rope_type": "default", "rope_theta": float(pub["rope_theta"]), "partial_rotary_factor": rd / hd}
    cfg = T.MiniMaxM2Config(
        vocab_size=pub["vocab_size"], hidden_size=pub["hidden_size"], intermediate_size=pub["intermediate_size"],
        num_hidden_layers=L, num_attention_heads=pub["num_attention_heads"],
        num_key_value_heads=pub["num_key_value_heads"], head_dim=hd, hidden_act="silu",
        max_position_embeddings=pub["max_position_embeddings"], rms_norm_eps=pub["rms_norm_eps"],
        bos_token_id=None, eos_token_id=pub["eos_token_id"], pad_token_id=None, tie_word_embeddings=False,
        num_experts_per_tok=pub["num_experts_per_tok"], num_local_experts=E, rope_parameters=rope)
    model = T.MiniMaxM2ForCausalLM(cfg).eval()
    inv = model.model.rotary_emb.inv_freq
    check(inv.numel() == rd // 2, f"{name}: transformers' inv_freq has {inv.numel()} entries (want rotary_dim/2 = "
          f"{rd // 2}): partial_rotary_factor not read")
    # the published names -> transformers' modules
    state = {}
    for k, v in sd.items():
        if k.startswith(f"model.layers.{L}."):
            continue  # the MTP module: not the language model
        if ".block_sparse_moe." not in k:
            state[k] = v
    for l in range(L):
        m = f"model.layers.{l}.block_sparse_moe."
        state[f"model.layers.{l}.mlp.gate.weight"] = sd[m + "gate.weight"]
        state[f"model.layers.{l}.mlp.e_score_correction_bias"] = sd[m + "e_score_correction_bias"]
        state[f"model.layers.{l}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([sd[m + f"experts.{e}.w1.weight"], sd[m + f"experts.{e}.w3.weight"]]) for e in range(E)])
        state[f"model.layers.{l}.mlp.experts.down_proj"] = torch.stack(
            [sd[m + f"experts.{e}.w2.weight"] for e in range(E)])
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    check(not missing and not unexpected, f"{name}: state dict missing {missing} unexpected {unexpected}")
    model = model.double()
    eager(model)
    ids = ref_golden["input_ids"].long()
    k = pub["num_experts_per_tok"]

    def sort_topk(l, out, idx):
        logits = out[0] if isinstance(out, (tuple, list)) else out
        c = torch.sigmoid(logits.double()) + model.model.layers[l].mlp.e_score_correction_bias.double()[None, :]
        rows = []
        for t in range(idx.shape[0]):
            chosen = sorted(idx[t].tolist(), key=lambda e: (-float(c[t, e]), e))
            rows.append(chosen)
        return torch.tensor(rows, dtype=torch.int32)

    cap = write_golden(name, model, 0, d, ref.SEQ, ref.PREFILL,
                       {"checkpoint": "tools/ref_minimax_m2.py's (the published key layout and names)",
                        "router_topk_order": "sorted by descending sigmoid + correction bias (dflash's order)"},
                       ids=ids, sort_topk=sort_topk)
    compare_with_reference(name, d, ref_golden, L, "tools/ref_minimax_m2.py")
    # config.json: the published keys, plus what transformers reads for the partial rotary
    pub["rope_parameters"] = rope
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(pub, f, indent=2)
    print(f"SUMMARY golden {name}: transformers {T.__version__} ({time.time() - t0:.1f}s)", flush=True)


# ------------------------------------------------------------------------------------------------------------
# DeepSeek-V3: transformers on the checkpoints of tools/ref_deepseek_v3.py
# ------------------------------------------------------------------------------------------------------------

def build_deepseek_v3(name: str, out_root: str) -> None:
    """transformers' DeepseekV3ForCausalLM on the checkpoint tools/ref_deepseek_v3.py writes (the published config.json
    keys and tensor names; per-expert weights stacked into transformers 5's gate_up_proj / down_proj); its golden
    replaces the reference's after the two are compared (every layer, the logits, the cached decode at 1e-5; the
    experts chosen equal)."""
    import transformers as T
    from safetensors.torch import load_file

    import ref_deepseek_v3 as ref

    t0 = time.time()
    d = os.path.join(out_root, name)
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        cfg0, seed = (ref.DEEPSEEK_V3, 4001) if name == "target_deepseek_v3" else (ref.kimi_config(), 4101)
        check(ref.write_dir(d, cfg0, seed) == 0, f"{name}: tools/ref_deepseek_v3.py failed")
    with open(os.path.join(d, "config.json")) as f:
        pub = json.load(f)
    sd = load_file(os.path.join(d, "model.safetensors"))
    ref_golden = load_file(os.path.join(d, "golden.safetensors"))
    L, E = pub["num_hidden_layers"], pub["n_routed_experts"]
    kw = {k: v for k, v in pub.items() if k not in ("architectures", "auto_map", "model_type", "torch_dtype",
                                                    "transformers_version")}
    cfg = T.DeepseekV3Config(**kw)
    model = T.DeepseekV3ForCausalLM(cfg).eval()
    state = {}
    for k, v in sd.items():
        if k.startswith(f"model.layers.{L}."):
            continue  # the MTP layer: not the language model
        if ".mlp.experts." not in k:
            state[k] = v
    for l in range(pub["first_k_dense_replace"], L):
        m = f"model.layers.{l}.mlp.experts."
        state[m + "gate_up_proj"] = torch.stack(
            [torch.cat([sd[m + f"{e}.gate_proj.weight"], sd[m + f"{e}.up_proj.weight"]]) for e in range(E)])
        state[m + "down_proj"] = torch.stack([sd[m + f"{e}.down_proj.weight"] for e in range(E)])
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    check(not missing and not unexpected, f"{name}: state dict missing {missing} unexpected {unexpected}")
    model = model.double()
    eager(model)
    ids = ref_golden["input_ids"].long()

    def sort_topk(l, logits, idx):
        mlp = model.model.layers[l].mlp
        chosen, _ = mlp.route_tokens_to_experts(logits)  # (the router's fp32 logits, as transformers routes)
        c = torch.sigmoid(logits.double()) + mlp.gate.e_score_correction_bias.double()[None, :]
        return torch.tensor([sorted(chosen[t].tolist(), key=lambda e: (-float(c[t, e]), e))
                             for t in range(chosen.shape[0])], dtype=torch.int32)

    write_golden(name, model, 0, d, ref.SEQ, ref.PREFILL,
                 {"checkpoint": "tools/ref_deepseek_v3.py's (the published key layout and names)",
                  "router_topk_order": "sorted by descending sigmoid + correction bias (dflash's order)"},
                 ids=ids, sort_topk=sort_topk)
    compare_with_reference(name, d, ref_golden, L, "tools/ref_deepseek_v3.py")
    print(f"SUMMARY golden {name}: transformers {T.__version__} ({time.time() - t0:.1f}s)", flush=True)


ALL = ["target_gpt_oss", "target_qwen3_next", "target_qwen3_5", "target_qwen3_5_moe", "target_qwen3_5_vl",
       "target_gemma4", "target_gemma4_text", "target_gemma4_moe", "target_minimax_m2", "target_deepseek_v3",
       "target_deepseek_v3_kimi"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--only", default="", help="comma list of " + ",".join(ALL))
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    self_check_mxfp4()
    names = [n for n in a.only.split(",") if n] or ALL
    for n in names:
        try:
            if n == "target_minimax_m2":
                build_minimax_m2(a.out)
                continue
            if n.startswith("target_deepseek_v3"):
                build_deepseek_v3(n, a.out)
                continue
            build(n, a.out)
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            check(False, f"{n}: {e!r}")
    if mg.FAILURES:
        print("FAILED CHECKS:\n  " + "\n  ".join(mg.FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
