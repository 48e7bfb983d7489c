#!/usr/bin/env python3
"""bench/torch_pipeline.py - the PyTorch reference of the multi-GPU training pipeline (spec 6, the origin's design):
one process, one Python thread per GPU role, target hidden states handed to the drafters through bounded queues.

    python3 bench/torch_pipeline.py --layouts split,coloc2,coloc1 --steps 6     # stages alone, then the layouts
    python3 bench/torch_pipeline.py --part stages                              # each stage alone only
    python3 bench/torch_pipeline.py --part layouts --layouts split             # one layout only

Needs CUDA (1 GPU for `coloc1` and the stages, 2 for `split` and `coloc2`), PyTorch with flex_attention and
transformers (Qwen3Model); no network (random weights). Run with PYTHONUNBUFFERED=1; default arguments take about
2-3 minutes on 2 H200s. Output: `RESULT name=... impl=torch key=value ...` lines (torch_ref.py's format); a layout
or stage that fails prints its RESULT line with error=... and the run goes on.

Roles (shapes of bench/torch_ref.py: Qwen3-8B target and drafter):
- TARGET thread, one per target GPU: an HF transformers Qwen3Model with random weights (normal(0, 0.02), norms 1)
  at Qwen3-8B shapes (H 4096, 36 layers, 32/8 heads, d 128, I 12288, V 151936, rope theta 1e6, bf16, sdpa),
  built directly on its GPU. It loops: random ids [1, S=3072] -> forward (no grad, output_hidden_states) ->
  hidden_states[l+1] for l in [1, 9, 17, 25, 33] concatenated to features [S, 5*4096] bf16 -> copied to its
  drafter's GPU on a side stream (`.to(dev, non_blocking=True)`; nothing is copied when both are one GPU) ->
  side-stream synchronize (so the tensor is complete when it is queued) -> queue.put. One queue per drafter,
  queue.Queue(maxsize=--queue-depth sequences; default 8 = 2 drafter steps of 4 sequences: with a depth of 2
  sequences the drafter would wait for two target forwards at every step). Target i feeds drafter i % D.
- DRAFTER thread, one per drafter GPU: torch_ref.py's drafter step (5 layers, B 16, N 512 anchors per sequence,
  fp32 masters + autocast bf16, torch.compile(flex_attention) with the DFlash BlockMask, chunked lm_head CE,
  clip 1.0, fused AdamW); it takes --seqs (4) sequences from its queue per optimizer step (stacked to a batch of 4).
  The consumer calls record_stream() on every tensor it takes, so the caching allocator cannot hand the memory
  back to the producer's stream while the drafter's stream still reads it.
  Anchors (hence the BlockMask, positions, RoPE tables, loss weights) are fixed per batch slot, as in torch_ref.py
  (the C++ benches' generator); tokens and features come from the target at every step.
- Every thread has its own CUDA stream (co-located roles overlap on one GPU); grad mode, autocast, current device
  and stream are thread-local and set in each thread.
- Several drafters (coloc2) are data-parallel replicas. torch.distributed does not work for several GPUs in one
  process, so the gradients are combined by hand: after backward each replica synchronizes its stream and waits at
  a threading.Barrier; each then pulls every peer's gradients into preallocated receive buffers on its own GPU
  (peer copies issued from its thread), synchronizes, waits at the barrier again (no one changes a gradient another
  replica still reads), then sums in the fixed replica order 0..D-1 (bit-identical on every replica) and scales by
  1/D: each replica's loss is normalised by its own weight sum, all equal here, so the mean is spec 2.4's global
  normalisation over the D*4 sequences. Then clip and AdamW on each replica: every replica does the same update
  (reported: replica_maxdiff, the largest parameter difference between replicas after the timed steps).
- Compilation and warm-up are single-threaded, in the main thread, before any worker thread starts (spec 6: the
  origin's JIT raced between GPU threads): BlockMask per GPU, one drafter step per drafter (compiles flex forward and
  backward for that GPU), one forward per target, peer access between the layout's GPUs; then replica 0's weights
  and AdamW state are copied to the other replicas. warmup_s = those seconds (targets' forwards + drafter steps);
  build_s = weights. Compiled code is kept in the process, so a later layout on the same GPU compiles less (the
  stages run first and compile flex for cuda:0). recompiles = Dynamo graphs compiled while the threads ran
  (expected 0; a nonzero value is the origin's failure mode).

Timing (per layout): the clock starts when the worker threads start (the pipeline fills from empty queues) and
stops when every drafter has finished --steps optimizer steps.
  ctx_tok_s = sequences consumed by the drafters * S / seconds;  tok_s_per_gpu = ctx_tok_s / GPUs of the layout;
  ctx_tok_s_steady: the same over the steps after the first (pipeline fill excluded);
  busy_target / busy_drafter = time inside the role's compute (target: ids + forward + copy until synchronized;
  drafter: stack + step + gradient sum, barrier waits excluded, until its stream is synchronized) / wall, averaged
  over the role's threads; wait_drafter = time a drafter waited for sequences / wall;
  peak_gib_gpuN = torch.cuda.max_memory_allocated(N) over the whole layout (build and warm-up included);
  stage_bound_tok_s: what the stages alone predict: split = min(T * target, D * drafter); co-located =
  GPUs / (1/target + 1/drafter) (the two roles time-sharing each GPU without overlap).
Layouts: split = 1 target on cuda:0 + 1 drafter on cuda:1; coloc2 = cuda:0 and cuda:1 each run a target thread and
a drafter thread (two data-parallel drafters); coloc1 = cuda:0 runs one target thread and one drafter thread.
Stages (--part stages), each alone on cuda:0, one thread: stage_target = timed forwards of 1 x S (tok_s = S / median
forward); stage_drafter = timed drafter steps of --seqs sequences with random features (ctx_tok_s = seqs * S /
median step). All GPU memory is freed between layouts and stages.

Reused from bench/torch_ref.py (imported, not copied): result, note, make_anchors, dflash_block_mask, shared_flex,
ChunkedLMHeadCE, rms, rope, step_flops, default_target_layer_ids, prefill_flops, PEAK_TFLOPS. Copied (they are
inside part_step / part_prefill there): the drafter's weights, batch tensors, layer_pre/layer_post/loss and step,
and the target's config / build / feature capture, as Drafter, build_target and target_features below.
"""
import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # no NVLink multicast (kept for anything that initialises NCCL; unused here)

import argparse  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import queue  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (imports torch)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

_STAGE = {}  # stage results (tok/s) for the layouts' stage_bound_tok_s
_BM = {}  # BlockMask per device index, built once in the main thread (anchors are the same for every layout)


def res(name, **kv):
    """torch_ref.result with string values made safe for one `key=value` token each."""
    out = {}
    for k, v in kv.items():
        if isinstance(v, str):
            v = re.sub(r"\s+", "_", v)[:300] or "-"
        out[k] = v
    torch_ref.result(name, **out)


def note(msg):
    torch_ref.note(msg)


def err_text(e):
    return f"{type(e).__name__}:{str(e)[:240]}"


def sync_all():
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)


def free_gpus():
    gc.collect()
    for i in range(torch.cuda.device_count()):
        with torch.cuda.device(i):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def dynamo_graphs():
    """Dynamo graphs compiled so far in this process (None when the counter is not available)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


def raise_recompile_limit():
    """Compiled flex runs on 2 devices (and both checkpoint modes): keep Dynamo from giving up on recompiles."""
    try:
        import torch._dynamo
        for key in ("cache_size_limit", "recompile_limit"):
            try:
                if getattr(torch._dynamo.config, key, 0) < 64:
                    setattr(torch._dynamo.config, key, 64)
            except Exception:
                pass
    except Exception as e:
        note(f"could not raise Dynamo's recompile limit: {err_text(e)}")


def overlap(intervals, t0, t1):
    """Seconds of the (start, end) intervals inside [t0, t1]."""
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in intervals)


# ---------------------------------------------------------------------------------------------------------------
# target (copied from torch_ref.part_prefill: config, build on the GPU, feature capture)
# ---------------------------------------------------------------------------------------------------------------


def build_target(a, dev):
    """HF Qwen3Model (or Qwen3MoeModel with --target-family qwen3_moe, experts through transformers' fastest
    implementation, grouped_mm) with random weights at the target shapes, built on `dev` (main thread only: it
    changes the process-global default dtype while it builds)."""
    from transformers import Qwen3Config, Qwen3Model

    if a.target_family == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeModel

        Qwen3Model = Qwen3MoeModel  # noqa: N806
        cfg = Qwen3MoeConfig(vocab_size=a.V, hidden_size=a.H, intermediate_size=a.I, num_hidden_layers=a.target_layers,
                             num_attention_heads=a.nh, num_key_value_heads=a.nkv, head_dim=a.d,
                             max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
                             use_cache=False, num_experts=a.experts, num_experts_per_tok=a.top_k,
                             moe_intermediate_size=a.moe_I, norm_topk_prob=True, decoder_sparse_step=1,
                             mlp_only_layers=[])
    else:
        cfg = Qwen3Config(vocab_size=a.V, hidden_size=a.H, intermediate_size=a.I, num_hidden_layers=a.target_layers,
                          num_attention_heads=a.nh, num_key_value_heads=a.nkv, head_dim=a.d,
                          max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False, use_cache=False)
    # rope theta 1e6 (Qwen3-8B): transformers 5 keeps it in rope_parameters, 4.x in rope_theta; set what exists
    try:
        rp = getattr(cfg, "rope_parameters", None)
        if isinstance(rp, dict):
            rp["rope_theta"] = a.rope_theta
        if hasattr(cfg, "rope_theta") or not isinstance(rp, dict):
            cfg.rope_theta = a.rope_theta
    except Exception as e:
        note(f"rope theta not set ({err_text(e)}); the config's default is used")
    cfg._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            model = Qwen3Model(cfg)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():
        for p in model.parameters():  # in place on the GPU, no CPU copy; buffers (rope inv_freq) keep their dtype
            if p.device != dev or p.dtype != torch.bfloat16:
                p.data = p.data.to(device=dev, dtype=torch.bfloat16)
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            else:
                p.fill_(1.0)
    model = model.to(device=dev).eval()
    model.requires_grad_(False)
    if a.target_family == "qwen3_moe":
        model.set_experts_implementation(a.experts_impl)
    return model


def target_features(model, ids, layer_ids):
    """[1, S] ids -> [1, S, len(layer_ids) * H] bf16: hidden_states[l + 1] of each target layer l, concatenated."""
    o = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = o.hidden_states
    return torch.cat([hs[l + 1] for l in layer_ids], dim=-1)


# ---------------------------------------------------------------------------------------------------------------
# drafter (copied from torch_ref.part_step, the minimum: it builds everything inside that one function there)
# ---------------------------------------------------------------------------------------------------------------


def block_mask_for(a, dev):
    """(anchors list, anchors tensor [nb, N] int32, BlockMask) on `dev`, built once per device (main thread)."""
    key = dev.index
    if key not in _BM:
        from torch.nn.attention.flex_attention import create_block_mask
        anchors = [torch_ref.make_anchors(a.seed, s, a.S, a.N) for s in range(a.seqs)]
        anchors_t = torch.tensor(anchors, dtype=torch.int32, device=dev)
        with torch.cuda.device(dev):
            bm = torch_ref.dflash_block_mask(anchors_t, a.S, a.B, create_block_mask)
        _BM[key] = (anchors, anchors_t, bm)
    return _BM[key]


class Drafter:
    """torch_ref.part_step's drafter on one device: the same weights (seeded), BlockMask, batch tensors, forward,
    chunked CE, clip and fused AdamW; features [nb, S, nf*H] and tokens [nb, S] are inputs of every step."""

    def __init__(self, a, dev, ckpt):
        self.a, self.dev, self.ckpt = a, dev, ckpt
        nb, S, N, B, H, I, L = a.seqs, a.S, a.N, a.B, a.H, a.I, a.layers
        nh, nkv, d, V, nf = a.nh, a.nkv, a.d, a.V, a.nf
        NB, KV = N * B, S + N * B
        self.nb, self.S, self.N, self.B, self.H, self.NB, self.KV = nb, S, N, B, H, NB, KV
        self.nh, self.nkv, self.d = nh, nkv, d
        self.mask_id = 151669 if V > 151669 else V - 1
        gamma = 7.0
        g = torch.Generator(device=dev)
        g.manual_seed(a.seed)

        def lin(o, i):
            return torch.nn.Parameter(torch.randn(o, i, device=dev, generator=g).mul_(0.02))

        def nrm(n):
            return torch.nn.Parameter(torch.ones(n, device=dev))

        self.fc, self.hidden_norm = lin(H, nf * H), nrm(H)
        self.layers = []
        for _ in range(L):
            self.layers.append(dict(in_norm=nrm(H), wq=lin(nh * d, H), wk=lin(nkv * d, H), wv=lin(nkv * d, H),
                                    wo=lin(H, nh * d), q_norm=nrm(d), k_norm=nrm(d), post_norm=nrm(H),
                                    wg=lin(I, H), wu=lin(I, H), wd=lin(H, I)))
        self.final_norm = nrm(H)
        self.params = ([self.fc, self.hidden_norm] + [p for lay in self.layers for p in lay.values()]
                       + [self.final_norm])
        self.embed = torch.randn(V, H, device=dev, dtype=torch.bfloat16, generator=g).mul_(0.02)
        self.lm_head = torch.randn(V, H, device=dev, dtype=torch.bfloat16, generator=g).mul_(0.02)
        # ---- fixed per batch slot: anchors, BlockMask, positions, RoPE tables, loss rows and weights ----
        anchors, anchors_t, self.bm = block_mask_for(a, dev)
        self.anchors = anchors
        anc = anchors_t.long()  # [nb, N]
        self.anc = anc
        slot = torch.arange(B, device=dev)
        pos_q = (anc[:, :, None] + slot).reshape(nb, NB)  # a_j + i
        in_seq = pos_q < S
        self.pos_lab = pos_q.clamp(max=S - 1)
        wts = torch.exp(-(slot.float() - 1.0) / gamma)[None, None, :].expand(nb, N, B).reshape(nb, NB).clone()
        wts = wts * (slot[None, None, :] > 0).expand(nb, N, B).reshape(nb, NB).float() * in_seq.float()
        wflat = wts.reshape(-1)
        self.rows = torch.nonzero(wflat > 0).squeeze(1)
        self.rows_total = int(self.rows.numel())
        sum_w = float(wflat.sum())
        self.wsel = (wflat.index_select(0, self.rows) / sum_w).float()
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))

        def cos_sin(pos):
            ang = pos.float()[..., None] * inv_freq
            emb = torch.cat((ang, ang), dim=-1)[:, :, None, :]
            return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)

        self.cos_q, self.sin_q = cos_sin(pos_q)
        pos_k = torch.cat([torch.arange(S, device=dev)[None, :].expand(nb, S), pos_q], dim=1)
        self.cos_k, self.sin_k = cos_sin(pos_k)
        self.flex = torch_ref.shared_flex()
        self.scale = 1.0 / math.sqrt(d)
        self.opt = torch.optim.AdamW(self.params, lr=6e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                     fused=True)
        self.flops = torch_ref.step_flops(anchors, self.rows_total, S, N, B, H, I, L, nh, nkv, d, V, nf)
        self.nparams = sum(p.numel() for p in self.params)
        self.recv = {}  # peer index -> receive buffers (one per parameter), set by GradSum

    def layer_pre(self, h, Ht, l):
        P = self.layers[l]
        nb, NB, KV, nh, nkv, d = self.nb, self.NB, self.KV, self.nh, self.nkv, self.d
        x = torch_ref.rms(h, P["in_norm"])
        q = F.linear(x, P["wq"]).view(nb, NB, nh, d)
        q = torch_ref.rope(torch_ref.rms(q, P["q_norm"]), self.cos_q, self.sin_q)
        kv_in = torch.cat([Ht, x], dim=1)
        k = F.linear(kv_in, P["wk"]).view(nb, KV, nkv, d)
        k = torch_ref.rope(torch_ref.rms(k, P["k_norm"]), self.cos_k, self.sin_k)
        v = F.linear(kv_in, P["wv"]).view(nb, KV, nkv, d)
        return q, k, v

    def layer_post(self, h, o, l):
        P = self.layers[l]
        h = h + F.linear(o, P["wo"])
        n = torch_ref.rms(h, P["post_norm"])
        return h + F.linear(F.silu(F.linear(n, P["wg"])) * F.linear(n, P["wu"]), P["wd"])

    def loss(self, feats, tokens):
        from torch.utils.checkpoint import checkpoint

        nb, N, B, NB, H = self.nb, self.N, self.B, self.NB, self.H
        # block inputs (spec 2.2): slot 0 = the token at the anchor, the rest the mask token; labels (spec 2.4)
        block_ids = torch.full((nb, N, B), self.mask_id, dtype=torch.long, device=self.dev)
        block_ids[:, :, 0] = torch.gather(tokens, 1, self.anc)
        block_ids = block_ids.reshape(nb, NB)
        labels = torch.gather(tokens, 1, self.pos_lab).reshape(-1).index_select(0, self.rows)
        ckpt = self.ckpt
        with torch.autocast("cuda", dtype=torch.bfloat16):
            Ht = torch_ref.rms(F.linear(feats, self.fc), self.hidden_norm)
            h = F.embedding(block_ids, self.embed)
            for l in range(len(self.layers)):
                if ckpt:
                    q, k, v = checkpoint(self.layer_pre, h, Ht, l, use_reentrant=False)
                else:
                    q, k, v = self.layer_pre(h, Ht, l)
                o = self.flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=self.bm,
                              scale=self.scale, enable_gqa=True)
                o = o.transpose(1, 2).reshape(nb, NB, self.nh * self.d)
                h = checkpoint(self.layer_post, h, o, l, use_reentrant=False) if ckpt else self.layer_post(h, o, l)
            hf = torch_ref.rms(h, self.final_norm)
        hs = hf.reshape(nb * NB, H).index_select(0, self.rows)
        return torch_ref.ChunkedLMHeadCE.apply(hs, self.lm_head, labels, self.wsel, 1024)

    def step(self, feats, tokens, grad_sync=None):
        """One optimizer step; grad_sync(self) combines the gradients with the other replicas before clip."""
        loss = self.loss(feats, tokens)
        loss.backward()
        if grad_sync is not None:
            grad_sync(self)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def random_batch(self, seed):
        g = torch.Generator(device=self.dev)
        g.manual_seed(seed)
        a = self.a
        feats = torch.randn(self.nb, self.S, a.nf * a.H, device=self.dev, dtype=torch.bfloat16, generator=g)
        tokens = torch.randint(0, a.V, (self.nb, self.S), device=self.dev, generator=g)
        return feats, tokens


def copy_replica(src, dst):
    """Weights and AdamW state of replica src -> replica dst (main thread, after the warm-up)."""
    with torch.no_grad():
        for p0, p in zip(src.params, dst.params):
            p.copy_(p0)
            s0, s1 = src.opt.state.get(p0, {}), dst.opt.state.get(p, {})
            for k, v in s0.items():
                if torch.is_tensor(v) and torch.is_tensor(s1.get(k)):
                    s1[k].copy_(v)


def replica_maxdiff(drafters):
    """Largest |p_r - p_0| over a few parameters (first, middle, last) of every replica r > 0."""
    if len(drafters) < 2:
        return 0.0
    idx = sorted({0, len(drafters[0].params) // 2, len(drafters[0].params) - 3, len(drafters[0].params) - 1})
    worst = 0.0
    with torch.no_grad():
        for dr in drafters[1:]:
            for i in idx:
                p0 = drafters[0].params[i]
                worst = max(worst, float((dr.params[i].to(p0.device) - p0).abs().max()))
    return worst


class GradSum:
    """Data-parallel gradient mean over the drafter replicas of one process, by hand (see the docstring)."""

    def __init__(self, drafters, timeout_s):
        self.dr = drafters
        self.D = len(drafters)
        self.barrier = threading.Barrier(self.D, timeout=timeout_s)
        for r, d in enumerate(drafters):
            with torch.cuda.device(d.dev):
                d.recv = {k: [torch.empty_like(p) for p in d.params] for k in range(self.D) if k != r}

    def make(self, r, stats):
        def fn(me):
            D = self.D
            s = torch.cuda.current_stream(me.dev)
            t0 = time.perf_counter()
            s.synchronize()  # this replica's gradients are complete
            tw = time.perf_counter()
            self.barrier.wait()  # every replica's gradients are complete
            stats["barrier_s"] += time.perf_counter() - tw
            for k in range(D):
                if k == r:
                    continue
                for buf, p in zip(me.recv[k], self.dr[k].params):
                    if p.grad is None:
                        raise RuntimeError(f"replica {k}: a parameter has no gradient")
                    buf.copy_(p.grad, non_blocking=True)  # peer copy; ordered with this thread's stream
            s.synchronize()  # the copies are done
            tw = time.perf_counter()
            self.barrier.wait()  # nobody reads anybody's gradients any more
            stats["barrier_s"] += time.perf_counter() - tw
            with torch.no_grad():
                for i, p in enumerate(me.params):
                    parts = [p.grad if k == r else me.recv[k][i] for k in range(D)]
                    acc = parts[0]  # own gradient (r == 0) or a receive buffer (scratch): same order everywhere
                    for x in parts[1:]:
                        acc.add_(x)
                    if acc is not p.grad:
                        p.grad.copy_(acc)
                    p.grad.mul_(1.0 / D)
            s.synchronize()
            stats["allreduce_s"] += time.perf_counter() - t0
        return fn


# ---------------------------------------------------------------------------------------------------------------
# workers
# ---------------------------------------------------------------------------------------------------------------


class Ctl:
    """Shared control of one layout's threads."""

    def __init__(self):
        self.stop = threading.Event()
        self.errors = []  # strings only (an exception object would keep its frames' tensors alive)
        self.lock = threading.Lock()
        self.barrier = None

    def fail(self, who, e):
        if sys.exc_info()[0] is not None:
            traceback.print_exc()
        with self.lock:
            self.errors.append(f"{who}:{err_text(e)}")
        self.stop.set()
        if self.barrier is not None:
            try:
                self.barrier.abort()
            except Exception:
                pass


def target_worker(ti, model, tdev, ddev, q, layer_ids, a, ctl, st):
    try:
        torch.cuda.set_device(tdev)
        ts = torch.cuda.Stream(device=tdev)  # compute
        cs = torch.cuda.Stream(device=tdev)  # hand-over copy
        torch.cuda.set_stream(ts)
        gen = torch.Generator(device=tdev)
        gen.manual_seed(a.seed * 1000 + 17 + ti)
        while not ctl.stop.is_set():
            t0 = time.perf_counter()
            with torch.no_grad():
                ids = torch.randint(0, a.V, (1, a.S), device=tdev, generator=gen)
                feats = target_features(model, ids, layer_ids)  # [1, S, nf*H]
                cs.wait_stream(ts)
                with torch.cuda.stream(cs):
                    f_out = feats[0].to(ddev, non_blocking=True)  # same GPU: no copy, the same tensor
                    t_out = ids[0].to(ddev, non_blocking=True)
                cs.synchronize()  # forward and copy complete: the consumer may use them on any stream
            t1 = time.perf_counter()
            st["busy"].append((t0, t1))
            st["produced"] += 1
            del feats, ids
            item = (f_out, t_out)
            del f_out, t_out
            while True:
                try:
                    q.put(item, timeout=0.2)
                    break
                except queue.Full:
                    if ctl.stop.is_set():
                        return
    except Exception as e:
        ctl.fail(f"target{ti}", e)


def drafter_worker(r, dr, q, grad_sync, a, ctl, st):
    try:
        dev = dr.dev
        torch.cuda.set_device(dev)
        s = torch.cuda.Stream(device=dev)
        torch.cuda.set_stream(s)
        for _ in range(a.steps):
            items = []
            tw = time.perf_counter()
            while len(items) < dr.nb:
                try:
                    items.append(q.get(timeout=0.2))
                except queue.Empty:
                    if ctl.stop.is_set():
                        return
            t0 = time.perf_counter()
            st["wait_s"] += t0 - tw
            for f, tok in items:
                f.record_stream(s)  # allocated on the producer's stream: freed only after s is done with them
                tok.record_stream(s)
            feats = torch.stack([f for f, _ in items])
            tokens = torch.stack([tok for _, tok in items])
            del items
            b0 = st["barrier_s"]
            loss = dr.step(feats, tokens, grad_sync)
            del feats, tokens
            s.synchronize()
            t1 = time.perf_counter()
            st["busy_s"] += (t1 - t0) - (st["barrier_s"] - b0)
            st["step_end"].append(t1)
            st["consumed"] += dr.nb
            st["loss"] = float(loss)
    except Exception as e:
        ctl.fail(f"drafter{r}", e)


# ---------------------------------------------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------------------------------------------

LAYOUTS = {  # name: (target GPUs, drafter GPUs)
    "split": ([0], [1]),
    "coloc2": ([0, 1], [0, 1]),
    "coloc1": ([0], [0]),
}


def run_layout(a, name):
    tids, dids = LAYOUTS[name]
    ngpu = len(set(tids) | set(dids))
    if torch.cuda.device_count() < ngpu:
        res(f"pipeline_{name}", error=f"needs_{ngpu}_GPUs_found_{torch.cuda.device_count()}")
        return
    T, D = len(tids), len(dids)
    layer_ids = torch_ref.default_target_layer_ids(a.target_layers, a.nf)
    for i in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(i)
    targets, drafters, ctl, queues, threads = [], [], None, [], []
    try:
        # ---- build (main thread) ----
        t0 = time.perf_counter()
        for i in tids:
            targets.append(build_target(a, torch.device("cuda", i)))
        for i in dids:
            drafters.append(Drafter(a, torch.device("cuda", i), a.ckpt))
        sync_all()
        build_s = time.perf_counter() - t0
        # ---- warm-up / compile (main thread, one after another) ----
        t0 = time.perf_counter()
        for m, i in zip(targets, tids):
            with torch.cuda.device(i), torch.no_grad():
                ids = torch.randint(0, a.V, (1, a.S), device=torch.device("cuda", i))
                f = target_features(m, ids, layer_ids)
                torch.cuda.synchronize()
                del f, ids
        t_tw = time.perf_counter() - t0
        for r, dr in enumerate(drafters):
            with torch.cuda.device(dr.dev):
                feats, tokens = dr.random_batch(a.seed + 5)
                loss = dr.step(feats, tokens)
                torch.cuda.synchronize()
                note(f"{name}: drafter {r} on {dr.dev} warm-up step done, loss {float(loss):.4f}")
                del feats, tokens, loss
        warmup_s = time.perf_counter() - t0
        for dr in drafters[1:]:
            copy_replica(drafters[0], dr)
        used = sorted(set(tids) | set(dids))
        for i in used:  # peer access (enabled by the first copy between two GPUs) before the clock starts
            for j in used:
                if i != j:
                    torch.ones(1, device=torch.device("cuda", i)).to(torch.device("cuda", j))
        sync_all()
        ctl = Ctl()
        gsum = GradSum(drafters, a.barrier_timeout) if D > 1 else None
        if gsum is not None:
            ctl.barrier = gsum.barrier
        sync_all()
        note(f"{name}: built in {build_s:.1f} s (targets on {tids}, drafters on {dids}, "
             f"{drafters[0].nparams / 1e9:.3f}B drafter params), warm-up {warmup_s:.1f} s "
             f"(target forwards {t_tw:.1f} s)")
        # ---- timed: worker threads ----
        queues = [queue.Queue(maxsize=a.queue_depth) for _ in range(D)]
        tst = [dict(busy=[], produced=0) for _ in range(T)]
        dst = [dict(busy_s=0.0, wait_s=0.0, barrier_s=0.0, allreduce_s=0.0, step_end=[], consumed=0, loss=float("nan"))
               for _ in range(D)]
        tthreads = [threading.Thread(target=target_worker, daemon=True, name=f"target{k}",
                                     args=(k, targets[k], torch.device("cuda", tids[k]),
                                           drafters[k % D].dev, queues[k % D], layer_ids, a, ctl, tst[k]))
                    for k in range(T)]
        dthreads = [threading.Thread(target=drafter_worker, daemon=True, name=f"drafter{r}",
                                     args=(r, drafters[r], queues[r], gsum.make(r, dst[r]) if gsum else None, a,
                                           ctl, dst[r]))
                    for r in range(D)]
        threads = tthreads + dthreads
        g0 = dynamo_graphs()
        t_start = time.perf_counter()
        for th in threads:
            th.start()
        deadline = t_start + a.layout_timeout
        for th in dthreads:
            th.join(timeout=max(1.0, deadline - time.perf_counter()))
        t_joined = time.perf_counter()
        ctl.stop.set()
        for th in tthreads:
            th.join(timeout=60.0)
        hung = [th.name for th in threads if th.is_alive()]
        if hung:
            ctl.fail("main", TimeoutError(f"threads still running after {a.layout_timeout:.0f} s: {hung}"))
        g1 = dynamo_graphs()
        if ctl.errors:
            res(f"pipeline_{name}", error=";".join(ctl.errors), steps=a.steps, warmup_s=warmup_s, build_s=build_s,
                consumed=sum(s["consumed"] for s in dst))
            return
        ends = [s["step_end"] for s in dst]
        t_end = max(e[-1] for e in ends) if all(ends) else t_joined
        seconds = t_end - t_start
        consumed = sum(s["consumed"] for s in dst)
        ctx = consumed * a.S / seconds
        kv = dict(ctx_tok_s=ctx, tok_s_per_gpu=ctx / ngpu, steps=a.steps, seconds=seconds, warmup_s=warmup_s)
        kv["busy_target"] = statistics.mean(overlap(s["busy"], t_start, t_end) / seconds for s in tst)
        kv["busy_drafter"] = statistics.mean(s["busy_s"] / seconds for s in dst)
        kv["wait_drafter"] = statistics.mean(s["wait_s"] / seconds for s in dst)
        for i in range(torch.cuda.device_count()):
            kv[f"peak_gib_gpu{i}"] = torch.cuda.max_memory_allocated(i) / 2**30
        if a.steps >= 2 and all(len(e) >= 2 for e in ends):
            t_first = max(e[0] for e in ends)
            kv["ctx_tok_s_steady"] = D * (a.steps - 1) * a.seqs * a.S / max(t_end - t_first, 1e-9)
        st_t, st_d = _STAGE.get("target"), _STAGE.get("drafter")
        if st_t and st_d:
            if name == "split":
                kv["stage_bound_tok_s"] = min(T * st_t, D * st_d)
            else:
                kv["stage_bound_tok_s"] = ngpu / (1.0 / st_t + 1.0 / st_d)
            kv["of_bound"] = ctx / kv["stage_bound_tok_s"]
        kv["build_s"] = build_s
        kv["targets"] = T
        kv["drafters"] = D
        kv["gpus"] = ngpu
        kv["seqs_per_step"] = a.seqs
        kv["queue"] = a.queue_depth
        kv["consumed"] = consumed
        kv["produced"] = sum(s["produced"] for s in tst)
        kv["loss"] = statistics.mean(s["loss"] for s in dst)
        if D > 1:
            kv["allreduce_ms"] = statistics.mean(s["allreduce_s"] for s in dst) / a.steps * 1e3
            try:
                kv["replica_maxdiff"] = replica_maxdiff(drafters)
            except Exception as e:
                kv["replica_maxdiff"] = f"error:{err_text(e)}"
        if g0 is not None and g1 is not None:
            kv["recompiles"] = g1 - g0
        kv["mode"] = "ckpt" if a.ckpt else "nockpt"
        res(f"pipeline_{name}", **kv)
    except Exception as e:
        traceback.print_exc()
        if ctl is not None:
            ctl.stop.set()
            if ctl.barrier is not None:
                try:
                    ctl.barrier.abort()
                except Exception:
                    pass
        res(f"pipeline_{name}", error=err_text(e), steps=a.steps)
    finally:
        if ctl is not None:
            ctl.stop.set()
        for th in threads:
            if th.is_alive():
                th.join(timeout=30.0)
        for q in queues:
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        del targets, drafters, queues, threads
        free_gpus()


# ---------------------------------------------------------------------------------------------------------------
# stages alone
# ---------------------------------------------------------------------------------------------------------------


def stage_target(a):
    dev = torch.device("cuda", 0)
    torch.cuda.reset_peak_memory_stats(0)
    model = None
    try:
        t0 = time.perf_counter()
        model = build_target(a, dev)
        torch.cuda.synchronize(dev)
        build_s = time.perf_counter() - t0
        layer_ids = torch_ref.default_target_layer_ids(a.target_layers, a.nf)
        g = torch.Generator(device=dev)
        g.manual_seed(a.seed)
        ids = torch.randint(0, a.V, (1, a.S), device=dev, generator=g)
        with torch.cuda.device(dev), torch.no_grad():
            t0 = time.perf_counter()
            f = target_features(model, ids, layer_ids)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            del f
            ts = []
            for _ in range(a.stage_reps):
                t0 = time.perf_counter()
                f = target_features(model, ids, layer_ids)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
                del f
        sec = statistics.median(ts)
        flops = torch_ref.prefill_flops(a.target_layers, [a.S], a.H, a.I, a.nh, a.nkv, a.d)
        tok_s = a.S / sec
        _STAGE["target"] = tok_s
        res("stage_target", tok_s=tok_s, ms=sec * 1e3, reps=len(ts), first_ms=first_s * 1e3, build_s=build_s,
            tflops=flops / sec / 1e12, mfu_989=flops / sec / 1e12 / torch_ref.PEAK_TFLOPS,
            peak_gib=torch.cuda.max_memory_allocated(0) / 2**30, layers=a.target_layers, captured=len(layer_ids))
    except Exception as e:
        traceback.print_exc()
        res("stage_target", error=err_text(e))
    finally:
        del model
        free_gpus()


def stage_drafter(a):
    dev = torch.device("cuda", 0)
    torch.cuda.reset_peak_memory_stats(0)
    dr = None
    try:
        t0 = time.perf_counter()
        dr = Drafter(a, dev, a.ckpt)
        torch.cuda.synchronize(dev)
        build_s = time.perf_counter() - t0
        with torch.cuda.device(dev):
            feats, tokens = dr.random_batch(a.seed + 7)
            t0 = time.perf_counter()
            dr.step(feats, tokens)  # compiles flex forward and backward for this GPU (first time in the process)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            ts = []
            loss = None
            for _ in range(a.stage_steps):
                t0 = time.perf_counter()
                loss = dr.step(feats, tokens)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
        sec = statistics.median(ts)
        ctx = dr.nb * a.S / sec
        _STAGE["drafter"] = ctx
        tf = dr.flops / sec / 1e12
        res("stage_drafter", ctx_tok_s=ctx, ms=sec * 1e3, draft_tok_s=dr.nb * dr.NB / sec, seqs=dr.nb,
            reps=len(ts), first_s=first_s, build_s=build_s, tflops=tf, mfu_989=tf / torch_ref.PEAK_TFLOPS,
            peak_gib=torch.cuda.max_memory_allocated(0) / 2**30, loss=float(loss),
            mode="ckpt" if a.ckpt else "nockpt")
    except Exception as e:
        traceback.print_exc()
        res("stage_drafter", error=err_text(e))
    finally:
        del dr
        free_gpus()


# ---------------------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="all", choices=["all", "stages", "layouts"],
                    help="all = the stages alone, then the layouts")
    ap.add_argument("--layouts", default="split,coloc2,coloc1", help="comma list of split, coloc2, coloc1")
    ap.add_argument("--steps", type=int, default=6, help="timed drafter optimizer steps per layout (per drafter)")
    ap.add_argument("--seqs", type=int, default=4, help="sequences per drafter optimizer step")
    ap.add_argument("--queue-depth", type=int, default=8, help="sequences each drafter's queue holds at most")
    ap.add_argument("--stage-reps", type=int, default=5, help="timed target forwards in stage_target")
    ap.add_argument("--stage-steps", type=int, default=3, help="timed drafter steps in stage_drafter")
    ap.add_argument("--ckpt", action="store_true", help="per-layer activation checkpointing in the drafter "
                    "(torch_ref.py mode ckpt); default: none (mode nockpt)")
    ap.add_argument("--layout-timeout", type=float, default=240.0, help="seconds for a layout's timed threads")
    ap.add_argument("--barrier-timeout", type=float, default=120.0, help="seconds a replica waits for the others")
    ap.add_argument("--S", type=int, default=3072)
    ap.add_argument("--N", type=int, default=512)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--I", type=int, default=12288)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--nh", type=int, default=32)
    ap.add_argument("--nkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--nf", type=int, default=5, help="captured target layers")
    ap.add_argument("--layers", type=int, default=5, help="draft layers")
    ap.add_argument("--target-layers", type=int, default=36)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target-family", default="qwen3", choices=["qwen3", "qwen3_moe"],
                    help="qwen3_moe: a Qwen3MoeModel target (set --H 2048 --I 6144 --nkv 4 --target-layers 48 for "
                         "Qwen3-30B-A3B; --I is then also the drafter's MLP width)")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--moe-I", type=int, default=768)
    ap.add_argument("--experts-impl", default="grouped_mm", help="transformers' experts implementation")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"torch_pipeline.py: no CUDA device visible to torch {torch.__version__}; nothing measured", flush=True)
        return 0
    if min(a.steps, a.seqs, a.queue_depth, a.stage_reps, a.stage_steps) < 1:
        print("torch_pipeline.py: --steps, --seqs, --queue-depth, --stage-reps and --stage-steps must be >= 1",
              flush=True)
        return 2
    layouts = [x.strip() for x in a.layouts.split(",") if x.strip()]
    for x in layouts:
        if x not in LAYOUTS:
            print(f"torch_pipeline.py: unknown layout {x!r} (known: {', '.join(LAYOUTS)})", flush=True)
            return 2
    t_all = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    raise_recompile_limit()
    try:
        import transformers
        tf_ver = transformers.__version__
        try:
            transformers.logging.set_verbosity_error()
        except Exception:
            pass
    except Exception as e:
        tf_ver = f"unavailable ({err_text(e)})"
    names = ", ".join(f"{i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count()))
    note(f"torch {torch.__version__}, transformers {tf_ver}; GPUs {names}; S {a.S}, {a.seqs} sequences per drafter "
         f"step, queue depth {a.queue_depth}, {a.steps} timed steps; drafter mode {'ckpt' if a.ckpt else 'nockpt'}; "
         f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}")
    # each function frees what it holds; free_gpus() again once its locals are gone
    if a.part in ("all", "stages"):
        stage_target(a)
        free_gpus()
        stage_drafter(a)
        free_gpus()
    if a.part in ("all", "layouts"):
        for x in layouts:
            note(f"layout {x}: targets on {LAYOUTS[x][0]}, drafters on {LAYOUTS[x][1]}")
            run_layout(a, x)
            free_gpus()
    note(f"total {time.perf_counter() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
