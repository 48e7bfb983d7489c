#!/usr/bin/env python3
"""bench/torch_ref.py - the PyTorch side of issue 6's benchmark. bench/run_all.sh runs `--part attnstep` and then
`--part prefill`, each in a fresh process with an empty Inductor/Triton cache, so first-call times are cold.

  python3 bench/torch_ref.py --part attn      # (a) flex_attention (torch.compile) with the DFlash BlockMask
  python3 bench/torch_ref.py --part step      # (c) a PyTorch drafter training step (flex, checkpointing, chunked CE)
  python3 bench/torch_ref.py --part attnstep  # (a) then (c) in one process: one flex compile serves both (the step
                                              #     reuses the compiled function, BlockMask, layout and autocast state);
                                              #     (c)'s start-up = import + CUDA init + (a)'s compile + first step
  python3 bench/torch_ref.py --part prefill   # (b) HF transformers Qwen3Model prefill, sdpa, output_hidden_states

Shapes are those of the C++ benches (Qwen3-8B drafter / target): 32/8 heads, d 128, B 16, N 512 anchors, S 3072,
4 sequences, H 4096, I 12288, V 151936, 5 draft layers, 36 target layers, bf16. Anchors come from the same
generator as bench/bench_util.h (make_anchors), so both sides count the same FLOPs:
  attention forward 4*d*nh*sum_j B*(a_j + B) (unmasked pairs only), backward 2.5x forward;
  step / prefill as written in bench/bench_step.cpp / bench/bench_prefill.cpp.
Ours runs the 4 sequences one after another; here they are one batch of 4 (PyTorch's best case).
Output: `RESULT name=... impl=torch key=value ...` lines, like the C++ benches.

(c) in detail: fp32 master weights, torch.autocast bf16 compute, eager PyTorch except flex_attention
(torch.compile(flex_attention), as the origin pipeline of spec 6). Per layer: RMSNorm (HF Qwen3 style, fp32 inside),
q/k/v projections ([context ; block] rows for k/v), q/k norms, RoPE, flex_attention over [context S | blocks N*B] with
the DFlash BlockMask (built once, outside the timed step; its cost is reported separately), o_proj, SwiGLU MLP.
Loss: weighted CE (spec 2.4 weights, global normalisation) through a chunked lm_head (1024 rows at a time, logits
never whole; the gradient w.r.t. h is formed chunk by chunk in the forward, as Liger-style fused linear-CE does).
Then clip_grad_norm_(1.0) and fused AdamW. Mode "ckpt": activation checkpointing per layer of everything but the
flex_attention call (the part before attention and the part after it are each checkpointed; checkpointing the
compiled flex call itself can fall back to its dense eager path in recomputation, pytorch/pytorch#147879);
mode "nockpt": no checkpointing.
"""
import time

_T0 = time.perf_counter()
import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

_T_IMPORT = time.perf_counter() - _T0
PEAK_TFLOPS = 989.0
DEV_TYPE = os.environ.get("TORCH_REF_DEVICE", "cuda")  # "cpu" only for a logic smoke test with a stubbed flex
M64 = (1 << 64) - 1


def result(name, **kv):
    parts = [f"name={name}", "impl=torch"]
    for k, v in kv.items():
        if isinstance(v, float):
            parts.append(f"{k}={v:.6g}")
        else:
            parts.append(f"{k}={str(v).replace(' ', '_')}")
    print("RESULT " + " ".join(parts), flush=True)


def note(msg):
    print("# " + msg, flush=True)


def make_anchors(seed, seq, S, N):
    """bench_util.h make_anchors: stratified random anchors, sorted, distinct, in [0, S-2]."""
    gap = (S - 1) // N
    if gap < 1:
        raise ValueError(f"S - 1 = {S - 1} < N = {N}")
    st = (seed * 0x9E3779B97F4A7C15 + seq + 1) & M64
    out = []
    for j in range(N):
        st = (st * 6364136223846793005 + 1442695040888963407) & M64
        u = (st >> 11) * (1.0 / 9007199254740992.0)
        out.append((j * (S - 1)) // N + min(gap - 1, int(math.floor(u * gap))))
    return out


def attn_fwd_flops(anchors, B, nh, d):
    return 4.0 * d * nh * sum(float(B) * float(a + B) for a in anchors)


def default_target_layer_ids(lt, nf):
    if nf == 1:
        return [lt // 2]
    return [int(math.floor(1 + i * (lt - 4) / (nf - 1) + 0.5)) for i in range(nf)]


def bench_events(fn, budget_s, max_reps=20, min_reps=3, warmup=2):
    """Median milliseconds of fn() between CUDA events, after `warmup` calls; the repeat count fits budget_s."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    reps = max_reps
    i = 0
    while i < reps:
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
        if i == 0:
            reps = max(min_reps, min(max_reps, int(budget_s * 1e3 / max(times[0], 1e-3))))
        i += 1
    return statistics.median(times), len(times)


def dflash_block_mask(anchors_t, S, B, create_block_mask):
    """Spec 2.3 as a flex BlockMask over Q = [blocks N*B], KV = [context S | blocks N*B] (all blocks valid):
    query block j sees context keys k < a_j and the B keys of its own block."""
    nb, N = anchors_t.shape
    NB = N * B

    def dflash_mask(b, h, q_idx, kv_idx):
        j = q_idx // B
        ctx_ok = (kv_idx < S) & (kv_idx < anchors_t[b, j])
        blk_ok = (kv_idx >= S) & ((kv_idx - S) // B == j)
        return ctx_ok | blk_ok

    return create_block_mask(dflash_mask, B=nb, H=None, Q_LEN=NB, KV_LEN=S + NB, device=anchors_t.device)


_SHARED = {}  # one compiled flex_attention and one BlockMask per process, shared by (a) and (c)


def shared_flex():
    """torch.compile(flex_attention), created once: (a) and (c) in one process call the same compiled function,
    with the same BlockMask object, input layout and autocast state, so (c) reuses what (a) compiled."""
    if "flex" not in _SHARED:
        from torch.nn.attention.flex_attention import flex_attention
        _SHARED["flex"] = torch.compile(flex_attention)
    return _SHARED["flex"]


def shared_block_mask(a, dev):
    """(anchors list, anchors tensor [nb, N] int32, BlockMask, build seconds) for the run's shapes, built once."""
    if "bm" not in _SHARED:
        from torch.nn.attention.flex_attention import create_block_mask
        anchors = [make_anchors(a.seed, s, a.S, a.N) for s in range(a.seqs)]
        anchors_t = torch.tensor(anchors, dtype=torch.int32, device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        bm = dflash_block_mask(anchors_t, a.S, a.B, create_block_mask)
        torch.cuda.synchronize()
        _SHARED["bm"] = (anchors, anchors_t, bm, time.perf_counter() - t0)
    return _SHARED["bm"]


def dense_probe(q, k, v, out, anchors, S, B, blocks, scale):
    """Max |flex - dense reference| over a few query blocks of sequence 0 (checks mask and layout).
    q [1, NB, nh, d], k/v [1, KV, nkv, d], out [1, nh, NB, d] (flex layout)."""
    nh, nkv = q.shape[2], k.shape[2]
    rep = nh // nkv
    worst = 0.0
    for j in blocks:
        a = anchors[j]
        keys = torch.cat([k[0, :a], k[0, S + j * B:S + (j + 1) * B]], 0).float()  # [Kj, nkv, d]
        vals = torch.cat([v[0, :a], v[0, S + j * B:S + (j + 1) * B]], 0).float()
        qq = q[0, j * B:(j + 1) * B].float()  # [B, nh, d]
        kk = keys.repeat_interleave(rep, dim=1)  # [Kj, nh, d]
        vv = vals.repeat_interleave(rep, dim=1)
        sc = torch.einsum("thd,khd->htk", qq, kk) * scale
        ref = torch.einsum("htk,khd->htd", sc.softmax(-1), vv)  # [nh, B, d]
        got = out[0, :, j * B:(j + 1) * B].float()
        worst = max(worst, float((got - ref).abs().max()))
    return worst


# ---------------------------------------------------------------------------------------------------------------
# (a) flex_attention
# ---------------------------------------------------------------------------------------------------------------


def part_attn(a):
    dev = torch.device(DEV_TYPE)
    S, N, B, nh, nkv, d, nb = a.S, a.N, a.B, a.nh, a.nkv, a.d, a.seqs
    NB, KV = N * B, a.S + a.N * a.B
    anchors, _, bm, t_mask = shared_block_mask(a, dev)
    flops_fwd = sum(attn_fwd_flops(x, B, nh, d) for x in anchors)
    note(f"flex_attention: batch {nb}, S {S}, N {N}, B {B}, heads {nh}/{nkv}, d {d}; forward work "
         f"{flops_fwd / 1e9:.1f} GFLOP (unmasked pairs); torch {torch.__version__}")
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)
    # the layout a model produces: [batch, tokens, heads, d], viewed as flex's [batch, heads, tokens, d]
    qb = torch.randn(nb, NB, nh, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    kb = torch.randn(nb, KV, nkv, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    vb = torch.randn(nb, KV, nkv, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    scale = 1.0 / math.sqrt(d)
    flex = shared_flex()

    def fwd():  # under autocast, as in the step (the same compiled graph serves both)
        with torch.autocast(DEV_TYPE, dtype=torch.bfloat16):
            return flex(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), block_mask=bm, scale=scale,
                        enable_gqa=True)

    t0 = time.perf_counter()
    out = fwd()
    torch.cuda.synchronize()
    t_first_fwd = time.perf_counter() - t0
    dout = torch.randn(out.shape, device=dev, dtype=out.dtype, generator=g)
    t0 = time.perf_counter()
    out.backward(dout)
    torch.cuda.synchronize()
    t_first_bwd = time.perf_counter() - t0
    _SHARED["compile_s"] = t_first_fwd + t_first_bwd
    result("attn_first_call", fwd_s=t_first_fwd, bwd_s=t_first_bwd, mask_ms=t_mask * 1e3,
           note="compile_included")
    try:
        with torch.no_grad():
            diff = dense_probe(qb.detach(), kb.detach(), vb.detach(), out.detach(), anchors[0], S, B,
                               [0, 1, N // 2, N - 1], scale)
        result("attn_check", maxdiff=diff, ok=int(diff < 5e-2))
    except Exception as e:  # the probe must not stop the measurement
        note(f"dense probe failed: {e!r}")
    del out

    def run_fwd():
        fwd()

    def run_fb():
        qb.grad = kb.grad = vb.grad = None
        fwd().backward(dout)

    ms_f, rf = bench_events(run_fwd, a.budget_s)
    result("attn_fwd", ms=ms_f, tflops=flops_fwd / ms_f / 1e9, seqs=nb, reps=rf, layout="batched")
    ms_fb, rfb = bench_events(run_fb, a.budget_s)
    result("attn_fwd_bwd", ms=ms_fb, tflops=3.5 * flops_fwd / ms_fb / 1e9, seqs=nb, reps=rfb, layout="batched")
    ms_b = max(ms_fb - ms_f, 1e-6)
    result("attn_bwd", ms=ms_b, tflops=2.5 * flops_fwd / ms_b / 1e9, derived="fwd_bwd_minus_fwd")
    result("attn_mem", peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    del qb, kb, vb, dout
    torch.cuda.empty_cache()
    # the target's causal prefill attention: SDPA (is_causal) as HF transformers' sdpa path calls it (kv heads
    # repeated to the query heads first, outside the timing), batched; bench_attention's attn_causal_* rows
    for T, nseq in ((a.S, 1), (1024, 4)):
        q = torch.randn(nseq, nh, T, d, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(nseq, nkv, T, d, device=dev, dtype=torch.bfloat16, generator=g).repeat_interleave(nh // nkv, 1)
        v = torch.randn(nseq, nkv, T, d, device=dev, dtype=torch.bfloat16, generator=g).repeat_interleave(nh // nkv, 1)

        def run_causal():
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

        run_causal()
        torch.cuda.synchronize()
        # one call per timed sample (its launch latency inside), and `per` calls back to back per sample (the kernel's
        # throughput, as a prefill issues them): bench_attention times its causal rows both ways too
        ms_1, _ = bench_events(run_causal, a.budget_s)
        per = max(1, round(5.0 / max(ms_1, 1e-3)))

        def run_many():
            for _ in range(per):
                run_causal()

        ms_m, rc = bench_events(run_many, a.budget_s)
        ms_c = ms_m / per
        fl = 4.0 * d * nh * T * (T + 1) / 2.0 * nseq
        result(f"attn_causal_{nseq}x{T}", ms=ms_c, tflops=fl / ms_c / 1e9, reps=rc, per_sample=per, ms_single=ms_1,
               tflops_single=fl / ms_1 / 1e9, layout="batched")
        del q, k, v


# ---------------------------------------------------------------------------------------------------------------
# (b) Hugging Face prefill
# ---------------------------------------------------------------------------------------------------------------


def prefill_flops(layers, lens, H, I, nh, nkv, d):
    p_layer = H * nh * d + 2 * H * nkv * d + nh * d * H + 3 * H * I
    return sum(layers * (2.0 * p_layer * t + 4.0 * d * nh * t * (t + 1) / 2.0) for t in lens)


def part_prefill(a):
    t0 = time.perf_counter()
    import transformers
    from transformers import Qwen3Config, Qwen3Model

    t_tf = time.perf_counter() - t0
    dev = torch.device(DEV_TYPE)
    H, I, L, V, nh, nkv, d = a.H, a.I, a.target_layers, a.V, a.nh, a.nkv, a.d
    cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                      num_attention_heads=nh, num_key_value_heads=nkv, head_dim=d, max_position_embeddings=40960,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, use_cache=False)
    cfg._attn_implementation = "sdpa"
    t0 = time.perf_counter()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            model = Qwen3Model(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.to(device=dev, dtype=torch.bfloat16).eval()
    torch.cuda.synchronize()
    t_build = time.perf_counter() - t0
    nparams = sum(p.numel() for p in model.parameters())
    impl = getattr(model.config, "_attn_implementation", "?")
    note(f"HF Qwen3Model (transformers {transformers.__version__}, import {t_tf:.1f} s): {nparams / 1e9:.3f}B params, "
         f"attn {impl}, built on the GPU with random weights in {t_build:.1f} s")
    layer_ids = default_target_layer_ids(L, 5)
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)

    def run(ids):
        with torch.inference_mode():
            o = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            return torch.cat([o.hidden_states[l + 1] for l in layer_ids], dim=-1)

    for name, (b, t) in (("prefill_3072", (1, a.T)), ("prefill_4x1024", (a.seqs, a.T_batch))):
        ids = torch.randint(0, V, (b, t), device=dev, generator=g)
        flops = prefill_flops(L, [t] * b, H, I, nh, nkv, d)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(ids)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        torch.cuda.reset_peak_memory_stats()
        ms, reps = bench_events(lambda: run(ids), a.budget_s, max_reps=10, warmup=1)
        tf = flops / ms / 1e9
        result(name, ms=ms, tokens_per_s=b * t / ms * 1e3, tflops=tf, mfu_989=tf / PEAK_TFLOPS, layers=L, reps=reps,
               first_ms=first * 1e3, peak_gib=torch.cuda.max_memory_allocated() / 2**30, attn=impl)


# ---------------------------------------------------------------------------------------------------------------
# (c) PyTorch drafter training step
# ---------------------------------------------------------------------------------------------------------------


class ChunkedLMHeadCE(torch.autograd.Function):
    """sum_r w_r * CE(h_r W^T, y_r) with the logits formed `chunk` rows at a time; dL/dh is computed in the forward
    (dz = w (softmax - onehot), dh = dz W) so no logits are kept for the backward."""

    @staticmethod
    def forward(ctx, h, W, labels, w, chunk):
        R = h.shape[0]
        dh = torch.empty_like(h)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        with torch.autocast(DEV_TYPE, enabled=False):
            for i in range(0, R, chunk):
                hc = h[i:i + chunk]
                y = labels[i:i + chunk]
                wc = w[i:i + chunk]
                z = torch.matmul(hc, W.t()).float()  # [c, V]
                lse = torch.logsumexp(z, dim=-1)
                zy = z.gather(1, y[:, None]).squeeze(1)
                loss += (wc * (lse - zy)).sum()
                z.sub_(lse[:, None]).exp_()  # softmax, in place
                z[torch.arange(z.shape[0], device=z.device), y] -= 1.0
                z.mul_(wc[:, None])
                dh[i:i + chunk] = torch.matmul(z.to(torch.bfloat16), W)
                del z
        ctx.dh = dh  # an intermediate (not an input or output): kept on ctx
        return loss

    @staticmethod
    def backward(ctx, g):
        return ctx.dh * g.to(ctx.dh.dtype), None, None, None, None


def rms(x, w, eps=1e-6):
    """HF Qwen3RMSNorm: fp32 inside; output bf16."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * w).to(torch.bfloat16)


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def step_flops(anchors_list, rows_total, S, N, B, H, I, L, nh, nkv, d, V, nf):
    NB = N * B
    f = 0.0
    for anc in anchors_list:
        f += 2.0 * 2.0 * S * (nf * H) * H
        f += L * 3.0 * 2.0 * NB * (H * nh * d + 2 * H * nkv * d + nh * d * H + 3 * H * I)
        f += L * 3.0 * 2.0 * S * H * (2 * nkv * d)
        f += 3.5 * attn_fwd_flops(anc, B, nh, d) * L
    f += 4.0 * V * H * rows_total
    return f


def part_step(a):
    from torch.utils.checkpoint import checkpoint

    dev = torch.device(DEV_TYPE)
    nb, S, N, B, H, I, L = a.seqs, a.S, a.N, a.B, a.H, a.I, a.layers
    nh, nkv, d, V, nf = a.nh, a.nkv, a.d, a.V, a.nf
    NB, KV = N * B, S + N * B
    mask_id = 151669 if V > 151669 else V - 1
    gamma = 7.0
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)

    # ---- weights (random; excluded from start-up like the C++ side's stand-ins) ----
    t0 = time.perf_counter()

    def lin(o, i):
        return torch.nn.Parameter(torch.randn(o, i, device=dev, generator=g).mul_(0.02))

    def nrm(n):
        return torch.nn.Parameter(torch.ones(n, device=dev))

    fc, hidden_norm = lin(H, nf * H), nrm(H)
    layers = []
    for _ in range(L):
        layers.append(dict(in_norm=nrm(H), wq=lin(nh * d, H), wk=lin(nkv * d, H), wv=lin(nkv * d, H),
                           wo=lin(H, nh * d), q_norm=nrm(d), k_norm=nrm(d), post_norm=nrm(H),
                           wg=lin(I, H), wu=lin(I, H), wd=lin(H, I)))
    final_norm = nrm(H)
    params = [fc, hidden_norm] + [p for lay in layers for p in lay.values()] + [final_norm]
    embed = torch.randn(V, H, device=dev, dtype=torch.bfloat16, generator=g).mul_(0.02)
    lm_head = torch.randn(V, H, device=dev, dtype=torch.bfloat16, generator=g).mul_(0.02)
    feats = torch.randn(nb, S, nf * H, device=dev, dtype=torch.bfloat16, generator=g)
    tokens = torch.randint(0, V, (nb, S), device=dev, generator=g)
    # ---- block inputs, positions, labels, weights (spec 2.2-2.4), all blocks valid ----
    anchors, anchors_t, bm, t_mask = shared_block_mask(a, dev)
    anc = anchors_t.long()  # [nb, N]
    slot = torch.arange(B, device=dev)
    pos_q = (anc[:, :, None] + slot).reshape(nb, NB)  # a_j + i
    block_ids = torch.full((nb, N, B), mask_id, dtype=torch.long, device=dev)
    block_ids[:, :, 0] = torch.gather(tokens, 1, anc)
    block_ids = block_ids.reshape(nb, NB)
    in_seq = pos_q < S
    labels_all = torch.gather(tokens, 1, pos_q.clamp(max=S - 1))
    wts = torch.exp(-(slot.float() - 1.0) / gamma)[None, None, :].expand(nb, N, B).reshape(nb, NB).clone()
    wts = wts * (slot[None, None, :] > 0).expand(nb, N, B).reshape(nb, NB).float() * in_seq.float()
    wflat = wts.reshape(-1)
    rows = torch.nonzero(wflat > 0).squeeze(1)
    rows_total = int(rows.numel())
    sum_w = float(wflat.sum())
    labels = labels_all.reshape(-1).index_select(0, rows)
    wsel = (wflat.index_select(0, rows) / sum_w).float()
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))

    def cos_sin(pos):
        ang = pos.float()[..., None] * inv_freq
        emb = torch.cat((ang, ang), dim=-1)[:, :, None, :]
        return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)

    cos_q, sin_q = cos_sin(pos_q)
    pos_k = torch.cat([torch.arange(S, device=dev)[None, :].expand(nb, S), pos_q], dim=1)
    cos_k, sin_k = cos_sin(pos_k)
    torch.cuda.synchronize()
    t_weights = time.perf_counter() - t0
    flops = step_flops(anchors, rows_total, S, N, B, H, I, L, nh, nkv, d, V, nf)
    nparams = sum(p.numel() for p in params)
    note(f"PyTorch drafter: {nparams / 1e9:.3f}B params (fp32 master, autocast bf16), batch {nb} x (S {S}, N {N}, "
         f"B {B}); weights built in {t_weights:.1f} s; BlockMask {t_mask * 1e3:.0f} ms (outside the step); "
         f"{flops / 1e12:.1f} TFLOP/step; {rows_total} scored rows")
    result("step_blockmask", ms=t_mask * 1e3)

    flex = shared_flex()
    scale = 1.0 / math.sqrt(d)
    opt = torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=DEV_TYPE == "cuda")

    def layer_pre(h, Ht, l):
        P = layers[l]
        x = rms(h, P["in_norm"])
        q = F.linear(x, P["wq"]).view(nb, NB, nh, d)
        q = rope(rms(q, P["q_norm"]), cos_q, sin_q)
        kv_in = torch.cat([Ht, x], dim=1)
        k = F.linear(kv_in, P["wk"]).view(nb, KV, nkv, d)
        k = rope(rms(k, P["k_norm"]), cos_k, sin_k)
        v = F.linear(kv_in, P["wv"]).view(nb, KV, nkv, d)
        return q, k, v

    def layer_post(h, o, l):
        P = layers[l]
        h = h + F.linear(o, P["wo"])
        n = rms(h, P["post_norm"])
        return h + F.linear(F.silu(F.linear(n, P["wg"])) * F.linear(n, P["wu"]), P["wd"])

    def loss_fn(ckpt):
        with torch.autocast(DEV_TYPE, dtype=torch.bfloat16):
            Ht = rms(F.linear(feats, fc), hidden_norm)
            h = F.embedding(block_ids, embed)
            for l in range(L):
                if ckpt:
                    q, k, v = checkpoint(layer_pre, h, Ht, l, use_reentrant=False)
                else:
                    q, k, v = layer_pre(h, Ht, l)
                o = flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=bm, scale=scale,
                         enable_gqa=True)
                o = o.transpose(1, 2).reshape(nb, NB, nh * d)
                h = checkpoint(layer_post, h, o, l, use_reentrant=False) if ckpt else layer_post(h, o, l)
            hf = rms(h, final_norm)
        hs = hf.reshape(nb * NB, H).index_select(0, rows)
        return ChunkedLMHeadCE.apply(hs, lm_head, labels, wsel, 1024)

    def step(ckpt):
        loss = loss_fn(ckpt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # foreach by default on CUDA
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def timed_step(ckpt):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = step(ckpt)
        torch.cuda.synchronize()
        return time.perf_counter() - t, loss

    first_done = False
    for mode in a.modes.split(","):
        ckpt = mode == "ckpt"
        try:
            tw, loss = timed_step(ckpt)  # warm-up (the very first one compiles flex forward and backward)
            if not first_done:
                first_done = True
                # flex compiled earlier in this process by (a) (its first forward + backward): counted here too
                pre = _SHARED.get("compile_s", 0.0)
                result("startup", s=_T_IMPORT + _SHARED["cuda_init_s"] + pre + tw, import_s=_T_IMPORT,
                       cuda_init_s=_SHARED["cuda_init_s"], flex_compile_before_s=pre, first_step_s=tw,
                       excluded_weights_s=t_weights, excluded_mask_s=t_mask, mode=mode)
            note(f"{mode}: warm-up step {tw:.3f} s, loss {float(loss):.4f}")
            reps = max(2, min(a.max_reps, int(a.budget_s / max(tw, 1e-3))))
            if mode == a.modes.split(",")[0]:
                tw2, _ = timed_step(ckpt)  # the first warm-up compiled: one more before timing
                reps = max(2, min(a.max_reps, int(a.budget_s / max(tw2, 1e-3))))
            torch.cuda.reset_peak_memory_stats()
            ts = []
            for _ in range(reps):
                t, loss = timed_step(ckpt)
                ts.append(t)
            sec = statistics.median(ts)
            tf = flops / sec / 1e12
            result("step_recompute" if ckpt else "step", ms=sec * 1e3, tokens_per_s=nb * NB / sec, tflops=tf,
                   mfu_989=tf / PEAK_TFLOPS, peak_gib=torch.cuda.max_memory_allocated() / 2**30,
                   reserved_gib=torch.cuda.max_memory_reserved() / 2**30, reps=reps, loss=float(loss),
                   seqs=nb, draft_tokens=nb * NB, layout="batched", mode=mode)
        except Exception as e:
            traceback.print_exc()
            result("step_error", mode=mode, msg=repr(e)[:200])
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
    result("step_flops", tflop=flops / 1e12, scored_rows=rows_total)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", required=True, choices=["attn", "prefill", "step", "attnstep"],
                    help="attnstep = attn then step in one process (one flex compile serves both)")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--S", type=int, default=3072)
    ap.add_argument("--N", type=int, default=512)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--I", type=int, default=12288)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--nh", type=int, default=32)
    ap.add_argument("--nkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--nf", type=int, default=5)
    ap.add_argument("--layers", type=int, default=5, help="draft layers")
    ap.add_argument("--target-layers", type=int, default=36)
    ap.add_argument("--T", type=int, default=3072, help="prefill length (one sequence)")
    ap.add_argument("--T-batch", type=int, default=1024, help="prefill length of each of --seqs sequences")
    ap.add_argument("--modes", default="ckpt,nockpt", help="step modes, in order (the first gives start-up)")
    ap.add_argument("--budget-s", type=float, default=5.0, help="seconds of timed repeats per measurement")
    ap.add_argument("--max-reps", type=int, default=5, help="step repeats at most")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"torch_ref.py: no CUDA device visible to torch {torch.__version__}; nothing measured")
        return 0
    t0 = time.perf_counter()
    torch.zeros(1, device=DEV_TYPE)
    torch.cuda.synchronize()
    _SHARED["cuda_init_s"] = time.perf_counter() - t0
    note(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}; import {_T_IMPORT:.2f} s, CUDA init "
         f"{_SHARED['cuda_init_s']:.2f} s; inductor cache {os.environ.get('TORCHINDUCTOR_CACHE_DIR', '(default)')}")
    parts = {"attn": [part_attn], "prefill": [part_prefill], "step": [part_step],
             "attnstep": [part_attn, part_step]}[a.part]
    rc = 0
    for fn in parts:
        try:
            fn(a)
        except Exception as e:
            traceback.print_exc()
            result(f"{fn.__name__[5:]}_error", msg=repr(e)[:300])
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
