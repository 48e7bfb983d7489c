// tests/ops/conv1d_causal.cpp — Context::conv1d_causal (the linear-attention layers' short convolution) on the CPU:
// the window written out, the same rows run in pieces with the state carried, several sequences in one call, and
// refusals that name the op and the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backend/context.h"
#include "core/error.h"
#include "common/test_util.h"

using namespace dflash;
using test::to_f64;

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

// y[t, c] = silu(sum_j w[c, j] x[t + j - 3, c]) with zeros before the start; the same sequence in pieces of 2, 1 and
// 4 rows with the state carried between them gives the same rows, and the state ends as the last 3 inputs.
TEST(HybridOps, CausalConvWithItsWindow) {
  auto ctx = make_context("cpu64");
  const int64_t T = 7, C = 5, K = 4;
  const Tensor x = test::randn({T, C}, 1, 1.0, DType::F64), w = test::randn({C, K}, 2, 0.5, DType::F64);
  Tensor y = cpu_empty(DType::F64, {T, C});
  ctx->conv1d_causal(x, w, Tensor{}, y);
  const double* X = x.ptr<double>();
  const double* W = w.ptr<double>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = t + j - (K - 1);
        if (s >= 0) acc += W[c * K + j] * X[s * C + c];
      }
      EXPECT_NEAR(y.ptr<double>()[t * C + c], acc * sigmoid(acc), 1e-14) << t << "," << c;
    }
  Tensor state = cpu_zeros(DType::F64, {K - 1, C}), yp = cpu_empty(DType::F64, {T, C});
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 3}, {3, 7}})
    ctx->conv1d_causal(x.slice(b, e), w, state, yp.slice(b, e));
  EXPECT_EQ(to_f64(yp), to_f64(y));
  for (int64_t i = 0; i < (K - 1) * C; ++i) EXPECT_EQ(state.ptr<double>()[i], X[(T - (K - 1)) * C + i]);
  // errors name the op and the tensor
  try {
    ctx->conv1d_causal(x, w, cpu_zeros(DType::F64, {2, C}), yp);
    ADD_FAILURE() << "a window of 2 rows accepted for K = 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv1d_causal: state"), std::string::npos) << e.what();
  }
}

// Several sequences in one call (seqs, a packed prefill): each from a zero window, the rows of one call per sequence;
// a window or offsets that do not tile the rows are refused.
TEST(HybridOps, CausalConvPackedSequences) {
  auto ctx = make_context("cpu64");
  const int64_t C = 5, K = 4;
  const std::vector<int64_t> seqs = {0, 2, 2, 9, 10};
  const int64_t T = seqs.back();
  const Tensor x = test::randn({T, C}, 3, 1.0, DType::F64), w = test::randn({C, K}, 4, 0.5, DType::F64);
  Tensor y = cpu_empty(DType::F64, {T, C}), ys = cpu_empty(DType::F64, {T, C});
  ctx->conv1d_causal(x, w, Tensor{}, y, seqs);
  for (size_t i = 0; i + 1 < seqs.size(); ++i)
    ctx->conv1d_causal(x.slice(seqs[i], seqs[i + 1]), w, Tensor{}, ys.slice(seqs[i], seqs[i + 1]));
  EXPECT_EQ(to_f64(y), to_f64(ys));
  Tensor whole = cpu_empty(DType::F64, {T, C});  // one sequence: row 2 (sequence 3's first) sees rows 0, 1
  ctx->conv1d_causal(x, w, Tensor{}, whole);
  EXPECT_NE(to_f64(whole.slice(2, 3)), to_f64(y.slice(2, 3)));
  const auto refused = [&](const Tensor& state, std::vector<int64_t> s, const char* what) {
    try {
      ctx->conv1d_causal(x, w, state, y, s);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("conv1d_causal: "), std::string::npos) << e.what();
    }
  };
  refused(cpu_zeros(DType::F64, {K - 1, C}), seqs, "a window with seqs");
  refused(Tensor{}, {0, 4, 9}, "seqs ending before T");
  refused(Tensor{}, {0, 5, 4, 10}, "seqs descending");
}
