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
// One CTA of 8 warps per value head walks the sequence's chunks in order; the state stays in the warps' mma
// accumulators (warp w: state rows 16w .. 16w+15, all 128 columns: 64 fp32 registers per thread). Per chunk:
//  1. q, k (the value head's key head) and v rows, g, beta: copied by cp.async into one of two stages while the
//     previous chunk computed (zero-filled rows past the end: they add nothing); each warp copies the q, k rows it
//     l2-normalises (in place, a warp per row) and waits for its own copies only; gc by warp 0's scan of its own g.
//     One block barrier, then the next chunk's copies go into the other stage.
//  2. K K^T and Q K^T (64 x 64, K = 128), masked and decayed: A in fp32, P in bf16.
//  3. T = (I + A)^-1 in fp32: the four 16 x 16 diagonal blocks by forward substitution (a warp each), the blocks below
//     by T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj, one block diagonal at a time (flash-linear-attention's solve_tril).
//  4. W and U (64 x 128, K = 64) with T's columns scaled as bf16 operands; -W kept in shared memory, U in registers.
//  5. S to bf16 in shared memory; V' = U + (-W) S; O = exp(gc) (Q S) + P V' written out; S <- exp(gc_63) S + K^T V'd.
// Warps split the 64 x 128 products as 4 row groups of 16 x 2 column halves of 64. Shared memory: 218 KB (1 CTA/SM;
// the two input stages 2 x 51.5 KB). 12 block barriers per chunk: none between chunks (the next chunk's first one
// follows a normalisation that touches only its own stage) and none between W, U and the state's bf16 copy.
// Roundings (as flash-linear-attention): normalised q, k, the scaled T, W, P, V' and S as bf16 operands; every sum in
// fp32. Parallelism: one CTA per value head and sequence (a packed prefill's sequences in one launch: GatedDeltaArgs
// seqs, grid nv x sequences); the sequential dependence is only the state between chunks.
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

// Shared-memory layout (bytes): two stages of a chunk's inputs (q, k, v, g then gc, beta; chunk i in stage i % 2, the
// next chunk's copies land in the other one), then the tiles of the chunk's math
constexpr int kTile128 = kC * LD * 2;   // a [64][136] bf16 tile
constexpr int kTile64 = kC * LC * 2;    // a [64][72] bf16 tile
constexpr int kSQ = 0, kSK = kSQ + kTile128, kSV = kSK + kTile128, kSG = kSV + kTile128, kSB = kSG + kC * 4;
constexpr int kStage = kSB + kC * 4;
constexpr int kOffW = 2 * kStage;
constexpr int kOffVN = kOffW + kTile128, kOffVD = kOffVN + kTile128;
constexpr int kOffP = kOffVD + kTile128, kOffT1 = kOffP + kTile64, kOffT2 = kOffT1 + kTile64;
// A and T (fp32 [64][65] each) while T is made; the state's bf16 copy [128][136] once W, U are done (the same bytes)
constexpr int kOffU = kOffT2 + kTile64;
constexpr int kUnion = kD * LD * 2 > 2 * kC * LF * 4 ? kD * LD * 2 : 2 * kC * LF * 4;
constexpr int kOffX = kOffU + kUnion;  // fp32 scratch of the off-diagonal blocks: 3 x 16 x 16
constexpr int kSmem = kOffX + 3 * 256 * 4;

constexpr int kMaxSeqs = 32;  // sequences per launch (blockIdx.y)

struct ChunkParams {
  const bf16* qkv;  // [T, C]
  const float* g;   // [T, nv]
  const float* beta;
  float* state;     // [nv, 128, 128] or null (only with one sequence)
  bf16* out;        // [T, nv, 128]
  int nk, nv;
  int64_t C;
  int64_t offs[kMaxSeqs + 1];  // sequence s of this launch: rows offs[s] .. offs[s + 1] - 1
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

// cp.async of the rows t0 .. t0 + L - 1 of this CTA's sequence into the stage at shared address st (the rest of the
// chunk's 64 zero-filled). Warp w copies the q, k and v rows w + 8j (j < 8), the q and k rows it l2-normalises (so
// that it waits for its own copies only), a lane two 16-byte pieces of a row per tile; warp 0 copies g and beta,
// lane l those of tokens 2l and 2l + 1 (the tokens it sums in the gc scan). qkv, G, Beta: the sequence's first row;
// zero-filled copies read nothing but still name a valid address (the tensors' starts).
__device__ __forceinline__ void load_chunk(uint32_t st, const ChunkParams& p, const bf16* qkv, const float* G,
                                           const float* Beta, int64_t t0, int L, int64_t qcol, int64_t kcol,
                                           int64_t vcol, int h, int warp, int lane) {
  const int c = (lane & 15) * 8;
  DFLASH_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int r = warp + 8 * (2 * i + (lane >> 4));
    const bool ok = r < L;
    const bf16* row = ok ? qkv + (t0 + r) * p.C : p.qkv;
    const uint32_t d = st + static_cast<uint32_t>((r * LD + c) * 2);
    cp_async16(d + kSQ, ok ? row + qcol + c : row, ok);
    cp_async16(d + kSK, ok ? row + kcol + c : row, ok);
    cp_async16(d + kSV, ok ? row + vcol + c : row, ok);
  }
  if (warp == 0) {
    DFLASH_UNROLL
    for (int j = 0; j < 2; ++j) {
      const int r = 2 * lane + j;
      const bool ok = r < L;
      const int64_t o = (t0 + r) * p.nv + h;
      cp_async4(st + kSG + 4 * r, ok ? G + o : p.g, ok);
      cp_async4(st + kSB + 4 * r, ok ? Beta + o : p.beta, ok);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
  DFLASH_UNROLL
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}

__global__ void __launch_bounds__(kThreads, 1) k_gdr_chunk(ChunkParams p) {
  DFLASH_DYN_SMEM(smem);
  bf16* sW = reinterpret_cast<bf16*>(smem + kOffW);    // -W
  bf16* sVN = reinterpret_cast<bf16*>(smem + kOffVN);  // V'
  bf16* sVD = reinterpret_cast<bf16*>(smem + kOffVD);  // V' rows x exp(gc_63 - gc_i)
  bf16* sP = reinterpret_cast<bf16*>(smem + kOffP);
  bf16* sT1 = reinterpret_cast<bf16*>(smem + kOffT1);  // T diag(beta exp(gc))
  bf16* sT2 = reinterpret_cast<bf16*>(smem + kOffT2);  // T diag(beta)
  float* sA = reinterpret_cast<float*>(smem + kOffU);  // [64][65]
  float* sTi = sA + kC * LF;                           // [64][65]
  bf16* sS = reinterpret_cast<bf16*>(smem + kOffU);    // [128][136] (after T is used)
  float* sX = reinterpret_cast<float*>(smem + kOffX);  // [3][16][16]
  const uint32_t smem_s = smem_u32(smem);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.x, kh = h / (p.nv / p.nk);
  const int64_t row0 = p.offs[blockIdx.y], T = p.offs[blockIdx.y + 1] - row0;
  const bf16* qkv = p.qkv + row0 * p.C;
  const float* G = p.g + row0 * p.nv;
  const float* Beta = p.beta + row0 * p.nv;
  bf16* out = p.out + row0 * p.nv * kD;
  const int rg = warp & 3, ch = warp >> 2;  // 64-row products: rows 16 rg, column half ch
  const int64_t qcol = static_cast<int64_t>(kh) * kD, kcol = static_cast<int64_t>(p.nk) * kD + qcol;
  const int64_t vcol = 2 * static_cast<int64_t>(p.nk) * kD + static_cast<int64_t>(h) * kD;
  const float qscale = 1.f / sqrtf(static_cast<float>(kD));

  // the state: rows 16 warp + {g4, g4 + 8}, columns 8 nt + 2 t4 + {0, 1}
  float S[16][4];
  DFLASH_UNROLL
  for (int nt = 0; nt < 16; ++nt)
    DFLASH_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * warp + g4 + (e >> 1) * 8, c = 8 * nt + 2 * t4 + (e & 1);
      S[nt][e] = p.state ? p.state[(static_cast<int64_t>(h) * kD + r) * kD + c] : 0.f;
    }

  if (T > 0) load_chunk(smem_s, p, qkv, G, Beta, 0, static_cast<int>(T < kC ? T : kC), qcol, kcol, vcol, h,
                        warp, lane);
  cp_async_commit();
  for (int64_t t0 = 0; t0 < T; t0 += kC) {
    const int L = static_cast<int>(T - t0 < kC ? T - t0 : kC), stage = static_cast<int>(t0 / kC) & 1;
    unsigned char* sbuf = smem + stage * kStage;
    bf16* sQ = reinterpret_cast<bf16*>(sbuf + kSQ);
    bf16* sK = reinterpret_cast<bf16*>(sbuf + kSK);
    bf16* sV = reinterpret_cast<bf16*>(sbuf + kSV);
    float* sG = reinterpret_cast<float*>(sbuf + kSG);  // g, then gc
    float* sB = reinterpret_cast<float*>(sbuf + kSB);  // beta
    // ---- 1. inputs (copied during the previous chunk) ---------------------------------------------------------
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
    __syncthreads();  // the inputs for every warp; the previous chunk's reads of the other stage are done
    if (t0 + kC < T)  // the next chunk's inputs into the other stage, under this chunk's math
      load_chunk(smem_s + static_cast<uint32_t>((stage ^ 1) * kStage), p, qkv, G, Beta, t0 + kC,
                 static_cast<int>(T - t0 - kC < kC ? T - t0 - kC : kC), qcol, kcol, vcol, h, warp, lane);
    cp_async_commit();

    // ---- 2. A = strict_lower(beta_i k_i.k_j e^{gc_i - gc_j}) (fp32), P = (q_i.k_j e^{gc_i - gc_j})_{j <= i} (bf16)
    {
      float a[4][4], q[4][4];
      zero(a);
      zero(q);
      warp_mma<4, kD, false>(a, sK, LD, 16 * rg, sK, LD, 32 * ch, lane);
      warp_mma<4, kD, false>(q, sQ, LD, 16 * rg, sK, LD, 32 * ch, lane);
      DFLASH_UNROLL
      for (int nt = 0; nt < 4; ++nt)
        DFLASH_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * rg + g4 + (e >> 1) * 8, j = 32 * ch + 8 * nt + 2 * t4 + (e & 1);
          const float dec = j <= i ? expf(sG[i] - sG[j]) : 0.f;
          sA[i * LF + j] = j < i ? sB[i] * a[nt][e] * dec : 0.f;
          sP[i * LC + j] = from_f<bf16>(q[nt][e] * dec);
        }
    }
    __syncthreads();

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
    __syncthreads();

    // ---- 4. W = T diag(beta e^gc) K (kept as -W, bf16), U = T diag(beta) V (registers) ---------------------------
    float U[8][4];
    {
      float w[8][4];
      zero(w);
      zero(U);
      warp_mma<8, kC, true>(w, sT1, LC, 16 * rg, sK, LD, 64 * ch, lane);
      warp_mma<8, kC, true>(U, sT2, LC, 16 * rg, sV, LD, 64 * ch, lane);
      DFLASH_UNROLL
      for (int nt = 0; nt < 8; ++nt)
        DFLASH_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 16 * rg + g4 + hf * 8, j = 64 * ch + 8 * nt + 2 * t4;
          *reinterpret_cast<uint32_t*>(sW + i * LD + j) = mma::pack_bf16(-w[nt][2 * hf], -w[nt][2 * hf + 1]);
        }
    }
    // A and T are dead since the barrier after T's scaling (step 4 reads neither): their bytes take the state's bf16
    // copy without a barrier here
    DFLASH_UNROLL
    for (int nt = 0; nt < 16; ++nt)
      DFLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 16 * warp + g4 + hf * 8, c = 8 * nt + 2 * t4;
        *reinterpret_cast<uint32_t*>(sS + r * LD + c) = mma::pack_bf16(S[nt][2 * hf], S[nt][2 * hf + 1]);
      }
    __syncthreads();

    // ---- 5. V' = U - W S; O = e^{gc} Q S + P V'; S <- e^{gc_63} S + K^T (V' e^{gc_63 - gc}) -----------------------
    const float glast = sG[kC - 1];
    warp_mma<8, kD, true>(U, sW, LD, 16 * rg, sS, LD, 64 * ch, lane);  // U becomes V'
    DFLASH_UNROLL
    for (int nt = 0; nt < 8; ++nt)
      DFLASH_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * rg + g4 + hf * 8, j = 64 * ch + 8 * nt + 2 * t4;
        const float d = expf(glast - sG[i]);
        *reinterpret_cast<uint32_t*>(sVN + i * LD + j) = mma::pack_bf16(U[nt][2 * hf], U[nt][2 * hf + 1]);
        *reinterpret_cast<uint32_t*>(sVD + i * LD + j) = mma::pack_bf16(U[nt][2 * hf] * d, U[nt][2 * hf + 1] * d);
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
      warp_mma<8, kC, true>(o, sP, LC, 16 * rg, sVN, LD, 64 * ch, lane);
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
    // no barrier: the next chunk's first one (after its normalisation, which touches only the other stage) comes
    // before anything this chunk reads is written again
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

bool gated_delta_chunk_applies(const Env& e, const GatedDeltaArgs& a, int64_t T) {
  return a.qkv.dtype == DType::BF16 && a.dk == kD && a.dv == kD && T >= kC && e.smem_limit >= kSmem;
}

void gated_delta_chunk(Env& e, const GatedDeltaArgs& a, const Tensor& out, int64_t T) {
  DFLASH_CHECK(e.smem_limit >= kSmem, "gated_delta_rule (cuda): the chunked kernel needs ", kSmem,
               " bytes of shared memory per block, the device allows ", e.smem_limit);
  const std::vector<int64_t> seqs = a.seqs.empty() ? std::vector<int64_t>{0, T} : a.seqs;
  const int64_t n = static_cast<int64_t>(seqs.size()) - 1;
  for (int64_t s0 = 0; s0 < n; s0 += kMaxSeqs) {  // a grid row per sequence, up to kMaxSeqs per launch
    const int64_t ns = std::min<int64_t>(kMaxSeqs, n - s0);
    ChunkParams p{static_cast<const bf16*>(a.qkv.data), a.g.ptr<float>(), a.beta.ptr<float>(),
                  a.state.defined() ? a.state.ptr<float>() : nullptr, static_cast<bf16*>(out.data),
                  static_cast<int>(a.nk), static_cast<int>(a.nv), a.qkv.shape[1], {}};
    for (int64_t i = 0; i <= ns; ++i) p.offs[i] = seqs[static_cast<size_t>(s0 + i)];
    const dim3 grid(static_cast<unsigned>(a.nv), static_cast<unsigned>(ns));
    DFLASH_LAUNCH(grid, kThreads, kSmem, e.stream, k_gdr_chunk)(p);
    check_launch("gated_delta_rule (chunked)");
  }
}

void gated_delta_init_attributes(int smem_optin) {
#ifndef DFLASH_CUDA_EMU
  allow_dynamic_smem(smem_optin, k_gdr_chunk);
#else
  (void)smem_optin;
#endif
}

}  // namespace dflash::cuda
