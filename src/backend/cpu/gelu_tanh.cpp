// cpu/gelu_tanh.cpp — the GeGLU gate of Gemma's MLPs: out = gelu_tanh(g) * u, with PyTorch's tanh approximation of
// GELU (ACT2FN["gelu_pytorch_tanh"]): gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))). Forward only
// (the target is frozen). Math in the tensors' dtype (F32, or F64 on cpu64).
#include <cmath>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void gelu_tanh_mul(ThreadPool& tp, const Tensor& gate, const Tensor& up, const Tensor& out) {
  dispatch_float("gelu_tanh_mul", gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    check_float("gelu_tanh_mul", gate, "gate", dt);
    check_float("gelu_tanh_mul", up, "up", dt);
    check_float("gelu_tanh_mul", out, "out", dt);
    const T* g = gate.ptr<T>();
    const T* u = up.ptr<T>();
    T* o = out.ptr<T>();
    const T k0 = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
    const T k1 = static_cast<T>(0.044715);
    tp.parallel_for(gate.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T x = g[i];
        o[i] = T(0.5) * x * (T(1) + std::tanh(k0 * (x + k1 * x * x * x))) * u[i];
      }
    });
  });
}

}  // namespace dflash::cpu
