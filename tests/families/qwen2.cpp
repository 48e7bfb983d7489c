// tests/families/qwen2.cpp — Qwen2 (Qwen2-7B-Instruct, Qwen2.5): the published config.json parsed (q/k/v biases
// whatever attention_bias says), and the tiny Qwen2 golden (tests/golden/target_qwen2) against transformers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "common/golden_checks.h"

using namespace dflash;
using nlohmann::json;
using test::check_golden;

namespace {

// Qwen/Qwen2-7B-Instruct
const char* kQwen2_7B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "hidden_act": "silu",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 18944,
  "max_position_embeddings": 32768,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.41.2",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 152064
})";

ModelConfig parse(const std::string& text) { return parse_model_config(json::parse(text), "test/config.json"); }

}  // namespace

TEST(HfConfig, Qwen2_7B) {
  ModelConfig c = parse(kQwen2_7B);
  EXPECT_EQ(c.arch, Arch::Qwen2);
  EXPECT_EQ(c.hidden_size, 3584);
  EXPECT_EQ(c.intermediate_size, 18944);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 28);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);  // 3584 / 28
  EXPECT_EQ(c.vocab_size, 152064);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.kind, "none");
  EXPECT_TRUE(c.attention_bias);  // Qwen2 always has q/k/v biases
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 7, 13, 19, 25}));
  // attention_bias false in the file does not turn Qwen2's biases off
  json j = json::parse(kQwen2_7B);
  j["attention_bias"] = false;
  EXPECT_TRUE(parse_model_config(j, "x").attention_bias);
}

TEST(TargetGolden, Qwen2WithBiasMatchesTransformers) { check_golden("target_qwen2", "cpu"); }
