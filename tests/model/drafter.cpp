// tests/model/drafter.cpp
// Tests of the drafter's forward/backward (fp64 finite differences), recompute, the draft batch rules (C08, C09),
// the inference cache path and the checkpoint JSON of its config.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "model/draft_batch.h"
#include "model/drafter.h"
#include "common/drafter_fixture.h"
#include "common/test_util.h"
#include "model/draft_batch.h"

using namespace dflash;
using dflash::test::randn;
using dflash::test::to_f64;

namespace {

using test::expect_fd_gradients;
using Fixture = test::DrafterFixture;
DrafterConfig tiny_config() { return test::tiny_drafter_config(); }

}  // namespace


TEST(Drafter, GradientsMatchFiniteDifferencesInFp64) {
  Fixture f("cpu64");
  expect_fd_gradients(f, std::getenv("KL") ? std::atof(std::getenv("KL")) : 0.3f);
}

// Sliding-window layers (spec 2.3): layer 0 slides with W 3, layer 1 is full. The window reaches the attention of
// both passes (the gradients match the loss), and it changes the loss (it is not ignored).
TEST(Drafter, SlidingWindowLayersGradientsMatchAndTheWindowApplies) {
  DrafterConfig c = tiny_config();
  c.layer_types = {"sliding_attention", "full_attention"};
  c.sliding_window = 3;
  c.validate();
  EXPECT_EQ(c.window_of(0), 3);
  EXPECT_EQ(c.window_of(1), 0);
  Fixture f("cpu64", c);
  expect_fd_gradients(f, 0.3f);
  Fixture full("cpu64");
  EXPECT_GT(std::fabs(f.loss(0.3f) - full.loss(0.3f)), 1e-6);
}

TEST(DrafterConfig, LayerTypesFromTheCommandLine) {
  EXPECT_TRUE(resolve_layer_types({}, 3, 0).empty());
  EXPECT_EQ(resolve_layer_types({}, 2, 512), (std::vector<std::string>{"sliding_attention", "sliding_attention"}));
  EXPECT_EQ(resolve_layer_types({"sliding", "full_attention"}, 2, 64),
            (std::vector<std::string>{"sliding_attention", "full_attention"}));
  EXPECT_TRUE(resolve_layer_types({"full", "full"}, 2, 64).empty());  // no sliding layer: all full
  EXPECT_THROW(resolve_layer_types({"sliding"}, 2, 64), Error);      // one type per layer
  EXPECT_THROW(resolve_layer_types({"sliding", "full"}, 2, 0), Error);  // sliding without a window
  EXPECT_THROW(resolve_layer_types({"local", "full"}, 2, 64), Error);
  DrafterConfig c = tiny_config();
  c.layer_types = {"sliding_attention", "full_attention"};
  EXPECT_THROW(c.validate(), Error);  // sliding_window 0
  c.sliding_window = 8;
  EXPECT_NO_THROW(c.validate());
  c.layer_types = {"sliding_attention"};
  EXPECT_THROW(c.validate(), Error);  // 1 type for 2 layers
}

// The config as checkpoints store it: these exact bytes, and a checkpoint without the keys later versions added
// (YaRN's, layer_types, sliding_window) loads with their defaults.
TEST(DrafterConfig, CheckpointJsonBytesAndOlderKeys) {
  DrafterConfig c = tiny_config();
  c.max_position_embeddings = 128;
  c.rope_scaling.kind = "yarn";
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 64;
  c.rope_scaling.truncate = false;
  c.layer_types = {"sliding_attention", "full_attention"};
  c.sliding_window = 5;
  const nlohmann::json j = c;
  EXPECT_EQ(j.dump(),
            R"({"block_size":4,"embed_scale":0.0,"head_dim":8,"hidden_size":16,"intermediate_size":24,)"
            R"("layer_types":["sliding_attention","full_attention"],"mask_token_id":39,"max_position_embeddings":128,)"
            R"("num_heads":4,"num_kv_heads":2,"num_layers":2,"num_target_layers":4,"rms_norm_eps":1e-06,)"
            R"("rope_scaling":{"attention_factor":0.0,"beta_fast":32.0,"beta_slow":1.0,"factor":4.0,)"
            R"("high_freq_factor":4.0,"kind":"yarn","low_freq_factor":1.0,"mscale":0.0,"mscale_all_dim":0.0,)"
            R"("original_max_position_embeddings":64,"truncate":false},"rope_theta":100.0,"sliding_window":5,)"
            R"("target_layer_ids":[0,2],"vocab_size":40})");
  EXPECT_EQ(nlohmann::json(j.get<DrafterConfig>()), j);

  nlohmann::json old = j;
  old.erase("layer_types");
  old.erase("sliding_window");
  old.erase("embed_scale");  // checkpoints before Gemma targets
  for (const char* k : {"beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim"})
    old["rope_scaling"].erase(k);
  const DrafterConfig o = old.get<DrafterConfig>();
  EXPECT_TRUE(o.layer_types.empty());
  EXPECT_EQ(o.sliding_window, 0);
  EXPECT_EQ(o.embed_scale, 0.0);
  RopeScaling want;  // the keys the older checkpoint has, the struct's defaults for the rest (truncate true)
  want.kind = "yarn";
  want.factor = 4.0;
  want.original_max_position_embeddings = 64;
  EXPECT_EQ(nlohmann::json(o.rope_scaling), nlohmann::json(want));
  old.erase("rope_theta");  // a key every checkpoint has is required
  EXPECT_THROW(old.get<DrafterConfig>(), nlohmann::json::out_of_range);
  old = j;
  old["rope_scaling"].erase("factor");
  EXPECT_THROW(old.get<DrafterConfig>(), nlohmann::json::out_of_range);
}

// embed_scale (a Gemma target's sqrt(H)): the drafter embeds its block tokens times the scale, i.e. it computes what
// the same drafter without a scale computes on the embedding table times the scale (8: exact in every dtype).
TEST(Drafter, EmbedScaleEqualsAScaledTable) {
  DrafterConfig scaled = test::tiny_drafter_config();
  scaled.embed_scale = 8.0;
  Fixture a("cpu64", scaled), b("cpu64");
  const std::vector<double> e = to_f64(b.embed);
  Tensor t = cpu_empty(DType::F64, b.embed.shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<double>()[i] = 8.0 * e[static_cast<size_t>(i)];
  b.embed = b.ctx->to_device(t, b.ctx->compute_dtype());
  EXPECT_EQ(to_f64(a.drafter->forward_hidden(*a.ctx, a.in, a.embed)),
            to_f64(b.drafter->forward_hidden(*b.ctx, b.in, b.embed)));
  EXPECT_NE(to_f64(a.drafter->forward_hidden(*a.ctx, a.in, a.embed)),
            to_f64(b.drafter->forward_hidden(*b.ctx, b.in, a.embed)));  // the scale matters
  EXPECT_EQ(a.loss(0.0f), b.loss(0.0f));
}

TEST(Drafter, RecomputeGivesIdenticalGradients) {  // case C06
  Fixture f("cpu");
  const float scale = static_cast<float>(1.0 / f.batch.sum_w);
  f.drafter->params().zero_grad(*f.ctx);
  auto a = f.drafter->forward_backward(*f.ctx, f.in, f.embed, f.lm_head, 0.f, scale, true, false);
  std::vector<std::vector<double>> g1;
  for (auto& p : f.drafter->params().all()) g1.push_back(to_f64(p.grad));
  f.drafter->params().zero_grad(*f.ctx);
  auto b = f.drafter->forward_backward(*f.ctx, f.in, f.embed, f.lm_head, 0.f, scale, true, true);
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  size_t k = 0;
  for (auto& p : f.drafter->params().all()) EXPECT_EQ(to_f64(p.grad), g1[k++]) << p.name;
}

// D-PACE through the whole drafter (fp64): the batch carries the mask m as weights and the row count as normaliser,
// and the gradients equal those of the fixed-weight path run with D-PACE's weights (they are detached: arXiv
// 2605.18810 Eq. 9), whose gradients the finite-difference test above checks; with and without the KL term.
TEST(Drafter, DPaceGradientsAreTheFixedWeightGradientsOfItsWeights) {
  for (float kl : {0.0f, 0.3f}) {
    Fixture d("cpu64", tiny_config(), 0.5);
    ASSERT_EQ(d.batch.sum_w, static_cast<double>(d.batch.rows.size()));
    for (float w : d.batch.weights) ASSERT_EQ(w, 1.0f);
    const float scale = static_cast<float>(1.0 / d.batch.sum_w);
    d.drafter->params().zero_grad(*d.ctx);
    const DraftStepStats a = d.drafter->forward_backward(*d.ctx, d.in, d.embed, d.lm_head, kl, scale, true);
    Fixture f("cpu64");  // the same drafter and inputs, fixed weights
    ASSERT_EQ(f.batch.rows, d.batch.rows);
    ASSERT_EQ(a.w.size(), f.batch.rows.size());
    double moved = 0;
    for (size_t r = 0; r < a.w.size(); ++r) {
      moved = std::max(moved, std::fabs(a.w[r] - f.batch.weights[r]));
      f.batch.weights[r] = static_cast<float>(a.w[r]);
    }
    EXPECT_GT(moved, 0.1) << "D-PACE's weights should differ from the decay's";
    f.in.weights = f.ctx->to_device(cpu_tensor(f.batch.weights, {static_cast<int64_t>(a.w.size())}));
    f.drafter->params().zero_grad(*f.ctx);
    const DraftStepStats b = f.drafter->forward_backward(*f.ctx, f.in, f.embed, f.lm_head, kl, scale, true);
    EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-7 * std::fabs(b.loss_sum)) << "kl " << kl;  // w rounded to F32 in b
    auto& fp = f.drafter->params().all();
    size_t k = 0;
    for (auto& p : d.drafter->params().all()) {
      const double e = dflash::test::rel_err(to_f64(p.grad), to_f64(fp[k++].grad));
      EXPECT_LT(e, 1e-6) << p.name << " kl " << kl;
    }
  }
}

TEST(DraftBatch, LabelAlignmentCaseC09) {
  std::vector<int32_t> x(40);
  for (int p = 0; p < 40; ++p) x[p] = p;
  std::vector<uint8_t> m(40, 1);
  std::vector<int32_t> anchors = {20};
  DraftBatch b = make_draft_batch(x, m, anchors, 1, 4, 99, 7.0);
  EXPECT_EQ(b.block_ids, (std::vector<int32_t>{20, 99, 99, 99}));
  EXPECT_EQ(b.block_pos, (std::vector<int32_t>{20, 21, 22, 23}));
  EXPECT_EQ(b.rows, (std::vector<int32_t>{1, 2, 3}));  // slot 0 carries no weight
  EXPECT_EQ(b.labels, (std::vector<int32_t>{21, 22, 23}));
  EXPECT_EQ(b.teacher_pos, (std::vector<int32_t>{20, 21, 22}));
  EXPECT_FLOAT_EQ(b.weights[0], 1.0f);
  EXPECT_FLOAT_EQ(b.weights[1], static_cast<float>(std::exp(-1.0 / 7.0)));
  EXPECT_FLOAT_EQ(b.weights[2], static_cast<float>(std::exp(-2.0 / 7.0)));
}

TEST(DraftBatch, CandidatesMaskAndPadding) {
  // loss mask 0 0 1 1 1 0 1 1 : candidates need m[a] = m[a+1] = 1 and a <= S-2
  std::vector<uint8_t> m = {0, 0, 1, 1, 1, 0, 1, 1};
  EXPECT_EQ(candidate_anchors(m), (std::vector<int32_t>{2, 3, 6}));
  std::vector<int32_t> x = {10, 11, 12, 13, 14, 15, 16, 17};
  std::vector<int32_t> anchors = {3, 6};
  DraftBatch b = make_draft_batch(x, m, anchors, 3, 4, 99, 0.0);  // uniform weights, one padding block
  EXPECT_EQ(b.valid, (std::vector<uint8_t>{1, 1, 0}));
  // block 0 (a=3): slots 1..3 -> positions 4 (m=1), 5 (m=0), 6 (m=1); block 1 (a=6): slot 1 -> 7, slots 2,3 past S
  EXPECT_EQ(b.rows, (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(b.labels, (std::vector<int32_t>{14, 16, 17}));
  EXPECT_DOUBLE_EQ(b.sum_w, 3.0);
  Rng rng(1, RngPurpose::Anchors);
  auto s = sample_anchors(m, 2, rng);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_LT(s[0], s[1]);
  EXPECT_TRUE(sample_anchors(std::vector<uint8_t>{1, 0, 1, 0}, 4, rng).empty());
}

TEST(Drafter, NoContextLeakCaseC08) {
  // B = 4, anchors at 10 and 12, S = 32: block j's output must not depend on any context feature at k >= a_j,
  // and must depend on the one at a_j - 1.
  DrafterConfig cfg = tiny_config();
  auto ctx = make_context("cpu64");
  Drafter d(*ctx, cfg, 7, 0.3);
  const int64_t S = 32, H = cfg.hidden_size;
  std::vector<int32_t> x(S);
  for (int p = 0; p < S; ++p) x[p] = p % 30;
  std::vector<uint8_t> m(S, 1);
  std::vector<int32_t> anchors = {10, 12};
  DraftBatch b = make_draft_batch(x, m, anchors, 2, 4, cfg.mask_token_id, 7.0);
  Tensor embed = randn({cfg.vocab_size, H}, 1, 1.0, DType::F64);
  Tensor F = randn({S, cfg.nf() * H}, 2, 1.0, DType::F64);
  auto run = [&](const Tensor& feats) { return to_f64(d.forward_hidden(*ctx, upload_draft_batch(*ctx, b, feats), embed)); };
  const std::vector<double> base = run(F);
  auto block_diff = [&](const std::vector<double>& o, int j) {
    double m2 = 0;
    for (int64_t r = j * 4; r < (j + 1) * 4; ++r)
      for (int64_t c = 0; c < H; ++c) m2 = std::max(m2, std::fabs(o[r * H + c] - base[r * H + c]));
    return m2;
  };
  for (int64_t k : {10, 11, 12, 20, 31}) {
    Tensor G = cpu_clone(F);
    for (int64_t c = 0; c < cfg.nf() * H; ++c) G.ptr<double>()[k * cfg.nf() * H + c] += 5.0;
    auto o = run(G);
    if (k >= 10) {
      EXPECT_EQ(block_diff(o, 0), 0.0) << "block 0 (anchor 10) sees context position " << k;
    }
    if (k >= 12) {
      EXPECT_EQ(block_diff(o, 1), 0.0) << "block 1 (anchor 12) sees context position " << k;
    }
    if (k == 11) {
      EXPECT_GT(block_diff(o, 1), 1e-6) << "block 1 must see position 11";
    }
  }
  Tensor G = cpu_clone(F);
  for (int64_t c = 0; c < cfg.nf() * H; ++c) G.ptr<double>()[9 * cfg.nf() * H + c] += 5.0;
  EXPECT_GT(block_diff(run(G), 0), 1e-6) << "block 0 must see position 9";
}

DrafterConfig sliding_config() {  // every layer a sliding-window layer, W 3
  DrafterConfig c = tiny_config();
  c.layer_types = {"sliding_attention", "sliding_attention"};
  c.sliding_window = 3;
  return c;
}

// One sequence of S tokens with random embeddings and features, and the draft batch of one block at anchor p.
struct OneBlock {
  Tensor embed, F;
  std::vector<int32_t> x;
  DraftBatch b;
};
OneBlock one_block(const DrafterConfig& cfg, int64_t S, int64_t p) {
  OneBlock o;
  o.embed = randn({cfg.vocab_size, cfg.hidden_size}, 1, 1.0, DType::F64);
  o.F = randn({S, cfg.nf() * cfg.hidden_size}, 2, 1.0, DType::F64);
  o.x.resize(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) o.x[i] = static_cast<int32_t>((i * 5) % 37);
  const std::vector<uint8_t> m(static_cast<size_t>(S), 1);
  const std::vector<int32_t> anchors = {static_cast<int32_t>(p)};
  o.b = make_draft_batch(o.x, m, anchors, 1, cfg.block_size, cfg.mask_token_id, 7.0);
  return o;
}

TEST(Drafter, CachedDraftEqualsFullForward) {
  // The inference path (context K/V cached incrementally, one block at anchor p = cache length) must give the
  // same hidden states as the training forward with anchor p over a context of length p; with full and with
  // sliding-window layers.
  for (const DrafterConfig& cfg : {tiny_config(), sliding_config()}) {
    SCOPED_TRACE(cfg.sliding_window ? "sliding window" : "full attention");
    auto ctx = make_context("cpu64");
    Drafter d(*ctx, cfg, 11, 0.3);
    const int64_t S = 30, p = 17;
    const auto [embed, F, x, b] = one_block(cfg, S, p);
    auto full = to_f64(d.forward_hidden(*ctx, upload_draft_batch(*ctx, b, F), embed));
    auto cache = d.make_cache(*ctx, S);
    d.extend_cache(*ctx, cache, F.slice(0, 5));
    d.extend_cache(*ctx, cache, F.slice(5, p));
    auto inc = to_f64(d.draft_block(*ctx, cache, x[p], embed));
    ASSERT_EQ(inc.size(), full.size());
    for (size_t i = 0; i < inc.size(); ++i) EXPECT_NEAR(inc[i], full[i], 1e-12) << i;
  }
}

TEST(Drafter, SlidingWindowLayersSeeOnlyTheWindow) {
  // W 3 in every layer: the block at anchor a sees context positions a-2 and a-1 (slot 0's window; later slots see
  // less, and reach no further through the block's own causal keys), never a-3 or anything earlier.
  DrafterConfig cfg = sliding_config();
  auto ctx = make_context("cpu64");
  Drafter d(*ctx, cfg, 11, 0.3);
  const int64_t S = 30, H = cfg.hidden_size, a = 17;
  const auto [embed, F, x, b] = one_block(cfg, S, a);
  const auto base = to_f64(d.forward_hidden(*ctx, upload_draft_batch(*ctx, b, F), embed));
  for (int64_t k : {0, 10, 14, 15, 16}) {
    Tensor G = cpu_clone(F);
    for (int64_t c = 0; c < cfg.nf() * H; ++c) G.ptr<double>()[k * cfg.nf() * H + c] += 5.0;
    const auto o = to_f64(d.forward_hidden(*ctx, upload_draft_batch(*ctx, b, G), embed));
    double diff = 0;
    for (size_t i = 0; i < o.size(); ++i) diff = std::max(diff, std::fabs(o[i] - base[i]));
    if (k < a - 2)
      EXPECT_EQ(diff, 0.0) << "context position " << k << " is outside the window of the block at " << a;
    else
      EXPECT_GT(diff, 1e-6) << "context position " << k << " is inside the window of the block at " << a;
  }
}
