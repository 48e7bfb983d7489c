// cpu/conv1d_causal.cpp — the depthwise causal convolution with SiLU of the Gated DeltaNet (backend/context.h
// conv1d_causal; transformers' causal_conv1d_fn with the cache's conv state, causal_conv1d_update): y[t, c] =
// silu(sum_j w[c, j] xin[t + j, c]) over xin = [state ; x], accumulated in the element type, and the state moved on
// to the last K - 1 rows of xin; with seqs, each sequence's rows on their own from a zero window.
#include <cmath>
#include <span>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void conv1d_causal(ThreadPool& tp, const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& y,
                   const Conv1dDims& d) {
  dispatch_float("conv1d_causal", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = d.C, K = d.K, P = K - 1;
    const T* wp = w.ptr<T>();
    T* sp = state.defined() ? state.ptr<T>() : nullptr;
    const std::vector<int64_t> one = {0, d.T};
    const std::span<const int64_t> seqs = d.seqs.empty() ? std::span<const int64_t>(one) : d.seqs;
    // xin row i (0 <= i < P + T) of the sequence whose x rows start at xp: the state's row i (or zero) for i < P,
    // else x's row i - P
    auto xin = [&](const T* xp, int64_t i, int64_t c) -> T {
      if (i >= P) return xp[(i - P) * C + c];
      return sp ? sp[i * C + c] : T(0);
    };
    tp.parallel_for(C, 64, [&](int64_t b, int64_t e) {
      for (size_t s = 0; s + 1 < seqs.size(); ++s) {
        const T* xp = x.ptr<T>() + seqs[s] * C;
        T* yp = y.ptr<T>() + seqs[s] * C;
        for (int64_t c = b; c < e; ++c)
          for (int64_t t = 0; t < seqs[s + 1] - seqs[s]; ++t) {
            T acc = 0;
            for (int64_t j = 0; j < K; ++j) acc += wp[c * K + j] * xin(xp, t + j, c);
            yp[t * C + c] = acc / (T(1) + std::exp(-acc));
          }
      }
    });
    if (!sp || P == 0) return;
    std::vector<T> next(static_cast<size_t>(P * C));  // the last P rows of xin (they may come from the old state)
    for (int64_t i = 0; i < P; ++i)
      for (int64_t c = 0; c < C; ++c) next[i * C + c] = xin(x.ptr<T>(), d.T + i, c);
    std::copy(next.begin(), next.end(), sp);
  });
}

}  // namespace dflash::cpu
