// tests/train/dpace.cpp
// The loss head's objectives (model/draft_loss.h, docs/spec.md 2.4): D-PACE's weights by hand and against the
// float64 reference tools/ref_dpace.py (tests/golden/dpace/case.json: weights, loss and gradient for the decayed
// cross-entropy and D-PACE, with and without the KL term), the scale_rows op, and errors that name the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "model/draft_loss.h"
#include "common/test_util.h"

using namespace dflash;

namespace {

// Expects `f` to throw an Error whose message contains every one of `words`.
template <class F>
void expect_error(F&& f, std::initializer_list<const char*> words) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << *words.begin();
  } catch (const Error& e) {
    for (const char* w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

}  // namespace

// Closed forms. Block 0: three slots of confidence 1/2 (ce = ln 2), alpha 1/2: s = 3/4 each, prefix products
// 3/4, 9/16, 27/64, weights their suffix sums. Block 1: slots 1 and 3 (slot 2 unsupervised: a factor 1, no term),
// confidences 1 and 1/4: s = 1, 5/8. Block 2: one slot.
TEST(DPace, WeightsByHand) {
  const std::vector<int32_t> rows = {1, 2, 3, 5, 7, 9};
  const std::vector<double> ce = {std::log(2.0), std::log(2.0), std::log(2.0), 0.0, std::log(4.0), 3.0};
  const std::vector<double> w = dpace_weights(rows, ce, 4, 0.5);
  const std::vector<double> want = {0.75 + 0.5625 + 0.421875, 0.5625 + 0.421875, 0.421875, 1.0 + 0.625, 0.625,
                                    0.5 * std::exp(-3.0) + 0.5};
  ASSERT_EQ(w.size(), want.size());
  for (size_t r = 0; r < w.size(); ++r) EXPECT_NEAR(w[r], want[r], 1e-15) << "row " << rows[r];
  // alpha = 1: every s is 1, so w counts the supervised slots at or after each one in its block
  const std::vector<double> w1 = dpace_weights(rows, ce, 4, 1.0);
  const std::vector<double> count = {3, 2, 1, 2, 1, 1};
  for (size_t r = 0; r < w1.size(); ++r) EXPECT_EQ(w1[r], count[r]) << "row " << rows[r];
  // a perfect drafter (ce 0) gets the count too, whatever alpha; the first slot of a block weighs most
  const std::vector<double> w0 = dpace_weights(rows, std::vector<double>(6, 0.0), 4, 0.3);
  for (size_t r = 0; r < w0.size(); ++r) EXPECT_NEAR(w0[r], count[r], 1e-15) << "row " << rows[r];
  EXPECT_TRUE(dpace_weights({}, {}, 4, 0.5).empty());
}

TEST(DPace, BadInputNamesTheArgument) {
  const std::vector<int32_t> rows = {1, 2};
  const std::vector<double> ce = {0.5, 0.5};
  expect_error([&] { dpace_weights(rows, ce, 4, 0.0); }, {"alpha", "(0, 1]"});
  expect_error([&] { dpace_weights(rows, ce, 4, 1.5); }, {"alpha", "1.5"});
  expect_error([&] { dpace_weights(rows, ce, 0, 0.5); }, {"block_size"});
  expect_error([&] { dpace_weights(rows, std::vector<double>{0.5}, 4, 0.5); }, {"1 ce values for 2 rows"});
  expect_error([&] { dpace_weights(std::vector<int32_t>{2, 1}, ce, 4, 0.5); }, {"rows[1] = 1", "ascending"});
  expect_error([&] { dpace_weights(rows, std::vector<double>{0.5, NAN}, 4, 0.5); }, {"ce[1]", "row 2"});
  expect_error([] { parse_loss_kind("dpase", "--loss"); }, {"--loss", "'dpase'", "decay", "dpace"});
  EXPECT_EQ(parse_loss_kind("dpace", "--loss"), LossKind::DPace);
  EXPECT_STREQ(loss_kind_name(parse_loss_kind("decay", "--loss")), "decay");
  expect_error([] { check_dpace_alpha(-0.1, "--dpace-alpha"); }, {"--dpace-alpha", "-0.1"});
}

// scale_rows: listed rows scaled (in place), others untouched; rows must ascend strictly within [0, R).
TEST(DPace, ScaleRowsOp) {
  for (const char* dev : {"cpu", "cpu64"}) {
    auto ctx = make_context(dev, {.threads = 2});
    const DType dt = ctx->compute_dtype();
    const Tensor x0 = test::randn({5, 3}, 7, 1.0, DType::F64);
    const std::vector<double> was = test::to_f64(x0);
    Tensor x = ctx->to_device(cpu_clone(x0), dt);
    Tensor sc = ctx->to_device(cpu_tensor(std::vector<float>{2.0f, -0.5f}, {2}), ctx->param_dtype());
    ctx->scale_rows(x, ctx->to_device(cpu_tensor_i32({1, 4}, {2})), sc);
    const std::vector<double> got = test::to_f64(ctx->to_host(x));
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t c = 0; c < 3; ++c) {
        const double f = r == 1 ? 2.0 : (r == 4 ? -0.5 : 1.0);
        EXPECT_NEAR(got[r * 3 + c], f * was[r * 3 + c], 1e-6 * std::fabs(was[r * 3 + c])) << dev << " " << r << "," << c;
      }
    expect_error([&] { ctx->scale_rows(x, ctx->to_device(cpu_tensor_i32({4, 1}, {2})), sc); },
                 {"scale_rows", "rows[1] = 1 after 4", "ascending"});
    expect_error([&] { ctx->scale_rows(x, ctx->to_device(cpu_tensor_i32({1, 5}, {2})), sc); },
                 {"scale_rows", "rows[1] = 5"});
    expect_error([&] { ctx->scale_rows(x, ctx->to_device(cpu_tensor_i32({1}, {1})), sc); },
                 {"scale_rows", "for 1 rows"});
  }
}

// The loss head against tools/ref_dpace.py (float64): per objective the weights, per-row ce / kl, the normalised
// loss and dh. fp64 on "cpu64" (tolerance: summation order), fp32 on "cpu" (the dyadic inputs make the logits
// exact; the softmax and the products round at 2^-24).
TEST(DPace, GoldenLossAndGradient) {
  const std::string path = test::source_dir() + "/tests/golden/dpace/case.json";
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path << " is missing: python3 tools/ref_dpace.py writes it";
  const nlohmann::json g = nlohmann::json::parse(f);
  const int64_t H = g["H"], V = g["V"], B = g["block_size"], R = B * g["blocks"].get<int64_t>();
  const auto rows = g["rows"].get<std::vector<int32_t>>();
  const auto labels = g["labels"].get<std::vector<int32_t>>();
  const int64_t Rs = static_cast<int64_t>(rows.size());
  auto matrix = [](const nlohmann::json& m, int64_t r, int64_t c) {
    Tensor t = cpu_empty(DType::F64, {r, c});
    for (int64_t i = 0; i < r; ++i)
      for (int64_t k = 0; k < c; ++k) t.ptr<double>()[i * c + k] = m[i][k].get<double>();
    return t;
  };
  const Tensor h = matrix(g["h"], R, H), W = matrix(g["lm_head"], V, H), th = matrix(g["teacher_h"], Rs, H);
  int checked = 0;
  for (const char* dev : {"cpu64", "cpu"}) {
    auto ctx = make_context(dev, {.threads = 2});
    const DType dt = ctx->compute_dtype();
    const double tol = dt == DType::F64 ? 1e-12 : 2e-6;
    for (const auto& [name, o] : g["objectives"].items()) {
      const bool dpace = o["kind"] == "dpace";
      const double alpha = dpace ? o["alpha"].get<double>() : 0.0, klw = o["kl_weight"];
      const auto w_ref = o["w"].get<std::vector<double>>();
      const double norm = o["normaliser"];
      LossArgs a;
      a.h = ctx->to_device(h, dt);
      a.lm_head = ctx->to_device(W, dt);
      a.rows = ctx->to_device(cpu_tensor_i32(rows, {Rs}));
      a.labels = ctx->to_device(cpu_tensor_i32(labels, {Rs}));
      // decay: the batch's weights (exp(-(i-1)/gamma) in F32, as model/draft_batch.h stores them); D-PACE: m = 1
      std::vector<float> given(static_cast<size_t>(Rs), 1.0f);
      if (!dpace)
        for (size_t r = 0; r < given.size(); ++r) given[r] = static_cast<float>(w_ref[r]);
      a.weights = ctx->to_device(cpu_tensor(given, {Rs}));
      a.teacher_h = klw > 0 ? ctx->to_device(th, dt) : Tensor{};
      a.kl_weight = static_cast<float>(klw);
      a.grad_scale = static_cast<float>(1.0 / norm);
      a.chunk_rows = 4;  // several chunks: D-PACE's blocks straddle them
      a.dh = ctx->zeros(dt, {R, H});
      const LossHeadOut out = loss_head(*ctx, a, alpha, B);
      const std::string what = cat(dev, " ", name);
      // the decay weights are the F32 ones given; D-PACE's are computed in float64 from the backend's ce
      const double wtol = dpace ? tol : 1e-7;
      ASSERT_EQ(out.w.size(), w_ref.size()) << what;
      for (size_t r = 0; r < w_ref.size(); ++r) {
        EXPECT_NEAR(out.w[r], w_ref[r], wtol * std::fabs(w_ref[r])) << what << " w[" << r << "]";
        EXPECT_NEAR(out.stats.ce[r], o["ce"][r].get<double>(), tol * 10) << what << " ce[" << r << "]";
        if (klw > 0) {
          EXPECT_NEAR(out.stats.kl[r], o["kl"][r].get<double>(), tol * 10) << what << " kl[" << r << "]";
        }
      }
      // the loss as the trainer forms it: (sum w ce + kl_weight sum w kl) / the normaliser
      const double loss = (out.ce_sum + klw * out.kl_sum) / norm, loss_ref = o["loss"];
      EXPECT_NEAR(loss, loss_ref, std::max(tol, wtol) * 10 * loss_ref) << what << " loss";
      const std::vector<double> dh = test::to_f64(ctx->to_host(a.dh));
      std::vector<double> dh_ref;
      for (const auto& row : o["dh"])
        for (const auto& v : row) dh_ref.push_back(v.get<double>());
      // LossArgs::grad_scale (1 / the normaliser) is an F32: a relative rounding of up to 2^-24 in every backend
      const double e = test::rel_err(dh, dh_ref), dtol = std::max({tol, wtol, 1e-7}) * 10;
      EXPECT_LT(e, dtol) << what << " dh: relative error " << e;
      for (int64_t r = 0; r < R; ++r) {  // rows without loss keep their zero gradient
        if (std::find(rows.begin(), rows.end(), r) != rows.end()) continue;
        for (int64_t c = 0; c < H; ++c) EXPECT_EQ(dh[r * H + c], 0.0) << what << " row " << r;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 6);
}

// D-PACE's loss head refuses weights that are not the mask: the weights it computes would silently replace them.
TEST(DPace, LossHeadWantsTheMaskAsWeights) {
  auto ctx = make_context("cpu", {.threads = 1});
  LossArgs a;
  a.h = test::randn({4, 3}, 1);
  a.lm_head = test::randn({5, 3}, 2);
  a.rows = cpu_tensor_i32({1, 2}, {2});
  a.labels = cpu_tensor_i32({0, 4}, {2});
  a.weights = cpu_tensor(std::vector<float>{1.0f, 0.5f}, {2});
  expect_error([&] { loss_head(*ctx, a, 0.5, 4); }, {"mask", "weights[1] = 0.5"});
}
