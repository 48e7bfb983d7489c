// tests/ops/candidate_selector.cpp — DFlash2's candidate selector (Context::candidate_selector, docs/spec.md 1.2) on
// the CPU: the pair scores, the strict top-k loss and the statistics against the formula, the gradients into g, the
// two codebooks and the hidden rows against finite differences (fp64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/context.h"
#include "common/test_util.h"

using namespace dflash;
using dflash::test::randn;

namespace {

Tensor f64(std::vector<double> v, Shape s) {
  Tensor t = cpu_empty(DType::F64, std::move(s));
  std::copy(v.begin(), v.end(), t.ptr<double>());
  return t;
}

}  // namespace

namespace {

struct SelectorCase {
  std::unique_ptr<Context> ctx = make_context("cpu64");
  int64_t R = 5, r = 3, V = 9, K = 3, H = 4;
  Tensor g = randn({R, r}, 11, 1.0, DType::F64), P = randn({V, r}, 12, 1.0, DType::F64);
  Tensor S = randn({V, r}, 13, 1.0, DType::F64), lm = randn({V, H}, 14, 1.0, DType::F64);
  // rows 0, 2, 4 scored; predecessors and candidates repeat ids across rows (the codebooks' scatter-adds meet)
  Tensor rows = cpu_tensor_i32({0, 2, 4}, {3}), prev = cpu_tensor_i32({1, 5, 1}, {3});
  Tensor cand = cpu_tensor_i32({2, 5, 7, 5, 2, 8, 0, 2, 3}, {3, 3});
  Tensor U = f64({1.5, 0.25, -1, 2, 1, 0.5, 0, -0.5, 0.75}, {3, 3});
  Tensor labels = cpu_tensor_i32({5, 8, 4}, {3});  // row 2's label 4 is not a candidate
  Tensor weights = cpu_tensor(std::vector<float>{0.5f, 2, 1}, {3});
  SelectorArgs args() {
    SelectorArgs a;
    a.g = g;
    a.rows = rows;
    a.prev = prev;
    a.cand = cand;
    a.cand_logit = U;
    a.pred_cb = P;
    a.succ_cb = S;
    a.labels = labels;
    return a;
  }
  double weighted_loss() {
    Tensor e = cpu_empty(DType::F64, {3, K});
    SelectorStats st = ctx->candidate_selector(args(), e);
    double l = 0;
    for (int m = 0; m < 3; ++m) l += weights.ptr<float>()[m] * st.loss[m];
    return l;
  }
};

}  // namespace

// e = U + <P[prev] * g[row], S[cand]>; the strict top-k cross-entropy where the label is a candidate, 0 elsewhere.
TEST(CandidateSelector, ScoresAndLossAreTheFormula) {
  SelectorCase c;
  Tensor e = cpu_empty(DType::F64, {3, c.K});
  SelectorStats st = c.ctx->candidate_selector(c.args(), e);
  const double* g = c.g.ptr<double>();
  const double* P = c.P.ptr<double>();
  const double* S = c.S.ptr<double>();
  for (int m = 0; m < 3; ++m) {
    const int row = c.rows.ptr<int32_t>()[m], pv = c.prev.ptr<int32_t>()[m];
    std::vector<double> ref(3);
    for (int j = 0; j < 3; ++j) {
      const int cj = c.cand.ptr<int32_t>()[m * 3 + j];
      double s = c.U.ptr<double>()[m * 3 + j];
      for (int q = 0; q < c.r; ++q) s += P[pv * c.r + q] * g[row * c.r + q] * S[cj * c.r + q];
      ref[j] = s;
      EXPECT_NEAR(e.ptr<double>()[m * 3 + j], s, 1e-12 * (1 + std::fabs(s)));
    }
    const int js = m == 0 ? 1 : m == 1 ? 2 : -1;
    EXPECT_EQ(st.covered[m], js >= 0 ? 1 : 0);
    const int am = static_cast<int>(std::max_element(ref.begin(), ref.end()) - ref.begin());
    EXPECT_EQ(st.correct[m], am == js ? 1 : 0);
    if (js < 0) {
      EXPECT_EQ(st.loss[m], 0.0);
      continue;
    }
    double se = 0;
    for (double x : ref) se += std::exp(x);
    EXPECT_NEAR(st.loss[m], std::log(se) - ref[js], 1e-12);
  }
}

// The gradients into g, both codebooks and (through the unary logits U = h lm_head^T at the candidates) h.
TEST(CandidateSelector, GradientsMatchFiniteDifferences) {
  SelectorCase c;
  Tensor dg = c.ctx->zeros(DType::F64, {c.R, c.r}), dP = c.ctx->zeros(DType::F64, {c.V, c.r});
  Tensor dS = c.ctx->zeros(DType::F64, {c.V, c.r}), dh = c.ctx->zeros(DType::F64, {c.R, c.H});
  SelectorArgs a = c.args();
  a.weights = c.weights;
  a.lm_head = c.lm;
  a.dg = dg;
  a.dh = dh;
  a.d_pred_cb = dP;
  a.d_succ_cb = dS;
  Tensor e = cpu_empty(DType::F64, {3, c.K});
  c.ctx->candidate_selector(a, e);
  for (auto [t, grad] : {std::pair{c.g, dg}, std::pair{c.P, dP}, std::pair{c.S, dS}}) {
    bool any = false;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double& x = t.ptr<double>()[i];
      const double x0 = x;
      x = x0 + 1e-5;
      const double lp = c.weighted_loss();
      x = x0 - 1e-5;
      const double lm = c.weighted_loss();
      x = x0;
      const double fd = (lp - lm) / 2e-5;
      any |= std::fabs(fd) > 1e-3;
      EXPECT_NEAR(grad.ptr<double>()[i], fd, 1e-7 * (1 + std::fabs(fd))) << i;
    }
    EXPECT_TRUE(any);
  }
  // dh[row] = sum_j dU[m, j] lm_head[cand_j]: U moves by h's change projected on the candidates' lm_head rows
  for (int m = 0; m < 3; ++m) {
    const int row = c.rows.ptr<int32_t>()[m];
    for (int64_t k = 0; k < c.H; ++k) {
      auto with = [&](double dx) {
        std::vector<double> u0(c.U.ptr<double>(), c.U.ptr<double>() + 9);
        for (int j = 0; j < 3; ++j)
          c.U.ptr<double>()[m * 3 + j] += dx * c.lm.ptr<double>()[c.cand.ptr<int32_t>()[m * 3 + j] * c.H + k];
        const double l = c.weighted_loss();
        std::copy(u0.begin(), u0.end(), c.U.ptr<double>());
        return l;
      };
      const double fd = (with(1e-5) - with(-1e-5)) / 2e-5;
      EXPECT_NEAR(dh.ptr<double>()[row * c.H + k], fd, 1e-7 * (1 + std::fabs(fd))) << "row " << row << " k " << k;
    }
  }
  // rows not scored keep a zero gradient
  for (int64_t q = 0; q < c.r; ++q) EXPECT_EQ(dg.ptr<double>()[1 * c.r + q], 0.0);
}
