// cpu/rmsnorm_gated.cpp — the hybrid models' row gates (backend/context.h): rmsnorm_gated (zero-centred RMSNorm,
// transformers' Qwen3NextRMSNorm: x rstd (1 + w); the gated norm Qwen3NextRMSNormGated: x rstd w silu(z)) and
// sigmoid_gate (y *= sigmoid(gate): gated attention's output gate, the shared expert's gate). Forward only.
#include <cmath>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void rmsnorm_gated(ThreadPool& tp, const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                   const Tensor& y, int64_t R, int64_t D) {
  dispatch_float("rmsnorm_gated", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.ptr<T>();
    const T* wp = w.ptr<T>();
    const T* zp = z ? z->ptr<T>() : nullptr;
    T* yp = y.ptr<T>();
    const T off = zero_centred ? T(1) : T(0);
    tp.parallel_for(R, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = xp + r * D;
        double ss = 0;
        for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        const T inv = T(1) / std::sqrt(static_cast<T>(ss / D) + static_cast<T>(eps));
        T* yr = yp + r * D;
        for (int64_t i = 0; i < D; ++i) {
          T v = xr[i] * inv * (off + wp[i]);
          if (zp) {
            const T g = zp[r * D + i];
            v *= g / (T(1) + std::exp(-g));
          }
          yr[i] = v;
        }
      }
    });
  });
}

void sigmoid_gate(ThreadPool& tp, const Tensor& y, const Tensor& gate, int64_t R, int64_t Dg) {
  dispatch_float("sigmoid_gate", y.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t D = y.shape.back();
    T* yp = y.ptr<T>();
    const T* gp = gate.ptr<T>();
    tp.parallel_for(R, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t i = 0; i < D; ++i) yp[r * D + i] *= T(1) / (T(1) + std::exp(-gp[r * Dg + (Dg == 1 ? 0 : i)]));
    });
  });
}

}  // namespace dflash::cpu
