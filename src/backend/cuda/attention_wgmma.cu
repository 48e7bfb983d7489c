// cuda/attention_wgmma.cu — attention on Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for head dim 128: the
// forward behind attention_causal (the target's prefill) and dflash_attention, and DFlash attention's backward (dQ,
// dK / dV) on the H200; and at head dim 256 the causal forward (the hybrid targets' prefill: k_fwd_wg<256>). Same
// math, masks (attention.h: attn_row_bounds / dflash_row_bounds) and outputs as the mma.sync kernels of
// attention_tc.cu, which still run for head dim 64, under a shared-memory cap too small for these tiles (case C07)
// and in the emulator (no tensor cores there); tests/cuda's op table judges both against the CPU.
//
// FlashAttention-2's online softmax (Dao 2023) on FlashAttention-3's operands (Shah et al. 2024, arXiv 2407.08608,
// section 3: wgmma with the first product's operands in shared memory and P / dS from registers; in the forward its
// intra-warpgroup overlap of the softmax with the P V product, its ping-pong of two warpgroups, and its persistent
// kernel with a producer warpgroup). In the backward the streamed tiles (dQ's K / V, dK/dV's Q / dO) come by TMA
// (dQ's from a load warpgroup, dK/dV's from its one warpgroup's thread 0), the tiles a CTA loads once (Q, dO, dK/dV's
// K / V) by cp.async. Shared-memory tiles use wgmma.cuh's SW128 layout. Masks are applied only on tiles a warp does not
// see whole.
//  * forward (k_fwd_wg): persistent (a CTA per SM) and warp-specialised: a producer warpgroup hands items over and
//    moves Q / K / V in and O out by TMA; 2 consumer warpgroups = 128 query rows ((query, head) pairs of one kv
//    head, attn_rows_tiling) per item; consumer w owns rows 64 w .. 64 w + 63 (one m64 wgmma). 128-key K / V tiles
//    in 2 stages with full / empty mbarriers, no CTA barrier; Q stays in shared memory as the A operand. Per tile
//    and consumer: S = Q K^T (8 x m64n128k16; m64n64 on a half tile, where the consumer's keys end in the tile's
//    first 64: causal diagonals, DFlash's block tiles and last context tiles), mask, online softmax in the log2
//    domain on the accumulator fragments (lazy rescaling), O += P V (P rounded to bf16 in registers, V read
//    MN-major); tile t's softmax runs while tile t - 1's P V product does, and while the other consumer's products
//    run. A consumer skips a tile none of its rows can see (uniform over its 128 threads). Items run longest first
//    (causal: the last queries; DFlash: sorted anchors) over all head groups and sequences. O is staged in the item's
//    own Q buffer and stored by TMA.
//  * dQ (k_dq_wg): the forward's tiling over 64-key tiles and warp-specialised: a load warpgroup streams K / V into
//    3 stages with full / empty mbarriers, no CTA barrier per tile, so the 2 consumer warpgroups drift apart. Per
//    tile and consumer: S = Q K^T, dP = dO V^T, P = exp2(S - lse), dS = P (dP - D), dQ += dS K (K read MN-major).
//  * dK / dV (k_dkv_wg): one warpgroup per 64 keys; the visible 64-query chunks are listed first, then the items
//    (chunk, head) run last chunk first with Q / dO double buffered: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
//    dK += dS^T Q. Deterministic: every gradient element is summed by one thread in a fixed order and written once.
// bench/NOTES.md 9-20 has every variant tried, with its prediction and outcome.
// Numerics as attention_tc.cu: fp32 accumulation, P and dS rounded to bf16 for the second products (tests/cuda
// compares attention by normalised mean square error for that reason).
#include <algorithm>
#include <climits>
#include <type_traits>
#include <utility>
#ifdef DFLASH_FWD_TIMELINE
#include <cstdio>
#include <vector>
#endif

#ifndef DFLASH_CUDA_EMU
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#endif

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !DFLASH_HOPPER_DEVICE
#pragma nv_diag_suppress 177  // (the Hopper kernels' helpers, unused where their bodies are traps: common.cuh)
#endif

namespace dflash::cuda {

namespace {

constexpr int kWgD = 128;  // the backward's head dim
// The forward's tiling (bench/NOTES.md 9: 2 warpgroups x 128-key tiles beat 1 x 64 (2 CTAs per SM) and 2 x 64):
// kFwdWgs consumer warpgroups beside the producer, and its K / V stages (2: the producer warp refills a stage as
// soon as both consumers have released it). Per head dim D (128, or 256 for the hybrid targets' causal prefill;
// bench/NOTES.md 29):
//  * keys per tile: 128 at D = 128; 64 at D = 256 (a consumer's O is 64 x 256 fp32 = 128 registers a thread, S of
//    64 keys 32 more; FlashAttention-3's hd256 forward takes 80 keys, which with our static shared memory is over
//    the 227 KiB);
//  * Q buffers: 2 at D = 128 (this item's and the next: the next item's Q lands while this one runs, and the last
//    tile's P V product runs on into the next item's first iteration); 1 at D = 256 (64 KiB: a second would not fit
//    beside the 128 KiB of K / V stages), so an item's O is staged in its own Q buffer after its last P V product
//    and the next item's Q is loaded once that O has been stored;
//  * half tiles (S as m64n64 where a consumer's keys end in the tile's first half) only at 128-key tiles: at D = 256
//    an m64n32 branch saved a quarter of one S product per item and made ptxas serialise the wgmma (C7511).
// setmaxnreg 56 / 224 at both (at D = 256, 40 / 232 spilled 32-36 bytes in the producer's item warp; the consumers
// fit 224 with O 128, S 32 and P 16 registers, no spill).
constexpr int kFwdWgs = 2, kFwdStages = 2;
constexpr int fwd_wg_keys(int d) { return d == 128 ? 128 : 64; }
constexpr int fwd_wg_qbufs(int d) { return d == 128 ? 2 : 1; }
// Q x buffers, K x stages, V x stages and the 1024-byte alignment slack, for head dim d and NWG consumer
// warpgroups (193 KiB at both head dims)
constexpr size_t fwd_wg_smem(int d, int nwg) {
  return static_cast<size_t>(fwd_wg_qbufs(d) * 64 * nwg + 2 * kFwdStages * fwd_wg_keys(d)) * d * 2 + 1024;
}

}  // namespace

#ifndef DFLASH_CUDA_EMU

namespace {

// TMA maps of K / V, segments 1 and 2 (attention.h; k2 / v2 unused without segment 2): 3-D tiled maps of
// [T, nkv, 128] bf16 (kv_map), boxes of the kernel's key tile (the forward's 128 rows, dQ's 64).
struct KvMaps {
  CUtensorMap k1, v1, k2, v2;
};
// dK/dV's TMA maps of Q and dO: [Tq, nh, 128] bf16, boxes of 64 columns x 1 head x 64 queries (kv_map).
struct QdoMaps {
  CUtensorMap q, dout;
};
// The forward's TMA maps of q and out ([rows, nh, 128] bf16 over all of q's rows), boxes of 64 columns x 1 head x mq
// rows: one head's rows of a query tile in one SW128 panel (used when mq % 8 == 0, so that each box starts on a
// 1024-byte boundary of the tile).
struct QoMaps {
  CUtensorMap q, o;
};
// The packed forward's TMA maps: sequence z's K / V ([tk, nkv, 128] bf16 each, attention.h's AttnSegs), as KvMaps.
// (8 KiB of kernel parameters for kAttnMaxSegs = 32: within the 32 KiB CUDA 12.1 allows.)
struct SeqMaps {
  CUtensorMap k[kAttnMaxSegs], v[kAttnMaxSegs];
};

constexpr int kBarTurn = 1;  // the forward's ping-pong: named barriers kBarTurn, kBarTurn + 1 (0 is __syncthreads)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLazyLog2 = 8.f;  // the forward's lazy rescaling threshold (log2 domain): P <= 2^8

// Copies ROWS rows x 128 columns into a SW128 tile at dst (2 panels of ROWS rows) with the block's NTHREADS
// threads; row r comes from src + off(r) (zeros when off(r) < 0).
template <int ROWS, int NTHREADS, class Off>
__device__ __forceinline__ void stage_tile(uint32_t dst, const bf16* src, Off off) {
  for (int c = threadIdx.x; c < ROWS * 16; c += NTHREADS) {
    const int r = c >> 4, ch = c & 15;
    const int64_t o = off(r);
    const uint32_t d = dst + (ch >> 3) * (ROWS * 128) + wg::sw128_offset(r, (ch & 7) * 8);
    cp_async16(d, o >= 0 ? src + o + ch * 8 : src, o >= 0);
  }
}

// Copies rows [0, ROWS) x 128 columns of a row-strided bf16 matrix into a SW128 tile at dst with the block's NTHREADS
// threads: row r comes from row0 + r * stride (elements); rows r >= nvalid are zero-filled (nvalid >= 1: row0 is a
// valid address). Thread t copies 16-byte chunk t % 16 of rows t / 16 + (NTHREADS / 16) j, so its shared-memory
// offsets are fixed (the swizzle repeats every 8 rows) and each further row costs one address add.
template <int ROWS, int NTHREADS>
__device__ __forceinline__ void stage_rows(uint32_t dst, const bf16* row0, int64_t stride, int nvalid) {
  constexpr int RSTEP = NTHREADS / 16;
  static_assert(RSTEP % 8 == 0 && ROWS % RSTEP == 0, "stage_rows: rows per pass must keep the swizzle phase");
  const int ch = threadIdx.x & 15, r0 = (threadIdx.x >> 4) % RSTEP;
  const uint32_t d0 = dst + (ch >> 3) * (ROWS * 128) + r0 * 128 + ((((ch & 7) ^ r0) & 7) << 4);
  const bf16* src = row0 + r0 * stride + ch * 8;
  const int64_t step = stride * RSTEP;
  DFLASH_UNROLL
  for (int j = 0; j < ROWS / RSTEP; ++j) {
    const bool ok = r0 + RSTEP * j < nvalid;
    cp_async16(d0 + j * RSTEP * 128, ok ? src + j * step : row0, ok);
  }
}

// 32-bit store / 128-bit load of shared memory at a shared-window address (smem_u32)
__device__ __forceinline__ void st_shared_b32(uint32_t a, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}

// 2^x on the special-function unit, denormal results flushed to zero (one MUFU.EX2; exp2f without -ftz adds the
// denormal range handling around it). Probabilities below 2^-126 do not matter here.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// dQ's grid, rows_grid(query tiles, head groups): blockIdx.x the head group (kv head x split), blockIdx.z the query
// tile counted from the last (the persistent forward, k_fwd_wg, numbers its items in the same order). CTAs start in
// linear block order (x fastest), so the whole grid runs query tile slowest, the tiles with the most keys first over
// every head group: one longest-first list (with the head group slowest, each group's short tiles would run before
// the next group's long ones and the launch would end on a sawtooth; bench/NOTES.md 15).
// false (grid untouched) past 65535 query tiles (grid.z's limit: 2M queries at 32 per tile, 1M at 16): the caller
// leaves the call to attention_tc.cu's kernels.
bool rows_grid(int64_t qtiles, int64_t head_groups, dim3& grid) {
  if (qtiles > 65535 || head_groups > INT32_MAX) return false;
  grid = dim3(static_cast<unsigned>(head_groups), 1, static_cast<unsigned>(qtiles));
  return true;
}
// This CTA's query tile under rows_grid (most keys first)
__device__ __forceinline__ int rows_item_qtile() { return static_cast<int>(gridDim.z - 1 - blockIdx.z); }

// Key ranges of a CTA's tiles: segment 1 tiles cover [lo1, hi1), segment 2 tiles [lo2, hi2).
struct KeySpan {
  int lo1, hi1, lo2, hi2;
};
// The ranges the CTA loads (cta) and the ones warpgroup wgi computes (mine), from the bounds of each thread's two
// rows (attn_row_bounds) through the shared sExt[1 + NWG][4] (max hi1, min lo2, max hi2, min lo1). Every thread of
// the CTA calls it (it holds __syncthreads).
template <int NWG, bool WIN>
__device__ __forceinline__ void key_spans(int (*sExt)[4], int wgi, const int (&lo1)[2], const int (&hi1)[2],
                                          const int (&lo2)[2], const int (&hi2)[2], KeySpan& cta, KeySpan& mine) {
  const int tid = threadIdx.x;
  if (tid < 4 * (1 + NWG)) sExt[tid >> 2][tid & 3] = (tid & 1) ? INT_MAX : 0;
  __syncthreads();
  if ((tid & 3) == 0)
    DFLASH_UNROLL
    for (int i = 0; i < 2; ++i)
      DFLASH_UNROLL
      for (int xi = 0; xi < 2; ++xi) {
        const int x = xi ? 1 + wgi : 0;
        if (!WIN || hi1[i] > lo1[i]) {
          atomicMax(&sExt[x][0], hi1[i]);
          if (WIN) atomicMin(&sExt[x][3], lo1[i]);
        }
        if (hi2[i] > lo2[i]) {
          atomicMin(&sExt[x][1], lo2[i]);
          atomicMax(&sExt[x][2], hi2[i]);
        }
      }
  __syncthreads();
  auto read = [&](int x, KeySpan& k) {
    k.hi1 = sExt[x][0];
    k.lo1 = WIN && k.hi1 > 0 ? sExt[x][3] : 0;
    k.hi2 = sExt[x][2];
    k.lo2 = k.hi2 > 0 ? sExt[x][1] : 0;
  };
  read(0, cta);
  read(1 + wgi, mine);
}
// A thread's two rows' visible keys in segment 1 (s1) or 2 as one half-open range each, [lo[i], hi[i]): picked once
// per tile, so that the mask is two compares per element (with the segment chosen per element, ptxas compiled the
// partial tiles' mask into a branch per element in one build: bench/NOTES.md 15).
template <bool WIN>
__device__ __forceinline__ void seg_bounds(bool s1, const int (&lo1)[2], const int (&hi1)[2], const int (&lo2)[2],
                                           const int (&hi2)[2], int (&lo)[2], int (&hi)[2]) {
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    lo[i] = s1 ? (WIN ? lo1[i] : 0) : lo2[i];  // (no window: segment 1 starts at key 0)
    hi[i] = s1 ? hi1[i] : hi2[i];
  }
}
// Whether a warpgroup with key ranges `mine` sees a key of tile [kt, kt + KT) of segment 1 (s1) or 2.
template <bool WIN>
__device__ __forceinline__ bool tile_visible(const KeySpan& mine, bool s1, int kt, int KT) {
  return s1 ? (kt < mine.hi1 && (!WIN || kt + KT > mine.lo1)) : (kt < mine.hi2 && kt + KT > mine.lo2);
}

#ifdef DFLASH_FWD_TIMELINE
// Diagnostic build only (-DDFLASH_FWD_TIMELINE): consumer thread 0 (thread 128) of each CTA of the last k_fwd_wg
// launch records its SM, globaltimer at entry and exit, and clock64 cycles summed over its items: before the loop
// (the item's hand-over and Q), in the key loop, in the epilogue; with its items and tiles.
// attn_fwd_timeline_report() summarises them.
constexpr int kTlMax = 16384;
__device__ unsigned long long g_tl_clk[kTlMax][4], g_tl_ns[kTlMax][2];  // clk: entry, before, loop, epilogue
constexpr int kTlSubs = 4;
__device__ unsigned long long g_tl_sub[kTlMax][kTlSubs];  // the same split finer: kTlSub's parts
__device__ int g_tl_sm[kTlMax], g_tl_nt[kTlMax], g_tl_items[kTlMax], g_tl_n;
// before the loop: waiting for the item, reading and releasing it, waiting for Q; the epilogue: the item's finish (row
// sums, lse). (Its O is staged inside the next item's first loop iteration, bench/NOTES.md 18, and not timed there:
// timers inside the loop made ptxas serialise the consumers' wgmma, C7511.)
constexpr const char* kTlSub[kTlSubs] = {"item wait", "item read", "Q wait", "finish"};
__device__ __forceinline__ unsigned long long tl_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// adds the cycles since the last mark to acc
#define DFLASH_TL_MARK(acc) do { const unsigned long long t_ = clock64(); acc += t_ - tl_mark; tl_mark = t_; } while (0)
#define DFLASH_TL_SUB(k) do { const unsigned long long t_ = clock64(); tl_sub[k] += t_ - tl_m2; tl_m2 = t_; } while (0)
#else
#define DFLASH_TL_MARK(acc) do { } while (0)
#define DFLASH_TL_SUB(k) do { } while (0)
#endif


// Programmatic dependent launch (sm_90; CUDA C++ Programming Guide 4.5, PTX ISA "griddepcontrol"). A kernel launched
// with launch_pdl may start while the kernel before it on the stream is still running (once every CTA of that one
// has executed pdl_trigger, or exited). pdl_wait blocks the calling thread until every such prerequisite grid has
// completed and its memory operations are visible; without the launch attribute both are no-ops. k_fwd_wg triggers
// at its start (so the next forward's CTAs take the SMs this one's leave, set up and wait: back to back, as a
// prefill's layers run) and waits before its first global access (bench/NOTES.md 19: causal 4 x 1024 +1%). The
// backward's two kernels launch plainly: the same there measured within the noise (bench/NOTES.md 19).
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// The forward's item hand-over (shared memory, kFwdSlots slots): the header's fields and each row's visible keys.
enum FwdItemField : int { kItQ0, kItH0, kItRb, kItTq, kItG, kItZ, kItNt1, kItNt, kItElo1, kItElo, kItMine, kItFields = kItMine + 8 };
constexpr int kFwdSlots = 2;
// k_fwd_wg's static shared memory (sHdr, sRows, sOut, sBar, and slack for their alignment): the launcher's and
// init_attributes' headroom beside the dynamic fwd_wg_smem
constexpr size_t kFwdWgStatic = sizeof(int) * kFwdSlots * (kItFields + 5) + 16 * kFwdSlots * 64 * kFwdWgs + 8 * 128 * kFwdWgs +
                                8 * (4 * kFwdSlots + 4 * kFwdStages) + 64;

// The forward, persistent and warp-specialised (FlashAttention-3's design, arXiv 2407.08608 section 3.1): a CTA of
// 1 + NWG warpgroups stays on its SM and runs items (query tile, head group[, sequence]) one after another; grid =
// min(items, SMs). Items are numbered in rows_grid's longest-first order (query tile from the last slowest, then
// the sequence, then the head group) and CTA c takes items c, 2G - 1 - c, 2G + c, ... (G = gridDim.x: a snake over
// the list, so each CTA's sum of tiles is about the mean).
//  * Warpgroup 0 is the producer (setmaxnreg 56), two warps of it:
//    - the item warp (warp 1), per item: the 128 rows' visible keys (attn_row_bounds) and the key spans of the CTA
//      and of each consumer into a shared-memory slot (2 slots, full / empty mbarriers); then, in the item's Q buffer
//      (D = 128: 2 buffers, so that the next item's Q lands while this one runs; D = 256: 1), the O of the item
//      QBUF back (two, or the last) out (TMA store, once the consumers have staged it there: the buffer's O-full
//      mbarrier) and this item's Q in (TMA, on the buffer's Q-full mbarrier). Q and O go by TMA in boxes of mq rows
//      of one head per 64-column panel (D / 64 panels), which start
//      on the tile's 1024-byte swizzle boundaries when mq % 8 == 0; else (3, 5, 6, 7 query heads per kv head) by
//      cp.async / 16-byte stores, as does O of a packed tile that crosses its sequence's end (a TMA store would write
//      the next sequence's rows).
//    - the K / V warp (warp 0, lane 0): the item's tiles by TMA into the NS-stage ring (a tile index that runs on
//      across items), each once both consumers have released the stage's previous tile.
//  * Warpgroups 1 .. NWG are the consumers (setmaxnreg 224): per item the key loop of the non-persistent
//    design before it (bench/NOTES.md 9-15); with 2 Q buffers its pipeline carried on into the next item (the last
//    tile's P V product issued with the next item's first S), then O / l staged in the item's Q buffer for the item
//    warp (bench/NOTES.md 18); with 1 (D = 256) the last P V product in an iteration of its own at the item's end,
//    then O / l staged in the same buffer, which the next item's Q may fill only once that O is out.
// So the per-item work that had cost 3.5-4.5 us per CTA before and after the loop (bench/NOTES.md 14: Q's copies,
// row bounds, span gathering, the O stores, the CTA's start and drain) runs on the producer under the consumers'
// products (bench/NOTES.md 16).
// WIN: compiled for a sliding-window layer; false = full attention, with no window arithmetic in the loops.
// PACKED: causal over the sequences of segs (items over segs.n sequences): query rows offset by the sequence's begin,
// its own keys (maps.k[z] / maps.v[z]: SeqMaps) and query offset. Otherwise maps is KvMaps (segments 1 and 2).
// K / V tiles come by TMA (a tile as D / 64 boxes of 64 columns, which land in wgmma.cuh's SW128 panels); TMA loads
// a tile's rows up to the tensor's end (zero-filled past it); the rows past the last key a row sees are masked
// (P = 0) like any invisible key.
// D: the head dim (128, or 256: fwd_wg_keys, fwd_wg_qbufs); KT = fwd_wg_keys(D).
template <int D, int NWG, int KT, bool WIN, bool PACKED>
__global__ void __launch_bounds__(128 * (NWG + 1), 1) k_fwd_wg(AttnFwdParams p, const __grid_constant__ AttnSegs segs,
                                                               const __grid_constant__ std::conditional_t<PACKED, SeqMaps, KvMaps> maps,
                                                               const __grid_constant__ QoMaps qo) {
#if DFLASH_HOPPER_DEVICE
  static_assert(NWG == 2, "the register split (setmaxnreg 56 / 224) is for one producer and two consumer warpgroups");
  static_assert((D == 128 || D == 256) && KT == fwd_wg_keys(D), "k_fwd_wg: head dim 128 or 256, its key tile");
  constexpr int NT = KT / 8, DT = D / 8, DP = D / 64, ROWS = 64 * NWG, NS = kFwdStages;
  constexpr int QBUF = fwd_wg_qbufs(D);  // Q buffers (1 or 2)
  constexpr bool HALF = KT == 128;        // half tiles (m64n64 S products)
  constexpr uint32_t TB = KT * D * 2, QB = ROWS * D * 2;  // one K or V tile; one Q buffer (DP panels of ROWS rows)
  DFLASH_DYN_SMEM(smem_raw);
  __shared__ int sHdr[kFwdSlots][kItFields];  // the item slots: FwdItemField's header
  __shared__ int4 sRows[kFwdSlots][ROWS];     // and each row's lo1, hi1, lo2, hi2
  __shared__ int sOut[kFwdSlots][5];          // Q buffer b's item (for its O): q0, h0, rb, Tq, O-full phase
  __shared__ float2 sInv[128 * NWG];          // a consumer thread's two rows' 1 / l, for its last item's O (QBUF 2)
  // mbarriers: item full / empty (per slot), Q full / O full (per buffer, QBUF of the kFwdSlots used: Q landed; the
  // consumers' O staged in it);
  // per stage K full, V full (the TMA bytes), K empty, V empty (every consumer warp read it)
  __shared__ alignas(8) uint64_t sBar[4 * kFwdSlots + 4 * NS];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + QBUF * QB, sV = sK + NS * TB;  // (fwd_wg_smem's layout)
  const uint32_t bItemF = smem_u32(&sBar[0]), bItemE = bItemF + 8 * kFwdSlots, bQF = bItemE + 8 * kFwdSlots,
                 bOF = bQF + 8 * kFwdSlots, bFullK = bOF + 8 * kFwdSlots, bFullV = bFullK + 8 * NS,
                 bEmptyK = bFullV + 8 * NS, bEmptyV = bEmptyK + 8 * NS;  // (slot / buffer / stage s: + 8 s)
  const int tid = threadIdx.x, wga = warpgroup_index(), warp = (tid >> 5) & 3, lane = tid & 31, t4 = lane & 3;
  const int nh = p.nh, mq = p.mq, hc = p.hc, rep = nh / p.nkv, splits = rep / hc;
  if (tid == 0) {
    DFLASH_UNROLL
    for (int s = 0; s < kFwdSlots; ++s) {
      mbar_init(bItemF + 8 * s, 32);           // every lane of the item warp wrote its rows
      mbar_init(bItemE + 8 * s, 4 * NWG + 1);  // every consumer warp and the K / V warp read the slot
      mbar_init(bQF + 8 * s, 1);               // Q landed (the TMA bytes, or the item warp's copies)
      mbar_init(bOF + 8 * s, 4 * NWG);         // every consumer warp staged its O rows
    }
    DFLASH_UNROLL
    for (int st = 0; st < NS; ++st) {
      mbar_init(bFullK + 8 * st, 1);
      mbar_init(bFullV + 8 * st, 1);
      mbar_init(bEmptyK + 8 * st, 4 * NWG);
      mbar_init(bEmptyV + 8 * st, 4 * NWG);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wga == 0) {
    // ---- the producer: warp 0 streams K / V, warp 1 hands the items over and moves Q in and O out ----
    setmaxnreg_dec<56>();
    if (warp >= 2 || (warp == 0 && lane != 0)) return;
    // every global access of the CTA is the producer's or follows an item it handed over (an mbarrier): its wait
    // orders them all after the previous kernels
    pdl_trigger();
    pdl_wait();
    if (warp == 0) {
      // K / V: the item's tiles into the NS-stage ring (a tile index kc that runs on across items), in the order the
      // consumers wait for them: K_0, then K_{j+1} before V_j
      uint32_t kc = 0;
      for (int n = 0;; ++n) {
        const int slot = n % kFwdSlots;
        mbar_wait(bItemF + 8 * slot, (n / kFwdSlots) & 1);
        const int* hdr = sHdr[slot];
        const int nt = hdr[kItNt], nt1 = hdr[kItNt1], elo1 = hdr[kItElo1], elo = hdr[kItElo], g = hdr[kItG],
                  z = hdr[kItZ];
        mbar_arrive(bItemE + 8 * slot);
        if (nt < 0) break;
        auto issue = [&](uint32_t idx, int kv, int j) {
          const int st = idx % NS;
          if (idx >= NS) mbar_wait((kv ? bEmptyV : bEmptyK) + 8 * st, ((idx / NS) & 1) ^ 1);
          const bool s1 = j < nt1;
          const int kt = s1 ? elo1 + j * KT : elo + (j - nt1) * KT;
          const uint32_t full = (kv ? bFullV : bFullK) + 8 * st;
          const CUtensorMap* map;
          if constexpr (PACKED)
            map = kv ? &maps.v[z] : &maps.k[z];
          else
            map = kv ? (s1 ? &maps.v1 : &maps.v2) : (s1 ? &maps.k1 : &maps.k2);
          const uint32_t dst = (kv ? sV : sK) + st * TB;
          mbar_arrive_expect_tx(full, TB);
          DFLASH_UNROLL
          for (int pn = 0; pn < DP; ++pn) tma_load_3d(dst + pn * (KT * 128), map, full, pn * 64, g, kt);  // panel pn
        };
        if (nt > 0) issue(kc, 0, 0);
        for (int j = 0; j < nt; ++j) {
          if (j + 1 < nt) issue(kc + j + 1, 0, j + 1);
          issue(kc + j, 1, j);
        }
        kc += nt;
      }
      return;
    }
    // warp 1: per item, the rows' bounds and spans into a slot; then, once the consumers have staged the O of the
    // item QBUF back in its Q buffer, that O out (by TMA when every row is written whole: mq a multiple of 8, and a
    // packed item not past its sequence's end; else 16-byte stores) and this item's Q in (TMA when mq % 8 == 0:
    // a box of mq rows per head and panel; else cp.async)
    const int hg = p.nkv * splits, nseq = PACKED ? segs.n : 1, per_qt = hg * nseq;
    const int total = (p.Tq + mq - 1) / mq * per_qt, G = gridDim.x, c = blockIdx.x;
    const bool rows8 = mq % 8 == 0;
    auto store_o = [&](int b) {  // the O staged in buffer b (sOut[b]: its item's q0, h0, rb, Tq)
      const uint32_t src = sQ + b * QB;
      const int q0 = sOut[b][0], h0 = sOut[b][1], rb = sOut[b][2], Tq = sOut[b][3];
      mbar_wait(bOF + 8 * b, sOut[b][4]);
      if (rows8 && (!PACKED || q0 + mq <= Tq)) {
        if (lane == 0) {
          for (int hh = 0; hh < hc; ++hh)
            DFLASH_UNROLL
            for (int pn = 0; pn < DP; ++pn) tma_store_3d(&qo.o, src + pn * (ROWS * 128) + hh * mq * 128, pn * 64, h0 + hh, rb + q0);
          bulk_commit();
        }
      } else {
        // 16-byte chunk lane % (D / 8) of rows lane / (D / 8) + (256 / D) j
        bf16* O = static_cast<bf16*>(p.out);
        const int ch = lane % DT;
        for (int r = lane / DT; r < ROWS; r += 32 / DT) {
          const int hh = r / mq, qi = q0 + r % mq;
          if (hh < hc && qi < Tq)
            *reinterpret_cast<uint4*>(O + (static_cast<int64_t>(rb + qi) * nh + h0 + hh) * D + ch * 8) =
                ld_shared_v4(src + (ch >> 3) * (ROWS * 128) + wg::sw128_offset(r, (ch & 7) * 8));
        }
        __syncwarp();
        wg::fence_proxy_async();  // (these generic reads before the next Q's TMA writes)
      }
    };
    const bf16* Q = static_cast<const bf16*>(p.q);
    int n = 0;  // items handed over
    for (int k = 0;; ++k) {
      const int i = k * G + ((k & 1) ? G - 1 - c : c);
      const int slot = n % kFwdSlots;
      const uint32_t ph = (n / kFwdSlots) & 1;
      if (i >= total) {  // no more items: an item with nt = -1; then the last QBUF items' O
        if (n >= kFwdSlots) mbar_wait(bItemE + 8 * slot, ph ^ 1);
        if (lane == 0) sHdr[slot][kItNt] = -1;
        mbar_arrive(bItemF + 8 * slot);
        for (int j = max(n - QBUF, 0); j < n; ++j) store_o(j % QBUF);
        if (lane == 0) bulk_wait<0>();
        break;
      }
      const int qt = total / per_qt - 1 - i / per_qt, rem = i % per_qt, z = rem / hg, x = rem % hg;
      const int q0 = qt * mq, g = x / splits, h0 = g * rep + (x % splits) * hc;
      int Tq = p.Tq, T1 = p.T1, rb = 0, q_offset = p.q_offset;
      if constexpr (PACKED) {
        rb = segs.begin[z];
        Tq = segs.len[z];
        T1 = segs.tk[z];
        q_offset = segs.q_offset[z];
        if (q0 >= Tq) continue;  // (past a shorter sequence's end)
      }
      if (n >= kFwdSlots) mbar_wait(bItemE + 8 * slot, ph ^ 1);
      // rows lane + 32 j (j = 0, 1: consumer 0's, 2, 3: consumer 1's): bounds into the slot, the spans reduced
      int hi1m[2] = {0, 0}, lo1m[2] = {INT_MAX, INT_MAX}, lo2m[2] = {INT_MAX, INT_MAX}, hi2m[2] = {0, 0};
      DFLASH_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int r = lane + 32 * j, w = j >> 1, hh = r / mq, qi = q0 + r % mq;
        int lo1 = 0, hi1 = 0, lo2 = 0, hi2 = 0;
        if (hh < hc && qi < Tq)
          attn_row_bounds(p.mode, qi, q_offset, T1, p.B, WIN ? p.window : 0, p.anchors, p.valid, p.err, lo1, hi1, lo2,
                          hi2);
        sRows[slot][r] = make_int4(lo1, hi1, lo2, hi2);
        if (!WIN || hi1 > lo1) {
          hi1m[w] = max(hi1m[w], hi1);
          if (WIN) lo1m[w] = min(lo1m[w], lo1);
        }
        if (hi2 > lo2) {
          lo2m[w] = min(lo2m[w], lo2);
          hi2m[w] = max(hi2m[w], hi2);
        }
      }
      DFLASH_UNROLL
      for (int w = 0; w < 2; ++w) {
        hi1m[w] = __reduce_max_sync(0xffffffffu, hi1m[w]);
        lo1m[w] = __reduce_min_sync(0xffffffffu, lo1m[w]);
        lo2m[w] = __reduce_min_sync(0xffffffffu, lo2m[w]);
        hi2m[w] = __reduce_max_sync(0xffffffffu, hi2m[w]);
      }
      if (lane == 0) {
        const int ext1 = max(hi1m[0], hi1m[1]), ehi = max(hi2m[0], hi2m[1]);
        const int elo1 = WIN && ext1 > 0 ? min(lo1m[0], lo1m[1]) : 0, elo = ehi > 0 ? min(lo2m[0], lo2m[1]) : 0;
        const int nt1 = (ext1 - elo1 + KT - 1) / KT;
        int* h = sHdr[slot];
        h[kItQ0] = q0;
        h[kItH0] = h0;
        h[kItRb] = rb;
        h[kItTq] = Tq;
        h[kItG] = g;
        h[kItZ] = z;
        h[kItNt1] = nt1;
        h[kItNt] = nt1 + (ehi - elo + KT - 1) / KT;
        h[kItElo1] = elo1;
        h[kItElo] = elo;
        DFLASH_UNROLL
        for (int w = 0; w < 2; ++w) {  // (KeySpan's order: lo1, hi1, lo2, hi2)
          h[kItMine + 4 * w + 0] = WIN && hi1m[w] > 0 ? lo1m[w] : 0;
          h[kItMine + 4 * w + 1] = hi1m[w];
          h[kItMine + 4 * w + 2] = hi2m[w] > 0 ? lo2m[w] : 0;
          h[kItMine + 4 * w + 3] = hi2m[w];
        }
      }
      mbar_arrive(bItemF + 8 * slot);  // (release: this lane's writes to the slot)
      // buffer b: the O of item n - QBUF out, then item n's Q in
      const int b = n % QBUF;
      if (n >= QBUF) store_o(b);
      __syncwarp();  // (every lane has read sOut[b] for that O)
      if (lane == 0) {
        sOut[b][0] = q0;
        sOut[b][1] = h0;
        sOut[b][2] = rb;
        sOut[b][3] = Tq;
        sOut[b][4] = (n / QBUF) & 1;  // (the O-full phase this item will complete)
      }
      __syncwarp();
      const uint32_t dq = sQ + b * QB;
      if (rows8) {
        if (lane == 0) {
          bulk_wait_read<0>();  // (the TMA store of buffer b has read it)
          mbar_arrive_expect_tx(bQF + 8 * b, hc * mq * D * 2);
          for (int hh = 0; hh < hc; ++hh)
            DFLASH_UNROLL
            for (int pn = 0; pn < DP; ++pn)
              tma_load_3d(dq + pn * (ROWS * 128) + hh * mq * 128, &qo.q, bQF + 8 * b, pn * 64, h0 + hh, rb + q0);
        }
      } else {
        // 16-byte chunk lane % (D / 8) of rows lane / (D / 8) + (256 / D) j; completed, fenced for wgmma (async
        // proxy), then arrived
        const int ch = lane % DT;
        const uint32_t dst = dq + (ch >> 3) * (ROWS * 128);
        for (int r = lane / DT; r < ROWS; r += 32 / DT) {
          const int hh = r / mq, qr = r % mq;
          const bool ok = hh < hc && q0 + qr < Tq;
          const bf16* src = Q + ((static_cast<int64_t>(rb + q0 + qr) * nh + h0 + hh) * D + ch * 8);
          cp_async16(dst + wg::sw128_offset(r, (ch & 7) * 8), ok ? src : Q, ok);
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        wg::fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbar_arrive(bQF + 8 * b);
      }
      ++n;
    }
  } else {
    // ---- the consumers ----
    setmaxnreg_inc<224>();
    const int wgi = wga - 1;
#ifdef DFLASH_FWD_TIMELINE
    unsigned long long tl_mark = clock64(), tl_pre = 0, tl_loop = 0, tl_epi = 0, tl_sub[kTlSubs] = {}, tl_m2 = tl_mark;
    int tl_tiles = 0, tl_items = 0;
    const unsigned long long tl_ns0 = tl_ns();
#endif
    const float sl2 = p.scale * kLog2e;
    // With 2 Q buffers the pipeline runs on across items: the P V product of an item's last tile is issued with the
    // next item's first S product (or alone in its first iteration), and the item's O is staged after it, at the end
    // of that iteration. So a consumer's epilogue and item change cost no turn of their own (before, each item began
    // with an S product that had no P V under it and ended with a P V alone, then the epilogue, while the other
    // consumer waited at its turn; bench/NOTES.md 18). A sentinel item (nt < 0) runs one last iteration for the last
    // item's P V and O. With 1 (D = 256) the next item's Q cannot land before this item's O has left the buffer: an
    // item ends with an iteration of its own for its last P V product, and its O is staged after it.
    uint32_t kc = 0;             // K / V tiles consumed so far, as the producer's count
    float o[DT * 4];             // O of the current item; until the end of the next item's first iteration, the last's
    uint32_t pa[KT / 16][4] = {};
    bool pending = false;        // pa holds P of tile kc - 1, whose P V product has not been issued
    bool vwait = false;          // V of tile kc - 1 not waited for and released yet
    // (QBUF 2: the last item's O waits in o until the end of the next item's first iteration, to be staged in the
    // other Q buffer, qb ^ 1, scaled by its 1 / l: sInv, this thread's two rows')
    static_assert(QBUF == 1 || kFwdSlots == 2, "the last item's Q buffer is qb ^ 1");
    DFLASH_UNROLL
    for (int e = 0; e < DT * 4; ++e) o[e] = 0.f;
    // O / l (inv: this thread's two rows' 1 / l) as bf16 into this warpgroup's own rows of Q buffer buf (its S
    // products have read them; the swizzle keeps the fragment writes free of bank conflicts), fenced for the TMA store
    // (async proxy), and the buffer handed to the item warp, which stores it (4-byte stores straight from the
    // fragments touch 8 rows per warp instruction, bench/NOTES.md 14; 16-byte stores from here held the consumers
    // ~1 us per item, 16); then O = 0 for the next item
    auto stage_o = [&](int buf, float2 inv) {
      const uint32_t eQb = sQ + buf * QB;
      const int r0 = wgi * 64 + warp * 16 + (lane >> 2);
      DFLASH_UNROLL
      for (int i = 0; i < 2; ++i)
        DFLASH_UNROLL
        for (int c = 0; c < DT; ++c)
          st_shared_b32(eQb + (c >> 3) * (ROWS * 128) + wg::sw128_offset(r0 + 8 * i, (c & 7) * 8 + 2 * t4),
                        wg::pack_bf16x2(o[c * 4 + 2 * i] * (i ? inv.y : inv.x), o[c * 4 + 2 * i + 1] * (i ? inv.y : inv.x)));
      wg::fence_proxy_async();
      __syncwarp();
      if (lane == 0) mbar_arrive(bOF + 8 * buf);
      DFLASH_UNROLL
      for (int e = 0; e < DT * 4; ++e) o[e] = 0.f;
    };
    if (wgi == 1) named_arrive(kBarTurn + 0, 256);  // warpgroup 0 issues first
    for (int n = 0;; ++n) {
      const int slot = n % kFwdSlots, qb = n % QBUF;
      const uint32_t ph = (n / kFwdSlots) & 1, qph = (n / QBUF) & 1;
      mbar_wait(bItemF + 8 * slot, ph);
      DFLASH_TL_SUB(0);
      const int* hdr = sHdr[slot];
      const bool fin = hdr[kItNt] < 0;  // the sentinel: no item, only the last one's P V and O
      const int nt = fin ? 0 : hdr[kItNt];
      int nt1 = 0, elo1 = 0, elo = 0;
      KeySpan mine = {0, 0, 0, 0};
      int lo1[2] = {0, 0}, hi1[2] = {0, 0}, lo2[2] = {0, 0}, hi2[2] = {0, 0};
      if (!fin) {
        nt1 = hdr[kItNt1];
        elo1 = hdr[kItElo1];
        elo = hdr[kItElo];
        mine = {hdr[kItMine + 4 * wgi], hdr[kItMine + 4 * wgi + 1], hdr[kItMine + 4 * wgi + 2], hdr[kItMine + 4 * wgi + 3]};
        DFLASH_UNROLL
        for (int i = 0; i < 2; ++i) {
          const int4 b = sRows[slot][wgi * 64 + warp * 16 + (lane >> 2) + 8 * i];
          lo1[i] = b.x;
          hi1[i] = b.y;
          lo2[i] = b.z;
          hi2[i] = b.w;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(bItemE + 8 * slot);
      }
      DFLASH_TL_SUB(1);

      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
      const uint32_t sQb = sQ + qb * QB, sQw = sQb + wgi * 64 * 128;  // this warpgroup's 64 rows in each Q panel

      // The online softmax of one tile's scores s (raw Q K^T of keys kt..kt + KT - 1 of segment 1 or 2): s becomes
      // P = exp2(s * sl2 - m) (fp32), m the row maxima used (log2 domain), alpha the factor for O and l, rs P's row
      // sums. Raw scores: the max is taken before scaling (scale > 0) and exp2(s * sl2 - m) is one FFMA + MUFU. A
      // warp whose 16 rows all see the whole tile skips the mask.
      // Lazy rescaling (FlashAttention-4's: Zadouri et al. 2025): m moves only when a row's maximum exceeds it by
      // more than kLazyLog2 (P <= 2^8 otherwise, far from fp32 / bf16 limits; O and l stay relative to the same m,
      // so the result is the same up to rounding); the decision is uniform over the warp, and when nothing moves the
      // O rescale is skipped (returns false).
      // W: the tile's width in 8-key column tiles (NT, or NT / 2 for a half tile: s[0 .. 4 W) only). (s is declared
      // [KT / 2], not [NT * 4]: cudafe++ 13.0 crashes on a generic lambda's parameter sized by a local constexpr.)
      auto softmax_tile = [&](auto w, float(&s)[KT / 2], bool s1, int kt, float(&alpha)[2], float(&rs)[2]) -> bool {
        constexpr int W = decltype(w)::value;
        int lo[2], hi[2];
        seg_bounds<WIN>(s1, lo1, hi1, lo2, hi2, lo, hi);
        bool full = true;
        DFLASH_UNROLL
        for (int i = 0; i < 2; ++i) full = full && kt >= lo[i] && kt + W * 8 <= hi[i];
        full = __all_sync(0xffffffffu, full);
        // (row maxima and sums over 4 partial values per row: dependency chains of 8 instead of 32, as only 2 warps
        // per scheduler hide the latency)
        float mx4[2][4];
        DFLASH_UNROLL
        for (int i = 0; i < 2; ++i)
          DFLASH_UNROLL
          for (int j = 0; j < 4; ++j) mx4[i][j] = -INFINITY;
        if (full) {
          DFLASH_UNROLL
          for (int c = 0; c < W; ++c)
            DFLASH_UNROLL
            for (int e = 0; e < 4; ++e) mx4[e >> 1][(c & 1) * 2 + (e & 1)] = fmaxf(mx4[e >> 1][(c & 1) * 2 + (e & 1)], s[c * 4 + e]);
        } else {
          DFLASH_UNROLL
          for (int c = 0; c < W; ++c)
            DFLASH_UNROLL
            for (int e = 0; e < 4; ++e) {
              const int i = e >> 1, key = kt + c * 8 + 2 * t4 + (e & 1);
              // (packed causal: every row's keys start at 0, so one compare per element)
              const float v = (PACKED || key >= lo[i]) && key < hi[i] ? s[c * 4 + e] : -INFINITY;
              s[c * 4 + e] = v;
              mx4[i][(c & 1) * 2 + (e & 1)] = fmaxf(mx4[i][(c & 1) * 2 + (e & 1)], v);
            }
        }
        float mx[2];
        bool move = false;
        DFLASH_UNROLL
        for (int i = 0; i < 2; ++i) {
          mx[i] = fmaxf(fmaxf(mx4[i][0], mx4[i][1]), fmaxf(mx4[i][2], mx4[i][3]));
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
          mx[i] *= sl2;
          move = move || mx[i] > m[i] + kLazyLog2;  // (false for a row that has seen nothing yet: -inf > -inf)
        }
        move = __any_sync(0xffffffffu, move);
        float mref[2];
        DFLASH_UNROLL
        for (int i = 0; i < 2; ++i) {
          alpha[i] = 1.f;
          if (move) {
            const float mn = fmaxf(m[i], mx[i]);
            alpha[i] = exp2_ftz(m[i] - (mn == -INFINITY ? 0.f : mn));
            m[i] = mn;
          }
          mref[i] = m[i] == -INFINITY ? 0.f : m[i];  // no -inf - -inf while a row has seen nothing
        }
        float rs4[2][4] = {};
        DFLASH_UNROLL
        for (int e = 0; e < W * 4; ++e) {
          s[e] = exp2_ftz(fmaf(s[e], sl2, -mref[(e >> 1) & 1]));
          rs4[(e >> 1) & 1][((e >> 2) & 1) * 2 + (e & 1)] += s[e];
        }
        DFLASH_UNROLL
        for (int i = 0; i < 2; ++i) rs[i] = (rs4[i][0] + rs4[i][1]) + (rs4[i][2] + rs4[i][3]);
        return move;
      };
      // l rescaled by alpha, and O when m moved (in an item's first iteration O still holds the last item's, which is
      // staged at its end: this item's is zero, so nothing to rescale); then P (s) rounded to bf16 pairs: the A
      // fragments of O += P V. (a half tile's P is zero past its 64 keys, so that a full-width P V product of it is
      // right too)
      auto rescale_pack = [&](auto w, const float(&s)[KT / 2], bool moved, const float(&alpha)[2], const float(&rs)[2],
                              uint32_t(&pa)[KT / 16][4]) {
        constexpr int W = decltype(w)::value;
        l[0] = l[0] * alpha[0] + rs[0];
        l[1] = l[1] * alpha[1] + rs[1];
        if (moved)
          DFLASH_UNROLL
          for (int e = 0; e < DT * 4; ++e) o[e] *= alpha[(e >> 1) & 1];
        DFLASH_UNROLL
        for (int c = 0; c < NT; ++c) {
          pa[c >> 1][(c & 1) * 2 + 0] = c < W ? wg::pack_bf16x2(s[c * 4 + 0], s[c * 4 + 1]) : 0u;
          pa[c >> 1][(c & 1) * 2 + 1] = c < W ? wg::pack_bf16x2(s[c * 4 + 2], s[c * 4 + 3]) : 0u;
        }
      };

      {
        // FlashAttention-3's intra-warpgroup overlap (arXiv 2407.08608, 3.2): an iteration issues S_t = Q K_t^T and
        // then the pending O += P V of the tile before (this item's, or the last item's last), waits for S_t only,
        // and runs tile t's softmax while the P V product runs. So V lags K by one tile: iteration t waits for K_t and
        // for the V of the tile consumed before it (ring index kc + t - 1).
        // And its ping-pong of the two consumers (3.1): each issues its products after the other has issued its own
        // (named barriers kBarTurn + w; the turns run on across items, and consumer 0 takes the last one after the
        // sentinel), so one warpgroup's softmax runs under the other's products. A warpgroup waits for every K and V
        // on their full mbarriers also when it skips them, so that its releases count towards the right phase.
        // QBUF 2: an item has max(nt, 1) iterations (the first stages the last item's O), the sentinel one.
        // QBUF 1: an item has nt + 1 (the last issues the pending P V product alone), the sentinel none.
        if (!fin) mbar_wait(bQF + 8 * qb, qph);
        DFLASH_TL_SUB(2);  // (Q came by TMA, or by copies the item warp fenced for the async proxy)
        DFLASH_TL_MARK(tl_pre);
#ifdef DFLASH_FWD_TIMELINE
        tl_tiles += nt;
        tl_items += !fin;
#endif
        const int nit = QBUF == 2 ? (nt > 0 ? nt : 1) : (fin ? 0 : nt + 1);
        for (int t = 0; t < nit; ++t) {
          const bool kin = t < nt;                   // K_t exists (ring index ik)
          const uint32_t ik = kc + t, iv = ik - 1;    // K_t's and the pending V's ring index
          const int stK = ik % NS, stV = iv % NS;
          if (kin) mbar_wait(bFullK + 8 * stK, (ik / NS) & 1);
          if (vwait) mbar_wait(bFullV + 8 * stV, (iv / NS) & 1);
          const bool s1 = t < nt1;
          const int kt = s1 ? elo1 + t * KT : elo + (t - nt1) * KT;
          const bool vis = kin && tile_visible<WIN>(mine, s1, kt, KT);
          // a half tile (128-key tiles only: HALF): this warpgroup's keys of the tile end in its first KT / 2 (a causal
          // diagonal where the queries sit low in it; DFlash's block tile, B <= 64 keys, and often its last context
          // tile): S = Q K^T as m64n64, and P zero past those 64 keys. The other consumer may run the same tile whole.
          // (Its P V product stays full width: a k64 variant of it beside this one made ptxas serialise every
          // wgmma of the packed causal kernel for want of registers, C7511; bench/NOTES.md 17.)
          const bool half = HALF && vis && (s1 ? mine.hi1 : mine.hi2) <= kt + KT / 2;
          const bool rescale = t > 0;  // (see rescale_pack)
          auto turn = [&] { named_sync(kBarTurn + wgi, 256); };   // my turn to issue
          auto pass = [&] { named_arrive(kBarTurn + (wgi ^ 1), 256); };  // then the other consumer's
          // (each case issues and waits for its own products: ptxas serialises wgmma issued in one branch and
          // waited for in another; so each width below is a branch of its own)
          const uint32_t tK = sK + stK * TB, tVp = sV + stV * TB;
          float s[NT * 4], alpha[2], rs[2];
          using Full = std::integral_constant<int, NT>;
          using Half = std::integral_constant<int, NT / 2>;
          auto s_pv = [&](auto w) {  // S_t (W column tiles) and the pending P V (full width)
            constexpr int W = decltype(w)::value;
            auto& sw = reinterpret_cast<float(&)[W * 4]>(s);
            wg::pin(o);
            wg::pin(pa);
            turn();
            wg::fence();
            wg::gemm_ss_kmajor<W * 8, D / 16>(sw, sQw, ROWS, tK, KT);
            wg::commit();
            wg::gemm_rs_mnmajor<D, KT / 16>(o, pa, tVp, KT);
            wg::commit();
            pass();
            wg::wait<1>();  // S_t is ready; the P V product may still run
            wg::pin(sw);
            const bool moved = softmax_tile(w, s, s1, kt, alpha, rs);
            wg::wait<0>();
            wg::pin(o);
            wg::pin(pa);
            rescale_pack(w, s, moved && rescale, alpha, rs, pa);
          };
          auto s_only = [&](auto w) {  // S_t alone (nothing pending)
            constexpr int W = decltype(w)::value;
            auto& sw = reinterpret_cast<float(&)[W * 4]>(s);
            turn();
            wg::fence();
            wg::gemm_ss_kmajor<W * 8, D / 16>(sw, sQw, ROWS, tK, KT);
            wg::commit();
            pass();
            wg::wait<0>();
            wg::pin(sw);
            const bool moved = softmax_tile(w, s, s1, kt, alpha, rs);
            rescale_pack(w, s, moved && rescale, alpha, rs, pa);
          };
          auto pv_only = [&] {  // the pending P V alone (tile t unseen, or the sentinel's iteration)
            wg::pin(o);
            wg::pin(pa);
            turn();
            wg::fence();
            wg::gemm_rs_mnmajor<D, KT / 16>(o, pa, tVp, KT);
            wg::commit();
            pass();
            wg::wait<0>();
            wg::pin(o);
            wg::pin(pa);
          };
          if (vis && pending) {
            if constexpr (HALF) {
              if (half)
                s_pv(Half{});
              else
                s_pv(Full{});
            } else {
              s_pv(Full{});
            }
          } else if (vis) {
            if constexpr (HALF) {
              if (half)
                s_only(Half{});
              else
                s_only(Full{});
            } else {
              s_only(Full{});
            }
          } else if (pending) {
            pv_only();
          } else {
            turn();
            pass();
          }
          pending = vis;
          if (lane == 0) {  // this warp is done with K_t and the pending V
            if (kin) mbar_arrive(bEmptyK + 8 * stK);
            if (vwait) mbar_arrive(bEmptyV + 8 * stV);
          }
          vwait = kin;
          if (QBUF == 2 && t == 0 && n > 0) stage_o(qb ^ 1, sInv[tid - 128]);  // the last item's O (its last P V ran above)
        }
        kc += nt;
      }
      DFLASH_TL_MARK(tl_loop);
#ifdef DFLASH_FWD_TIMELINE
      tl_m2 = tl_mark;
#endif
      if (fin) break;
      // the item's row sums and lse (attn_fwd_finish) now; its O once its last P V product has run (QBUF 2: in the
      // next item's first iteration, above; QBUF 1: it has, in the item's last iteration)
      // (the item's q0, h0, rb, Tq from sOut[qb], which the item warp wrote before Q's arrival and keeps until it
      // has stored this item's O: not held in registers through the loop)
      float inv[2];
      {
        const int q0 = sOut[qb][0], h0 = sOut[qb][1], rb = sOut[qb][2], Tq = sOut[qb][3];
        bool rok[2];
        int64_t orow[2];
        DFLASH_UNROLL
        for (int i = 0; i < 2; ++i) {
          const int r = wgi * 64 + warp * 16 + (lane >> 2) + 8 * i, hh = r / mq, qi = q0 + r % mq;
          rok[i] = hh < hc && qi < Tq;
          orow[i] = (static_cast<int64_t>(rb + qi) * nh + h0 + hh) * D;
        }
        attn_fwd_finish(p, D, rok, orow, l, m, t4, inv);
      }
      if constexpr (QBUF == 2)
        sInv[tid - 128] = make_float2(inv[0], inv[1]);
      else
        stage_o(qb, make_float2(inv[0], inv[1]));
      DFLASH_TL_SUB(3);
      DFLASH_TL_MARK(tl_epi);
#ifdef DFLASH_FWD_TIMELINE
      tl_m2 = tl_mark;
#endif
    }
    if (wgi == 0) named_sync(kBarTurn + 0, 256);  // consumer 1's pass after its last tile
#ifdef DFLASH_FWD_TIMELINE
    if (threadIdx.x == 128 && blockIdx.x < kTlMax) {
      const int c = blockIdx.x;
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      g_tl_sm[c] = static_cast<int>(sm);
      g_tl_nt[c] = tl_tiles;
      g_tl_items[c] = tl_items;
      g_tl_clk[c][1] = tl_pre;
      g_tl_clk[c][2] = tl_loop;
      g_tl_clk[c][3] = tl_epi;
      for (int k = 0; k < kTlSubs; ++k) g_tl_sub[c][k] = tl_sub[k];
      g_tl_ns[c][0] = tl_ns0;
      g_tl_ns[c][1] = tl_ns();
      if (c == 0) g_tl_n = static_cast<int>(gridDim.x);
    }
#endif
  }
#else
  __trap();  // (not the Hopper tier: never launched, common.cuh)
#endif
}

// ---- backward: dQ ------------------------------------------------------------------------------------------------
// The forward's tiling (2 warpgroups = 128 query rows, the tiles with most keys first) over 64-key tiles: per tile
// and warpgroup S = Q K^T and dP = dO V^T (m64n64k16, Q and dO stay in shared memory as the A operands),
// P = exp2(S - lse) from the forward's lse, dS = P (dP - D), dQ += dS K (m64n128k16, dS from registers, K read
// MN-major); dQ *= scale at the end.
constexpr int kDqWgKeys = 64;
constexpr uint32_t kDqWgKvBytes = kDqWgKeys * kWgD * 2;                          // [64][128] bf16: 16 KiB
// K / V stages: the loader runs up to 3 tiles ahead of the slower consumer warpgroup (4 measured the same; NOTES 20)
constexpr int kDqWgStages = 3;
// Q, dO, K and V x stages and the alignment slack, for NWG warpgroups
constexpr size_t dq_wg_smem(int nwg) {
  return static_cast<size_t>(2 * 64 * nwg) * kWgD * 2 + 2 * kDqWgStages * size_t{kDqWgKvBytes} + 1024;
}
constexpr int kDqWgs = 2;  // 2 warpgroups (1 CTA per SM) beat 1 (2 CTAs per SM): bench/NOTES.md 9
constexpr size_t kDqWgSmem = dq_wg_smem(kDqWgs);
constexpr int kDqWgThreads = 128 * (kDqWgs + 1);  // the consumer warpgroups and the load warpgroup

// A load warpgroup (the last; setmaxnreg 40, its thread 0 only) streams the K / V tiles by TMA (maps, as k_fwd_wg)
// into a kDqWgStages-stage ring: per stage a full mbarrier (the TMA bytes) and an empty one (every consumer warp has
// finished the tile's products), so the two consumer warpgroups (setmaxnreg 232) pass no CTA barrier per tile and may
// drift apart, one's softmax under the other's products.
template <int NWG, bool WIN>
__global__ void __launch_bounds__(128 * (NWG + 1), 1) k_dq_wg(AttnBwdParams p, const __grid_constant__ KvMaps maps) {
#if DFLASH_HOPPER_DEVICE
  static_assert(NWG == 2, "the register split (setmaxnreg 40 / 232) is for one load and two consumer warpgroups");
  constexpr int D = kWgD, KT = kDqWgKeys, NT = KT / 8, DT = D / 8, ROWS = 64 * NWG;
  constexpr int NS = kDqWgStages, kBarDqQ = 1;  // (named barrier 1: the consumers' Q / dO landed)
  DFLASH_DYN_SMEM(smem_raw);
  __shared__ int sExt[1 + NWG][4];  // as k_fwd_wg
  __shared__ alignas(8) uint64_t sBar[2 * NS];  // stage s: full (K and V landed), empty (every consumer warp is done)
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sO = base + ROWS * D * 2, sK = sO + ROWS * D * 2, sV = sK + NS * kDqWgKvBytes;
  const uint32_t bFull = smem_u32(&sBar[0]), bEmpty = bFull + 8 * NS;  // (stage s: + 8 s)
  const int tid = threadIdx.x, wga = warpgroup_index(), warp = (tid >> 5) & 3, lane = tid & 31, t4 = lane & 3;
  const bool loader = wga == NWG;  // the load warpgroup
  const int wgi = loader ? 0 : wga;  // (its rows see nothing, so its part in key_spans changes no span)
  const int nh = p.nh, nkv = p.nkv, mq = p.mq, hc = p.hc, rep = nh / nkv, splits = rep / hc;
  const int qtile = rows_item_qtile(), q0 = qtile * mq;  // (most keys first)
  const int g = blockIdx.x / splits, h0 = g * rep + (blockIdx.x % splits) * hc;
  if (tid == 0) {
    tma_prefetch_map(&maps.k1);
    tma_prefetch_map(&maps.v1);
    DFLASH_UNROLL
    for (int st = 0; st < NS; ++st) {
      mbar_init(bFull + 8 * st, 1);
      mbar_init(bEmpty + 8 * st, 4 * NWG);
    }
    mbar_init_fence();
  }  // (key_spans' CTA barriers order the initialisation before the first load and wait)

  auto qoff = [&](int r) -> int64_t {
    const int hh = r / mq, qi = q0 + r % mq;
    return hh < hc && qi < p.Tq ? (static_cast<int64_t>(qi) * nh + h0 + hh) * D : -1;
  };
  if (!loader) {  // Q and dO by the consumers (cp.async; waited for before their loop)
    stage_tile<ROWS, 128 * NWG>(sQ, p.q, qoff);
    stage_tile<ROWS, 128 * NWG>(sO, p.dout, qoff);
  }
  cp_async_commit();

  int lo1[2], hi1[2], lo2[2], hi2[2];
  bool rok[2];
  int64_t orow[2];
  float lse2[2], Dr[2];
  // (the load warpgroup's rows, 128 and up, are past the tile: rok false, no keys)
  attn_dq_rows<WIN>(p, wga * 64 + warp * 16 + (lane >> 2), q0, mq, hc, h0, D, rok, orow, lo1, hi1, lo2, hi2, lse2, Dr);
  KeySpan ks, mine;  // the CTA's key ranges (the tiles it loads) and this warpgroup's
  key_spans<NWG, WIN>(sExt, wgi, lo1, hi1, lo2, hi2, ks, mine);
  const int ext1 = ks.hi1, elo1 = ks.lo1, ehi = ks.hi2, elo = ks.lo2;
  const int nt1 = (ext1 - elo1 + KT - 1) / KT, nt = nt1 + (ehi - elo + KT - 1) / KT;
  if (loader) {
    // tile t's K and V into stage t % NS once every consumer warp has released the tile NS before it (rows past the
    // tensor's end zero-filled; rows past the CTA's last visible key are masked below, as in k_fwd_wg)
    setmaxnreg_dec<40>();
    if (warp != 0 || lane != 0) return;
    for (int t = 0; t < nt; ++t) {
      const int st = t % NS;
      if (t >= NS) mbar_wait(bEmpty + 8 * st, ((t / NS) & 1) ^ 1);
      const bool s1 = t < nt1;
      const int kt = s1 ? elo1 + t * KT : elo + (t - nt1) * KT;
      const uint32_t full = bFull + 8 * st, dK = sK + st * kDqWgKvBytes, dV = sV + st * kDqWgKvBytes;
      mbar_arrive_expect_tx(full, 2 * kDqWgKvBytes);
      tma_load_3d(dK, s1 ? &maps.k1 : &maps.k2, full, 0, g, kt);  // columns 0..63: panel 0
      tma_load_3d(dK + KT * 128, s1 ? &maps.k1 : &maps.k2, full, 64, g, kt);
      tma_load_3d(dV, s1 ? &maps.v1 : &maps.v2, full, 0, g, kt);
      tma_load_3d(dV + KT * 128, s1 ? &maps.v1 : &maps.v2, full, 64, g, kt);
    }
    return;
  }
  setmaxnreg_inc<232>();
  cp_async_wait<0>();  // this thread's Q and dO copies
  wg::fence_proxy_async();
  named_sync(kBarDqQ, 128 * NWG);  // every consumer's

  float dq[DT * 4];
  DFLASH_UNROLL
  for (int n = 0; n < DT * 4; ++n) dq[n] = 0.f;
  const float sl2 = p.scale * kLog2e;
  const uint32_t sQw = sQ + wgi * 64 * 128, sOw = sO + wgi * 64 * 128;

  for (int t = 0; t < nt; ++t) {
    const int st = t % NS;
    // tile t has landed (waited for even when this warpgroup skips it, so that its release counts towards the
    // stage's right phase)
    mbar_wait(bFull + 8 * st, (t / NS) & 1);
    const bool s1 = t < nt1;
    const int kt = s1 ? elo1 + t * KT : elo + (t - nt1) * KT;
    if (tile_visible<WIN>(mine, s1, kt, KT)) {
      const uint32_t tK = sK + st * kDqWgKvBytes, tV = sV + st * kDqWgKvBytes;
      float s[NT * 4], dp[NT * 4];
      wg::fence();
      wg::gemm_ss_kmajor<KT, D / 16>(s, sQw, ROWS, tK, KT);
      wg::commit();
      wg::gemm_ss_kmajor<KT, D / 16>(dp, sOw, ROWS, tV, KT);
      wg::commit();
      wg::wait<1>();  // S is ready; dP may still run
      wg::pin(s);
      int lo[2], hi[2];
      seg_bounds<WIN>(s1, lo1, hi1, lo2, hi2, lo, hi);
      bool full = true;  // as k_fwd_wg: the warp's rows all see the whole tile
      DFLASH_UNROLL
      for (int i = 0; i < 2; ++i) full = full && kt >= lo[i] && kt + KT <= hi[i];
      if (__all_sync(0xffffffffu, full)) {
        DFLASH_UNROLL
        for (int n = 0; n < NT * 4; ++n) s[n] = exp2_ftz(fmaf(s[n], sl2, -lse2[(n >> 1) & 1]));  // P
      } else {
        DFLASH_UNROLL
        for (int n = 0; n < NT; ++n)
          DFLASH_UNROLL
          for (int e = 0; e < 4; ++e) {
            const int i = e >> 1, key = kt + n * 8 + 2 * t4 + (e & 1);
            s[n * 4 + e] = key >= lo[i] && key < hi[i] ? exp2_ftz(fmaf(s[n * 4 + e], sl2, -lse2[i])) : 0.f;  // P
          }
      }
      wg::wait<0>();
      wg::pin(dp);
      uint32_t da[KT / 16][4];
      DFLASH_UNROLL
      for (int n = 0; n < NT; ++n) {
        da[n >> 1][(n & 1) * 2 + 0] =
            wg::pack_bf16x2(s[n * 4 + 0] * (dp[n * 4 + 0] - Dr[0]), s[n * 4 + 1] * (dp[n * 4 + 1] - Dr[0]));
        da[n >> 1][(n & 1) * 2 + 1] =
            wg::pack_bf16x2(s[n * 4 + 2] * (dp[n * 4 + 2] - Dr[1]), s[n * 4 + 3] * (dp[n * 4 + 3] - Dr[1]));
      }
      wg::gemm_rs_mnmajor_sync<D, KT / 16>(dq, da, tK, KT);  // (waits: the stage is read)
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bEmpty + 8 * st);  // this warp is done with tile t
  }
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    if (!rok[i]) continue;
    DFLASH_UNROLL
    for (int n = 0; n < DT; ++n)
      *reinterpret_cast<__nv_bfloat162*>(p.dq + orow[i] + n * 8 + 2 * t4) =
          __floats2bfloat162_rn(dq[n * 4 + 2 * i] * p.scale, dq[n * 4 + 2 * i + 1] * p.scale);
  }
#else
  __trap();  // (not the Hopper tier: never launched, common.cuh)
#endif
}

// ---- backward: dK, dV --------------------------------------------------------------------------------------------
// A CTA = 1 warpgroup owns 64 keys of one kv head (context tiles first, then block-key tiles, as k_dkv_tc) and walks
// the items (chunk of 64 queries, head of the kv group) whose chunk can see the tile: the chunks are listed first
// (sList, in query order) and run last chunk first, then Q / dO of item i + 1 load (cp.async) while item i computes:
//   S^T = K Q^T, dP^T = V dO^T (m64n64k16, K-major operands), P^T = exp2(S^T - lse), dS^T = P^T (dP^T - D),
//   dV += P^T dO, dK += dS^T Q (m64n128k16, P^T / dS^T from registers, dO / Q read MN-major).
// Each key's gradients are summed by one thread in item order and written once: deterministic, no float atomics
// (the first context tiles run as two CTAs, each summing half the items, and the second to finish adds the other's
// sums: DkvSplit below).
// An item's Q / dO come by TMA from thread 0 (maps; one full mbarrier per buffer), the CTA's K / V by cp.async.
constexpr int kDkvWgThreads = 128;
constexpr int kDkvWgKeys = 64;                              // keys per CTA
constexpr int kDkvWgQ = 64;                                 // queries per chunk
constexpr int kDkvWgMaxChunks = 1024;                       // Tq <= 65536 (else k_dkv_tc runs)
constexpr uint32_t kDkvWgTileBytes = 64 * kWgD * 2;         // [64][128] bf16: 16 KiB
constexpr size_t kDkvWgSmem = 6 * size_t{kDkvWgTileBytes} + 1024;  // K, V, Q x 2, dO x 2
// static __shared__ of k_dkv_wg: 6192 bytes for <true> (ptxas: sList 4096, sL, sDr, sHi, sLo 512 each, sWarp, sFull
// and sItem 16 each), plus ~1 KiB of slack
constexpr size_t kDkvWgStatic = 4 * kDkvWgMaxChunks + 16 + 16 * 64 + 2048;

// The heaviest context tiles split in two (load balance). Context tile j is seen by the chunks with an anchor past
// its keys: with anchors spread over the context, about (1 - j / n1) of them (n1 context tiles), so the first tiles
// carry the most items, and with two CTAs per SM tile 0's CTA (all chunks) outlasts an SM slot's average share: the
// SMs idled ~19% of the kernel's time (ncu, bench_attention's DFlash shapes: SM active cycles 81% of elapsed, and a
// list-scheduling model of the grid gave 79%; bench/NOTES.md 21). So the first `ns` context tiles run as two CTAs
// each, part 0 taking the even chunk slots of the tile's list and part 1 the odd ones; each writes its fp32 dK / dV
// sums to the Env's workspace and the second to finish adds the other's (a + b = b + a exactly: the result does not
// depend on which part finishes first) and writes the tile. launch_dflash_backward_wgmma picks ns from the same model
// (measured: splitting at 3/4 of a slot's share beat 1/2, 0.9 and 1.1; bench/NOTES.md 21). ns depends on the SM
// count, so dK / dV's last bits may differ between GPU models (as cuBLASLt's choice of algorithm may); on one model
// they do not change from run to run (op table: DFlashAttentionBackwardBitwise).
struct DkvSplit {
  int ns = 0;            // context tiles 0 .. ns - 1 split (0: none)
  float* ws = nullptr;   // [ns * nkv][2 parts][32][128 threads] float4: each part's dK (16 float4) and dV sums
  int* cnt = nullptr;    // [ns * nkv] parts finished, zero at the launch
};
// The grid's order, longest expected work first (the hardware starts CTAs in linear order): the halves of split
// tile j (weight (n1 - j) / 2 each, part 0 first), the whole context tiles k >= ns (weight n1 - k) merged with them
// by weight (a half first on a tie), then the block-key tiles. dkv_rank_half / dkv_rank_whole give an entry's
// position; dkv_tile_of inverts them by binary search (both increase along their lists). constexpr: also checked at
// compile time below.
constexpr int dkv_rank_half(int n1, int ns, int j, int part) {
  const int whole_before = (n1 + j + 1) / 2 - ns;  // whole tiles k >= ns with 2 (n1 - k) > n1 - j: k < (n1 + j) / 2
  return 2 * j + part + (whole_before > 0 ? whole_before : 0);
}
constexpr int dkv_rank_whole(int n1, int ns, int k) {
  const int halves = 2 * k - n1 + 1;  // split tiles j < ns with n1 - j >= 2 (n1 - k): j <= 2 k - n1
  return (k - ns) + 2 * (halves < 0 ? 0 : (halves > ns ? ns : halves));
}
// The last i in [lo, hi] with rank(i) <= y (rank increasing), or `none` when there is none: binary search.
template <class Rank>
constexpr int dkv_last_at_most(int lo, int hi, int y, int none, Rank rank) {
  int found = none;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (rank(mid) <= y) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}
// Grid row y -> (tile, part): part -1 for a whole tile. Tiles past the n1 context tiles are block-key tiles.
constexpr void dkv_tile_of(int y, int n1, int ns, int& tile, int& part) {
  part = -1;
  if (y >= n1 + ns) {
    tile = y - ns;
    return;
  }
  const int j = dkv_last_at_most(0, ns - 1, y, -1, [&](int i) { return dkv_rank_half(n1, ns, i, 0); });
  if (j >= 0 && y - dkv_rank_half(n1, ns, j, 0) < 2) {
    tile = j;
    part = y - dkv_rank_half(n1, ns, j, 0);
    return;
  }
  tile = dkv_last_at_most(ns, n1 - 1, y, ns, [&](int k) { return dkv_rank_whole(n1, ns, k); });
}
// Every row 0 .. n1 + ns - 1 maps to a distinct (tile, part), each split tile's two parts and each whole tile once.
constexpr bool dkv_order_is_permutation(int n1, int ns) {
  int seen[64 * 3] = {};  // (tile, part + 1)
  for (int y = 0; y < n1 + ns; ++y) {
    int t = 0, pt = 0;
    dkv_tile_of(y, n1, ns, t, pt);
    if (t < 0 || t >= n1 || (t < ns) != (pt >= 0) || seen[t * 3 + pt + 1]++) return false;
    if ((pt >= 0 && y != dkv_rank_half(n1, ns, t, pt)) || (pt < 0 && y != dkv_rank_whole(n1, ns, t))) return false;
  }
  return true;
}
static_assert(dkv_order_is_permutation(48, 20) && dkv_order_is_permutation(48, 0) && dkv_order_is_permutation(48, 48) &&
                  dkv_order_is_permutation(1, 1) && dkv_order_is_permutation(7, 3) && dkv_order_is_permutation(64, 63) &&
                  dkv_order_is_permutation(33, 1),
              "dK/dV grid order");

template <bool WIN>
__global__ void __launch_bounds__(kDkvWgThreads, 2) k_dkv_wg(AttnBwdParams p, const __grid_constant__ QdoMaps qm,
                                                            DkvSplit sp) {
#if DFLASH_HOPPER_DEVICE
  constexpr int D = kWgD, KN = kDkvWgKeys, QC = kDkvWgQ, NT = QC / 8, DT = D / 8;
  DFLASH_DYN_SMEM(smem_raw);
  __shared__ int sList[kDkvWgMaxChunks];
  __shared__ int sWarp[4];
  __shared__ alignas(16) float sL[2][QC];  // (float2 reads)
  __shared__ alignas(16) float sDr[2][QC];
  __shared__ int sFull[2][2];             // per buffer and half of the chunk: see put_meta
  __shared__ int sHi[2][QC], sLo[2][QC];  // per query: a_j (context tile) or j (block tile), -1 = sees nothing;
                                          // lo1 (context) or the slot (block), used with a window
  __shared__ alignas(8) uint64_t sItem[2];  // buffer b's Q and dO have landed (TMA bytes)
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = base, sV = base + kDkvWgTileBytes, sQ0 = base + 2 * kDkvWgTileBytes,
                 sO0 = base + 4 * kDkvWgTileBytes;  // Q / dO buffer b at sQ0 / sO0 + b * kDkvWgTileBytes
  const uint32_t bItem = smem_u32(&sItem[0]);  // (buffer b: + 8 b)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, t4 = lane & 3;
  if (tid == 0) {
    tma_prefetch_map(&qm.q);
    tma_prefetch_map(&qm.dout);
    mbar_init(bItem, 1);
    mbar_init(bItem + 8, 1);
    mbar_init_fence();
  }  // (the chunk listing's CTA barriers order the initialisation before any item's load: items > 0 needs a chunk)
  const int nh = p.nh, nkv = p.nkv, rep = nh / nkv, g = blockIdx.x, B = p.B;
  const int nt1 = (p.T1 + KN - 1) / KN;
  int tile = 0, part = -1;  // part 0 / 1: this CTA takes the even / odd chunk slots of a split tile (DkvSplit)
  dkv_tile_of(static_cast<int>(blockIdx.y), nt1, sp.ns, tile, part);
  const int cstep = part < 0 ? 1 : 2;
  const bool s1 = tile < nt1;
  const int k0 = s1 ? tile * KN : (tile - nt1) * KN, klim = s1 ? p.T1 : p.T2;
  const int64_t kstride = static_cast<int64_t>(nkv) * D;
  if (k0 < klim) {  // (a tile past klim has no items either)
    stage_rows<KN, kDkvWgThreads>(sK, (s1 ? p.k1 : p.k2) + k0 * kstride + g * D, kstride, klim - k0);
    stage_rows<KN, kDkvWgThreads>(sV, (s1 ? p.v1 : p.v2) + k0 * kstride + g * D, kstride, klim - k0);
  }
  cp_async_commit();

  // the chunks of 64 queries that can see a key of [k0, k0 + 64): context tile -> a valid block with a_j > k0
  // (and, with a window, lo1 < k0 + 64 for one of its queries in the chunk); block tile -> the valid blocks owning
  // those keys
  int q_lo = 0, q_hi = p.Tq;
  if (!s1) {
    q_lo = (k0 / B) * B;
    q_hi = min(p.Tq, ((min(k0 + KN, klim) - 1) / B + 1) * B);
  }
  const int nch = (q_hi - q_lo + QC - 1) / QC;
  int nvis = 0;
  for (int cb = 0; cb < nch; cb += kDkvWgThreads) {
    const int c = cb + tid;
    bool vis = false;
    if (c < nch) {
      const int qa = q_lo + c * QC, qb = min(qa + QC, q_hi);
      for (int j = qa / B; j * B < qb && !vis; ++j) {
        if (!p.valid[j]) continue;
        if (!s1) {
          vis = true;
          continue;
        }
        int a = p.anchors[j];
        a = a < 0 ? 0 : (a > p.T1 ? p.T1 : a);
        const int i0 = max(qa - j * B, 0);  // the block's first slot in the chunk has the smallest lo1
        vis = a > k0 && (!WIN || min(max(0, a + i0 - (p.window - 1)), a) < k0 + KN);
      }
    }
    const unsigned bal = __ballot_sync(0xffffffffu, vis);
    if (lane == 0) sWarp[warp] = __popc(bal);
    __syncthreads();
    int before = nvis, sum = 0;
    DFLASH_UNROLL
    for (int w = 0; w < 4; ++w) {
      before += w < warp ? sWarp[w] : 0;
      sum += sWarp[w];
    }
    if (vis) sList[before + __popc(bal & ((1u << lane) - 1u))] = c;
    nvis += sum;
    __syncthreads();
  }
  const int items = (part < 0 ? nvis : (nvis - part + 1) / 2) * rep;
  // An item's Q / dO go to shared memory by cp.async; its per-query values (validity, anchor, lse, D) are loaded
  // into registers one item ahead (fetch_meta) and only written to shared memory (put_meta) after the current
  // item's products, so their latency hides behind them.
  struct Meta {
    int q, a;
    unsigned char valid;
    float lse, dr;
  };
  // Items run from the last visible chunk down (chunk nvis - 1 - it / rep): every context tile sees the last chunks,
  // so the CTAs resident together read the same Q / dO rows at about the same time and find them in L2 (in query
  // order each tile started at its own first chunk and the concurrent CTAs streamed all of Q / dO from DRAM).
  // An item is (chunk slot ci: chunk sList[nvis - 1 - ci], first query row c0; head hh of the kv group), advanced
  // incrementally (head fastest) so the loop holds no division by rep.
  struct ItemPos {
    int ci, hh, c0;
  };
  auto chunk_row = [&](int ci) { return ci < nvis ? q_lo + sList[nvis - 1 - ci] * QC : q_lo; };
  auto advance = [&](ItemPos& ip) {
    if (++ip.hh == rep) {
      ip.hh = 0;
      ip.c0 = chunk_row(ip.ci += cstep);
    }
  };
  // rows past Tq are zero-filled; rows in [q_hi, Tq) are loaded but their metadata marks them invisible (P^T = 0)
  auto stage_item = [&](const ItemPos& ip, int buf) {
    if (tid != 0) return;
    const uint32_t full = bItem + 8 * buf, dQ = sQ0 + buf * kDkvWgTileBytes, dO = sO0 + buf * kDkvWgTileBytes;
    const int h = g * rep + ip.hh;
    mbar_arrive_expect_tx(full, 2 * kDkvWgTileBytes);
    tma_load_3d(dQ, &qm.q, full, 0, h, ip.c0);  // columns 0..63: panel 0
    tma_load_3d(dQ + QC * 128, &qm.q, full, 64, h, ip.c0);
    tma_load_3d(dO, &qm.dout, full, 0, h, ip.c0);
    tma_load_3d(dO + QC * 128, &qm.dout, full, 64, h, ip.c0);
  };
  auto fetch_meta = [&](const ItemPos& ip) {
    Meta m{0, 0, 0, 0.f, 0.f};
    m.q = ip.c0 + tid;
    if (tid < QC && m.q < q_hi) {
      const int j = m.q / B;
      const int64_t row = static_cast<int64_t>(m.q) * nh + g * rep + ip.hh;
      m.valid = p.valid[j];
      m.a = p.anchors[j];
      m.lse = p.lse[row];
      m.dr = p.Dr[row];
    }
    return m;
  };
  // put_meta also sets sFull[buf][w] (warps 0 and 1, 32 queries each): every query of the half sees every key of
  // the (context) tile, so the item's products need no mask.
  auto put_meta = [&](const Meta& m, int buf) {
    if (tid >= QC) return;
    int hi = -1, lo = 0;
    if (m.valid) {
      const int a = m.a < 0 ? 0 : (m.a > p.T1 ? p.T1 : m.a), j = m.q / B;
      hi = s1 ? a : j;
      lo = s1 ? (WIN ? min(max(0, a + m.q % B - (p.window - 1)), a) : 0) : m.q % B;
    }
    const bool full = m.valid && s1 && k0 + KN <= hi && k0 + KN <= klim && (!WIN || lo <= k0);
    const bool all = __all_sync(0xffffffffu, full);
    if (lane == 0) sFull[buf][warp] = all;
    sHi[buf][tid] = hi;
    sLo[buf][tid] = lo;
    sL[buf][tid] = m.valid ? m.lse * kLog2e : 0.f;
    sDr[buf][tid] = m.valid ? m.dr : 0.f;
  };
  ItemPos nxt{part < 0 ? 0 : part, 0, chunk_row(part < 0 ? 0 : part)};  // item 0, then (in the loop) item it + 1
  if (items > 0) {
    stage_item(nxt, 0);
    put_meta(fetch_meta(nxt), 0);
    advance(nxt);
  }
  cp_async_commit();

  float dk[DT * 4], dv[DT * 4];
  DFLASH_UNROLL
  for (int n = 0; n < DT * 4; ++n) dk[n] = dv[n] = 0.f;
  const float sl2 = p.scale * kLog2e;
  int key[2], kblk[2], kslot[2];
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    key[i] = k0 + warp * 16 + (lane >> 2) + 8 * i;
    kblk[i] = key[i] / B;
    kslot[i] = key[i] % B;
  }

  for (int it = 0; it < items; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();  // K and V have landed (this thread's copies; nothing left in flight after item 0)
    wg::fence_proxy_async();
    mbar_wait(bItem + 8 * buf, (it >> 1) & 1);  // item it's Q / dO have landed
    __syncthreads();  // ... everyone's K / V, and item it's metadata; item it - 1's buffers are free: one barrier per item
    const bool nomask = sFull[buf][0] && sFull[buf][1];  // (read before the products: its latency hides)
    Meta next{0, 0, 0, 0.f, 0.f};
    if (it + 1 < items) {
      stage_item(nxt, buf ^ 1);
      next = fetch_meta(nxt);
      advance(nxt);  // (item it + 2's chunk row is read from sList here, used in the next iteration)
    }
    cp_async_commit();
    const uint32_t tQ = sQ0 + buf * kDkvWgTileBytes, tO = sO0 + buf * kDkvWgTileBytes;
    float s[NT * 4], dp[NT * 4];
    wg::fence();
    wg::gemm_ss_kmajor<QC, D / 16>(s, sK, KN, tQ, QC);
    wg::commit();
    wg::gemm_ss_kmajor<QC, D / 16>(dp, sV, KN, tO, QC);
    wg::commit();
    // this thread's queries' lse, read while the products run (after the wait, the loads' latency stalled the
    // exponentials: ncu's short-scoreboard stalls on their first FFMAs, bench/NOTES.md 21)
    float2 lv[NT];
    DFLASH_UNROLL
    for (int n = 0; n < NT; ++n) lv[n] = *reinterpret_cast<const float2*>(&sL[buf][n * 8 + 2 * t4]);
    wg::wait<1>();  // S^T is ready; dP^T may still run
    wg::pin(s);
    if (nomask) {
      DFLASH_UNROLL
      for (int n = 0; n < NT; ++n) {
        const float2 l2 = lv[n];
        DFLASH_UNROLL
        for (int e = 0; e < 4; ++e) s[n * 4 + e] = exp2_ftz(fmaf(s[n * 4 + e], sl2, -((e & 1) ? l2.y : l2.x)));  // P^T
      }
    } else {
      DFLASH_UNROLL
      for (int n = 0; n < NT; ++n)
        DFLASH_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1, qc = n * 8 + 2 * t4 + (e & 1), hi = sHi[buf][qc];
          // spec 2.3 as dflash_row_bounds: context keys [lo1, a_j), block keys of block j (a prefix with a window)
          bool vis = key[i] < klim && (s1 ? key[i] < hi : (hi >= 0 && kblk[i] == hi));
          if constexpr (WIN) vis = vis && (s1 ? key[i] >= sLo[buf][qc] : kslot[i] <= sLo[buf][qc]);
          const float pe = exp2_ftz(fmaf(s[n * 4 + e], sl2, -((e & 1) ? lv[n].y : lv[n].x)));  // (every element: no branch)
          s[n * 4 + e] = vis ? pe : 0.f;  // P^T
        }
    }
    // dV += P^T dO is issued before dS^T is formed (it needs only P^T), so dS^T's arithmetic runs under it
    uint32_t pa[QC / 16][4], da[QC / 16][4];
    DFLASH_UNROLL
    for (int n = 0; n < NT; ++n) {
      pa[n >> 1][(n & 1) * 2 + 0] = wg::pack_bf16x2(s[n * 4 + 0], s[n * 4 + 1]);
      pa[n >> 1][(n & 1) * 2 + 1] = wg::pack_bf16x2(s[n * 4 + 2], s[n * 4 + 3]);
    }
    wg::pin(dv);
    wg::pin(pa);
    wg::fence();
    wg::gemm_rs_mnmajor<D, QC / 16>(dv, pa, tO, QC);
    wg::commit();
    wg::wait<1>();  // dP^T is ready (S^T was); dV's product may still run
    wg::pin(dp);
    DFLASH_UNROLL
    for (int n = 0; n < NT; ++n) {
      float d4[4];
      const float2 dr2 = *reinterpret_cast<const float2*>(&sDr[buf][n * 8 + 2 * t4]);
      DFLASH_UNROLL
      for (int e = 0; e < 4; ++e) d4[e] = s[n * 4 + e] * (dp[n * 4 + e] - ((e & 1) ? dr2.y : dr2.x));  // dS^T
      da[n >> 1][(n & 1) * 2 + 0] = wg::pack_bf16x2(d4[0], d4[1]);
      da[n >> 1][(n & 1) * 2 + 1] = wg::pack_bf16x2(d4[2], d4[3]);
    }
    wg::pin(dk);
    wg::pin(da);
    wg::fence();
    wg::gemm_rs_mnmajor<D, QC / 16>(dk, da, tQ, QC);
    wg::commit();
    wg::wait<0>();
    wg::pin(pa);
    wg::pin(da);
    wg::pin(dv);
    wg::pin(dk);
    if (it + 1 < items) put_meta(next, buf ^ 1);  // (buffer buf ^ 1's metadata was last read in item it - 1)
  }
  cp_async_wait<0>();  // (no item: K / V copies still count as in flight)
  if (part >= 0) {
    // a split tile: this part's sums to the workspace (float4 i of thread t at i * 128 + t: coalesced), then the
    // second part to finish adds the other's and writes the tile (the classic split-K semaphore: stores, fence,
    // counter; the reader's loads after it by ld.global.cg, past L1)
    const int pair = tile * nkv + g;
    float4* mine = reinterpret_cast<float4*>(sp.ws) + (static_cast<size_t>(pair) * 2 + part) * (32 * kDkvWgThreads);
    const float4* other = reinterpret_cast<const float4*>(sp.ws) + (static_cast<size_t>(pair) * 2 + (part ^ 1)) * (32 * kDkvWgThreads);
    DFLASH_UNROLL
    for (int i = 0; i < DT; ++i) {
      mine[i * kDkvWgThreads + tid] = make_float4(dk[4 * i], dk[4 * i + 1], dk[4 * i + 2], dk[4 * i + 3]);
      mine[(DT + i) * kDkvWgThreads + tid] = make_float4(dv[4 * i], dv[4 * i + 1], dv[4 * i + 2], dv[4 * i + 3]);
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) sWarp[0] = atomicAdd(sp.cnt + pair, 1);
    __syncthreads();
    if (sWarp[0] == 0) return;  // the other part writes the tile
    __threadfence();
    DFLASH_UNROLL
    for (int i = 0; i < DT; ++i) {
      const float4 a = __ldcg(other + i * kDkvWgThreads + tid), b = __ldcg(other + (DT + i) * kDkvWgThreads + tid);
      dk[4 * i] += a.x;
      dk[4 * i + 1] += a.y;
      dk[4 * i + 2] += a.z;
      dk[4 * i + 3] += a.w;
      dv[4 * i] += b.x;
      dv[4 * i + 1] += b.y;
      dv[4 * i + 2] += b.z;
      dv[4 * i + 3] += b.w;
    }
  }
  bf16* dK = s1 ? p.dk1 : p.dk2;
  bf16* dV = s1 ? p.dv1 : p.dv2;
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    if (key[i] >= klim) continue;
    const int64_t off = (static_cast<int64_t>(key[i]) * nkv + g) * D;
    DFLASH_UNROLL
    for (int n = 0; n < DT; ++n) {
      const int c = n * 8 + 2 * t4;
      *reinterpret_cast<__nv_bfloat162*>(dK + off + c) =
          __floats2bfloat162_rn(dk[n * 4 + 2 * i] * p.scale, dk[n * 4 + 2 * i + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(dV + off + c) = __floats2bfloat162_rn(dv[n * 4 + 2 * i], dv[n * 4 + 2 * i + 1]);
    }
  }
#else
  __trap();  // (not the Hopper tier: never launched, common.cuh)
#endif
}

}  // namespace

void attention_wgmma_init_attributes(int smem_optin) {
  constexpr int K1 = fwd_wg_keys(128), K2 = fwd_wg_keys(256);
  if (static_cast<size_t>(smem_optin) >= fwd_wg_smem(128, kFwdWgs) + kFwdWgStatic) {  // else never launched
    allow_dynamic_smem(smem_optin, k_fwd_wg<128, kFwdWgs, K1, false, false>, k_fwd_wg<128, kFwdWgs, K1, true, false>,
                       k_fwd_wg<128, kFwdWgs, K1, false, true>);
  }
  if (static_cast<size_t>(smem_optin) >= fwd_wg_smem(256, kFwdWgs) + kFwdWgStatic)
    allow_dynamic_smem(smem_optin, k_fwd_wg<256, kFwdWgs, K2, false, false>, k_fwd_wg<256, kFwdWgs, K2, false, true>);
  if (static_cast<size_t>(smem_optin) >= std::max(kDkvWgSmem + kDkvWgStatic, kDqWgSmem + 1024)) {
    allow_dynamic_smem(smem_optin, k_dq_wg<kDqWgs, false>, k_dq_wg<kDqWgs, true>, k_dkv_wg<false>, k_dkv_wg<true>);
  }
}

namespace {
// Launches kernel(args...) on the stream with programmatic stream serialisation (the CUDA runtime's
// cudaLaunchAttributeProgrammaticStreamSerialization): it may begin before the stream's previous kernel has
// completed, as pdl_trigger / pdl_wait above allow. Throws, naming the kernel, if the launch fails (check_launch: the
// runtime records the launch's error as its last one).
template <class... P, class... A>
void launch_pdl(const char* name, dim3 grid, int threads, size_t smem, cudaStream_t stream, void (*kernel)(P...),
                A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  check_launch(name);
}

// The TMA map of a [T, heads, d] bf16 tensor at base (16-byte aligned; K / V, or dK/dV's Q / dO; d = 128, or 256 in
// the forward): dimensions (d, heads, T) innermost first, boxes of 64 columns x 1 head x box_rows rows (128 bytes per
// box row: one SW128 panel, CU_TENSOR_MAP_SWIZZLE_128B as wgmma.cuh lays it out; a tile takes d / 64 of them), rows
// past T zero-filled. An absent tensor (T = 0) gets a map over one row at `dummy` that no tile reads.
// cuTensorMapEncodeTiled comes through the runtime's driver entry point, so nothing links libcuda. Throws with the
// driver's error code if the encoding fails.
CUtensorMap kv_map(const void* base, int64_t T, int heads, int box_rows, const void* dummy, int d = kWgD) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (T == 0 || base == nullptr) {
    base = dummy;
    T = 1;
    heads = 1;
  }
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(T)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d) * 2, static_cast<cuuint64_t>(heads) * d * 2};  // bytes
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_rows)}, elem[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DFLASH_CHECK(r == CUDA_SUCCESS, "attention (cuda): cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r),
               ") for a [", T, ", ", heads, ", ", d, "] tensor");
  return map;
}
KvMaps kv_maps(const void* k1, const void* v1, int64_t T1, const void* k2, const void* v2, int64_t T2, int nkv,
               int box_rows, const void* dummy, int d = kWgD) {
  KvMaps m;
  m.k1 = kv_map(k1, T1, nkv, box_rows, dummy, d);
  m.v1 = kv_map(v1, T1, nkv, box_rows, dummy, d);
  m.k2 = kv_map(k2, T2, nkv, box_rows, dummy, d);
  m.v2 = kv_map(v2, T2, nkv, box_rows, dummy, d);
  return m;
}
}  // namespace

#ifdef DFLASH_FWD_TIMELINE
// Summary of the last k_fwd_wg launch's per-CTA timeline (diagnostic build): the shares of the SMs' time (the span
// from the first CTA's entry to the last one's exit, times the CTAs) each CTA's consumer 0 spent before its items'
// loops (hand-over, Q), in the loops, in the epilogues, and idle before its entry / after its exit; per item and
// per tile means.
void attn_fwd_timeline_report(const char* label) {
  cudaDeviceSynchronize();
  int n = 0;
  cudaMemcpyFromSymbol(&n, g_tl_n, sizeof n);
  n = std::min(n, kTlMax);
  std::vector<unsigned long long> clk(static_cast<size_t>(kTlMax) * 4), ns(static_cast<size_t>(kTlMax) * 2);
  std::vector<int> nt(kTlMax), items(kTlMax);
  cudaMemcpyFromSymbol(clk.data(), g_tl_clk, clk.size() * 8);
  cudaMemcpyFromSymbol(ns.data(), g_tl_ns, ns.size() * 8);
  cudaMemcpyFromSymbol(nt.data(), g_tl_nt, nt.size() * 4);
  cudaMemcpyFromSymbol(items.data(), g_tl_items, items.size() * 4);
  std::vector<unsigned long long> sub(static_cast<size_t>(kTlMax) * kTlSubs);
  cudaMemcpyFromSymbol(sub.data(), g_tl_sub, sub.size() * 8);
  if (n == 0) return;
  unsigned long long t0 = ~0ull, t1 = 0;
  double pre = 0, loop = 0, epi = 0, head = 0, tail = 0, tiles = 0, nit = 0, busy_ns = 0;
  for (int i = 0; i < n; ++i) {
    t0 = std::min(t0, ns[i * 2]);
    t1 = std::max(t1, ns[i * 2 + 1]);
  }
  for (int i = 0; i < n; ++i) {
    pre += double(clk[i * 4 + 1]);
    loop += double(clk[i * 4 + 2]);
    epi += double(clk[i * 4 + 3]);
    tiles += nt[i];
    nit += items[i];
    head += double(ns[i * 2] - t0);
    tail += double(t1 - ns[i * 2 + 1]);
    busy_ns += double(ns[i * 2 + 1] - ns[i * 2]);
  }
  const double cyc = pre + loop + epi, ghz = cyc / std::max(busy_ns, 1.0);  // (the three cover entry to exit)
  const double tot = double(t1 - t0) * n / 100.0;                           // ns
  std::printf("TIMELINE %s: %d CTAs, span %.1f us at ~%.2f GHz, %.0f items, %.0f tiles (%.2f us per tile in the "
              "loops); share of SM time: before loops %.1f%%, loops %.1f%%, epilogues %.1f%%, idle before entry %.1f%%, "
              "after exit %.1f%%; per item: before loop %.2f us, epilogue %.2f us\n",
              label, n, double(t1 - t0) / 1e3, ghz, nit, tiles, loop / ghz / std::max(tiles, 1.0) / 1e3,
              pre / ghz / tot, loop / ghz / tot, epi / ghz / tot, head / tot, tail / tot,
              pre / ghz / std::max(nit, 1.0) / 1e3, epi / ghz / std::max(nit, 1.0) / 1e3);
  std::printf("TIMELINE %s: per item (us):", label);
  for (int k = 0; k < kTlSubs; ++k) {
    double a = 0;
    for (int i = 0; i < n; ++i) a += double(sub[i * kTlSubs + k]);
    std::printf(" %s %.2f%s", kTlSub[k], a / ghz / std::max(nit, 1.0) / 1e3, k + 1 < kTlSubs ? "," : "\n");
  }
  std::fflush(stdout);
}
#endif

namespace {
// The forward at head dim D (k_fwd_wg<D, ...>): the checks of launch_attention_forward_wgmma passed but the
// alignment's; false (launching nothing) where it does not apply.
template <int D>
bool launch_fwd_wg(Env& e, const AttnFwdParams& p0, const AttnSegs& segs) {
  constexpr int KT = fwd_wg_keys(D);
  constexpr size_t smem = fwd_wg_smem(D, kFwdWgs);
  if (smem + kFwdWgStatic > static_cast<size_t>(e.smem_limit)) return false;
  if (!aligned16(p0.q) || !aligned16(p0.k1) || !aligned16(p0.v1) || !aligned16(p0.out)) return false;
  if (p0.k2 && (!aligned16(p0.k2) || !aligned16(p0.v2))) return false;
  AttnFwdParams p = p0;
  attn_rows_tiling(p.nh, p.nkv, 64 * kFwdWgs, p.hc, p.mq);
  p.nk = KT;
  // a persistent grid: one CTA per SM, or one per item when there are fewer (packed: p.Tq is the longest sequence;
  // the items past a shorter one's end are skipped)
  const int64_t items = (p.Tq + p.mq - 1) / p.mq * p.nkv * (p.nh / p.nkv / p.hc) * std::max(segs.n, 1);
  if (items > INT32_MAX) return false;
  if (items == 0) return true;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(items, e.num_sms)));
  constexpr int threads = 128 * (kFwdWgs + 1);
  int64_t qrows = p.Tq;  // (packed: q's rows run to the last sequence's end)
  for (int z = 0; z < segs.n; ++z) qrows = std::max<int64_t>(qrows, int64_t{segs.begin[z]} + segs.len[z]);
  QoMaps qo;
  qo.q = kv_map(p.q, qrows, p.nh, p.mq, p.q, D);
  qo.o = kv_map(p.out, qrows, p.nh, p.mq, p.q, D);
  if (segs.n > 0) {
    DFLASH_CHECK(p.mode == kAttnCausal && p.k2 == nullptr, "attention (cuda): batched sequences are causal");
    SeqMaps sm;
    for (int z = 0; z < segs.n; ++z) {
      sm.k[z] = kv_map(segs.k[z], segs.tk[z], p.nkv, KT, p.q, D);
      sm.v[z] = kv_map(segs.v[z], segs.tk[z], p.nkv, KT, p.q, D);
    }
    launch_pdl("attention_forward_wgmma", grid, threads, smem, e.stream, k_fwd_wg<D, kFwdWgs, KT, false, true>, p,
               segs, sm, qo);
    return true;
  }
  const KvMaps maps = kv_maps(p.k1, p.v1, p.T1, p.k2, p.v2, p.k2 ? p.T2 : 0, p.nkv, KT, p.q, D);
  if constexpr (D == 128) {
    launch_pdl("attention_forward_wgmma", grid, threads, smem, e.stream,
               p.mode == kAttnDFlash && p.window > 0 ? k_fwd_wg<D, kFwdWgs, KT, true, false>
                                                     : k_fwd_wg<D, kFwdWgs, KT, false, false>,
               p, segs, maps, qo);
  } else {  // (no window at 256: launch_attention_forward_wgmma takes only unwindowed causal calls there)
    launch_pdl("attention_forward_wgmma", grid, threads, smem, e.stream, k_fwd_wg<D, kFwdWgs, KT, false, false>, p,
               segs, maps, qo);
  }
  return true;
}
}  // namespace

bool launch_attention_forward_wgmma(Env& e, const AttnFwdParams& p0, const AttnSegs& segs) {
  if (e.tier != KernelTier::Hopper || !e.attn_wgmma) return false;  // (DFLASH_ATTN_WGMMA=0: the mma.sync forward)
  if (p0.mode == kAttnCausal && p0.window > 0) return false;  // (its causal rows start at key 0: the mma.sync kernel)
  if (p0.d == 128) return launch_fwd_wg<128>(e, p0, segs);
  // head dim 256: the target's causal attention (sinks too; no window, above); DFlash attention at 256 stays on the
  // mma.sync kernel (no drafter has it)
  if (p0.d == 256 && p0.mode == kAttnCausal) return launch_fwd_wg<256>(e, p0, segs);
  return false;
}

bool launch_dflash_backward_wgmma(Env& e, const AttnBwdParams& p0) {
  if (e.tier != KernelTier::Hopper) return false;
  if (p0.d != kWgD || p0.Tq > kDkvWgMaxChunks * kDkvWgQ) return false;
  if (std::max(kDkvWgSmem + kDkvWgStatic, kDqWgSmem + 1024) > static_cast<size_t>(e.smem_limit)) return false;
  // (the caller, launch_dflash_backward_tc, has checked the 16-byte alignment of every tensor)
  const int64_t tiles = (p0.T1 + kDkvWgKeys - 1) / kDkvWgKeys + (p0.T2 + kDkvWgKeys - 1) / kDkvWgKeys;
  if (tiles > 65535) return false;  // (attention_tc.cu refuses it with the message, before launching anything)
  AttnBwdParams p = p0;
  attn_rows_tiling(p.nh, p.nkv, 64 * kDqWgs, p.hc, p.mq);
  p.nk = kDqWgKeys;
  dim3 grid_q;
  if (!rows_grid((p.Tq + p.mq - 1) / p.mq, static_cast<int64_t>(p.nkv) * (p.nh / p.nkv / p.hc), grid_q))
    return false;
  const KvMaps maps = kv_maps(p.k1, p.v1, p.T1, p.k2, p.v2, p.k2 ? p.T2 : 0, p.nkv, kDqWgKeys, p.q);
  if (p.window > 0)
    DFLASH_LAUNCH(grid_q, kDqWgThreads, kDqWgSmem, e.stream, k_dq_wg<kDqWgs, true>)(p, maps);
  else
    DFLASH_LAUNCH(grid_q, kDqWgThreads, kDqWgSmem, e.stream, k_dq_wg<kDqWgs, false>)(p, maps);
  check_launch("dflash_attention_dq_wgmma");
  if (tiles == 0) return true;
  // The split context tiles (DkvSplit): the model's expected items of context tile j, I0 (1 - j / n1) (I0: every
  // chunk times the query heads of a kv group), against a CTA slot's average share of the grid's work (2 CTAs per
  // SM); tile j splits while its items exceed 3/4 of that share (the model put the busiest slot within 1% of the
  // average for bench_attention's shapes). A sliding window spreads the work evenly: no split.
  const int n1 = static_cast<int>((p.T1 + kDkvWgKeys - 1) / kDkvWgKeys), n2 = static_cast<int>(tiles) - n1;
  DkvSplit sp;
  if (p.window <= 0 && n1 > 0) {
    const double i0 = std::ceil(p.Tq / double(kDkvWgQ)) * (p.nh / p.nkv);
    const double per_block_tile = (p.nh / p.nkv) * 2.0;  // (a block-key tile: its own chunk or two)
    const double work = p.nkv * (i0 * (n1 + 1) / 2.0 + per_block_tile * n2), share = work / (2.0 * e.num_sms);
    while (sp.ns < n1 && i0 * (1.0 - double(sp.ns) / n1) > 0.75 * share) ++sp.ns;
  }
  // The sums and counters live in the Env's workspace (stream-ordered scratch, a fixed size): ns is capped to what
  // fits, so the kernel's memory does not grow with the sequence (case C03); the counters are zeroed per launch.
  constexpr size_t kPairBytes = 2 * 32 * kDkvWgThreads * sizeof(float4);
  auto cnt_span = [&](int ns) { return (static_cast<size_t>(ns) * p.nkv * sizeof(int) + 255) / 256 * 256; };
  auto fits = [&](int ns) { return cnt_span(ns) + static_cast<size_t>(ns) * p.nkv * kPairBytes <= e.workspace_bytes; };
  while (sp.ns > 0 && (!fits(sp.ns) || tiles + sp.ns > 65535)) --sp.ns;  // (grid.y: the tiles and the split ones)
  if (sp.ns > 0) {
    sp.cnt = static_cast<int*>(e.workspace);
    sp.ws = reinterpret_cast<float*>(static_cast<char*>(e.workspace) + cnt_span(sp.ns));
    DFLASH_CUDA_CHECK(cudaMemsetAsync(sp.cnt, 0, static_cast<size_t>(sp.ns) * p.nkv * sizeof(int), e.stream));
  }
  const dim3 grid(static_cast<unsigned>(p.nkv), static_cast<unsigned>(tiles + sp.ns));
  QdoMaps qm;
  qm.q = kv_map(p.q, p.Tq, p.nh, kDkvWgQ, p.q);
  qm.dout = kv_map(p.dout, p.Tq, p.nh, kDkvWgQ, p.q);
  if (p.window > 0)
    DFLASH_LAUNCH(grid, kDkvWgThreads, kDkvWgSmem, e.stream, k_dkv_wg<true>)(p, qm, sp);
  else
    DFLASH_LAUNCH(grid, kDkvWgThreads, kDkvWgSmem, e.stream, k_dkv_wg<false>)(p, qm, sp);
  check_launch("dflash_attention_dkv_wgmma");
  return true;
}

size_t attention_wgmma_fwd_smem(int D) {
  return (D == 128 ? fwd_wg_smem(128, kFwdWgs) : fwd_wg_smem(256, kFwdWgs)) + kFwdWgStatic;
}
size_t attention_wgmma_bwd_smem() { return std::max(kDkvWgSmem + kDkvWgStatic, kDqWgSmem + 1024); }

#else  // DFLASH_CUDA_EMU: no warpgroup MMA in the emulator

size_t attention_wgmma_fwd_smem(int) { return SIZE_MAX; }
size_t attention_wgmma_bwd_smem() { return SIZE_MAX; }
void attention_wgmma_init_attributes(int) {}
bool launch_attention_forward_wgmma(Env&, const AttnFwdParams&, const AttnSegs&) { return false; }
bool launch_dflash_backward_wgmma(Env&, const AttnBwdParams&) { return false; }

#endif

}  // namespace dflash::cuda
