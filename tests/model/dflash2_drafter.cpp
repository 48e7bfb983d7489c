// tests/model/dflash2_drafter.cpp — the DFlash2 drafter (model/drafter.h, docs/spec.md 1.1-1.2): its gradients
// (fp64 finite differences; D-PACE's detached weights; recompute), its identity start, its greedy path, its config
// checks and its export in vLLM's DFlash2DraftModel form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "common/drafter_fixture.h"
#include "common/test_util.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/export.h"
#include "model/draft_batch.h"

using namespace dflash;
using dflash::test::randn;
using dflash::test::expect_fd_gradients;
using dflash::test::to_f64;

namespace {

DrafterConfig tiny_dflash2() {
  DrafterConfig c = test::tiny_drafter_config();
  c.arch = DraftArch::DFlash2;
  c.conv_kernel_size = 2;
  c.conv_group_size = 4;
  c.selector_rank = 6;
  c.selector_top_k = 5;
  return c;
}

// The tiny drafter fixture with every parameter perturbed (or as initialised)
struct D2Fixture : test::DrafterFixture {
  D2Fixture(const std::string& device, DrafterConfig c, double dpace_alpha = 0, bool perturb = true)
      : DrafterFixture(device, std::move(c), dpace_alpha, perturb ? Perturb::All : Perturb::None) {}
};

}  // namespace

// Every parameter's gradient (backbone, convolutions, selector) against central differences, with the KL term and
// the decayed weights, and with D-PACE's weights.
TEST(DFlash2Drafter, GradientsMatchFiniteDifferencesInFp64) {
  D2Fixture c("cpu64", tiny_dflash2());
  c.selector_alpha = 0;  // the backbone and its convolutions alone
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
