// tests/ops/dynamic_conv.cpp — DFlash2's grouped dynamic convolution (Context::dynamic_conv, docs/spec.md 1.1) on the
// CPU: the forward against the formula written out, the block boundary, the backward against finite differences.
#include <gtest/gtest.h>

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

// The loop of DynConvArgs written out for one (t, c): the reference of the tests below.
double conv_ref(const std::vector<double>& u, const std::vector<double>& delta, const std::vector<double>& base,
                int64_t C, int64_t T, int64_t g, int64_t B, int side, int64_t t, int64_t c) {
  const int64_t G = C / g;
  double y = 0;
  for (int64_t k = 0; k < T && k <= t % B; ++k)
    y += (base[(side * T + k) * C + c] + delta[t * 2 * T * G + side * T * G + k * G + c / g]) * u[(t - k) * C + c];
  return y;
}

}  // namespace

// Two blocks of 3 rows, 4 channels in groups of 2, 2 taps: every output against the formula (slot 0 has no tap 1:
// nothing reaches across the block boundary), with the residual added.
TEST(DynamicConv, ForwardIsTheFormulaAndStaysInsideTheBlock) {
  auto ctx = make_context("cpu64");
  const int64_t R = 6, C = 4, T = 2, g = 2, B = 3, G = C / g;
  std::vector<double> u(R * C), delta(R * 2 * T * G), base(2 * T * C), res(R * C);
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<double>(i % 7) - 3;
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = 0.25 * static_cast<double>(i % 5) - 0.5;
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<double>(i % 3);
  for (size_t i = 0; i < res.size(); ++i) res[i] = static_cast<double>(i);
  for (int side : {0, 1}) {
    DynConvArgs a{f64(u, {R, C}), f64(delta, {R, 2 * T * G}), f64(base, {2, T, C}), side, B, g};
    Tensor y = cpu_empty(DType::F64, {R, C}), r = f64(res, {R, C});
    ctx->dynamic_conv(a, y, &r);
    for (int64_t t = 0; t < R; ++t)
      for (int64_t c = 0; c < C; ++c)
        EXPECT_DOUBLE_EQ(y.ptr<double>()[t * C + c], res[t * C + c] + conv_ref(u, delta, base, C, T, g, B, side, t, c))
            << "side " << side << " t " << t << " c " << c;
    // the block's first row: tap 0 only, (b0 + d0) u_t
    const double b0 = base[(side * T) * C + 1], d0 = delta[3 * 2 * T * G + side * T * G + 0 * G + 0];
    ctx->dynamic_conv(a, y, nullptr);
    EXPECT_DOUBLE_EQ(y.ptr<double>()[3 * C + 1], (b0 + d0) * u[3 * C + 1]);
  }
}

// The backward against central differences of sum(y * w) for random u, delta, base (fp64).
TEST(DynamicConv, BackwardMatchesFiniteDifferences) {
  auto ctx = make_context("cpu64");
  const int64_t R = 8, C = 6, T = 3, g = 3, B = 4, G = C / g;
  for (int side : {0, 1}) {
    Tensor u = randn({R, C}, 1, 1.0, DType::F64), delta = randn({R, 2 * T * G}, 2, 0.5, DType::F64);
    Tensor base = randn({2, T, C}, 3, 1.0, DType::F64), wy = randn({R, C}, 4, 1.0, DType::F64);
    DynConvArgs a{u, delta, base, side, B, g};
    Tensor du = cpu_empty(DType::F64, {R, C}), dd = ctx->zeros(DType::F64, {R, 2 * T * G});
    Tensor db = ctx->zeros(DType::F64, {2, T, C});
    ctx->dynamic_conv_backward(a, wy, du, dd, db);
    auto loss = [&] {
      Tensor y = cpu_empty(DType::F64, {R, C});
      ctx->dynamic_conv(a, y, nullptr);
      double s = 0;
      for (int64_t i = 0; i < R * C; ++i) s += y.ptr<double>()[i] * wy.ptr<double>()[i];
      return s;
    };
    for (auto [t, grad] : {std::pair{u, du}, std::pair{delta, dd}, std::pair{base, db}}) {
      for (int64_t i = 0; i < t.numel(); ++i) {
        double& x = t.ptr<double>()[i];
        const double x0 = x;
        x = x0 + 1e-6;
        const double lp = loss();
        x = x0 - 1e-6;
        const double lm = loss();
        x = x0;
        const double fd = (lp - lm) / 2e-6;
        // the other side's coefficients and base rows get no gradient (and are left untouched)
        EXPECT_NEAR(grad.ptr<double>()[i], fd, 1e-7 * (1 + std::fabs(fd))) << "side " << side << " i " << i;
      }
    }
  }
}
