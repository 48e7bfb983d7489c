// tests/families/qwen3.cpp — Qwen3 (dense): the published config.json of Qwen3-8B and Qwen3-0.6B parsed (q/k norms,
// an explicit head_dim, tied embeddings), and the tiny Qwen3 golden (tests/golden/target_qwen3) against transformers
// in fp32 and fp64. The tiny Qwen3 target also drives the training tests (tests/train/).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "common/golden_checks.h"
#include "common/published_configs.h"

using namespace dflash;
using nlohmann::json;
using test::check_golden;
using test::kQwen3_8B;

namespace {

// Qwen/Qwen3-0.6B
const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

ModelConfig parse(const std::string& text) { return parse_model_config(json::parse(text), "test/config.json"); }

}  // namespace

TEST(HfConfig, Qwen3_8B_And_0_6B) {
  ModelConfig c = parse(kQwen3_8B);
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // an integer in the file
  EXPECT_EQ(c.rope_scaling.kind, "none");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 9, 17, 25, 33}));

  ModelConfig s = parse(kQwen3_06B);
  EXPECT_EQ(s.hidden_size, 1024);
  EXPECT_EQ(s.num_attention_heads, 16);
  EXPECT_EQ(s.head_dim, 128);  // explicit, not 1024 / 16
  EXPECT_TRUE(s.tie_word_embeddings);
}

TEST(TargetGolden, Qwen3MatchesTransformers) { check_golden("target_qwen3", "cpu"); }

TEST(TargetGolden, Qwen3InFp64) { check_golden("target_qwen3", "cpu64"); }
