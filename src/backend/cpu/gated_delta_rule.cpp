// cpu/gated_delta_rule.cpp — the Gated DeltaNet's gates and its recurrence (backend/context.h gdn_gate,
// gated_delta_rule): the reference the CUDA chunked kernel is tested against. The recurrence runs token by token
// exactly as transformers' torch_recurrent_gated_delta_rule (use_qk_l2norm_in_kernel=True), in the element type
// (fp32 on "cpu", fp64 on "cpu64"); value heads run in parallel.
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

void gdn_gate(ThreadPool& tp, const Tensor& ba, const Tensor& A_log, const Tensor& dt_bias, const Tensor& g,
              const Tensor& beta, int64_t Tn) {
  dispatch_float("gdn_gate", ba.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t nv = ba.shape[1] / 2;
    const T* p = ba.ptr<T>();
    const T* al = A_log.ptr<T>();
    const T* dt = dt_bias.ptr<T>();
    T* gp = g.ptr<T>();
    T* bp = beta.ptr<T>();
    tp.parallel_for(Tn, 64, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        for (int64_t h = 0; h < nv; ++h) {
          const T bv = p[t * 2 * nv + h], av = p[t * 2 * nv + nv + h] + dt[h];
          const T sp = av > T(20) ? av : std::log1p(std::exp(av));  // torch softplus (beta 1, threshold 20)
          gp[t * nv + h] = -std::exp(al[h]) * sp;
          bp[t * nv + h] = T(1) / (T(1) + std::exp(-bv));
        }
    });
  });
}

namespace {
void one_sequence(ThreadPool& tp, const GatedDeltaArgs& a, const Tensor& out, int64_t Tn);
}  // namespace

void gated_delta_rule(ThreadPool& tp, const GatedDeltaArgs& a, const Tensor& out, int64_t Tn) {
  if (a.seqs.empty()) {
    one_sequence(tp, a, out, Tn);
    return;
  }
  for (size_t i = 0; i + 1 < a.seqs.size(); ++i) {  // independent sequences, each from zeros
    const int64_t b = a.seqs[i], e = a.seqs[i + 1];
    if (e == b) continue;
    GatedDeltaArgs s{a.qkv.slice(b, e), a.g.slice(b, e), a.beta.slice(b, e), Tensor{}, a.nk, a.dk, a.nv, a.dv, {}};
    one_sequence(tp, s, out.slice(b, e), e - b);
  }
}

namespace {
void one_sequence(ThreadPool& tp, const GatedDeltaArgs& a, const Tensor& out, int64_t Tn) {
  dispatch_float("gated_delta_rule", a.qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t nk = a.nk, dk = a.dk, nv = a.nv, dv = a.dv, rep = nv / nk, C = 2 * nk * dk + nv * dv;
    const T* qkv = a.qkv.ptr<T>();
    const T* gp = a.g.ptr<T>();
    const T* bp = a.beta.ptr<T>();
    T* st = a.state.defined() ? a.state.ptr<T>() : nullptr;
    T* op = out.ptr<T>();
    const T scale = T(1) / std::sqrt(static_cast<T>(dk));
    tp.parallel_for(nv, 1, [&](int64_t h0, int64_t h1) {
      std::vector<T> S(static_cast<size_t>(dk * dv)), q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk));
      std::vector<T> u(static_cast<size_t>(dv));
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t kh = h / rep;  // repeat_interleave: value head h reads key head h / rep
        if (st) {
          std::copy(st + h * dk * dv, st + (h + 1) * dk * dv, S.begin());
        } else {
          std::fill(S.begin(), S.end(), T(0));
        }
        for (int64_t t = 0; t < Tn; ++t) {
          const T* row = qkv + t * C;
          const T* qr = row + kh * dk;
          const T* kr = row + nk * dk + kh * dk;
          const T* vr = row + 2 * nk * dk + h * dv;
          T qq = 0, kk = 0;
          for (int64_t i = 0; i < dk; ++i) {
            qq += qr[i] * qr[i];
            kk += kr[i] * kr[i];
          }
          const T qn = T(1) / std::sqrt(qq + T(1e-6)) * scale, kn = T(1) / std::sqrt(kk + T(1e-6));
          for (int64_t i = 0; i < dk; ++i) {
            q[i] = qr[i] * qn;
            k[i] = kr[i] * kn;
          }
          const T decay = std::exp(gp[t * nv + h]), b = bp[t * nv + h];
          // S = decay S; u = beta (v - S^T k); S += k u^T; o = S^T q
          for (T& s : S) s *= decay;
          for (int64_t j = 0; j < dv; ++j) {
            T mem = 0;
            for (int64_t i = 0; i < dk; ++i) mem += S[i * dv + j] * k[i];
            u[j] = (vr[j] - mem) * b;
          }
          for (int64_t i = 0; i < dk; ++i)
            for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[i] * u[j];
          T* o = op + (t * nv + h) * dv;
          for (int64_t j = 0; j < dv; ++j) {
            T acc = 0;
            for (int64_t i = 0; i < dk; ++i) acc += S[i * dv + j] * q[i];
            o[j] = acc;
          }
        }
        if (st) std::copy(S.begin(), S.end(), st + h * dk * dv);
      }
    });
  });
}
}  // namespace

}  // namespace dflash::cpu
