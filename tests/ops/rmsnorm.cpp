// tests/ops/rmsnorm.cpp — Context::rmsnorm / rmsnorm_backward with RopeArgs (the drafter's per-head q / k norms,
// RoPE fused) against rmsnorm then rope, in fp32 and fp64, and the backward against central differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/context.h"
#include "common/test_util.h"

using namespace dflash;
using test::randn;
using test::to_f64;

// rmsnorm / rmsnorm_backward with RopeArgs (the drafter's per-head q / k norms, RoPE fused): the forward is rmsnorm
// then rope on the rows as [T, heads, D] (also in place); the backward rotates dy back (rope inverse) and runs the
// plain backward, dy untouched. In fp64 that backward is the adjoint of the forward: dx . v and dw . u equal central
// differences of L = sum(dy y) along directions v (of x) and u (of w).
TEST(OpsRmsNorm, RopeArgsAreRmsNormThenRope) {
  for (const char* dev : {"cpu", "cpu64"}) {
    auto ctx = make_context(dev, {.threads = 2});
    const DType dt = ctx->compute_dtype();
    const int64_t T = 3, heads = 2, D = 8, R = T * heads;
    const auto rnd = [&](Shape s, uint64_t seed, double sd, double mean) {
      Tensor t = randn(std::move(s), seed, sd, DType::F64);
      for (double& v : t.span<double>()) v += mean;
      return ctx->to_device(t, dt);
    };
    const Tensor x = rnd({R, D}, 31, 1.5, 0.0), w = rnd({D}, 32, 0.3, 1.0), dy = rnd({R, D}, 33, 1.0, 0.0);
    const Tensor dx_init = rnd({R, D}, 34, 1.0, 0.0), dw_init = rnd({D}, 35, 1.0, 0.0);
    const Tensor pos = cpu_tensor_i32({0, 7, 1234}, {T});
    Tensor inv = cpu_empty(DType::F32, {D / 2});
    for (int64_t i = 0; i < D / 2; ++i) inv.ptr<float>()[i] = std::pow(10000.0f, -2.0f * i / D);
    const RopeArgs rope{pos, inv, heads};
    // forward
    Tensor y = ctx->empty(dt, {R, D}), rstd = ctx->empty(dt, {R}), none;
    ctx->rmsnorm(x, w, 1e-6f, y, rstd, &rope);
    Tensor y0 = ctx->empty(dt, {R, D}), rstd0 = ctx->empty(dt, {R});
    ctx->rmsnorm(x, w, 1e-6f, y0, rstd0);
    ctx->rope(y0.reshape({T, heads, D}), pos, inv, false);
    EXPECT_EQ(to_f64(y), to_f64(y0)) << dev;
    EXPECT_EQ(to_f64(rstd), to_f64(rstd0)) << dev;
    Tensor xi = cpu_clone(x);
    ctx->rmsnorm(xi, w, 1e-6f, xi, none, &rope);
    EXPECT_EQ(to_f64(xi), to_f64(y0)) << dev;
    // backward: beta 1 with dw, and dx = dy (beta 0, no dw)
    const std::vector<double> dyv = to_f64(dy);
    Tensor dx = cpu_clone(dx_init), dw = cpu_clone(dw_init);
    ctx->rmsnorm_backward(dy, x, w, rstd, dx, dw, 1.0f, &rope);
    EXPECT_EQ(to_f64(dy), dyv) << dev;
    Tensor g = cpu_clone(dy), dx0 = cpu_clone(dx_init), dw0 = cpu_clone(dw_init);
    ctx->rope(g.reshape({T, heads, D}), pos, inv, true);
    ctx->rmsnorm_backward(g, x, w, rstd, dx0, dw0, 1.0f);
    EXPECT_EQ(to_f64(dx), to_f64(dx0)) << dev;
    EXPECT_EQ(to_f64(dw), to_f64(dw0)) << dev;
    Tensor gi = cpu_clone(dy);
    ctx->rmsnorm_backward(gi, x, w, rstd, gi, none, 0.0f, &rope);
    Tensor dxb = ctx->empty(dt, {R, D});
    ctx->rmsnorm_backward(g, x, w, rstd, dxb, none, 0.0f);
    EXPECT_EQ(to_f64(gi), to_f64(dxb)) << dev;
    if (dt != DType::F64) continue;
    // the adjoint, by central differences (fp64)
    const auto loss = [&](const Tensor& xs, const Tensor& ws) {
      Tensor ys = ctx->empty(dt, {R, D});
      ctx->rmsnorm(xs, ws, 1e-6f, ys, none, &rope);
      double l = 0;
      const auto yv = to_f64(ys);
      for (size_t i = 0; i < yv.size(); ++i) l += dyv[i] * yv[i];
      return l;
    };
    const auto along = [&](const Tensor& t, const Tensor& dir, double h) {
      Tensor o = cpu_clone(t);
      for (int64_t i = 0; i < o.numel(); ++i) o.ptr<double>()[i] += h * dir.ptr<double>()[i];
      return o;
    };
    const Tensor v = rnd({R, D}, 36, 1.0, 0.0), u = rnd({D}, 37, 1.0, 0.0);
    Tensor dxa = ctx->empty(dt, {R, D}), dwa = ctx->zeros(dt, {D});
    ctx->rmsnorm_backward(dy, x, w, rstd, dxa, dwa, 0.0f, &rope);
    const double h = 1e-5;
    const double fd_x = (loss(along(x, v, h), w) - loss(along(x, v, -h), w)) / (2 * h);
    const double fd_w = (loss(x, along(w, u, h)) - loss(x, along(w, u, -h))) / (2 * h);
    double an_x = 0, an_w = 0;
    for (int64_t i = 0; i < R * D; ++i) an_x += dxa.ptr<double>()[i] * v.ptr<double>()[i];
    for (int64_t i = 0; i < D; ++i) an_w += dwa.ptr<double>()[i] * u.ptr<double>()[i];
    EXPECT_NEAR(an_x, fd_x, 1e-7 * std::max(1.0, std::fabs(fd_x)));
    EXPECT_NEAR(an_w, fd_w, 1e-7 * std::max(1.0, std::fabs(fd_w)));
  }
}
