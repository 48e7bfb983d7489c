// cpu/dynamic_conv.cpp — DFlash2's grouped dynamic convolution, forward and backward (backend/context.h
// DynConvArgs): per token the kernel base[s] + delta's group coefficients, taps reaching back only inside the block.
// Sums in the element type T (fp32 on "cpu", fp64 on "cpu64").
//   forward:  y[t, c] = sum_{k <= t mod B} (base[s, k, c] + delta[t, s T G + k G + c / g]) u[t - k, c]  (+ res)
//   backward: du[t - k, c] += w_t[k, c] dy[t, c];  d_delta[t, s T G + k G + q] = sum_{c in group q} dy[t, c] u[t - k, c];
//             d_base[s, k, c] += sum_t dy[t, c] u[t - k, c]
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void dynamic_conv(ThreadPool& tp, const DynConvArgs& a, const Tensor& y, const Tensor* res, const DynConvDims& d) {
  dispatch_float("dynamic_conv", a.u.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = d.C, Tn = d.T, G = d.G, g = a.group, B = a.block_size, D = 2 * Tn * G;
    const T* u = a.u.ptr<T>();
    const T* dl = a.delta.ptr<T>() + a.side * Tn * G;
    const T* bs = a.base.ptr<T>() + a.side * Tn * C;
    const T* rs = res ? res->ptr<T>() : nullptr;
    T* yp = y.ptr<T>();
    tp.parallel_for(d.R, 16, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t taps = std::min<int64_t>(Tn, t % B + 1);
        for (int64_t c = 0; c < C; ++c) {
          T acc = rs ? rs[t * C + c] : T(0);
          for (int64_t k = 0; k < taps; ++k) acc += (bs[k * C + c] + dl[t * D + k * G + c / g]) * u[(t - k) * C + c];
          yp[t * C + c] = acc;
        }
      }
    });
  });
}

void dynamic_conv_backward(ThreadPool& tp, const DynConvArgs& a, const Tensor& dy, const Tensor& du,
                           const Tensor& d_delta, const Tensor& d_base, const DynConvDims& d) {
  dispatch_float("dynamic_conv_backward", a.u.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t R = d.R, C = d.C, Tn = d.T, G = d.G, g = a.group, B = a.block_size, D = 2 * Tn * G;
    const T* u = a.u.ptr<T>();
    const T* dyp = dy.ptr<T>();
    const T* dl = a.delta.ptr<T>() + a.side * Tn * G;
    const T* bs = a.base.ptr<T>() + a.side * Tn * C;
    T* dup = du.ptr<T>();
    T* ddl = d_delta.ptr<T>() + a.side * Tn * G;
    // du[t', c] = sum_k w_{t'+k}[k, c] dy[t' + k, c] over the taps k that reach t' from inside its block
    tp.parallel_for(R, 16, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t taps = std::min<int64_t>(Tn, B - t % B);  // t + k stays in t's block
        for (int64_t c = 0; c < C; ++c) {
          T acc = 0;
          for (int64_t k = 0; k < taps; ++k)
            acc += (bs[k * C + c] + dl[(t + k) * D + k * G + c / g]) * dyp[(t + k) * C + c];
          dup[t * C + c] = acc;
        }
        const int64_t back = std::min<int64_t>(Tn, t % B + 1);
        for (int64_t k = 0; k < Tn; ++k)
          for (int64_t q = 0; q < G; ++q) {
            T acc = 0;
            if (k < back)
              for (int64_t c = q * g; c < (q + 1) * g; ++c) acc += dyp[t * C + c] * u[(t - k) * C + c];
            ddl[t * D + k * G + q] = acc;
          }
      }
    });
    // d_base[s, k, c] += sum_t dy[t, c] u[t - k, c]
    T* db = d_base.ptr<T>() + a.side * Tn * C;
    tp.parallel_for(C, 64, [&](int64_t b, int64_t e) {
      for (int64_t k = 0; k < Tn; ++k)
        for (int64_t c = b; c < e; ++c) {
          T acc = 0;
          for (int64_t t = 0; t < R; ++t)
            if (t % B >= k) acc += dyp[t * C + c] * u[(t - k) * C + c];
          db[k * C + c] += acc;
        }
    });
  });
}

}  // namespace dflash::cpu
