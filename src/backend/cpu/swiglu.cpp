// cpu/swiglu.cpp — the SwiGLU MLP's gate: out = silu(g) * u, silu(g) = g * sigmoid(g) (Shazeer 2020).
// Backward: dg = dout * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))), du = dout * silu(g).
#include <cmath>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void silu_mul(ThreadPool& tp, const Tensor& gate, const Tensor& up, const Tensor& out) {
  dispatch_float("silu_mul", gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("silu_mul", gate, "gate", dt);
    check_float("silu_mul", up, "up", dt);
    check_float("silu_mul", out, "out", dt);
    const T* g = gate.ptr<T>();
    const T* u = up.ptr<T>();
    T* o = out.ptr<T>();
    tp.parallel_for(gate.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T sg = T(1) / (T(1) + std::exp(-g[i]));
        o[i] = g[i] * sg * u[i];
      }
    });
  });
}

void silu_mul_backward(ThreadPool& tp, const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                       const Tensor& dup) {
  dispatch_float("silu_mul_backward", dout.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    for (const Tensor* t : {&dout, &gate, &up, &dgate, &dup}) check_float("silu_mul_backward", *t, "tensor", dt);
    const T* d = dout.ptr<T>();
    const T* g = gate.ptr<T>();
    const T* u = up.ptr<T>();
    T* dg = dgate.ptr<T>();
    T* du = dup.ptr<T>();
    tp.parallel_for(dout.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T gi = g[i], ui = u[i], di = d[i];  // read before write: outputs may alias inputs
        const T sg = T(1) / (T(1) + std::exp(-gi));
        dg[i] = di * ui * sg * (T(1) + gi * (T(1) - sg));
        du[i] = di * gi * sg;
      }
    });
  });
}

}  // namespace dflash::cpu
