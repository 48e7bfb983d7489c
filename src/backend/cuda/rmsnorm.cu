// cuda/rmsnorm.cu — RMSNorm (Zhang & Sennrich 2019) as in HF Llama/Qwen, over the last dim D of x [R, D]:
//   forward:  r = 1 / sqrt(mean(x^2) + eps),  y = x r w  (rstd [R] F32 saved when defined; y may alias x)
//   backward: u = x r,  dw += sum_rows dy * u,  dx = r (dy w - u mean(dy w u)) (+ beta dx)
// One warp per row (fp32 accumulation). dw uses a deterministic two-stage column reduction (fixed row
// partitions -> F32 partials -> one ordered sum per column), no float atomics. dw is computed before dx, so dx may
// alias dy.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr int kWarps = 8;  // rows per block in the row kernels

template <class T>
__global__ void k_rmsnorm(const T* x, const T* __restrict__ w, T* y, float* __restrict__ rstd, int64_t R, int D,
                          float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= R) return;  // whole warp leaves together; no block barrier below
  const T* xr = x + row * D;
  float ss = 0.f;
  for (int i = lane; i < D; i += 32) {
    const float v = to_f(xr[i]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (rstd != nullptr && lane == 0) rstd[row] = inv;
  T* yr = y + row * D;
  for (int i = lane; i < D; i += 32) yr[i] = from_f<T>(to_f(xr[i]) * inv * to_f(w[i]));
}

// The forward for BF16 rows with D % 8 == 0, 16-byte aligned: 8 values per lane and load (y may alias x: a lane
// reads each of its chunks before writing it).
__global__ void k_rmsnorm_bf16x8(const bf16* x, const bf16* __restrict__ w, bf16* y, float* __restrict__ rstd,
                                 int64_t R, int D, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= R) return;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * D);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  const int C = D / 8;
  float ss = 0.f;
  for (int c = lane; c < C; c += 32) {
    float xf[8];
    bf16x8_to_f(xr[c], xf);
    DFLASH_UNROLL
    for (int k = 0; k < 8; ++k) ss += xf[k] * xf[k];
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (rstd != nullptr && lane == 0) rstd[row] = inv;
  uint4* yr = reinterpret_cast<uint4*>(y + row * D);
  for (int c = lane; c < C; c += 32) {
    float xf[8], wf[8];
    bf16x8_to_f(xr[c], xf);
    bf16x8_to_f(wr[c], wf);
    DFLASH_UNROLL
    for (int k = 0; k < 8; ++k) xf[k] = xf[k] * inv * wf[k];
    yr[c] = f_to_bf16x8(xf);
  }
}

template <class T>
__global__ void k_rmsnorm_dx(const T* dy, const T* __restrict__ x, const T* __restrict__ w,
                             const float* __restrict__ rstd, T* dx, int64_t R, int D, float beta) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= R) return;
  const T* g = dy + row * D;
  const T* xr = x + row * D;
  const float inv = rstd[row];
  float dot = 0.f;
  for (int i = lane; i < D; i += 32) dot += to_f(g[i]) * to_f(w[i]) * to_f(xr[i]) * inv;
  dot = warp_sum(dot);
  const float mean = dot / static_cast<float>(D);
  T* o = dx + row * D;
  for (int i = lane; i < D; i += 32) {
    const float v = inv * (to_f(g[i]) * to_f(w[i]) - to_f(xr[i]) * inv * mean);
    o[i] = from_f<T>(beta == 0.f ? v : v + beta * to_f(o[i]));
  }
}

// The same for BF16 rows with D % 8 == 0 (16-byte aligned): each lane moves 8 values per load (one uint4), and
// nothing aliases (dx == dy is read before it is written, element by element within the lane).
__global__ void k_rmsnorm_dx_bf16x8(const bf16* dy, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                    const float* __restrict__ rstd, bf16* dx, int64_t R, int D, float beta) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= R) return;
  const uint4* g = reinterpret_cast<const uint4*>(dy + row * D);
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * D);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  const int C = D / 8;
  const float inv = rstd[row];
  float dot = 0.f;
  for (int c = lane; c < C; c += 32) {
    float gf[8], xf[8], wf[8];
    bf16x8_to_f(g[c], gf);
    bf16x8_to_f(xr[c], xf);
    bf16x8_to_f(wr[c], wf);
    DFLASH_UNROLL
    for (int k = 0; k < 8; ++k) dot += gf[k] * wf[k] * xf[k];
  }
  dot = warp_sum(dot) * inv;
  const float mean = dot / static_cast<float>(D);
  uint4* o = reinterpret_cast<uint4*>(dx + row * D);
  for (int c = lane; c < C; c += 32) {
    float gf[8], xf[8], wf[8], of[8];
    bf16x8_to_f(g[c], gf);
    bf16x8_to_f(xr[c], xf);
    bf16x8_to_f(wr[c], wf);
    if (beta != 0.f) bf16x8_to_f(o[c], of);
    uint4 out;
    __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&out);
    DFLASH_UNROLL
    for (int k = 0; k < 4; ++k) {
      float v0 = inv * (gf[2 * k] * wf[2 * k] - xf[2 * k] * inv * mean);
      float v1 = inv * (gf[2 * k + 1] * wf[2 * k + 1] - xf[2 * k + 1] * inv * mean);
      if (beta != 0.f) {
        v0 += beta * of[2 * k];
        v1 += beta * of[2 * k + 1];
      }
      oh[k] = __floats2bfloat162_rn(v0, v1);
    }
    o[c] = out;
  }
}

// Stage 1: partial[p, i] = sum over rows r of partition p of dy[r, i] * x[r, i] * rstd[r].
// grid (ceil(D / (32 VEC)), P), block (32, 8); VEC = 8: BF16 with D % 8 == 0 and 16-byte aligned rows, thread x
// owning 8 adjacent columns (one 16-byte load per row), else VEC = 1.
template <class T, int VEC>
__global__ void k_rmsnorm_dw_partial(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ rstd,
                                     int64_t R, int D, int64_t rows_per_part, float* __restrict__ partial) {
  __shared__ float red[8][32 * VEC + 1];
  const int col = (blockIdx.x * 32 + threadIdx.x) * VEC;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t r1 = r0 + rows_per_part < R ? r0 + rows_per_part : R;
  float acc[VEC];
  DFLASH_UNROLL
  for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
  if (col < D)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      if constexpr (VEC == 8) {
        float gf[8], xf[8];
        bf16x8_to_f(*reinterpret_cast<const uint4*>(dy + r * D + col), gf);
        bf16x8_to_f(*reinterpret_cast<const uint4*>(x + r * D + col), xf);
        const float rs = rstd[r];
        DFLASH_UNROLL
        for (int k = 0; k < 8; ++k) acc[k] += gf[k] * xf[k] * rs;
      } else {
        acc[0] += to_f(dy[r * D + col]) * to_f(x[r * D + col]) * rstd[r];
      }
    }
  DFLASH_UNROLL
  for (int k = 0; k < VEC; ++k) red[threadIdx.y][threadIdx.x * VEC + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < D) {
    DFLASH_UNROLL
    for (int k = 0; k < VEC; ++k) {
      float s = 0.f;
      for (int j = 0; j < 8; ++j) s += red[j][threadIdx.x * VEC + k];
      partial[static_cast<int64_t>(blockIdx.y) * D + col + k] = s;
    }
  }
}

// Stage 2: dw[i] += sum_p partial[p, i]. block (32, 8): thread (x, y) sums the partitions p = y (mod 8) in order,
// then row y = 0 adds the 8 sums in order (a fixed order: deterministic). grid ceil(D/32).
__global__ void k_colsum_final(const float* __restrict__ partial, int P, int D, float* __restrict__ dw) {
  __shared__ float red[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (col < D)
    for (int p = threadIdx.y; p < P; p += 8) s += partial[static_cast<int64_t>(p) * D + col];
  red[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < D) {
    float t = 0.f;
    for (int k = 0; k < 8; ++k) t += red[k][threadIdx.x];
    dw[col] += t;
  }
}

template <class T>
void launch_forward(Env& e, const Tensor& x, const Tensor& w, const Tensor& y, float* rs, int64_t R, int D, float eps) {
  const unsigned g = static_cast<unsigned>((R + kWarps - 1) / kWarps);
  if constexpr (std::is_same_v<T, bf16>) {
    if (bf16x8_ok(D, x.data, w.data, y.data)) {
      DFLASH_LAUNCH(g, kWarps * 32, 0, e.stream, k_rmsnorm_bf16x8)(static_cast<const bf16*>(x.data),
                                                                  static_cast<const bf16*>(w.data),
                                                                  static_cast<bf16*>(y.data), rs, R, D, eps);
      check_launch("rmsnorm_bf16x8");
      return;
    }
  }
  DFLASH_LAUNCH(g, kWarps * 32, 0, e.stream, k_rmsnorm<T>)(static_cast<const T*>(x.data), static_cast<const T*>(w.data),
                                                            static_cast<T*>(y.data), rs, R, D, eps);
  check_launch("rmsnorm");
}

template <class T>
void launch_backward(Env& e, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                     const Tensor& dw, float beta, int64_t R, int D) {
  const T* dyp = static_cast<const T*>(dy.data);
  const T* xp = static_cast<const T*>(x.data);
  if (dw.defined()) {
    const int64_t P = std::max<int64_t>(1, std::min<int64_t>(512, (R + 63) / 64));
    const int64_t rpp = (R + P - 1) / P;
    Tensor partial = e.alloc(DType::F32, {P, D});
    bool vec = false;
    if constexpr (std::is_same_v<T, bf16>) {
      vec = bf16x8_ok(D, dy.data, x.data);
      if (vec) {
        const dim3 grid(static_cast<unsigned>((D + 255) / 256), static_cast<unsigned>(P));
        DFLASH_LAUNCH(grid, dim3(32, 8), 0, e.stream, k_rmsnorm_dw_partial<T, 8>)(dyp, xp, rstd.ptr<float>(), R, D,
                                                                                  rpp, partial.ptr<float>());
      }
    }
    if (!vec) {
      const dim3 grid(static_cast<unsigned>((D + 31) / 32), static_cast<unsigned>(P));
      DFLASH_LAUNCH(grid, dim3(32, 8), 0, e.stream, k_rmsnorm_dw_partial<T, 1>)(dyp, xp, rstd.ptr<float>(), R, D, rpp,
                                                                                partial.ptr<float>());
    }
    check_launch("rmsnorm_dw_partial");
    DFLASH_LAUNCH((D + 31) / 32, dim3(32, 8), 0, e.stream, k_colsum_final)(partial.ptr<float>(), static_cast<int>(P),
                                                                            D, dw.ptr<float>());
    check_launch("rmsnorm_dw_final");
  }
  const unsigned g = static_cast<unsigned>((R + kWarps - 1) / kWarps);
  if constexpr (std::is_same_v<T, bf16>) {
    if (bf16x8_ok(D, dy.data, x.data, w.data, dx.data)) {
      DFLASH_LAUNCH(g, kWarps * 32, 0, e.stream, k_rmsnorm_dx_bf16x8)(dyp, xp, static_cast<const bf16*>(w.data),
                                                                     rstd.ptr<float>(), static_cast<bf16*>(dx.data),
                                                                     R, D, beta);
      check_launch("rmsnorm_dx_bf16x8");
      return;
    }
  }
  DFLASH_LAUNCH(g, kWarps * 32, 0, e.stream, k_rmsnorm_dx<T>)(dyp, xp, static_cast<const T*>(w.data), rstd.ptr<float>(),
                                                               static_cast<T*>(dx.data), R, D, beta);
  check_launch("rmsnorm_dx");
}

}  // namespace

void rmsnorm(Env& e, const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd) {
  check_on_dev("rmsnorm", x, "x");
  check_dev("rmsnorm", w, "w", x.dtype);
  check_dev("rmsnorm", y, "y", x.dtype);
  const int64_t D = x.dim(-1), R = x.rows();
  DFLASH_CHECK(w.numel() == D && y.numel() == x.numel(), "rmsnorm: x ", shape_str(x.shape), " w ", shape_str(w.shape),
               " y ", shape_str(y.shape));
  float* rs = nullptr;
  if (rstd.defined()) {
    check_dev("rmsnorm", rstd, "rstd", DType::F32);
    DFLASH_CHECK(rstd.numel() == R, "rmsnorm: rstd ", shape_str(rstd.shape), " for ", R, " rows");
    rs = rstd.ptr<float>();
  }
  if (R == 0 || D == 0) return;
  if (x.dtype == DType::BF16)
    launch_forward<bf16>(e, x, w, y, rs, R, static_cast<int>(D), eps);
  else if (x.dtype == DType::F32)
    launch_forward<float>(e, x, w, y, rs, R, static_cast<int>(D), eps);
  else
    DFLASH_FAIL("rmsnorm (cuda): dtype ", dtype_name(x.dtype), " (BF16 or F32)");
}

void rmsnorm_backward(Env& e, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dw, float beta) {
  const char* op = "rmsnorm_backward";
  check_on_dev(op, x, "x");
  check_dev(op, dy, "dy", x.dtype);
  check_dev(op, w, "w", x.dtype);
  check_dev(op, dx, "dx", x.dtype);
  check_dev(op, rstd, "rstd", DType::F32);
  const int64_t D = x.dim(-1), R = x.rows();
  DFLASH_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && rstd.numel() == R && w.numel() == D, op,
               ": shapes dy ", shape_str(dy.shape), " x ", shape_str(x.shape), " dx ", shape_str(dx.shape), " rstd ",
               shape_str(rstd.shape));
  if (dw.defined()) {
    check_dev(op, dw, "dw", DType::F32);
    DFLASH_CHECK(dw.numel() == D, op, ": dw ", shape_str(dw.shape));
  }
  if (R == 0 || D == 0) return;
  if (x.dtype == DType::BF16)
    launch_backward<bf16>(e, dy, x, w, rstd, dx, dw, beta, R, static_cast<int>(D));
  else if (x.dtype == DType::F32)
    launch_backward<float>(e, dy, x, w, rstd, dx, dw, beta, R, static_cast<int>(D));
  else
    DFLASH_FAIL("rmsnorm_backward (cuda): dtype ", dtype_name(x.dtype), " (BF16 or F32)");
}

}  // namespace dflash::cuda
