// cuda/dflash_attention.cu — DFlash block attention (spec 2.3), forward and backward, block-sparse from the anchors:
// query block j (slots i < B, anchor a_j, valid_j) sees the context keys [0, a_j) (strictly before the anchor) and
// the B keys of its own block; a padding block sees nothing (zeros, lse = -inf). No dense mask and no Q x KV
// buffer: the only scratch is D = rowsum(dO * O), one float per (query, head).
//
// Forward: the shared two-segment flash kernel (attention_fwd.cu): segment 1 = k_ctx rows [0, a_j), segment 2 =
// k_blk rows [j B, j B + B).
// Backward (FlashAttention-2, Dao 2023, Algorithm 2, with P recomputed from the saved lse):
//   P = exp(S - lse), dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D),
//   dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO
// in two deterministic kernels (no atomics, every output element written by exactly one thread):
//   k_attn_dq  (query-major): a CTA of M = 4096/D query rows (queries x the heads of one kv group) walks the key
//              tiles of its rows' two segments, as the forward does, accumulating dQ in registers.
//   k_attn_dkv (key-major):   a CTA owns NK = 4096/D keys of one kv head (a context tile or a block-key tile) and
//              walks the query blocks that can see them: for a context tile starting at k0, the valid blocks with
//              a_j > k0 (a suffix when the anchors are sorted; any order works); for a block-key tile, the blocks
//              owning those keys. Each block's B x (nh/nkv) query rows are staged in chunks of mc rows.
//              dK, dV accumulate in registers and are written once.
// Keys no query sees (context keys >= max a_j, keys of padding blocks) get zero gradients.
#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }

// D[row] = sum_c dO[row, c] * O[row, c], one warp per (query, head) row.
__global__ void k_rowdot(const bf16* __restrict__ o, const bf16* __restrict__ dout, float* __restrict__ Dr,
                         int64_t rows, int d) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float s = 0.f;
  for (int c = lane; c < d; c += 32) s += __bfloat162float(o[row * d + c]) * __bfloat162float(dout[row * d + c]);
  s = warp_sum(s);
  if (lane == 0) Dr[row] = s;
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads) k_attn_dq(AttnBwdParams p) {
  constexpr int M = 4096 / D;
  constexpr int NT = kAttnThreads;
  constexpr int ACC = M * D / NT;
  constexpr int LD = D + 2;
  DFLASH_DYN_SMEM(smem);
  const int nk = p.nk, ldS = nk + 1;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + M * LD;
  bf16* sK = sdO + M * LD;
  bf16* sV = sK + nk * LD;
  float* sP = reinterpret_cast<float*>(smem + align16(static_cast<size_t>(2 * M + 2 * nk) * LD * sizeof(bf16)));
  float* sLse = sP + M * ldS;
  float* sDr = sLse + M;
  int* sHi1 = reinterpret_cast<int*>(sDr + M);
  int* sLo2 = sHi1 + M;
  int* sHi2 = sLo2 + M;
  int* sLo1 = sHi2 + M;
  int* sExt = sLo1 + M;

  const int tid = threadIdx.x;
  const int d = p.d, nh = p.nh, nkv = p.nkv, mq = p.mq, hc = p.hc;
  const int rep = nh / nkv, splits = rep / hc;
  const int g = blockIdx.y / splits;
  const int h0 = g * rep + (blockIdx.y % splits) * hc;
  const int q0 = blockIdx.x * mq;
  const bf16 zero = __float2bfloat16(0.f);

  for (int r = tid; r < M; r += NT) {
    int lo1 = 0, hi1 = 0, lo2 = 0, hi2 = 0;
    float lse = 0.f, dr = 0.f;
    const int hh = r / mq, qi = q0 + r % mq;
    if (hh < hc && qi < p.Tq) {
      dflash_row_bounds(qi, p.B, p.T1, p.window, p.anchors, p.valid, nullptr, lo1, hi1, lo2, hi2);
      if (p.valid[qi / p.B]) {
        const int64_t row = static_cast<int64_t>(qi) * nh + h0 + hh;
        lse = p.lse[row];
        dr = p.Dr[row];
      }
    }
    sLo1[r] = lo1;
    sHi1[r] = hi1;
    sLo2[r] = lo2;
    sHi2[r] = hi2;
    sLse[r] = lse;
    sDr[r] = dr;
  }
  for (int idx = tid; idx < M * D; idx += NT) {
    const int r = idx / D, c = idx % D;
    const int hh = r / mq, qi = q0 + r % mq;
    bf16 qv = zero, gv = zero;
    if (c < d && hh < hc && qi < p.Tq) {
      const int64_t off = (static_cast<int64_t>(qi) * nh + h0 + hh) * d + c;
      qv = p.q[off];
      gv = p.dout[off];
    }
    sQ[r * LD + c] = qv;
    sdO[r * LD + c] = gv;
  }
  __syncthreads();
  if (tid == 0) {
    int e1 = 0, l1 = 0x7fffffff, lo = 0x7fffffff, hi = 0;
    for (int r = 0; r < M; ++r) {
      if (sHi1[r] > sLo1[r]) {
        e1 = max(e1, sHi1[r]);
        l1 = min(l1, sLo1[r]);
      }
      if (sHi2[r] > sLo2[r]) {
        lo = min(lo, sLo2[r]);
        hi = max(hi, sHi2[r]);
      }
    }
    sExt[0] = e1;
    sExt[1] = hi > 0 ? lo : 0;
    sExt[2] = hi;
    sExt[3] = e1 > 0 ? l1 : 0;
  }
  __syncthreads();
  const int ext_lo1 = sExt[3], ext1 = sExt[0], ext_lo2 = sExt[1], ext_hi2 = sExt[2];

  float acc[ACC];
  DFLASH_UNROLL
  for (int u = 0; u < ACC; ++u) acc[u] = 0.f;

  for (int seg = 0; seg < 2; ++seg) {
    const int klo = seg == 0 ? ext_lo1 : ext_lo2, khi = seg == 0 ? ext1 : ext_hi2;
    const bf16* Kp = seg == 0 ? p.k1 : p.k2;
    const bf16* Vp = seg == 0 ? p.v1 : p.v2;
    for (int kt = klo; kt < khi; kt += nk) {
      __syncthreads();
      for (int idx = tid; idx < nk * D; idx += NT) {
        const int kk = idx / D, c = idx % D, key = kt + kk;
        bf16 kv = zero, vv = zero;
        if (key < khi && c < d) {
          const int64_t off = (static_cast<int64_t>(key) * nkv + g) * d + c;
          kv = Kp[off];
          vv = Vp[off];
        }
        sK[kk * LD + c] = kv;
        sV[kk * LD + c] = vv;
      }
      __syncthreads();
      for (int idx = tid; idx < M * nk; idx += NT) {
        const int r = idx / nk, kk = idx % nk, key = kt + kk;
        const bool vis = seg == 0 ? (key >= sLo1[r] && key < sHi1[r]) : (key >= sLo2[r] && key < sHi2[r]);
        float ds = 0.f;
        if (vis) {
          const bf16* qr = sQ + r * LD;
          const bf16* gr = sdO + r * LD;
          const bf16* kr = sK + kk * LD;
          const bf16* vr = sV + kk * LD;
          float s = 0.f, dp = 0.f;
          for (int c = 0; c < d; ++c) {
            s += to_f(qr[c]) * to_f(kr[c]);
            dp += to_f(gr[c]) * to_f(vr[c]);
          }
          const float pr = expf(s * p.scale - sLse[r]);
          ds = pr * (dp - sDr[r]);
        }
        sP[r * ldS + kk] = ds;
      }
      __syncthreads();
      DFLASH_UNROLL
      for (int u = 0; u < ACC; ++u) {
        const int idx = tid + NT * u, r = idx / D, c = idx % D;
        const float* prow = sP + r * ldS;
        float a = acc[u];
        for (int kk = 0; kk < nk; ++kk) a += prow[kk] * to_f(sK[kk * LD + c]);
        acc[u] = a;
      }
    }
  }
  DFLASH_UNROLL
  for (int u = 0; u < ACC; ++u) {
    const int idx = tid + NT * u, r = idx / D, c = idx % D;
    const int hh = r / mq, qi = q0 + r % mq;
    if (c < d && hh < hc && qi < p.Tq)
      p.dq[(static_cast<int64_t>(qi) * nh + h0 + hh) * d + c] = __float2bfloat16(p.scale * acc[u]);
  }
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads) k_attn_dkv(AttnBwdParams p) {
  constexpr int NK = 4096 / D;  // keys per CTA
  constexpr int NT = kAttnThreads;
  constexpr int ACC = NK * D / NT;
  constexpr int LD = D + 2;
  constexpr int ldP = NK + 1;
  DFLASH_DYN_SMEM(smem);
  const int mc = p.mc;
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + NK * LD;
  bf16* sQ = sV + NK * LD;
  bf16* sdO = sQ + mc * LD;
  float* sP = reinterpret_cast<float*>(smem + align16(static_cast<size_t>(2 * NK + 2 * mc) * LD * sizeof(bf16)));
  float* sdS = sP + mc * ldP;
  float* sLse = sdS + mc * ldP;
  float* sDr = sLse + mc;

  const int tid = threadIdx.x;
  const int d = p.d, nh = p.nh, nkv = p.nkv, B = p.B;
  const int rep = nh / nkv;
  const int g = blockIdx.y;
  const int n_ctx_tiles = (p.T1 + NK - 1) / NK;
  const int seg = static_cast<int>(blockIdx.x) < n_ctx_tiles ? 0 : 1;
  const int kt = (seg == 0 ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x) - n_ctx_tiles) * NK;
  const int Tseg = seg == 0 ? p.T1 : p.T2;
  const int kend = kt + NK < Tseg ? kt + NK : Tseg;
  const bf16* Kp = seg == 0 ? p.k1 : p.k2;
  const bf16* Vp = seg == 0 ? p.v1 : p.v2;
  const bf16 zero = __float2bfloat16(0.f);

  for (int idx = tid; idx < NK * D; idx += NT) {
    const int kk = idx / D, c = idx % D, key = kt + kk;
    bf16 kv = zero, vv = zero;
    if (key < kend && c < d) {
      const int64_t off = (static_cast<int64_t>(key) * nkv + g) * d + c;
      kv = Kp[off];
      vv = Vp[off];
    }
    sK[kk * LD + c] = kv;
    sV[kk * LD + c] = vv;
  }
  float acc_k[ACC], acc_v[ACC];
  DFLASH_UNROLL
  for (int u = 0; u < ACC; ++u) acc_k[u] = acc_v[u] = 0.f;

  const int rows_per_block = B * rep;
  const int jlo = seg == 0 ? 0 : kt / B;
  const int jhi = seg == 0 ? p.N : min(p.N, (kend - 1) / B + 1);
  for (int j = jlo; j < jhi; ++j) {  // every condition below is uniform over the CTA
    if (!p.valid[j]) continue;
    // slot 0 has the widest context range of the block ([lo1, hi1) of the other slots lie inside it); each row's own
    // range comes from dflash_row_bounds below
    int lo_any, hi_any, unused_lo2, unused_hi2;
    dflash_row_bounds(j * B, B, p.T1, p.window, p.anchors, p.valid, nullptr, lo_any, hi_any, unused_lo2, unused_hi2);
    if (seg == 0 && (hi_any <= kt || lo_any >= kend)) continue;  // no key of this tile is in block j's range
    for (int c0 = 0; c0 < rows_per_block; c0 += mc) {
      const int nrows = rows_per_block - c0 < mc ? rows_per_block - c0 : mc;
      __syncthreads();  // the previous chunk's shared rows are no longer read
      for (int r = tid; r < nrows; r += NT) {
        const int rb = c0 + r, qi = j * B + rb % B, h = g * rep + rb / B;
        const int64_t row = static_cast<int64_t>(qi) * nh + h;
        sLse[r] = p.lse[row];
        sDr[r] = p.Dr[row];
      }
      for (int idx = tid; idx < mc * D; idx += NT) {
        const int r = idx / D, c = idx % D;
        bf16 qv = zero, gv = zero;
        if (r < nrows && c < d) {
          const int rb = c0 + r, qi = j * B + rb % B, h = g * rep + rb / B;
          const int64_t off = (static_cast<int64_t>(qi) * nh + h) * d + c;
          qv = p.q[off];
          gv = p.dout[off];
        }
        sQ[r * LD + c] = qv;
        sdO[r * LD + c] = gv;
      }
      __syncthreads();
      for (int idx = tid; idx < nrows * NK; idx += NT) {
        const int r = idx / NK, kk = idx % NK, key = kt + kk;
        float pr = 0.f, ds = 0.f;
        int lo1, hi1, lo2, hi2;
        dflash_row_bounds(j * B + (c0 + r) % B, B, p.T1, p.window, p.anchors, p.valid, nullptr, lo1, hi1, lo2, hi2);
        const int vis_lo = seg == 0 ? lo1 : lo2, vis_hi = seg == 0 ? hi1 : hi2;
        if (key < kend && key >= vis_lo && key < vis_hi) {
          const bf16* qr = sQ + r * LD;
          const bf16* gr = sdO + r * LD;
          const bf16* kr = sK + kk * LD;
          const bf16* vr = sV + kk * LD;
          float s = 0.f, dp = 0.f;
          for (int c = 0; c < d; ++c) {
            s += to_f(qr[c]) * to_f(kr[c]);
            dp += to_f(gr[c]) * to_f(vr[c]);
          }
          pr = expf(s * p.scale - sLse[r]);
          ds = pr * (dp - sDr[r]);
        }
        sP[r * ldP + kk] = pr;
        sdS[r * ldP + kk] = ds;
      }
      __syncthreads();
      DFLASH_UNROLL
      for (int u = 0; u < ACC; ++u) {
        const int idx = tid + NT * u, kk = idx / D, c = idx % D;
        float ak = acc_k[u], av = acc_v[u];
        for (int r = 0; r < nrows; ++r) {
          av += sP[r * ldP + kk] * to_f(sdO[r * LD + c]);
          ak += sdS[r * ldP + kk] * to_f(sQ[r * LD + c]);
        }
        acc_k[u] = ak;
        acc_v[u] = av;
      }
    }
  }
  bf16* dK = seg == 0 ? p.dk1 : p.dk2;
  bf16* dV = seg == 0 ? p.dv1 : p.dv2;
  DFLASH_UNROLL
  for (int u = 0; u < ACC; ++u) {
    const int idx = tid + NT * u, kk = idx / D, c = idx % D, key = kt + kk;
    if (key < kend && c < d) {
      const int64_t off = (static_cast<int64_t>(key) * nkv + g) * d + c;
      dK[off] = __float2bfloat16(p.scale * acc_k[u]);
      dV[off] = __float2bfloat16(acc_v[u]);
    }
  }
}

struct Geometry {
  int64_t S, N, B, NB, nh, nkv, d;
};

// The sizes, and the CUDA checks (dtypes, the device, sizes the kernels index in 32 bits); Context's public ops
// checked the shapes.
Geometry check_args(const char* op, const DFlashAttnArgs& a) {
  check_dev(op, a.q, "q", DType::BF16);
  check_dev(op, a.k_ctx, "k_ctx", DType::BF16);
  check_dev(op, a.v_ctx, "v_ctx", DType::BF16);
  check_dev(op, a.k_blk, "k_blk", DType::BF16);
  check_dev(op, a.v_blk, "v_blk", DType::BF16);
  check_dev(op, a.anchors, "anchors", DType::I32);
  check_dev(op, a.valid, "valid", DType::U8);
  Geometry g{};
  g.B = a.block_size;
  g.N = a.anchors.numel();
  g.NB = g.N * g.B;
  g.S = a.k_ctx.dim(0);
  g.nh = a.q.dim(1);
  g.d = a.q.dim(2);
  g.nkv = a.k_ctx.dim(1);
  DFLASH_CHECK(g.S < (int64_t{1} << 30) && g.NB < (int64_t{1} << 30), op, ": sequence too long");
  return g;
}

}  // namespace

void dflash_backward_init_attributes(int smem_optin) {
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dq<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dq<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dq<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dkv<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dkv<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dkv<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
}

void dflash_attention(Env& e, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse) {
  const char* op = "dflash_attention";
  const Geometry g = check_args(op, a);
  check_dev(op, out, "out", DType::BF16);
  check_dev(op, lse, "lse", DType::F32);
  AttnFwdParams p{};
  p.q = a.q.data;
  p.k1 = a.k_ctx.data;
  p.v1 = a.v_ctx.data;
  p.k2 = a.k_blk.data;
  p.v2 = a.v_blk.data;
  p.out = out.data;
  p.lse = lse.ptr<float>();
  p.Tq = static_cast<int>(g.NB);
  p.nh = static_cast<int>(g.nh);
  p.nkv = static_cast<int>(g.nkv);
  p.d = static_cast<int>(g.d);
  p.T1 = static_cast<int>(g.S);
  p.T2 = static_cast<int>(g.NB);
  p.scale = a.scale;
  p.mode = kAttnDFlash;
  p.anchors = a.anchors.ptr<int>();
  p.valid = a.valid.ptr<uint8_t>();
  p.B = static_cast<int>(g.B);
  p.N = static_cast<int>(g.N);
  p.window = a.window;
  p.err = e.err_flag;
  launch_attention_forward(e, p);
}

void dflash_attention_backward(Env& e, const DFlashAttnArgs& a, const Tensor& out, const Tensor& lse,
                               const Tensor& dout, const Tensor& dq, const Tensor& dk_ctx, const Tensor& dv_ctx,
                               const Tensor& dk_blk, const Tensor& dv_blk) {
  const char* op = "dflash_attention_backward";
  const Geometry g = check_args(op, a);
  check_dev(op, out, "out", DType::BF16);
  check_dev(op, lse, "lse", DType::F32);
  check_dev(op, dout, "dout", DType::BF16);
  check_dev(op, dq, "dq", DType::BF16);
  check_dev(op, dk_ctx, "dk_ctx", DType::BF16);
  check_dev(op, dv_ctx, "dv_ctx", DType::BF16);
  check_dev(op, dk_blk, "dk_blk", DType::BF16);
  check_dev(op, dv_blk, "dv_blk", DType::BF16);
  std::string why;
  DFLASH_CHECK(attention_supported(static_cast<int>(g.d), e.smem_limit, &why), op, " (cuda): ", why);
  const int D = head_dim_bucket(static_cast<int>(g.d));
  const int64_t rows = g.NB * g.nh;
  if (rows == 0) {
    if (dk_ctx.numel()) {
      DFLASH_CUDA_CHECK(cudaMemsetAsync(dk_ctx.data, 0, dk_ctx.nbytes(), e.stream));
      DFLASH_CUDA_CHECK(cudaMemsetAsync(dv_ctx.data, 0, dv_ctx.nbytes(), e.stream));
    }
    return;
  }
  Tensor Dr = e.alloc(DType::F32, {rows});
  DFLASH_LAUNCH(static_cast<unsigned>((rows + 7) / 8), 256, 0, e.stream, k_rowdot)(
      static_cast<const bf16*>(out.data), static_cast<const bf16*>(dout.data), Dr.ptr<float>(), rows,
      static_cast<int>(g.d));
  check_launch("dflash_attention_rowdot");

  AttnBwdParams p{};
  p.q = static_cast<const bf16*>(a.q.data);
  p.k1 = static_cast<const bf16*>(a.k_ctx.data);
  p.v1 = static_cast<const bf16*>(a.v_ctx.data);
  p.k2 = static_cast<const bf16*>(a.k_blk.data);
  p.v2 = static_cast<const bf16*>(a.v_blk.data);
  p.dout = static_cast<const bf16*>(dout.data);
  p.lse = lse.ptr<float>();
  p.Dr = Dr.ptr<float>();
  p.dq = static_cast<bf16*>(dq.data);
  p.dk1 = static_cast<bf16*>(dk_ctx.data);
  p.dv1 = static_cast<bf16*>(dv_ctx.data);
  p.dk2 = static_cast<bf16*>(dk_blk.data);
  p.dv2 = static_cast<bf16*>(dv_blk.data);
  p.Tq = static_cast<int>(g.NB);
  p.nh = static_cast<int>(g.nh);
  p.nkv = static_cast<int>(g.nkv);
  p.d = static_cast<int>(g.d);
  p.T1 = static_cast<int>(g.S);
  p.T2 = static_cast<int>(g.NB);
  p.scale = a.scale;
  p.anchors = a.anchors.ptr<int>();
  p.valid = a.valid.ptr<uint8_t>();
  p.B = static_cast<int>(g.B);
  p.N = static_cast<int>(g.N);
  p.window = a.window;
  if (launch_dflash_backward_tc(e, p)) return;  // tensor cores (attention_tc.cu) where the head dim allows

  // dQ: query-major, the forward's tiling
  const int M = attn_rows_per_cta(D), rep = p.nh / p.nkv;
  int hc = 1;
  for (int c = 1; c <= rep && c <= M; ++c)
    if (rep % c == 0) hc = c;
  p.hc = hc;
  p.mq = M / hc;
  p.nk = choose_dq_nk(D, e.smem_limit);
  const int64_t gy = static_cast<int64_t>(p.nkv) * (rep / hc);
  DFLASH_CHECK(gy <= 65535, op, ": too many heads (", p.nh, ")");
  const dim3 grid_q(static_cast<unsigned>((p.Tq + p.mq - 1) / p.mq), static_cast<unsigned>(gy));
  const size_t smem_q = attn_dq_smem(D, p.nk);
  switch (D) {
    case 64: DFLASH_LAUNCH(grid_q, kAttnThreads, smem_q, e.stream, k_attn_dq<64>)(p); break;
    case 128: DFLASH_LAUNCH(grid_q, kAttnThreads, smem_q, e.stream, k_attn_dq<128>)(p); break;
    default: DFLASH_LAUNCH(grid_q, kAttnThreads, smem_q, e.stream, k_attn_dq<256>)(p); break;
  }
  check_launch("dflash_attention_dq");

  // dK, dV: key-major over the context tiles then the block-key tiles
  p.mc = choose_dkv_mc(D, e.smem_limit);
  const int NK = attn_keys_per_cta(D);
  const int64_t tiles = (g.S + NK - 1) / NK + (g.NB + NK - 1) / NK;
  DFLASH_CHECK(p.nkv <= 65535, op, ": too many kv heads");
  const dim3 grid_kv(static_cast<unsigned>(tiles), static_cast<unsigned>(p.nkv));
  const size_t smem_kv = attn_dkv_smem(D, p.mc);
  switch (D) {
    case 64: DFLASH_LAUNCH(grid_kv, kAttnThreads, smem_kv, e.stream, k_attn_dkv<64>)(p); break;
    case 128: DFLASH_LAUNCH(grid_kv, kAttnThreads, smem_kv, e.stream, k_attn_dkv<128>)(p); break;
    default: DFLASH_LAUNCH(grid_kv, kAttnThreads, smem_kv, e.stream, k_attn_dkv<256>)(p); break;
  }
  check_launch("dflash_attention_dkv");
}

}  // namespace dflash::cuda
