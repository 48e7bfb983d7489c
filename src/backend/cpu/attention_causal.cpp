// cpu/attention_causal.cpp — the target's causal GQA attention (prefill and KV-cache decode).
// out[t, h] = softmax_{k <= q_offset+t} (q[t,h] . k[k, g] * scale) v[k, g],  g = h / (nh / nkv).
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void attention_causal(ThreadPool& tp, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      int64_t q_offset, float scale) {
  dispatch_float("attention_causal", q.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("attention_causal", q, "q", dt);
    check_float("attention_causal", k, "k", dt);
    check_float("attention_causal", v, "v", dt);
    check_float("attention_causal", out, "out", dt);
    DFLASH_CHECK(q.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3, "attention_causal: q/k/v must be [T, heads, d]");
    const int64_t Tq = q.dim(0), nh = q.dim(1), d = q.dim(2), Tk = k.dim(0), nkv = k.dim(1);
    DFLASH_CHECK(k.dim(2) == d && v.numel() == k.numel() && nh % nkv == 0 && out.numel() == q.numel(),
                 "attention_causal: q ", shape_str(q.shape), " k ", shape_str(k.shape), " v ", shape_str(v.shape));
    DFLASH_CHECK(q_offset >= 0 && q_offset + Tq <= Tk, "attention_causal: queries at ", q_offset, "..",
                 q_offset + Tq - 1, " need keys up to there, have ", Tk);
    const int64_t rep = nh / nkv;
    const T* qp = q.ptr<T>();
    const T* kp = k.ptr<T>();
    const T* vp = v.ptr<T>();
    T* op = out.ptr<T>();
    const T sc = static_cast<T>(scale);
    tp.parallel_for(Tq * nh, 1, [&](int64_t b, int64_t e) {
      std::vector<T> s(static_cast<size_t>(Tk));
      std::vector<double> acc(static_cast<size_t>(d));
      for (int64_t th = b; th < e; ++th) {
        const int64_t t = th / nh, h = th % nh, g = h / rep;
        const T* qr = qp + (t * nh + h) * d;
        const int64_t nk = q_offset + t + 1;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < nk; ++j) {
          const T* kr = kp + (j * nkv + g) * d;
          T dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += qr[i] * kr[i];
          s[j] = dot * sc;
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < nk; ++j) {
          const double p = std::exp(static_cast<double>(s[j] - mx));
          l += p;
          const T* vr = vp + (j * nkv + g) * d;
          for (int64_t i = 0; i < d; ++i) acc[i] += p * vr[i];
        }
        T* orow = op + (t * nh + h) * d;
        for (int64_t i = 0; i < d; ++i) orow[i] = static_cast<T>(acc[i] / l);
      }
    });
  });
}

}  // namespace dflash::cpu
