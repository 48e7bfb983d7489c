// tests/train/drafter_init.cpp
// Starting the drafter from the target's layers (model/drafter_init.h): which target layers "next" picks,
// the errors for bad lists, that every copied tensor equals the target's (fc the selection of the last feature),
// and that the trainer applies it to every drafter replica, sharded optimizer included.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/context.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/drafter_init.h"
#include "common/test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "common/train_fixtures.h"

namespace dflash {
namespace {

DrafterConfig cfg_for(int64_t layers, std::vector<int64_t> ids, int64_t lt = 8) {
  DrafterConfig c;
  c.num_layers = layers;
  c.target_layer_ids = std::move(ids);
  c.num_target_layers = lt;
  return c;
}

TEST(DrafterInit, NextPicksTheLayersAfterTheLastCapturedOne) {
  EXPECT_EQ(resolve_init_layers("", cfg_for(1, {1, 2, 3, 4, 5})), (std::vector<int64_t>{}));
  EXPECT_EQ(resolve_init_layers("next", cfg_for(1, {1, 2, 3, 4, 5})), (std::vector<int64_t>{6}));
  EXPECT_EQ(resolve_init_layers("next", cfg_for(2, {1, 2, 3, 4, 5})), (std::vector<int64_t>{6, 7}));
  // would run past the last target layer: shifted down to end at it
  EXPECT_EQ(resolve_init_layers("next", cfg_for(3, {1, 2, 3, 4, 5})), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(resolve_init_layers("next", cfg_for(1, {1, 7})), (std::vector<int64_t>{7}));
  EXPECT_EQ(resolve_init_layers("3,0", cfg_for(2, {1, 2})), (std::vector<int64_t>{3, 0}));
  auto fails = [](const std::string& spec, const DrafterConfig& c, const std::string& what) {
    try {
      resolve_init_layers(spec, c);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails("6,x", cfg_for(2, {1}), "'x' in '6,x' is not a layer index");
  fails("8", cfg_for(1, {1}), "layer 8 is outside the target's layers 0..7");
  fails("5,6", cfg_for(1, {1}), "names 2 target layers, the drafter has 1");
  fails("next", cfg_for(9, {1}), "the drafter has 9 layers, the target only 8");
}

TEST(DrafterInit, CopiesTheTargetLayerAndSelectsTheLastFeature) {
  auto ctx = make_context("cpu", {.threads = 1});
  const std::string dir = test::source_dir() + "/tests/golden/target_qwen3";
  const ModelConfig tc = load_model_config(dir);
  DrafterConfig dc = DrafterConfig::for_target(tc, 1, 4, {0, 1}, 511);
  Drafter d(*ctx, dc, 3);
  const WeightStore ws = WeightStore::open(dir);
  const std::vector<int64_t> layers = resolve_init_layers("next", dc);
  ASSERT_EQ(layers, (std::vector<int64_t>{2}));
  init_drafter_from_target(*ctx, d.params(), dc, ws, layers, "last");
  auto same = [&](const std::string& mine, const std::string& theirs) {
    const std::vector<float> a = to_f32_vector(d.params().get(mine).master), b = to_f32_vector(ws.f32(theirs));
    ASSERT_EQ(a.size(), b.size()) << mine;
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << mine << " [" << i << "]";
    // the compute copy follows
    const std::vector<float> c = to_f32_vector(d.params().get(mine).compute);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(c[i], a[i]) << mine << " compute [" << i << "]";
  };
  for (const char* w : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                        "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
                        "mlp.up_proj.weight", "mlp.down_proj.weight"})
    same(std::string("layers.0.") + w, std::string("model.layers.2.") + w);
  same("hidden_norm.weight", "model.layers.2.input_layernorm.weight");
  same("norm.weight", "model.norm.weight");
  const int64_t H = dc.hidden_size, nf = dc.nf();
  const std::vector<float> fc = to_f32_vector(d.params().get("fc.weight").master);
  ASSERT_EQ(static_cast<int64_t>(fc.size()), H * nf * H);
  for (int64_t r = 0; r < H; ++r)
    for (int64_t c = 0; c < nf * H; ++c)
      ASSERT_EQ(fc[static_cast<size_t>(r * nf * H + c)], c == (nf - 1) * H + r ? 1.f : 0.f) << r << "," << c;
  // a mode that does not exist
  EXPECT_THROW(init_drafter_from_target(*ctx, d.params(), dc, ws, layers, "first"), Error);
}

// Through the trainer with 2 drafters and the sharded optimizer: after one AdamW step (|update| <= lr per element
// at the first step: m_hat / sqrt(v_hat) = sign(g)) every replica's weights are within lr of the target's layer.
TEST(DrafterInit, TheTrainerStartsEveryDrafterFromTheTarget) {
  const std::string root = test::train_tmpdir("init_from_target");
  const std::string data = test::make_train_data(root);
  TrainConfig c = test::tiny_train_config(root, data);
  c.drafters = "2";
  c.init_from_target = "next";
  c.init_fc = "last";
  c.max_steps = 1;
  c.optim.warmup_ratio = 0;
  c.optim.schedule = "constant";
  train(c);
  const std::string ck = latest_checkpoint(c.out_dir);
  const WeightStore mine = WeightStore::open(ck + "/params.safetensors");
  const WeightStore target = WeightStore::open(c.target_dir);
  const double lr = c.optim.lr;
  auto near = [&](const std::string& a, const std::string& b, float exact_value = NAN) {
    const std::vector<float> x = to_f32_vector(mine.f32(a));
    const std::vector<float> y = std::isnan(exact_value) ? to_f32_vector(target.f32(b)) : std::vector<float>{};
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double(x[i]) - (y.empty() ? exact_value : y[i])));
    EXPECT_LE(worst, lr * 1.0001) << a;
    EXPECT_GT(worst, 0) << a << " did not move: the step did not train it";
  };
  near("layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.q_proj.weight");  // ids {1, 2}: next = 3
  near("layers.0.mlp.down_proj.weight", "model.layers.3.mlp.down_proj.weight");
  near("hidden_norm.weight", "model.layers.3.input_layernorm.weight");
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace dflash
