// cpu/candidate_selector.cpp — DFlash2's candidate selector (backend/context.h SelectorArgs): the pair scores
// e[m, j] = U[m, j] + sum_q P[prev, q] g[row, q] S[cand_j, q], the strict top-k cross-entropy of the label among the
// candidates, and its gradients into g, the two codebooks and (through the unary logits) the hidden rows. Sums in
// the element type T (fp32 on "cpu", fp64 on "cpu64").
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace dflash::cpu {

SelectorStats candidate_selector(ThreadPool& tp, const SelectorArgs& a, const Tensor& scores, const SelectorDims& d) {
  SelectorStats st;
  dispatch_float("candidate_selector", a.g.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t M = d.M, K = d.K, r = d.r, V = d.V, R = d.R;
    const int32_t* rows = a.rows.ptr<int32_t>();
    const int32_t* prev = a.prev.ptr<int32_t>();
    const int32_t* cand = a.cand.ptr<int32_t>();
    const T* U = a.cand_logit.ptr<T>();
    const T* g = a.g.ptr<T>();
    const T* P = a.pred_cb.ptr<T>();
    const T* S = a.succ_cb.ptr<T>();
    for (int64_t m = 0; m < M; ++m) {
      DFLASH_CHECK(rows[m] >= 0 && rows[m] < R, "candidate_selector: row ", rows[m], " outside [0, ", R, ")");
      DFLASH_CHECK(prev[m] >= 0 && prev[m] < V, "candidate_selector: predecessor ", prev[m], " outside [0, ", V, ")");
      for (int64_t j = 0; j < K; ++j)
        DFLASH_CHECK(cand[m * K + j] >= 0 && cand[m * K + j] < V, "candidate_selector: candidate ", cand[m * K + j],
                     " outside [0, ", V, ")");
    }
    T* e = scores.ptr<T>();
    tp.parallel_for(M, 8, [&](int64_t b, int64_t en) {
      std::vector<T> pg(static_cast<size_t>(r));
      for (int64_t m = b; m < en; ++m) {
        const T* gp = g + rows[m] * r;
        const T* pp = P + static_cast<int64_t>(prev[m]) * r;
        for (int64_t q = 0; q < r; ++q) pg[q] = pp[q] * gp[q];
        for (int64_t j = 0; j < K; ++j) {
          const T* sp = S + static_cast<int64_t>(cand[m * K + j]) * r;
          T acc = 0;
          for (int64_t q = 0; q < r; ++q) acc += pg[q] * sp[q];
          e[m * K + j] = U[m * K + j] + acc;
        }
      }
    });
    if (!a.labels.defined()) return;
    const int32_t* lab = a.labels.ptr<int32_t>();
    st.loss.assign(static_cast<size_t>(M), 0.0);
    st.covered.assign(static_cast<size_t>(M), 0);
    st.correct.assign(static_cast<size_t>(M), 0);
    std::vector<T> de(static_cast<size_t>(M * K), T(0));
    const bool grad = a.dg.defined();
    for (int64_t m = 0; m < M; ++m) {
      const T* em = e + m * K;
      int64_t am = 0, js = -1;
      for (int64_t j = 0; j < K; ++j) {
        if (em[j] > em[am]) am = j;
        if (js < 0 && cand[m * K + j] == lab[m]) js = j;
      }
      st.correct[m] = cand[m * K + am] == lab[m];
      if (js < 0) continue;
      st.covered[m] = 1;
      double se = 0;
      for (int64_t j = 0; j < K; ++j) se += std::exp(static_cast<double>(em[j]) - static_cast<double>(em[am]));
      st.loss[m] = static_cast<double>(em[am]) + std::log(se) - em[js];
      if (!grad) continue;
      const double w = a.weights.ptr<float>()[m];
      for (int64_t j = 0; j < K; ++j)
        de[m * K + j] = static_cast<T>(w * (std::exp(static_cast<double>(em[j]) - static_cast<double>(em[am])) / se - (j == js ? 1.0 : 0.0)));
    }
    if (!grad) return;
    T* dg = a.dg.ptr<T>();
    T* dP = a.d_pred_cb.ptr<T>();
    T* dS = a.d_succ_cb.ptr<T>();
    T* dh = a.dh.ptr<T>();
    const T* W = a.lm_head.ptr<T>();
    const int64_t H = a.lm_head.dim(1);
    // sequential over rows: the codebook gradients scatter into shared rows
    std::vector<T> sd(static_cast<size_t>(r));
    for (int64_t m = 0; m < M; ++m) {
      const T* dem = de.data() + m * K;
      bool any = false;
      for (int64_t j = 0; j < K; ++j) any |= dem[j] != T(0);
      if (!any) continue;
      const T* gp = g + rows[m] * r;
      const T* pp = P + static_cast<int64_t>(prev[m]) * r;
      std::fill(sd.begin(), sd.end(), T(0));  // sum_j de_j S[cand_j]
      for (int64_t j = 0; j < K; ++j) {
        const int64_t cj = cand[m * K + j];
        const T* sp = S + cj * r;
        T* dsp = dS + cj * r;
        for (int64_t q = 0; q < r; ++q) {
          sd[q] += dem[j] * sp[q];
          dsp[q] += dem[j] * pp[q] * gp[q];
        }
        const T* wr = W + cj * H;
        T* dhr = dh + rows[m] * H;
        for (int64_t c = 0; c < H; ++c) dhr[c] += dem[j] * wr[c];
      }
      T* dgp = dg + rows[m] * r;
      T* dpp = dP + static_cast<int64_t>(prev[m]) * r;
      for (int64_t q = 0; q < r; ++q) {
        dgp[q] += sd[q] * pp[q];
        dpp[q] += sd[q] * gp[q];
      }
    }
  });
  return st;
}

}  // namespace dflash::cpu
