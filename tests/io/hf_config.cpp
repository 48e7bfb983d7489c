// tests/io/hf_config.cpp — io/hf_config for every family: transformers' defaults, old and new RoPE keys, refusals by
// name (edits of published configs, tests/common/published_configs.h), loading from a directory or a file, and
// default_target_layer_ids. Each family's published configs: tests/families/<family>.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "common/published_configs.h"

using namespace dflash;
using nlohmann::json;
using test::kLlama31_8B;
using test::kQwen3_8B;

namespace {

ModelConfig parse(const std::string& text) { return parse_model_config(json::parse(text), "test/config.json"); }

// parse() of `text` with `edit` applied, returning the error message ("" if it parsed).
std::string error_after(const char* base, const std::function<void(json&)>& edit) {
  json j = json::parse(base);
  edit(j);
  try {
    parse_model_config(j, "/models/x/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

}  // namespace

TEST(HfConfig, TransformersDefaults) {
  ModelConfig c = parse(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 100})");
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_scaling.kind, "none");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2}));

  // architectures alone decide when model_type is absent; null head_dim falls back to H / nh
  ModelConfig q = parse(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                            "vocab_size": 10, "head_dim": null, "attention_bias": true, "eos_token_id": null})");
  EXPECT_EQ(q.arch, Arch::Qwen3);
  EXPECT_EQ(q.model_type, "qwen3");
  EXPECT_EQ(q.head_dim, 32);
  EXPECT_TRUE(q.attention_bias);
  EXPECT_TRUE(q.eos_token_ids.empty());
  EXPECT_EQ(q.bos_token_id, -1);
  EXPECT_EQ(q.max_position_embeddings, 32768);
  // Qwen3Config's own head_dim default is 128
  EXPECT_EQ(parse(R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "vocab_size": 10})").head_dim, 128);
}

TEST(HfConfig, RopeKeysOldAndNew) {
  // transformers < 4.45 wrote "type"
  EXPECT_EQ(error_after(kLlama31_8B, [](json& j) {
              j["rope_scaling"].erase("rope_type");
              j["rope_scaling"]["type"] = "llama3";
            }), "");
  json j = json::parse(kLlama31_8B);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.rope_scaling.kind, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse_model_config(j, "x").rope_scaling.kind, "none");

  // transformers 5: "rope_parameters" holds rope_theta and the scaling
  j = json::parse(kLlama31_8B);
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  c = parse_model_config(j, "x");
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.kind, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  j = json::parse(kQwen3_8B);
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_theta", 1000000}, {"rope_type", "default"}};
  c = parse_model_config(j, "x");
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.kind, "none");

  std::string msg = error_after(kLlama31_8B, [](json& j) { j["rope_scaling"]["rope_type"] = "longrope"; });
  EXPECT_TRUE(has(msg, "'longrope'") && has(msg, "rope_scaling") && has(msg, "config.json")) << msg;
  msg = error_after(kLlama31_8B, [](json& j) { j["rope_scaling"].erase("low_freq_factor"); });
  EXPECT_TRUE(has(msg, "rope_scaling.low_freq_factor") && has(msg, "config.json")) << msg;
}

TEST(HfConfig, RefusalsAndMissingFields) {
  std::string msg = error_after(kLlama31_8B, [](json& j) {
    j["architectures"] = {"MistralForCausalLM"};
    j["model_type"] = "mistral";
  });
  EXPECT_TRUE(has(msg, "unsupported architecture 'MistralForCausalLM' in /models/x/config.json")) << msg;
  msg = error_after(kLlama31_8B, [](json& j) {
    j.erase("architectures");
    j["model_type"] = "gemma2";
  });
  EXPECT_TRUE(has(msg, "'gemma2'") && has(msg, "model_type") && has(msg, "config.json")) << msg;
  msg = error_after(kLlama31_8B, [](json& j) { j["model_type"] = "qwen2"; });
  EXPECT_TRUE(has(msg, "model_type") && has(msg, "disagrees")) << msg;
  msg = error_after(kQwen3_8B, [](json& j) {
    j.erase("architectures");
    j.erase("model_type");
  });
  EXPECT_TRUE(has(msg, "model_type")) << msg;
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "vocab_size"}) {
    msg = error_after(kQwen3_8B, [&](json& j) { j.erase(field); });
    EXPECT_TRUE(has(msg, "config.json missing " + std::string(field))) << msg;
  }
  msg = error_after(kQwen3_8B, [](json& j) { j["hidden_size"] = "4096"; });
  EXPECT_TRUE(has(msg, "hidden_size") && has(msg, "integer") && has(msg, "config.json")) << msg;
  msg = error_after(kQwen3_8B, [](json& j) { j["num_key_value_heads"] = 5; });
  EXPECT_TRUE(has(msg, "num_key_value_heads")) << msg;
  msg = error_after(kQwen3_8B, [](json& j) { j["tie_word_embeddings"] = "yes"; });
  EXPECT_TRUE(has(msg, "tie_word_embeddings")) << msg;
  msg = error_after(kQwen3_8B, [](json& j) { j["eos_token_id"] = {151645, "x"}; });
  EXPECT_TRUE(has(msg, "eos_token_id")) << msg;
  // An exported DFlash drafter config is read through its model_type.
  EXPECT_EQ(error_after(kQwen3_8B, [](json& j) { j["architectures"] = {"DFlashDraftModel"}; }), "");
}

TEST(HfConfig, LoadFromDirectoryOrFile) {
  const std::string dir = cat("/tmp/dflash_test_", getpid(), "_HfConfig_Load");
  std::filesystem::remove_all(dir);
  make_dirs(dir);
  write_file_atomic(dir + "/config.json", kQwen3_8B);
  EXPECT_EQ(load_model_config(dir).hidden_size, 4096);
  EXPECT_EQ(load_model_config(dir + "/config.json").num_hidden_layers, 36);

  json j = json::parse(kQwen3_8B);
  j.erase("hidden_size");
  write_file_atomic(dir + "/config.json", j.dump(2));
  try {
    load_model_config(dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), dir + "/config.json missing hidden_size")) << e.what();
  }
  write_file_atomic(dir + "/config.json", "{\"hidden_size\": ");
  try {
    load_model_config(dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "config.json") && has(e.what(), "invalid JSON")) << e.what();
  }
  write_file_atomic(dir + "/config.json", "[1]");
  EXPECT_THROW(load_model_config(dir), Error);
  std::filesystem::remove(dir + "/config.json");
  try {
    load_model_config(dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "config.json")) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(HfConfig, DefaultTargetLayerIds) {
  EXPECT_EQ(default_target_layer_ids(36, 5), (std::vector<int64_t>{1, 9, 17, 25, 33}));  // Qwen3-8B
  EXPECT_EQ(default_target_layer_ids(32, 5), (std::vector<int64_t>{1, 8, 15, 22, 29}));  // Llama-3.1-8B
  EXPECT_EQ(default_target_layer_ids(36, 1), (std::vector<int64_t>{18}));
  EXPECT_EQ(default_target_layer_ids(7, 1), (std::vector<int64_t>{3}));
  EXPECT_EQ(default_target_layer_ids(32, 2), (std::vector<int64_t>{1, 29}));
  EXPECT_EQ(default_target_layer_ids(36, 3), (std::vector<int64_t>{1, 17, 33}));
  // halves round away from zero: 1 + i*6/4 = 1, 2.5, 4, 5.5, 7
  EXPECT_EQ(default_target_layer_ids(10, 5), (std::vector<int64_t>{1, 3, 4, 6, 7}));
  // 1 + i*5/2 = 1, 3.5, 6
  EXPECT_EQ(default_target_layer_ids(9, 3), (std::vector<int64_t>{1, 4, 6}));
  EXPECT_THROW(default_target_layer_ids(3, 2), Error);  // would give [1, 0]
  EXPECT_THROW(default_target_layer_ids(4, 3), Error);  // would give [1, 1, 1]
  EXPECT_THROW(default_target_layer_ids(0, 1), Error);
  EXPECT_THROW(default_target_layer_ids(36, 0), Error);
}
