// cuda/hybrid_rows.cu — the row and elementwise ops of the hybrid linear-attention models (backend/context.h):
// rmsnorm_gated (zero-centred RMSNorm x rstd (1 + w); the gated norm x rstd w silu(z)), sigmoid_gate (y *= sigmoid(g),
// per element or per row) and gdn_gate (beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)). Math in fp32 as the
// CPU ops (cpu/rmsnorm_gated.cpp, cpu/gated_delta_rule.cpp), stored in the output's dtype. All bandwidth-bound: one
// warp per row for the norm (the row read twice: the sum of squares, then the output, the second from L1/L2), a
// grid-stride loop for the others.
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

template <class T>
__global__ void k_rmsnorm_gated(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ z, T* y,
                                int64_t R, int D, float eps, float off) {
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  const int64_t step = static_cast<int64_t>(gridDim.x) * wpb;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * wpb + (threadIdx.x >> 5); r < R; r += step) {
    const T* xr = x + r * D;
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) {
      const float v = to_f(xr[i]);
      ss += v * v;
    }
    ss = warp_sum(ss);
    const float inv = 1.f / sqrtf(ss / static_cast<float>(D) + eps);
    for (int i = lane; i < D; i += 32) {
      float v = to_f(xr[i]) * inv * (off + to_f(w[i]));
      if (z) {
        const float g = to_f(z[r * D + i]);
        v *= g / (1.f + expf(-g));
      }
      y[r * D + i] = from_f<T>(v);  // y may alias x: element i was read above by this lane
    }
  }
}

template <class T>
__global__ void k_sigmoid_gate(T* y, const T* __restrict__ gate, int64_t n, int D, int Dg) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[Dg == 1 ? i / D : i]);
    y[i] = from_f<T>(to_f(y[i]) / (1.f + expf(-g)));
  }
}

template <class T>
__global__ void k_gdn_gate(const T* __restrict__ ba, const T* __restrict__ A_log, const T* __restrict__ dt_bias,
                           float* __restrict__ g, float* __restrict__ beta, int64_t T_, int nv) {
  const int64_t n = T_ * nv;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / nv;
    const int h = static_cast<int>(i % nv);
    const float b = to_f(ba[t * 2 * nv + h]), a = to_f(ba[t * 2 * nv + nv + h]) + to_f(dt_bias[h]);
    const float sp = a > 20.f ? a : log1pf(expf(a));  // torch softplus (beta 1, threshold 20)
    g[i] = -expf(to_f(A_log[h])) * sp;
    beta[i] = 1.f / (1.f + expf(-b));
  }
}

}  // namespace

void rmsnorm_gated(Env& e, const Tensor& x, const Tensor& w, const Tensor* z, float eps, bool zero_centred,
                   const Tensor& y, const RowsDims& d) {
  if (d.R == 0) return;
  const int threads = 256;  // 8 rows per block
  const unsigned grid = grid_for(d.R * 32, threads, e.num_sms);
  const float off = zero_centred ? 1.f : 0.f;
  if (x.dtype == DType::BF16) {
    DFLASH_LAUNCH(grid, threads, 0, e.stream, k_rmsnorm_gated<bf16>)
    (static_cast<bf16*>(x.data), static_cast<bf16*>(w.data), z ? static_cast<bf16*>(z->data) : nullptr,
     static_cast<bf16*>(y.data), d.R, static_cast<int>(d.D), eps, off);
  } else {
    DFLASH_LAUNCH(grid, threads, 0, e.stream, k_rmsnorm_gated<float>)
    (x.ptr<float>(), w.ptr<float>(), z ? z->ptr<float>() : nullptr, y.ptr<float>(), d.R, static_cast<int>(d.D), eps,
     off);
  }
  check_launch("rmsnorm_gated");
}

void sigmoid_gate(Env& e, const Tensor& y, const Tensor& gate, const RowsDims& d) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const int D = static_cast<int>(y.shape.back()), Dg = static_cast<int>(d.D);
  const unsigned grid = grid_for(n, 256, e.num_sms);
  if (y.dtype == DType::BF16) {
    DFLASH_LAUNCH(grid, 256, 0, e.stream, k_sigmoid_gate<bf16>)
    (static_cast<bf16*>(y.data), static_cast<bf16*>(gate.data), n, D, Dg);
  } else {
    DFLASH_LAUNCH(grid, 256, 0, e.stream, k_sigmoid_gate<float>)(y.ptr<float>(), gate.ptr<float>(), n, D, Dg);
  }
  check_launch("sigmoid_gate");
}

void gdn_gate(Env& e, const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g, const Tensor& beta,
              int64_t T) {
  const int nv = static_cast<int>(ba.shape[1] / 2);
  if (T * nv == 0) return;
  const unsigned grid = grid_for(T * nv, 256, e.num_sms);
  if (ba.dtype == DType::BF16) {
    DFLASH_LAUNCH(grid, 256, 0, e.stream, k_gdn_gate<bf16>)
    (static_cast<bf16*>(ba.data), static_cast<bf16*>(A_log.data), static_cast<bf16*>(dt_bias.data), g.ptr<float>(),
     beta.ptr<float>(), T, nv);
  } else {
    DFLASH_LAUNCH(grid, 256, 0, e.stream, k_gdn_gate<float>)
    (ba.ptr<float>(), A_log.ptr<float>(), dt_bias.ptr<float>(), g.ptr<float>(), beta.ptr<float>(), T, nv);
  }
  check_launch("gdn_gate");
}

}  // namespace dflash::cuda
