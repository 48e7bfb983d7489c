#!/usr/bin/env python3
"""Writes the golden files of the C++ CPU tests into tests/golden/ (run on the GPU machine, CPU is enough).

    python3 tools/make_goldens.py [--out tests/golden]

1. Target parity (docs/cases.md C10; "Parity with Hugging Face transformers, no download"): four tiny
   models built from a config with a fixed seed, saved with save_pretrained in float32:
     tests/golden/target_{qwen3,llama3,qwen2,qwen3_moe}/{config.json, model.safetensors, golden.safetensors}
   target_qwen3_moe also writes router_topk.{l} (the experts chosen) and target_qwen3_moe_sharded/ (the same
   weights in the other expert layout, two shards and model.safetensors.index.json).
   golden.safetensors (all computed in float64 by transformers, stored F32):
     input_ids I32 [S]; hidden_states.{k} [S,H] for k in 0..L exactly as HF output_hidden_states returns them;
     layer_output.{l} [S,H] = residual stream after decoder layer l (spec h_after_layer(l), forward hooks);
     final_hidden [S,H] (final-norm output = lm_head input); logits [S,V];
     kv_decode_logits [4,V] (prefill 36 tokens with a KV cache, then feed input_ids[36..39] one at a time:
     row t = logits at position 36+t); rope_inv_freq [d/2] (reference formula, float64 -> F32).
   __metadata__ says what each key is, which HF semantics were observed, and the max difference to the
   independent reference of tools/ref_dflash.py.
2. Drafter step (tests/golden/step_qwen3/): one DFlash training step on target_qwen3 computed by the
   independent float64 reference tools/ref_dflash.py: init.safetensors, case.safetensors,
   expected_ce.safetensors (kl_weight 0), expected_kl.safetensors (kl_weight 0.15), config.json.
   A few label tokens are set to the initial drafter's argmax (plant_hits) so the per-slot accuracy is not 0.

Self-checks (asserts): mask rule on hand-written pairs and pair-by-pair against the dense builder, label
alignment (C09), finite differences of the loss, AdamW/clipping against torch.optim, reference target vs
transformers, reload of the saved directory. A failed check is reported at the end (exit code 1) but the
files are still written, so one failure does not lose the rest.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_dflash as ref  # noqa: E402

FAILURES: list[str] = []
SEQ_LEN = 40
PREFILL = 36


def check(cond: bool, what: str) -> bool:
    """Records a failed self-check (printed at the end) instead of stopping the script."""
    if not cond:
        FAILURES.append(what)
        print(f"CHECK FAILED: {what}", flush=True)
    return bool(cond)


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def save_st(tensors: dict, path: str, metadata: dict | None = None) -> None:
    """safetensors writer with contiguous CPU tensors and str->str metadata."""
    from safetensors.torch import save_file

    t = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    md = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in (metadata or {}).items()}
    save_file(t, path, metadata=md)


def fl(x) -> float:
    """float() of a Python number or a (possibly grad-tracking) tensor."""
    return float(x.detach()) if torch.is_tensor(x) else float(x)


def f32(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(torch.float32)


def round_f32(x: torch.Tensor) -> torch.Tensor:
    """float64 tensor rounded to float32 values (what the stored F32 file holds), kept in float64."""
    return x.detach().to(torch.float32).to(torch.float64)


# ----------------------------------------------------------------------------------------------------------
# 1. Target parity goldens
# ----------------------------------------------------------------------------------------------------------

TARGETS = {
    "target_qwen3": dict(
        cls="Qwen3ForCausalLM", cfg="Qwen3Config", seed=1001,
        kw=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                rms_norm_eps=1e-6, max_position_embeddings=128, attention_bias=False),
        rope_theta=1e6, rope_scaling=None),
    "target_llama3": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", seed=1002,
        kw=dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                rms_norm_eps=1e-5, max_position_embeddings=128, attention_bias=False, mlp_bias=False),
        rope_theta=500000.0,
        # original_max_position_embeddings 64 (not 32): with head_dim 16 and theta 5e5 the wavelengths are
        # 6.3, 32.4, 167, ... so 64 puts one band in each branch of the llama3 rule (kept, smoothed, /factor).
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}),
    # Qwen3-MoE (issue 40): 4 layers, 8 experts top-2 renormalised, layer 2 dense (mlp_only_layers); experts of
    # width 32 beside a dense width of 128, so a mix-up of the two cannot pass.
    "target_qwen3_moe": dict(
        cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig", seed=1004,
        kw=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                rms_norm_eps=1e-6, max_position_embeddings=128, attention_bias=False,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                decoder_sparse_step=1, mlp_only_layers=[2]),
        rope_theta=1e6, rope_scaling=None, moe=True),
    "target_qwen2": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config", seed=1003,
        kw=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                rms_norm_eps=1e-6, max_position_embeddings=128),
        rope_theta=10000.0, rope_scaling=None),
}


def tf_major() -> int:
    import transformers

    try:
        return int(transformers.__version__.split(".")[0])
    except Exception:
        return 5


def make_config(spec: dict):
    """Builds the HF config. transformers >= 5 takes RoPE as rope_parameters {rope_type, rope_theta, ...};
    older versions take rope_theta + rope_scaling. The effective frequencies are checked later against the
    reference formula, so a silently ignored argument cannot pass unnoticed."""
    import transformers

    cls = getattr(transformers, spec["cfg"])
    kw = dict(spec["kw"])
    kw.update(bos_token_id=None, eos_token_id=1, pad_token_id=None)
    if tf_major() >= 5:
        rp = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
        if spec["rope_scaling"]:
            rp = dict(spec["rope_scaling"], rope_theta=spec["rope_theta"])
        try:
            return cls(**kw, rope_parameters=rp)
        except TypeError as e:
            print(f"  note: {spec['cfg']}(rope_parameters=...) refused ({e}); using rope_theta/rope_scaling")
    return cls(**kw, rope_theta=spec["rope_theta"], rope_scaling=spec["rope_scaling"])


def reinit_(model, seed: int) -> None:
    """Non-trivial random weights so norms and biases are exercised: matrices N(0, 0.05), norm weights
    1 + 0.1*N(0,1), biases N(0, 0.02). Tied tensors are visited once (named_parameters dedups)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def save_pretrained(model, path: str) -> None:
    """transformers 5 removed `safe_serialization` (safetensors is the only format); older ones need it."""
    if tf_major() >= 5:
        model.save_pretrained(path)
        return
    try:
        model.save_pretrained(path, safe_serialization=True)
    except TypeError:
        model.save_pretrained(path)


def layer_out(o):
    return o[0] if isinstance(o, (tuple, list)) else o


def hf_forward(model, ids: torch.Tensor) -> dict:
    """Full forward with output_hidden_states plus hooks on each decoder layer and on the final norm."""
    cap = {}
    hooks = []
    for l, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, i, o, l=l: cap.__setitem__(f"layer_output.{l}", layer_out(o).detach().clone())))
    hooks.append(model.model.norm.register_forward_hook(
        lambda m, i, o: cap.__setitem__("final_hidden", layer_out(o).detach().clone())))
    try:
        with torch.no_grad():
            out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    cap["logits"] = out.logits[0].detach().clone()
    cap["hidden_states"] = [h[0].detach().clone() for h in out.hidden_states]
    for k in list(cap):
        if k.startswith("layer_output") or k == "final_hidden":
            cap[k] = cap[k][0]
    return cap


def hf_kv_decode(model, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Prefill ids[:prefill] with use_cache=True, then feed ids[prefill..S-1] one at a time with the cache.
    Row t = logits at position prefill + t."""
    rows = []
    with torch.no_grad():
        out = model(input_ids=ids[None, :prefill], use_cache=True)
        pkv = out.past_key_values
        for t in range(prefill, ids.numel()):
            out = model(input_ids=ids[None, t:t + 1], past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            rows.append(out.logits[0, -1].detach().clone())
    return torch.stack(rows)


def build_target_golden(name: str, spec: dict, out_root: str) -> None:
    import transformers

    t0 = time.time()
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    cfg = make_config(spec)
    torch.manual_seed(spec["seed"])
    model = getattr(transformers, spec["cls"])(cfg)
    model.eval()
    reinit_(model, spec["seed"])
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    check(tied == bool(spec["kw"]["tie_word_embeddings"]), f"{name}: tied embeddings = {tied}")
    if name == "target_qwen2":
        for l, layer in enumerate(model.model.layers):
            for pn in ("q_proj", "k_proj", "v_proj"):
                b = getattr(layer.self_attn, pn).bias
                check(b is not None and float(b.detach().abs().max()) > 0, f"{name}: layer {l} {pn} bias non-zero")
    model = model.float()
    save_pretrained(model, d)
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    files = sorted(os.listdir(d))
    check("model.safetensors" in files, f"{name}: model.safetensors written (files: {files})")
    if name == "target_qwen3":
        check(cj.get("head_dim") == 32, f"{name}: config.json head_dim 32 (got {cj.get('head_dim')})")
    if name == "target_llama3":
        rs = cj.get("rope_scaling") or {}
        rp = cj.get("rope_parameters") or {}
        kind = rs.get("rope_type", rs.get("type")) or rp.get("rope_type")
        check(kind == "llama3", f"{name}: config.json carries llama3 rope scaling (rope_scaling={rs}, "
                                f"rope_parameters={rp})")
    rcfg = ref.load_hf_config(d)
    inv_ref = ref.rope_inv_freq(rcfg["head_dim"], rcfg["rope_theta"], rcfg["rope_scaling"])
    hf_inv = getattr(getattr(model.model, "rotary_emb", None), "inv_freq", None)
    if hf_inv is not None:
        dv = maxdiff(hf_inv.double() / inv_ref, torch.ones_like(inv_ref))
        check(dv < 1e-6, f"{name}: HF inv_freq equals the reference formula (max rel diff {dv:.2e})")
    else:
        print(f"  note: {name}: model.model.rotary_emb.inv_freq not found; RoPE checked through the outputs")

    model = model.double()
    if spec.get("moe") and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")  # the per-expert loop: defined for float64 on the CPU
    g = torch.Generator().manual_seed(spec["seed"] + 7)
    ids = torch.randint(0, spec["kw"]["vocab_size"], (SEQ_LEN,), generator=g)
    cap = hf_forward(model, ids)
    kv = hf_kv_decode(model, ids, PREFILL)
    L = spec["kw"]["num_hidden_layers"]
    hs = cap["hidden_states"]
    check(len(hs) == L + 1, f"{name}: len(hidden_states) = {len(hs)} (want {L + 1})")

    # Observed HF semantics, recorded rather than assumed.
    emb = model.get_input_embeddings().weight[ids].detach()
    sem = {
        "hidden_states_0_is_embedding": maxdiff(hs[0], emb) < 1e-12,
        "hidden_states_k_is_layer_output_k_minus_1_for_k_lt_L": all(
            maxdiff(hs[k], cap[f"layer_output.{k - 1}"]) < 1e-12 for k in range(1, min(L, len(hs)))),
        "hidden_states_last_is_normed": maxdiff(hs[-1], cap["final_hidden"]) < 1e-12,
        "hidden_states_last_is_layer_output_last": maxdiff(hs[-1], cap[f"layer_output.{L - 1}"]) < 1e-12,
    }
    lm = model.get_output_embeddings().weight.detach()
    check(maxdiff(cap["final_hidden"] @ lm.T, cap["logits"]) < 1e-10, f"{name}: logits = final_hidden @ lm_head^T")
    dkv = maxdiff(kv, cap["logits"][PREFILL:])
    check(dkv < 1e-9, f"{name}: KV-cache decode logits equal the full forward (max diff {dkv:.2e})")

    # Independent reference (tools/ref_dflash.py) on the weights as saved.
    W = ref.load_target_weights(d)
    r = ref.target_forward(rcfg, W, ids)
    dref = max([maxdiff(r["layer_outputs"][l], cap[f"layer_output.{l}"]) for l in range(L)]
               + [maxdiff(r["final_hidden"], cap["final_hidden"]), maxdiff(r["logits"], cap["logits"])])
    # transformers computes RoPE angles in float32 even in a float64 model -> ~1e-6 differences are expected.
    check(dref < 1e-4, f"{name}: reference target_forward vs transformers max diff {dref:.2e}")

    # Reload what was saved: the directory alone must reproduce the golden.
    try:
        m2 = getattr(transformers, spec["cls"]).from_pretrained(d).double().eval()
        if spec.get("moe") and hasattr(m2, "set_experts_implementation"):
            m2.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
        with torch.no_grad():
            lg2 = m2(input_ids=ids[None], use_cache=False).logits[0]
        drl = maxdiff(lg2, cap["logits"])
        check(drl < 1e-9, f"{name}: reloaded directory reproduces the logits (max diff {drl:.2e})")
    except Exception as e:  # noqa: BLE001
        check(False, f"{name}: reload failed: {e!r}")

    tensors = {"input_ids": ids.to(torch.int32), "final_hidden": f32(cap["final_hidden"]),
               "logits": f32(cap["logits"]), "kv_decode_logits": f32(kv), "rope_inv_freq": f32(inv_ref)}
    for k, h in enumerate(hs):
        tensors[f"hidden_states.{k}"] = f32(h)
    for l in range(L):
        tensors[f"layer_output.{l}"] = f32(cap[f"layer_output.{l}"])
    md = {
        "description": "transformers forward in float64 (model.double()) of the model in this directory on "
                       "input_ids; stored as F32",
        "input_ids": f"I32 [{SEQ_LEN}] random ids, torch.Generator seed {spec['seed'] + 7}",
        "hidden_states.k": "HF output_hidden_states[k], k = 0..L, exactly as returned",
        "layer_output.l": "residual stream after decoder layer l (forward hook on model.model.layers[l]) = "
                          "spec h_after_layer(l); pre final norm",
        "final_hidden": "output of model.model.norm (input of lm_head)",
        "logits": "[S, V]",
        "kv_decode_logits": f"[{SEQ_LEN - PREFILL}, V]: prefill input_ids[0:{PREFILL}] with use_cache=True, then "
                            f"feed input_ids[{PREFILL}..{SEQ_LEN - 1}] one token at a time; row t = logits at "
                            f"position {PREFILL}+t (equal to logits[{PREFILL}+t])",
        "rope_inv_freq": "reference formula (tools/ref_dflash.py rope_inv_freq) in float64, includes rope scaling",
        "rope_angles": "transformers computes cos/sin from float32 angles even in float64 models (~1e-6 abs)",
        "max_abs_diff_vs_ref_dflash": f"{dref:.3e}",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": str(getattr(model.config, "_attn_implementation", "?")),
        "num_hidden_layers": str(L),
    }
    md.update({k: ("true" if v else "false") for k, v in sem.items()})
    if spec.get("moe"):
        moe_extras(name, spec, model, ids, r, tensors, md, d, out_root)
    save_st(tensors, os.path.join(d, "golden.safetensors"), md)
    print(f"  {name}: L={L} semantics={ {k: v for k, v in sem.items()} } ref_diff={dref:.2e} "
          f"kv_diff={dkv:.2e} ({time.time() - t0:.1f}s)", flush=True)
    print(f"SUMMARY golden {name}: ok files={sorted(os.listdir(d))} ref_diff={dref:.1e}")


def moe_extras(name: str, spec: dict, model, ids: torch.Tensor, r: dict, tensors: dict, md: dict, d: str,
               out_root: str) -> None:
    """Qwen3-MoE: the experts each token chose per MoE layer (router_topk.{l} I32 [S, k], HF's own choice checked
    against the reference's), torch.topk's order on exact ties (case C21), the names save_pretrained wrote, and the
    same weights in the other expert layout, sharded over two files with model.safetensors.index.json
    (<name>_sharded/), which must load to the same model."""
    from safetensors.torch import load_file

    L = spec["kw"]["num_hidden_layers"]
    xin = {}
    hooks = [layer.mlp.register_forward_hook(lambda m, i, o, l=l: xin.__setitem__(l, i[0].detach().clone()))
             for l, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            model(input_ids=ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    k = spec["kw"]["num_experts_per_tok"]
    moe_layers = []
    for l in range(L):
        mlp = model.model.layers[l].mlp
        if not hasattr(mlp, "gate"):
            continue
        moe_layers.append(l)
        x = xin[l].reshape(-1, xin[l].shape[-1])
        with torch.no_grad():
            g = mlp.gate(x)
        if isinstance(g, (tuple, list)):  # transformers 5: (router_logits, routing_weights, selected_experts)
            hf_idx = [t for t in g if t.dtype in (torch.int64, torch.int32)][0]
        else:  # an nn.Linear: the logits; the block's rule
            hf_idx = torch.topk(torch.softmax(g, dim=-1, dtype=torch.float), k, dim=-1).indices
        ours = r["router_topk"][l]
        same = torch.equal(hf_idx.to(torch.long).sort(dim=-1).values, ours.sort(dim=-1).values)
        check(same, f"{name}: layer {l} HF chooses the same experts as the reference")
        tensors[f"router_topk.{l}"] = ours.to(torch.int32)
    check(moe_layers == [l for l in range(L) if l not in spec["kw"]["mlp_only_layers"]],
          f"{name}: MoE layers {moe_layers}")
    md["router_topk.l"] = ("I32 [S, k] per MoE layer: the experts chosen (tools/ref_dflash.py moe_block: softmax, "
                           "descending, lower index first on ties), checked equal as sets to transformers' choice")
    md["moe_layers"] = json.dumps(moe_layers)

    # torch.topk on exact ties (C21): which index comes first
    z = torch.tensor([[0.5, 1.0, 1.0, 0.25, 1.0, -1.0, 0.0, 1.0]])
    order = {}
    for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        order[dev] = torch.topk(torch.softmax(z.to(dev), dim=-1), 3, dim=-1).indices.cpu().tolist()[0]
    md["torch_topk_ties"] = json.dumps({"logits": z.tolist()[0], "top3": order})
    # measured with torch 2.11: cpu [4, 7, 2], cuda [4, 2, 1]: neither takes the lower index first, and they differ,
    # so no fixed rule reproduces torch on exact ties; dflash takes the lower index (backend/context.h moe_route)
    print(f"  {name}: torch.topk on ties {order} (lower index first would be [1, 2, 4])", flush=True)

    # the names save_pretrained wrote, and the other layout sharded in two files
    W = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors") and fn != "golden.safetensors":
            W.update(load_file(os.path.join(d, fn)))
    fused = any(n.endswith("mlp.experts.gate_up_proj") for n in W)
    md["save_pretrained_expert_layout"] = "fused gate_up_proj / down_proj" if fused else "per expert"
    print(f"  {name}: save_pretrained wrote experts {md['save_pretrained_expert_layout']}", flush=True)
    E = spec["kw"]["num_experts"]
    other = {}
    for n, t in W.items():
        if fused and n.endswith("mlp.experts.gate_up_proj"):
            pre = n[: -len("gate_up_proj")]
            I = t.shape[1] // 2
            for e in range(E):
                other[f"{pre}{e}.gate_proj.weight"] = t[e, :I].contiguous()
                other[f"{pre}{e}.up_proj.weight"] = t[e, I:].contiguous()
        elif fused and n.endswith("mlp.experts.down_proj"):
            pre = n[: -len("down_proj")]
            for e in range(E):
                other[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
        elif not fused and ".mlp.experts." in n:
            continue
        else:
            other[n] = t
    if not fused:
        for l in moe_layers:
            pre = f"model.layers.{l}.mlp.experts."
            other[pre + "gate_up_proj"] = torch.stack([torch.cat([W[f"{pre}{e}.gate_proj.weight"],
                                                                  W[f"{pre}{e}.up_proj.weight"]]) for e in range(E)])
            other[pre + "down_proj"] = torch.stack([W[f"{pre}{e}.down_proj.weight"] for e in range(E)])
    sd = os.path.join(out_root, name + "_sharded")
    os.makedirs(sd, exist_ok=True)
    names = sorted(other)
    half = len(names) // 2
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {}
    for fi, part in enumerate([names[:half], names[half:]]):
        save_st({n: other[n] for n in part}, os.path.join(sd, files[fi]), {"format": "pt"})
        weight_map.update({n: files[fi] for n in part})
    with open(os.path.join(sd, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.numel() * t.element_size() for t in other.values())},
                   "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(d, "config.json")) as f:
        cfg_text = f.read()
    with open(os.path.join(sd, "config.json"), "w") as f:
        f.write(cfg_text)
    md["sharded_copy"] = (f"../{name}_sharded: the same weights with experts "
                          f"{'per expert' if fused else 'fused'}, two shards + model.safetensors.index.json")
    # the reference on the other layout gives the same forward
    W2 = ref.load_target_weights(sd)
    r2 = ref.target_forward(ref.load_hf_config(sd), W2, ids)
    d2 = maxdiff(r2["logits"], r["logits"])
    check(d2 < 1e-12, f"{name}: the sharded other-layout copy gives the same logits (max diff {d2:.2e})")


# ----------------------------------------------------------------------------------------------------------
# 2. Drafter step golden
# ----------------------------------------------------------------------------------------------------------

DRAFT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, block_size=4, target_layer_ids=[1, 2], mask_token_id=511,
             gamma=7.0, rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None)
INIT = dict(seed=2024, linear_std=0.1, norm_std=0.1)
OPT = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, max_grad_norm=1.0)
KL_WEIGHTS = {"expected_ce": 0.0, "expected_kl": 0.15}


def make_sequences() -> list[dict]:
    """Two sequences (spec 2.1): seq0 S=40 (prompt 0..9, response 10..39 with a hole at 22..24),
    seq1 S=29 (prompt 0..7, response 8..28) padded with one invalid block (anchor 0, valid 0) last.
    Anchors are sorted and chosen from the candidates: they include the smallest candidate, blocks that
    overlap, a block that crosses the hole, and blocks running past S-1 (a_j + B - 1 >= S)."""
    g = torch.Generator().manual_seed(77)
    seqs = []
    # seq0
    S0 = 40
    m0 = [0] * 10 + [1] * 30
    for p in (22, 23, 24):
        m0[p] = 0
    a0 = [10, 13, 20, 26, 31, 37]
    seqs.append(dict(S=S0, ids=torch.randint(0, 500, (S0,), generator=g).tolist(), loss_mask=m0, anchors=a0,
                     valid=[1] * len(a0)))
    # seq1
    S1 = 29
    m1 = [0] * 8 + [1] * 21
    a1 = [8, 10, 15, 21, 27, 0]
    seqs.append(dict(S=S1, ids=torch.randint(0, 500, (S1,), generator=g).tolist(), loss_mask=m1, anchors=a1,
                     valid=[1, 1, 1, 1, 1, 0]))
    for k, s in enumerate(seqs):
        cand = ref.anchor_candidates(s["loss_mask"])
        valid_anchors = [a for a, v in zip(s["anchors"], s["valid"]) if v]
        assert all(a in cand for a in valid_anchors), f"seq{k}: anchor not a candidate"
        assert valid_anchors == sorted(valid_anchors)
        assert valid_anchors[0] == cand[0], f"seq{k}: smallest candidate included"
    assert 27 + DRAFT["block_size"] - 1 >= S1 and 27 == S1 - 2
    return seqs


def plant_hits(s: dict, dc, tcfg: dict, TW: dict, P0d: dict, embed, lm_head) -> list:
    """Makes the per-slot accuracy of the golden non-trivial: for each valid block in anchor order, sets
    x[a_j + 1] (and x[a_j + 2] for even j) to the initial drafter's argmax for that slot, when the position is
    supervised, inside the sequence, not already planted, and the token is < 500. Block j's logits depend only
    on x[0..a_j] (context keys k < a_j, input x[a_j]); the changed positions are > a_j, so earlier blocks'
    predictions stay as they were and later blocks are computed after the change."""
    B = dc.block_size
    planted, fixed = [], set()
    for j, (a, v) in enumerate(zip(s["anchors"], s["valid"])):
        if not v:
            continue
        tf = ref.target_forward(tcfg, TW, s["ids"])
        F = round_f32(ref.context_features(tf["layer_outputs"], dc.target_layer_ids))
        with torch.no_grad():
            lg = ref.drafter_forward(P0d, dc, embed, lm_head, F, s["ids"], s["anchors"], s["valid"])["logits"]
        for i in ((1, 2) if j % 2 == 0 else (1,)):
            p = a + i
            if p >= s["S"] or p in fixed or s["loss_mask"][p] != 1:
                continue
            t = int(lg[j * B + i].argmax())
            if t >= 500:
                continue
            s["ids"][p] = t
            fixed.add(p)
            planted.append([j, i, p, t])
    return planted


def self_check_rules() -> None:
    """(i) spec 2.3 mask on hand-written pairs (C08 layout: S=32, B=4, anchors 10 and 12), padding block;
    spec 2.4 labels (C09: x[p] = p, anchor 20); spec 2.1 candidates; spec 1 default layer ids."""
    S, B, an, va = 32, 4, [10, 12], [1, 1]
    want = {
        (0, 9): True, (0, 10): False, (3, 9): True, (3, 10): False,  # k < a_j strictly, every slot
        (4, 11): True, (4, 12): False, (7, 11): True,
        (0, 31): False,
        (0, 32): True, (0, 35): True, (3, 32): True, (2, 33): True,  # own block, bidirectional
        (0, 36): False, (5, 35): False, (5, 36): True, (7, 39): True, (4, 32): False,
    }
    for (q, k), w in want.items():
        assert ref.mask_allowed(q, k, S, an, va, B) == w, f"mask rule ({q},{k}) != {w}"
    dm = ref.dense_mask(S, an, va, B)
    for (q, k), w in want.items():
        assert bool(dm[q, k]) == w
    # padding block sees nothing
    an2, va2 = [10, 0], [1, 0]
    dm2 = ref.dense_mask(S, an2, va2, B)
    assert not dm2[4:8].any() and dm2[0:4].any()
    assert not ref.mask_allowed(4, 0, S, an2, va2, B) and not ref.mask_allowed(4, 36, S, an2, va2, B)
    # labels: x[p] = p, anchor 20
    ids = list(range(64))
    y, m, w = ref.labels_and_weights(ids, [1] * 64, [20], [1], 4, 7.0)
    assert y[0].tolist() == [20, 21, 22, 23] and m[0].tolist() == [0, 1, 1, 1]
    assert abs(float(w[0, 1]) - 1.0) < 1e-15 and abs(float(w[0, 3]) - math.exp(-2 / 7)) < 1e-15
    # candidates and default layers
    assert ref.anchor_candidates([0, 1, 1, 0, 1, 1, 1]) == [1, 4, 5]
    assert ref.default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert ref.default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]
    print("  rule self-checks: ok")


def build_step_golden(out_root: str) -> None:
    import transformers

    t0 = time.time()
    tdir = os.path.join(out_root, "target_qwen3")
    d = os.path.join(out_root, "step_qwen3")
    os.makedirs(d, exist_ok=True)
    self_check_rules()
    tcfg = ref.load_hf_config(tdir)
    TW = ref.load_target_weights(tdir)
    embed = TW["embed_tokens.weight"]
    lm_head = TW["lm_head.weight"]
    dc = ref.DraftConfig(**DRAFT)
    assert dc.hidden_size == tcfg["hidden_size"] and dc.mask_token_id < tcfg["vocab_size"]
    assert dc.rope_theta == tcfg["rope_theta"]

    seqs = make_sequences()
    P0 = ref.init_drafter_params(dc, **INIT)
    P0d = {n: v.double() for n, v in P0.items()}
    for s in seqs:
        s["planted"] = plant_hits(s, dc, tcfg, TW, P0d, embed, lm_head)
    hf = getattr(transformers, "Qwen3ForCausalLM").from_pretrained(tdir).double().eval()
    case = {}
    for k, s in enumerate(seqs):
        tf = ref.target_forward(tcfg, TW, s["ids"])
        F = ref.context_features(tf["layer_outputs"], dc.target_layer_ids)
        # cross-check the features with transformers (HF hidden_states[l + 1] = h_after_layer(l) for l < L-1)
        cap = hf_forward(hf, torch.tensor(s["ids"]))
        dF = max(maxdiff(tf["layer_outputs"][l], cap[f"layer_output.{l}"]) for l in dc.target_layer_ids)
        dH = maxdiff(tf["final_hidden"], cap["final_hidden"])
        check(dF < 1e-4 and dH < 1e-4, f"step seq{k}: reference features vs transformers ({dF:.1e}, {dH:.1e})")
        s["features"] = round_f32(F)
        s["target_final_hidden"] = round_f32(tf["final_hidden"])
        case[f"seq{k}.input_ids"] = torch.tensor(s["ids"], dtype=torch.int32)
        case[f"seq{k}.loss_mask"] = torch.tensor(s["loss_mask"], dtype=torch.uint8)
        case[f"seq{k}.anchors"] = torch.tensor(s["anchors"], dtype=torch.int32)
        case[f"seq{k}.valid"] = torch.tensor(s["valid"], dtype=torch.uint8)
        case[f"seq{k}.features"] = f32(s["features"])
        case[f"seq{k}.target_final_hidden"] = f32(s["target_final_hidden"])
        y, m, w = ref.labels_and_weights(s["ids"], s["loss_mask"], s["anchors"], s["valid"], dc.block_size,
                                         dc.gamma)
        case[f"seq{k}.labels"] = y.to(torch.int32)
        case[f"seq{k}.weights"] = f32(w)
        dm = ref.dense_mask(s["S"], s["anchors"], s["valid"], dc.block_size)
        # the two implementations of the mask rule agree pair by pair
        for q in range(dm.shape[0]):
            for kk in range(dm.shape[1]):
                assert bool(dm[q, kk]) == ref.mask_allowed(q, kk, s["S"], s["anchors"], s["valid"], dc.block_size)
        case[f"seq{k}.mask"] = dm.to(torch.uint8)
        case[f"seq{k}.block_input_ids"] = torch.tensor(
            ref.block_input_ids(s["ids"], s["anchors"], dc.block_size, dc.mask_token_id), dtype=torch.int32)
        case[f"seq{k}.positions"] = torch.tensor(ref.block_positions(s["anchors"], dc.block_size),
                                                 dtype=torch.int32)
    save_st(case, os.path.join(d, "case.safetensors"), {
        "description": "inputs of the drafter step golden; labels/weights/mask/block_input_ids/positions are "
                       "the spec-derived expectations (2.2-2.4), not inputs",
        "features": "F of spec 1 = concat(h_after_layer(1), h_after_layer(2)) of ../target_qwen3, reference "
                    "float64 -> F32",
        "target_final_hidden": "final-norm hidden state of the target (soft labels: p at row a_j+i-1)",
        "labels": "I32 [N,B] y[j,i] = x[a_j+i] (0 where a_j+i >= S)",
        "weights": "F32 [N,B] w = m * exp(-(i-1)/gamma)",
        "mask": "U8 [N*B, S+N*B] spec 2.3 allowed(q,k); keys = [context 0..S-1 | blocks]",
        "padding": "seq1 block 5 is padding: anchor 0, valid 0",
    })

    save_st(P0, os.path.join(d, "init.safetensors"), {"init": json.dumps(INIT)})
    names = [n for n, _ in ref.drafter_param_shapes(dc)]
    summary = {}
    for fname, klw in KL_WEIGHTS.items():
        P = {n: P0[n].double().clone().requires_grad_(True) for n in names}
        res = ref.dflash_loss(P, dc, embed, lm_head, seqs, kl_weight=klw)
        res["loss"].backward()
        grads = {n: P[n].grad.detach().clone() for n in names}
        gnorm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))

        # (ii) finite differences in float64 on a few single elements
        def loss_at(name, idx, delta):
            Q = {n: P0[n].double().clone() for n in names}
            Q[name][idx] += delta
            with torch.no_grad():
                return float(ref.dflash_loss(Q, dc, embed, lm_head, seqs, kl_weight=klw)["loss"])

        for name, idx in [("layers.0.self_attn.q_proj.weight", (3, 5)), ("fc.weight", (2, 100)),
                          ("layers.1.mlp.up_proj.weight", (7, 11)), ("hidden_norm.weight", (4,)),
                          ("layers.1.self_attn.k_norm.weight", (6,))]:
            h = 1e-5
            fd = (loss_at(name, idx, h) - loss_at(name, idx, -h)) / (2 * h)
            ag = float(grads[name][idx])
            check(abs(fd - ag) <= 1e-7 + 1e-5 * abs(ag),
                  f"{fname}: finite difference {name}{list(idx)}: fd {fd:.10e} vs autograd {ag:.10e}")

        for k, (s, sr) in enumerate(zip(seqs, res["seqs"])):
            for j, i, p, t in s["planted"]:
                got = int(sr["logits"][j * dc.block_size + i].argmax())
                check(got == t == int(sr["y"][j, i]), f"{fname}: planted hit seq{k} block {j} slot {i}: argmax {got}, "
                                                      f"label {int(sr['y'][j, i])}, planted {t}")
        out = {"loss": torch.tensor([fl(res["loss"])]), "sum_w": torch.tensor([fl(res["sum_w"])]),
               "loss_ce": torch.tensor([fl(res["ce_sum"] / res["sum_w"])]),
               "loss_kl": torch.tensor([fl(res["kl_sum"] / res["sum_w"]) if klw else 0.0]),
               "grad_norm": torch.tensor([gnorm]), "acc": f32(res["acc"]), "count": f32(res["count"])}
        out = {k: v.to(torch.float32) for k, v in out.items()}
        for n in names:
            out[f"grad.{n}"] = f32(grads[n])
        for k, sr in enumerate(res["seqs"]):
            out[f"logits.seq{k}"] = f32(sr["logits"])
            out[f"ctx.seq{k}"] = f32(sr["ctx"])

        clip_coef = None
        for wd, prefix in ((0.0, "after"), (0.1, "after_wd")):
            params = [P0[n].double().clone().requires_grad_(True) for n in names]
            for p, n in zip(params, names):
                p.grad = grads[n].clone()
            total = float(torch.nn.utils.clip_grad_norm_(params, OPT["max_grad_norm"]))
            check(abs(total - gnorm) <= 1e-9 * max(1.0, gnorm), f"{fname}: clip_grad_norm_ total {total} vs {gnorm}")
            opt = torch.optim.AdamW(params, lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"], weight_decay=wd,
                                    foreach=False)
            opt.step()
            # the written-out formulas agree with torch.optim
            tot2, coef, clipped = ref.clip_grad_norm(grads, OPT["max_grad_norm"])
            clip_coef = coef
            manual = ref.adamw_step({n: P0[n].double() for n in names}, clipped, {}, OPT["lr"], OPT["betas"],
                                    OPT["eps"], wd)
            dm_ = max(maxdiff(manual[n], p.detach()) for n, p in zip(names, params))
            check(dm_ < 1e-12, f"{fname} wd={wd}: manual AdamW vs torch.optim.AdamW max diff {dm_:.1e}")
            for n, p in zip(names, params):
                out[f"{prefix}.{n}"] = f32(p.detach())
        out["clip_coef"] = torch.tensor([clip_coef], dtype=torch.float32)
        save_st(out, os.path.join(d, f"{fname}.safetensors"), {
            "kl_weight": str(klw),
            "loss": "global: sum w*CE / sum w (+ kl_weight * sum w*KL(p||q) / sum w) over both sequences",
            "grad.<name>": "d loss / d param, before clipping",
            "grad_norm": "global L2 norm of all grads before clipping",
            "clip_coef": "min(1, max_norm / (grad_norm + 1e-6)) as torch.nn.utils.clip_grad_norm_",
            "after.<name>": "params after clip + one torch.optim.AdamW step, weight_decay 0",
            "after_wd.<name>": "same with weight_decay 0.1",
            "acc": "per-slot accuracy argmax == label over rows with m = 1 (slot 0 = 0)",
            "count": "rows with m = 1 per slot",
            "logits.seq<k>": "drafter logits [N*B, V] before the step",
            "ctx.seq<k>": "Ht = RMSNorm_hidden(F @ fc^T) [S, H] before the step",
        })
        summary[fname] = dict(loss=fl(res["loss"]), sum_w=fl(res["sum_w"]), grad_norm=gnorm,
                              clip_coef=clip_coef, acc=[round(float(a), 4) for a in res["acc"]],
                              count=[int(c) for c in res["count"]])
        print(f"  {fname}: loss {fl(res['loss']):.6f} sum_w {fl(res['sum_w']):.4f} grad_norm {gnorm:.4f} "
              f"clip_coef {clip_coef:.4f} acc {summary[fname]['acc']} count {summary[fname]['count']}", flush=True)

    cfg = {
        "description": "one DFlash training step (docs/spec.md 1, 2.1-2.5) on ../target_qwen3, computed in "
                       "float64 by tools/ref_dflash.py; all tensors stored F32",
        "target_dir": "../target_qwen3",
        "drafter": {k: DRAFT[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "head_dim",
                                          "rms_norm_eps", "rope_theta", "rope_scaling")},
        "block_size": DRAFT["block_size"],
        "target_layer_ids": DRAFT["target_layer_ids"],
        "mask_token_id": DRAFT["mask_token_id"],
        "gamma": DRAFT["gamma"],
        "loss_weighting": "exp: w = m * exp(-(i-1)/gamma)",
        "normalization": "global over both sequences",
        "kl_weight": KL_WEIGHTS,
        "init": dict(INIT, rule="Linear N(0, linear_std), norm weights 1 + norm_std*N(0,1), torch.Generator "
                                "in drafter_param_shapes order; values in init.safetensors"),
        "optimizer": {"type": "AdamW", "lr": OPT["lr"], "betas": list(OPT["betas"]), "eps": OPT["eps"],
                      "weight_decay": {"after": 0.0, "after_wd": 0.1}, "max_grad_norm": OPT["max_grad_norm"],
                      "clip_eps": 1e-6, "step": 1},
        "frozen": "embedding and lm_head (tied embed_tokens of the target)",
        "sequences": [{"S": s["S"], "N": len(s["anchors"]), "anchors": s["anchors"], "valid": s["valid"],
                       "candidates": ref.anchor_candidates(s["loss_mask"]),
                       "planted_hits": s["planted"]} for s in seqs],
        "planted_hits": "[block j, slot i, position, token]: x[position] was set to the initial drafter's argmax "
                        "so that acc is not all zero (tools/make_goldens.py plant_hits)",
        "param_names": names,
        "export_config": {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": DRAFT["block_size"],
            "num_target_layers": tcfg["num_hidden_layers"],
            "dflash_config": {"mask_token_id": DRAFT["mask_token_id"],
                              "target_layer_ids": DRAFT["target_layer_ids"]},
            "hidden_size": DRAFT["hidden_size"], "intermediate_size": DRAFT["intermediate_size"],
            "num_hidden_layers": DRAFT["num_hidden_layers"], "num_attention_heads": DRAFT["num_attention_heads"],
            "num_key_value_heads": DRAFT["num_key_value_heads"], "head_dim": DRAFT["head_dim"],
            "hidden_act": "silu", "rms_norm_eps": DRAFT["rms_norm_eps"], "rope_theta": DRAFT["rope_theta"],
            "rope_scaling": None, "max_position_embeddings": 128, "attention_bias": False,
            "layer_types": ["full_attention"] * DRAFT["num_hidden_layers"], "tie_word_embeddings": False,
            "vocab_size": tcfg["vocab_size"], "torch_dtype": "float32"},
        "results": summary,
        "files": {
            "init.safetensors": "drafter params (export names, F32) before the step",
            "case.safetensors": "sequences, anchors, features, target final hidden; derived labels/weights/mask",
            "expected_ce.safetensors": "kl_weight 0: loss, grads, params after the step, metrics, logits",
            "expected_kl.safetensors": "kl_weight 0.15: same keys",
        },
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"  step_qwen3 written ({time.time() - t0:.1f}s)", flush=True)
    ce = summary["expected_ce"]
    print(f"SUMMARY golden step_qwen3: loss_ce {ce['loss']:.5f} loss_kl {summary['expected_kl']['loss']:.5f} "
          f"grad_norm {ce['grad_norm']:.4f} clip_coef {ce['clip_coef']:.4f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--only", default="", help="comma list of parts: target_qwen3,target_llama3,target_qwen2,"
                    "target_qwen3_moe,step")
    args = ap.parse_args()
    only = set(x for x in args.only.split(",") if x)
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    import transformers

    print(f"make_goldens: torch {torch.__version__} transformers {transformers.__version__} out={args.out}")
    for name, spec in TARGETS.items():
        if only and name not in only:
            continue
        try:
            build_target_golden(name, spec, args.out)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            check(False, f"{name}: exception {e!r}")
    if not only or "step" in only:
        try:
            build_step_golden(args.out)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            check(False, f"step_qwen3: exception {e!r}")
    total = 0
    for root, _, files in os.walk(args.out):
        for fn in files:
            total += os.path.getsize(os.path.join(root, fn))
    print(f"SUMMARY goldens: {total / 1e6:.2f} MB in {args.out}, {time.time() - t0:.1f}s, "
          f"{len(FAILURES)} failed checks")
    for f in FAILURES:
        print(f"SUMMARY FAILED: {f}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
