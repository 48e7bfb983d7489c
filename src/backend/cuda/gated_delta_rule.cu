// cuda/gated_delta_rule.cu — the gated delta rule of one sequence (backend/context.h GatedDeltaArgs; the CPU
// reference is cpu/gated_delta_rule.cpp) and its dispatch: the chunked tensor-core kernels of gated_delta_chunk.cu for
// prefills (bf16, dk = dv = 128, T >= 64), else this file's recurrent kernel.
//
// Recurrent kernel (decode, verification, small or odd shapes): a block = one warp owns value head h and 32 of its dv
// state columns; the state slice S[:, j0 .. j0 + 31] (dk x 32 fp32) lives in shared memory, lane j its column. Per
// token: the lanes load q and k of the key head (l2-normalised in fp32 with warp sums, q also / sqrt(dk)) into shared
// memory; lane j: S_j *= exp(g); u = beta (v_j - S_j . k); S_j += k u; o_j = S_j . q. The sequence is walked in
// order, so a token costs 3 dk FMAs per column and the block's parallelism is nv dv / 32 warps: fine for the few
// tokens of a decode step or a verify block, far from the tensor cores for a prefill.
#include "backend/cuda/common.cuh"

namespace dflash::cuda {

namespace {

template <class T>
__global__ void k_gdr_recurrent(const T* __restrict__ qkv, const float* __restrict__ g, const float* __restrict__ beta,
                                float* state, T* __restrict__ out, int64_t Tn, int nk, int dk, int nv, int dv) {
  DFLASH_DYN_SMEM(smem);
  float* S = reinterpret_cast<float*>(smem);  // [dk][32]
  float* sq = S + dk * 32;                    // [dk]
  float* sk = sq + dk;                        // [dk]
  const int lane = threadIdx.x & 31, h = blockIdx.x, j = blockIdx.y * 32 + lane, kh = h / (nv / nk);
  const int64_t C = 2 * static_cast<int64_t>(nk) * dk + static_cast<int64_t>(nv) * dv;
  const bool col = j < dv;
  for (int i = 0; i < dk; ++i)
    S[i * 32 + lane] = state && col ? state[(static_cast<int64_t>(h) * dk + i) * dv + j] : 0.f;
  const float scale = 1.f / sqrtf(static_cast<float>(dk));
  for (int64_t t = 0; t < Tn; ++t) {
    const T* row = qkv + t * C;
    float qq = 0.f, kk = 0.f;
    for (int i = lane; i < dk; i += 32) {
      const float qv = to_f(row[kh * dk + i]), kv = to_f(row[nk * dk + kh * dk + i]);
      sq[i] = qv;
      sk[i] = kv;
      qq += qv * qv;
      kk += kv * kv;
    }
    qq = warp_sum(qq);
    kk = warp_sum(kk);
    const float qn = scale / sqrtf(qq + 1e-6f), kn = 1.f / sqrtf(kk + 1e-6f);
    __syncwarp();
    const float decay = expf(g[t * nv + h]), b = beta[t * nv + h];
    if (col) {
      const float v = to_f(row[2 * static_cast<int64_t>(nk) * dk + static_cast<int64_t>(h) * dv + j]);
      float mem = 0.f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[i * 32 + lane] * decay;
        S[i * 32 + lane] = s;
        mem += s * sk[i];
      }
      const float u = (v - mem * kn) * b;
      float o = 0.f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[i * 32 + lane] + sk[i] * kn * u;
        S[i * 32 + lane] = s;
        o += s * sq[i];
      }
      out[(t * nv + h) * dv + j] = from_f<T>(o * qn);
    }
    __syncwarp();
  }
  if (state && col)
    for (int i = 0; i < dk; ++i) state[(static_cast<int64_t>(h) * dk + i) * dv + j] = S[i * 32 + lane];
}

}  // namespace

void gated_delta_rule(Env& e, const GatedDeltaArgs& a, const Tensor& out, int64_t T) {
  if (T == 0) return;
  if (gated_delta_chunk_applies(e, a, T)) {
    gated_delta_chunk(e, a, out, T);
    return;
  }
  if (!a.seqs.empty()) {  // several sequences: one recurrent launch each, from zeros
    for (size_t i = 0; i + 1 < a.seqs.size(); ++i) {
      const int64_t b = a.seqs[i], n = a.seqs[i + 1] - b;
      if (n == 0) continue;
      GatedDeltaArgs s{a.qkv.slice(b, b + n), a.g.slice(b, b + n), a.beta.slice(b, b + n), Tensor{}, a.nk, a.dk,
                       a.nv, a.dv, {}};
      gated_delta_rule(e, s, out.slice(b, b + n), n);
    }
    return;
  }
  const int nk = static_cast<int>(a.nk), dk = static_cast<int>(a.dk), nv = static_cast<int>(a.nv),
            dv = static_cast<int>(a.dv);
  const size_t smem = static_cast<size_t>(dk * 32 + 2 * dk) * sizeof(float);
  DFLASH_CHECK(smem <= 48 * 1024, "gated_delta_rule (cuda): key head dim ", dk, " above 256");
  const dim3 grid(static_cast<unsigned>(nv), static_cast<unsigned>((dv + 31) / 32));
  float* st = a.state.defined() ? a.state.ptr<float>() : nullptr;
  if (a.qkv.dtype == DType::BF16) {
    DFLASH_LAUNCH(grid, 32, smem, e.stream, k_gdr_recurrent<bf16>)
    (static_cast<bf16*>(a.qkv.data), a.g.ptr<float>(), a.beta.ptr<float>(), st, static_cast<bf16*>(out.data), T, nk, dk,
     nv, dv);
  } else {
    DFLASH_LAUNCH(grid, 32, smem, e.stream, k_gdr_recurrent<float>)
    (a.qkv.ptr<float>(), a.g.ptr<float>(), a.beta.ptr<float>(), st, out.ptr<float>(), T, nk, dk, nv, dv);
  }
  check_launch("gated_delta_rule");
}

}  // namespace dflash::cuda
