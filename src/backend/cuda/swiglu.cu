// cuda/swiglu.cu — the SwiGLU gate (Shazeer 2020): out = silu(g) * u, silu(g) = g * sigmoid(g).
// Backward: dg = dout * u * s * (1 + g (1 - s)), du = dout * silu(g), s = sigmoid(g). Elementwise, fp32 math,
// stored in the tensors' dtype (BF16 or F32). Outputs may alias inputs (each element is read before written). BF16
// tensors of a multiple of 8 elements, 16-byte aligned, move 8 values per load (the step's [tokens, I] tensors).
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

template <class T>
__global__ void k_silu_mul(const T* g, const T* u, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = to_f(g[i]), ui = to_f(u[i]);
    const float s = 1.0f / (1.0f + expf(-gi));
    out[i] = from_f<T>(gi * s * ui);
  }
}

template <class T>
__global__ void k_silu_mul_bwd(const T* dout, const T* g, const T* u, T* dg, T* du, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = to_f(g[i]), ui = to_f(u[i]), di = to_f(dout[i]);
    const float s = 1.0f / (1.0f + expf(-gi));
    dg[i] = from_f<T>(di * ui * s * (1.0f + gi * (1.0f - s)));
    du[i] = from_f<T>(di * gi * s);
  }
}

// The same for BF16 with n % 8 == 0 and 16-byte aligned tensors: 8 values per thread and load (chunk c = 8 elements).
__global__ void k_silu_mul_bf16x8(const bf16* g, const bf16* u, bf16* out, int64_t chunks) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float gf[8], uf[8];
    bf16x8_to_f(reinterpret_cast<const uint4*>(g)[c], gf);
    bf16x8_to_f(reinterpret_cast<const uint4*>(u)[c], uf);
    DFLASH_UNROLL
    for (int k = 0; k < 8; ++k) {
      const float s = 1.0f / (1.0f + expf(-gf[k]));
      gf[k] = gf[k] * s * uf[k];
    }
    reinterpret_cast<uint4*>(out)[c] = f_to_bf16x8(gf);
  }
}
__global__ void k_silu_mul_bwd_bf16x8(const bf16* dout, const bf16* g, const bf16* u, bf16* dg, bf16* du,
                                      int64_t chunks) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float gf[8], uf[8], df[8], dgf[8], duf[8];
    bf16x8_to_f(reinterpret_cast<const uint4*>(g)[c], gf);
    bf16x8_to_f(reinterpret_cast<const uint4*>(u)[c], uf);
    bf16x8_to_f(reinterpret_cast<const uint4*>(dout)[c], df);
    DFLASH_UNROLL
    for (int k = 0; k < 8; ++k) {
      const float s = 1.0f / (1.0f + expf(-gf[k]));
      dgf[k] = df[k] * uf[k] * s * (1.0f + gf[k] * (1.0f - s));
      duf[k] = df[k] * gf[k] * s;
    }
    reinterpret_cast<uint4*>(dg)[c] = f_to_bf16x8(dgf);
    reinterpret_cast<uint4*>(du)[c] = f_to_bf16x8(duf);
  }
}

}  // namespace

void silu_mul(Env& e, const Tensor& gate, const Tensor& up, const Tensor& out) {
  check_on_dev("silu_mul", gate, "gate");
  check_dev("silu_mul", up, "up", gate.dtype);
  check_dev("silu_mul", out, "out", gate.dtype);
  const int64_t n = gate.numel();
  if (n == 0) return;
  const unsigned gr = grid_for(n, 256, e.num_sms);
  if (gate.dtype == DType::BF16 && bf16x8_ok(n, gate.data, up.data, out.data)) {
    DFLASH_LAUNCH(grid_for(n / 8, 256, e.num_sms), 256, 0, e.stream, k_silu_mul_bf16x8)(
        static_cast<const bf16*>(gate.data), static_cast<const bf16*>(up.data), static_cast<bf16*>(out.data), n / 8);
  } else if (gate.dtype == DType::BF16) {
    DFLASH_LAUNCH(gr, 256, 0, e.stream, k_silu_mul<bf16>)(static_cast<const bf16*>(gate.data),
                                                          static_cast<const bf16*>(up.data),
                                                          static_cast<bf16*>(out.data), n);
  } else if (gate.dtype == DType::F32) {
    DFLASH_LAUNCH(gr, 256, 0, e.stream, k_silu_mul<float>)(gate.ptr<float>(), up.ptr<float>(), out.ptr<float>(), n);
  } else {
    DFLASH_FAIL("silu_mul (cuda): dtype ", dtype_name(gate.dtype), " (BF16 or F32)");
  }
  check_launch("silu_mul");
}

void silu_mul_backward(Env& e, const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                       const Tensor& dup) {
  const char* op = "silu_mul_backward";
  check_on_dev(op, dout, "dout");
  for (const Tensor* t : {&gate, &up, &dgate, &dup}) check_dev(op, *t, "gate/up/dgate/dup", dout.dtype);
  const int64_t n = dout.numel();
  if (n == 0) return;
  const unsigned gr = grid_for(n, 256, e.num_sms);
  if (dout.dtype == DType::BF16 && bf16x8_ok(n, dout.data, gate.data, up.data, dgate.data, dup.data)) {
    DFLASH_LAUNCH(grid_for(n / 8, 256, e.num_sms), 256, 0, e.stream, k_silu_mul_bwd_bf16x8)(
        static_cast<const bf16*>(dout.data), static_cast<const bf16*>(gate.data), static_cast<const bf16*>(up.data),
        static_cast<bf16*>(dgate.data), static_cast<bf16*>(dup.data), n / 8);
  } else if (dout.dtype == DType::BF16) {
    DFLASH_LAUNCH(gr, 256, 0, e.stream, k_silu_mul_bwd<bf16>)(
        static_cast<const bf16*>(dout.data), static_cast<const bf16*>(gate.data), static_cast<const bf16*>(up.data),
        static_cast<bf16*>(dgate.data), static_cast<bf16*>(dup.data), n);
  } else if (dout.dtype == DType::F32) {
    DFLASH_LAUNCH(gr, 256, 0, e.stream, k_silu_mul_bwd<float>)(dout.ptr<float>(), gate.ptr<float>(), up.ptr<float>(),
                                                               dgate.ptr<float>(), dup.ptr<float>(), n);
  } else {
    DFLASH_FAIL("silu_mul_backward (cuda): dtype ", dtype_name(dout.dtype), " (BF16 or F32)");
  }
  check_launch("silu_mul_backward");
}

}  // namespace dflash::cuda
