// tests/ops/gelu_tanh.cpp — Gemma's elementwise ops on the CPU: gelu_tanh_mul (the GeGLU of its MLPs and experts)
// against PyTorch's gelu(approximate="tanh") at fixed points (values printed by torch 1.13 in float64) and against
// the formula written out, and softcap (final_logit_softcapping) likewise; both in F32 and F64, in place, and
// their argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/context.h"
#include "core/error.h"
#include "common/test_util.h"

using namespace dflash;
using test::to_f64;

namespace {

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace

// torch.nn.functional.gelu(x, approximate="tanh") in float64 at these points (torch 1.13).
TEST(GemmaOps, GeluTanhMulMatchesTorch) {
  const std::vector<double> x = {-5.0, -2.5, -1.0, -0.3, 0.0, 0.2, 0.7, 1.5, 3.0, 6.0};
  const std::vector<double> want = {-2.2917961972623857e-07, -0.015084266089998577, -0.1588080093917233,
                                    -0.11462907645724074,    0.0,                   0.11585142978210627,
                                    0.5305701347051167,      1.3995715769802328,    2.996362607918227,
                                    5.9999999999156035};
  const int64_t n = static_cast<int64_t>(x.size());
  for (const char* dev : {"cpu64", "cpu"}) {
    auto ctx = make_context(dev);
    const DType dt = ctx->compute_dtype();
    Tensor g = cpu_empty(dt, {2, n}), u = cpu_empty(dt, {2, n}), out = cpu_empty(dt, {2, n});
    for (int64_t i = 0; i < n; ++i) {  // row 0: up = 1 (the activation alone); row 1: up = -1.5
      const double v[2] = {1.0, -1.5};
      for (int r = 0; r < 2; ++r) {
        if (dt == DType::F64) {
          g.ptr<double>()[r * n + i] = x[i];
          u.ptr<double>()[r * n + i] = v[r];
        } else {
          g.ptr<float>()[r * n + i] = static_cast<float>(x[i]);
          u.ptr<float>()[r * n + i] = static_cast<float>(v[r]);
        }
      }
    }
    ctx->gelu_tanh_mul(g, u, out);
    const auto o = to_f64(out);
    const double tol = dt == DType::F64 ? 1e-15 : 2e-6;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(o[i], want[i], tol * (1 + std::abs(want[i]))) << dev << " x " << x[i];
      EXPECT_NEAR(o[n + i], -1.5 * want[i], tol * (1 + std::abs(want[i]))) << dev << " x " << x[i];
    }
    ctx->gelu_tanh_mul(g, u, g);  // out aliasing gate
    EXPECT_EQ(to_f64(g), o) << dev;
  }
}

// Random inputs against the formula; shape and dtype mismatches refused.
TEST(GemmaOps, GeluTanhMulFormulaAndChecks) {
  auto ctx = make_context("cpu64");
  const Tensor g = test::randn({5, 33}, 21, 2.0, DType::F64), u = test::randn({5, 33}, 22, 1.0, DType::F64);
  Tensor out = cpu_empty(DType::F64, {5, 33});
  ctx->gelu_tanh_mul(g, u, out);
  for (int64_t i = 0; i < g.numel(); ++i)
    EXPECT_NEAR(out.ptr<double>()[i], gelu_tanh(g.ptr<double>()[i]) * u.ptr<double>()[i], 1e-14);
  EXPECT_THROW(ctx->gelu_tanh_mul(g, cpu_zeros(DType::F64, {5, 32}), out), Error);
  EXPECT_THROW(ctx->gelu_tanh_mul(g, u, cpu_zeros(DType::F32, {5, 33})), Error);
}

// 30 tanh(x / 30) (torch, float64) at fixed points, in place; a cap <= 0 refused.
TEST(GemmaOps, SoftcapMatchesTorch) {
  const std::vector<double> x = {-100.0, -31.0, -5.0, 0.0, 0.5, 29.0, 200.0};
  const std::vector<double> want = {-29.92373902421512, -23.257253439518596, -4.95421238773888, 0.0,
                                    0.49995370884715834, 22.417074638519228, 29.999902824349846};
  for (const char* dev : {"cpu64", "cpu"}) {
    auto ctx = make_context(dev);
    Tensor t = ctx->to_device(cpu_tensor(std::vector<float>(x.begin(), x.end()), {1, 7}), ctx->compute_dtype());
    ctx->softcap(t, 30.0f);
    const auto o = to_f64(t);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(o[i], want[i], 2e-6 * (1 + std::abs(want[i]))) << dev;
    EXPECT_THROW(ctx->softcap(t, 0.0f), Error);
    EXPECT_THROW(ctx->softcap(t, -1.0f), Error);
  }
}
