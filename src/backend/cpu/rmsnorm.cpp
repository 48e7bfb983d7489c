// cpu/rmsnorm.cpp — RMSNorm (Zhang & Sennrich 2019) as in HF Llama/Qwen: y = x * rsqrt(mean(x^2) + eps) * w.
// Backward, with r = rstd, u = x r, y = u w:
//   dw += sum_rows dy * u,   dx = r * (dy*w - u * mean(dy*w*u)).
#include <cmath>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void rmsnorm(ThreadPool& tp, const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) {
  dispatch_float("rmsnorm", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("rmsnorm", x, "x", dt);
    check_float("rmsnorm", w, "w", dt);
    check_float("rmsnorm", y, "y", dt);
    const int64_t D = x.dim(-1), R = x.rows();
    T* rs = nullptr;
    if (rstd.defined()) {
      check_float("rmsnorm", rstd, "rstd", dt);
      rs = rstd.ptr<T>();
    }
    const T* xp = x.ptr<T>();
    const T* wp = w.ptr<T>();
    T* yp = y.ptr<T>();
    tp.parallel_for(R, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = xp + r * D;
        double ss = 0;
        for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        const T inv = T(1) / std::sqrt(static_cast<T>(ss / D) + static_cast<T>(eps));
        if (rs) rs[r] = inv;
        T* yr = yp + r * D;
        for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv * wp[i];
      }
    });
  });
}

void rmsnorm_backward(ThreadPool& tp, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw, float beta) {
  dispatch_float("rmsnorm_backward", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("rmsnorm_backward", dy, "dy", dt);
    check_float("rmsnorm_backward", x, "x", dt);
    check_float("rmsnorm_backward", w, "w", dt);
    check_float("rmsnorm_backward", rstd, "rstd", dt);
    check_float("rmsnorm_backward", dx, "dx", dt);
    const int64_t D = x.dim(-1), R = x.rows();
    const T* g = dy.ptr<T>();
    const T* xp = x.ptr<T>();
    const T* wp = w.ptr<T>();
    const T* rs = rstd.ptr<T>();
    T* o = dx.ptr<T>();
    // dw first: dx may alias dy.
    if (dw.defined()) {
      check_float("rmsnorm_backward", dw, "dw", dt);
      T* dwp = dw.ptr<T>();
      tp.parallel_for(D, 64, [&](int64_t b, int64_t e) {  // each task owns a range of dw entries
        for (int64_t i = b; i < e; ++i) {
          double acc = 0;
          for (int64_t r = 0; r < R; ++r) acc += static_cast<double>(g[r * D + i]) * xp[r * D + i] * rs[r];
          dwp[i] += static_cast<T>(acc);
        }
      });
    }
    tp.parallel_for(R, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* gr = g + r * D;
        const T* xr = xp + r * D;
        T* orow = o + r * D;
        const T inv = rs[r];
        double dot = 0;
        for (int64_t i = 0; i < D; ++i) dot += static_cast<double>(gr[i]) * wp[i] * xr[i] * inv;
        const T mean = static_cast<T>(dot / D);
        for (int64_t i = 0; i < D; ++i) {
          const T v = inv * (gr[i] * wp[i] - xr[i] * inv * mean);
          orow[i] = beta == 0.f ? v : v + static_cast<T>(beta) * orow[i];
        }
      }
    });
  });
}

}  // namespace dflash::cpu
