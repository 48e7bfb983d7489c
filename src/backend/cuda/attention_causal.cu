// cuda/attention_causal.cu — the target's causal GQA attention (prefill and KV-cache decode), forward only:
//   out[t, h] = softmax_{k <= q_offset + t}(q[t, h] . k[k, g] * scale) v[k, g],  g = h / (nh / nkv)
// q [T, nh, d], k/v [Tk, nkv, d] (a prefix: the cache), BF16. Runs the shared flash-style forward kernel
// (attention_fwd.cu) with one key segment whose length for query t is q_offset + t + 1: no T x Tk buffer.
#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

void attention_causal(Env& e, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t q_offset,
                      float scale) {
  const char* op = "attention_causal";
  check_dev(op, q, "q", DType::BF16);
  check_dev(op, k, "k", DType::BF16);
  check_dev(op, v, "v", DType::BF16);
  check_dev(op, out, "out", DType::BF16);
  DFLASH_CHECK(q.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3, op, ": q/k/v must be [T, heads, d]");
  const int64_t Tq = q.dim(0), nh = q.dim(1), d = q.dim(2), Tk = k.dim(0), nkv = k.dim(1);
  DFLASH_CHECK(k.dim(2) == d && v.numel() == k.numel() && nkv > 0 && nh % nkv == 0 && out.numel() == q.numel(), op,
               ": q ", shape_str(q.shape), " k ", shape_str(k.shape), " v ", shape_str(v.shape), " out ",
               shape_str(out.shape));
  DFLASH_CHECK(q_offset >= 0 && q_offset + Tq <= Tk, op, ": queries at ", q_offset, "..", q_offset + Tq - 1,
               " need keys up to there, have ", Tk);
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
  launch_attention_forward(e, p);
}

}  // namespace dflash::cuda
