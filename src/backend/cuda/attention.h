// backend/cuda/attention.h — the shared forward attention kernel's parameters and launcher (attention_fwd.cu),
// used by attention_causal.cu and dflash_attention.cu, and the tile-size rules of every attention kernel.
// defines: AttnFwdParams, launch_attention_forward, head_dim_bucket, attn_rows_per_cta, smem sizes
//
// The forward kernel computes, for each query row (query t, head h, kv head g = h / (nh/nkv)), the softmax
// attention over at most two key segments held in separate tensors:
//   segment 1: keys k1/v1 rows [lo1(row), hi1(row))             (causal keys / DFlash context prefix)
//   segment 2: keys k2/v2 rows [lo2(row), hi2(row))             (DFlash: the keys of the query's own block)
// (dflash_row_bounds below: lo1 = 0 and the whole block unless the layer has a sliding window).
// with FlashAttention-2's online softmax (Dao 2023) over key tiles staged in shared memory: never a Tq x Tk
// buffer. A row that sees no key outputs zeros and lse = -inf. Rows of one CTA are (query, head) pairs of one kv
// head, so GQA heads share each K/V tile.
#pragma once
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace dflash::cuda {

enum AttnMode : int { kAttnCausal = 0, kAttnDFlash = 1 };

struct AttnFwdParams {
  const void* q;   // [Tq, nh, d] BF16
  const void* k1;  // [T1, nkv, d] BF16
  const void* v1;
  const void* k2;  // [T2, nkv, d] BF16 or null (no segment 2)
  const void* v2;
  void* out;       // [Tq, nh, d] BF16
  float* lse;      // [Tq, nh] F32 or null
  int Tq, nh, nkv, d, T1, T2;
  int hc;          // query heads per CTA (a divisor of nh / nkv)
  int mq;          // queries per CTA (rows per CTA = mq * hc <= attn_rows_per_cta(D))
  int nk;          // keys per shared-memory tile
  float scale;
  int mode;        // AttnMode
  int q_offset;    // causal: query t sees keys [0, q_offset + t]
  const int* anchors;      // DFlash [N] (device)
  const unsigned char* valid;  // DFlash [N] (device)
  int B, N;                // DFlash block size and number of blocks (S = T1)
  int window;              // sliding window W (0 = full attention): DFlash spec 2.3; causal: keys p - W + 1 .. p
  const float* sinks;      // causal: [nh] F32 per-head sink logits in each row's denominator (gpt-oss), or null
  int* err;
};

// A batch of causal sequences in one launch (attention_causal_batch, the wgmma forward only): CTA z of the grid
// handles query rows [begin[z], begin[z] + len[z]) of q / out, at positions q_offset[z].., over keys k[z], v[z]
// ([tk[z], nkv, d] BF16, device pointers).
constexpr int kAttnMaxSegs = 32;
struct AttnSegs {
  int n = 0;  // 0: one sequence, the whole of AttnFwdParams
  int begin[kAttnMaxSegs], len[kAttnMaxSegs], q_offset[kAttnMaxSegs], tk[kAttnMaxSegs];
  const void* k[kAttnMaxSegs];
  const void* v[kAttnMaxSegs];
};

// DFlash attention backward (dflash_attention.cu, attention_tc.cu): inputs, the forward's lse, D = rowsum(dO * O)
// and the five gradients, all device pointers.
struct AttnBwdParams {
  const bf16 *q, *k1, *v1, *k2, *v2, *dout;
  const float* lse;  // [Tq, nh]
  const float* Dr;   // [Tq, nh]
  bf16 *dq, *dk1, *dv1, *dk2, *dv2;
  int Tq, nh, nkv, d, T1, T2;
  int hc, mq, nk;  // dQ kernel tiling
  int mc;          // dK/dV kernel: query rows per chunk
  float scale;
  const int* anchors;
  const unsigned char* valid;
  int B, N;
  int window;  // sliding window W, 0 = full attention
};

// The visibility of DFlash query row qi (block j = qi / B, slot i = qi % B) of spec 2.3, the one definition every
// attention kernel uses: context keys [lo1, hi1) with hi1 = a_j (strictly before the anchor) and, with a sliding
// window W > 0, lo1 = max(0, a_j + i - (W - 1)); block keys [lo2, hi2) = [j B, j B + B), or [j B, j B + i + 1)
// (causal in the block) with a window. A padding block sees nothing (all ranges empty). An anchor outside
// [0, T1] is clamped and flagged in *err (when err is not null).
__device__ __forceinline__ void dflash_row_bounds(int qi, int B, int T1, int window, const int* anchors,
                                                  const unsigned char* valid, int* err, int& lo1, int& hi1,
                                                  int& lo2, int& hi2) {
  lo1 = hi1 = lo2 = hi2 = 0;
  const int j = qi / B;
  if (!valid[j]) return;
  int a = anchors[j];
  if (a < 0 || a > T1) {
    if (err) atomicOr(err, kErrAnchor);
    a = a < 0 ? 0 : T1;
  }
  hi1 = a;
  lo2 = j * B;
  hi2 = lo2 + B;
  if (window > 0) {
    const int i = qi - lo2;
    lo1 = min(max(0, a + i - (window - 1)), a);
    hi2 = lo2 + i + 1;
  }
}

// Visibility of a query row for either mode: causal (segment 1 keys [0, q_offset + qi + 1)) or DFlash
// (dflash_row_bounds).
__device__ __forceinline__ void attn_row_bounds(int mode, int qi, int q_offset, int T1, int B, int window,
                                                const int* anchors, const unsigned char* valid, int* err, int& lo1,
                                                int& hi1, int& lo2, int& hi2) {
  if (mode == kAttnCausal) {
    lo2 = hi2 = 0;
    hi1 = min(q_offset + qi + 1, T1);
    lo1 = window > 0 ? max(0, q_offset + qi + 1 - window) : 0;
    return;
  }
  dflash_row_bounds(qi, B, T1, window, anchors, valid, err, lo1, hi1, lo2, hi2);
}

// hc / mq of a CTA of `rows` query rows: hc heads of one kv group (the largest divisor of nh / nkv up to rows)
// times mq = rows / hc queries; row r is (query q0 + r % mq, head h0 + r / mq), rows >= hc * mq are idle.
inline void attn_rows_tiling(int nh, int nkv, int rows, int& hc, int& mq) {
  const int rep = nh / nkv;
  hc = 1;
  for (int c = 1; c <= rep && c <= rows; ++c)
    if (rep % c == 0) hc = c;
  mq = rows / hc;
}
// The forward's row finish, shared by the tensor-core kernels (attention_tc.cu, attention_wgmma.cu): a thread's two
// rows i = 0, 1 (the m16n8 C layout: 4 lanes per row, lane quad index t4) get their row sums l summed over the quad,
// inv[i] = 1 / l (0 for a row that saw no key) and, for an existing row, lse = (m + log2 l) ln 2 at row orow[i] / D
// (m in the log2 domain; -inf for a row that saw no key). Every lane of the warp calls it (quad shuffles). With sinks
// (row orow / D = query * nh + head), l gains exp(s_head - m) in the log2 domain: exp2(s log2e - m), the sink's
// term of the denominator (a row that saw no key keeps inv = 0: HF's output is 0 there too).
__device__ __forceinline__ void attn_fwd_finish(const AttnFwdParams& p, int D, const bool (&rok)[2],
                                                const int64_t (&orow)[2], float (&l)[2], const float (&m)[2], int t4,
                                                float (&inv)[2]) {
  constexpr float kLn2f = 0.6931471805599453f;
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    if (p.sinks != nullptr && rok[i] && l[i] > 0.f)
      l[i] += exp2f(p.sinks[(orow[i] / D) % p.nh] * 1.4426950408889634f - m[i]);
    inv[i] = l[i] > 0.f ? 1.f / l[i] : 0.f;
    if (rok[i] && p.lse != nullptr && t4 == 0)
      p.lse[orow[i] / D] = l[i] > 0.f ? (m[i] + log2f(l[i])) * kLn2f : -INFINITY;
  }
}
// The mma.sync forward's epilogue (attention_tc.cu): attn_fwd_finish, then out = o / l as bf16 pairs straight from
// the fragments (acc(n, k) = accumulator element k of column tile n, k = 2 i, 2 i + 1) at element offset orow[i].
template <int DT, class Acc>
__device__ __forceinline__ void attn_fwd_store(const AttnFwdParams& p, int D, const bool (&rok)[2],
                                               const int64_t (&orow)[2], float (&l)[2], const float (&m)[2], int t4,
                                               Acc acc) {
  float inv[2];
  attn_fwd_finish(p, D, rok, orow, l, m, t4, inv);
  bf16* O = static_cast<bf16*>(p.out);
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    if (!rok[i]) continue;
    DFLASH_UNROLL
    for (int n = 0; n < DT; ++n)
      *reinterpret_cast<__nv_bfloat162*>(O + orow[i] + n * 8 + 2 * t4) =
          __floats2bfloat162_rn(acc(n, 2 * i) * inv[i], acc(n, 2 * i + 1) * inv[i]);
  }
}

// The dQ kernels' per-row set-up (attention_tc.cu, attention_wgmma.cu): a thread's rows r0 and r0 + 8 of its CTA are
// (query q0 + r % mq, head h0 + r / mq); rok = the row exists, orow = its element offset in q / dq, the key bounds of
// attn_row_bounds (DFlash), lse2 = the forward's lse in the log2 domain, Dr = rowsum(dO * O); zeros for idle rows.
template <bool WIN>
__device__ __forceinline__ void attn_dq_rows(const AttnBwdParams& p, int r0, int q0, int mq, int hc, int h0, int D,
                                             bool (&rok)[2], int64_t (&orow)[2], int (&lo1)[2], int (&hi1)[2],
                                             int (&lo2)[2], int (&hi2)[2], float (&lse2)[2], float (&Dr)[2]) {
  constexpr float kLog2ef = 1.4426950408889634f;
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int r = r0 + 8 * i, hh = r / mq, qi = q0 + r % mq;
    rok[i] = hh < hc && qi < p.Tq;
    orow[i] = (static_cast<int64_t>(qi) * p.nh + h0 + hh) * D;
    lo1[i] = hi1[i] = lo2[i] = hi2[i] = 0;
    lse2[i] = Dr[i] = 0.f;
    if (rok[i]) {
      attn_row_bounds(kAttnDFlash, qi, 0, p.T1, p.B, WIN ? p.window : 0, p.anchors, p.valid, nullptr, lo1[i], hi1[i],
                      lo2[i], hi2[i]);
      lse2[i] = p.lse[orow[i] / D] * kLog2ef;
      Dr[i] = p.Dr[orow[i] / D];
    }
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Head-dim bucket D (64, 128 or 256) the kernels are compiled for; any d <= D runs in bucket D. 0 if d > 256.
inline int head_dim_bucket(int d) { return d <= 64 ? 64 : (d <= 128 ? 128 : (d <= 256 ? 256 : 0)); }
// Query rows per CTA in the forward and dQ kernels: 32 fp32 accumulators per thread of 128 threads.
inline int attn_rows_per_cta(int D) { return 4096 / D; }
// Keys per CTA in the dK/dV kernel: 32 accumulators each for dK and dV per thread.
inline int attn_keys_per_cta(int D) { return 4096 / D; }
constexpr int kAttnThreads = 128;

size_t attn_fwd_smem(int D, int nk);
size_t attn_dq_smem(int D, int nk);
size_t attn_dkv_smem(int D, int mc);
// Largest key tile nk in {64, 32, 16} whose forward (dq) kernel fits smem_limit; 0 if none.
int choose_fwd_nk(int D, int smem_limit);
int choose_dq_nk(int D, int smem_limit);
// Largest query chunk mc in {64, 32, 16, 8} whose dK/dV kernel fits smem_limit; 0 if none.
int choose_dkv_mc(int D, int smem_limit);

// Picks hc / mq for the problem (p.nh, p.nkv) and head-dim bucket, chooses nk from e.smem_limit and launches.
// p.hc, p.mq, p.nk are filled in here.
void launch_attention_forward(Env& e, AttnFwdParams p);
// Sets the dynamic-shared-memory attribute of the backward kernels (dflash_attention.cu).
void dflash_backward_init_attributes(int smem_optin);

// Tensor-core versions (attention_tc.cu): run the op and return true when they apply (head dim exactly 64 or 128,
// or 256 for the forward; 16-byte aligned tensors, enough shared memory under e.smem_limit); return false, launching
// nothing, otherwise, and the CUDA-core kernels above run instead. The CPU emulator runs the forward; the backward
// returns false there.
bool launch_attention_forward_tc(Env& e, const AttnFwdParams& p);
bool launch_dflash_backward_tc(Env& e, const AttnBwdParams& p);
void attention_tc_init_attributes(int smem_optin);
// Hopper warpgroup-MMA forward (attention_wgmma.cu): head dim exactly 128 (causal and DFlash) or 256 (causal
// only), no causal window, 16-byte aligned tensors and ~200 KiB of shared memory (attention_wgmma.cu: fwd_wg_smem
// + kFwdWgStatic), the Hopper tier (e.tier) and e.attn_wgmma set; returns false (launching nothing) otherwise, and in
// the emulator.
// segs.n > 0: causal, several sequences in one launch (p.Tq = the longest; see AttnSegs).
bool launch_attention_forward_wgmma(Env& e, const AttnFwdParams& p, const AttnSegs& segs = AttnSegs{});
// Shared memory per block (dynamic and static) the Hopper forward at head dim D (128, 256) and the Hopper DFlash
// backward need (SIZE_MAX in the emulator, which has none).
size_t attention_wgmma_fwd_smem(int D);
size_t attention_wgmma_bwd_smem();
// Sets the Hopper kernels' dynamic-shared-memory attribute (the Hopper tier's contexts only).
void attention_wgmma_init_attributes(int smem_optin);
// The DFlash backward (dQ, then dK / dV) on warpgroup MMA (attention_wgmma.cu), tried first by
// launch_dflash_backward_tc once it has checked alignment: the Hopper tier, head dim 128, Tq <= 65536 and enough
// shared memory, else false (launching nothing).
bool launch_dflash_backward_wgmma(Env& e, const AttnBwdParams& p);
// Shared memory of the tensor-core kernels for head dim D (64 or 128; the forward also 256).
size_t attn_tc_fwd_smem(int D, int keys = 0);  // keys per tile: 0 = the kernel's first choice
size_t attn_tc_dq_smem(int D);
size_t attn_tc_dkv_smem(int D);

}  // namespace dflash::cuda
