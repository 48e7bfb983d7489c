// cuda/attention_fwd.cu — the forward attention kernel shared by attention_causal and dflash_attention (see
// attention.h for the two-segment visibility rule), the shared-memory sizing of every attention kernel and the
// tile-configuration choice (case C07: a configuration is chosen from the queried shared-memory limit).
//
// One CTA = kAttnThreads threads = M query rows (mq queries x hc heads of one kv head), M = 4096 / D.
// FlashAttention-2 forward (Dao 2023, Algorithm 1) with fp32 scores and accumulators:
//   for each key tile (nk keys of the CTA's segment range, staged in shared memory as BF16):
//     S = Q K^T * scale (masked to -inf where a row may not see the key)
//     m_new = max(m, rowmax S);  P = exp(S - m_new);  l = l e^{m - m_new} + rowsum P;  O = O e^{m - m_new} + P V
//   out = O / l, lse = m + log l;  l = 0 (a row that saw nothing) -> out = 0, lse = -inf (never NaN: the running
//   max is replaced by 0 while it is still -inf, so no -inf - -inf is formed).
// Thread t owns the output elements (r, c) with r * D + c = t + 128 u, u < 32 (for D = 128: column t of every row).
#include <algorithm>
#include <climits>

#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }

// A row's softmax denominator with the sink of head h (natural-log domain: m the row's running maximum; a row that
// saw no key keeps l = 0).
__device__ __forceinline__ float sink_l(const AttnFwdParams& p, float l, float m, int h) {
  return p.sinks != nullptr && l > 0.f ? l + expf(p.sinks[h] - m) : l;
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads) k_attn_fwd(AttnFwdParams p) {
  constexpr int M = 4096 / D;
  constexpr int NT = kAttnThreads;
  constexpr int ACC = M * D / NT;
  constexpr int LD = D + 2;  // bf16 row stride in shared memory: an odd number of 32-bit words (no bank conflicts)
  DFLASH_DYN_SMEM(smem);
  const int nk = p.nk, ldS = nk + 1;
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + M * LD;
  bf16* sV = sK + nk * LD;
  float* sS = reinterpret_cast<float*>(smem + align16(static_cast<size_t>(M + 2 * nk) * LD * sizeof(bf16)));
  float* sM = sS + M * ldS;  // running max per row
  float* sL = sM + M;        // running sum per row
  float* sA = sL + M;        // rescale factor of the current tile per row
  int* sHi1 = reinterpret_cast<int*>(sA + M);
  int* sLo2 = sHi1 + M;
  int* sHi2 = sLo2 + M;
  int* sLo1 = sHi2 + M;
  int* sExt = sLo1 + M;  // [0] = max hi1, [1] = min lo2, [2] = max hi2, [3] = min lo1 over the CTA's rows

  const int tid = threadIdx.x;
  const int d = p.d, nh = p.nh, nkv = p.nkv, mq = p.mq, hc = p.hc;
  const int rep = nh / nkv, splits = rep / hc;
  const int g = blockIdx.y / splits;
  const int h0 = g * rep + (blockIdx.y % splits) * hc;
  const int q0 = blockIdx.x * mq;
  const bf16* Q = static_cast<const bf16*>(p.q);
  const bf16 zero = __float2bfloat16(0.f);

  // per-row visibility (row r = query q0 + r % mq, head h0 + r / mq)
  for (int r = tid; r < M; r += NT) {
    int lo1 = 0, hi1 = 0, lo2 = 0, hi2 = 0;
    const int hh = r / mq, qi = q0 + r % mq;
    if (hh < hc && qi < p.Tq) {
      attn_row_bounds(p.mode, qi, p.q_offset, p.T1, p.B, p.window, p.anchors, p.valid, p.err, lo1, hi1, lo2, hi2);
    }
    sLo1[r] = lo1;
    sHi1[r] = hi1;
    sLo2[r] = lo2;
    sHi2[r] = hi2;
    sM[r] = -INFINITY;
    sL[r] = 0.f;
  }
  for (int idx = tid; idx < M * D; idx += NT) {
    const int r = idx / D, c = idx % D;
    const int hh = r / mq, qi = q0 + r % mq;
    bf16 v = zero;
    if (c < d && hh < hc && qi < p.Tq) v = Q[(static_cast<int64_t>(qi) * nh + h0 + hh) * d + c];
    sQ[r * LD + c] = v;
  }
  __syncthreads();
  if (tid == 0) {
    int e1 = 0, l1 = INT_MAX, lo = INT_MAX, hi = 0;
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
  const int lane = tid & 31, warp = tid >> 5;

  for (int seg = 0; seg < 2; ++seg) {
    const int klo = seg == 0 ? ext_lo1 : ext_lo2, khi = seg == 0 ? ext1 : ext_hi2;
    const bf16* Kp = static_cast<const bf16*>(seg == 0 ? p.k1 : p.k2);
    const bf16* Vp = static_cast<const bf16*>(seg == 0 ? p.v1 : p.v2);
    for (int kt = klo; kt < khi; kt += nk) {
      __syncthreads();  // the previous tile's sK / sV / sS are no longer read
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
        float s = -INFINITY;
        if (vis) {
          const bf16* qr = sQ + r * LD;
          const bf16* kr = sK + kk * LD;
          float dot = 0.f;
          for (int c = 0; c < d; ++c) dot += to_f(qr[c]) * to_f(kr[c]);
          s = dot * p.scale;
        }
        sS[r * ldS + kk] = s;
      }
      __syncthreads();
      for (int r = warp; r < M; r += NT / 32) {  // online softmax, one warp per row
        float* srow = sS + r * ldS;
        float tmax = -INFINITY;
        for (int kk = lane; kk < nk; kk += 32) tmax = fmaxf(tmax, srow[kk]);
        tmax = warp_max(tmax);
        const float m_old = sM[r];
        const float m_new = fmaxf(m_old, tmax);
        const float mref = m_new == -INFINITY ? 0.f : m_new;
        float psum = 0.f;
        for (int kk = lane; kk < nk; kk += 32) {
          const float pv = expf(srow[kk] - mref);
          srow[kk] = pv;
          psum += pv;
        }
        psum = warp_sum(psum);
        if (lane == 0) {
          const float alpha = expf(m_old - mref);
          sA[r] = alpha;
          sL[r] = sL[r] * alpha + psum;
          sM[r] = m_new;
        }
      }
      __syncthreads();
      DFLASH_UNROLL
      for (int u = 0; u < ACC; ++u) {
        const int idx = tid + NT * u, r = idx / D, c = idx % D;
        const float* prow = sS + r * ldS;
        float a = acc[u] * sA[r];
        for (int kk = 0; kk < nk; ++kk) a += prow[kk] * to_f(sV[kk * LD + c]);
        acc[u] = a;
      }
    }
  }
  __syncthreads();
  bf16* O = static_cast<bf16*>(p.out);
  DFLASH_UNROLL
  for (int u = 0; u < ACC; ++u) {
    const int idx = tid + NT * u, r = idx / D, c = idx % D;
    const int hh = r / mq, qi = q0 + r % mq;
    if (c < d && hh < hc && qi < p.Tq) {
      const float l = sink_l(p, sL[r], sM[r], h0 + hh);
      O[(static_cast<int64_t>(qi) * nh + h0 + hh) * d + c] = __float2bfloat16(l > 0.f ? acc[u] / l : 0.f);
    }
  }
  if (p.lse != nullptr) {
    for (int r = tid; r < M; r += NT) {
      const int hh = r / mq, qi = q0 + r % mq;
      if (hh < hc && qi < p.Tq) {
        const float l = sink_l(p, sL[r], sM[r], h0 + hh);
        p.lse[static_cast<int64_t>(qi) * nh + h0 + hh] = l > 0.f ? sM[r] + logf(l) : -INFINITY;
      }
    }
  }
}

}  // namespace

size_t attn_fwd_smem(int D, int nk) {
  const size_t M = static_cast<size_t>(attn_rows_per_cta(D)), LD = static_cast<size_t>(D + 2);
  return align16((M + 2 * nk) * LD * sizeof(uint16_t)) + (M * (nk + 1) + 3 * M) * sizeof(float) +
         (4 * M + 4) * sizeof(int);
}
size_t attn_dq_smem(int D, int nk) {
  const size_t M = static_cast<size_t>(attn_rows_per_cta(D)), LD = static_cast<size_t>(D + 2);
  return align16((2 * M + 2 * nk) * LD * sizeof(uint16_t)) + (M * (nk + 1) + 2 * M) * sizeof(float) +
         (4 * M + 4) * sizeof(int);
}
size_t attn_dkv_smem(int D, int mc) {
  const size_t NK = static_cast<size_t>(attn_keys_per_cta(D)), LD = static_cast<size_t>(D + 2);
  return align16((2 * NK + 2 * mc) * LD * sizeof(uint16_t)) + (2 * mc * (NK + 1) + 2 * mc) * sizeof(float);
}
int choose_fwd_nk(int D, int smem_limit) {
  for (int nk : {64, 32, 16})
    if (attn_fwd_smem(D, nk) <= static_cast<size_t>(smem_limit)) return nk;
  return 0;
}
int choose_dq_nk(int D, int smem_limit) {
  for (int nk : {64, 32, 16})
    if (attn_dq_smem(D, nk) <= static_cast<size_t>(smem_limit)) return nk;
  return 0;
}
int choose_dkv_mc(int D, int smem_limit) {
  for (int mc : {64, 32, 16, 8})
    if (attn_dkv_smem(D, mc) <= static_cast<size_t>(smem_limit)) return mc;
  return 0;
}

bool attention_supported(int d, int smem_limit, std::string* why) {
  const int D = head_dim_bucket(d);
  if (d <= 0 || D == 0) {
    if (why) *why = cat("head_dim ", d, " is not supported by the CUDA attention kernels (1 <= head_dim <= ", kMaxHeadDim, ")");
    return false;
  }
  if (!choose_fwd_nk(D, smem_limit) || !choose_dq_nk(D, smem_limit) || !choose_dkv_mc(D, smem_limit)) {
    if (why)
      *why = cat("head_dim ", d, " needs at least ", std::max({attn_fwd_smem(D, 16), attn_dq_smem(D, 16), attn_dkv_smem(D, 8)}),
                 " bytes of shared memory per block, the device allows ", smem_limit);
    return false;
  }
  return true;
}

std::string attention_config(int d, int smem_limit) {
  std::string why;
  if (!attention_supported(d, smem_limit, &why)) return why;
  const int D = head_dim_bucket(d);
  const int nk = choose_fwd_nk(D, smem_limit), nkq = choose_dq_nk(D, smem_limit), mc = choose_dkv_mc(D, smem_limit);
  return cat("D", D, " fwd M", attn_rows_per_cta(D), " nk", nk, " (", attn_fwd_smem(D, nk), " B) dq nk", nkq, " (",
             attn_dq_smem(D, nkq), " B) dkv keys", attn_keys_per_cta(D), " mc", mc, " (", attn_dkv_smem(D, mc),
             " B) limit ", smem_limit);
}

void attention_init_attributes(int smem_optin, KernelTier tier) {
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_fwd<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_fwd<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(k_attn_fwd<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
  dflash_backward_init_attributes(smem_optin);
  attention_tc_init_attributes(smem_optin);
  if (tier == KernelTier::Hopper) attention_wgmma_init_attributes(smem_optin);
}

void launch_attention_forward(Env& e, AttnFwdParams p) {
  if (p.Tq == 0 || p.nh == 0) return;
  // Hopper warpgroup MMA (attention_wgmma.cu): head dim 128, and 256 for causal attention (the hybrid targets)
  if (launch_attention_forward_wgmma(e, p)) return;
  // mma.sync tensor cores (attention_tc.cu), every mode (causal, DFlash, windows, sinks; one sequence per launch):
  // head dims 64, 128 and 256 where the wgmma forward does not run (a causal window, DFlash at 256, a lower
  // shared-memory limit, the emulator, DFLASH_ATTN_WGMMA=0; at 256 32-key tiles). The kernel below takes other head
  // dims and smaller caps.
  if (launch_attention_forward_tc(e, p)) return;
  std::string why;
  DFLASH_CHECK(attention_supported(p.d, e.smem_limit, &why), "attention (cuda): ", why);
  const int D = head_dim_bucket(p.d), M = attn_rows_per_cta(D), rep = p.nh / p.nkv;
  int hc = 1;
  for (int c = 1; c <= rep && c <= M; ++c)
    if (rep % c == 0) hc = c;
  p.hc = hc;
  p.mq = M / hc;
  p.nk = choose_fwd_nk(D, e.smem_limit);
  const size_t smem = attn_fwd_smem(D, p.nk);
  const int64_t gy = static_cast<int64_t>(p.nkv) * (rep / hc);
  DFLASH_CHECK(gy <= 65535, "attention (cuda): too many heads (", p.nh, ")");
  const dim3 grid(static_cast<unsigned>((p.Tq + p.mq - 1) / p.mq), static_cast<unsigned>(gy));
  switch (D) {
    case 64: DFLASH_LAUNCH(grid, kAttnThreads, smem, e.stream, k_attn_fwd<64>)(p); break;
    case 128: DFLASH_LAUNCH(grid, kAttnThreads, smem, e.stream, k_attn_fwd<128>)(p); break;
    default: DFLASH_LAUNCH(grid, kAttnThreads, smem, e.stream, k_attn_fwd<256>)(p); break;
  }
  check_launch("attention_forward");
}

}  // namespace dflash::cuda
