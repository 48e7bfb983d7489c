// cuda/moe.cu — the Mixture-of-Experts ops (backend/context.h): routing, grouping by expert, the grouped expert GEMM
// and the weighted combine. No op reads a count back to the host: a MoE layer runs without a host synchronisation,
// and the launch sizes depend only on T, k, E and the weights' shapes (never on how the tokens were routed).
//
//  moe_route    one warp per token: the fp32 softmax over E <= 1024 logits (E / 32 per lane in registers), the k
//               largest by k warp arg-max reductions (logit descending, expert index ascending on ties); with
//               sigmoid scores (MoeRouteOpts) each lane's p = sigmoid(z) and the choice value p + bias instead, and
//               with groups (DeepSeek-V3) the groups outside the topk_group best marked taken first.
//  moe_group    three small kernels over chunks of 64 tokens: per-chunk expert counts, one block scanning them into
//               the experts' offsets and each chunk's starting row per expert (all its threads over the counts,
//               kMaxExperts / E per expert column), then each chunk placing its pairs
//               (a thread per expert walking the chunk in token order: every expert's rows stay in token order).
//  moe_linear   the grouped GEMM. Tiles of 128 grouped rows x BN columns never straddle two experts; the tiles of
//               expert e are numbered from tile_off[e] (a warp's scan of ceil(count_e / 128)), the grid is sized to
//               the most tiles any routing can need (ceil(R / 128) + E per column tile) and blocks past the last
//               tile exit at once. Hopper kernel (k_moe_gemm_wg): one producer warpgroup loads A — the tile's rows
//               of x, gathered through `rows` — by cp.async into 128-byte-swizzled panels, and thread 0 the weight
//               tile by TMA (BN / 64 boxes of 64 rows: for SwiGLU the expert's gate rows h0.. and up rows N + h0..,
//               so the tile's BN columns are BN / 2 gate and BN / 2 up columns of the same outputs); a ring of NS
//               stages with full / empty mbarriers; two consumer warpgroups each issue wgmma m64nBNk16 over their
//               64 rows (fp32 accumulators) and write the epilogue (the SwiGLU of each thread's gate column c and up
//               column c + BN / 2, which the m64nBN accumulator layout puts in the same thread) straight to y in
//               bf16. BN = 256 with 4 stages is the default (bench/NOTES.md 23: 1.5x the 128-column tiles).
//               MXFP4 and INT4 weights: k_moe_gemm_fp4, the product transposed (y^T = W x^T) with the weights as
//               wgmma's A operand from registers, dequantised by the consumer threads (bench/NOTES.md 25).
//               Any other shape (K or N odd, K not a multiple of 8) and the CPU emulator run a plain tiled kernel.
//  moe_combine  one block per token: the k rows of y weighted and summed in fp32 in slot order, + beta out.
#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/mma_sync.cuh"
#include "backend/cuda/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !DFLASH_HOPPER_DEVICE
#pragma nv_diag_suppress 177  // (the Hopper kernels' helpers, unused where their bodies are traps: common.cuh)
#endif

namespace dflash::cuda {

namespace {

constexpr int kGroupChunk = 64;     // tokens per chunk of moe_group
constexpr int kMoeDefaultVariant = 1;  // the Hopper grouped GEMM's variant when Env::moe_variant is unset (-1): 256 columns
constexpr int kMaxExperts = 1024;   // moe_route keeps E / 32 logits per lane; moe_group scans E in one block

// ---- moe_route ------------------------------------------------------------------------------------------------------
// SIGMOID (MoeScore::Sigmoid): p = sigmoid(z) per expert, the top k of p + bias (bias may be null), w = p. With
// groups (ng > 1: MoeRouteOpts::n_group, tg = topk_group) the warp writes its choice values to shared memory, lane g
// sums group g's two largest, tg warp arg-max rounds keep the groups, and the other groups' experts are marked taken
// before the top-k rounds. scale multiplies the weights.
struct RouteGroups {
  int ng = 1, tg = 1;
  float scale = 1.f;
};
template <int EPL, bool SIGMOID>  // experts per lane: E <= 32 EPL
__global__ void k_moe_route(const bf16* __restrict__ logits, int64_t T, int E, int k, bool normalize,
                            const float* __restrict__ bias, int32_t* __restrict__ idx, float* __restrict__ weights,
                            RouteGroups grp) {
  DFLASH_DYN_SMEM(route_smem);  // with groups: [warps per block][E] F32
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= T) return;
  const bf16* z = logits + t * E;
  float v[EPL];  // softmax: the logits; sigmoid: p + bias, the value that chooses
  float s[EPL];  // sigmoid: p
  unsigned taken = 0;  // bit i: this lane's expert lane + 32 i already chosen
  float mx = -INFINITY;
  DFLASH_UNROLL
  for (int i = 0; i < EPL; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? __bfloat162float(z[e]) : -INFINITY;
    if (e >= E) taken |= 1u << i;
    if constexpr (SIGMOID) {
      s[i] = e < E ? 1.f / (1.f + expf(-v[i])) : 0.f;
      if (e < E) v[i] = s[i] + (bias ? bias[e] : 0.f);
    }
    mx = fmaxf(mx, v[i]);
  }
  if constexpr (SIGMOID) {
    if (grp.ng > 1) {
      float* c = reinterpret_cast<float*>(route_smem) + (threadIdx.x >> 5) * E;
      DFLASH_UNROLL
      for (int i = 0; i < EPL; ++i)
        if (lane + 32 * i < E) c[lane + 32 * i] = v[i];
      __syncwarp();
      const int gs = E / grp.ng;
      float gsc = -INFINITY;  // lane g < ng: group g's score, the sum of its two largest choice values
      if (lane < grp.ng) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int i = 0; i < gs; ++i) {
          const float x = c[lane * gs + i];
          if (x > b1) {
            b2 = b1;
            b1 = x;
          } else if (x > b2) {
            b2 = x;
          }
        }
        gsc = b1 + b2;
      }
      unsigned kept = 0;  // bit g: group g kept (every lane holds the same mask)
      for (int j = 0; j < grp.tg; ++j) {
        float bv = lane < grp.ng && !(kept >> lane & 1u) ? gsc : -INFINITY;
        int bg = lane < grp.ng && !(kept >> lane & 1u) ? lane : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
          const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
          const int og = __shfl_xor_sync(0xffffffffu, bg, o);
          if (og != INT_MAX && (bg == INT_MAX || ov > bv || (ov == bv && og < bg))) {
            bv = ov;
            bg = og;
          }
        }
        kept |= 1u << bg;
      }
      DFLASH_UNROLL
      for (int i = 0; i < EPL; ++i) {
        const int e = lane + 32 * i;
        if (e < E && !(kept >> (e / gs) & 1u)) taken |= 1u << i;
      }
    }
  }
  float sum = 1.f;
  if constexpr (!SIGMOID) {
    mx = warp_max(mx);
    sum = 0.f;
    DFLASH_UNROLL
    for (int i = 0; i < EPL; ++i) sum += lane + 32 * i < E ? expf(v[i] - mx) : 0.f;
    sum = warp_sum(sum);
  }
  float chosen_sum = 0.f, my_p = 0.f;
  int my_e = 0;
  for (int j = 0; j < k; ++j) {
    // this lane's best remaining (value descending, index ascending), then the warp's
    float bv = -INFINITY;
    int be = INT_MAX;
    DFLASH_UNROLL
    for (int i = 0; i < EPL; ++i) {
      const int e = lane + 32 * i;
      if (!(taken >> i & 1u) && (v[i] > bv || be == INT_MAX)) {
        bv = v[i];
        be = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (ov > bv || (ov == bv && oe < be)) {
        bv = ov;
        be = oe;
      }
    }
    if ((be & 31) == lane) taken |= 1u << (be >> 5);
    float p;
    if constexpr (SIGMOID) {  // p of the chosen expert, from the lane that holds it
      float mine = 0.f;
      DFLASH_UNROLL
      for (int i = 0; i < EPL; ++i)
        if (i == (be >> 5)) mine = s[i];
      p = __shfl_sync(0xffffffffu, mine, be & 31);
    } else {
      p = expf(bv - mx) / sum;
    }
    chosen_sum += p;
    if (lane == j) {
      my_e = be;
      my_p = p;
    }
  }
  if (lane < k) {
    idx[t * k + lane] = my_e;
    // (+ 1e-20: DeepseekV3MoE's guard, backend/context.h moe_route)
    weights[t * k + lane] = (normalize ? my_p / (chosen_sum + 1e-20f) : my_p) * grp.scale;
  }
}

// ---- moe_group ------------------------------------------------------------------------------------------------------
// counts[c * E + e] = pairs of chunk c routed to expert e. Expert ids outside [0, E) set kErrExpertId and count as
// expert 0 (the result is void; the error is raised at the next synchronising call).
__global__ void k_moe_count(const int32_t* __restrict__ idx, int64_t n, int k, int E, int32_t* __restrict__ counts,
                            int* err) {
  __shared__ int cnt[kMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kGroupChunk * k, p1 = min(n, p0 + static_cast<int64_t>(kGroupChunk) * k);
  for (int64_t p = p0 + threadIdx.x; p < p1; p += blockDim.x) {
    int e = idx[p];
    if (e < 0 || e >= E) {
      atomicOr(err, kErrExpertId);
      e = 0;
    }
    atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[static_cast<int64_t>(blockIdx.x) * E + e] = cnt[e];
}

// One block of kMaxExperts threads turns counts [chunks, E] into each chunk's first row per expert and writes the
// experts' offsets [E + 1]. Thread t takes expert e = t % E over the chunks of group t / E (G = kMaxExperts / E groups
// of consecutive chunks: at E = 256 four threads share a column), and loads kScanBatch counts before it uses them.
// (One thread per expert walking its column, each count's load behind the store before it, would be two chains of
// `chunks` dependent L2 round trips plus a serial scan of E: ~60 us at 12288 tokens x top-8, 256 experts;
// bench/NOTES.md 30.)
constexpr int kScanBatch = 16;
__global__ void __launch_bounds__(kMaxExperts)
    k_moe_scan(int32_t* __restrict__ counts, int chunks, int E, int32_t* __restrict__ offsets) {
  __shared__ int part[kMaxExperts];  // part[g * E + e]: group g's pairs for e, then its first row within e's rows
  __shared__ int first[kMaxExperts];  // expert e's first row (offsets[e])
  __shared__ int wtot[32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, G = kMaxExperts / E, e = t % E, g = t / E;
  const int per = (chunks + G - 1) / G, c0 = min(chunks, g * per), c1 = g < G ? min(chunks, c0 + per) : c0;
  int32_t* col = counts + e;
  int sum = 0;
  for (int c = c0; c < c1; c += kScanBatch) {
    int x[kScanBatch];
    DFLASH_UNROLL
    for (int i = 0; i < kScanBatch; ++i) x[i] = c + i < c1 ? col[static_cast<int64_t>(c + i) * E] : 0;
    DFLASH_UNROLL
    for (int i = 0; i < kScanBatch; ++i) sum += x[i];
  }
  if (g < G) part[t] = sum;
  __syncthreads();
  int tot = 0;  // thread e < E: expert e's pairs; each group's start within them
  if (t < E)
    for (int q = 0; q < G; ++q) {
      const int x = part[q * E + t];
      part[q * E + t] = tot;
      tot += x;
    }
  int incl = tot;  // the block's inclusive scan of tot over e (threads t >= E add 0)
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) wtot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < (kMaxExperts >> 5) ? wtot[lane] : 0;
    int wi = w;
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += x;
    }
    wtot[lane] = wi - w;  // the rows of the warps before
  }
  __syncthreads();
  if (t < E) {
    const int excl = wtot[warp] + incl - tot;
    first[t] = excl;
    offsets[t] = excl;
    if (t == E - 1) offsets[E] = excl + tot;
  }
  __syncthreads();
  if (g >= G) return;
  int run = first[e] + part[t];
  for (int c = c0; c < c1; c += kScanBatch) {
    int x[kScanBatch];
    DFLASH_UNROLL
    for (int i = 0; i < kScanBatch; ++i) x[i] = c + i < c1 ? col[static_cast<int64_t>(c + i) * E] : 0;
    DFLASH_UNROLL
    for (int i = 0; i < kScanBatch; ++i)
      if (c + i < c1) {
        col[static_cast<int64_t>(c + i) * E] = run;
        run += x[i];
      }
  }
}

// Chunk c's pairs placed: thread e walks the chunk's pairs in (token, slot) order.
__global__ void k_moe_place(const int32_t* __restrict__ idx, int64_t n, int k, int E, const int32_t* __restrict__ base,
                            int32_t* __restrict__ rows, int32_t* __restrict__ slot) {
  __shared__ int32_t sIdx[kGroupChunk * 32];
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kGroupChunk * k;
  const int np = static_cast<int>(min(n - p0, static_cast<int64_t>(kGroupChunk) * k));
  for (int i = threadIdx.x; i < np; i += blockDim.x) {
    const int e = idx[p0 + i];
    sIdx[i] = e < 0 || e >= E ? 0 : e;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int r = base[static_cast<int64_t>(blockIdx.x) * E + e];
    for (int i = 0; i < np; ++i)
      if (sIdx[i] == e) {
        rows[r] = static_cast<int32_t>((p0 + i) / k);
        slot[p0 + i] = r;
        ++r;
      }
  }
}

// ---- moe_linear: the tile schedule ----------------------------------------------------------------------------------
// tile_off[e] = sum over e' < e of ceil(count_e' / BM): one warp, E / 32 experts per lane and a warp scan.
__global__ void k_moe_tiles(const int32_t* __restrict__ offsets, int E, int BM, int32_t* __restrict__ tile_off) {
  const int lane = threadIdx.x;
  const int per = (E + 31) / 32, e0 = lane * per, e1 = min(E, e0 + per);
  int mine = 0;
  for (int e = e0; e < e1; ++e) mine += (offsets[e + 1] - offsets[e] + BM - 1) / BM;
  int incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  int run = incl - mine;
  for (int e = e0; e < e1; ++e) {
    tile_off[e] = run;
    run += (offsets[e + 1] - offsets[e] + BM - 1) / BM;
  }
  if (lane == 31) tile_off[E] = incl;
}

struct MoeGemmParams {
  const bf16* x;             // [x_rows, K]
  const int32_t* rows;       // [R] tokens of the grouped rows, or null (a = x[r])
  const int32_t* offsets;    // [E + 1]
  const int32_t* tile_off;   // [E + 1]
  const bf16* w;             // [E, Nw, K] bf16, or null when the weights are MXFP4 or INT4:
  const uint8_t* wq;         // [E, Nw, K / 2] 4-bit codes (two per byte, low nibble first)
  const uint8_t* ws;         // MXFP4: [E, Nw, K / 32] e8m0 scales
  const uint16_t* wsb;       // INT4: [E, Nw, K / group] bf16 scales (their bits)
  int64_t group;             // INT4: elements per scale along K (a multiple of 32 dividing K)
  int gblk;                  // INT4: group / 32 (the 32-column blocks per scale)
  const bf16* bias;          // [E, Nw] or null
  bf16* y;                   // [R, N]
  int64_t N, K, Nw, x_rows;
  int E, n_tiles;
  bool y16;                  // y's rows take 16-byte stores (N % 8 == 0, y 16-byte aligned)
  int* err;
};

// The expert and first grouped row of m-tile mt (tiles of BM rows; tile_off as k_moe_tiles wrote it): the largest e
// with tile_off[e] <= mt (experts without rows have tile_off[e] == tile_off[e + 1] and are passed over).
__device__ __forceinline__ int tile_expert(const MoeGemmParams& p, int mt) {
  int lo = 0, hi = p.E;  // tile_off[lo] <= mt < tile_off[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (p.tile_off[mid] <= mt) lo = mid;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// The epilogue's activation of a gate / up pair (MoeAct, backend/context.h): kActSwiGLU silu(g) u; kActClampedSwiGLU
// the clamped SwiGLU (alpha kClampedSwiGLUAlpha, limit kClampedSwiGLULimit).
enum : int { kActNone = 0, kActSwiGLU = 1, kActClampedSwiGLU = 2 };
constexpr float kClampAlpha = static_cast<float>(kClampedSwiGLUAlpha);
constexpr float kClampLimit = static_cast<float>(kClampedSwiGLULimit);
template <int ACT>
__device__ __forceinline__ float moe_act(float g, float u) {
  if (ACT == kActClampedSwiGLU) {
    g = fminf(g, kClampLimit);
    u = fminf(fmaxf(u, -kClampLimit), kClampLimit);
    return (u + 1.f) * g / (1.f + expf(-kClampAlpha * g));
  }
  return silu(g) * u;
}

// One e2m1 code (4 bits, sign in bit 3) times 2^(scale - 127), exactly, as a float: the code's bits placed in a float's
// exponent / mantissa give code * 2^-126 (the codes of exponent 0 become float subnormals, which FMUL takes exactly:
// the build does not flush them); two multiplies keep 2^(scale - 1) from overflowing for scales above 128.
__device__ __forceinline__ float e2m1_scaled(uint32_t code, float f_lo, float f_hi) {
  const float v = __uint_as_float(((code & 8u) << 28) | ((code & 7u) << 22));
  return v * f_lo * f_hi;
}
// Eight e2m1 codes (a 32-bit word of MXFP4 bytes: element i in nibble i) as four bf16 pairs o[j] = (element 2j,
// element 2j + 1), times 2^(s - 127) for the e8m0 scale s given as (m1, m2) below. The codes' sign and magnitude
// bits placed in a bf16's sign / exponent / mantissa give code * 2^-126 (exponent-0 codes become bf16 subnormals,
// which bf16x2 multiplies take exactly: there is no flush for bf16 arithmetic); the scale multiply restores it.
// About 3.5 instructions per value (a byte permute, two masks, two shifts and an or per pair, a bf16x2 multiply).
__device__ __forceinline__ void e2m1x8_to_bf16(uint32_t w, __nv_bfloat162 m1, __nv_bfloat162 m2, bool two,
                                               uint32_t (&o)[4]) {
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;  // even elements, odd elements (one per byte)
  DFLASH_UNROLL
  for (int j = 0; j < 4; ++j) {
    const uint32_t v = __byte_perm(lo, hi, 0x4400u + 0x1111u * j);  // [lo byte j, (same), hi byte j, (same)]
    const uint32_t bits = ((v & 0x00080008u) << 12) | ((v & 0x00070007u) << 6);
    __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&bits);
    b = __hmul2(b, m1);
    if (two) b = __hmul2(b, m2);
    o[j] = *reinterpret_cast<const uint32_t*>(&b);
  }
}
// The bf16x2 factors of an e8m0 scale s for e2m1x8_to_bf16: m1 = 2^(s - 1) while that is a normal bf16 (s <= 128),
// else m1 = 2^126 and m2 = 2^(s - 127) (two = true).
__device__ __forceinline__ bool e8m0_bf16_factors(uint32_t s, __nv_bfloat162& m1, __nv_bfloat162& m2) {
  const bool two = s > 128u;
  const uint16_t a = static_cast<uint16_t>(two ? (126u + 127u) << 7 : (s + 126u) << 7), b = static_cast<uint16_t>(s << 7);
  const uint32_t pa = a | (uint32_t{a} << 16), pb = b | (uint32_t{b} << 16);
  m1 = *reinterpret_cast<const __nv_bfloat162*>(&pa);
  m2 = *reinterpret_cast<const __nv_bfloat162*>(&pb);
  return two;
}
// The weight formats of the grouped GEMM kernels (MoeWeights, backend/context.h).
enum : int { kQPlain = 0, kQMxfp4 = 1, kQInt4 = 2 };

// Eight INT4 codes (a 32-bit word of the weight bytes, element i in nibble i: a pack_to_int32 word) as four bf16 pairs
// o[j] = (element 2j, element 2j + 1), each (c - 8) * s for the bf16 scale s given as the pair s2 = (s, s): a code c
// placed in a bf16's low mantissa bits under the exponent of 128 reads 128 + c (0x4300 | c), minus 136 gives c - 8
// exactly, and one bf16x2 multiply rounds (c - 8) s to bf16, as compressed-tensors' decompression into a bf16 scale
// dtype and vLLM's Marlin (its 0x43004300 trick) do. About 2.5 instructions per value.
__device__ __forceinline__ void int4x8_to_bf16(uint32_t w, __nv_bfloat162 s2, uint32_t (&o)[4]) {
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;  // even elements, odd elements (one per byte)
  constexpr uint32_t kBias = 0x43084308u;                             // (136, 136) in bf16
  DFLASH_UNROLL
  for (int j = 0; j < 4; ++j) {
    const uint32_t bits = (__byte_perm(lo, hi, 0x4400u + 0x1111u * j) & 0x00FF00FFu) | 0x43004300u;
    __nv_bfloat162 b = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&bits),
                               *reinterpret_cast<const __nv_bfloat162*>(&kBias));
    b = __hmul2(b, s2);
    o[j] = *reinterpret_cast<const uint32_t*>(&b);
  }
}
// (s, s) of a bf16 scale given as its 16 bits.
__device__ __forceinline__ __nv_bfloat162 bf16_pair(uint32_t bits16) {
  const uint32_t v = (bits16 & 0xFFFFu) * 0x10001u;
  return *reinterpret_cast<const __nv_bfloat162*>(&v);
}

// (f_lo, f_hi) of an e8m0 scale s: f_lo f_hi = 2^126 2^(s - 127) = 2^(s - 1), each factor a normal float.
__device__ __forceinline__ void e8m0_factors(uint32_t s, float& f_lo, float& f_hi) {
  if (s <= 128u) {
    f_lo = __uint_as_float((s + 126u) << 23);  // 2^(s - 1)
    f_hi = 1.f;
  } else {
    f_lo = 8.507059173023462e37f;               // 2^126
    f_hi = __uint_as_float(s << 23);             // 2^(s - 127)
  }
}

// ---- moe_linear: the portable kernel (any shape; the CPU emulator) --------------------------------------------------
// Block (32, 8) computes a 32 x 32 output tile: thread (tx, ty) the column tx of rows ty, ty + 8, ty + 16, ty + 24;
// SwiGLU keeps a gate and an up accumulator per output.
constexpr int kSimtBM = 32;
template <int ACT, int Q>
__global__ void k_moe_gemm_simt(MoeGemmParams p) {
  constexpr bool SWIGLU = ACT != kActNone;
  __shared__ float sA[32][33];
  __shared__ float sG[32][33];
  __shared__ float sU[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int mt = blockIdx.x / p.n_tiles, nt = blockIdx.x % p.n_tiles;
  if (mt >= p.tile_off[p.E]) return;
  const int e = tile_expert(p, mt);
  const int64_t m0 = p.offsets[e] + static_cast<int64_t>(mt - p.tile_off[e]) * kSimtBM, m_end = p.offsets[e + 1];
  const int64_t n0 = static_cast<int64_t>(nt) * 32;
  const int64_t erow = static_cast<int64_t>(e) * p.Nw;
  // weight element (row n of expert e, column kk) as a float
  auto wv = [&](int64_t n, int64_t kk) -> float {
    const int64_t r = erow + n;
    if (Q == kQPlain) return to_f(p.w[r * p.K + kk]);
    const uint32_t byte = p.wq[r * (p.K / 2) + kk / 2], code = (kk & 1) ? byte >> 4 : byte & 15u;
    if (Q == kQInt4)  // (c - 8) s rounded to bf16, as the tensor-core kernels' int4x8_to_bf16
      return to_f(__float2bfloat16(static_cast<float>(static_cast<int>(code) - 8) *
                                   __uint_as_float(uint32_t{p.wsb[r * (p.K / p.group) + kk / p.group]} << 16)));
    float f_lo, f_hi;
    e8m0_factors(p.ws[r * (p.K / 32) + kk / 32], f_lo, f_hi);
    return e2m1_scaled(code, f_lo, f_hi);
  };
  float ag[4] = {0.f, 0.f, 0.f, 0.f}, au[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t k0 = 0; k0 < p.K; k0 += 32) {
    for (int i = ty; i < 32; i += 8) {
      const int64_t r = m0 + i, kk = k0 + tx;
      float a = 0.f;
      if (r < m_end && kk < p.K) {
        int64_t src = p.rows ? p.rows[r] : r;
        if (src < 0 || src >= p.x_rows) {
          atomicOr(p.err, kErrGatherRow);
          src = 0;
        }
        a = to_f(p.x[src * p.K + kk]);
      }
      sA[i][tx] = a;
      const int64_t n = n0 + i;
      sG[i][tx] = n < p.N && kk < p.K ? wv(n, kk) : 0.f;
      if (SWIGLU) sU[i][tx] = n < p.N && kk < p.K ? wv(p.N + n, kk) : 0.f;
    }
    __syncthreads();
    for (int kk = 0; kk < 32; ++kk) {
      const float g = sG[tx][kk], u = SWIGLU ? sU[tx][kk] : 0.f;
      DFLASH_UNROLL
      for (int q = 0; q < 4; ++q) {
        ag[q] += sA[ty + 8 * q][kk] * g;
        if (SWIGLU) au[q] += sA[ty + 8 * q][kk] * u;
      }
    }
    __syncthreads();
  }
  const int64_t n = n0 + tx;
  if (n >= p.N) return;
  const float bg = p.bias ? to_f(p.bias[erow + n]) : 0.f, bu = p.bias && SWIGLU ? to_f(p.bias[erow + p.N + n]) : 0.f;
  DFLASH_UNROLL
  for (int q = 0; q < 4; ++q) {
    const int64_t r = m0 + ty + 8 * q;
    if (r < m_end) p.y[r * p.N + n] = __float2bfloat16(SWIGLU ? moe_act<ACT>(ag[q] + bg, au[q] + bu) : ag[q] + bg);
  }
}

// ---- moe_linear: the portable tensor-core kernel (mma.sync, compute capability 8.0 and later; the emulator) ---------
// A CTA of 4 warps computes 64 grouped rows x 128 weight rows: for SwiGLU 64 outputs (the expert's gate rows n0.. and
// its up rows N + n0..), otherwise 128 outputs. K runs in steps of 32 through a ring of kMmaStages stages that
// cp.async fills (the tile's rows of x gathered through `rows`; rows past the expert's end, weight rows past N and
// columns past K zero-filled). Warp (wm, wn) multiplies rows 32 wm.. by weight rows 64 wn.. (SwiGLU: gate rows 32 wn..
// and up rows 64 + 32 wn..: a thread's accumulators hold the gate and the up value of the same outputs) with
// mma.sync m16n8k16 (fp32 accumulation) and applies the epilogue from its registers. MXFP4 and INT4 weights: each
// stage holds the 128 rows' 16 bytes of 4-bit codes; after it lands the CTA dequantises it (the row's e8m0 or bf16
// scale of those 32 columns, read from global memory) into one bf16 tile, which the products read (one more barrier
// per step).
// Needs K % 8 == 0 and 16-byte aligned x and weights (moe_linear_path).
constexpr int kMmaBM = 64, kMmaBW = 128, kMmaBK = 32, kMmaStages = 3, kMmaThreads = 128;
constexpr int kMmaLd = kMmaBK + 8;  // a tile row: 80 bytes, so that ldmatrix's 8 rows fall in distinct banks
constexpr int kMmaATile = kMmaBM * kMmaLd * 2, kMmaBTile = kMmaBW * kMmaLd * 2, kMmaRaw = kMmaBW * kMmaBK / 2;
constexpr size_t moe_mma_smem(bool q4) {
  return q4 ? static_cast<size_t>(kMmaStages) * (kMmaATile + kMmaRaw) + kMmaBTile
             : static_cast<size_t>(kMmaStages) * (kMmaATile + kMmaBTile);
}
static_assert(moe_mma_smem(false) <= 48 * 1024 && moe_mma_smem(true) <= 48 * 1024,
              "the portable grouped GEMM runs without a shared-memory opt-in, on every card");

template <int ACT, int Q>
__global__ void __launch_bounds__(kMmaThreads) k_moe_gemm_mma(MoeGemmParams p) {
  constexpr bool SWIGLU = ACT != kActNone, FP4 = Q != kQPlain;  // (FP4: either 4-bit format)
  constexpr int OUT = SWIGLU ? kMmaBW / 2 : kMmaBW;  // outputs per tile
  DFLASH_DYN_SMEM(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
  const int g = lane >> 2, t4 = lane & 3;
  const int mt = blockIdx.x / p.n_tiles, nt = blockIdx.x % p.n_tiles;
  if (mt >= p.tile_off[p.E]) return;
  const int e = tile_expert(p, mt);
  const int64_t m0 = p.offsets[e] + static_cast<int64_t>(mt - p.tile_off[e]) * kMmaBM, m_end = p.offsets[e + 1];
  const int64_t n0 = static_cast<int64_t>(nt) * OUT, erow = static_cast<int64_t>(e) * p.Nw;
  bf16* sA = reinterpret_cast<bf16*>(smem);             // [stage][kMmaBM][kMmaLd]
  unsigned char* sB = smem + kMmaStages * kMmaATile;    // bf16 [stage][kMmaBW][kMmaLd], or 4-bit [stage][kMmaBW][16]
  bf16* sBd = reinterpret_cast<bf16*>(sB + kMmaStages * kMmaRaw);  // 4-bit: the dequantised tile [kMmaBW][kMmaLd]
  const int64_t K = p.K;

  // The weight row of tile row w (0 .. kMmaBW - 1), and whether it exists.
  auto weight_row = [&](int w, bool& ok) -> int64_t {
    const int64_t n = n0 + (SWIGLU ? (w & (kMmaBW / 2 - 1)) : w);
    ok = n < p.N;
    return erow + (SWIGLU && w >= kMmaBW / 2 ? p.N + n : n);
  };
  // This thread's copies of x: chunks c = tid + 128 i (row c / 4, 16-byte column c % 4 of the 32-column step).
  const bf16* a_src[2];
  bool a_ok[2];
  DFLASH_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int c = tid + kMmaThreads * i;
    const int64_t r = m0 + (c >> 2);
    a_ok[i] = r < m_end;
    int64_t src = 0;
    if (a_ok[i]) {
      src = p.rows ? p.rows[r] : r;
      if (src < 0 || src >= p.x_rows) {
        atomicOr(p.err, kErrGatherRow);
        src = 0;
        a_ok[i] = false;
      }
    }
    a_src[i] = p.x + src * K + (c & 3) * 8;
  }
  auto load_stage = [&](int slot, int64_t k0) {
    DFLASH_UNROLL
    for (int i = 0; i < 2; ++i) {
      const int c = tid + kMmaThreads * i;
      const bool ok = a_ok[i] && k0 + (c & 3) * 8 < K;
      cp_async16(smem_u32(sA + (slot * kMmaBM + (c >> 2)) * kMmaLd + (c & 3) * 8), ok ? a_src[i] + k0 : p.x, ok);
    }
    if constexpr (FP4) {  // row tid's 32 codes of this step (K % 32 == 0)
      bool wok;
      const int64_t wr = weight_row(tid, wok);
      cp_async16(smem_u32(sB + slot * kMmaRaw + tid * 16), wok ? p.wq + wr * (K / 2) + k0 / 2 : p.wq, wok);
    } else {
      DFLASH_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int c = tid + kMmaThreads * i, col = (c & 3) * 8;
        bool wok;
        const int64_t wr = weight_row(c >> 2, wok);
        const bool ok = wok && k0 + col < K;
        cp_async16(smem_u32(reinterpret_cast<bf16*>(sB) + (slot * kMmaBW + (c >> 2)) * kMmaLd + col),
                   ok ? p.w + wr * K + k0 + col : p.w, ok);
      }
    }
  };
  const int64_t nsc = Q == kQInt4 ? K / p.group : 0;  // INT4 scales per weight row
  // 4-bit weights: row tid of stage `slot` (K columns k0 ..) into sBd as bf16.
  auto dequantise = [&](int slot, int64_t k0) {
    bool wok;
    const int64_t wr = weight_row(tid, wok);
    const uint32_t* raw = reinterpret_cast<const uint32_t*>(sB + slot * kMmaRaw + tid * 16);
    if constexpr (Q == kQInt4) {  // (a missing row: scale 0)
      const int g = static_cast<int>(k0 >> 5) / p.gblk;
      const __nv_bfloat162 s2 = bf16_pair(wok ? p.wsb[wr * nsc + g] : 0u);
      DFLASH_UNROLL
      for (int j = 0; j < 4; ++j) {
        uint32_t o[4];
        int4x8_to_bf16(raw[j], s2, o);
        *reinterpret_cast<uint4*>(sBd + tid * kMmaLd + 8 * j) = uint4{o[0], o[1], o[2], o[3]};
      }
      return;
    }
    const uint32_t s = wok ? p.ws[wr * (K / 32) + k0 / 32] : 127u;  // (a missing row's codes were zero-filled)
    __nv_bfloat162 m1, m2;
    const bool two = e8m0_bf16_factors(s, m1, m2);
    DFLASH_UNROLL
    for (int j = 0; j < 4; ++j) {
      uint32_t o[4];
      e2m1x8_to_bf16(raw[j], m1, m2, two, o);
      *reinterpret_cast<uint4*>(sBd + tid * kMmaLd + 8 * j) = uint4{o[0], o[1], o[2], o[3]};
    }
  };
  // weight-tile row of this warp's n tile j (8 rows each)
  auto wrow0 = [&](int j) { return SWIGLU ? (j < 4 ? wn * 32 + j * 8 : kMmaBW / 2 + wn * 32 + (j - 4) * 8) : wn * 64 + j * 8; };

  float acc[2][8][4];
  DFLASH_UNROLL
  for (int mi = 0; mi < 2; ++mi)
    DFLASH_UNROLL
    for (int j = 0; j < 8; ++j)
      DFLASH_UNROLL
      for (int q = 0; q < 4; ++q) acc[mi][j][q] = 0.f;

  const int64_t nk = (K + kMmaBK - 1) / kMmaBK;
  for (int s = 0; s < kMmaStages - 1; ++s) {
    if (s < nk) load_stage(s, static_cast<int64_t>(s) * kMmaBK);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < nk; ++kt) {
    cp_async_wait<kMmaStages - 2>();
    __syncthreads();  // step kt landed for every thread; every warp is past step kt - 1's products
    const int64_t next = kt + kMmaStages - 1;
    if (next < nk) load_stage(static_cast<int>(next % kMmaStages), next * kMmaBK);
    cp_async_commit();
    const int slot = static_cast<int>(kt % kMmaStages);
    if constexpr (FP4) {
      dequantise(slot, kt * kMmaBK);
      __syncthreads();
    }
    const bf16* tA = sA + slot * kMmaBM * kMmaLd;
    const bf16* tB = FP4 ? sBd : reinterpret_cast<const bf16*>(sB) + slot * kMmaBW * kMmaLd;
    DFLASH_UNROLL
    for (int kk = 0; kk < kMmaBK; kk += 16) {
      uint32_t a[2][4];
      DFLASH_UNROLL
      for (int mi = 0; mi < 2; ++mi) mma::load_a(a[mi], tA, kMmaLd, wm * 32 + mi * 16, kk, lane);
      DFLASH_UNROLL
      for (int j = 0; j < 8; j += 2) {
        uint32_t b[4];
        mma::load_bt(b, tB, kMmaLd, wrow0(j), kk, lane);
        DFLASH_UNROLL
        for (int mi = 0; mi < 2; ++mi) {
          mma::mma16816(acc[mi][j], a[mi], b[0], b[1]);
          mma::mma16816(acc[mi][j + 1], a[mi], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // (no copy is left in flight at exit)

  // epilogue: accumulator (mi, j, 2h + c) is row 32 wm + 16 mi + g + 8h, tile column 8 j + 2 t4 + c
  constexpr int NJ = SWIGLU ? 4 : 8;
  DFLASH_UNROLL
  for (int mi = 0; mi < 2; ++mi)
    DFLASH_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int64_t r = m0 + wm * 32 + mi * 16 + g + 8 * h;
      if (r >= m_end) continue;
      DFLASH_UNROLL
      for (int j = 0; j < NJ; ++j)
        DFLASH_UNROLL
        for (int c = 0; c < 2; ++c) {
          const int64_t n = n0 + (SWIGLU ? wn * 32 : wn * 64) + j * 8 + 2 * t4 + c;
          if (n >= p.N) continue;
          float v = acc[mi][j][2 * h + c] + (p.bias ? to_f(p.bias[erow + n]) : 0.f);
          if constexpr (SWIGLU)
            v = moe_act<ACT>(v, acc[mi][j + 4][2 * h + c] + (p.bias ? to_f(p.bias[erow + p.N + n]) : 0.f));
          p.y[r * p.N + n] = __float2bfloat16(v);
        }
    }
}

#ifndef DFLASH_CUDA_EMU
// ---- moe_linear: the Hopper kernel ----------------------------------------------------------------------------------
constexpr int kWgBM = 128, kWgBK = 64;        // tile rows, k-step
constexpr int kWgATile = kWgBM * kWgBK * 2;   // an A stage: 128 rows of one 128-byte panel (16 KB)
constexpr int kWgThreads = 384;               // consumer warpgroups 0, 1; producer warpgroup 2

// Register split of the CTA (one per SM: 65536 registers; 128 producer threads, 256 consumer threads, multiples of 8).
// Two CTAs per SM do not fit: ptxas compiles the whole kernel under launch_bounds' cap (80 registers at 384 x 2
// threads), too few for a warpgroup MMA's 64 accumulators and its operands.
// setmaxnreg.inc only takes registers that other warps of the CTA gave back with setmaxnreg.dec: the CTA starts with
// 168 per thread (launch_bounds' cap, which ptxas uses), so 2 consumer + producer <= 3 x 168 (more hangs the
// consumers in setmaxnreg.inc).
constexpr int kWgLaunchRegs = 65536 / kWgThreads / 8 * 8;
constexpr int kWgProducerRegs = 40, kWgConsumerRegs = 232;
static_assert(2 * kWgConsumerRegs + kWgProducerRegs <= 3 * kWgLaunchRegs, "the register split exceeds the CTA's");

// Shared memory of a variant: NS stages of A (16 KB) and B (BN rows, BN x 128 bytes), and the 1024-byte alignment.
constexpr size_t moe_wg_smem(int BN, int NS) { return static_cast<size_t>(NS) * (kWgATile + BN * 128) + 1024; }

__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ uint32_t pick4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, int i) {
  return i == 0 ? a : i == 1 ? b : i == 2 ? c : d;
}
// Stores 32 consecutive bf16 outputs of a row that a quad of lanes (q = lane % 4) holds as wgmma's m64nN accumulator
// layout spreads them: pk[jj] of lane q = columns 8 jj + 2 q, + 1 (a packed bf16 pair). Three quad shuffles give lane q
// the 8 columns 8 q .. 8 q + 7, stored as one 16-byte store when `vec` (the row's address and width allow it), else as
// pairs: a warp's store then covers 8 rows x 64 bytes instead of 8 rows x 16 (a quarter of the store instructions and
// of their L1 wavefronts; bench/NOTES.md 28). Columns >= `cols` and rows with !row_ok are not stored; every lane of the
// warp must call it (the shuffles).
__device__ __forceinline__ void quad_store(bf16* row, const uint32_t (&pk)[4], int q, int64_t cols, bool row_ok,
                                           bool vec) {
  const int base = (threadIdx.x & 31) & ~3;
  uint32_t v[4];  // v[s]: from lane (q + s) % 4, its pair of the columns of block q
  v[0] = pick4(pk[0], pk[1], pk[2], pk[3], q);
  DFLASH_UNROLL
  for (int s = 1; s < 4; ++s)
    v[s] = __shfl_sync(0xffffffffu, pick4(pk[0], pk[1], pk[2], pk[3], (q - s) & 3), base | ((q + s) & 3));
  uint32_t o[4];  // o[k]: columns 8 q + 2 k, + 1, from lane k
  DFLASH_UNROLL
  for (int k = 0; k < 4; ++k) o[k] = pick4(v[0], v[1], v[2], v[3], (k - q) & 3);
  if (!row_ok) return;
  bf16* dst = row + 8 * q;
  if (vec && 8 * q + 8 <= cols) {
    *reinterpret_cast<uint4*>(dst) = uint4{o[0], o[1], o[2], o[3]};
  } else {
    DFLASH_UNROLL
    for (int k = 0; k < 4; ++k)
      if (8 * q + 2 * k < cols) *reinterpret_cast<uint32_t*>(dst + 2 * k) = o[k];
  }
}

// BN columns per tile (128 or 256: wgmma m64nBNk16), NS stages; ACT the epilogue (kActNone / kActSwiGLU /
// kActClampedSwiGLU).
// bf16 weights (MXFP4 weights: k_moe_gemm_fp4 below).
template <int ACT, int BN, int NS>
__global__ void __launch_bounds__(kWgThreads, 1) k_moe_gemm_wg(MoeGemmParams p, const __grid_constant__ CUtensorMap wmap) {
#if DFLASH_HOPPER_DEVICE
  static_assert(BN == 128 || BN == 256, "tiles of 128 or 256 columns");
  constexpr bool SWIGLU = ACT != kActNone;
  constexpr int kBTile = BN * 128, kBoxes = BN / 64;  // B stage bytes; 64-row TMA boxes per stage
  DFLASH_DYN_SMEM(smem_raw);
  __shared__ alignas(8) uint64_t sBar[2 * NS];  // stage s: full (A's copies and B's bytes landed), empty (consumers done)
  __shared__ int4 sTile[NS];  // the CTA's j-th tile in slot j % NS: expert, first grouped row, end of the expert's rows
  const int tiles = p.tile_off[p.E] * p.n_tiles;  // this routing's tiles (the grid is sized without it)
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sA = base, sB = base + NS * kWgATile;
  const uint32_t bFull = smem_u32(&sBar[0]), bEmpty = bFull + 8 * NS;
  const int tid = threadIdx.x, wga = warpgroup_index(), warp = (tid >> 5) & 3, lane = tid & 31;
  const int KT = static_cast<int>((p.K + kWgBK - 1) / kWgBK);
  if (tid == 0) {
    tma_prefetch_map(&wmap);
    DFLASH_UNROLL
    for (int s = 0; s < NS; ++s) {
      mbar_init(bFull + 8 * s, 128 + 1);  // every producer thread's A copies and thread 0's expected TMA bytes
      mbar_init(bEmpty + 8 * s, 8);  // every consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  // Persistent: CTA b runs tiles b, b + grid, ... (tile t: m-tile t / n_tiles, n-tile t % n_tiles), the stage ring
  // carried across tiles (k-step it counts over the CTA's tiles), so the producer loads the next tile's first stages
  // while the consumers run this tile's epilogue (bench/NOTES.md 28). The producer finds each tile's expert (a binary
  // search over tile_off: dependent loads) and hands it to the consumers in sTile with the tile's first stage: its
  // thread 0 writes the slot before its arrive (release) on that stage's full barrier, the consumers read it after
  // their wait (acquire) and before they release the stage, so the producer cannot reuse the slot (NS tiles later, at
  // least NS k-steps later) before they have it.
  if (wga == 2) {  // ---- producer
    setmaxnreg_dec<kWgProducerRegs>();
    const int pt = tid - 256, c = pt & 7;
    int it = 0, j = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++j) {
      const int mt = t / p.n_tiles, nt = t % p.n_tiles, e = tile_expert(p, mt);
      const int64_t m0 = p.offsets[e] + static_cast<int64_t>(mt - p.tile_off[e]) * kWgBM, m_end = p.offsets[e + 1];
      const int64_t wrow = static_cast<int64_t>(e) * p.Nw;
      int64_t src[8];
      bool ok[8];
      DFLASH_UNROLL
      for (int q = 0; q < 8; ++q) {
        const int64_t r = m0 + (pt >> 3) + 16 * q;
        ok[q] = r < m_end;
        int64_t s = ok[q] ? (p.rows ? p.rows[r] : r) : 0;
        if (ok[q] && (s < 0 || s >= p.x_rows)) {
          atomicOr(p.err, kErrGatherRow);
          ok[q] = false;
          s = 0;
        }
        src[q] = s * p.K;
      }
      int brow[kBoxes];
      DFLASH_UNROLL
      for (int b = 0; b < kBoxes; ++b)
        brow[b] = static_cast<int>(SWIGLU ? wrow + (b < kBoxes / 2 ? 0 : p.N) + static_cast<int64_t>(BN / 2) * nt +
                                                64 * (b % (kBoxes / 2))
                                          : wrow + static_cast<int64_t>(BN) * nt + 64 * b);
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int st = it % NS;
        if (it >= NS) mbar_wait(bEmpty + 8 * st, ((it / NS) & 1) ^ 1);
        const uint32_t full = bFull + 8 * st;
        if (pt == 0) {
          if (kt == 0) sTile[j % NS] = make_int4(e, static_cast<int>(m0), static_cast<int>(m_end), 0);
          mbar_arrive_expect_tx(full, kBTile);
          DFLASH_UNROLL
          for (int b = 0; b < kBoxes; ++b)
            tma_load_2d(sB + st * kBTile + b * 64 * 128, &wmap, full, kt * kWgBK, brow[b]);
        }
        // k-step kt's A: the tile's gathered rows of x, columns kt kWgBK .. (past K: zero-filled), into stage st
        const int64_t kc = static_cast<int64_t>(kt) * kWgBK + c * 8;
        const bool kin = kc < p.K;
        DFLASH_UNROLL
        for (int q = 0; q < 8; ++q) {
          const int row = (pt >> 3) + 16 * q;
          cp_async16(sA + st * kWgATile + row * 128 + (((c ^ row) & 7) << 4), p.x + src[q] + (kin ? kc : 0),
                     ok[q] && kin);
        }
        cp_async_mbar_arrive(full);
      }
    }
    cp_async_wait<0>();
    return;
  }

  // ---- consumers: warpgroup wga owns rows 64 wga .. 64 wga + 63 of each tile
  setmaxnreg_inc<kWgConsumerRegs>();
  const uint32_t aW = sA + wga * 64 * 128;
  const int r_in = wga * 64 + warp * 16 + (lane >> 2), c_in = 2 * (lane & 3);
  int it = 0, j = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++j) {
    float d[BN / 2];
    DFLASH_UNROLL
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
    int4 tile;  // (expert, m0, m_end) from the producer
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const int st = it % NS;
      mbar_wait(bFull + 8 * st, (it / NS) & 1);
      if (kt == 0) tile = sTile[j % NS];
      const uint64_t da = wg::desc_kmajor(aW + st * kWgATile), db = wg::desc_kmajor(sB + st * kBTile);
      wg::pin(d);
      wg::fence();
      DFLASH_UNROLL
      for (int kk = 0; kk < kWgBK / 16; ++kk)
        wg::wgmma_ss<BN>(d, wg::desc_add(da, kk * 32), wg::desc_add(db, kk * 32), (kt | kk) != 0);
      wg::commit();
      wg::wait<1>();  // k-step it - 1's products are done: its stage goes back to the producer
      wg::pin(d);
      if (kt > 0 && lane == 0) mbar_arrive(bEmpty + 8 * ((it - 1) % NS));
    }
    wg::wait<0>();
    wg::pin(d);
    if (lane == 0) mbar_arrive(bEmpty + 8 * ((it - 1) % NS));  // the tile's last stage

    // epilogue: accumulator d[4 j + i] holds row 16 warp + lane / 4 + 8 (i / 2), column 8 j + 2 (lane % 4) + i % 2;
    // for the gated acts, gate column c (< BN / 2) and its up column c + BN / 2 are d[4 j + i] and
    // d[4 (j + BN / 16) + i]. The outputs go out by quad_store (32 columns of a row per quad and store), rows past the expert's dropped there.
    const int nt = t % p.n_tiles;
    const int64_t m0 = tile.y, m_end = tile.z;
    const bf16* bias = p.bias ? p.bias + static_cast<int64_t>(tile.x) * p.Nw : nullptr;
    constexpr int kCols = SWIGLU ? BN / 2 : BN;  // output columns of the tile
    DFLASH_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int64_t r = m0 + r_in + 8 * h;
      bf16* yr = p.y + r * p.N + static_cast<int64_t>(nt) * kCols;
      const int64_t cols = p.N - static_cast<int64_t>(nt) * kCols;  // the tile's columns that exist
      DFLASH_UNROLL
      for (int g = 0; g < kCols / 32; ++g) {
        uint32_t pk[4];  // columns 8 (4 g + jj) + c_in, + 1
        DFLASH_UNROLL
        for (int jj = 0; jj < 4; ++jj) {
          const int j = 4 * g + jj, col = 8 * j + c_in;
          float v0, v1;
          if (SWIGLU) {
            float g0 = d[4 * j + 2 * h], g1 = d[4 * j + 2 * h + 1];
            float u0 = d[4 * (j + BN / 16) + 2 * h], u1 = d[4 * (j + BN / 16) + 2 * h + 1];
            if (bias && col < cols) {
              const int64_t bc = static_cast<int64_t>(nt) * kCols + col;
              g0 += to_f(bias[bc]);
              g1 += to_f(bias[bc + 1]);
              u0 += to_f(bias[p.N + bc]);
              u1 += to_f(bias[p.N + bc + 1]);
            }
            v0 = moe_act<ACT>(g0, u0);
            v1 = moe_act<ACT>(g1, u1);
          } else {
            v0 = d[4 * j + 2 * h];
            v1 = d[4 * j + 2 * h + 1];
            if (bias && col < cols) {
              const int64_t bc = static_cast<int64_t>(nt) * kCols + col;
              v0 += to_f(bias[bc]);
              v1 += to_f(bias[bc + 1]);
            }
          }
          pk[jj] = bf162_bits(__floats2bfloat162_rn(v0, v1));
        }
        quad_store(yr + 32 * g, pk, lane & 3, cols - 32 * g, r < m_end, p.y16);
      }
    }
  }
#else
  __trap();  // (not the Hopper tier: never launched, common.cuh)
#endif
}

// ---- moe_linear: the Hopper kernel for MXFP4 and INT4 weights --------------------------------------------------------
// Hopper's tensor cores take no FP4 operand, so the weights are dequantised on their way into wgmma, and to make that
// cheap the product is computed transposed, y^T = W x^T (CUTLASS's mixed-input GEMM and Machete do the same): the
// weights are wgmma's A operand, from registers, and each consumer thread dequantises only its own A fragment (32
// values per k-step) while the previous k-step's wgmma runs; the gathered rows of x are the B operand (K-major, from
// shared memory, as the bf16 kernel's A). bench/NOTES.md 25.
//
// Tile: 128 weight rows (two consumer warpgroups of 64) x BT grouped rows (tokens) of one expert, k-steps of 64.
// Producer warpgroup: per k-step, the BT gathered rows of x by cp.async (SW128 panel, as k_moe_gemm_wg's A) and the
// raw 4-bit weight tile (128 rows x 32 bytes; thread pt copies row pt's two MXFP4 blocks, block h at 16 ((h ^ pt / 4)
// & 1) in the row's 32 bytes, so that the consumers' reads of 8 rows hit 32 distinct banks); full barrier: 128
// cp.async arrivals. Consumers: thread (warp w, lane l) of warpgroup g owns tile rows r = 64 g + 16 w + l / 4 and
// r + 8 (wgmma's A fragment: a[i][0] = (row r, k 16 i + 2 (l % 4) + {0, 1}), a[i][1] the same of row r + 8, a[i][2],
// a[i][3] at k + 8). Byte l % 4 of the row's 32-bit words 2 i and 2 i + 1 holds exactly those k pairs (byte j of a row
// holds elements 2 j, 2 j + 1), so two byte permutes gather a k16-step's four pairs and e2m1x8_to_bf16 converts them
// with the block's scale (read by the consumer itself, one k-step ahead). INT4 weights (Q = kQInt4) have the same bytes
// (a pack_to_int32 word is 8 consecutive elements, element 2j in the low nibble of byte j) and differ only there: the
// scales are bf16, one per group of a multiple of 32 columns, and int4x8_to_bf16 converts.
// Rows of a tile: kActNone: weight rows 128 nt + r; the gated acts: the 16 rows of warp slice s = r / 16 are the gate
// rows of outputs 64 nt + 8 s .. + 7 then their up rows (N + ..), so the accumulator rows l / 4 and l / 4 + 8 of a
// thread are the gate and the up of one output, and the activation happens in the thread. The epilogue stages the
// tile's outputs [BT tokens][64 or 128 outputs] in shared memory (the ring, free by then) and writes whole rows of y.
constexpr int kFp4Raw = kWgBM * 32;  // a stage's raw weight tile: 128 rows x 32 bytes (64 e2m1 values per row)
// Register split: the producer keeps BT / 16 gathered row indices (at 40 or 56 registers it spills at BT = 256), the
// consumers 128 accumulators and two k-steps' fragments (no spills at 216).
constexpr int kFp4ProducerRegs = 64, kFp4ConsumerRegs = 216;
static_assert(2 * kFp4ConsumerRegs + kFp4ProducerRegs <= 3 * kWgLaunchRegs, "the register split exceeds the CTA's");
constexpr size_t moe_fp4_smem(int BT, int NS) { return static_cast<size_t>(NS) * (BT * 128 + kFp4Raw) + 1024; }

// The weight row (within the expert) of row m of n-tile nt, or -1 past the expert's rows.
template <int ACT>
__device__ __forceinline__ int64_t fp4_tile_row(const MoeGemmParams& p, int nt, int m) {
  if constexpr (ACT != kActNone) {
    const int64_t f = static_cast<int64_t>(nt) * 64 + (m >> 4) * 8 + (m & 7);
    return f < p.N ? ((m & 8) ? p.N + f : f) : -1;
  }
  const int64_t f = static_cast<int64_t>(nt) * 128 + m;
  return f < p.N ? f : -1;
}

template <int ACT, int Q, int BT, int NS>
__global__ void __launch_bounds__(kWgThreads, 1) k_moe_gemm_fp4(MoeGemmParams p) {
#if DFLASH_HOPPER_DEVICE
  static_assert(BT == 128 || BT == 256, "tiles of 128 or 256 tokens");
  constexpr bool GATED = ACT != kActNone;
  constexpr int kXTile = BT * 128, kStage = kXTile + kFp4Raw;  // a stage: x's rows, then the raw weights
  constexpr int kCols = GATED ? 64 : 128;                       // outputs per tile
  constexpr int kOutRow = (kCols + 8) * 2;                      // staged output row (bytes, padded: no bank conflicts)
  static_assert(static_cast<size_t>(BT) * kOutRow <= static_cast<size_t>(NS) * kStage, "the staged tile fits the ring");
  DFLASH_DYN_SMEM(smem_raw);
  __shared__ alignas(8) uint64_t sBar[2 * NS];  // stage s: full (the producer's copies landed), empty (consumers done)
  const int mt = blockIdx.x / p.n_tiles, nt = blockIdx.x % p.n_tiles;
  if (mt >= p.tile_off[p.E]) return;  // (uniform over the CTA, before any barrier)
  const int e = tile_expert(p, mt);
  const int64_t m0 = p.offsets[e] + static_cast<int64_t>(mt - p.tile_off[e]) * BT, m_end = p.offsets[e + 1];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t bFull = smem_u32(&sBar[0]), bEmpty = bFull + 8 * NS;
  const int tid = threadIdx.x, wga = warpgroup_index(), warp = (tid >> 5) & 3, lane = tid & 31;
  const int KT = static_cast<int>((p.K + kWgBK - 1) / kWgBK);
  const int64_t wrow = static_cast<int64_t>(e) * p.Nw, rowb = p.K / 2, nblk = p.K / 32;
  if (tid == 0) {
    DFLASH_UNROLL
    for (int s = 0; s < NS; ++s) {
      mbar_init(bFull + 8 * s, 128);  // every producer thread's copies
      mbar_init(bEmpty + 8 * s, 8);   // every consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wga == 2) {  // ---- producer
    setmaxnreg_dec<kFp4ProducerRegs>();
    constexpr int kQ = BT / 16;  // x rows per thread: (pt / 8) + 16 q, 16-byte chunk pt % 8 of the k-step
    const int pt = tid - 256, c = pt & 7;
    int32_t src[kQ];
    uint32_t ok = 0;
    DFLASH_UNROLL
    for (int q = 0; q < kQ; ++q) {
      const int64_t r = m0 + (pt >> 3) + 16 * q;
      bool v = r < m_end;
      int64_t s = v ? (p.rows ? p.rows[r] : r) : 0;
      if (v && (s < 0 || s >= p.x_rows)) {
        atomicOr(p.err, kErrGatherRow);
        v = false;
        s = 0;
      }
      src[q] = static_cast<int32_t>(s);
      ok |= static_cast<uint32_t>(v) << q;
    }
    const int64_t wr = fp4_tile_row<ACT>(p, nt, pt);  // this thread's weight row: tile row pt
    const uint8_t* wsrc = p.wq + (wr >= 0 ? (wrow + wr) * rowb : 0);
    for (int kt = 0; kt < KT; ++kt) {
      const int st = kt % NS;
      if (kt >= NS) mbar_wait(bEmpty + 8 * st, ((kt / NS) & 1) ^ 1);
      const uint32_t sx = base + st * kStage, sw = sx + kXTile;
      const int64_t kc = static_cast<int64_t>(kt) * kWgBK + c * 8;
      const bool kin = kc < p.K;
      DFLASH_UNROLL
      for (int q = 0; q < kQ; ++q) {
        const int row = (pt >> 3) + 16 * q;
        cp_async16(sx + row * 128 + (((c ^ row) & 7) << 4), p.x + static_cast<int64_t>(src[q]) * p.K + (kin ? kc : 0),
                   ((ok >> q) & 1u) && kin);
      }
      DFLASH_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int64_t kb = static_cast<int64_t>(kt) * 2 + h;  // the MXFP4 block along K
        const bool okw = wr >= 0 && kb < nblk;
        cp_async16(sw + pt * 32 + (((h ^ (pt >> 2)) & 1) << 4), wsrc + (okw ? kb * 16 : 0), okw);
      }
      cp_async_mbar_arrive(bFull + 8 * st);
    }
    cp_async_wait<0>();
    return;
  }

  // ---- consumers
  setmaxnreg_inc<kFp4ConsumerRegs>();
  const int g = lane >> 2, t = lane & 3, r0 = wga * 64 + warp * 16 + g;  // tile rows r0, r0 + 8
  const int64_t wr0 = fp4_tile_row<ACT>(p, nt, r0), wr1 = fp4_tile_row<ACT>(p, nt, r0 + 8);
  const int64_t nsc = Q == kQInt4 ? p.K / p.group : nblk;  // scales per weight row
  const uint8_t* sc0 = p.ws + (wrow + (wr0 >= 0 ? wr0 : 0)) * nsc;
  const uint8_t* sc1 = p.ws + (wrow + (wr1 >= 0 ? wr1 : 0)) * nsc;
  const uint16_t* sb0 = p.wsb + (wrow + (wr0 >= 0 ? wr0 : 0)) * nsc;
  const uint16_t* sb1 = p.wsb + (wrow + (wr1 >= 0 ? wr1 : 0)) * nsc;
  // k-step kt's scales. MXFP4: bytes (r0 block 2 kt, r0 block 2 kt + 1, r0 + 8 .., ..); 127 (x 1) where the codes are
  // zero-filled (past K or the expert's rows). INT4: bf16 bits, x = (r0 block 2 kt, r0 block 2 kt + 1), y = r0 + 8's;
  // 0 where the codes are zero-filled.
  auto scales = [&](int kt) {
    const int64_t kb = static_cast<int64_t>(kt) * 2;
    const bool in0 = kb < nblk, in1 = kb + 1 < nblk;
    if constexpr (Q == kQInt4) {
      const int g0 = static_cast<int>(kb) / p.gblk, g1 = static_cast<int>(kb + 1) / p.gblk;
      const uint32_t s00 = wr0 >= 0 && in0 ? __ldg(sb0 + g0) : 0u, s01 = wr0 >= 0 && in1 ? __ldg(sb0 + g1) : 0u;
      const uint32_t s10 = wr1 >= 0 && in0 ? __ldg(sb1 + g0) : 0u, s11 = wr1 >= 0 && in1 ? __ldg(sb1 + g1) : 0u;
      return uint2{s00 | (s01 << 16), s10 | (s11 << 16)};
    } else {
      const uint32_t s00 = wr0 >= 0 && in0 ? __ldg(sc0 + kb) : 127u, s01 = wr0 >= 0 && in1 ? __ldg(sc0 + kb + 1) : 127u;
      const uint32_t s10 = wr1 >= 0 && in0 ? __ldg(sc1 + kb) : 127u, s11 = wr1 >= 0 && in1 ? __ldg(sc1 + kb + 1) : 127u;
      return s00 | (s01 << 8) | (s10 << 16) | (s11 << 24);
    }
  };
  using Scales = decltype(scales(0));
  const uint32_t sel = static_cast<uint32_t>(t) | (static_cast<uint32_t>(t + 4) << 4);  // byte t of x, byte t of y
  // k-step kt's A fragments (4 k16-steps) from stage kt % NS's raw weights and the scales sc
  auto fragments = [&](int kt, Scales sc, uint32_t (&a)[4][4]) {
    const uint32_t sw = base + (kt % NS) * kStage + kXTile;
    DFLASH_UNROLL
    for (int rr = 0; rr < 2; ++rr) {
      const int m = r0 + 8 * rr;
      uint32_t v[8];
      DFLASH_UNROLL
      for (int h = 0; h < 2; ++h)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v[4 * h]), "=r"(v[4 * h + 1]), "=r"(v[4 * h + 2]), "=r"(v[4 * h + 3])
                     : "r"(sw + m * 32 + (((h ^ (m >> 2)) & 1) << 4)));
      DFLASH_UNROLL
      for (int h = 0; h < 2; ++h) {  // block h = k16-steps 2 h, 2 h + 1
        const uint32_t x = __byte_perm(__byte_perm(v[4 * h], v[4 * h + 1], sel),
                                       __byte_perm(v[4 * h + 2], v[4 * h + 3], sel), 0x5410u);
        uint32_t o[4];
        if constexpr (Q == kQInt4) {
          int4x8_to_bf16(x, bf16_pair((rr ? sc.y : sc.x) >> (16 * h)), o);
        } else {
          __nv_bfloat162 m1, m2;
          const bool two = e8m0_bf16_factors((sc >> (8 * (2 * rr + h))) & 255u, m1, m2);
          e2m1x8_to_bf16(x, m1, m2, two, o);
        }
        a[2 * h][rr] = o[0];
        a[2 * h][2 + rr] = o[1];
        a[2 * h + 1][rr] = o[2];
        a[2 * h + 1][2 + rr] = o[3];
      }
    }
  };
  float d[BT / 2];
  DFLASH_UNROLL
  for (int i = 0; i < BT / 2; ++i) d[i] = 0.f;
  uint32_t fa[4][4], fb[4][4];
  Scales sc_next = KT > 1 ? scales(1) : Scales{};
  mbar_wait(bFull, 0);
  fragments(0, scales(0), fa);
  // k-step kt with fragments a (dequantised already); dequantises k-step kt + 1 into an while kt's products run
  auto step = [&](int kt, uint32_t (&a)[4][4], uint32_t (&an)[4][4]) {
    const uint64_t db = wg::desc_kmajor(base + (kt % NS) * kStage);
    wg::pin(d);
    wg::pin(a);
    wg::fence();
    DFLASH_UNROLL
    for (int kk = 0; kk < kWgBK / 16; ++kk) wg::wgmma_rs<BT, 0>(d, a[kk], wg::desc_add(db, kk * 32), (kt | kk) != 0);
    wg::commit();
    wg::wait<1>();  // k-step kt - 1's products are done: its stage goes back to the producer, its fragments are free
    wg::pin(d);
    if (kt > 0 && lane == 0) mbar_arrive(bEmpty + 8 * ((kt - 1) % NS));
    if (kt + 1 < KT) {
      const Scales sc = sc_next;
      if (kt + 2 < KT) sc_next = scales(kt + 2);
      mbar_wait(bFull + 8 * ((kt + 1) % NS), ((kt + 1) / NS) & 1);
      fragments(kt + 1, sc, an);
    }
  };
  for (int kt = 0; kt < KT; kt += 2) {
    step(kt, fa, fb);
    if (kt + 1 < KT) step(kt + 1, fb, fa);
  }
  wg::wait<0>();
  wg::pin(d);

  // epilogue: both consumer warpgroups are done with the ring; it becomes the staged outputs [BT][kCols] (bf16)
  named_sync(1, 256);
  const bf16* bias = p.bias ? p.bias + wrow : nullptr;
  const float b0 = bias && wr0 >= 0 ? to_f(bias[wr0]) : 0.f, b1 = bias && wr1 >= 0 ? to_f(bias[wr1]) : 0.f;
  auto put = [&](int tok, int col, float v) {
    const __nv_bfloat16 h = __float2bfloat16(v);
    asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(base + tok * kOutRow + col * 2),
                 "h"(*reinterpret_cast<const uint16_t*>(&h))
                 : "memory");
  };
  DFLASH_UNROLL
  for (int j = 0; j < BT / 8; ++j) {
    const int tok = 8 * j + 2 * t;  // accumulator d[4 j + i]: row r0 + 8 (i / 2), token tok + i % 2
    if constexpr (GATED) {
      const int col = (r0 >> 4) * 8 + g;  // the output of gate row r0 and up row r0 + 8
      put(tok, col, moe_act<ACT>(d[4 * j] + b0, d[4 * j + 2] + b1));
      put(tok + 1, col, moe_act<ACT>(d[4 * j + 1] + b0, d[4 * j + 3] + b1));
    } else {
      put(tok, r0, d[4 * j] + b0);
      put(tok + 1, r0, d[4 * j + 1] + b0);
      put(tok, r0 + 8, d[4 * j + 2] + b1);
      put(tok + 1, r0 + 8, d[4 * j + 3] + b1);
    }
  }
  named_sync(1, 256);
  const int64_t col0 = static_cast<int64_t>(nt) * kCols;
  const bool vec = p.N % 8 == 0 && (reinterpret_cast<uintptr_t>(p.y) & 15) == 0;
  constexpr int kChunksRow = kCols / 8;
  for (int i = tid; i < BT * kChunksRow; i += 256) {
    const int tok = i / kChunksRow, cc = (i % kChunksRow) * 8;
    const int64_t r = m0 + tok, col = col0 + cc;
    if (r >= m_end || col >= p.N) continue;
    const uint32_t s = base + tok * kOutRow + cc * 2;
    bf16* out = p.y + r * p.N + col;
    if (vec) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(s));
      *reinterpret_cast<uint4*>(out) = v;
    } else {
      for (int u = 0; u < 8 && col + u < p.N; ++u) {
        uint16_t hv;
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(hv) : "r"(s + 2 * u));
        out[u] = *reinterpret_cast<const bf16*>(&hv);
      }
    }
  }
#else
  __trap();  // (not the Hopper tier: never launched, common.cuh)
#endif
}

// The 2-D TMA map of the weights [E Nw, K] (bf16, K innermost): boxes of 64 columns x 64 rows, 128-byte swizzle (one
// SW128 panel of wgmma.cuh per box), out-of-range elements zero-filled.
CUtensorMap weight_map(const void* w, int64_t rows, int64_t K) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K) * 2};
  const cuuint32_t box[2] = {64, 64}, elem[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(w), dims, strides,
                                          box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DFLASH_CHECK(r == CUDA_SUCCESS, "moe_linear (cuda): cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r),
               ") for weights [", rows, ", ", K, "]");
  return map;
}

// The Hopper kernel's variants (Env::moe_variant; bench/NOTES.md "MoE grouped GEMM"): tile columns, stages.
struct WgVariant {
  int bn, stages;
};
constexpr WgVariant kWgVariants[] = {{128, 4}, {256, 4}, {128, 6}};

template <int ACT, int BN, int NS>
void launch_wg_t(Env& e, const MoeGemmParams& p, int64_t blocks, const CUtensorMap& map) {
  DFLASH_LAUNCH(static_cast<unsigned>(blocks), kWgThreads, moe_wg_smem(BN, NS), e.stream, k_moe_gemm_wg<ACT, BN, NS>)
  (p, map);
  check_launch("k_moe_gemm_wg");
}
template <int ACT, int Q, int BT, int NS>
void launch_fp4_t(Env& e, const MoeGemmParams& p, int64_t blocks) {
  DFLASH_LAUNCH(static_cast<unsigned>(blocks), kWgThreads, moe_fp4_smem(BT, NS), e.stream, k_moe_gemm_fp4<ACT, Q, BT, NS>)
  (p);
  check_launch("k_moe_gemm_fp4");
}

// Launches variant v of the bf16 kernel; p.n_tiles is set here (it depends on the variant's tile width). The
// combinations part 1 did not have (a bias-free SwiGLU stays the only one with three variants) run variants 0 and 1
// (2 runs as 1). The tile schedule (tile_off) must be k_moe_tiles' of kWgBM rows.
template <int ACT>
void launch_wg(Env& e, MoeGemmParams p, int64_t R, int v, int64_t w_rows) {
  constexpr bool kAll = ACT != kActClampedSwiGLU;
  if (!kAll && v == 2) v = 1;
  const WgVariant& wv = kWgVariants[v];
  const int cols = ACT != kActNone ? wv.bn / 2 : wv.bn;  // output columns per tile
  p.n_tiles = static_cast<int>((p.N + cols - 1) / cols);
  // persistent CTAs: one per SM, or one per tile of the worst routing when there are fewer
  const int64_t worst = ((R + kWgBM - 1) / kWgBM + p.E) * p.n_tiles;
  DFLASH_CHECK(worst < (int64_t{1} << 31), "moe_linear (cuda): ", worst, " tiles");
  const int64_t blocks = std::min<int64_t>(worst, e.num_sms);
  const CUtensorMap map = weight_map(p.w, w_rows, p.K);
  switch (v) {
    case 0: launch_wg_t<ACT, 128, 4>(e, p, blocks, map); break;
    case 1: launch_wg_t<ACT, 256, 4>(e, p, blocks, map); break;
    default:
      if constexpr (kAll) launch_wg_t<ACT, 128, 6>(e, p, blocks, map);
      break;
  }
}

// The MXFP4 / INT4 kernel's variants: v's bn = tokens per tile (BT), stages as the bf16 kernel's (variant 2 runs as
// 1); the tile schedule (tile_off) is k_moe_tiles' of BT rows, computed here.
template <int ACT, int Q>
void launch_fp4(Env& e, MoeGemmParams p, int64_t R, int v) {
  if (v == 2) v = 1;
  const int bt = kWgVariants[v].bn, cols = ACT != kActNone ? 64 : 128;  // tokens, outputs per tile
  DFLASH_LAUNCH(1, 32, 0, e.stream, k_moe_tiles)(p.offsets, p.E, bt, const_cast<int32_t*>(p.tile_off));
  check_launch("k_moe_tiles");
  p.n_tiles = static_cast<int>((p.N + cols - 1) / cols);
  const int64_t blocks = ((R + bt - 1) / bt + p.E) * p.n_tiles;
  DFLASH_CHECK(blocks < (int64_t{1} << 31), "moe_linear (cuda): ", blocks, " blocks");
  if (v == 0) launch_fp4_t<ACT, Q, 128, 4>(e, p, blocks);
  else launch_fp4_t<ACT, Q, 256, 4>(e, p, blocks);
}
#endif  // DFLASH_CUDA_EMU

// ---- moe_combine ----------------------------------------------------------------------------------------------------
// Block per token, thread per 8 columns (H % 8 == 0) or per column.
__global__ void k_moe_combine(const bf16* __restrict__ y, const int32_t* __restrict__ slot,
                              const float* __restrict__ weights, bf16* __restrict__ out, int64_t H, int k, int64_t R,
                              float beta, int* err) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      int64_t r = slot[t * k + j];
      if (r < 0 || r >= R) {
        atomicOr(err, kErrGatherRow);
        continue;
      }
      acc += weights[t * k + j] * to_f(y[r * H + c]);
    }
    bf16* o = out + t * H + c;
    *o = __float2bfloat16(beta != 0.f ? acc + beta * to_f(*o) : acc);
  }
}

__global__ void k_moe_combine8(const bf16* __restrict__ y, const int32_t* __restrict__ slot,
                               const float* __restrict__ weights, bf16* __restrict__ out, int64_t H, int k, int64_t R,
                               float beta, int* err) {
  const int64_t t = blockIdx.x;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * 8; c < H; c += static_cast<int64_t>(blockDim.x) * 8) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < k; ++j) {
      const int64_t r = slot[t * k + j];
      if (r < 0 || r >= R) {
        atomicOr(err, kErrGatherRow);
        continue;
      }
      const float wj = weights[t * k + j];
      float f[8];
      bf16x8_to_f(*reinterpret_cast<const uint4*>(y + r * H + c), f);
      DFLASH_UNROLL
      for (int i = 0; i < 8; ++i) acc[i] += wj * f[i];
    }
    uint4* o = reinterpret_cast<uint4*>(out + t * H + c);
    if (beta != 0.f) {
      float f[8];
      bf16x8_to_f(*o, f);
      DFLASH_UNROLL
      for (int i = 0; i < 8; ++i) acc[i] += beta * f[i];
    }
    *o = f_to_bf16x8(acc);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

std::string moe_linear_path(const Env& e, int64_t N, int64_t K, bool aligned) {
  if (K % 8 != 0 || K < 8 || !aligned) return "simt";
  if (e.tier == KernelTier::Hopper && N % 2 == 0) return "wgmma";
  return "mma";
}

std::string moe_linear_kernels(const Env& e) {
  return std::string(e.tier == KernelTier::Hopper ? "warpgroup MMA with TMA (K % 8 == 0, N even), else " : "") +
         "mma.sync (K % 8 == 0), else CUDA cores; bf16, MXFP4 or INT4 weights (dequantised on chip)";
}

namespace {
template <bool SIGMOID>
void launch_moe_route(Env& e, unsigned blocks, const bf16* z, int64_t T, int E, int k, bool normalize,
                      const float* b, int32_t* ix, float* w, RouteGroups g) {
  // with groups: each of the 8 warps keeps its token's E choice values in shared memory (32 KiB at E 1024)
  const size_t sm = g.ng > 1 ? 8 * static_cast<size_t>(E) * sizeof(float) : 0;
  if (E <= 32) DFLASH_LAUNCH(blocks, 256, sm, e.stream, k_moe_route<1, SIGMOID>)(z, T, E, k, normalize, b, ix, w, g);
  else if (E <= 64) DFLASH_LAUNCH(blocks, 256, sm, e.stream, k_moe_route<2, SIGMOID>)(z, T, E, k, normalize, b, ix, w, g);
  else if (E <= 128) DFLASH_LAUNCH(blocks, 256, sm, e.stream, k_moe_route<4, SIGMOID>)(z, T, E, k, normalize, b, ix, w, g);
  else if (E <= 256) DFLASH_LAUNCH(blocks, 256, sm, e.stream, k_moe_route<8, SIGMOID>)(z, T, E, k, normalize, b, ix, w, g);
  else if (E <= 512) DFLASH_LAUNCH(blocks, 256, sm, e.stream, k_moe_route<16, SIGMOID>)(z, T, E, k, normalize, b, ix, w, g);
  else DFLASH_LAUNCH(blocks, 256, sm, e.stream, k_moe_route<32, SIGMOID>)(z, T, E, k, normalize, b, ix, w, g);
}
}  // namespace

void moe_route(Env& e, const Tensor& logits, int64_t k, bool normalize, const Tensor& idx, const Tensor& weights,
               const MoeRouteOpts& opts) {
  check_on_dev("moe_route", idx, "idx");
  check_on_dev("moe_route", weights, "weights");
  if (opts.choice_bias.defined()) check_on_dev("moe_route", opts.choice_bias, "choice_bias");
  const int64_t T = logits.shape[0], E = logits.shape[1];
  DFLASH_CHECK(E <= kMaxExperts && k <= 32 && opts.n_group <= 32, "moe_route (cuda): E = ", E, " experts, k = ", k,
               ", n_group = ", opts.n_group, " (supported: E <= ", kMaxExperts, ", k <= 32, n_group <= 32)");
  if (T == 0) return;
  const unsigned blocks = static_cast<unsigned>((T + 7) / 8);
  const bf16* z = static_cast<bf16*>(logits.data);
  int32_t* ix = idx.ptr<int32_t>();
  float* w = weights.ptr<float>();
  const int Ei = static_cast<int>(E), ki = static_cast<int>(k);
  const float* b = opts.choice_bias.defined() ? opts.choice_bias.ptr<float>() : nullptr;
  const RouteGroups g{static_cast<int>(opts.n_group), static_cast<int>(opts.topk_group), static_cast<float>(opts.scale)};
  if (opts.score == MoeScore::Sigmoid) launch_moe_route<true>(e, blocks, z, T, Ei, ki, normalize, b, ix, w, g);
  else launch_moe_route<false>(e, blocks, z, T, Ei, ki, normalize, nullptr, ix, w, g);
  check_launch("k_moe_route");
}

void moe_group(Env& e, const Tensor& idx, const Tensor& offsets, const Tensor& rows, const Tensor& slot) {
  check_on_dev("moe_group", offsets, "offsets");
  check_on_dev("moe_group", rows, "rows");
  check_on_dev("moe_group", slot, "slot");
  const int64_t n = idx.numel(), k = idx.shape[1], E = offsets.numel() - 1;
  DFLASH_CHECK(E <= kMaxExperts && k <= 32, "moe_group (cuda): E = ", E, ", k = ", k, " (supported: E <= ",
               kMaxExperts, ", k <= 32)");
  const int64_t T = n / k, chunks = std::max<int64_t>(1, (T + kGroupChunk - 1) / kGroupChunk);
  DFLASH_CHECK(chunks < (int64_t{1} << 31), "moe_group (cuda): ", T, " tokens");
  Tensor counts = e.alloc(DType::I32, {chunks, E});
  const int Ei = static_cast<int>(E), ki = static_cast<int>(k), C = static_cast<int>(chunks);
  DFLASH_LAUNCH(C, 256, 0, e.stream, k_moe_count)(idx.ptr<int32_t>(), n, ki, Ei, counts.ptr<int32_t>(), e.err_flag);
  check_launch("k_moe_count");
  DFLASH_LAUNCH(1, kMaxExperts, 0, e.stream, k_moe_scan)(counts.ptr<int32_t>(), C, Ei, offsets.ptr<int32_t>());
  check_launch("k_moe_scan");
  if (n == 0) return;
  DFLASH_LAUNCH(C, 256, 0, e.stream, k_moe_place)(idx.ptr<int32_t>(), n, ki, Ei, counts.ptr<int32_t>(),
                                                  rows.ptr<int32_t>(), slot.ptr<int32_t>());
  check_launch("k_moe_place");
}

void moe_linear(Env& e, const Tensor& x, const Tensor* rows, const MoeWeights& mw, const Tensor& offsets,
                const Tensor& y, MoeAct act, const MoeLinearDims& d) {
  check_on_dev("moe_linear", x, "x");
  check_on_dev("moe_linear", mw.w, "w");
  check_on_dev("moe_linear", y, "y");
  if (mw.quantized()) check_on_dev("moe_linear", mw.scales, "scales");
  if (mw.bias.defined()) check_on_dev("moe_linear", mw.bias, "bias");
  if (d.R == 0 || d.N == 0) return;
  const bool fp4 = mw.quantized();  // either 4-bit format
  const int q = mw.mxfp4() ? kQMxfp4 : mw.int4() ? kQInt4 : kQPlain;
  const int a = act == MoeAct::None ? kActNone : act == MoeAct::SwiGLU ? kActSwiGLU : kActClampedSwiGLU;
  DFLASH_CHECK(d.E <= (int64_t{1} << 20), "moe_linear (cuda): ", d.E, " experts");
  MoeGemmParams p;
  p.x = static_cast<bf16*>(x.data);
  p.rows = rows ? rows->ptr<int32_t>() : nullptr;
  p.offsets = offsets.ptr<int32_t>();
  p.w = fp4 ? nullptr : static_cast<bf16*>(mw.w.data);
  p.wq = fp4 ? mw.w.ptr<uint8_t>() : nullptr;
  p.ws = q == kQMxfp4 ? mw.scales.ptr<uint8_t>() : nullptr;
  p.wsb = q == kQInt4 ? mw.scales.ptr<uint16_t>() : nullptr;
  p.group = q == kQInt4 ? mw.int4_group : 0;
  p.gblk = static_cast<int>(p.group / 32);
  p.bias = mw.bias.defined() ? static_cast<bf16*>(mw.bias.data) : nullptr;
  p.y = static_cast<bf16*>(y.data);
  p.N = d.N;
  p.K = d.K;
  p.Nw = mw.w.shape[1];
  p.x_rows = x.rows();
  p.E = static_cast<int>(d.E);
  p.err = e.err_flag;
  p.y16 = d.N % 8 == 0 && aligned16(y.data);
  Tensor tile_off = e.alloc(DType::I32, {d.E + 1});
  p.tile_off = tile_off.ptr<int32_t>();
  const std::string path = moe_linear_path(e, d.N, d.K, aligned16(p.x) && aligned16(mw.w.data));
#ifndef DFLASH_CUDA_EMU
  if (path == "wgmma") {
    const int v = e.moe_variant >= 0 && e.moe_variant < 3 ? e.moe_variant : kMoeDefaultVariant;
    switch (a + 3 * q) {
      case 3 * kQMxfp4 + kActNone: launch_fp4<kActNone, kQMxfp4>(e, p, d.R, v); return;
      case 3 * kQMxfp4 + kActSwiGLU: launch_fp4<kActSwiGLU, kQMxfp4>(e, p, d.R, v); return;
      case 3 * kQMxfp4 + kActClampedSwiGLU: launch_fp4<kActClampedSwiGLU, kQMxfp4>(e, p, d.R, v); return;
      case 3 * kQInt4 + kActNone: launch_fp4<kActNone, kQInt4>(e, p, d.R, v); return;
      case 3 * kQInt4 + kActSwiGLU: launch_fp4<kActSwiGLU, kQInt4>(e, p, d.R, v); return;
      case 3 * kQInt4 + kActClampedSwiGLU: launch_fp4<kActClampedSwiGLU, kQInt4>(e, p, d.R, v); return;
      default: break;  // bf16 weights: below
    }
    DFLASH_LAUNCH(1, 32, 0, e.stream, k_moe_tiles)(p.offsets, p.E, kWgBM, tile_off.ptr<int32_t>());
    check_launch("k_moe_tiles");
    const int64_t w_rows = d.E * p.Nw;
    DFLASH_CHECK(w_rows < (int64_t{1} << 31), "moe_linear (cuda): ", w_rows, " weight rows");
    if (a == kActNone) launch_wg<kActNone>(e, p, d.R, v, w_rows);
    else if (a == kActSwiGLU) launch_wg<kActSwiGLU>(e, p, d.R, v, w_rows);
    else launch_wg<kActClampedSwiGLU>(e, p, d.R, v, w_rows);
    return;
  }
#endif
  if (path == "mma") {
    DFLASH_LAUNCH(1, 32, 0, e.stream, k_moe_tiles)(p.offsets, p.E, kMmaBM, tile_off.ptr<int32_t>());
    check_launch("k_moe_tiles");
    const int64_t out = act == MoeAct::None ? kMmaBW : kMmaBW / 2;
    p.n_tiles = static_cast<int>((d.N + out - 1) / out);
    const int64_t blocks = ((d.R + kMmaBM - 1) / kMmaBM + d.E) * p.n_tiles;
    DFLASH_CHECK(blocks < (int64_t{1} << 31), "moe_linear (cuda): ", blocks, " blocks");
    const unsigned nb = static_cast<unsigned>(blocks);
    const size_t smem = moe_mma_smem(fp4);
    auto launch = [&](auto kernel) { DFLASH_LAUNCH(nb, kMmaThreads, smem, e.stream, kernel)(p); };
    switch (a + 3 * q) {
      case kActNone: launch(k_moe_gemm_mma<kActNone, kQPlain>); break;
      case kActSwiGLU: launch(k_moe_gemm_mma<kActSwiGLU, kQPlain>); break;
      case kActClampedSwiGLU: launch(k_moe_gemm_mma<kActClampedSwiGLU, kQPlain>); break;
      case 3 * kQMxfp4 + kActNone: launch(k_moe_gemm_mma<kActNone, kQMxfp4>); break;
      case 3 * kQMxfp4 + kActSwiGLU: launch(k_moe_gemm_mma<kActSwiGLU, kQMxfp4>); break;
      case 3 * kQMxfp4 + kActClampedSwiGLU: launch(k_moe_gemm_mma<kActClampedSwiGLU, kQMxfp4>); break;
      case 3 * kQInt4 + kActNone: launch(k_moe_gemm_mma<kActNone, kQInt4>); break;
      case 3 * kQInt4 + kActSwiGLU: launch(k_moe_gemm_mma<kActSwiGLU, kQInt4>); break;
      default: launch(k_moe_gemm_mma<kActClampedSwiGLU, kQInt4>); break;
    }
    check_launch("k_moe_gemm_mma");
    return;
  }
  DFLASH_LAUNCH(1, 32, 0, e.stream, k_moe_tiles)(p.offsets, p.E, kSimtBM, tile_off.ptr<int32_t>());
  check_launch("k_moe_tiles");
  p.n_tiles = static_cast<int>((d.N + 31) / 32);
  const int64_t blocks = ((d.R + kSimtBM - 1) / kSimtBM + d.E) * p.n_tiles;
  DFLASH_CHECK(blocks < (int64_t{1} << 31), "moe_linear (cuda): ", blocks, " blocks");
  const unsigned nb = static_cast<unsigned>(blocks);
  const dim3 blk(32, 8);
  switch (a + 3 * q) {
    case 0: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActNone, kQPlain>)(p); break;
    case 1: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActSwiGLU, kQPlain>)(p); break;
    case 2: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActClampedSwiGLU, kQPlain>)(p); break;
    case 3: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActNone, kQMxfp4>)(p); break;
    case 4: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActSwiGLU, kQMxfp4>)(p); break;
    case 5: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActClampedSwiGLU, kQMxfp4>)(p); break;
    case 6: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActNone, kQInt4>)(p); break;
    case 7: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActSwiGLU, kQInt4>)(p); break;
    default: DFLASH_LAUNCH(nb, blk, 0, e.stream, k_moe_gemm_simt<kActClampedSwiGLU, kQInt4>)(p); break;
  }
  check_launch("k_moe_gemm_simt");
}

void moe_combine(Env& e, const Tensor& y, const Tensor& slot, const Tensor& weights, const Tensor& out, float beta) {
  check_on_dev("moe_combine", y, "y");
  check_on_dev("moe_combine", out, "out");
  const int64_t T = out.rows(), H = out.shape.back(), k = weights.shape[1], R = y.rows();
  if (T == 0) return;
  DFLASH_CHECK(T < (int64_t{1} << 31), "moe_combine (cuda): ", T, " tokens");
  const unsigned blocks = static_cast<unsigned>(T);
  if (H % 8 == 0 && aligned16(y.data) && aligned16(out.data)) {
    const int threads = static_cast<int>(std::min<int64_t>(256, H / 8));
    DFLASH_LAUNCH(blocks, threads, 0, e.stream, k_moe_combine8)(static_cast<bf16*>(y.data), slot.ptr<int32_t>(),
                                                                weights.ptr<float>(), static_cast<bf16*>(out.data), H,
                                                                static_cast<int>(k), R, beta, e.err_flag);
    check_launch("k_moe_combine8");
  } else {
    const int threads = static_cast<int>(std::min<int64_t>(256, H));
    DFLASH_LAUNCH(blocks, threads, 0, e.stream, k_moe_combine)(static_cast<bf16*>(y.data), slot.ptr<int32_t>(), weights.ptr<float>(),
                                                               static_cast<bf16*>(out.data), H, static_cast<int>(k), R, beta,
                                                               e.err_flag);
    check_launch("k_moe_combine");
  }
}

void moe_init_attributes(int smem_optin, KernelTier tier) {
#ifndef DFLASH_CUDA_EMU
  if (tier != KernelTier::Hopper) return;
  allow_dynamic_smem(smem_optin, k_moe_gemm_wg<kActSwiGLU, 128, 4>, k_moe_gemm_wg<kActNone, 128, 4>,
                     k_moe_gemm_wg<kActSwiGLU, 256, 4>, k_moe_gemm_wg<kActNone, 256, 4>,
                     k_moe_gemm_wg<kActSwiGLU, 128, 6>, k_moe_gemm_wg<kActNone, 128, 6>,
                     k_moe_gemm_wg<kActClampedSwiGLU, 128, 4>, k_moe_gemm_wg<kActClampedSwiGLU, 256, 4>,
                     k_moe_gemm_fp4<kActNone, kQMxfp4, 128, 4>, k_moe_gemm_fp4<kActNone, kQMxfp4, 256, 4>,
                     k_moe_gemm_fp4<kActSwiGLU, kQMxfp4, 128, 4>, k_moe_gemm_fp4<kActSwiGLU, kQMxfp4, 256, 4>,
                     k_moe_gemm_fp4<kActClampedSwiGLU, kQMxfp4, 128, 4>,
                     k_moe_gemm_fp4<kActClampedSwiGLU, kQMxfp4, 256, 4>,
                     k_moe_gemm_fp4<kActNone, kQInt4, 128, 4>, k_moe_gemm_fp4<kActNone, kQInt4, 256, 4>,
                     k_moe_gemm_fp4<kActSwiGLU, kQInt4, 128, 4>, k_moe_gemm_fp4<kActSwiGLU, kQInt4, 256, 4>,
                     k_moe_gemm_fp4<kActClampedSwiGLU, kQInt4, 128, 4>,
                     k_moe_gemm_fp4<kActClampedSwiGLU, kQInt4, 256, 4>);
#else
  (void)smem_optin, (void)tier;
#endif
}

}  // namespace dflash::cuda
