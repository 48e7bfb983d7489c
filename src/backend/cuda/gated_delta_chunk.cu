// cuda/gated_delta_chunk.cu — the gated delta rule of one sequence in chunks of 64 tokens on tensor cores (mma.sync
// m16n8k16, bf16 operands, fp32 accumulation; the state in fp32), for key and value heads of 128: the WY form of
// Yang, Kautz, Hatamizadeh 2024 ("Gated Delta Networks", sec. 3.3) as flash-linear-attention's chunk_gated_delta_rule
// and transformers' torch_chunk_gated_delta_rule compute it. For a chunk of tokens 0..63 with gc = cumsum(g) inside the
// chunk, q and k l2-normalised (q also / sqrt(dk)), S the [dk, dv] state before the chunk:
//   A   = strictly_lower(diag(beta) K K^T ⊙ exp(gc_i - gc_j))            [64, 64]
//   T   = (I + A)^-1                                                      (unit lower triangular)
//   W   = T diag(beta exp(gc)) K,  U = T diag(beta) V                     [64, 128]   (the WY representation)
//   V'  = U - W S                                                         the chunk's delta-rule corrections
//   O   = diag(exp(gc)) Q S + (Q K^T ⊙ exp(gc_i - gc_j) [j <= i]) V'       [64, 128]
//   S  <- exp(gc_63) S + (K ⊙ exp(gc_63 - gc))^T V'
// equal to the token-by-token recurrence up to rounding (tests/cuda: against cpu/gated_delta_rule.cpp).
//
// Two kernels (flash-linear-attention's split of chunk_gated_delta_rule into its state-free and state parts):
//  k_gdr_prep, one CTA of 8 warps per (chunk, value head), all chunks of all sequences at once (3 CTAs / SM): what
//    does not depend on the state, into a workspace (per chunk and value head: -W, U [64][128] bf16, P [64][64] bf16,
//    gc [64] fp32; per chunk and key head: the normalised Q, K [64][128] bf16, written by the key head's first value
//    head). Rows past a sequence's end are zero-filled inputs, so their Q, K, W, U rows are zero.
//     1. q, k rows, g, beta by cp.async (each warp copies the q, k rows it l2-normalises, in place, a warp per row); gc
//        by warp 0's scan of g. One block barrier; Q, K and gc to the workspace.
//     2. K K^T and Q K^T (64 x 64, K = 128), masked and decayed: A in fp32 (shared memory), P in bf16 (workspace).
//        A barrier; then v's rows by cp.async into q's bytes (q is dead), landing during step 3.
//     3. T = (I + A)^-1 in fp32: the four 16 x 16 diagonal blocks by forward substitution (a warp each), the blocks
//        below by T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj, one block diagonal at a time (flash-linear-attention's
//        solve_tril); T's columns scaled as bf16 operands T diag(beta e^gc), T diag(beta) (in A's bytes).
//     4. W and U (64 x 128, K = 64), to the workspace as -W and U (bf16).
//    Shared memory 70 KB (q then v, k, A, the off-diagonal scratch, T); 10 block barriers.
//  k_gdr_state, one CTA of 8 warps per (value head, sequence), walking the sequence's chunks in order, the state in
//    the warps' mma accumulators (warp w: state rows 16w .. 16w+15, all 128 columns: 64 fp32 registers per thread).
//    The next chunk's workspace tiles (-W, U, Q, K, P, gc: 77 KB) come by cp.async into the other of two stages while
//    this chunk computes. Per chunk: S to bf16 in shared memory; one block barrier (the stage and S); V' = U + (-W) S
//    (U from its bf16 tile into the accumulators; V' back into U's bytes, the same elements by the same lanes, and
//    V' e^{gc_63 - gc} beside); O = e^gc (Q S); a barrier (V' complete); O += P V' written out;
//    S <- e^{gc_63} S + K^T V'd. Shared memory 206 KB (1 CTA / SM), 2 block barriers per chunk. With 163 KiB per
//    block (compute capability 8.0) one stage of 128 KiB: the next chunk's tiles load after a third barrier.
// Warps split the 64 x 128 products as 4 row groups of 16 x 2 column halves of 64.
// Roundings (as flash-linear-attention): normalised q, k, the scaled T, W, U, P, V' and S as bf16 operands; every sum
// in fp32. U is rounded to bf16 in the workspace (flash-linear-attention stores u in bf16 too): one rounding more
// than a U kept in fp32 until V', ~2-4% more error in the outputs, far under the tolerance (bench/NOTES.md 31).
// Workspace: (41 KB x nv + 32 KB x nk) per chunk of 64 tokens, e.g. 354 MB at Qwen3.5's 32 value / 16 key heads on
// 4 x 3072 tokens; from the context's stream-ordered allocator (Env::alloc). A call's sequences go in groups of at
// most kMaxSeqs sequences and kWsBudget bytes of workspace (one longer sequence alone), two launches per group.
#include <algorithm>
#include <vector>

#include "backend/cuda/async_copy.cuh"  // cp_async16, cp_async4, cp_async_commit, cp_async_wait, smem_u32
#include "backend/cuda/common.cuh"
#include "backend/cuda/mma_sync.cuh"

namespace dflash::cuda {

namespace {

constexpr int kC = 64;          // tokens per chunk
constexpr int kD = 128;         // dk = dv
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int LD = kD + 8;      // bf16 row stride of 128-wide tiles (ldmatrix rows on distinct banks)
constexpr int LC = kC + 8;      // bf16 row stride of 64-wide tiles
constexpr int LF = kC + 1;      // fp32 row stride of 64 x 64 tiles
constexpr int kTile128 = kC * LD * 2;   // a [64][136] bf16 tile
constexpr int kTile64 = kC * LC * 2;    // a [64][72] bf16 tile
constexpr int kTileF = kC * LF * 4;     // a [64][65] fp32 tile

// Workspace records (bytes; dense row-major tiles). Per chunk and value head: -W, U [64][128] bf16, P [64][64] bf16,
// gc [64] fp32; per chunk and key head: Q (normalised, / sqrt(dk)), K (normalised) [64][128] bf16.
constexpr int kWsW = 0, kWsU = kWsW + kC * kD * 2, kWsP = kWsU + kC * kD * 2, kWsG = kWsP + kC * kC * 2;
constexpr int kRecV = kWsG + kC * 4;
constexpr int kWsQ = 0, kWsK = kC * kD * 2, kRecK = 2 * kC * kD * 2;
constexpr int64_t kWsBudget = int64_t{1} << 30;  // workspace bytes of one launch group (a longer sequence alone)

// k_gdr_prep's shared memory: q (v once q is dead), k, g then gc, beta, A, the off-diagonal scratch (3 x 16 x 16
// fp32), T (fp32); T's scaled bf16 copies T1, T2 in A's and the scratch's bytes once T is complete
constexpr int kPQ = 0, kPK = kPQ + kTile128, kPG = kPK + kTile128, kPB = kPG + kC * 4, kPA = kPB + kC * 4;
constexpr int kPX = kPA + kTileF, kPTi = kPX + 3 * 256 * 4, kSmemPrep = kPTi + kTileF;
constexpr int kPT1 = kPA, kPT2 = kPT1 + kTile64;
static_assert(kPT2 + kTile64 <= kPTi, "T1, T2 fit in A's and the scratch's bytes");

// k_gdr_state's shared memory: NS stages of a chunk's workspace tiles (chunk i in stage i % NS), then the state's
// bf16 copy [128][136] and V' e^{gc_63 - gc} [64][136]. Two stages (206 KiB: the next chunk's tiles load while this
// one is computed) where the device allows it (compute capability 9.0), else one (128 KiB: the next chunk loads after
// this one's products; compute capability 8.0's 163 KiB); below that (8.6, 8.9: 99 KiB) the recurrent kernel runs.
constexpr int kSW = 0, kSU = kSW + kTile128, kSQ = kSU + kTile128, kSK = kSQ + kTile128, kSP = kSK + kTile128;
constexpr int kSG = kSP + kTile64, kStage = kSG + kC * 4;
constexpr int state_ss(int NS) { return NS * kStage; }
constexpr int state_svd(int NS) { return state_ss(NS) + kD * LD * 2; }
constexpr int state_smem(int NS) { return state_svd(NS) + kTile128; }
constexpr int kSmemState = state_smem(2), kSmemState1 = state_smem(1);

constexpr int kMaxSeqs = 32;  // sequences per launch (k_gdr_state's blockIdx.y)

struct SplitParams {
  const bf16* qkv;  // [T, C]
  const float* g;   // [T, nv]
  const float* beta;
  float* state;     // [nv, 128, 128] or null (only with one sequence)
  bf16* out;        // [T, nv, 128]
  unsigned char* wsv;  // [chunks][nv] records of kRecV bytes
  unsigned char* wsk;  // [chunks][nk] records of kRecK bytes
  int nk, nv;
  int64_t C;
  int64_t offs[kMaxSeqs + 1];  // sequence s of this launch: rows offs[s] .. offs[s + 1] - 1
  int cb[kMaxSeqs + 1];        // sequence s of this launch: chunks (workspace records) cb[s] .. cb[s + 1] - 1
};

// acc[NT][4] += A (16 rows from a_row0 of a row-major tile, K columns) x B (K rows, 8 NT columns from n0):
// B_kn stored [k][n] (b_kmajor: ldmatrix .trans) or [n][k] (B = the tile's transpose: plain ldmatrix).
template <int NT, int K, bool B_KMAJOR>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const bf16* a, int lda, int a_row0, const bf16* b,
                                         int ldb, int n0, int lane) {
  static_assert(NT % 2 == 0, "n tiles in pairs");
  DFLASH_UNROLL
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t af[4];
    mma::load_a(af, a, lda, a_row0, k0, lane);
    DFLASH_UNROLL
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t bf[4];
      if (B_KMAJOR) {
        mma::load_b(bf, b, ldb, k0, n0 + nt * 8, lane);
      } else {
        mma::load_bt(bf, b, ldb, n0 + nt * 8, k0, lane);
      }
      mma::mma16816(acc[nt], af, bf[0], bf[1]);
      mma::mma16816(acc[nt + 1], af, bf[2], bf[3]);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
  DFLASH_UNROLL
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}


// cp.async of a 128-wide column block (from column col) of the chunk's rows 0 .. L - 1 (rows: the chunk's first row)
// into the [64][136] tile at shared address dst, the rows past L zero-filled (they read nothing but still name a valid
// address, the tensor's start). Warp w copies the rows w + 8j (j < 8), a lane two 16-byte pieces of a row.
__device__ __forceinline__ void copy_rows(uint32_t dst, const SplitParams& p, const bf16* rows, int64_t col, int L,
                                          int warp, int lane) {
  const int c = (lane & 15) * 8;
  DFLASH_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int r = warp + 8 * (2 * i + (lane >> 4));
    const bool ok = r < L;
    cp_async16(dst + static_cast<uint32_t>((r * LD + c) * 2), ok ? rows + r * p.C + col + c : p.qkv, ok);
  }
}

// Grid (nv, chunks of the launch): the state-free part of chunk blockIdx.y for value head blockIdx.x.
__global__ void __launch_bounds__(kThreads, 3) k_gdr_prep(SplitParams p) {
  DFLASH_DYN_SMEM(smem);
  bf16* sQ = reinterpret_cast<bf16*>(smem + kPQ);  // normalised q; v after step 2
  bf16* sV = sQ;
  bf16* sK = reinterpret_cast<bf16*>(smem + kPK);
  float* sG = reinterpret_cast<float*>(smem + kPG);  // g, then gc
  float* sB = reinterpret_cast<float*>(smem + kPB);  // beta
  float* sA = reinterpret_cast<float*>(smem + kPA);  // [64][65]
  float* sX = reinterpret_cast<float*>(smem + kPX);  // [3][16][16]
  float* sTi = reinterpret_cast<float*>(smem + kPTi);  // [64][65]
  bf16* sT1 = reinterpret_cast<bf16*>(smem + kPT1);  // T diag(beta exp(gc))
  bf16* sT2 = reinterpret_cast<bf16*>(smem + kPT2);  // T diag(beta)
  const uint32_t smem_s = smem_u32(smem);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.x, rep = p.nv / p.nk, kh = h / rep, ci = blockIdx.y;
  int s = 0;
  while (p.cb[s + 1] <= ci) ++s;
  const int64_t t0 = p.offs[s] + static_cast<int64_t>(ci - p.cb[s]) * kC;
  const int L = static_cast<int>(p.offs[s + 1] - t0 < kC ? p.offs[s + 1] - t0 : kC);
  const bf16* rows = p.qkv + t0 * p.C;
  const int rg = warp & 3, ch = warp >> 2;  // 64-row products: rows 16 rg, column half ch
  const int64_t qcol = static_cast<int64_t>(kh) * kD, kcol = static_cast<int64_t>(p.nk) * kD + qcol;
  const int64_t vcol = 2 * static_cast<int64_t>(p.nk) * kD + static_cast<int64_t>(h) * kD;
  const float qscale = 1.f / sqrtf(static_cast<float>(kD));
  unsigned char* rec = p.wsv + (static_cast<int64_t>(ci) * p.nv + h) * kRecV;
  unsigned char* krec = p.wsk + (static_cast<int64_t>(ci) * p.nk + kh) * kRecK;

  // ---- 1. q, k, g, beta; q, k l2-normalised, gc ----------------------------------------------------------------
  copy_rows(smem_s + kPQ, p, rows, qcol, L, warp, lane);
  copy_rows(smem_s + kPK, p, rows, kcol, L, warp, lane);
  if (warp == 0) {  // lane l: g, beta of tokens 2l and 2l + 1 (the tokens it sums in the gc scan)
    DFLASH_UNROLL
    for (int j = 0; j < 2; ++j) {
      const int r = 2 * lane + j;
      const bool ok = r < L;
      const int64_t o = (t0 + r) * p.nv + h;
      cp_async4(smem_s + kPG + 4 * r, ok ? p.g + o : p.g, ok);
      cp_async4(smem_s + kPB + 4 * r, ok ? p.beta + o : p.beta, ok);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();  // this warp's q, k rows (and warp 0's g) landed: the warp reads only those before the barrier
  for (int r = warp; r < 2 * kC; r += kWarps) {  // l2-normalise q (then / sqrt(dk)) and k rows, in place
    bf16* row = r < kC ? sQ + r * LD : sK + (r - kC) * LD;
    float v[kD / 32], ss = 0.f;
    DFLASH_UNROLL
    for (int i = 0; i < kD / 32; ++i) {
      v[i] = to_f(row[lane + 32 * i]);
      ss += v[i] * v[i];
    }
    ss = warp_sum(ss);
    const float sc = (r < kC ? qscale : 1.f) / sqrtf(ss + 1e-6f);
    DFLASH_UNROLL
    for (int i = 0; i < kD / 32; ++i) row[lane + 32 * i] = from_f<bf16>(v[i] * sc);
  }
  if (warp == 0) {  // gc = inclusive cumsum of g: lane l owns tokens 2l, 2l + 1
    const float a = sG[2 * lane], b = sG[2 * lane + 1];
    float s = a + b;
    for (int o = 1; o < 32; o <<= 1) {
      const float u = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += u;
    }
    __syncwarp();
    sG[2 * lane] = s - b;
    sG[2 * lane + 1] = s;
  }
  __syncthreads();
  if (h % rep == 0) {  // the key head's normalised Q, K (16-byte pieces; the first of its value heads writes them)
    for (int e = tid; e < 2 * kC * (kD / 8); e += kThreads) {
      const int tile = e / (kC * (kD / 8)), r = (e / (kD / 8)) % kC, c = (e % (kD / 8)) * 8;
      const bf16* src = (tile == 0 ? sQ : sK) + r * LD + c;
      bf16* dst = reinterpret_cast<bf16*>(krec + (tile == 0 ? kWsQ : kWsK)) + r * kD + c;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    }
  }
  if (tid < kC) reinterpret_cast<float*>(rec + kWsG)[tid] = sG[tid];

  // ---- 2. A = strict_lower(beta_i k_i.k_j e^{gc_i - gc_j}) (fp32), P = (q_i.k_j e^{gc_i - gc_j})_{j <= i} (bf16)
  {
    float a[4][4], q[4][4];
    zero(a);
    zero(q);
    warp_mma<4, kD, false>(a, sK, LD, 16 * rg, sK, LD, 32 * ch, lane);
    warp_mma<4, kD, false>(q, sQ, LD, 16 * rg, sK, LD, 32 * ch, lane);
    bf16* gP = reinterpret_cast<bf16*>(rec + kWsP);
    DFLASH_UNROLL
    for (int nt = 0; nt < 4; ++nt)
      DFLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * rg + g4 + hf * 8, j = 32 * ch + 8 * nt + 2 * t4;
        float pv[2];
        DFLASH_UNROLL
        for (int u = 0; u < 2; ++u) {
          const float dec = j + u <= i ? expf(sG[i] - sG[j + u]) : 0.f;
          sA[i * LF + j + u] = j + u < i ? sB[i] * a[nt][2 * hf + u] * dec : 0.f;
          pv[u] = q[nt][2 * hf + u] * dec;
        }
        *reinterpret_cast<uint32_t*>(gP + i * kC + j) = mma::pack_bf16(pv[0], pv[1]);
      }
  }
  __syncthreads();  // A complete; every warp's reads of q done
  copy_rows(smem_s + kPQ, p, rows, vcol, L, warp, lane);  // v into q's bytes, landing during the solve
  cp_async_commit();

  // ---- 3. T = (I + A)^-1 -----------------------------------------------------------------------------------
  if (warp < 4) {  // diagonal block `warp`: forward substitution, lane c = column (c < 16)
    const int b0 = 16 * warp, c = lane;
    for (int i = 0; i < 16; ++i) {
      float v = 0.f;
      if (c < 16) {
        if (c == i) {
          v = 1.f;
        } else if (c < i) {
          v = -sA[(b0 + i) * LF + b0 + c];
          for (int m = c + 1; m < i; ++m) v -= sA[(b0 + i) * LF + b0 + m] * sTi[(b0 + m) * LF + b0 + c];
        }
        sTi[(b0 + i) * LF + b0 + c] = v;
      }
      __syncwarp();
    }
  }
  __syncthreads();
  for (int d = 1; d < 4; ++d) {  // block diagonal d: blocks (bi, bi - d)
    const int pairs = 4 - d;
    for (int e = tid; e < pairs * 256; e += kThreads) {  // X = sum_{k=bj}^{bi-1} A_{bi,k} T_{k,bj}
      const int pr = e / 256, r = (e % 256) / 16, c = e % 16, bi = d + pr, bj = pr;
      float x = 0.f;
      for (int m = 16 * bj; m < 16 * bi; ++m) x += sA[(16 * bi + r) * LF + m] * sTi[m * LF + 16 * bj + c];
      sX[e] = x;
    }
    __syncthreads();
    for (int e = tid; e < pairs * 256; e += kThreads) {  // T_{bi,bj} = -T_{bi,bi} X
      const int pr = e / 256, r = (e % 256) / 16, c = e % 16, bi = d + pr, bj = pr;
      float x = 0.f;
      for (int m = 0; m < 16; ++m) x += sTi[(16 * bi + r) * LF + 16 * bi + m] * sX[pr * 256 + m * 16 + c];
      sTi[(16 * bi + r) * LF + 16 * bj + c] = -x;
    }
    __syncthreads();
  }
  for (int e = tid; e < kC * kC; e += kThreads) {  // T's columns scaled, as bf16 operands (lower triangle only)
    const int i = e / kC, j = e % kC;
    const float t = j <= i ? sTi[i * LF + j] * sB[j] : 0.f;
    sT1[i * LC + j] = from_f<bf16>(t * expf(sG[j]));
    sT2[i * LC + j] = from_f<bf16>(t);
  }
  cp_async_wait<0>();
  __syncthreads();  // T1, T2 and every warp's v rows

  // ---- 4. W = T diag(beta e^gc) K (stored as -W), U = T diag(beta) V, bf16 -----------------------------------
  {
    float w[8][4];
    zero(w);
    warp_mma<8, kC, true>(w, sT1, LC, 16 * rg, sK, LD, 64 * ch, lane);
    bf16* gW = reinterpret_cast<bf16*>(rec + kWsW);
    DFLASH_UNROLL
    for (int nt = 0; nt < 8; ++nt)
      DFLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * rg + g4 + hf * 8, j = 64 * ch + 8 * nt + 2 * t4;
        *reinterpret_cast<uint32_t*>(gW + i * kD + j) = mma::pack_bf16(-w[nt][2 * hf], -w[nt][2 * hf + 1]);
      }
  }
  {
    float u[8][4];
    zero(u);
    warp_mma<8, kC, true>(u, sT2, LC, 16 * rg, sV, LD, 64 * ch, lane);
    bf16* gU = reinterpret_cast<bf16*>(rec + kWsU);
    DFLASH_UNROLL
    for (int nt = 0; nt < 8; ++nt)
      DFLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * rg + g4 + hf * 8, j = 64 * ch + 8 * nt + 2 * t4;
        *reinterpret_cast<uint32_t*>(gU + i * kD + j) = mma::pack_bf16(u[nt][2 * hf], u[nt][2 * hf + 1]);
      }
  }
}

// cp.async of workspace record ci (value head h, key head kh) into the k_gdr_state stage at shared address st:
// thread tid copies 16-byte pieces tid + 256 i of each tile.
__device__ __forceinline__ void load_stage(uint32_t st, const SplitParams& p, int ci, int h, int kh, int tid) {
  const unsigned char* rec = p.wsv + (static_cast<int64_t>(ci) * p.nv + h) * kRecV;
  const unsigned char* krec = p.wsk + (static_cast<int64_t>(ci) * p.nk + kh) * kRecK;
  DFLASH_UNROLL
  for (int i = 0; i < kC * kD / 8 / kThreads; ++i) {
    const int e = tid + kThreads * i, r = e / (kD / 8), c = (e % (kD / 8)) * 8;
    const uint32_t d = static_cast<uint32_t>((r * LD + c) * 2);
    const int o = (r * kD + c) * 2;
    cp_async16(st + kSW + d, rec + kWsW + o, true);
    cp_async16(st + kSU + d, rec + kWsU + o, true);
    cp_async16(st + kSQ + d, krec + kWsQ + o, true);
    cp_async16(st + kSK + d, krec + kWsK + o, true);
  }
  DFLASH_UNROLL
  for (int i = 0; i < kC * kC / 8 / kThreads; ++i) {
    const int e = tid + kThreads * i, r = e / (kC / 8), c = (e % (kC / 8)) * 8;
    cp_async16(st + kSP + static_cast<uint32_t>((r * LC + c) * 2), rec + kWsP + (r * kC + c) * 2, true);
  }
  if (tid < kC / 4) cp_async16(st + kSG + 16 * tid, rec + kWsG + 16 * tid, true);
}

// Grid (nv, sequences of the launch): value head blockIdx.x of sequence blockIdx.y walks its chunks' records.
// NS: stages of workspace tiles (2, or 1 where shared memory is short: state_smem).
template <int NS>
__global__ void __launch_bounds__(kThreads, 1) k_gdr_state(SplitParams p) {
  static_assert(NS == 1 || NS == 2, "one or two stages");
  DFLASH_DYN_SMEM(smem);
  bf16* sS = reinterpret_cast<bf16*>(smem + state_ss(NS));    // [128][136]
  bf16* sVD = reinterpret_cast<bf16*>(smem + state_svd(NS));  // V' rows x exp(gc_63 - gc_i)
  const uint32_t smem_s = smem_u32(smem);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.x, kh = h / (p.nv / p.nk);
  const int64_t row0 = p.offs[blockIdx.y], T = p.offs[blockIdx.y + 1] - row0;
  const int c0 = p.cb[blockIdx.y], nc = p.cb[blockIdx.y + 1] - c0;
  bf16* out = p.out + row0 * p.nv * kD;
  const int rg = warp & 3, ch = warp >> 2;  // 64-row products: rows 16 rg, column half ch

  // the state: rows 16 warp + {g4, g4 + 8}, columns 8 nt + 2 t4 + {0, 1}
  float S[16][4];
  DFLASH_UNROLL
  for (int nt = 0; nt < 16; ++nt)
    DFLASH_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * warp + g4 + (e >> 1) * 8, c = 8 * nt + 2 * t4 + (e & 1);
      S[nt][e] = p.state ? p.state[(static_cast<int64_t>(h) * kD + r) * kD + c] : 0.f;
    }

  if (nc > 0) load_stage(smem_s, p, c0, h, kh, tid);
  cp_async_commit();
  for (int c = 0; c < nc; ++c) {
    const int64_t t0 = static_cast<int64_t>(c) * kC;
    const int L = static_cast<int>(T - t0 < kC ? T - t0 : kC), stage = NS == 2 ? c & 1 : 0;
    unsigned char* sbuf = smem + stage * kStage;
    const bf16* sW = reinterpret_cast<const bf16*>(sbuf + kSW);  // -W
    bf16* sU = reinterpret_cast<bf16*>(sbuf + kSU);              // U, then V'
    const bf16* sQ = reinterpret_cast<const bf16*>(sbuf + kSQ);
    const bf16* sK = reinterpret_cast<const bf16*>(sbuf + kSK);
    const bf16* sP = reinterpret_cast<const bf16*>(sbuf + kSP);
    const float* sG = reinterpret_cast<const float*>(sbuf + kSG);  // gc
    // S to bf16 (the previous chunk's reads of sS came before its second barrier)
    DFLASH_UNROLL
    for (int nt = 0; nt < 16; ++nt)
      DFLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * warp + g4 + hf * 8, cc = 8 * nt + 2 * t4;
        *reinterpret_cast<uint32_t*>(sS + r * LD + cc) = mma::pack_bf16(S[nt][2 * hf], S[nt][2 * hf + 1]);
      }
    cp_async_wait<0>();
    __syncthreads();  // this chunk's stage and S for every warp; the previous chunk's reads of the other stage done
    if (NS == 2) {
      if (c + 1 < nc) load_stage(smem_s + static_cast<uint32_t>((stage ^ 1) * kStage), p, c0 + c + 1, h, kh, tid);
      cp_async_commit();
    }

    // ---- V' = U - W S; O = e^{gc} Q S + P V'; S <- e^{gc_63} S + K^T (V' e^{gc_63 - gc}) -------------------------
    float V[8][4];  // U, then V'
    DFLASH_UNROLL
    for (int nt = 0; nt < 8; ++nt)
      DFLASH_UNROLL
      for (int e = 0; e < 4; ++e)
        V[nt][e] = to_f(sU[(16 * rg + g4 + (e >> 1) * 8) * LD + 64 * ch + 8 * nt + 2 * t4 + (e & 1)]);
    warp_mma<8, kD, true>(V, sW, LD, 16 * rg, sS, LD, 64 * ch, lane);
    const float glast = sG[kC - 1];
    DFLASH_UNROLL
    for (int nt = 0; nt < 8; ++nt)
      DFLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {  // V' into U's elements (read above by this lane only)
        const int i = 16 * rg + g4 + hf * 8, j = 64 * ch + 8 * nt + 2 * t4;
        const float d = expf(glast - sG[i]);
        *reinterpret_cast<uint32_t*>(sU + i * LD + j) = mma::pack_bf16(V[nt][2 * hf], V[nt][2 * hf + 1]);
        *reinterpret_cast<uint32_t*>(sVD + i * LD + j) = mma::pack_bf16(V[nt][2 * hf] * d, V[nt][2 * hf + 1] * d);
      }
    {
      float o[8][4];
      zero(o);
      warp_mma<8, kD, true>(o, sQ, LD, 16 * rg, sS, LD, 64 * ch, lane);
      DFLASH_UNROLL
      for (int nt = 0; nt < 8; ++nt)
        DFLASH_UNROLL
        for (int e = 0; e < 4; ++e) o[nt][e] *= expf(sG[16 * rg + g4 + (e >> 1) * 8]);
      __syncthreads();  // V' complete (every warp's rows)
      warp_mma<8, kC, true>(o, sP, LC, 16 * rg, sU, LD, 64 * ch, lane);
      DFLASH_UNROLL
      for (int nt = 0; nt < 8; ++nt)
        DFLASH_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 16 * rg + g4 + hf * 8, j = 64 * ch + 8 * nt + 2 * t4;
          if (i < L)
            *reinterpret_cast<uint32_t*>(out + ((t0 + i) * p.nv + h) * kD + j) =
                mma::pack_bf16(o[nt][2 * hf], o[nt][2 * hf + 1]);
        }
    }
    // the state: rows 16 warp of K^T (A operand from K [token][dk] stored k-major: ldmatrix .trans), V'd [token][dv]
    const float cd = expf(glast);
    DFLASH_UNROLL
    for (int nt = 0; nt < 16; ++nt)
      DFLASH_UNROLL
      for (int e = 0; e < 4; ++e) S[nt][e] *= cd;
    DFLASH_UNROLL
    for (int k0 = 0; k0 < kC; k0 += 16) {
      uint32_t af[4];
      mma::load_at(af, sK, LD, 16 * warp, k0, lane);
      DFLASH_UNROLL
      for (int nt = 0; nt < 16; nt += 2) {
        uint32_t bf[4];
        mma::load_b(bf, sVD, LD, k0, nt * 8, lane);
        mma::mma16816(S[nt], af, bf[0], bf[1]);
        mma::mma16816(S[nt + 1], af, bf[2], bf[3]);
      }
    }
    // two stages, no barrier: the next chunk's first one comes before anything this chunk reads is written again
    // (S's bf16 copy is written before it, but its last reads here preceded the second barrier). One stage: every
    // warp is past its reads of the stage (K above, P and V' before) before the next chunk's tiles overwrite it.
    if (NS == 1 && c + 1 < nc) {
      __syncthreads();
      load_stage(smem_s, p, c0 + c + 1, h, kh, tid);
      cp_async_commit();
    }
  }
  if (p.state) {
    DFLASH_UNROLL
    for (int nt = 0; nt < 16; ++nt)
      DFLASH_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * warp + g4 + (e >> 1) * 8, c = 8 * nt + 2 * t4 + (e & 1);
        p.state[(static_cast<int64_t>(h) * kD + r) * kD + c] = S[nt][e];
      }
  }
}

}  // namespace

std::string gated_delta_kernels(const Env& e) {
  if (e.smem_limit >= kSmemState)
    return "chunked, mma.sync, 2 stages (head dims 128, 64 tokens or more), else recurrent";
  if (e.smem_limit >= kSmemState1)
    return "chunked, mma.sync, 1 stage (head dims 128, 64 tokens or more), else recurrent";
  return cat("recurrent, CUDA cores (the chunked kernel needs ", kSmemState1 / 1024, " KiB of shared memory per block, ",
             "this device allows ", e.smem_limit / 1024, " KiB)");
}

bool gated_delta_chunk_applies(const Env& e, const GatedDeltaArgs& a, int64_t T) {
  return a.qkv.dtype == DType::BF16 && a.dk == kD && a.dv == kD && T >= kC && e.smem_limit >= kSmemState1;
}

void gated_delta_chunk(Env& e, const GatedDeltaArgs& a, const Tensor& out, int64_t T) {
  DFLASH_CHECK(e.smem_limit >= kSmemState1, "gated_delta_rule (cuda): the chunked kernel needs ", kSmemState1,
               " bytes of shared memory per block, the device allows ", e.smem_limit);
  const bool two = e.smem_limit >= kSmemState;
  const std::vector<int64_t> seqs = a.seqs.empty() ? std::vector<int64_t>{0, T} : a.seqs;
  const int64_t n = static_cast<int64_t>(seqs.size()) - 1;
  auto chunks_of = [&](int64_t s) {
    return (seqs[static_cast<size_t>(s + 1)] - seqs[static_cast<size_t>(s)] + kC - 1) / kC;
  };
  // launch groups [s0, s1): at most kMaxSeqs sequences and kWsBudget bytes of workspace (a longer sequence alone)
  const int64_t per_chunk = a.nv * kRecV + a.nk * kRecK, budget = std::max<int64_t>(1, kWsBudget / per_chunk);
  std::vector<int64_t> starts;
  int64_t most = 0;
  for (int64_t s0 = 0, s1 = 0; s0 < n; s0 = s1) {
    int64_t chunks = 0;
    for (s1 = s0; s1 < n && s1 - s0 < kMaxSeqs && (s1 == s0 || chunks + chunks_of(s1) <= budget); ++s1)
      chunks += chunks_of(s1);
    starts.push_back(s0);
    most = std::max(most, chunks);
  }
  starts.push_back(n);
  DFLASH_CHECK(most <= 65535, "gated_delta_rule (cuda): a sequence of ", most * kC,
               " tokens is above the chunked kernel's 65535 chunks per launch");
  Tensor ws = e.alloc(DType::U8, {most * per_chunk});  // [most][nv] value-head records, then [most][nk] key-head ones
  unsigned char* wsv = static_cast<unsigned char*>(ws.data);
  for (size_t gi = 0; gi + 1 < starts.size(); ++gi) {
    const int64_t s0 = starts[gi], ns = starts[gi + 1] - s0;
    SplitParams p{static_cast<const bf16*>(a.qkv.data), a.g.ptr<float>(), a.beta.ptr<float>(),
                  a.state.defined() ? a.state.ptr<float>() : nullptr, static_cast<bf16*>(out.data), wsv,
                  wsv + most * a.nv * kRecV, static_cast<int>(a.nk), static_cast<int>(a.nv), a.qkv.shape[1], {}, {}};
    int chunks = 0;
    for (int64_t i = 0; i <= ns; ++i) {
      p.offs[i] = seqs[static_cast<size_t>(s0 + i)];
      p.cb[i] = chunks;
      if (i < ns) chunks += static_cast<int>(chunks_of(s0 + i));
    }
    if (chunks == 0) continue;  // only empty sequences
    DFLASH_LAUNCH(dim3(static_cast<unsigned>(a.nv), static_cast<unsigned>(chunks)), kThreads, kSmemPrep, e.stream,
                  k_gdr_prep)(p);
    check_launch("gated_delta_rule (chunked, state-free part)");
    const dim3 grid(static_cast<unsigned>(a.nv), static_cast<unsigned>(ns));
    if (two) DFLASH_LAUNCH(grid, kThreads, kSmemState, e.stream, k_gdr_state<2>)(p);
    else DFLASH_LAUNCH(grid, kThreads, kSmemState1, e.stream, k_gdr_state<1>)(p);
    check_launch("gated_delta_rule (chunked, state part)");
  }
}

void gated_delta_init_attributes(int smem_optin) {
#ifndef DFLASH_CUDA_EMU
  allow_dynamic_smem(smem_optin, k_gdr_prep, k_gdr_state<2>, k_gdr_state<1>);
#else
  (void)smem_optin;
#endif
}

}  // namespace dflash::cuda
