// tests/ops/gated_delta_rule.cpp — the Gated DeltaNet ops on the CPU: gdn_gate (beta and the decay g, softplus as
// torch) and gated_delta_rule against the matrix form written out (value heads grouped over key heads), run in pieces
// with the state carried and as several sequences in one call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/context.h"
#include "core/error.h"
#include "common/test_util.h"

using namespace dflash;
using test::to_f64;

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The gated delta rule written out with explicit matrices (one value head h over its key head h / (nv / nk)).
std::vector<double> delta_rule_reference(const Tensor& qkv, const Tensor& g, const Tensor& beta, int64_t nk,
                                         int64_t dk, int64_t nv, int64_t dv, std::vector<double>* state) {
  const int64_t T = qkv.shape[0], C = qkv.shape[1];
  std::vector<double> out(static_cast<size_t>(T * nv * dv));
  for (int64_t h = 0; h < nv; ++h) {
    const int64_t kh = h / (nv / nk);
    std::vector<double> S(static_cast<size_t>(dk * dv), 0.0);
    if (state) std::copy(state->begin() + h * dk * dv, state->begin() + (h + 1) * dk * dv, S.begin());
    for (int64_t t = 0; t < T; ++t) {
      const double* r = qkv.ptr<double>() + t * C;
      std::vector<double> q(r + kh * dk, r + (kh + 1) * dk), k(r + nk * dk + kh * dk, r + nk * dk + (kh + 1) * dk);
      const double* v = r + 2 * nk * dk + h * dv;
      double nq = 0, nkk = 0;
      for (int64_t i = 0; i < dk; ++i) nq += q[i] * q[i], nkk += k[i] * k[i];
      for (int64_t i = 0; i < dk; ++i) {
        q[i] /= std::sqrt(nq + 1e-6) * std::sqrt(double(dk));
        k[i] /= std::sqrt(nkk + 1e-6);
      }
      const double a = std::exp(g.ptr<double>()[t * nv + h]), b = beta.ptr<double>()[t * nv + h];
      // S_t = a (I - b k k^T) S_{t-1} + b k v^T   (the same update, as a matrix product)
      std::vector<double> kS(static_cast<size_t>(dv), 0.0);
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) kS[j] += k[i] * S[i * dv + j];
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] = a * (S[i * dv + j] - b * k[i] * kS[j]) + b * k[i] * v[j];
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * q[i];
        out[(t * nv + h) * dv + j] = o;
      }
    }
    if (state) std::copy(S.begin(), S.end(), state->begin() + h * dk * dv);
  }
  return out;
}

}  // namespace

// beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), softplus passing x > 20 through (torch).
TEST(HybridOps, GdnGates) {
  auto ctx = make_context("cpu64");
  const std::vector<double> ba = {0.5, -1.0, 2.0, 25.0};  // one token, nv = 2: b = (0.5, -1), a = (2, 25)
  Tensor t = cpu_empty(DType::F64, {1, 4});
  std::copy(ba.begin(), ba.end(), t.ptr<double>());
  Tensor al = cpu_empty(DType::F64, {2}), dt = cpu_empty(DType::F64, {2});
  al.ptr<double>()[0] = std::log(3.0);
  al.ptr<double>()[1] = std::log(0.5);
  dt.ptr<double>()[0] = 0.25;
  dt.ptr<double>()[1] = -1.0;
  Tensor g = cpu_empty(DType::F64, {1, 2}), beta = cpu_empty(DType::F64, {1, 2});
  ctx->gdn_gate(t, al, dt, g, beta);
  EXPECT_NEAR(beta.ptr<double>()[0], sigmoid(0.5), 1e-15);
  EXPECT_NEAR(beta.ptr<double>()[1], sigmoid(-1.0), 1e-15);
  EXPECT_NEAR(g.ptr<double>()[0], -3.0 * std::log1p(std::exp(2.25)), 1e-14);
  EXPECT_NEAR(g.ptr<double>()[1], -0.5 * 24.0, 1e-14);  // 25 - 1 = 24 > 20: softplus is the identity
}

// The op against the matrix form S_t = a (I - b k k^T) S_{t-1} + b k v^T, o_t = S_t^T q_t (value heads grouped over
// key heads); and run in pieces with the state carried, the same outputs and final state.
TEST(HybridOps, GatedDeltaRuleMatchesTheMatrixFormAndRunsInPieces) {
  auto ctx = make_context("cpu64");
  const int64_t T = 9, nk = 2, dk = 4, nv = 4, dv = 3, C = 2 * nk * dk + nv * dv;
  const Tensor qkv = test::randn({T, C}, 5, 1.0, DType::F64);
  Tensor g = test::randn({T, nv}, 6, 0.5, DType::F64), beta = test::randn({T, nv}, 7, 1.0, DType::F64);
  for (int64_t i = 0; i < T * nv; ++i) {
    g.ptr<double>()[i] = -std::fabs(g.ptr<double>()[i]);
    beta.ptr<double>()[i] = sigmoid(beta.ptr<double>()[i]);
  }
  Tensor out = cpu_empty(DType::F64, {T, nv, dv});
  ctx->gated_delta_rule({qkv, g, beta, Tensor{}, nk, dk, nv, dv, {}}, out);
  const std::vector<double> want = delta_rule_reference(qkv, g, beta, nk, dk, nv, dv, nullptr);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out.ptr<double>()[i], want[i], 1e-13) << i;
  // pieces 0..3, 3..4, 4..9 from a non-zero start state
  Tensor st = test::randn({nv, dk, dv}, 8, 0.3, DType::F64);
  std::vector<double> ref_state = to_f64(st);
  const std::vector<double> want2 = delta_rule_reference(qkv, g, beta, nk, dk, nv, dv, &ref_state);
  Tensor out2 = cpu_empty(DType::F64, {T, nv, dv});
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 4}, {4, 9}})
    ctx->gated_delta_rule({qkv.slice(b, e), g.slice(b, e), beta.slice(b, e), st, nk, dk, nv, dv, {}},
                          out2.slice(b, e));
  for (size_t i = 0; i < want2.size(); ++i) EXPECT_NEAR(out2.ptr<double>()[i], want2[i], 1e-13) << i;
  const std::vector<double> got_state = to_f64(st);
  for (size_t i = 0; i < ref_state.size(); ++i) EXPECT_NEAR(got_state[i], ref_state[i], 1e-13) << i;
  EXPECT_THROW(ctx->gated_delta_rule({qkv, g, beta, Tensor{}, 3, dk, nv, dv, {}}, out), Error);  // nv % nk != 0
  // several sequences in one call (seqs): each from zeros, as three calls would run them
  Tensor out3 = cpu_empty(DType::F64, {T, nv, dv});
  ctx->gated_delta_rule({qkv, g, beta, Tensor{}, nk, dk, nv, dv, {0, 4, 4, 9}}, out3);
  Tensor out4 = cpu_empty(DType::F64, {T, nv, dv});
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 9}})
    ctx->gated_delta_rule({qkv.slice(b, e), g.slice(b, e), beta.slice(b, e), Tensor{}, nk, dk, nv, dv, {}},
                          out4.slice(b, e));
  EXPECT_EQ(to_f64(out3), to_f64(out4));
  EXPECT_THROW(ctx->gated_delta_rule({qkv, g, beta, st, nk, dk, nv, dv, {0, 4, 9}}, out3), Error);  // no state
  EXPECT_THROW(ctx->gated_delta_rule({qkv, g, beta, Tensor{}, nk, dk, nv, dv, {0, 4, 8}}, out3), Error);  // != T
}
