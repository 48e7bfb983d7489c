// cuda/attention_causal.cu — the target's causal GQA attention (prefill and KV-cache decode), forward only:
//   out[t, h] = softmax_{k <= q_offset + t}(q[t, h] . k[k, g] * scale) v[k, g],  g = h / (nh / nkv)
// q [T, nh, d], k/v [Tk, nkv, d] (a prefix: the cache), BF16. CausalAttnOpts: a sliding window (the row's lo1) and
// sinks (attn_fwd_finish: one more term in each row's denominator). Runs the shared flash-style forward kernel
// (attention_fwd.cu) with one key segment whose length for query t is q_offset + t + 1: no T x Tk buffer.
// attention_causal_batch: the sequences of a batch in one launch of the wgmma forward per kAttnMaxSegs of them (one
// launch per sequence on the other kernels).
#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {
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
  launch_attention_forward(e, causal_params(e, "attention_causal", q, k, v, out, q_offset, scale, opts));
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
