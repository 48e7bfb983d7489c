// cpu/adamw.cpp — AdamW with decoupled weight decay (Loshchilov & Hutter 2019), as torch.optim.AdamW:
//   g = grad * grad_scale; p *= (1 - lr*wd); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#include <cmath>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void adamw(ThreadPool& tp, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
           const AdamWArgs& a, const Tensor& param_compute) {
  dispatch_float("adamw", param.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr DType dt = float_dtype<T>();
    for (const Tensor* t : {&param, &grad, &m, &v}) check_float("adamw", *t, "param/grad/m/v", dt);
    T* p = param.ptr<T>();
    const T* g = grad.ptr<T>();
    T* mp = m.ptr<T>();
    T* vp = v.ptr<T>();
    const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
    const T step_size = static_cast<T>(a.lr / bc1);
    const T bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    const T decay = T(1) - static_cast<T>(a.lr) * static_cast<T>(a.weight_decay);
    const T b1 = a.beta1, b2 = a.beta2, eps = a.eps, gs = a.grad_scale;
    T* pc = nullptr;
    if (param_compute.defined() && param_compute.data != param.data) {
      check_float("adamw", param_compute, "param_compute", dt);
      pc = param_compute.ptr<T>();
    }
    tp.parallel_for(param.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T gi = g[i] * gs;
        p[i] *= decay;
        mp[i] = b1 * mp[i] + (T(1) - b1) * gi;
        vp[i] = b2 * vp[i] + (T(1) - b2) * gi * gi;
        p[i] -= step_size * mp[i] / (std::sqrt(vp[i]) / bc2_sqrt + eps);
        if (pc) pc[i] = p[i];
      }
    });
  });
}

}  // namespace dflash::cpu
