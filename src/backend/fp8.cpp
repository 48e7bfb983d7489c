// backend/fp8.cpp — FP8 E4M3 linear weights (backend/context.h LinearWeight) on the host: the argument check every
// backend uses, the exact dequantisation (the CPU backend's reference) and the block quantizer of the CPU backend.
// defines: check_linear_weight, fp8_dequantize, cpu::fp8_quantize
#include <algorithm>
#include <cmath>

#include "backend/context.h"

namespace dflash {

void check_linear_weight(const char* op, const LinearWeight& w) {
  DFLASH_CHECK(w.w.defined() && w.w.ndim() == 2, op, ": weight ", w.w.defined() ? shape_str(w.w.shape) : "undefined",
               ", expected [N, K]");
  if (!w.fp8()) return;
  const int64_t N = w.w.shape[0], K = w.w.shape[1];
  DFLASH_CHECK(w.w.dtype == DType::F8E4M3, op, ": an FP8 weight is ", dtype_name(w.w.dtype), ", expected F8_E4M3");
  DFLASH_CHECK(w.block_n >= 1 && w.block_k >= 1, op, ": FP8 block ", w.block_n, "x", w.block_k,
               ": both sizes must be >= 1");
  const Shape want{(N + w.block_n - 1) / w.block_n, (K + w.block_k - 1) / w.block_k};
  DFLASH_CHECK(w.scale.dtype == DType::F32 && w.scale.shape == want, op, ": FP8 scale is ", dtype_name(w.scale.dtype),
               " ", shape_str(w.scale.shape), ", expected F32 ", shape_str(want), " for a weight ", shape_str(w.w.shape),
               " in blocks of ", w.block_n, "x", w.block_k);
  DFLASH_CHECK(w.w.device == w.scale.device, op, ": FP8 weight and scale on different devices");
}

Tensor fp8_dequantize(const LinearWeight& w) {
  check_linear_weight("fp8_dequantize", w);
  DFLASH_CHECK(w.fp8() && w.w.device == Device::CPU, "fp8_dequantize: needs an FP8 weight on the host");
  const int64_t N = w.w.shape[0], K = w.w.shape[1], kb = w.scale.shape[1];
  Tensor out = cpu_empty(DType::F32, {N, K});
  float lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = f8e4m3_to_f32(static_cast<uint8_t>(v));
  const uint8_t* q = w.w.ptr<uint8_t>();
  const float* s = w.scale.ptr<float>();
  float* o = out.ptr<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) o[n * K + k] = lut[q[n * K + k]] * s[(n / w.block_n) * kb + k / w.block_k];
  return out;
}

namespace cpu {

// w: host F32 or F64 [N, K]. The scale is computed in f32 as a GPU kernel does (amax of the f32 values / 448).
LinearWeight fp8_quantize(const Tensor& w, int64_t bn, int64_t bk) {
  DFLASH_CHECK(w.device == Device::CPU && w.ndim() == 2, "quantize_fp8: w ", shape_str(w.shape),
               " must be a host [N, K]");
  DFLASH_CHECK(bn >= 1 && bk >= 1, "quantize_fp8: block ", bn, "x", bk, ": both sizes must be >= 1");
  const std::vector<float> v = to_f32_vector(w);
  const int64_t N = w.shape[0], K = w.shape[1], nb = (N + bn - 1) / bn, kb = (K + bk - 1) / bk;
  LinearWeight r;
  r.w = cpu_empty(DType::F8E4M3, {N, K});
  r.scale = cpu_empty(DType::F32, {nb, kb});
  r.block_n = bn;
  r.block_k = bk;
  uint8_t* q = r.w.ptr<uint8_t>();
  float* s = r.scale.ptr<float>();
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = 0; j < kb; ++j) {
      const int64_t n0 = i * bn, n1 = std::min(N, n0 + bn), k0 = j * bk, k1 = std::min(K, k0 + bk);
      float amax = 0.f;
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(v[n * K + k]));
      const float sc = amax > 0.f ? amax / 448.f : 1.f;
      s[i * kb + j] = sc;
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = k0; k < k1; ++k) q[n * K + k] = f32_to_f8e4m3(v[n * K + k] / sc);
    }
  return r;
}

}  // namespace cpu
}  // namespace dflash
