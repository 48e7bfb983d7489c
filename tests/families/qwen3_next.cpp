// tests/families/qwen3_next.cpp — Qwen3-Next: the published keys of Qwen3-Next-80B-A3B (partial rotary and theta at
// the top level, no layer_types, MoE in every layer), the hybrid configs' defaults and refusals, and the tiny golden of
// transformers 5.17. What it shares with Qwen3.5 (rollback, speculative decoding, capture, training):
// tests/families/hybrid.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/hf_config.h"
#include "model/target.h"
#include "common/golden_checks.h"
#include "common/published_configs.h"
#include "common/test_util.h"

using namespace dflash;
using nlohmann::json;
using test::check_hybrid_golden;
using test::qwen3_5_9b;

TEST(HybridConfig, DefaultsLayerTypesAndRefusals) {
  // Qwen3-Next-80B-A3B's published keys: partial_rotary_factor and rope_theta at the top level, no layer_types
  json n = {{"architectures", {"Qwen3NextForCausalLM"}}, {"model_type", "qwen3_next"}, {"hidden_size", 2048},
            {"intermediate_size", 5120}, {"num_hidden_layers", 48}, {"num_attention_heads", 16},
            {"num_key_value_heads", 2}, {"head_dim", 256}, {"vocab_size", 151936}, {"partial_rotary_factor", 0.25},
            {"rope_theta", 10000000}, {"full_attention_interval", 4}, {"num_experts", 512},
            {"num_experts_per_tok", 10}, {"moe_intermediate_size", 512}, {"shared_expert_intermediate_size", 512},
            {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()}};
  const ModelConfig c = parse_model_config(n, "/m/config.json");
  EXPECT_EQ(c.arch, Arch::Qwen3Next);
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.layer(3).mixer, TokenMixer::Attention);
  EXPECT_EQ(c.layer(4).mixer, TokenMixer::LinearAttention);
  EXPECT_EQ(c.layer(0).mlp, ChannelMixer::MoE);
  EXPECT_EQ(c.moe.top_k, 10);
  EXPECT_NEAR(target_params(c).total / 1e9, 79.67, 0.1);  // Qwen3-Next-80B-A3B
  auto msg = [](json x) {
    try {
      parse_model_config(x, "/m/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json bad = n;
  bad["layer_types"] = {"linear_attention", "mamba"};
  EXPECT_NE(msg(bad).find("layer_types"), std::string::npos) << msg(bad);
  bad["layer_types"] = json(std::vector<std::string>(48, "sliding_attention"));
  EXPECT_NE(msg(bad).find("layer_types[0]: 'sliding_attention'"), std::string::npos) << msg(bad);
  bad = n;
  bad["linear_num_value_heads"] = 24;
  bad["linear_num_key_heads"] = 16;
  EXPECT_NE(msg(bad).find("linear_num_value_heads 24"), std::string::npos) << msg(bad);
  bad = n;
  bad["partial_rotary_factor"] = 0.005;  // 1.28 dims
  EXPECT_NE(msg(bad).find("partial_rotary_factor"), std::string::npos) << msg(bad);
  json d = qwen3_5_9b();
  d["text_config"].erase("intermediate_size");
  EXPECT_NE(msg(d).find("missing text_config.intermediate_size"), std::string::npos) << msg(d);
}

TEST(HybridGolden, Qwen3NextMatchesTransformers) { check_hybrid_golden("target_qwen3_next", "cpu"); }
