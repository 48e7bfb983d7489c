// cpu/softcap.cpp — logit soft-capping, x = cap tanh(x / cap) in place (Gemma's final_logit_softcapping:
// transformers' Gemma4ForCausalLM divides by the cap, takes tanh, multiplies back). Math in the tensor's dtype.
#include <cmath>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void softcap(ThreadPool& tp, const Tensor& x, float cap) {
  dispatch_float("softcap", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    check_float("softcap", x, "x", float_dtype<T>());
    T* p = x.ptr<T>();
    const T c = static_cast<T>(cap);
    tp.parallel_for(x.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = c * std::tanh(p[i] / c);
    });
  });
}

}  // namespace dflash::cpu
