// cuda/attention_tc.cu — the attention kernels on tensor cores (mma.sync m16n8k16: bf16 operands, fp32
// accumulation) for head dim 64, for 128 where the Hopper kernels of attention_wgmma.cu do not apply (a lower
// shared-memory limit, Tq > 65536, a causal window) and, forward only, for 256 (the hybrid targets; on the H200 their
// unwindowed causal forward runs on attention_wgmma.cu's k_fwd_wg<256>, this one in the emulator, with a window, and
// with DFLASH_ATTN_WGMMA=0): the forward
// shared by attention_causal and dflash_attention (the two-segment visibility rule of attention.h), and DFlash
// attention's backward. Same math, masks and outputs as the CUDA-core kernels of attention_fwd.cu /
// dflash_attention.cu, which still run for other head dims, the backward at 256, and under a shared-memory cap too
// small for these tiles (case C07). The kernel emulator runs the forward (mma.sync / ldmatrix from their fragment
// layouts, cp.async as a plain copy); the backward's named barriers it does not have, so there the CUDA-core
// backward runs.
//
// FlashAttention-2 (Dao 2023) structure, written for this project's masks:
//  * forward (k_fwd_tc): a CTA = 4 warps = 64 query rows ((query, head) pairs of one kv head, as attention_fwd.cu);
//    a warp owns 16 rows, holds Q as mma A-fragments in registers, and walks 64-key tiles (32 at head dim 256:
//    fwd_keys) staged in shared memory by cp.async (double buffered: tile t+1 loads while tile t is computed).
//    S = Q K^T, online softmax in the log2 domain (exp2), O += P V with P rounded to bf16 as the mma's A operand.
//    A warp skips the math of a tile none of its rows can see.
//  * dQ (k_dq_tc): the forward's tiling with 32-key tiles; P = exp(S - lse) from the saved lse, dP = dO V^T,
//    dS = P (dP - D), dQ += dS K (dS rounded to bf16), dQ *= scale at the end.
//  * dK/dV (k_dkv_tc): a CTA of 8 warps owns 64 keys of one kv head (context tiles, then block-key tiles); two
//    groups of 4 warps (16 keys per warp) split the heads of the kv group and walk the chunks of 32 queries that
//    can see the tile (a context tile: the queries whose valid block has a_j > the tile's first key; a block-key
//    tile: the queries of the blocks owning those keys). S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T,
//    dS^T = P^T (dP^T - D), dK += dS^T Q; the groups' sums are added in a fixed order and dK *= scale.
//    Deterministic: no atomics; every gradient element is written once.
// Fragment layouts are PTX ISA's for mma.m16n8k16 (.row.col) and ldmatrix (.x4, .trans): lane l holds, of an
// accumulator tile, rows l/4 and l/4 + 8 and columns 2 (l%4) + {0, 1}.
// Error of the bf16 rounding of P and dS (what flex_attention and FlashAttention do too): a relative 2^-9 per term
// of the second product; tests/cuda compares these outputs by normalised mean square error for that reason.
#include <algorithm>
#include <climits>
#include <initializer_list>
#include <string>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/mma_sync.cuh"

namespace dflash::cuda {

namespace {

constexpr int kTcThreads = 128;  // 4 warps
constexpr int kTcRows = 64;      // query rows per CTA (forward, dQ)
constexpr int kFwdKeys = 64;     // keys per tile (forward)
constexpr int kDqKeys = 32;      // keys per tile (dQ: more accumulators live)
constexpr int kDkvKeys = 64;     // keys per CTA (dK/dV)
constexpr int kDkvQ = 32;        // query rows per chunk (dK/dV)
constexpr size_t kStaticSmemSlack = 1024;  // bytes of static __shared__ per kernel, at most
constexpr float kLog2e = 1.4426950408889634f;
// Head dim 256 (the hybrid targets' gated attention, Qwen3-Next / Qwen3.5: 16 or 32 query heads on 2 or 4 kv heads)
// keeps the CTA of 4 warps x 16 rows with Q in registers and halves the key tile to 32. Per thread: Q fragments 64
// registers (16 k-steps x 4), O 128 (32 column tiles x 4), S 16 (4 x 4) instead of 32: ptxas fits it in 255 with no
// spill (64-key tiles spilled 96 / 156 bytes). Shared memory (64 + 2 stages x 2 x 32) x 264 x 2 = 99 KiB, so two
// CTAs (8 warps, 2 x 128 x 256 registers: the whole file) share an SM, as at 64 / 128; 64-key tiles took 165 KiB
// (one CTA, 4 warps: nothing hides the softmax's latency). Not chosen: Q reloaded from shared memory at each k-step
// (FlashAttention-2's hd256 layout, 64-key S in the freed registers): one more ldmatrix per 4 B loads of
// S = Q K^T, +12% shared-memory traffic in a loop bound by it; D split in two halves over two warps: each half needs
// all of S, so Q K^T is computed twice (or S goes through shared memory).
// On the cards with 99 KiB of shared memory per block (compute capability 8.6, 8.9) the 32-key tiles do not fit beside
// the kernel's 16 static bytes: there head dim 256 takes 16-key tiles (66 KiB), kFwdKeys256Small.
constexpr int fwd_keys(int D) { return D == 256 ? 32 : kFwdKeys; }
constexpr int kFwdKeys256Small = 16;

using mma::mma16816;  // backend/cuda/mma_sync.cuh: mma.sync, ldmatrix and the fragment loads of a tile
using mma::pack_bf16;
template <int LDS>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int row0, int c0, int lane) {
  mma::load_a(a, tile, LDS, row0, c0, lane);
}
template <int LDS>
__device__ __forceinline__ void load_bt(uint32_t (&r)[4], const bf16* tile, int n0, int c0, int lane) {
  mma::load_bt(r, tile, LDS, n0, c0, lane);
}
template <int LDS>
__device__ __forceinline__ void load_b(uint32_t (&r)[4], const bf16* tile, int k0, int n0, int lane) {
  mma::load_b(r, tile, LDS, k0, n0, lane);
}

// Copies rows [0, nrows) x D of a tile whose row r lives at src + off(r) (or is zero when off(r) < 0).
// t / nthreads: this thread's index among the threads sharing the copy.
template <int D, int LDS, class Off>
__device__ __forceinline__ void stage_rows(bf16* dst, const bf16* src, int nrows, Off off, int t = threadIdx.x,
                                           int nthreads = kTcThreads) {
  constexpr int CH = D / 8;
  for (int c = t; c < nrows * CH; c += nthreads) {
    const int r = c / CH, col = (c % CH) * 8;
    const int64_t o = off(r);
    cp_async16(smem_u32(dst + r * LDS + col), o >= 0 ? src + o + col : src, o >= 0);
  }
}

// ---- forward ---------------------------------------------------------------------------------------------------
// WIN: compiled for a sliding-window layer; false = full attention, with no window arithmetic in the loops.
// KT: keys per tile (fwd_keys(D), or kFwdKeys256Small at head dim 256 under 99 KiB).
template <int D, bool WIN, int KT = fwd_keys(D)>
__global__ void __launch_bounds__(kTcThreads) k_fwd_tc(AttnFwdParams p) {
  constexpr int LDS = D + 8, NT = KT / 8, DT = D / 8;
  DFLASH_DYN_SMEM(smem);
  __shared__ int sExt[4];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [64][LDS]
  bf16* sK = sQ + kTcRows * LDS;              // [2][KT][LDS]
  bf16* sV = sK + 2 * KT * LDS;               // [2][KT][LDS]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, t4 = lane & 3;
  const int nh = p.nh, nkv = p.nkv, mq = p.mq, hc = p.hc, rep = nh / nkv, splits = rep / hc;
  // head dim 256: query tiles in reverse order, so that a causal prefill's tiles with the most keys start first and
  // the short ones fill the last wave (about 3 waves of 2 CTAs per SM at 3072 tokens; not measured)
  const unsigned qt = D == 256 ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int g = blockIdx.y / splits, h0 = g * rep + (blockIdx.y % splits) * hc, q0 = qt * mq;
  const bf16* Q = static_cast<const bf16*>(p.q);

  int lo1[2], hi1[2], lo2[2], hi2[2];
  bool rok[2];
  int64_t orow[2];
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + (lane >> 2) + 8 * i, hh = r / mq, qi = q0 + r % mq;
    rok[i] = hh < hc && qi < p.Tq;
    orow[i] = (static_cast<int64_t>(qi) * nh + h0 + hh) * D;
    if (rok[i])
      attn_row_bounds(p.mode, qi, p.q_offset, p.T1, p.B, WIN ? p.window : 0, p.anchors, p.valid, p.err, lo1[i], hi1[i],
                 lo2[i], hi2[i]);
    else
      lo1[i] = hi1[i] = lo2[i] = hi2[i] = 0;
  }
  if (tid == 0) {
    sExt[0] = 0;
    sExt[1] = INT_MAX;
    sExt[2] = 0;
    sExt[3] = INT_MAX;
  }
  stage_rows<D, LDS>(sQ, Q, kTcRows, [&](int r) -> int64_t {
    const int hh = r / mq, qi = q0 + r % mq;
    return hh < hc && qi < p.Tq ? (static_cast<int64_t>(qi) * nh + h0 + hh) * D : -1;
  });
  cp_async_commit();
  __syncthreads();
  if (t4 == 0)
    DFLASH_UNROLL
    for (int i = 0; i < 2; ++i) {
      if (!WIN || hi1[i] > lo1[i]) {
        atomicMax(&sExt[0], hi1[i]);
        if (WIN) atomicMin(&sExt[3], lo1[i]);
      }
      if (hi2[i] > lo2[i]) {
        atomicMin(&sExt[1], lo2[i]);
        atomicMax(&sExt[2], hi2[i]);
      }
    }
  __syncthreads();
  // segment 1 tiles cover [elo1, ext1), segment 2 tiles [elo, ehi)
  const int ext1 = sExt[0], elo1 = WIN && ext1 > 0 ? sExt[3] : 0, ehi = sExt[2], elo = ehi > 0 ? sExt[1] : 0;
  const int nt1 = (ext1 - elo1 + KT - 1) / KT, nt = nt1 + (ehi - elo + KT - 1) / KT;
  auto load_tile = [&](int t, int buf) {
    const bool s1 = t < nt1;
    const int kt = s1 ? elo1 + t * KT : elo + (t - nt1) * KT, khi = s1 ? ext1 : ehi;
    const bf16* Kp = static_cast<const bf16*>(s1 ? p.k1 : p.k2);
    const bf16* Vp = static_cast<const bf16*>(s1 ? p.v1 : p.v2);
    auto off = [&](int r) -> int64_t {
      return kt + r < khi ? (static_cast<int64_t>(kt + r) * nkv + g) * D : -1;
    };
    stage_rows<D, LDS>(sK + buf * KT * LDS, Kp, KT, off);
    stage_rows<D, LDS>(sV + buf * KT * LDS, Vp, KT, off);
  };
  if (nt > 0) load_tile(0, 0);
  cp_async_commit();
  cp_async_wait<1>();  // Q
  __syncthreads();
  uint32_t qf[D / 16][4];
  DFLASH_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) load_a<LDS>(qf[kk], sQ, warp * 16, kk * 16, lane);

  float o[DT][4];
  DFLASH_UNROLL
  for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float sl2 = p.scale * kLog2e;

  for (int t = 0; t < nt; ++t) {
    const int buf = t & 1;
    if (t + 1 < nt) load_tile(t + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bool s1 = t < nt1;
    const int kt = s1 ? elo1 + t * KT : elo + (t - nt1) * KT;
    bool mine = false;
    DFLASH_UNROLL
    for (int i = 0; i < 2; ++i)
      mine |= s1 ? (hi1[i] > kt && (!WIN || (hi1[i] > lo1[i] && lo1[i] < kt + KT)))
                 : (hi2[i] > lo2[i] && lo2[i] < kt + KT && hi2[i] > kt);
    if (__any_sync(0xffffffffu, mine)) {
      const bf16* tK = sK + buf * KT * LDS;
      const bf16* tV = sV + buf * KT * LDS;
      float s[NT][4];
      DFLASH_UNROLL
      for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      DFLASH_UNROLL
      for (int kk = 0; kk < D / 16; ++kk)
        DFLASH_UNROLL
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b[4];
          load_bt<LDS>(b, tK, np * 16, kk * 16, lane);
          mma16816(s[2 * np], qf[kk], b[0], b[1]);
          mma16816(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
      float mx[2] = {-INFINITY, -INFINITY};
      DFLASH_UNROLL
      for (int n = 0; n < NT; ++n)
        DFLASH_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1, key = kt + n * 8 + 2 * t4 + (e & 1);
          const bool vis = s1 ? ((!WIN || key >= lo1[i]) && key < hi1[i]) : (key >= lo2[i] && key < hi2[i]);
          const float v = vis ? s[n][e] * sl2 : -INFINITY;
          s[n][e] = v;
          mx[i] = fmaxf(mx[i], v);
        }
      float alpha[2], mref[2], rs[2] = {0.f, 0.f};
      DFLASH_UNROLL
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mn = fmaxf(m[i], mx[i]);
        mref[i] = mn == -INFINITY ? 0.f : mn;  // no -inf - -inf while a row has seen nothing
        alpha[i] = exp2f(m[i] - mref[i]);
        m[i] = mn;
      }
      DFLASH_UNROLL
      for (int n = 0; n < NT; ++n)
        DFLASH_UNROLL
        for (int e = 0; e < 4; ++e) {
          const float pv = exp2f(s[n][e] - mref[e >> 1]);
          s[n][e] = pv;
          rs[e >> 1] += pv;
        }
      l[0] = l[0] * alpha[0] + rs[0];
      l[1] = l[1] * alpha[1] + rs[1];
      DFLASH_UNROLL
      for (int n = 0; n < DT; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
      DFLASH_UNROLL
      for (int kc = 0; kc < KT / 16; ++kc) {
        const uint32_t a[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                               pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                               pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
        DFLASH_UNROLL
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          load_b<LDS>(b, tV, kc * 16, dp * 16, lane);
          mma16816(o[2 * dp], a, b[0], b[1]);
          mma16816(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }
  attn_fwd_store<DT>(p, D, rok, orow, l, m, t4, [&](int n, int k) { return o[n][k]; });
}

#ifndef DFLASH_CUDA_EMU  // (the emulator runs the forward only: see the end of the file)

// ---- backward: dQ ----------------------------------------------------------------------------------------------
template <int D, bool WIN>
__global__ void __launch_bounds__(kTcThreads) k_dq_tc(AttnBwdParams p) {
  constexpr int LDS = D + 8, KT = kDqKeys, NT = KT / 8, DT = D / 8;
  DFLASH_DYN_SMEM(smem);
  __shared__ int sExt[4];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [64][LDS]
  bf16* sdO = sQ + kTcRows * LDS;             // [64][LDS]
  bf16* sK = sdO + kTcRows * LDS;             // [2][KT][LDS]
  bf16* sV = sK + 2 * KT * LDS;               // [2][KT][LDS]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, t4 = lane & 3;
  const int nh = p.nh, nkv = p.nkv, mq = p.mq, hc = p.hc, rep = nh / nkv, splits = rep / hc;
  const int g = blockIdx.y / splits, h0 = g * rep + (blockIdx.y % splits) * hc, q0 = blockIdx.x * mq;

  int lo1[2], hi1[2], lo2[2], hi2[2];
  bool rok[2];
  int64_t orow[2];
  float lse2[2], Dr[2];
  attn_dq_rows<WIN>(p, warp * 16 + (lane >> 2), q0, mq, hc, h0, D, rok, orow, lo1, hi1, lo2, hi2, lse2, Dr);
  if (tid == 0) {
    sExt[0] = 0;
    sExt[1] = INT_MAX;
    sExt[2] = 0;
    sExt[3] = INT_MAX;
  }
  auto qoff = [&](int r) -> int64_t {
    const int hh = r / mq, qi = q0 + r % mq;
    return hh < hc && qi < p.Tq ? (static_cast<int64_t>(qi) * nh + h0 + hh) * D : -1;
  };
  stage_rows<D, LDS>(sQ, p.q, kTcRows, qoff);
  stage_rows<D, LDS>(sdO, p.dout, kTcRows, qoff);
  cp_async_commit();
  __syncthreads();
  if (t4 == 0)
    DFLASH_UNROLL
    for (int i = 0; i < 2; ++i) {
      if (!WIN || hi1[i] > lo1[i]) {
        atomicMax(&sExt[0], hi1[i]);
        if (WIN) atomicMin(&sExt[3], lo1[i]);
      }
      if (hi2[i] > lo2[i]) {
        atomicMin(&sExt[1], lo2[i]);
        atomicMax(&sExt[2], hi2[i]);
      }
    }
  __syncthreads();
  // segment 1 tiles cover [elo1, ext1), segment 2 tiles [elo, ehi)
  const int ext1 = sExt[0], elo1 = WIN && ext1 > 0 ? sExt[3] : 0, ehi = sExt[2], elo = ehi > 0 ? sExt[1] : 0;
  const int nt1 = (ext1 - elo1 + KT - 1) / KT, nt = nt1 + (ehi - elo + KT - 1) / KT;
  auto load_tile = [&](int t, int buf) {
    const bool s1 = t < nt1;
    const int kt = s1 ? elo1 + t * KT : elo + (t - nt1) * KT, khi = s1 ? ext1 : ehi;
    auto off = [&](int r) -> int64_t {
      return kt + r < khi ? (static_cast<int64_t>(kt + r) * nkv + g) * D : -1;
    };
    stage_rows<D, LDS>(sK + buf * KT * LDS, s1 ? p.k1 : p.k2, KT, off);
    stage_rows<D, LDS>(sV + buf * KT * LDS, s1 ? p.v1 : p.v2, KT, off);
  };
  if (nt > 0) load_tile(0, 0);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  uint32_t qf[D / 16][4], of[D / 16][4];
  DFLASH_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) {
    load_a<LDS>(qf[kk], sQ, warp * 16, kk * 16, lane);
    load_a<LDS>(of[kk], sdO, warp * 16, kk * 16, lane);
  }
  float dq[DT][4];
  DFLASH_UNROLL
  for (int n = 0; n < DT; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  const float sl2 = p.scale * kLog2e;

  for (int t = 0; t < nt; ++t) {
    const int buf = t & 1;
    if (t + 1 < nt) load_tile(t + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bool s1 = t < nt1;
    const int kt = s1 ? elo1 + t * KT : elo + (t - nt1) * KT;
    bool mine = false;
    DFLASH_UNROLL
    for (int i = 0; i < 2; ++i)
      mine |= s1 ? (hi1[i] > kt && (!WIN || (hi1[i] > lo1[i] && lo1[i] < kt + KT)))
                 : (hi2[i] > lo2[i] && lo2[i] < kt + KT && hi2[i] > kt);
    if (__any_sync(0xffffffffu, mine)) {
      const bf16* tK = sK + buf * KT * LDS;
      const bf16* tV = sV + buf * KT * LDS;
      float s[NT][4], dp[NT][4];
      DFLASH_UNROLL
      for (int n = 0; n < NT; ++n)
        DFLASH_UNROLL
        for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
      DFLASH_UNROLL
      for (int kk = 0; kk < D / 16; ++kk)
        DFLASH_UNROLL
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b[4];
          load_bt<LDS>(b, tK, np * 16, kk * 16, lane);
          mma16816(s[2 * np], qf[kk], b[0], b[1]);
          mma16816(s[2 * np + 1], qf[kk], b[2], b[3]);
          load_bt<LDS>(b, tV, np * 16, kk * 16, lane);
          mma16816(dp[2 * np], of[kk], b[0], b[1]);
          mma16816(dp[2 * np + 1], of[kk], b[2], b[3]);
        }
      DFLASH_UNROLL
      for (int n = 0; n < NT; ++n)
        DFLASH_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1, key = kt + n * 8 + 2 * t4 + (e & 1);
          const bool vis = s1 ? ((!WIN || key >= lo1[i]) && key < hi1[i]) : (key >= lo2[i] && key < hi2[i]);
          const float pv = vis ? exp2f(s[n][e] * sl2 - lse2[i]) : 0.f;
          s[n][e] = pv * (dp[n][e] - Dr[i]);  // dS
        }
      DFLASH_UNROLL
      for (int kc = 0; kc < KT / 16; ++kc) {
        const uint32_t a[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                               pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                               pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
        DFLASH_UNROLL
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t b[4];
          load_b<LDS>(b, tK, kc * 16, dn * 16, lane);
          mma16816(dq[2 * dn], a, b[0], b[1]);
          mma16816(dq[2 * dn + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    if (!rok[i]) continue;
    DFLASH_UNROLL
    for (int n = 0; n < DT; ++n)
      *reinterpret_cast<__nv_bfloat162*>(p.dq + orow[i] + n * 8 + 2 * t4) =
          __floats2bfloat162_rn(dq[n][2 * i] * p.scale, dq[n][2 * i + 1] * p.scale);
  }
}

// ---- backward: dK, dV ------------------------------------------------------------------------------------------
// 256 threads = two groups of 4 warps over the same 64 keys: group w takes the heads h = w, w + 2, ... of the kv
// group, each with its own Q / dO staging and group-local barriers (bar.sync 1 + w), so one group computes while
// the other waits for its loads; at the end group 1 hands its dK / dV to group 0 through shared memory, which adds
// them in a fixed order (deterministic) and writes.
constexpr int kDkvThreads = 256;
__device__ __forceinline__ void group_sync(int group) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + group), "r"(kTcThreads));
}

template <int D, bool WIN>
__global__ void __launch_bounds__(kDkvThreads) k_dkv_tc(AttnBwdParams p) {
  constexpr int LDS = D + 8, QC = kDkvQ, NT = QC / 8, DT = D / 8;
  DFLASH_DYN_SMEM(smem);
  __shared__ float sL[2][QC], sD[2][QC];
  __shared__ int sVis[2][QC], sAny[2];
  bf16* sK = reinterpret_cast<bf16*>(smem);  // [64][LDS]
  bf16* sV = sK + kDkvKeys * LDS;             // [64][LDS]
  const int tid = threadIdx.x, grp = tid >> 7, gt = tid & 127, warp = gt >> 5, lane = tid & 31, t4 = lane & 3;
  bf16* sQ = sV + kDkvKeys * LDS + grp * 2 * QC * LDS;  // [QC][LDS] per group
  bf16* sdO = sQ + QC * LDS;                             // [QC][LDS] per group
  // grid (kv heads, tiles): consecutive CTAs are the kv heads of one tile, and the first tiles (context keys near
  // 0, seen by nearly every query: the longest CTAs) are scheduled first
  const int nh = p.nh, nkv = p.nkv, rep = nh / nkv, g = blockIdx.x, tile = blockIdx.y, B = p.B;
  const int nt1 = (p.T1 + kDkvKeys - 1) / kDkvKeys;
  const bool s1 = tile < nt1;
  const int k0 = s1 ? tile * kDkvKeys : (tile - nt1) * kDkvKeys, klim = s1 ? p.T1 : p.T2;
  const bf16* Kp = s1 ? p.k1 : p.k2;
  const bf16* Vp = s1 ? p.v1 : p.v2;
  bf16* dK = s1 ? p.dk1 : p.dk2;
  bf16* dV = s1 ? p.dv1 : p.dv2;
  auto koff = [&](int r) -> int64_t {
    return k0 + r < klim ? (static_cast<int64_t>(k0 + r) * nkv + g) * D : -1;
  };
  stage_rows<D, LDS>(sK, Kp, kDkvKeys, koff, tid, kDkvThreads);
  stage_rows<D, LDS>(sV, Vp, kDkvKeys, koff, tid, kDkvThreads);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // queries that may see this tile: context keys -> every query (chunks are skipped below); block keys -> the
  // queries of the blocks owning keys k0 .. min(k0 + 64, klim) - 1
  int q_lo = 0, q_hi = p.Tq;
  if (!s1) {
    q_lo = (k0 / B) * B;
    q_hi = min(p.Tq, ((min(k0 + kDkvKeys, klim) - 1) / B + 1) * B);
  }
  float dk[DT][4], dv[DT][4];
  DFLASH_UNROLL
  for (int n = 0; n < DT; ++n)
    DFLASH_UNROLL
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  const float sl2 = p.scale * kLog2e;
  const int krow0 = k0 + warp * 16 + (lane >> 2);  // this thread's keys: krow0 and krow0 + 8

  if (grp < rep) {  // (a group with no head left idles until the final exchange)
    for (int c0 = q_lo; c0 < q_hi; c0 += QC) {
      if (warp == 0) {  // QC == 32: one lane per query of the chunk
        int vis_code = -1;  // context tile: a_j of the query's valid block; block tile: its block index
        bool any = false;
        const int q = c0 + lane;
        if (q < q_hi) {
          const int j = q / B;
          if (p.valid[j]) {
            int a = p.anchors[j];
            a = a < 0 ? 0 : (a > p.T1 ? p.T1 : a);
            vis_code = s1 ? a : j;
            // a context tile: some key of [k0, k0 + 64) in [lo1, a_j) (dflash_row_bounds: lo1 = 0 without a window)
            const int lo1 = WIN ? min(max(0, a + q % B - (p.window - 1)), a) : 0;
            any = s1 ? (a > k0 && lo1 < k0 + kDkvKeys) : true;
          }
        }
        sVis[grp][lane] = vis_code;
        any = __any_sync(0xffffffffu, any);
        if (lane == 0) sAny[grp] = any;
      }
      group_sync(grp);
      const bool skip = !sAny[grp];
      group_sync(grp);  // sAny is rewritten by the next chunk
      if (skip) continue;
      for (int hh = grp; hh < rep; hh += 2) {
        const int h = g * rep + hh;
        auto qoff = [&](int r) -> int64_t {
          const int q = c0 + r;
          return q < q_hi ? (static_cast<int64_t>(q) * nh + h) * D : -1;
        };
        stage_rows<D, LDS>(sQ, p.q, QC, qoff, gt, kTcThreads);
        stage_rows<D, LDS>(sdO, p.dout, QC, qoff, gt, kTcThreads);
        cp_async_commit();
        if (gt < QC) {
          const int q = c0 + gt;
          const bool ok = q < q_hi && sVis[grp][gt] >= 0;
          sL[grp][gt] = ok ? p.lse[static_cast<int64_t>(q) * nh + h] * kLog2e : 0.f;
          sD[grp][gt] = ok ? p.Dr[static_cast<int64_t>(q) * nh + h] : 0.f;
        }
        cp_async_wait<0>();
        group_sync(grp);
        float s[NT][4], dp[NT][4];
        DFLASH_UNROLL
        for (int n = 0; n < NT; ++n)
          DFLASH_UNROLL
          for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
        DFLASH_UNROLL
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t ka[4], va[4];
          load_a<LDS>(ka, sK, warp * 16, kk * 16, lane);
          load_a<LDS>(va, sV, warp * 16, kk * 16, lane);
          DFLASH_UNROLL
          for (int np = 0; np < NT / 2; ++np) {
            uint32_t b[4];
            load_bt<LDS>(b, sQ, np * 16, kk * 16, lane);
            mma16816(s[2 * np], ka, b[0], b[1]);
            mma16816(s[2 * np + 1], ka, b[2], b[3]);
            load_bt<LDS>(b, sdO, np * 16, kk * 16, lane);
            mma16816(dp[2 * np], va, b[0], b[1]);
            mma16816(dp[2 * np + 1], va, b[2], b[3]);
          }
        }
        DFLASH_UNROLL
        for (int n = 0; n < NT; ++n)
          DFLASH_UNROLL
          for (int e = 0; e < 4; ++e) {
            const int key = krow0 + 8 * (e >> 1), qc = n * 8 + 2 * t4 + (e & 1), code = sVis[grp][qc];
            // spec 2.3 as dflash_row_bounds: context keys [lo1, a_j), block keys of block j (a prefix with a
            // window); the query's slot is only computed in the sliding-window kernels
            bool vis = key < klim && (s1 ? key < code : (code >= 0 && key / B == code));
            if constexpr (WIN) {
              const int slot = (c0 + qc) % B;
              vis = vis && (s1 ? key >= code + slot - (p.window - 1) : key % B <= slot);
            }
            const float pv = vis ? exp2f(s[n][e] * sl2 - sL[grp][qc]) : 0.f;
            s[n][e] = pv;                                // P^T
            dp[n][e] = pv * (dp[n][e] - sD[grp][qc]);  // dS^T
          }
        DFLASH_UNROLL
        for (int kc = 0; kc < QC / 16; ++kc) {
          const uint32_t pa[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                                  pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                  pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
          const uint32_t da[4] = {pack_bf16(dp[2 * kc][0], dp[2 * kc][1]), pack_bf16(dp[2 * kc][2], dp[2 * kc][3]),
                                  pack_bf16(dp[2 * kc + 1][0], dp[2 * kc + 1][1]),
                                  pack_bf16(dp[2 * kc + 1][2], dp[2 * kc + 1][3])};
          DFLASH_UNROLL
          for (int dn = 0; dn < D / 16; ++dn) {
            uint32_t b[4];
            load_b<LDS>(b, sdO, kc * 16, dn * 16, lane);
            mma16816(dv[2 * dn], pa, b[0], b[1]);
            mma16816(dv[2 * dn + 1], pa, b[2], b[3]);
            load_b<LDS>(b, sQ, kc * 16, dn * 16, lane);
            mma16816(dk[2 * dn], da, b[0], b[1]);
            mma16816(dk[2 * dn + 1], da, b[2], b[3]);
          }
        }
        group_sync(grp);  // this group's sQ / sdO / sL / sD are restaged for its next head
      }
    }
  }
  // group 1 -> shared memory (fp32, [64 keys][D] for dK then dV, over the K/V/Q staging) -> group 0 adds and writes
  __syncthreads();
  float* xk = reinterpret_cast<float*>(smem);
  float* xv = xk + kDkvKeys * D;
  if (grp == 1) {
    DFLASH_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int kr = warp * 16 + (lane >> 2) + 8 * i;
      DFLASH_UNROLL
      for (int n = 0; n < DT; ++n) {
        xk[kr * D + n * 8 + 2 * t4] = dk[n][2 * i];
        xk[kr * D + n * 8 + 2 * t4 + 1] = dk[n][2 * i + 1];
        xv[kr * D + n * 8 + 2 * t4] = dv[n][2 * i];
        xv[kr * D + n * 8 + 2 * t4 + 1] = dv[n][2 * i + 1];
      }
    }
  }
  __syncthreads();
  if (grp == 0) {
    DFLASH_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int kr = warp * 16 + (lane >> 2) + 8 * i, key = k0 + kr;
      if (key >= klim) continue;
      const int64_t off = (static_cast<int64_t>(key) * nkv + g) * D;
      DFLASH_UNROLL
      for (int n = 0; n < DT; ++n) {
        const int c = n * 8 + 2 * t4;
        *reinterpret_cast<__nv_bfloat162*>(dK + off + c) = __floats2bfloat162_rn(
            (dk[n][2 * i] + xk[kr * D + c]) * p.scale, (dk[n][2 * i + 1] + xk[kr * D + c + 1]) * p.scale);
        *reinterpret_cast<__nv_bfloat162*>(dV + off + c) =
            __floats2bfloat162_rn(dv[n][2 * i] + xv[kr * D + c], dv[n][2 * i + 1] + xv[kr * D + c + 1]);
      }
    }
  }
}

#endif  // DFLASH_CUDA_EMU

}  // namespace

size_t attn_tc_fwd_smem(int D, int keys) {
  return static_cast<size_t>(kTcRows + 4 * (keys > 0 ? keys : fwd_keys(D))) * (D + 8) * 2;
}
size_t attn_tc_dq_smem(int D) { return static_cast<size_t>(2 * kTcRows + 4 * kDqKeys) * (D + 8) * 2; }
size_t attn_tc_dkv_smem(int D) {  // K, V and two groups' Q, dO; also holds the final fp32 exchange (2 x 64 x D)
  return std::max(static_cast<size_t>(2 * kDkvKeys + 4 * kDkvQ) * (D + 8) * 2, size_t{2} * kDkvKeys * D * 4);
}

#ifndef DFLASH_CUDA_EMU
void attention_tc_init_attributes(int smem_optin) {
  allow_dynamic_smem(smem_optin, k_fwd_tc<64, false>, k_fwd_tc<128, false>, k_dq_tc<64, false>, k_dq_tc<128, false>,
                     k_dkv_tc<64, false>, k_dkv_tc<128, false>, k_fwd_tc<64, true>, k_fwd_tc<128, true>,
                     k_dq_tc<64, true>, k_dq_tc<128, true>, k_dkv_tc<64, true>, k_dkv_tc<128, true>,
                     k_fwd_tc<256, false>, k_fwd_tc<256, true>, k_fwd_tc<256, false, kFwdKeys256Small>,
                     k_fwd_tc<256, true, kFwdKeys256Small>);
}
#else
void attention_tc_init_attributes(int) {}
#endif

bool launch_attention_forward_tc(Env& e, const AttnFwdParams& p0) {
  if (p0.d != 64 && p0.d != 128 && p0.d != 256) return false;
  int keys = fwd_keys(p0.d);
  if (p0.d == 256 && attn_tc_fwd_smem(256, keys) + kStaticSmemSlack > static_cast<size_t>(e.smem_limit))
    keys = kFwdKeys256Small;  // (99 KiB per block: compute capability 8.6, 8.9)
  const size_t smem = attn_tc_fwd_smem(p0.d, keys);
  if (smem + kStaticSmemSlack > static_cast<size_t>(e.smem_limit)) return false;
  if (!aligned16(p0.q) || !aligned16(p0.k1) || !aligned16(p0.v1) || !aligned16(p0.out)) return false;
  if (p0.k2 && (!aligned16(p0.k2) || !aligned16(p0.v2))) return false;
  AttnFwdParams p = p0;
  attn_rows_tiling(p.nh, p.nkv, kTcRows, p.hc, p.mq);
  p.nk = keys;
  const int64_t gy = static_cast<int64_t>(p.nkv) * (p.nh / p.nkv / p.hc);
  DFLASH_CHECK(gy <= 65535, "attention (cuda): too many heads (", p.nh, ")");
  const dim3 grid(static_cast<unsigned>((p.Tq + p.mq - 1) / p.mq), static_cast<unsigned>(gy));
  auto launch = [&](auto kernel) { DFLASH_LAUNCH(grid, kTcThreads, smem, e.stream, kernel)(p); };
  const bool win = p.window > 0;
  if (p.d == 64)
    win ? launch(k_fwd_tc<64, true>) : launch(k_fwd_tc<64, false>);
  else if (p.d == 128)
    win ? launch(k_fwd_tc<128, true>) : launch(k_fwd_tc<128, false>);
  else if (keys == kFwdKeys256Small)  // the hybrid targets' gated attention (Qwen3-Next, Qwen3.5: head_dim 256)
    win ? launch(k_fwd_tc<256, true, kFwdKeys256Small>) : launch(k_fwd_tc<256, false, kFwdKeys256Small>);
  else
    win ? launch(k_fwd_tc<256, true>) : launch(k_fwd_tc<256, false>);
  check_launch("attention_forward_tc");
  return true;
}

namespace {
// "64, 128, 256" of the head dims whose kernel fits the shared-memory limit (smem(D) + slack bytes)
template <class F>
std::string dims_fitting(const Env& e, std::initializer_list<int> dims, F smem, size_t slack) {
  std::string s;
  for (int D : dims)
    if (smem(D) + slack <= static_cast<size_t>(e.smem_limit)) s += (s.empty() ? "" : ", ") + std::to_string(D);
  return s;
}
}  // namespace

std::string attention_forward_kernels(const Env& e) {
  std::string s;
  if (e.tier == KernelTier::Hopper && e.attn_wgmma) {
    const std::string wg = dims_fitting(e, {128, 256}, [](int D) { return attention_wgmma_fwd_smem(D); }, 0);
    if (!wg.empty()) s = "warpgroup MMA (head dim " + wg + "; no causal window, DFlash at 128), else ";
  }
  const std::string tc = dims_fitting(
      e, {64, 128, 256}, [](int D) { return attn_tc_fwd_smem(D, D == 256 ? kFwdKeys256Small : 0); }, kStaticSmemSlack);
  if (!tc.empty()) s += "mma.sync (head dim " + tc + "), else ";
  return s + "CUDA cores (other head dims)";
}

std::string dflash_backward_kernels(const Env& e) {
  std::string s;
  if (e.tier == KernelTier::Hopper && attention_wgmma_bwd_smem() <= static_cast<size_t>(e.smem_limit))
    s = "warpgroup MMA (head dim 128), else ";
#ifndef DFLASH_CUDA_EMU
  const std::string tc = dims_fitting(
      e, {64, 128}, [](int D) { return std::max(attn_tc_dq_smem(D), attn_tc_dkv_smem(D)); }, kStaticSmemSlack);
  if (!tc.empty()) s += "mma.sync (head dim " + tc + "), else ";
#endif
  return s + "CUDA cores";
}

#ifndef DFLASH_CUDA_EMU
bool launch_dflash_backward_tc(Env& e, const AttnBwdParams& p0) {
  if (p0.d != 64 && p0.d != 128) return false;
  const size_t smem_q = attn_tc_dq_smem(p0.d), smem_kv = attn_tc_dkv_smem(p0.d);
  if (std::max(smem_q, smem_kv) + kStaticSmemSlack > static_cast<size_t>(e.smem_limit)) return false;
  for (const void* ptr : {static_cast<const void*>(p0.q), static_cast<const void*>(p0.k1),
                          static_cast<const void*>(p0.v1), static_cast<const void*>(p0.k2),
                          static_cast<const void*>(p0.v2), static_cast<const void*>(p0.dout),
                          static_cast<const void*>(p0.dq), static_cast<const void*>(p0.dk1),
                          static_cast<const void*>(p0.dv1), static_cast<const void*>(p0.dk2),
                          static_cast<const void*>(p0.dv2)})
    if (!aligned16(ptr)) return false;
  if (launch_dflash_backward_wgmma(e, p0)) return true;  // Hopper warpgroup MMA (attention_wgmma.cu): head dim 128
  AttnBwdParams p = p0;
  attn_rows_tiling(p.nh, p.nkv, kTcRows, p.hc, p.mq);
  p.nk = kDqKeys;
  const int64_t gy = static_cast<int64_t>(p.nkv) * (p.nh / p.nkv / p.hc);
  DFLASH_CHECK(gy <= 65535, "dflash_attention_backward (cuda): too many heads (", p.nh, ")");
  const dim3 grid_q(static_cast<unsigned>((p.Tq + p.mq - 1) / p.mq), static_cast<unsigned>(gy));
  const int64_t tiles = (p.T1 + kDkvKeys - 1) / kDkvKeys + (p.T2 + kDkvKeys - 1) / kDkvKeys;
  DFLASH_CHECK(tiles <= 65535, "dflash_attention_backward (cuda): too many keys (", p.T1, " + ", p.T2, ")");
  const dim3 grid_kv(static_cast<unsigned>(p.nkv), static_cast<unsigned>(tiles));
  auto launch = [&](auto dq_kernel, auto dkv_kernel) {
    DFLASH_LAUNCH(grid_q, kTcThreads, smem_q, e.stream, dq_kernel)(p);
    check_launch("dflash_attention_dq_tc");
    if (tiles > 0) DFLASH_LAUNCH(grid_kv, kDkvThreads, smem_kv, e.stream, dkv_kernel)(p);
  };
  const bool win = p.window > 0;
  if (p.d == 64 && !win)
    launch(k_dq_tc<64, false>, k_dkv_tc<64, false>);
  else if (p.d == 64)
    launch(k_dq_tc<64, true>, k_dkv_tc<64, true>);
  else if (!win)
    launch(k_dq_tc<128, false>, k_dkv_tc<128, false>);
  else
    launch(k_dq_tc<128, true>, k_dkv_tc<128, true>);
  check_launch("dflash_attention_dkv_tc");
  return true;
}

#else  // DFLASH_CUDA_EMU: the backward's named barriers (group_sync) are not emulated; the CUDA-core kernels run

bool launch_dflash_backward_tc(Env&, const AttnBwdParams&) { return false; }

#endif

}  // namespace dflash::cuda
