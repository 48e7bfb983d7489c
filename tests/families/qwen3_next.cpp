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
#include "io/model_family_hybrid.h"
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

// Qwen3-Next's fused projections split by io's layout conversion (transformers' fix_query_key_value_ordering): qkvz
// viewed as [nk, q (dk) | k (dk) | v (r dv) | z (r dv)] and ba as [nk, b (r) | a (r)]; the split layout concatenates
// all key heads' q, then k, then v (and z, b, a alone). Every value names its source row.
TEST(HybridConfig, GroupedQkvzSplitsPerKeyHead) {
  LinearAttnConfig a;
  a.num_key_heads = 2, a.num_value_heads = 4, a.key_head_dim = 3, a.value_head_dim = 2, a.conv_kernel = 4;
  const int64_t nk = 2, dk = 3, r = 2, vd = r * 2, group = 2 * dk + 2 * vd, nv = 4, H = 2;
  Tensor qkvz = cpu_empty(DType::F32, {nk * group, H}), ba = cpu_empty(DType::F32, {2 * nv, H});
  for (int64_t i = 0; i < qkvz.numel(); ++i) qkvz.ptr<float>()[i] = static_cast<float>(i / H);
  for (int64_t i = 0; i < ba.numel(); ++i) ba.ptr<float>()[i] = static_cast<float>(100 + i / H);
  const SplitLinearAttnProjections s = split_grouped_qkvz(qkvz, ba, a);
  ASSERT_EQ(s.qkv.shape, (Shape{a.conv_dim(), H}));
  ASSERT_EQ(s.z.shape, (Shape{a.value_dim(), H}));
  ASSERT_EQ(s.ba.shape, (Shape{2 * nv, H}));
  std::vector<float> qkv, z, b, av;  // the expected source rows, in order
  for (int64_t part = 0; part < 3; ++part)  // q, k, v
    for (int64_t g = 0; g < nk; ++g)
      for (int64_t i = 0; i < (part < 2 ? dk : vd); ++i) qkv.push_back(static_cast<float>(g * group + part * dk + i));
  for (int64_t g = 0; g < nk; ++g)
    for (int64_t i = 0; i < vd; ++i) z.push_back(static_cast<float>(g * group + 2 * dk + vd + i));
  for (int64_t g = 0; g < nk; ++g)
    for (int64_t i = 0; i < r; ++i) {
      b.push_back(static_cast<float>(100 + g * 2 * r + i));
      av.push_back(static_cast<float>(100 + g * 2 * r + r + i));
    }
  b.insert(b.end(), av.begin(), av.end());
  auto rows = [H](const Tensor& t) {
    std::vector<float> v;
    for (int64_t i = 0; i < t.shape[0]; ++i) {
      EXPECT_EQ(t.ptr<float>()[i * H], t.ptr<float>()[i * H + 1]) << "row " << i << " mixes two source rows";
      v.push_back(t.ptr<float>()[i * H]);
    }
    return v;
  };
  EXPECT_EQ(rows(s.qkv), qkv);
  EXPECT_EQ(rows(s.z), z);
  EXPECT_EQ(rows(s.ba), b);
}
