// cuda/hybrid_rows.cu — the row and elementwise ops of the hybrid linear-attention models (backend/context.h):
// rmsnorm_gated (zero-centred RMSNorm x rstd (1 + w); the gated norm x rstd w silu(z)), sigmoid_gate (y *= sigmoid(g),
// per element or per row) and gdn_gate (beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)). Math in fp32 as the
// CPU ops (cpu/rmsnorm_gated.cpp, cpu/gated_delta_rule.cpp), stored in the output's dtype. All bandwidth-bound: one
// warp per row for the norm (the row read twice: the sum of squares, then the output, the second from L1/L2; bf16
// rows of D % 8 == 0, D >= 128 by 16-byte loads, two rows per warp at D = 128), a grid-stride loop for the others.
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

// bf16 rows with D % 8 == 0 and 16-byte aligned rows: L lanes per row (L = 16 for D = 128: two rows per warp; 32
// otherwise), 8 values per 16-byte load, both passes (the second from L1/L2) as the scalar kernel's.
template <int L>
__global__ void k_rmsnorm_gated8(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ z,
                                 bf16* y, int64_t R, int D, float eps, float off) {
  const int lane = threadIdx.x & 31, sub = lane % L, rpw = 32 / L;  // lane within its row, rows per warp
  const int64_t rows_per_block = static_cast<int64_t>(blockDim.x >> 5) * rpw;
  const int64_t step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block + (threadIdx.x >> 5) * rpw; r0 < R; r0 += step) {
    const int64_t r = r0 + lane / L;
    const bool live = r < R;  // (every lane takes part in the shuffles)
    const bf16* xr = x + (live ? r : 0) * D;
    float ss = 0.f;
    for (int i = sub * 8; live && i < D; i += L * 8) {
      float f[8];
      const uint4 v = *reinterpret_cast<const uint4*>(xr + i);  // (a local first: one 16-byte load)
      bf16x8_to_f(v, f);
      DFLASH_UNROLL
      for (int k = 0; k < 8; ++k) ss += f[k] * f[k];
    }
    for (int o = L / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (!live) continue;
    const float inv = 1.f / sqrtf(ss / static_cast<float>(D) + eps);
    for (int i = sub * 8; i < D; i += L * 8) {
      float f[8], fw[8];
      const uint4 vx = *reinterpret_cast<const uint4*>(xr + i), vw = *reinterpret_cast<const uint4*>(w + i);
      bf16x8_to_f(vx, f);
      bf16x8_to_f(vw, fw);
      DFLASH_UNROLL
      for (int k = 0; k < 8; ++k) f[k] = f[k] * inv * (off + fw[k]);
      if (z) {
        float fz[8];
        const uint4 vz = *reinterpret_cast<const uint4*>(z + r * D + i);
        bf16x8_to_f(vz, fz);
        DFLASH_UNROLL
        for (int k = 0; k < 8; ++k) f[k] *= fz[k] / (1.f + expf(-fz[k]));
      }
      *reinterpret_cast<uint4*>(y + r * D + i) = f_to_bf16x8(f);  // y may alias x: read above by this lane
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

// bf16, D % 8 == 0, 16-byte aligned (bf16x8_ok): 8 elements of one row per thread and 16-byte loads and stores.
__global__ void k_sigmoid_gate8(bf16* y, const bf16* __restrict__ gate, int64_t n8, int D8, bool per_row) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 yv = reinterpret_cast<const uint4*>(y)[i];  // (a local copy: one 16-byte load)
    float v[8], g[8];
    bf16x8_to_f(yv, v);
    if (per_row) {
      const float s = 1.f / (1.f + expf(-to_f(gate[i / D8])));
      DFLASH_UNROLL
      for (int k = 0; k < 8; ++k) v[k] *= s;
    } else {
      const uint4 gv = reinterpret_cast<const uint4*>(gate)[i];
      bf16x8_to_f(gv, g);
      DFLASH_UNROLL
      for (int k = 0; k < 8; ++k) v[k] = v[k] / (1.f + expf(-g[k]));
    }
    reinterpret_cast<uint4*>(y)[i] = f_to_bf16x8(v);
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
  const bool vec = x.dtype == DType::BF16 && d.D % 8 == 0 && d.D >= 128 &&
                   bf16x8_ok(d.D, static_cast<const bf16*>(x.data), static_cast<const bf16*>(w.data),
                             static_cast<const bf16*>(y.data), z ? static_cast<const bf16*>(z->data) : nullptr);
  if (vec) {
    const bf16* zp = z ? static_cast<bf16*>(z->data) : nullptr;
    if (d.D == 128) {
      const unsigned g16 = grid_for((d.R + 1) / 2 * 32, threads, e.num_sms);
      DFLASH_LAUNCH(g16, threads, 0, e.stream, k_rmsnorm_gated8<16>)
      (static_cast<bf16*>(x.data), static_cast<bf16*>(w.data), zp, static_cast<bf16*>(y.data), d.R,
       static_cast<int>(d.D), eps, off);
    } else {
      DFLASH_LAUNCH(grid, threads, 0, e.stream, k_rmsnorm_gated8<32>)
      (static_cast<bf16*>(x.data), static_cast<bf16*>(w.data), zp, static_cast<bf16*>(y.data), d.R,
       static_cast<int>(d.D), eps, off);
    }
  } else if (x.dtype == DType::BF16) {
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
  if (y.dtype == DType::BF16 && D % 8 == 0 &&
      bf16x8_ok(n, static_cast<const bf16*>(y.data), Dg == 1 ? nullptr : static_cast<const bf16*>(gate.data))) {
    DFLASH_LAUNCH(grid_for(n / 8, 256, e.num_sms), 256, 0, e.stream, k_sigmoid_gate8)
    (static_cast<bf16*>(y.data), static_cast<bf16*>(gate.data), n / 8, D / 8, Dg == 1);
  } else if (y.dtype == DType::BF16) {
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
