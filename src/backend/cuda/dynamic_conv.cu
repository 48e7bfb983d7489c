// backend/cuda/dynamic_conv.cu — DFlash2's grouped dynamic convolution, forward and backward (backend/context.h
// DynConvArgs): bf16 in and out, fp32 sums rounded once.
// defines: dflash::cuda::dynamic_conv, dynamic_conv_backward
//
// A thread owns a strip of W channels of one block of B rows (W = 8: one 16-byte load per row when C % 8 == 0 and
// every pointer is 16-byte aligned; else W = 1) and walks the block's rows, keeping the rows the taps need in a
// register window of TM >= T rows (TM = 2, 4 or 8; T <= 8), so that every u / dy / res element is read from memory
// once; the next row's loads are issued before the current row is computed. delta's group coefficients are one
// scalar load per (row, tap) when the strip lies in one group (g % W == 0), cached across neighbouring lanes.
//  forward: rows t = b0 .. b0 + B - 1, window win[k] = u[t - k]:
//      y[t] = res[t] + sum_{k < T, k <= slot} (base[k] + delta[t, k, q]) u[t - k]
//  backward: rows in reverse, t = b0 + B - 1 .. b0, window win[k] = dy[t + k] (zeros past the block); at row t the
//  taps k < min(T, B - slot) are those whose output row t + k reads u[t]:
//      du[t]              = sum_k (base[k] + delta[t + k, k, q]) dy[t + k]
//      d_delta[t + k, k, q] = sum over group q's channels of dy[t + k] u[t]     (a shuffle over the g / W lanes of
//                                                                               the group, when a power of two <= 32)
//      d_base[k]         += dy[t + k] u[t]                                      (per-thread fp32 partials)
//  and d_delta[t, k, q] = 0 for the taps k > slot that do not reach. Every (t', k) with k <= slot(t') is written
//  once, from row t' - k. Other groupings (g % W != 0, or g / W not a power of two <= 32) write d_delta with
//  k_conv_ddelta, one thread per (t, k, q).
//  d_base is a column sum over R rows, reduced without atomics: CTAs of 32 strips x 8 row lanes walk the blocks
//  (grid-stride along y), each thread sums its rows in registers, the 8 row lanes are added in shared memory in a
//  fixed order into a partial [grid.y, T, C] (F32 workspace), and k_conv_dbase adds the grid.y partials in order
//  into d_base. Deterministic on a given device (grid.y follows the SM count).
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr int kFwdThreads = 256;
constexpr int kBwdX = 32, kBwdY = 8;  // backward CTA: 32 strips (one warp) x 8 row lanes

struct ConvParams {
  const bf16* u;      // [R, C]
  const bf16* delta;  // [R, D], D = 2 T G, already offset to the side's T G columns
  const bf16* base;   // [T, C] of the side
  const bf16* res;    // [R, C] or null (forward)
  bf16* y;            // [R, C] (forward)
  const bf16* dy;     // [R, C] (backward)
  bf16* du;           // [R, C]
  bf16* d_delta;      // [R, D], offset like delta
  float* part;        // [grid.y, T, C] d_base partials
  int64_t C, D, B, g, G, nstrips, nblocks;
  int T;
  int lanes;  // backward: lanes per group (g / W, a power of two <= 32), or 0: d_delta by k_conv_ddelta
};

// acc[i] += (bs[i] + delta coefficient of channel c0 + i) * x[i]; dl points at the tap's G coefficients of the row.
template <int W>
__device__ __forceinline__ void tap(float (&acc)[W], const float (&bs)[W], const float (&x)[W], const bf16* dl,
                                    int64_t c0, int64_t g) {
  if (g % W == 0) {
    const float d = __bfloat162float(dl[c0 / g]);
    DFLASH_UNROLL
    for (int i = 0; i < W; ++i) acc[i] += (bs[i] + d) * x[i];
  } else {
    DFLASH_UNROLL
    for (int i = 0; i < W; ++i) acc[i] += (bs[i] + __bfloat162float(dl[(c0 + i) / g])) * x[i];
  }
}

template <int W, int TM>
__global__ void __launch_bounds__(kFwdThreads) k_conv_fwd(ConvParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.nstrips * p.nblocks) return;
  const int64_t c0 = (i % p.nstrips) * W, t0 = (i / p.nstrips) * p.B, C = p.C;
  float bs[TM][W], win[TM][W];
  DFLASH_UNROLL
  for (int k = 0; k < TM; ++k)
    DFLASH_UNROLL
    for (int j = 0; j < W; ++j) {
      bs[k][j] = k < p.T ? __bfloat162float(p.base[k * C + c0 + j]) : 0.f;
      win[k][j] = 0.f;
    }
  Raw<W> nu, nr;  // the next row's u and res
  nu.load(p.u + t0 * C + c0);
  if (p.res) nr.load(p.res + t0 * C + c0);
  for (int s = 0; s < p.B; ++s) {
    const int64_t t = t0 + s;
    DFLASH_UNROLL
    for (int k = TM - 1; k > 0; --k)
      DFLASH_UNROLL
      for (int j = 0; j < W; ++j) win[k][j] = win[k - 1][j];
    nu.to_f(win[0]);
    float acc[W];
    if (p.res)
      nr.to_f(acc);
    else
      DFLASH_UNROLL
      for (int j = 0; j < W; ++j) acc[j] = 0.f;
    if (s + 1 < p.B) {
      nu.load(p.u + (t + 1) * C + c0);
      if (p.res) nr.load(p.res + (t + 1) * C + c0);
    }
    const bf16* dl = p.delta + t * p.D;
    DFLASH_UNROLL
    for (int k = 0; k < TM; ++k)
      if (k < p.T && k <= s) tap<W>(acc, bs[k], win[k], dl + k * p.G, c0, p.g);
    store_f<W>(p.y + t * C + c0, acc);
  }
}

template <int W, int TM>
__global__ void __launch_bounds__(kBwdX * kBwdY) k_conv_bwd(ConvParams p) {
  __shared__ float red[kBwdY][kBwdX * W];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t strip = blockIdx.x * static_cast<int64_t>(kBwdX) + tx;
  const bool valid = strip < p.nstrips;  // a group's lanes are all valid or all not (nstrips is a multiple of lanes)
  const int64_t c0 = valid ? strip * W : 0, C = p.C, D = p.D, G = p.G, g = p.g;
  const int L = p.lanes;
  float bs[TM][W], part[TM][W];
  DFLASH_UNROLL
  for (int k = 0; k < TM; ++k)
    DFLASH_UNROLL
    for (int j = 0; j < W; ++j) {
      bs[k][j] = valid && k < p.T ? __bfloat162float(p.base[k * C + c0 + j]) : 0.f;
      part[k][j] = 0.f;
    }
  // warps are rows of the CTA (blockDim.x = 32): the block walk and the row loop are uniform in a warp, so the
  // shuffles below see every lane
  for (int64_t blk = blockIdx.y * static_cast<int64_t>(kBwdY) + ty; blk < p.nblocks;
       blk += static_cast<int64_t>(gridDim.y) * kBwdY) {
    const int64_t t0 = blk * p.B;
    float win[TM][W];
    DFLASH_UNROLL
    for (int k = 0; k < TM; ++k)
      DFLASH_UNROLL
      for (int j = 0; j < W; ++j) win[k][j] = 0.f;
    Raw<W> ndy, nu;  // the next row's dy and u
    if (valid) {
      ndy.load(p.dy + (t0 + p.B - 1) * C + c0);
      nu.load(p.u + (t0 + p.B - 1) * C + c0);
    }
    for (int s = static_cast<int>(p.B) - 1; s >= 0; --s) {
      const int64_t t = t0 + s;
      DFLASH_UNROLL
      for (int k = TM - 1; k > 0; --k)
        DFLASH_UNROLL
        for (int j = 0; j < W; ++j) win[k][j] = win[k - 1][j];
      float uu[W];
      if (valid) {
        ndy.to_f(win[0]);
        nu.to_f(uu);
        if (s > 0) {
          ndy.load(p.dy + (t - 1) * C + c0);
          nu.load(p.u + (t - 1) * C + c0);
        }
      } else {
        DFLASH_UNROLL
        for (int j = 0; j < W; ++j) win[0][j] = uu[j] = 0.f;
      }
      const int taps = min(p.T, static_cast<int>(p.B) - s);
      float acc[W];
      DFLASH_UNROLL
      for (int j = 0; j < W; ++j) acc[j] = 0.f;
      DFLASH_UNROLL
      for (int k = 0; k < TM; ++k) {
        if (k >= taps) continue;  // uniform in the warp
        if (valid) tap<W>(acc, bs[k], win[k], p.delta + (t + k) * D + k * G, c0, g);
        float sum = 0.f;
        DFLASH_UNROLL
        for (int j = 0; j < W; ++j) {
          const float pr = win[k][j] * uu[j];
          part[k][j] += pr;
          sum += pr;
        }
        if (L > 0) {
          for (int o = L >> 1; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
          if (valid && tx % L == 0) p.d_delta[(t + k) * D + k * G + c0 / g] = __float2bfloat16(sum);
        }
      }
      if (valid) {
        store_f<W>(p.du + t * C + c0, acc);
        if (L > 0 && tx % L == 0)
          for (int k = s + 1; k < p.T; ++k) p.d_delta[t * D + k * G + c0 / g] = __float2bfloat16(0.f);
      }
    }
  }
  // the CTA's d_base partial: its 8 row lanes added in order
  for (int k = 0; k < p.T && k < TM; ++k) {
    DFLASH_UNROLL
    for (int j = 0; j < W; ++j) red[ty][tx * W + j] = part[k][j];
    __syncthreads();
    if (ty == 0 && valid) {
      DFLASH_UNROLL
      for (int j = 0; j < W; ++j) {
        float s = 0.f;
        for (int y = 0; y < kBwdY; ++y) s += red[y][tx * W + j];
        p.part[(blockIdx.y * static_cast<int64_t>(p.T) + k) * C + c0 + j] = s;
      }
    }
    __syncthreads();
  }
}

// d_delta[t, k, q] = sum over group q's channels of dy[t, c] u[t - k, c] (0 where the tap does not reach): the
// groupings the backward kernel's shuffle does not cover.
__global__ void k_conv_ddelta(ConvParams p) {
  const int64_t n = p.nblocks * p.B * p.T * p.G;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t q = i % p.G, k = (i / p.G) % p.T, t = i / (p.G * p.T);
    float s = 0.f;
    if (t % p.B >= k)
      for (int64_t c = q * p.g; c < (q + 1) * p.g; ++c)
        s += __bfloat162float(p.dy[t * p.C + c]) * __bfloat162float(p.u[(t - k) * p.C + c]);
    p.d_delta[t * p.D + k * p.G + q] = __float2bfloat16(s);
  }
}

// d_base[k, c] += sum over the ny partials, in order.
__global__ void k_conv_dbase(const float* part, float* d_base, int64_t TC, int ny) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < TC;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int y = 0; y < ny; ++y) s += part[y * TC + i];
    d_base[i] += s;
  }
}

int taps_bucket(int64_t T) {
  DFLASH_CHECK(T >= 1 && T <= 8, "dynamic_conv (cuda): ", T, " taps; the CUDA kernels take at most 8");
  return T <= 2 ? 2 : T <= 4 ? 4 : 8;
}

ConvParams params(const DynConvArgs& a, const DynConvDims& d) {
  ConvParams p{};
  p.C = d.C;
  p.D = 2 * d.T * d.G;
  p.B = a.block_size;
  p.g = a.group;
  p.G = d.G;
  p.T = static_cast<int>(d.T);
  p.nblocks = d.R / a.block_size;
  p.u = static_cast<const bf16*>(a.u.data);
  p.delta = static_cast<const bf16*>(a.delta.data) + a.side * d.T * d.G;
  p.base = static_cast<const bf16*>(a.base.data) + a.side * d.T * d.C;
  return p;
}

template <int W>
void launch_fwd(Env& e, const ConvParams& p, int tm) {
  const int64_t n = p.nstrips * p.nblocks;
  const unsigned grid = static_cast<unsigned>((n + kFwdThreads - 1) / kFwdThreads);
  if (tm == 2) DFLASH_LAUNCH(grid, kFwdThreads, 0, e.stream, k_conv_fwd<W, 2>)(p);
  else if (tm == 4) DFLASH_LAUNCH(grid, kFwdThreads, 0, e.stream, k_conv_fwd<W, 4>)(p);
  else DFLASH_LAUNCH(grid, kFwdThreads, 0, e.stream, k_conv_fwd<W, 8>)(p);
  check_launch("dynamic_conv");
}

template <int W>
void launch_bwd(Env& e, const ConvParams& p, int tm, dim3 grid) {
  const dim3 block(kBwdX, kBwdY);
  if (tm == 2) DFLASH_LAUNCH(grid, block, 0, e.stream, k_conv_bwd<W, 2>)(p);
  else if (tm == 4) DFLASH_LAUNCH(grid, block, 0, e.stream, k_conv_bwd<W, 4>)(p);
  else DFLASH_LAUNCH(grid, block, 0, e.stream, k_conv_bwd<W, 8>)(p);
  check_launch("dynamic_conv_backward");
}

}  // namespace

void dynamic_conv(Env& e, const DynConvArgs& a, const Tensor& y, const Tensor* res, const DynConvDims& d) {
  const char* op = "dynamic_conv";
  check_on_dev(op, a.u, "u");
  check_on_dev(op, a.delta, "delta");
  check_on_dev(op, a.base, "base");
  check_on_dev(op, y, "y");
  if (res) check_on_dev(op, *res, "res");
  if (d.R == 0 || d.C == 0) return;
  const int tm = taps_bucket(d.T);
  ConvParams p = params(a, d);
  p.res = res ? static_cast<const bf16*>(res->data) : nullptr;
  p.y = static_cast<bf16*>(y.data);
  if (bf16x8_ok(d.C, p.u, p.base, p.y, p.res ? p.res : p.u)) {
    p.nstrips = d.C / 8;
    launch_fwd<8>(e, p, tm);
  } else {
    p.nstrips = d.C;
    launch_fwd<1>(e, p, tm);
  }
}

void dynamic_conv_backward(Env& e, const DynConvArgs& a, const Tensor& dy, const Tensor& du, const Tensor& d_delta,
                           const Tensor& d_base, const DynConvDims& d) {
  const char* op = "dynamic_conv_backward";
  check_on_dev(op, a.u, "u");
  check_on_dev(op, a.delta, "delta");
  check_on_dev(op, a.base, "base");
  check_on_dev(op, dy, "dy");
  check_dev(op, du, "du", DType::BF16);
  check_dev(op, d_delta, "d_delta", DType::BF16);
  check_dev(op, d_base, "d_base", DType::F32);
  if (d.R == 0 || d.C == 0) return;
  const int tm = taps_bucket(d.T);
  ConvParams p = params(a, d);
  p.dy = static_cast<const bf16*>(dy.data);
  p.du = static_cast<bf16*>(du.data);
  p.d_delta = static_cast<bf16*>(d_delta.data) + a.side * d.T * d.G;
  const bool vec = bf16x8_ok(d.C, p.u, p.base, p.dy, static_cast<const bf16*>(p.du));
  const int W = vec ? 8 : 1;
  p.nstrips = d.C / W;
  const int64_t lanes = a.group % W == 0 ? a.group / W : 0;
  p.lanes = lanes > 0 && lanes <= 32 && (lanes & (lanes - 1)) == 0 ? static_cast<int>(lanes) : 0;
  // grid: the strips along x, enough CTAs along y for about four per SM, each walking nblocks / (8 grid.y) blocks
  const int64_t gx = (p.nstrips + kBwdX - 1) / kBwdX;
  const int64_t gy = std::max<int64_t>(
      1, std::min<int64_t>((p.nblocks + kBwdY - 1) / kBwdY, std::max<int64_t>(1, 4 * e.num_sms / gx)));
  Tensor part = e.alloc(DType::F32, {gy, d.T, d.C});
  p.part = part.ptr<float>();
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  if (vec)
    launch_bwd<8>(e, p, tm, grid);
  else
    launch_bwd<1>(e, p, tm, grid);
  if (p.lanes == 0) {
    DFLASH_LAUNCH(grid_for(d.R * d.T * d.G, 256, e.num_sms), 256, 0, e.stream, k_conv_ddelta)(p);
    check_launch("dynamic_conv_backward d_delta");
  }
  float* db = d_base.ptr<float>() + a.side * d.T * d.C;
  DFLASH_LAUNCH(grid_for(d.T * d.C, 256, e.num_sms), 256, 0, e.stream, k_conv_dbase)(p.part, db, d.T * d.C,
                                                                                     static_cast<int>(gy));
  check_launch("dynamic_conv_backward d_base");
}

}  // namespace dflash::cuda
