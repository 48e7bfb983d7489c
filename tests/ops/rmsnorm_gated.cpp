// tests/ops/rmsnorm_gated.cpp — the norms and gates of the hybrid families on the CPU: the zero-centred RMSNorm
// x rstd (1 + w), the gated norm x rstd w silu(z) (rmsnorm_gated) and sigmoid_gate per element and per row, against
// the formulas written out.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/context.h"
#include "core/error.h"
#include "common/test_util.h"

using namespace dflash;
using test::to_f64;

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

// Zero-centred RMSNorm x rstd (1 + w), the gated norm x rstd w silu(z), and sigmoid_gate per element and per row.
TEST(HybridOps, NormsAndGates) {
  auto ctx = make_context("cpu64");
  const int64_t R = 3, D = 5;
  const Tensor x = test::randn({R, D}, 9, 1.0, DType::F64), w = test::randn({D}, 10, 0.3, DType::F64);
  const Tensor z = test::randn({R, D}, 11, 1.0, DType::F64);
  Tensor y1 = cpu_empty(DType::F64, {R, D}), y2 = cpu_empty(DType::F64, {R, D});
  ctx->rmsnorm_gated(x, w, nullptr, 1e-6f, true, y1);
  ctx->rmsnorm_gated(x, w, &z, 1e-6f, false, y2);
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += x.ptr<double>()[r * D + i] * x.ptr<double>()[r * D + i];
    const double inv = 1.0 / std::sqrt(ss / D + double(1e-6f));
    for (int64_t i = 0; i < D; ++i) {
      const double n = x.ptr<double>()[r * D + i] * inv, zz = z.ptr<double>()[r * D + i];
      EXPECT_NEAR(y1.ptr<double>()[r * D + i], n * (1 + w.ptr<double>()[i]), 1e-14);
      EXPECT_NEAR(y2.ptr<double>()[r * D + i], n * w.ptr<double>()[i] * zz * sigmoid(zz), 1e-14);
    }
  }
  Tensor a = cpu_clone(x), b = cpu_clone(x);
  const Tensor row = test::randn({R, 1}, 12, 1.0, DType::F64);
  ctx->sigmoid_gate(a, z);
  ctx->sigmoid_gate(b, row);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < D; ++i) {
      const double v = x.ptr<double>()[r * D + i];
      EXPECT_NEAR(a.ptr<double>()[r * D + i], v * sigmoid(z.ptr<double>()[r * D + i]), 1e-15);
      EXPECT_NEAR(b.ptr<double>()[r * D + i], v * sigmoid(row.ptr<double>()[r]), 1e-15);
    }
  EXPECT_THROW(ctx->sigmoid_gate(a, cpu_zeros(DType::F64, {R, 2})), Error);
}
