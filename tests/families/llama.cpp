// tests/families/llama.cpp — Llama (Llama-3.1-8B-Instruct, Llama-3.x): the published config.json parsed (llama3
// RoPE scaling, several EOS ids, the default target layers), and the tiny Llama-3 golden (tests/golden/target_llama3)
// against transformers: every layer, the logits and the KV-cached decode, its scaled RoPE frequencies included.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "common/golden_checks.h"
#include "common/published_configs.h"

using namespace dflash;
using nlohmann::json;
using test::check_golden;
using test::kLlama31_8B;

namespace {

ModelConfig parse(const std::string& text) { return parse_model_config(json::parse(text), "test/config.json"); }

}  // namespace

TEST(HfConfig, Llama31_8B) {
  ModelConfig c = parse(kLlama31_8B);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_STREQ(arch_name(c.arch), "llama");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.kind, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 8, 15, 22, 29}));
}

TEST(TargetGolden, Llama3WithRopeScalingMatchesTransformers) { check_golden("target_llama3", "cpu"); }
