// cpu/rope.cpp — rotate-half RoPE (Su et al. 2021; the HF Llama/Qwen layout): for i < d/2,
//   (x_i, x_{i+d/2}) -> (x_i cos t - x_{i+d/2} sin t, x_{i+d/2} cos t + x_i sin t),  t = pos * inv_freq[i].
// The angle is formed in fp32 as transformers does (pos and inv_freq in float32); cos/sin then in T.
// The backward is the same rotation by -t. Partial rotary (partial_rotary_factor < 1): inv_freq has r/2 < d/2
// entries; the first r dims of each head rotate as above with r in place of d, the other d - r pass through
// (transformers' apply_rotary_pos_emb with cos/sin of rotary_dim r).
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void rope(ThreadPool& tp, const Tensor& x, const Tensor& pos, const Tensor& inv_freq, bool inverse) {
  dispatch_float("rope", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    check_float("rope", x, "x", float_dtype<T>());
    check_float("rope", inv_freq, "inv_freq", DType::F32);
    const int64_t Tn = x.dim(0), Hh = x.dim(1), d = x.dim(2), half = inv_freq.numel();
    const int32_t* p = pos.ptr<int32_t>();
    const float* f = inv_freq.ptr<float>();
    T* xp = x.ptr<T>();
    const T sgn = inverse ? T(-1) : T(1);
    tp.parallel_for(Tn, 8, [&](int64_t b, int64_t e) {
      std::vector<T> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
      for (int64_t t = b; t < e; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const float ang = static_cast<float>(p[t]) * f[i];
          c[i] = static_cast<T>(std::cos(ang));
          s[i] = sgn * static_cast<T>(std::sin(ang));
        }
        for (int64_t h = 0; h < Hh; ++h) {
          T* v = xp + (t * Hh + h) * d;
          for (int64_t i = 0; i < half; ++i) {
            const T a = v[i], bb = v[i + half];
            v[i] = a * c[i] - bb * s[i];
            v[i + half] = bb * c[i] + a * s[i];
          }
        }
      }
    });
  });
}

}  // namespace dflash::cpu
