// cuda/gelu_tanh.cu — the GeGLU gate of Gemma's MLPs: out = gelu_tanh(g) * u, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi)
// (g + 0.044715 g^3))) (PyTorch's gelu_pytorch_tanh). Elementwise, fp32 math, stored in the tensors' dtype (BF16 or
// F32); out may alias gate or up (each element is read before written). BF16 tensors of a multiple of 8 elements,
// 16-byte aligned, move 8 values per load. Forward only: the target is frozen. CPU reference: cpu/gelu_tanh.cpp.
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

template <class T>
__global__ void k_gelu_tanh_mul(const T* g, const T* u, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(gelu_tanh(to_f(g[i])) * to_f(u[i]));
}

__global__ void k_gelu_tanh_mul_bf16x8(const bf16* g, const bf16* u, bf16* out, int64_t chunks) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float gf[8], uf[8];
    bf16x8_to_f(reinterpret_cast<const uint4*>(g)[c], gf);
    bf16x8_to_f(reinterpret_cast<const uint4*>(u)[c], uf);
    DFLASH_UNROLL
    for (int k = 0; k < 8; ++k) gf[k] = gelu_tanh(gf[k]) * uf[k];
    reinterpret_cast<uint4*>(out)[c] = f_to_bf16x8(gf);
  }
}

}  // namespace

void gelu_tanh_mul(Env& e, const Tensor& gate, const Tensor& up, const Tensor& out) {
  check_on_dev("gelu_tanh_mul", gate, "gate");
  check_dev("gelu_tanh_mul", up, "up", gate.dtype);
  check_dev("gelu_tanh_mul", out, "out", gate.dtype);
  const int64_t n = gate.numel();
  if (n == 0) return;
  const unsigned gr = grid_for(n, 256, e.num_sms);
  if (gate.dtype == DType::BF16 && bf16x8_ok(n, gate.data, up.data, out.data)) {
    DFLASH_LAUNCH(grid_for(n / 8, 256, e.num_sms), 256, 0, e.stream, k_gelu_tanh_mul_bf16x8)(
        static_cast<const bf16*>(gate.data), static_cast<const bf16*>(up.data), static_cast<bf16*>(out.data), n / 8);
  } else if (gate.dtype == DType::BF16) {
    DFLASH_LAUNCH(gr, 256, 0, e.stream, k_gelu_tanh_mul<bf16>)(static_cast<const bf16*>(gate.data),
                                                               static_cast<const bf16*>(up.data),
                                                               static_cast<bf16*>(out.data), n);
  } else if (gate.dtype == DType::F32) {
    DFLASH_LAUNCH(gr, 256, 0, e.stream, k_gelu_tanh_mul<float>)(gate.ptr<float>(), up.ptr<float>(), out.ptr<float>(),
                                                                n);
  } else {
    DFLASH_FAIL("gelu_tanh_mul (cuda): dtype ", dtype_name(gate.dtype), " (BF16 or F32)");
  }
  check_launch("gelu_tanh_mul");
}

}  // namespace dflash::cuda
