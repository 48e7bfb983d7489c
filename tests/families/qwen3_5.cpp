// tests/families/qwen3_5.cpp — Qwen3.5 / Qwen3.6 (dense and MoE, text-only and image-text checkpoints): the published
// shapes of Qwen3.5-9B and Qwen3.5-35B-A3B (layers, parameters, the drafter's defaults), the tiny goldens of
// transformers 5.17 (dense, MoE, image-text), a packed prefill restarting the state per sequence, and `dflash info` on
// an image-text checkpoint. What Qwen3.5 shares with Qwen3-Next (rollback, speculative decoding, capture, training):
// tests/families/hybrid.cpp; the ops: tests/ops/ (conv1d_causal, gated_delta_rule, rmsnorm_gated, rope).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "model/drafter.h"
#include "model/target.h"
#include "common/decode_checks.h"
#include "common/golden_checks.h"
#include "common/published_configs.h"
#include "common/test_util.h"

using namespace dflash;
using nlohmann::json;
using test::check_hybrid_golden;
using test::qwen3_5_9b;

namespace {

std::string golden_dir(const std::string& name) { return test::source_dir() + "/tests/golden/" + name; }

// Qwen/Qwen3.5-35B-A3B's (Qwen3_5MoeTextConfig defaults), image-text.
json qwen3_5_35b_a3b() {
  json j = qwen3_5_9b();
  j["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
  j["model_type"] = "qwen3_5_moe";
  json& t = j["text_config"];
  t["model_type"] = "qwen3_5_moe_text";
  t.erase("intermediate_size");
  t["hidden_size"] = 2048;
  t["num_hidden_layers"] = 40;
  t["num_key_value_heads"] = 2;
  t["num_experts"] = 256;
  t["num_experts_per_tok"] = 8;
  t["moe_intermediate_size"] = 512;
  t["shared_expert_intermediate_size"] = 512;
  return j;
}

}  // namespace

TEST(HybridConfig, Qwen3_5_9B) {
  const ModelConfig c = parse_model_config(qwen3_5_9b(), "/models/Qwen3.5-9B/config.json");
  EXPECT_EQ(c.arch, Arch::Qwen3_5Vl);
  EXPECT_EQ(c.architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope_dim(), 64);  // 0.25 of 256
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_TRUE(c.zero_centred_norms);
  EXPECT_FALSE(c.has_moe());
  ASSERT_TRUE(c.has_linear_attention());
  for (int64_t l = 0; l < 32; ++l) {
    const LayerSpec s = c.layer(l);
    EXPECT_EQ(s.mixer == TokenMixer::LinearAttention, (l + 1) % 4 != 0) << l;
    EXPECT_TRUE(s.attention.output_gate);
    EXPECT_EQ(s.mlp_width, 12288);
  }
  EXPECT_EQ(c.linear_attn.conv_dim(), 2 * 16 * 128 + 32 * 128);
  EXPECT_EQ(family_of(c.arch).names.layer, "model.language_model.layers.");
  // params: 24 linear layers, 8 gated attention layers, dense MLPs; the published 9B counts the vision tower too
  const int64_t H = 4096, V = 248320, C = 8192, VD = 4096;
  const int64_t lin = H * C + H * VD + 2 * 32 * H + C * 4 + 2 * 32 + 128 + H * VD;
  const int64_t att = 2 * H * 16 * 256 + 2 * H * 4 * 256 + 2 * 256 + H * 16 * 256;
  const int64_t per = 2 * H + 3 * H * 12288;
  const TargetParams p = target_params(c);
  EXPECT_EQ(p.total, 2 * V * H + H + 24 * (lin + per) + 8 * (att + per));
  EXPECT_NEAR(p.total / 1e9, 8.95, 0.01);
  // the drafter: the spec's layer ids (SpecForge / z-lab: Qwen3.5-4B [1, 8, 15, 22, 29] at 32 layers), 32 heads of
  // 128 with 8 kv heads, the target's MLP width and full rotary at the target's theta
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 8, 15, 22, 29}));
  const DrafterConfig d = DrafterConfig::for_target(c, 5, 16, {1, 8, 15, 22, 29}, 248070);
  EXPECT_EQ(d.num_heads, 32);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.num_kv_heads, 8);
  EXPECT_EQ(d.intermediate_size, 12288);
  EXPECT_EQ(d.rope_theta, 1e7);
}

TEST(HybridConfig, Qwen3_5_35B_A3B) {
  const ModelConfig c = parse_model_config(qwen3_5_35b_a3b(), "/models/Qwen3.5-35B-A3B/config.json");
  EXPECT_EQ(c.arch, Arch::Qwen3_5MoeVl);
  EXPECT_EQ(c.intermediate_size, 0);  // Qwen3_5MoeTextConfig has none: every layer is MoE
  EXPECT_TRUE(c.moe.norm_topk_prob);  // always renormalised
  EXPECT_EQ(c.moe.shared_expert_width, 512);
  for (int64_t l = 0; l < 40; ++l) EXPECT_EQ(c.layer(l).mlp, ChannelMixer::MoE);
  // SpecForge's qwen3.5-35b-a3b-dflash: target_layer_ids [1, 10, 19, 28, 37], 32 x 128 heads, kv 4, MLP 6144 = 3 H
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 10, 19, 28, 37}));
  const DrafterConfig d = DrafterConfig::for_target(c, 8, 16, {1, 10, 19, 28, 37}, 248070);
  EXPECT_EQ(d.num_kv_heads, 4);
  EXPECT_EQ(d.intermediate_size, 6144);
  const TargetParams p = target_params(c);
  EXPECT_NEAR(p.total / 1e9, 34.66, 0.05);   // the card's 35B (language model)
  EXPECT_NEAR(p.active / 1e9, 2.95, 0.01);   // A3B: the router, 8 of 256 experts and the shared expert per layer
  EXPECT_NEAR((p.active + p.embedding) / 1e9, 3.45, 0.01);
}

TEST(HybridGolden, Qwen3_5MatchesTransformers) { check_hybrid_golden("target_qwen3_5", "cpu"); }

TEST(HybridGolden, Qwen3_5MoeMatchesTransformers) { check_hybrid_golden("target_qwen3_5_moe", "cpu"); }

TEST(HybridGolden, Qwen3_5ImageTextCheckpointMatchesTransformers) { check_hybrid_golden("target_qwen3_5_vl", "cpu"); }

// Several sequences in one packed prefill (the training target's forward) equal each run alone: the convolution and
// the recurrence restart at every sequence.
TEST(HybridTarget, PackedPrefillRestartsTheStatePerSequence) {
  auto ctx = make_context("cpu64");
  auto target = Target::load(golden_dir("target_qwen3_5_moe"), *ctx);
  const std::vector<int32_t> a = {1, 5, 9, 13, 2, 7, 300, 301}, b = {3, 3, 60};
  const std::vector<int64_t> ids = {0, 3};
  test::check_packed_prefill(*ctx, *target, a, b, ids, 1e-12);
}

// dflash info on the image-text golden: the plan (Gated DeltaNet and gated attention layers), the ignored vision and
// MTP tensors.
TEST(HybridEndToEnd, InfoShowsThePlanAndTheIgnoredTensors) {
  const std::string tmp = cat("/tmp/dflash_test_hinfo_", getpid());
  std::filesystem::create_directories(tmp);
  const std::string cmd = cat(DFLASH_BINARY, " info ", golden_dir("target_qwen3_5_vl"), " > ", tmp, "/out.txt 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp + "/out.txt");
  const std::string out = read_file(tmp + "/out.txt");
  EXPECT_NE(out.find("qwen3_5 (Qwen3.5 (image-text checkpoint), Qwen3_5ForConditionalGeneration)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("layer 0-2     Gated DeltaNet (2 key heads x 16, 4 value heads x 16, conv 4) + dense SwiGLU of "
                     "width 128"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("layer 3       attention (qk-norm, output gate, rotary 8 of 32) + dense SwiGLU"), std::string::npos)
      << out;
  EXPECT_NE(out.find("ignored by name (not the language model): 2 tensors under mtp."), std::string::npos) << out;
  EXPECT_NE(out.find("tensors under model.visual."), std::string::npos) << out;
  std::filesystem::remove_all(tmp);
}
