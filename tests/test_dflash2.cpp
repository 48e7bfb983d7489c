// tests/test_dflash2.cpp — DFlash2 (docs/spec.md 1.1-1.2): the grouped dynamic convolution and the candidate
// selector against hand-computed values and finite differences, the lm_head loss's top-k, the DFlash2 drafter's
// gradients (fp64 finite differences), its identity start, its greedy path, its config checks and its export.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/export.h"
#include "test_util.h"
#include "train/draft_batch.h"
#include "train_fixtures.h"  // tiny training runs

using namespace dflash;
using dflash::test::randn;
using dflash::test::to_f64;

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

// The candidates: the topk largest logits of each row in descending order, ties to the lower id.
TEST(LmHeadLossTopK, CandidatesAreTheLargestLogitsTiesToTheLowerId) {
  auto ctx = make_context("cpu");
  const int64_t V = 12, H = 2, K = 4;
  // lm_head rows [v, 0] with h = [1, 0]: logit v = w[v] (ties: ids 3, 7 and 9 share the largest value)
  std::vector<float> w = {0, 1, 2, 5, -1, 4, 3, 5, 0, 5, 2, 1}, lm(V * H, 0.0f);
  for (int64_t v = 0; v < V; ++v) lm[v * H] = w[v];
  LossArgs la;
  la.h = cpu_tensor(std::vector<float>{1, 0}, {1, H});
  la.lm_head = cpu_tensor(lm, {V, H});
  la.rows = cpu_tensor_i32({0}, {1});
  la.labels = cpu_tensor_i32({5}, {1});
  la.weights = cpu_tensor(std::vector<float>{1}, {1});
  la.topk = K;
  la.topk_ids = cpu_empty(DType::I32, {1, K});
  la.topk_logits = cpu_empty(DType::F32, {1, K});
  LossStats st = ctx->lm_head_loss(la);
  const int32_t* ids = la.topk_ids.ptr<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(ids, ids + K), (std::vector<int32_t>{3, 7, 9, 5}));
  const float* z = la.topk_logits.ptr<float>();
  EXPECT_EQ(std::vector<float>(z, z + K), (std::vector<float>{5, 5, 5, 4}));
  EXPECT_EQ(st.correct[0], 0);  // argmax 3, label 5
}

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

namespace {

DrafterConfig tiny_dflash2() {
  DrafterConfig c;
  c.arch = DraftArch::DFlash2;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 40;
  c.block_size = 4;
  c.target_layer_ids = {0, 2};
  c.num_target_layers = 4;
  c.mask_token_id = 39;
  c.rope_theta = 100.0;
  c.conv_kernel_size = 2;
  c.conv_group_size = 4;
  c.selector_rank = 6;
  c.selector_top_k = 5;
  return c;
}

struct D2Fixture {
  std::unique_ptr<Context> ctx;
  DrafterConfig cfg;
  std::unique_ptr<Drafter> drafter;
  Tensor embed, lm_head, features, teacher;
  DraftBatch batch;
  DraftInputs in;
  D2Fixture(const std::string& device, DrafterConfig c, double dpace_alpha = 0, bool perturb = true)
      : cfg(std::move(c)) {
    ctx = make_context(device, {.threads = 2});
    const DType dt = ctx->compute_dtype();
    drafter = std::make_unique<Drafter>(*ctx, cfg, 1234, 0.3);
    int idx = 0;
    if (perturb)  // every parameter away from its init (the identity convolutions, the zero successor codebook)
      for (auto& p : drafter->params().all()) {
        Tensor t = randn(p.shape, 700 + idx++, p.shape.size() == 1 ? 0.2 : 0.15, DType::F64);
        const std::vector<double> m = to_f64(p.master);
        for (int64_t i = 0; i < t.numel(); ++i) t.ptr<double>()[i] += m[i];
        ctx->copy(p.master, ctx->to_device(t, p.master.dtype));
      }
    const int64_t S = 21, H = cfg.hidden_size, V = cfg.vocab_size;
    embed = ctx->to_device(randn({V, H}, 1, 1.0, DType::F64), dt);
    lm_head = ctx->to_device(randn({V, H}, 2, 0.5, DType::F64), dt);
    features = ctx->to_device(randn({S, cfg.nf() * H}, 3, 1.0, DType::F64), dt);
    teacher = ctx->to_device(randn({S, H}, 4, 1.0, DType::F64), dt);
    std::vector<int32_t> tokens(S);
    std::vector<uint8_t> mask(S, 0);
    for (int64_t p = 0; p < S; ++p) tokens[p] = static_cast<int32_t>((p * 7 + 3) % 38);
    for (int64_t p = 5; p < S; ++p) mask[p] = p == 11 ? 0 : 1;
    std::vector<int32_t> anchors = {5, 8, 12, 18};
    batch = make_draft_batch(tokens, mask, anchors, 5, cfg.block_size, cfg.mask_token_id, 7.0, dpace_alpha);
    in = upload_draft_batch(*ctx, batch, features, teacher);
    drafter->params().sync_compute(*ctx);
  }
  float alpha = 1.0f;  // the selector loss's weight
  double loss(float kl) {
    drafter->params().sync_compute(*ctx);
    auto st = drafter->forward_backward(*ctx, in, embed, lm_head, kl, 1.0f, false, false, alpha);
    return st.loss_sum / batch.sum_w;
  }
};

void expect_fd_gradients(D2Fixture& f, float kl) {
  SCOPED_TRACE(testing::Message() << "alpha " << f.alpha << " kl " << kl << " dpace " << f.batch.dpace_alpha);
  f.drafter->params().zero_grad(*f.ctx);
  f.drafter->forward_backward(*f.ctx, f.in, f.embed, f.lm_head, kl, static_cast<float>(1.0 / f.batch.sum_w), true,
                              false, f.alpha);
  Rng pick(9, RngPurpose::Test);
  for (auto& p : f.drafter->params().all()) {
    std::vector<double> g = to_f64(p.grad);
    if (f.alpha == 0 && p.name.rfind("candidate_selector.", 0) == 0) continue;  // no selector loss, no gradient
    ASSERT_GT(dflash::test::max_abs(g), 1e-8) << p.name << " has an all-zero gradient";
    double* w = p.master.ptr<double>();
    // the codebooks' gradients are sparse (the rows of the predecessors and candidates): check those rows
    std::vector<int64_t> nz;
    for (int64_t i = 0; i < p.master.numel(); ++i)
      if (g[i] != 0) nz.push_back(i);
    const int checks = std::min<int64_t>(static_cast<int64_t>(nz.size()), 12);
    for (int c = 0; c < checks; ++c) {
      const int64_t i = nz[pick.below(static_cast<uint64_t>(nz.size()))];
      const double w0 = w[i], h = 1e-5;
      w[i] = w0 + h;
      const double lp = f.loss(kl);
      w[i] = w0 - h;
      const double lm = f.loss(kl);
      w[i] = w0;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-7 + 1e-5 * std::fabs(fd)) << p.name << "[" << i << "]";
    }
  }
}

}  // namespace

// Every parameter's gradient (backbone, convolutions, selector) against central differences, with the KL term and
// the decayed weights, and with D-PACE's weights.
TEST(DFlash2Drafter, GradientsMatchFiniteDifferencesInFp64) {
  D2Fixture c("cpu64", tiny_dflash2());
  c.alpha = 0;  // the backbone and its convolutions alone
  expect_fd_gradients(c, 0.3f);
  D2Fixture f("cpu64", tiny_dflash2());
  expect_fd_gradients(f, 0.3f);
}

// With D-PACE the weights come from the forward and are detached (spec 2.4): the gradients, the selector's included,
// are those of the same drafter with those weights fixed.
TEST(DFlash2Drafter, DPaceGradientsAreTheFixedWeightGradientsOfItsWeights) {
  D2Fixture d("cpu64", tiny_dflash2(), 0.5);
  const float scale = static_cast<float>(1.0 / d.batch.sum_w);
  d.drafter->params().zero_grad(*d.ctx);
  const DraftStepStats a = d.drafter->forward_backward(*d.ctx, d.in, d.embed, d.lm_head, 0.3f, scale, true);
  D2Fixture f("cpu64", tiny_dflash2());
  ASSERT_EQ(a.w.size(), f.batch.rows.size());
  for (size_t r = 0; r < a.w.size(); ++r) f.batch.weights[r] = static_cast<float>(a.w[r]);
  f.in.weights = f.ctx->to_device(cpu_tensor(f.batch.weights, {static_cast<int64_t>(a.w.size())}));
  f.drafter->params().zero_grad(*f.ctx);
  const DraftStepStats b = f.drafter->forward_backward(*f.ctx, f.in, f.embed, f.lm_head, 0.3f, scale, true);
  EXPECT_GT(a.sel_sum, 0.0);
  EXPECT_NEAR(a.sel_sum, b.sel_sum, 1e-6 * b.sel_sum);  // w rounded to F32 in b
  auto& fp = f.drafter->params().all();
  size_t k = 0;
  for (auto& p : d.drafter->params().all())
    EXPECT_LT(dflash::test::rel_err(to_f64(p.grad), to_f64(fp[k++].grad)), 1e-6) << p.name;
}

// Recompute (case C06) gives the gradients of the stored forward.
TEST(DFlash2Drafter, RecomputeGivesTheSameGradients) {
  D2Fixture f("cpu64", tiny_dflash2());
  const float gs = static_cast<float>(1.0 / f.batch.sum_w);
  f.drafter->params().zero_grad(*f.ctx);
  f.drafter->forward_backward(*f.ctx, f.in, f.embed, f.lm_head, 0.3f, gs, true, false);
  std::vector<std::vector<double>> g1;
  for (auto& p : f.drafter->params().all()) g1.push_back(to_f64(p.grad));
  f.drafter->params().zero_grad(*f.ctx);
  f.drafter->forward_backward(*f.ctx, f.in, f.embed, f.lm_head, 0.3f, gs, true, true);
  size_t i = 0;
  for (auto& p : f.drafter->params().all()) EXPECT_EQ(to_f64(p.grad), g1[i++]) << p.name;
}

// At init the convolutions are the identity and the selector's transition is zero (successor codebook 0): the
// backbone's output is the DFlash drafter's of the same seed, and the selector's path is the argmax of the logits.
TEST(DFlash2Drafter, StartsAsTheDFlashDrafterOfTheSameSeed) {
  DrafterConfig c1 = tiny_dflash2();
  c1.arch = DraftArch::DFlash;
  D2Fixture a("cpu64", tiny_dflash2(), 0, false), b("cpu64", c1, 0, false);
  Tensor h2 = a.drafter->forward_hidden(*a.ctx, a.in, a.embed), h1 = b.drafter->forward_hidden(*b.ctx, b.in, b.embed);
  EXPECT_EQ(to_f64(h2), to_f64(h1));
  // 2 selector tensors more than the DFlash drafter's, and 4 per layer
  EXPECT_EQ(a.drafter->params().all().size(), b.drafter->params().all().size() + 4 * 2 + 3);
  Tensor rows = h2.slice(1, 4);
  std::vector<int32_t> path = a.drafter->select_path(*a.ctx, rows, 7, a.lm_head);
  Tensor z = a.ctx->empty(DType::F64, {3, a.cfg.vocab_size});
  a.ctx->linear(rows, a.lm_head, nullptr, z);
  Tensor am = a.ctx->empty(DType::I32, {3});
  a.ctx->argmax(z, am);
  EXPECT_EQ(path, std::vector<int32_t>(am.ptr<int32_t>(), am.ptr<int32_t>() + 3));
}

// The greedy path (vLLM's dflash2 walk): slot 1 after the anchor's token, each later slot after the previous choice,
// the candidate of the largest pair score; against the scores computed here for each step alone.
TEST(DFlash2Drafter, SelectPathIsTheGreedyWalkOverPairScores) {
  D2Fixture f("cpu64", tiny_dflash2());
  // pair terms as large as the logits' gaps, so that they change choices
  for (const char* cb : {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"})
    for (double& x : f.drafter->params().get(cb).master.span<double>()) x *= 8;
  f.drafter->params().sync_compute(*f.ctx);
  const int64_t n = 3, K = f.cfg.selector_top_k, r = f.cfg.selector_rank, V = f.cfg.vocab_size;
  Tensor h = f.drafter->forward_hidden(*f.ctx, f.in, f.embed).slice(1, 1 + n);
  const int32_t anchor = 17;
  std::vector<int32_t> path = f.drafter->select_path(*f.ctx, h, anchor, f.lm_head);
  ASSERT_EQ(path.size(), static_cast<size_t>(n));
  const auto& ps = f.drafter->params();
  const double* W = ps.get("candidate_selector.hidden_projection.weight").master.ptr<double>();
  const double* P = ps.get("candidate_selector.predecessor_codebook").master.ptr<double>();
  const double* S = ps.get("candidate_selector.successor_codebook").master.ptr<double>();
  const double* L = f.lm_head.ptr<double>();
  const int64_t H = f.cfg.hidden_size;
  int32_t prev = anchor;
  bool differs_from_argmax = false;
  for (int64_t t = 0; t < n; ++t) {
    const double* ht = h.ptr<double>() + t * H;
    std::vector<double> z(V), gt(r);
    for (int64_t v = 0; v < V; ++v) {
      z[v] = 0;
      for (int64_t k = 0; k < H; ++k) z[v] += ht[k] * L[v * H + k];
    }
    for (int64_t q = 0; q < r; ++q) {
      gt[q] = 0;
      for (int64_t k = 0; k < H; ++k) gt[q] += W[q * H + k] * ht[k];
    }
    std::vector<int32_t> ids(V);
    for (int64_t v = 0; v < V; ++v) ids[v] = static_cast<int32_t>(v);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    int32_t best = -1;
    double bs = -1e300;
    for (int64_t j = 0; j < K; ++j) {
      double e = static_cast<float>(z[ids[j]]);
      for (int64_t q = 0; q < r; ++q) e += P[prev * r + q] * gt[q] * S[ids[j] * r + q];
      if (e > bs) bs = e, best = ids[j];
    }
    EXPECT_EQ(path[t], best) << "slot " << t + 1;
    differs_from_argmax |= best != ids[0];
    prev = best;
  }
  EXPECT_TRUE(differs_from_argmax) << "the pair scores never changed a choice: the case tests nothing";
}

// Bad shapes are refused naming the key and its value.
TEST(DFlash2Config, RefusesAGroupThatDoesNotDivideAndTooManyCandidates) {
  DrafterConfig c = tiny_dflash2();
  c.conv_group_size = 5;
  try {
    c.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv_group_size 5 does not divide hidden_size 16"), std::string::npos)
        << e.what();
  }
  c = tiny_dflash2();
  c.selector_top_k = 41;
  try {
    c.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("selector_top_k 41"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_draft_arch("dflash3", "--arch"), Error);
}

// The export is the served form vLLM's qwen3_dflash2.py loads: DFlash2DraftModel, the dflash_config keys, the conv
// and selector tensors under their published names and shapes; read back it is the same drafter.
TEST(DFlash2Export, PublishedNamesAndShapesAndRoundTrip) {
  D2Fixture f("cpu", tiny_dflash2());
  const std::string dir = (std::filesystem::temp_directory_path() / ("dflash2_export_" + std::to_string(getpid()))).string();
  export_drafter(*f.ctx, dir, f.cfg, f.drafter->params(), nlohmann::json::object());
  const auto j = nlohmann::json::parse(read_file(dir + "/config.json"));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"DFlash2DraftModel"}));
  const auto& dc = j["dflash_config"];
  EXPECT_EQ(dc["conv_kernel_size"], 2);
  EXPECT_EQ(dc["conv_group_size"], 4);
  EXPECT_EQ(dc["selector_rank"], 6);
  EXPECT_EQ(dc["selector_top_k"], 5);
  EXPECT_EQ(dc["block_size"], 4);
  EXPECT_FALSE(dc.contains("output_multiplier"));
  auto ws = WeightStore::open(dir + "/model.safetensors");
  const int64_t H = 16, V = 40, r = 6, coef = 2 * 2 * (16 / 4);
  EXPECT_EQ(ws.view("layers.1.attention_conv.base_kernel").shape, (Shape{2, 2, H}));
  EXPECT_EQ(ws.view("layers.1.mlp_conv.kernel_projection.weight").shape, (Shape{coef, H}));
  EXPECT_EQ(ws.view("candidate_selector.hidden_projection.weight").shape, (Shape{r, H}));
  EXPECT_EQ(ws.view("candidate_selector.predecessor_codebook").shape, (Shape{V, r}));
  EXPECT_EQ(ws.view("candidate_selector.successor_codebook").shape, (Shape{V, r}));
  EXPECT_EQ(ws.view("layers.0.self_attn.q_proj.weight").shape, (Shape{32, H}));
  auto back = load_exported_drafter(*f.ctx, dir);
  EXPECT_TRUE(back->config().dflash2());
  EXPECT_EQ(back->config().selector_top_k, 5);
  // every tensor is the bf16 rounding of the trained one
  for (const Param& p : f.drafter->params().all()) {
    std::vector<double> want = to_f64(p.master);
    for (double& x : want) x = round_bf16(static_cast<float>(x));
    EXPECT_EQ(to_f64(back->params().get(p.name).master), want) << p.name;
  }
  // the served options this trainer does not compute are refused by name
  auto cfg = j;
  cfg["dflash_config"]["output_multiplier"] = 0.5;
  write_file_atomic(dir + "/config.json", cfg.dump());
  EXPECT_THROW(read_exported_drafter(dir), Error);
  std::filesystem::remove_all(dir);
}

// ---- training runs (train_fixtures.h: the tiny Qwen3 golden target on a learnable toy set) ---------------------


// A DFlash2 run learns: the cross-entropy falls, the EAL (the selector's teacher-forced choices) and the share of
// labels among the candidates rise (TrainLoop.LossFallsAndEalRises' run, with D-PACE, the default objective).
TEST(DFlash2Train, CrossEntropyFallsAndEalAndRecallRise) {
  const std::string root = test::train_tmpdir("d2learn");
  TrainConfig c = test::tiny_train_config(root, test::make_train_data(root));
  c.arch = "dflash2";
  c.conv_group_size = 8;
  c.selector_rank = 16;
  c.selector_top_k = 8;
  c.threads = 2;
  c.batch_size = 2;
  c.max_steps = 300;
  c.optim.lr = 1e-2;
  c.optim.warmup_ratio = 0.02;
  train(c);
  auto m = test::read_metrics_jsonl(c.out_dir);
  ASSERT_EQ(m.size(), 300u);
  ASSERT_TRUE(m[0].contains("sel_loss") && m[0].contains("sel_recall"));
  auto mean = [&](size_t b, size_t e, const char* k) {
    double s = 0;
    for (size_t i = b; i < e; ++i) s += m[i][k].get<double>();
    return s / static_cast<double>(e - b);
  };
  EXPECT_LT(mean(280, 300, "ce"), 0.75 * mean(0, 20, "ce"));
  EXPECT_GT(mean(280, 300, "eal"), mean(0, 20, "eal") + 0.3);
  EXPECT_GT(mean(280, 300, "sel_recall"), mean(0, 20, "sel_recall") + 0.2);
  std::filesystem::remove_all(root);
}

// 2 target + 2 drafter workers give the DFlash2 run of one of each (the selector's codebook gradients are summed
// like every other gradient; ZeRO-1 shards them).
TEST(DFlash2Train, TwoPlusTwoMatchesOneWorker) {
  const std::string root = test::train_tmpdir("d2pipe");
  TrainConfig one = test::tiny_train_config(root, test::make_train_data(root));
  one.arch = "dflash2";
  one.conv_group_size = 8;
  one.selector_rank = 16;
  one.selector_top_k = 8;
  one.max_steps = 12;
  one.out_dir = root + "/one";
  train(one);
  test::expect_two_plus_two_as_one(one, root + "/two", "dflash2");
  std::filesystem::remove_all(root);
}

// A DFlash2 checkpoint is not continued as DFlash (nor the reverse): the refusal names --arch.
TEST(DFlash2Train, ResumeAsAnotherArchIsRefusedNamingArch) {
  const std::string root = test::train_tmpdir("d2resume");
  TrainConfig c = test::tiny_train_config(root, test::make_train_data(root, 8));
  c.arch = "dflash2";
  c.conv_group_size = 8;
  c.selector_rank = 16;
  c.selector_top_k = 8;
  c.max_steps = 4;
  c.stop_after = 2;
  train(c);
  c.stop_after = 0;
  c.resume = true;
  c.arch = "dflash";
  try {
    train(c);
    FAIL() << "resume of a dflash2 checkpoint as dflash must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--arch dflash2"), std::string::npos) << e.what();
  }
  c.arch = "dflash2";
  c.selector_top_k = 4;
  EXPECT_THROW(train(c), Error);
  c.selector_top_k = 8;
  TrainSummary s = train(c);  // the same settings continue
  EXPECT_EQ(s.steps_done, 4);
  std::filesystem::remove_all(root);
}
