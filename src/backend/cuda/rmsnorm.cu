// cuda/rmsnorm.cu — RMSNorm (Zhang & Sennrich 2019) as in HF Llama/Qwen, over the last dim D of x [R, D]:
//   forward:  r = 1 / sqrt(mean(x^2) + eps),  y = x r w  (rstd [R] F32 saved when defined; y may alias x)
//   backward: u = x r,  dw += sum_rows dy * u,  dx = r (dy w - u mean(dy w u)) (+ beta dx)
// BF16 rows of D = 64 .. 8192 (a power of two), 16-byte aligned: TPR threads per row, 8 values per load
// (k_rmsnorm_rows; the backward in one pass over dy and x, k_rmsnorm_bwd_rows). Other D and F32: one warp per row.
// fp32 accumulation throughout. dw uses a deterministic two-stage column reduction (fixed row partitions -> F32
// partials -> one ordered sum per column), no float atomics. dx may alias dy (the one-pass kernel reads a chunk
// before writing it; the two-kernel path computes dw before dx).
// With RopeArgs (the per-head q / k norms): y = RoPE(y) and dy -> RoPE^-1(dy) before the backward, fused into the
// row kernels for BF16 rows of D = 64, 128, 256 (ROPE: the rotate-half partner of a thread's chunk is a lane of its
// warp); other rows run the composition with rope.cu's kernel (forward: rope on y; backward: on a copy of dy).
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

// ---- BF16 rows of D = 64 .. 8192 (a power of two), 16-byte aligned: TPR threads per row -----------------------------
// A row of D bf16 is C = D / 8 chunks of 8 values (one uint4 load or store). A block of kRowThreads threads is
// NS = kRowThreads / TPR row slots of TPR threads: thread slot s = tid % TPR owns the chunks s + TPR j (j < CPT,
// C = TPR CPT: a warp's loads are contiguous), row slot q = tid / TPR. A step covers NS RB consecutive rows (row
// base + k NS + q, k < RB), each thread loading all of its chunks of the step before it uses any. TPR, CPT (and
// so D) are compile-time: the largest TPR <= 256 with C / TPR in {1, 2, 4}, i.e. D = 64 .. 2048: TPR = D / 8,
// CPT 1; D = 4096: TPR 256, CPT 2; D = 8192: TPR 256, CPT 4 (row_kernel_for). Other D take the kernels above.
constexpr int kRowThreads = 256;

// Rows per row slot and step: RB (the forward: RB CPT = 4 chunks of x per thread in flight; the backward: RB CPT = 2
// chunks of dy, x and dx each for CPT 1 and 2, 4 for CPT 4), and the blocks per SM the backward is built for (its
// __launch_bounds__ minimum: ptxas fits it in 64, 80, 128 registers without spills; RB CPT = 4 for CPT 1 takes
// about 100 and 2 blocks per SM). The backward with the RoPE fused (CPT 1) keeps dy in fp32 (rotated) and needs 74
// (80 with dw): 3 blocks per SM (4 spill). The forward has no minimum (80 registers with the RoPE, 48 without).
template <int CPT>
constexpr int kFwdRowsPerSlot = 4 / CPT;
template <int CPT>
constexpr int kBwdRowsPerSlot = CPT == 1 ? 2 : 1;
template <int CPT, bool ROPE>
constexpr int kBwdBlocksPerSm = ROPE ? 3 : CPT == 1 ? 4 : CPT == 2 ? 3 : 2;

// Sums v[k] (k < RB) over the TPR threads of each row slot, in a fixed order; every thread of the slot gets the
// same bits. A xor butterfly over min(TPR, 32) lanes (aligned lane groups); for TPR > 32 then the TPR / 32 warp
// sums of the slot, in order, through red[RB * 8] in shared memory after one __syncthreads (a caller that calls
// again before another barrier passes the other of two buffers: every thread has read this one before it can
// reach the next call's barrier, so the write after that barrier cannot overtake a read).
template <int TPR, int RB>
__device__ __forceinline__ void row_sums(float (&v)[RB], float* red) {
  constexpr int L = TPR < 32 ? TPR : 32;
  DFLASH_UNROLL
  for (int o = L / 2; o > 0; o >>= 1) {
    DFLASH_UNROLL
    for (int k = 0; k < RB; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
  }
  if constexpr (TPR > 32) {
    constexpr int W = TPR / 32;
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
      DFLASH_UNROLL
      for (int k = 0; k < RB; ++k) red[k * 8 + warp] = v[k];
    }
    __syncthreads();
    const int w0 = warp & ~(W - 1);  // the first warp of this row slot
    DFLASH_UNROLL
    for (int k = 0; k < RB; ++k) {
      float t = red[k * 8 + w0];
      DFLASH_UNROLL
      for (int i = 1; i < W; ++i) t += red[k * 8 + w0 + i];
      v[k] = t;
    }
  }
}

// bf16x8_to_f by integer ops (a bf16 is the high half of its float): the same values, but not an expression the
// compiler can share with an earlier bf16x8_to_f of the same words, so across the backward's row sum it keeps the
// 4 packed words of a chunk alive rather than its 8 floats, and converts again (1 instruction per value).
__device__ __forceinline__ void bf16x8_to_f_alu(const uint4 v, float (&f)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
  DFLASH_UNROLL
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = __uint_as_float(u[k] << 16);
    f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
  }
}

// ---- the fused RoPE (ROPE row kernels: CPT 1, TPR <= 32, i.e. D = 64, 128, 256) ------------------------------------
// Row r is head r mod heads of token r / heads, at position pos[r / heads]. Thread s holds the elements 8s .. 8s+7 of
// its row; rotate-half pairs element i < D/2 with i + D/2, i.e. thread s with its partner s ^ TPR/2, a lane of the
// same warp (row slots are aligned groups of TPR <= 32 lanes), whose chunk comes by __shfl_xor_sync. The cos / sin
// of each (token, i) are computed once, by k_rope_table, into cs[token][i] (the accurate cosf / sinf cost ~40
// instructions each: in the row kernels every thread of a pair and every head of a token would repeat them; bench/
// NOTES.md 12).
struct RopeRows {
  const float2* cs = nullptr;  // [R / heads, D/2] (cos t, sin t), t = pos[token] * inv_freq[i]
  int heads = 1;
};

// cs[t, i] = (cos, sin)(pos[t] * inv_freq[i]) for t < T, i < half: the angle formed in fp32 and the accurate cosf /
// sinf, as rope.cu (positions reach thousands of radians).
__global__ void k_rope_table(const int* __restrict__ pos, const float* __restrict__ inv_freq, int64_t T, int half,
                             float2* __restrict__ cs) {
  const int64_t n = T * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float ang = static_cast<float>(pos[idx / half]) * inv_freq[idx % half];
    cs[idx] = float2{cosf(ang), sinf(ang)};
  }
}
constexpr int64_t kRopeMaxD = 256;

// The partner's 4 packed words of the same row (every lane of the warp must call: a warp-wide shuffle).
template <int TPR>
__device__ __forceinline__ uint4 rope_partner(const uint4& v) {
  return {__shfl_xor_sync(0xffffffffu, v.x, TPR / 2), __shfl_xor_sync(0xffffffffu, v.y, TPR / 2),
          __shfl_xor_sync(0xffffffffu, v.z, TPR / 2), __shfl_xor_sync(0xffffffffu, v.w, TPR / 2)};
}

// v = thread s's 8 values, p = its partner's: with t = pos * inv_freq[8 (s mod TPR/2) + e] (cs: the token's row of
// the table),
//   first half (s < TPR/2):  v_e cos t - p_e sin t,   second half:  v_e cos t + p_e sin t
// (rope.cu's (a cos - b sin, b cos + a sin)); sgn = -1: the inverse (rotation by -t).
template <int TPR>
__device__ __forceinline__ void rope_chunk(float (&v)[8], const float (&p)[8], const float2* cs, int s, float sgn) {
  constexpr int H = TPR / 2;
  const float sg = s < H ? -sgn : sgn;
  const float4* c4 = reinterpret_cast<const float4*>(cs + 8 * (s & (H - 1)));  // 8 (cos, sin): 4 16-byte loads
  DFLASH_UNROLL
  for (int h = 0; h < 4; ++h) {
    const float4 t = __ldg(c4 + h);
    v[2 * h] = v[2 * h] * t.x + p[2 * h] * (sg * t.y);
    v[2 * h + 1] = v[2 * h + 1] * t.z + p[2 * h + 1] * (sg * t.w);
  }
}

// The forward, one step per block: rows blockIdx.x NS RB + k NS + q. Same arithmetic as k_rmsnorm_bf16x8 (y may
// alias x: a thread reads each of its chunks before writing it). ROPE: the partner's y (its x, by shuffle, times
// r and its w) rotates the fp32 y before the one rounding at the store.
template <int TPR, int CPT, bool ROPE>
__global__ void __launch_bounds__(kRowThreads) k_rmsnorm_rows(const bf16* x, const bf16* __restrict__ w, bf16* y,
                                                              float* __restrict__ rstd, int64_t R, float eps,
                                                              RopeRows rope) {
  static_assert(!ROPE || (CPT == 1 && TPR <= 32), "the fused RoPE exchanges chunks within a warp");
  constexpr int D = 8 * TPR * CPT, NS = kRowThreads / TPR, RB = kFwdRowsPerSlot<CPT>;
  __shared__ float red[RB * 8];
  const int s = threadIdx.x % TPR, q = threadIdx.x / TPR;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * (NS * RB) + q;
  uint4 xv[RB][CPT], wv[CPT], wp{};  // wp: the partner's chunk of w (ROPE)
  float ss[RB];
  DFLASH_UNROLL
  for (int j = 0; j < CPT; ++j) wv[j] = reinterpret_cast<const uint4*>(w)[s + TPR * j];
  if constexpr (ROPE) wp = reinterpret_cast<const uint4*>(w)[s ^ (TPR / 2)];
  DFLASH_UNROLL
  for (int k = 0; k < RB; ++k) {
    const int64_t row = base + k * NS;
    DFLASH_UNROLL
    for (int j = 0; j < CPT; ++j)
      xv[k][j] = row < R ? reinterpret_cast<const uint4*>(x)[row * (D / 8) + s + TPR * j] : uint4{};
  }
  DFLASH_UNROLL
  for (int k = 0; k < RB; ++k) {
    ss[k] = 0.f;
    DFLASH_UNROLL
    for (int j = 0; j < CPT; ++j) {
      float xf[8];
      bf16x8_to_f(xv[k][j], xf);
      DFLASH_UNROLL
      for (int e = 0; e < 8; ++e) ss[k] += xf[e] * xf[e];
    }
  }
  row_sums<TPR, RB>(ss, red);
  DFLASH_UNROLL
  for (int k = 0; k < RB; ++k) {
    const int64_t row = base + k * NS;
    uint4 xp{};
    if constexpr (ROPE) xp = rope_partner<TPR>(xv[k][0]);  // before the row test: all lanes shuffle
    if (row >= R) continue;
    const float inv = 1.0f / sqrtf(ss[k] / static_cast<float>(D) + eps);
    if (rstd != nullptr && s == 0) rstd[row] = inv;
    DFLASH_UNROLL
    for (int j = 0; j < CPT; ++j) {
      float xf[8], wf[8];
      bf16x8_to_f(xv[k][j], xf);
      bf16x8_to_f(wv[j], wf);
      DFLASH_UNROLL
      for (int e = 0; e < 8; ++e) xf[e] = xf[e] * inv * wf[e];
      if constexpr (ROPE) {
        float pf[8];
        bf16x8_to_f(xp, pf);
        bf16x8_to_f(wp, wf);
        DFLASH_UNROLL
        for (int e = 0; e < 8; ++e) pf[e] = pf[e] * inv * wf[e];
        rope_chunk<TPR>(xf, pf, rope.cs + int64_t{static_cast<int>(row) / rope.heads} * (D / 2), s, 1.f);  // (32-bit /)
      }
      reinterpret_cast<uint4*>(y)[row * (D / 8) + s + TPR * j] = f_to_bf16x8(xf);
    }
  }
}

// The backward in one pass over dy, x (and dx when beta != 0): block b takes the rows [b rows_per_block,
// (b + 1) rows_per_block) (rows_per_block a multiple of NS RB), step by step. Per row, with u = x r:
//   dot = sum_i dy_i w_i x_i (over the TPR threads: row_sums), mean = dot r / D,
//   dx = r (dy w - x r mean) (+ beta dx)   (fp32, one bf16 rounding at the store: k_rmsnorm_dx_bf16x8's formula)
// and, when DW, each thread accumulates dy x r over the block's rows for its 8 CPT columns in fp32 registers; at
// the end the NS row slots are added in order (q = 0, 1, ...) into partial[b, D] (F32), which k_colsum_final sums
// over the blocks in order: a fixed row partition and reduction order, no atomics (deterministic). dx may alias dy
// or x: a thread reads its chunks of a row before it writes them, and no other thread touches them.
// ROPE: dy is rotated back (RoPE^-1 in fp32, not rounded) right after the loads, the partner's chunk by shuffle
// (before any store of the step); that dy is the dy of everything above.
template <int TPR, int CPT, bool DW, bool ROPE>
__global__ void __launch_bounds__(kRowThreads, kBwdBlocksPerSm<CPT, ROPE>)
    k_rmsnorm_bwd_rows(const bf16* dy, const bf16* x, const bf16* __restrict__ w, const float* __restrict__ rstd,
                       bf16* dx, int64_t R, int64_t rows_per_block, float beta, float* __restrict__ partial,
                       RopeRows rope) {
  static_assert(!ROPE || (CPT == 1 && TPR <= 32), "the fused RoPE exchanges chunks within a warp");
  constexpr int D = 8 * TPR * CPT, NS = kRowThreads / TPR, RB = kBwdRowsPerSlot<CPT>;
  __shared__ float red[2][RB * 8];
  const int s = threadIdx.x % TPR, q = threadIdx.x / TPR;
  uint4 wv[CPT];  // the same chunks of w for every row
  DFLASH_UNROLL
  for (int j = 0; j < CPT; ++j) wv[j] = reinterpret_cast<const uint4*>(w)[s + TPR * j];
  float acc[CPT][8];
  DFLASH_UNROLL
  for (int j = 0; j < CPT; ++j)
    DFLASH_UNROLL
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.f;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < R ? r0 + rows_per_block : R;
  int buf = 0;
  for (int64_t step = r0; step < r1; step += NS * RB, buf ^= 1) {  // the same trip count in every thread
    const int64_t base = step + q;
    uint4 gv[RB][CPT], xv[RB][CPT], ov[RB][CPT];
    float inv[RB], dot[RB];
    DFLASH_UNROLL
    for (int k = 0; k < RB; ++k) {  // every load of the step first (rows past r1: zeros)
      const int64_t row = base + k * NS;
      const bool in = row < r1;
      const int64_t off = in ? row * (D / 8) : 0;
      DFLASH_UNROLL
      for (int j = 0; j < CPT; ++j) {
        const int64_t c = off + s + TPR * j;
        gv[k][j] = in ? reinterpret_cast<const uint4*>(dy)[c] : uint4{};
        xv[k][j] = in ? reinterpret_cast<const uint4*>(x)[c] : uint4{};
        ov[k][j] = in && beta != 0.f ? reinterpret_cast<const uint4*>(dx)[c] : uint4{};
      }
      inv[k] = in ? rstd[row] : 0.f;
    }
    [[maybe_unused]] float gr[RB][8];  // ROPE: dy rotated back, fp32
    if constexpr (ROPE) {
      DFLASH_UNROLL
      for (int k = 0; k < RB; ++k) {
        const int64_t row = base + k * NS;
        float pf[8];
        bf16x8_to_f(gv[k][0], gr[k]);
        bf16x8_to_f(rope_partner<TPR>(gv[k][0]), pf);
        rope_chunk<TPR>(gr[k], pf, rope.cs + int64_t{row < r1 ? static_cast<int>(row) / rope.heads : 0} * (D / 2), s,
                        -1.f);
      }
    }
    DFLASH_UNROLL
    for (int k = 0; k < RB; ++k) {  // dot, and dw's terms (they do not need the row sum)
      dot[k] = 0.f;
      DFLASH_UNROLL
      for (int j = 0; j < CPT; ++j) {
        float gf[8], xf[8], wf[8];
        if constexpr (ROPE) {
          DFLASH_UNROLL
          for (int e = 0; e < 8; ++e) gf[e] = gr[k][e];
        } else {
          bf16x8_to_f(gv[k][j], gf);
        }
        bf16x8_to_f(xv[k][j], xf);
        bf16x8_to_f(wv[j], wf);
        DFLASH_UNROLL
        for (int e = 0; e < 8; ++e) dot[k] += gf[e] * wf[e] * xf[e];
        if constexpr (DW) {  // rows past r1 add 0 * 0 * 0
          DFLASH_UNROLL
          for (int e = 0; e < 8; ++e) acc[j][e] += gf[e] * xf[e] * inv[k];
        }
      }
    }
    row_sums<TPR, RB>(dot, red[buf]);
    DFLASH_UNROLL
    for (int k = 0; k < RB; ++k) {
      const int64_t row = base + k * NS;
      if (row >= r1) continue;
      const float mean = dot[k] * inv[k] / static_cast<float>(D);
      DFLASH_UNROLL
      for (int j = 0; j < CPT; ++j) {
        float gf[8], xf[8], wf[8], of[8];
        if constexpr (ROPE) {
          DFLASH_UNROLL
          for (int e = 0; e < 8; ++e) gf[e] = gr[k][e];
        } else {
          bf16x8_to_f_alu(gv[k][j], gf);
        }
        bf16x8_to_f_alu(xv[k][j], xf);
        bf16x8_to_f(wv[j], wf);
        bf16x8_to_f_alu(ov[k][j], of);
        uint4 out;
        __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&out);
        DFLASH_UNROLL
        for (int h = 0; h < 4; ++h) {
          float v0 = inv[k] * (gf[2 * h] * wf[2 * h] - xf[2 * h] * inv[k] * mean);
          float v1 = inv[k] * (gf[2 * h + 1] * wf[2 * h + 1] - xf[2 * h + 1] * inv[k] * mean);
          if (beta != 0.f) {
            v0 += beta * of[2 * h];
            v1 += beta * of[2 * h + 1];
          }
          oh[h] = __floats2bfloat162_rn(v0, v1);
        }
        reinterpret_cast<uint4*>(dx)[row * (D / 8) + s + TPR * j] = out;
      }
    }
  }
  if constexpr (DW) {
    float* out = partial + static_cast<int64_t>(blockIdx.x) * D;
    if constexpr (NS == 1) {
      DFLASH_UNROLL
      for (int j = 0; j < CPT; ++j) {
        float4* o4 = reinterpret_cast<float4*>(out + (s + TPR * j) * 8);
        o4[0] = float4{acc[j][0], acc[j][1], acc[j][2], acc[j][3]};
        o4[1] = float4{acc[j][4], acc[j][5], acc[j][6], acc[j][7]};
      }
    } else {
      __shared__ float slot_sum[NS][D];
      DFLASH_UNROLL
      for (int j = 0; j < CPT; ++j)
        DFLASH_UNROLL
        for (int e = 0; e < 8; ++e) slot_sum[q][(s + TPR * j) * 8 + e] = acc[j][e];
      __syncthreads();
      for (int c = threadIdx.x; c < D; c += kRowThreads) {
        float t = slot_sum[0][c];
        DFLASH_UNROLL
        for (int p = 1; p < NS; ++p) t += slot_sum[p][c];
        out[c] = t;
      }
    }
  }
}

// Calls f(TPR, CPT) (std::integral_constant's) for the D the row kernels take; false for any other D.
template <class F>
bool row_kernel_for(int64_t D, F&& f) {
  switch (D) {
    case 64: f(std::integral_constant<int, 8>{}, std::integral_constant<int, 1>{}); return true;
    case 128: f(std::integral_constant<int, 16>{}, std::integral_constant<int, 1>{}); return true;
    case 256: f(std::integral_constant<int, 32>{}, std::integral_constant<int, 1>{}); return true;
    case 512: f(std::integral_constant<int, 64>{}, std::integral_constant<int, 1>{}); return true;
    case 1024: f(std::integral_constant<int, 128>{}, std::integral_constant<int, 1>{}); return true;
    case 2048: f(std::integral_constant<int, 256>{}, std::integral_constant<int, 1>{}); return true;
    case 4096: f(std::integral_constant<int, 256>{}, std::integral_constant<int, 2>{}); return true;
    case 8192: f(std::integral_constant<int, 256>{}, std::integral_constant<int, 4>{}); return true;
    default: return false;
  }
}

// The same for the row kernels with the RoPE fused: D = 64, 128, 256 (TPR <= 32, CPT 1); false for any other D.
template <class F>
bool rope_row_kernel_for(int64_t D, F&& f) {
  return D <= kRopeMaxD && row_kernel_for(D, [&](auto tpr, auto cpt) {
           if constexpr (decltype(tpr)::value <= 32) f(tpr, cpt);
         });
}

// The most blocks (= dw partials) of the one-pass backward: one wave of an H200 (132 SMs) at kBwdBlocksPerSm. A
// constant, not the device's SM count, so that the row partition, and so dw's bits, are the same on every GPU. The
// emulator uses 3, so that its small test shapes still give blocks of several steps.
template <int CPT, bool ROPE>
constexpr int64_t max_row_blocks() {
#ifdef DFLASH_CUDA_EMU
  return 3;
#else
  return 132 * kBwdBlocksPerSm<CPT, ROPE>;
#endif
}

// k_rmsnorm_rows<TPR, CPT, ROPE> over the R rows.
template <int TPR, int CPT, bool ROPE>
void launch_fwd_rows(Env& e, const Tensor& x, const Tensor& w, const Tensor& y, float* rs, int64_t R, float eps,
                     const RopeRows& rope) {
  constexpr int64_t step = kRowThreads / TPR * kFwdRowsPerSlot<CPT>;
  DFLASH_LAUNCH(static_cast<unsigned>((R + step - 1) / step), kRowThreads, 0, e.stream,
                k_rmsnorm_rows<TPR, CPT, ROPE>)(static_cast<const bf16*>(x.data), static_cast<const bf16*>(w.data),
                                                static_cast<bf16*>(y.data), rs, R, eps, rope);
  check_launch("rmsnorm_rows");
}

// The one pass (k_rmsnorm_bwd_rows<TPR, CPT, DW, ROPE>) over the R rows, then k_colsum_final over its P partials.
template <int TPR, int CPT, bool ROPE>
void launch_bwd_rows(Env& e, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                     const Tensor& dw, float beta, int64_t R, const RopeRows& rope) {
  constexpr int D = 8 * TPR * CPT;
  constexpr int64_t step = kRowThreads / TPR * kBwdRowsPerSlot<CPT>;  // rows per block and step
  const int64_t P0 = std::min<int64_t>((R + step - 1) / step, max_row_blocks<CPT, ROPE>());
  const int64_t rpb = ((R + P0 - 1) / P0 + step - 1) / step * step;  // rows per block: whole steps
  const int64_t P = (R + rpb - 1) / rpb;
  const bf16* dyp = static_cast<const bf16*>(dy.data);
  const bf16* xp = static_cast<const bf16*>(x.data);
  const bf16* wp = static_cast<const bf16*>(w.data);
  bf16* dxp = static_cast<bf16*>(dx.data);
  if (dw.defined()) {
    Tensor partial = e.alloc(DType::F32, {P, D});
    DFLASH_LAUNCH(static_cast<unsigned>(P), kRowThreads, 0, e.stream, k_rmsnorm_bwd_rows<TPR, CPT, true, ROPE>)(
        dyp, xp, wp, rstd.ptr<float>(), dxp, R, rpb, beta, partial.ptr<float>(), rope);
    check_launch("rmsnorm_bwd_rows");
    DFLASH_LAUNCH((D + 31) / 32, dim3(32, 8), 0, e.stream, k_colsum_final)(partial.ptr<float>(), static_cast<int>(P), D,
                                                                            dw.ptr<float>());
    check_launch("rmsnorm_dw_final");
  } else {
    DFLASH_LAUNCH(static_cast<unsigned>(P), kRowThreads, 0, e.stream, k_rmsnorm_bwd_rows<TPR, CPT, false, ROPE>)(
        dyp, xp, wp, rstd.ptr<float>(), dxp, R, rpb, beta, nullptr, rope);
    check_launch("rmsnorm_bwd_rows");
  }
}

template <class T>
void launch_forward(Env& e, const Tensor& x, const Tensor& w, const Tensor& y, float* rs, int64_t R, int D, float eps) {
  const unsigned g = static_cast<unsigned>((R + kWarps - 1) / kWarps);
  if constexpr (std::is_same_v<T, bf16>) {
    if (bf16x8_ok(D, x.data, w.data, y.data)) {
      const bool rows = row_kernel_for(D, [&](auto tpr, auto cpt) {
        launch_fwd_rows<decltype(tpr)::value, decltype(cpt)::value, false>(e, x, w, y, rs, R, eps, RopeRows{});
      });
      if (rows) return;
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
  if constexpr (std::is_same_v<T, bf16>) {
    if (bf16x8_ok(D, dy.data, x.data, w.data, dx.data) && row_kernel_for(D, [&](auto tpr, auto cpt) {
          launch_bwd_rows<decltype(tpr)::value, decltype(cpt)::value, false>(e, dy, x, w, rstd, dx, dw, beta, R,
                                                                             RopeRows{});
        }))
      return;
  }
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

// Checks r against x [R, D], beyond Context's checks (whole tokens, a position each): on the device, 32-bit rows, and
// the whole head rotated (no partial rotary in the fused kernels).
void check_rope(const char* op, const Tensor& x, const RopeArgs& r) {
  const int64_t D = x.dim(-1), R = x.rows();
  check_dev(op, r.pos, "pos", DType::I32);
  check_dev(op, r.inv_freq, "inv_freq", DType::F32);
  DFLASH_CHECK(R < (int64_t{1} << 31), op, ": ", R, " rows with rope (the row kernels index tokens in 32 bits)");
  DFLASH_CHECK(D % 2 == 0 && r.inv_freq.numel() == D / 2, op, ": rope inv_freq has ", r.inv_freq.numel(),
               " entries, head_dim ", D);
}

// The row kernels' view of r: its cos / sin table (k_rope_table) in cs, [R / heads, D/2] float2 allocated by the
// caller.
RopeRows rope_rows(Env& e, const Tensor& x, const RopeArgs& r, Tensor& cs) {
  const int64_t D = x.dim(-1), T = x.rows() / r.heads;
  cs = e.alloc(DType::F32, {T, D / 2, 2});
  if (T > 0) {
    DFLASH_LAUNCH(grid_for(T * (D / 2), 256, e.num_sms), 256, 0, e.stream, k_rope_table)(
        r.pos.ptr<int>(), r.inv_freq.ptr<float>(), T, static_cast<int>(D / 2), reinterpret_cast<float2*>(cs.data));
    check_launch("rope_table");
  }
  return {reinterpret_cast<const float2*>(cs.data), static_cast<int>(r.heads)};
}

}  // namespace

void rmsnorm(Env& e, const Tensor& x, const Tensor& w, float eps, const Tensor& y, const Tensor& rstd,
             const RopeArgs* rope) {
  check_on_dev("rmsnorm", x, "x");
  check_dev("rmsnorm", w, "w", x.dtype);
  check_dev("rmsnorm", y, "y", x.dtype);
  const int64_t D = x.dim(-1), R = x.rows();
  float* rs = nullptr;
  if (rstd.defined()) {
    check_dev("rmsnorm", rstd, "rstd", DType::F32);
    rs = rstd.ptr<float>();
  }
  if (rope) check_rope("rmsnorm", x, *rope);
  if (R == 0 || D == 0) return;
  if (rope && x.dtype == DType::BF16 && bf16x8_ok(D, x.data, w.data, y.data) &&
      rope_row_kernel_for(D, [&](auto tpr, auto cpt) {
        Tensor cs;
        const RopeRows rr = rope_rows(e, x, *rope, cs);
        launch_fwd_rows<decltype(tpr)::value, decltype(cpt)::value, true>(e, x, w, y, rs, R, eps, rr);
      }))
    return;
  if (x.dtype == DType::BF16)
    launch_forward<bf16>(e, x, w, y, rs, R, static_cast<int>(D), eps);
  else if (x.dtype == DType::F32)
    launch_forward<float>(e, x, w, y, rs, R, static_cast<int>(D), eps);
  else
    DFLASH_FAIL("rmsnorm (cuda): dtype ", dtype_name(x.dtype), " (BF16 or F32)");
  if (rope) cuda::rope(e, y.reshape({R / rope->heads, rope->heads, D}), rope->pos, rope->inv_freq, false);
}

void rmsnorm_backward(Env& e, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dw, float beta, const RopeArgs* rope) {
  const char* op = "rmsnorm_backward";
  check_on_dev(op, x, "x");
  check_dev(op, dy, "dy", x.dtype);
  check_dev(op, w, "w", x.dtype);
  check_dev(op, dx, "dx", x.dtype);
  check_dev(op, rstd, "rstd", DType::F32);
  const int64_t D = x.dim(-1), R = x.rows();
  if (dw.defined()) check_dev(op, dw, "dw", DType::F32);
  if (rope) check_rope(op, x, *rope);
  if (R == 0 || D == 0) return;
  if (rope && x.dtype == DType::BF16 && bf16x8_ok(D, dy.data, x.data, w.data, dx.data) &&
      rope_row_kernel_for(D, [&](auto tpr, auto cpt) {
        Tensor cs;
        const RopeRows rr = rope_rows(e, x, *rope, cs);
        launch_bwd_rows<decltype(tpr)::value, decltype(cpt)::value, true>(e, dy, x, w, rstd, dx, dw, beta, R, rr);
      }))
    return;
  Tensor g = dy;  // the composition: RoPE^-1 on a copy of dy
  if (rope) {
    g = e.alloc(dy.dtype, dy.shape);
    convert(e, g, dy);
    cuda::rope(e, g.reshape({R / rope->heads, rope->heads, D}), rope->pos, rope->inv_freq, true);
  }
  if (x.dtype == DType::BF16)
    launch_backward<bf16>(e, g, x, w, rstd, dx, dw, beta, R, static_cast<int>(D));
  else if (x.dtype == DType::F32)
    launch_backward<float>(e, g, x, w, rstd, dx, dw, beta, R, static_cast<int>(D));
  else
    DFLASH_FAIL("rmsnorm_backward (cuda): dtype ", dtype_name(x.dtype), " (BF16 or F32)");
}

}  // namespace dflash::cuda
