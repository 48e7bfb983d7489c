// tests/ops/linear.cpp — Context::linear on the CPU: y = x w^T + beta c with a separate beta operand against a
// direct sum, and the same with c == y (the plain accumulation).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backend/context.h"
#include "common/test_util.h"

using namespace dflash;
using test::randn;
using test::to_f64;

// linear with a separate beta operand c (the drafter's residual adds): y = x w^T + beta c, c untouched, the same as
// copying c into y and accumulating.
TEST(OpsLinear, SeparateBetaOperandMatchesCopyThenAccumulate) {
  auto ctx = make_context("cpu", {.threads = 2});
  const int64_t M = 5, N = 4, K = 3;
  Tensor x = randn({M, K}, 11), w = randn({N, K}, 12), c = randn({M, N}, 13);
  const std::vector<double> c0 = to_f64(c);
  Tensor y = cpu_empty(DType::F32, {M, N});
  ctx->linear(x, w, nullptr, y, 0.5f, &c);
  const auto yv = to_f64(y), xv = to_f64(x), wv = to_f64(w);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.5 * c0[m * N + n];
      for (int64_t k = 0; k < K; ++k) s += xv[m * K + k] * wv[n * K + k];
      EXPECT_NEAR(yv[m * N + n], s, 1e-5) << m << " " << n;
    }
  EXPECT_EQ(to_f64(c), c0);
  // c == y: the plain accumulation
  Tensor y2 = cpu_empty(DType::F32, {M, N});
  std::copy_n(c.ptr<float>(), M * N, y2.ptr<float>());
  ctx->linear(x, w, nullptr, y2, 0.5f, &y2);
  EXPECT_EQ(to_f64(y2), yv);
}
