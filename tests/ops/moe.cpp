// tests/ops/moe.cpp — the Mixture-of-Experts ops on the CPU (backend/context.h moe_route, moe_group, moe_linear,
// moe_combine) with values worked out by hand; the gpt-oss GLU with biases and its clamps against the formula per row;
// and the MoE layer (model/target/mlp.h moe_forward) against transformers' rule written out per token. MXFP4 experts:
// tests/ops/mxfp4.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/context.h"
#include "model/target.h"
#include "common/test_util.h"

using namespace dflash;

namespace {

std::vector<int32_t> ints(const Tensor& t) { return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel()); }
std::vector<float> floats(const Tensor& t) { return to_f32_vector(t); }

double gpt_oss_glu(double g, double u) {  // transformers' GptOssExperts._apply_gate, written out
  g = std::min(g, 7.0);
  u = std::max(-7.0, std::min(u, 7.0));
  return (u + 1) * g / (1 + std::exp(-1.702 * g));
}

}  // namespace

TEST(MoeOps, RouteTopKTiesAndWeights) {
  auto ctx = make_context("cpu");
  // token 0: experts 1 and 3 tie at 2.0 (lower index first), then 0; token 1: a clear order 2 > 0 > 3
  Tensor z = cpu_tensor({1.0f, 2.0f, 0.5f, 2.0f, /**/ 0.0f, -1.0f, 3.0f, -0.5f}, {2, 4});
  Tensor idx = cpu_empty(DType::I32, {2, 3}), w = cpu_empty(DType::F32, {2, 3});
  ctx->moe_route(z, 3, false, idx, w);
  EXPECT_EQ(ints(idx), (std::vector<int32_t>{1, 3, 0, 2, 0, 3}));
  const double s0 = std::exp(1.0) + 2 * std::exp(2.0) + std::exp(0.5);
  const double s1 = std::exp(0.0) + std::exp(-1.0) + std::exp(3.0) + std::exp(-0.5);
  const std::vector<double> want = {std::exp(2.0) / s0, std::exp(2.0) / s0, std::exp(1.0) / s0,
                                    std::exp(3.0) / s1, 1.0 / s1,           std::exp(-0.5) / s1};
  const std::vector<float> got = floats(w);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  ctx->moe_route(z, 3, true, idx, w);  // renormalised over the chosen three
  const std::vector<float> gn = floats(w);
  const double c0 = want[0] + want[1] + want[2], c1 = want[3] + want[4] + want[5];
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(gn[i], want[i] / c0, 1e-6);
  for (size_t i = 3; i < 6; ++i) EXPECT_NEAR(gn[i], want[i] / c1, 1e-6);
  EXPECT_NEAR(gn[0] + gn[1] + gn[2], 1.0, 1e-6);
  EXPECT_THROW(ctx->moe_route(z, 5, true, idx, w), Error);  // k > E
}

// Sigmoid scores with a choice bias (MiniMax-M2's router): the bias decides which experts, p = sigmoid(z) their
// weights; ties of p + b to the lower index; without normalize the weights are the p themselves.
TEST(MoeOps, RouteSigmoidWithChoiceBias) {
  for (const char* dev : {"cpu", "cpu64"}) {
    auto ctx = make_context(dev);
    const DType dt = ctx->compute_dtype();
    // token 0: p = sigmoid(2, 0, 1, -1); the bias (0, 0.5, -0.5, 1.2) makes the choice values
    //   0.881, 1.0, 0.231, 1.469: experts 3, 1 (not 0 and 2, the largest p)
    // token 1: z = 0 everywhere, p = 0.5; bias (0, 0.25, 0, 0.25): experts 1 and 3 tie at 0.75, lower index first
    std::vector<double> zv = {2, 0, 1, -1, 0, 0, 0, 0};
    Tensor z = cpu_empty(dt, {2, 4});
    for (size_t i = 0; i < zv.size(); ++i) {
      if (dt == DType::F64) z.ptr<double>()[i] = zv[i];
      else z.ptr<float>()[i] = static_cast<float>(zv[i]);
    }
    MoeRouteOpts o;
    o.score = MoeScore::Sigmoid;
    Tensor b = cpu_tensor({0.0f, 0.5f, -0.5f, 1.2f}, {4});
    o.choice_bias = b;
    Tensor idx = cpu_empty(DType::I32, {2, 2}), w = cpu_empty(ctx->param_dtype(), {2, 2});
    // token 1 with its own bias: run the two tokens separately (one bias per call)
    ctx->moe_route(z.slice(0, 1), 2, false, idx.slice(0, 1), w.slice(0, 1), o);
    Tensor b1 = cpu_tensor({0.0f, 0.25f, 0.0f, 0.25f}, {4});
    o.choice_bias = b1;
    ctx->moe_route(z.slice(1, 2), 2, false, idx.slice(1, 2), w.slice(1, 2), o);
    EXPECT_EQ(ints(idx), (std::vector<int32_t>{3, 1, 1, 3})) << dev;
    auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
    const std::vector<double> want = {sig(-1), sig(0), 0.5, 0.5};  // p, not p + b
    const std::vector<double> got = test::to_f64(w);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-7) << dev << " " << i;
    o.choice_bias = b;
    ctx->moe_route(z.slice(0, 1), 2, true, idx.slice(0, 1), w.slice(0, 1), o);  // renormalised over the chosen
    const std::vector<double> gn = test::to_f64(w);
    EXPECT_NEAR(gn[0], sig(-1) / (sig(-1) + sig(0)), 1e-7) << dev;
    EXPECT_NEAR(gn[0] + gn[1], 1.0, 1e-7) << dev;
    // without a bias: the largest p (experts 0 and 2)
    o.choice_bias = Tensor();
    ctx->moe_route(z.slice(0, 1), 2, true, idx.slice(0, 1), w.slice(0, 1), o);
    EXPECT_EQ(ints(idx.slice(0, 1)), (std::vector<int32_t>{0, 2})) << dev;
    // a bias with softmax scores, or of another size, is refused
    MoeRouteOpts bad;
    bad.choice_bias = b;
    EXPECT_THROW(ctx->moe_route(z, 2, true, idx, w, bad), Error);
    o.choice_bias = cpu_tensor({0.0f, 0.5f}, {2});
    EXPECT_THROW(ctx->moe_route(z, 2, true, idx, w, o), Error);
  }
}

// DeepSeek-V3's group-limited choice (MoeRouteOpts::n_group / topk_group) and routed scaling: 8 experts in 4 groups of
// 2, z = (3, -3, 2, 2, 2.5, -3, 0.1, 0): group scores (the sum of a group's two p) 1.0, 1.76, 0.97, 1.02, so groups 1
// and 3 are kept and the top 3 are experts 2, 3 (tied: the lower first) and 6, where without groups they would be
// 0, 4, 2; the weights are p / (sum + 1e-20) x 2.5.
TEST(MoeOps, RouteSigmoidGroupLimited) {
  for (const char* dev : {"cpu", "cpu64"}) {
    auto ctx = make_context(dev);
    const DType dt = ctx->compute_dtype();
    const std::vector<double> zv = {3, -3, 2, 2, 2.5, -3, 0.1, 0};
    Tensor z = cpu_empty(dt, {1, 8});
    for (size_t i = 0; i < zv.size(); ++i) {
      if (dt == DType::F64) z.ptr<double>()[i] = zv[i];
      else z.ptr<float>()[i] = static_cast<float>(zv[i]);
    }
    MoeRouteOpts o;
    o.score = MoeScore::Sigmoid;
    o.n_group = 4;
    o.topk_group = 2;
    o.scale = 2.5;
    Tensor idx = cpu_empty(DType::I32, {1, 3}), w = cpu_empty(ctx->param_dtype(), {1, 3});
    ctx->moe_route(z, 3, true, idx, w, o);
    EXPECT_EQ(ints(idx), (std::vector<int32_t>{2, 3, 6})) << dev;
    auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
    const double sum = 2 * sig(2) + sig(0.1);
    const std::vector<double> got = test::to_f64(w);
    EXPECT_NEAR(got[0], 2.5 * sig(2) / sum, 1e-6) << dev;
    EXPECT_NEAR(got[2], 2.5 * sig(0.1) / sum, 1e-6) << dev;
    o.n_group = 1;  // no groups: the largest p
    o.topk_group = 1;
    ctx->moe_route(z, 3, true, idx, w, o);
    EXPECT_EQ(ints(idx), (std::vector<int32_t>{0, 4, 2})) << dev;
    // refused: groups that do not divide E, topk_group outside [1, n_group], too few candidates, softmax with groups
    o.n_group = 3;
    EXPECT_THROW(ctx->moe_route(z, 3, true, idx, w, o), Error);
    o.n_group = 4;
    o.topk_group = 5;
    EXPECT_THROW(ctx->moe_route(z, 3, true, idx, w, o), Error);
    o.topk_group = 1;  // 2 candidates < k = 3
    EXPECT_THROW(ctx->moe_route(z, 3, true, idx, w, o), Error);
    o.topk_group = 2;
    o.score = MoeScore::Softmax;
    EXPECT_THROW(ctx->moe_route(z, 3, true, idx, w, o), Error);
  }
}

TEST(MoeOps, GroupSortsPairsByExpertThenToken) {
  auto ctx = make_context("cpu");
  // pairs (token, slot): (0,0)->2 (0,1)->0 (1,0)->2 (1,1)->1 (2,0)->0 (2,1)->2
  Tensor idx = cpu_tensor_i32({2, 0, 2, 1, 0, 2}, {3, 2});
  Tensor off = cpu_empty(DType::I32, {4}), rows = cpu_empty(DType::I32, {6}), slot = cpu_empty(DType::I32, {6});
  ctx->moe_group(idx, off, rows, slot);
  EXPECT_EQ(ints(off), (std::vector<int32_t>{0, 2, 3, 6}));        // expert 0: 2 pairs, 1: 1, 2: 3
  EXPECT_EQ(ints(rows), (std::vector<int32_t>{0, 2, 1, 0, 1, 2}));  // each expert's tokens ascending
  EXPECT_EQ(ints(slot), (std::vector<int32_t>{3, 0, 4, 2, 1, 5}));  // pair (t, j) -> its grouped row
  Tensor bad = cpu_tensor_i32({0, 3}, {1, 2});
  Tensor o2 = cpu_empty(DType::I32, {4}), r2 = cpu_empty(DType::I32, {2}), s2 = cpu_empty(DType::I32, {2});
  try {
    ctx->moe_group(bad, o2, r2, s2);
    ADD_FAILURE() << "expert 3 of 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 3"), std::string::npos) << e.what();
  }
}

TEST(MoeOps, GroupedLinearAndCombineEqualPerRowProducts) {
  auto ctx = make_context("cpu64");
  const int64_t T = 5, H = 6, N = 4, E = 3, k = 2;
  Tensor idx = cpu_tensor_i32({0, 2, 2, 1, 0, 1, 2, 0, 1, 2}, {T, k});
  Tensor off = cpu_empty(DType::I32, {E + 1}), rows = cpu_empty(DType::I32, {T * k}), slot = cpu_empty(DType::I32, {T * k});
  ctx->moe_group(idx, off, rows, slot);
  const Tensor x = test::randn({T, H}, 1, 1.0, DType::F64), w = test::randn({E, 2 * N, H}, 2, 0.5, DType::F64);
  Tensor y = cpu_empty(DType::F64, {T * k, 2 * N}), a = cpu_empty(DType::F64, {T * k, N});
  ctx->moe_linear(x, &rows, w, off, y, MoeAct::None);
  ctx->moe_linear(x, &rows, w, off, a, MoeAct::SwiGLU);
  const double* X = x.ptr<double>();
  const double* W = w.ptr<double>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx.ptr<int32_t>()[t * k + j], r = slot.ptr<int32_t>()[t * k + j];
      ASSERT_EQ(rows.ptr<int32_t>()[r], t);
      for (int64_t n = 0; n < 2 * N; ++n) {
        double dot = 0;
        for (int64_t c = 0; c < H; ++c) dot += X[t * H + c] * W[(e * 2 * N + n) * H + c];
        EXPECT_NEAR(y.ptr<double>()[r * 2 * N + n], dot, 1e-12);
      }
      for (int64_t n = 0; n < N; ++n) {
        const double g = y.ptr<double>()[r * 2 * N + n], u = y.ptr<double>()[r * 2 * N + N + n];
        EXPECT_NEAR(a.ptr<double>()[r * N + n], g / (1 + std::exp(-g)) * u, 1e-12);
      }
    }
  // combine: out[t] = 0.5 out[t] + sum_j w_tj a[slot(t, j)]
  const Tensor wts = test::randn({T, k}, 3, 1.0, DType::F64), o0 = test::randn({T, N}, 4, 1.0, DType::F64);
  Tensor out = cpu_clone(o0);
  ctx->moe_combine(a, slot, wts, out, 0.5f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double want = 0.5 * o0.ptr<double>()[t * N + n];
      for (int64_t j = 0; j < k; ++j)
        want += wts.ptr<double>()[t * k + j] * a.ptr<double>()[slot.ptr<int32_t>()[t * k + j] * N + n];
      EXPECT_NEAR(out.ptr<double>()[t * N + n], want, 1e-12);
    }
}

// The clamped SwiGLU (gpt-oss's) with biases against the formula per row, on values that reach both clamps (|g|, |u|
// up to ~20).
TEST(GptOssExperts, ClampedGluWithBiasesPerRow) {
  auto ctx = make_context("cpu64");
  const int64_t T = 5, K = 8, N = 4, E = 2;
  Tensor idx = cpu_tensor_i32({0, 1, 1, 0, 1}, {T, 1});
  Tensor off = cpu_empty(DType::I32, {E + 1}), rows = cpu_empty(DType::I32, {T}), slot = cpu_empty(DType::I32, {T});
  ctx->moe_group(idx, off, rows, slot);
  const Tensor x = test::randn({T, K}, 31, 3.0, DType::F64);
  MoeWeights w = test::randn({E, 2 * N, K}, 32, 1.5, DType::F64);
  w.bias = test::randn({E, 2 * N}, 33, 2.0, DType::F64);
  Tensor y = cpu_empty(DType::F64, {T, N});
  ctx->moe_linear(x, &rows, w, off, y, MoeAct::ClampedSwiGLU);
  int clamped_g = 0, clamped_u = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t e = idx.ptr<int32_t>()[t], r = slot.ptr<int32_t>()[t];
    for (int64_t n = 0; n < N; ++n) {
      double g = w.bias.ptr<double>()[e * 2 * N + n], u = w.bias.ptr<double>()[e * 2 * N + N + n];
      for (int64_t c = 0; c < K; ++c) {
        g += x.ptr<double>()[t * K + c] * w.w.ptr<double>()[(e * 2 * N + n) * K + c];
        u += x.ptr<double>()[t * K + c] * w.w.ptr<double>()[(e * 2 * N + N + n) * K + c];
      }
      clamped_g += g > 7;
      clamped_u += std::fabs(u) > 7;
      EXPECT_NEAR(y.ptr<double>()[r * N + n], gpt_oss_glu(g, u), 1e-12) << "token " << t << " column " << n;
    }
  }
  EXPECT_GT(clamped_g, 0) << "no gate value reached the clamp: the test would not see it";
  EXPECT_GT(clamped_u, 0) << "no up value reached the clamp: the test would not see it";
}

// The MoE layer (router GEMM, route, group, two grouped GEMMs, combine) against transformers' rule written out per
// token: softmax over all experts, the top k, renormalised, sum_j p_j down_e(silu(gate_e x) * up_e x).
TEST(MoeLayer, MatchesPerTokenLoop) {
  auto ctx = make_context("cpu64");
  MoeConfig m;
  m.num_experts = 6;
  m.top_k = 3;
  m.expert_width = 5;
  m.norm_topk_prob = true;
  const int64_t T = 9, H = 8, E = 6, k = 3, I = 5;
  MoeLayerWeights w;
  w.router = test::randn({E, H}, 11, 0.7, DType::F64);
  w.gate_up = test::randn({E, 2 * I, H}, 12, 0.4, DType::F64);
  w.down = test::randn({E, H, I}, 13, 0.4, DType::F64);
  const Tensor x = test::randn({T, H}, 14, 1.0, DType::F64), h0 = test::randn({T, H}, 15, 1.0, DType::F64);
  Tensor h = cpu_clone(h0);
  const Tensor chosen = moe_forward(*ctx, w, m, x, h);
  const double* X = x.ptr<double>();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> z(E), p(E);
    for (int64_t e = 0; e < E; ++e) {
      z[e] = 0;
      for (int64_t c = 0; c < H; ++c) z[e] += X[t * H + c] * w.router.ptr<double>()[e * H + c];
    }
    const double mx = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += p[e] = std::exp(z[e] - mx);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
    double cs = 0;
    for (int64_t j = 0; j < k; ++j) cs += p[order[j]] / s;
    for (int64_t j = 0; j < k; ++j) EXPECT_EQ(chosen.ptr<int32_t>()[t * k + j], order[j]) << "token " << t;
    for (int64_t c = 0; c < H; ++c) {
      double want = h0.ptr<double>()[t * H + c];
      for (int64_t j = 0; j < k; ++j) {
        const int e = order[j];
        double yc = 0;
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int64_t q = 0; q < H; ++q) {
            g += X[t * H + q] * w.gate_up.w.ptr<double>()[(e * 2 * I + i) * H + q];
            u += X[t * H + q] * w.gate_up.w.ptr<double>()[(e * 2 * I + I + i) * H + q];
          }
          yc += g / (1 + std::exp(-g)) * u * w.down.w.ptr<double>()[(e * H + c) * I + i];
        }
        want += p[e] / s / cs * yc;
      }
      EXPECT_NEAR(h.ptr<double>()[t * H + c], want, 1e-11) << "token " << t << " column " << c;
    }
  }
}
