// cuda/attention_causal.cu — the target's causal GQA attention (prefill and KV-cache decode), forward only:
//   out[t, h] = softmax_{k <= q_offset + t}(q[t, h] . k[k, g] * scale) v[k, g],  g = h / (nh / nkv)
// q [T, nh, d], k/v [Tk, nkv, d] (a prefix: the cache), BF16. CausalAttnOpts: a sliding window (the row's lo1) and
// sinks (attn_fwd_finish: one more term in each row's denominator). Runs the shared flash-style forward kernel
// (attention_fwd.cu) with one key segment whose length for query t is q_offset + t + 1: no T x Tk buffer.
// attention_causal_batch: the sequences of a batch in one launch of the wgmma forward per kAttnMaxSegs of them (one
// launch per sequence on the other kernels). Heads wider than the tiled kernels take (kMaxHeadDim < d <= 1024, d % 32
// == 0: Gemma 4's full-attention layers, d 512) run on k_attn_causal_wide: one warp per (query, head), the q row and
// the output row in registers, an online softmax over the row's keys; CUDA cores, no tiles (a correct fallback:
// decode and verification rows are cheap, a long prefill is not; a tiled kernel for d 512 is still to be written).
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr int kWideMaxPer = 32;  // elements per lane of k_attn_causal_wide: d <= 32 x 32

// One warp per (query row t, head h), 8 warps a block: lane i holds elements i, i + 32, ... of the row (coalesced
// loads of q, k and v rows). Keys lo .. hi of kv head h / (nh / nkv), hi = q_offset + t, lo = hi - window + 1 (0
// without a window); scores q.k * scale in fp32; exp(s - m) weights with a running max m; the sink (when given) joins
// the denominator; out = acc / l rounded once to bf16.
__global__ void k_attn_causal_wide(AttnFwdParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(p.Tq) * p.nh) return;
  const int t = static_cast<int>(w / p.nh), h = static_cast<int>(w % p.nh), g = h / (p.nh / p.nkv);
  const int per = p.d >> 5;
  const bf16* q = static_cast<const bf16*>(p.q) + (static_cast<int64_t>(t) * p.nh + h) * p.d;
  float qv[kWideMaxPer], acc[kWideMaxPer];
  DFLASH_UNROLL
  for (int i = 0; i < kWideMaxPer; ++i) {
    qv[i] = i < per ? to_f(q[lane + 32 * i]) * p.scale : 0.0f;
    acc[i] = 0.0f;
  }
  const int hi = p.q_offset + t, lo = p.window > 0 ? max(0, hi - p.window + 1) : 0;
  float m = -INFINITY, l = 0.0f;
  for (int j = lo; j <= hi; ++j) {
    const int64_t row = (static_cast<int64_t>(j) * p.nkv + g) * p.d;
    const bf16* k = static_cast<const bf16*>(p.k1) + row;
    const bf16* v = static_cast<const bf16*>(p.v1) + row;
    float s = 0.0f;
    DFLASH_UNROLL
    for (int i = 0; i < kWideMaxPer; ++i)
      if (i < per) s += qv[i] * to_f(k[lane + 32 * i]);
    s = warp_sum(s);
    const float mn = fmaxf(m, s), c = expf(m - mn), e = expf(s - mn);
    l = l * c + e;
    DFLASH_UNROLL
    for (int i = 0; i < kWideMaxPer; ++i)
      if (i < per) acc[i] = acc[i] * c + e * to_f(v[lane + 32 * i]);
    m = mn;
  }
  if (p.sinks) {  // one more term in the denominator, no output
    const float sk = p.sinks[h], mn = fmaxf(m, sk), c = expf(m - mn);
    l = l * c + expf(sk - mn);
    DFLASH_UNROLL
    for (int i = 0; i < kWideMaxPer; ++i) acc[i] *= c;
  }
  const float inv = 1.0f / l;
  bf16* o = static_cast<bf16*>(p.out) + (static_cast<int64_t>(t) * p.nh + h) * p.d;
  DFLASH_UNROLL
  for (int i = 0; i < kWideMaxPer; ++i)
    if (i < per) o[lane + 32 * i] = from_f<bf16>(acc[i] * inv);
}

// The parameters (and the CUDA checks: dtypes, the device, 32-bit sizes) shared by attention_causal and
// attention_causal_batch; Context's public ops checked the shapes and the options.
AttnFwdParams causal_params(Env& e, const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& out, int64_t q_offset, float scale, const CausalAttnOpts& opts) {
  check_dev(op, q, "q", DType::BF16);
  check_dev(op, k, "k", DType::BF16);
  check_dev(op, v, "v", DType::BF16);
  check_dev(op, out, "out", DType::BF16);
  const int64_t Tq = q.dim(0), nh = q.dim(1), d = q.dim(2), Tk = k.dim(0), nkv = k.dim(1);
  DFLASH_CHECK(Tk < (int64_t{1} << 31) && Tq < (int64_t{1} << 31), op, ": sequence too long");
  AttnFwdParams p{};
  p.q = q.data;
  p.k1 = k.data;
  p.v1 = v.data;
  p.out = out.data;
  p.Tq = static_cast<int>(Tq);
  p.nh = static_cast<int>(nh);
  p.nkv = static_cast<int>(nkv);
  p.d = static_cast<int>(d);
  p.T1 = static_cast<int>(Tk);
  p.scale = scale;
  p.mode = kAttnCausal;
  p.q_offset = static_cast<int>(q_offset);
  p.B = 1;
  p.err = e.err_flag;
  if (opts.sinks.defined()) check_dev(op, opts.sinks, "sinks", DType::F32);
  DFLASH_CHECK(opts.window < (int64_t{1} << 31), op, ": window ", opts.window);
  p.window = static_cast<int>(opts.window);
  p.sinks = opts.sinks.defined() ? opts.sinks.ptr<float>() : nullptr;
  return p;
}
}  // namespace

void attention_causal(Env& e, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t q_offset,
                      float scale, const CausalAttnOpts& opts) {
  const AttnFwdParams p = causal_params(e, "attention_causal", q, k, v, out, q_offset, scale, opts);
  if (p.d <= kMaxHeadDim) {
    launch_attention_forward(e, p);
    return;
  }
  DFLASH_CHECK(p.d % 32 == 0 && p.d <= 32 * kWideMaxPer, "attention_causal (cuda): head_dim ", p.d,
               " is not supported (up to ", kMaxHeadDim, " on the tiled kernels; above, multiples of 32 up to ",
               32 * kWideMaxPer, ")");
  if (p.Tq == 0 || p.nh == 0) return;
  const int64_t warps = static_cast<int64_t>(p.Tq) * p.nh, blocks = (warps + 7) / 8;
  DFLASH_CHECK(blocks < (int64_t{1} << 31), "attention_causal (cuda): ", warps, " rows x heads");
  DFLASH_LAUNCH(static_cast<unsigned>(blocks), 256, 0, e.stream, k_attn_causal_wide)(p);
  check_launch("attention_causal_wide");
}

void attention_causal_batch(Env& e, const Tensor& q, const Tensor& out, std::span<const CausalSeq> seqs,
                            float scale, const CausalAttnOpts& opts) {
  const char* op = "attention_causal_batch";
  std::vector<const CausalSeq*> live;
  for (const CausalSeq& s : seqs)
    if (s.end > s.begin) live.push_back(&s);
  if (live.size() == 1) {  // one sequence: the plain launch
    const CausalSeq& s = *live[0];
    attention_causal(e, q.slice(s.begin, s.end), s.k, s.v, out.slice(s.begin, s.end), s.q_offset, scale, opts);
    return;
  }
  for (size_t i0 = 0; i0 < live.size(); i0 += kAttnMaxSegs) {
    const size_t i1 = std::min(live.size(), i0 + kAttnMaxSegs);
    AttnSegs segs;
    AttnFwdParams p{};
    int longest = 0;
    bool aligned = true;  // (the wgmma launch checks the first sequence's pointers; these are the others')
    for (size_t i = i0; i < i1; ++i) {
      const CausalSeq& s = *live[i];
      // the checks (and, for the first, the parameters) of the one-sequence op
      const AttnFwdParams ps =
          causal_params(e, op, q.slice(s.begin, s.end), s.k, s.v, out.slice(s.begin, s.end), s.q_offset, scale, opts);
      if (i == i0) p = ps;
      DFLASH_CHECK(ps.nh == p.nh && ps.nkv == p.nkv && ps.d == p.d, op, ": sequence ", i, " has other heads");
      const int z = segs.n++;
      segs.begin[z] = static_cast<int>(s.begin);
      segs.len[z] = ps.Tq;
      segs.q_offset[z] = ps.q_offset;
      segs.tk[z] = ps.T1;
      segs.k[z] = ps.k1;
      segs.v[z] = ps.v1;
      longest = std::max(longest, ps.Tq);
      aligned = aligned && aligned16(ps.k1) && aligned16(ps.v1);
    }
    p.q = q.data;  // rows are offset inside the kernel
    p.out = out.data;
    p.Tq = longest;
    if (aligned && launch_attention_forward_wgmma(e, p, segs)) continue;
    for (size_t i = i0; i < i1; ++i) {  // the other kernels take one sequence per launch
      const CausalSeq& s = *live[i];
      attention_causal(e, q.slice(s.begin, s.end), s.k, s.v, out.slice(s.begin, s.end), s.q_offset, scale, opts);
    }
  }
}

}  // namespace dflash::cuda
