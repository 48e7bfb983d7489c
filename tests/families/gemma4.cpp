// tests/families/gemma4.cpp — Gemma 4 text models on the CPU: the published configs of gemma-4-31B-it (dense) and
// gemma-4-26B-A4B-it (MoE) parsed into their plan, parameters and drafter defaults; the refusals of the options dflash
// does not run, by name; the tiny goldens of tools/ref_gemma4.py (an independent float64 reading of transformers'
// modeling_gemma4.py; tools/make_goldens_families.py makes the same with transformers on the GPU machine) on cpu and
// cpu64, with the cached decode and the experts chosen; packed prefill; speculative decoding through the KV cache of
// sliding and full layers = the target's greedy decode; a tiny training run, its export and eval; `dflash info`.
// Its ops: tests/ops/gelu_tanh.cpp (gelu_tanh_mul, softcap), tests/ops/rope.cpp (rope with zero frequencies).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/target.h"
#include "train/trainer.h"
#include "common/decode_checks.h"
#include "common/golden_checks.h"
#include "common/test_util.h"
#include "common/train_fixtures.h"

using namespace dflash;
using nlohmann::json;
using test::check_golden;

namespace {

std::string golden_dir(const std::string& name) { return test::source_dir() + "/tests/golden/" + name; }

// layer_types of the published models: 5 sliding layers, then one full, repeated.
json gemma4_layer_types(int n) {
  json lt = json::array();
  for (int l = 0; l < n; ++l) lt.push_back((l + 1) % 6 ? "sliding_attention" : "full_attention");
  return lt;
}

// google/gemma-4-31B-it config.json: its text_config key for key as copies of the published file quote it (the
// vision_config abridged to a few keys: dflash reads the language model only).
json gemma4_31b() {
  json t = {
      {"attention_bias", false}, {"attention_dropout", 0.0}, {"attention_k_eq_v", true}, {"dtype", "bfloat16"},
      {"enable_moe_block", false}, {"final_logit_softcapping", 30.0}, {"global_head_dim", 512}, {"head_dim", 256},
      {"hidden_activation", "gelu_pytorch_tanh"}, {"hidden_size", 5376}, {"hidden_size_per_layer_input", 0},
      {"intermediate_size", 21504}, {"layer_types", gemma4_layer_types(60)}, {"max_position_embeddings", 262144},
      {"model_type", "gemma4_text"}, {"num_attention_heads", 32}, {"num_global_key_value_heads", 4},
      {"num_hidden_layers", 60}, {"num_key_value_heads", 16}, {"num_kv_shared_layers", 0}, {"rms_norm_eps", 1e-6},
      {"rope_parameters",
       {{"full_attention", {{"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}, {"rope_type", "proportional"}}},
        {"sliding_attention", {{"rope_theta", 10000.0}, {"rope_type", "default"}}}}},
      {"sliding_window", 1024}, {"tie_word_embeddings", true}, {"use_cache", true}, {"use_double_wide_mlp", false},
      {"vocab_size", 262144}, {"vocab_size_per_layer_input", 262144}};
  return {{"architectures", {"Gemma4ForConditionalGeneration"}}, {"model_type", "gemma4"}, {"dtype", "bfloat16"},
          {"eos_token_id", {1, 106}}, {"image_token_id", 258880}, {"tie_word_embeddings", true}, {"text_config", t},
          {"vision_config", {{"model_type", "gemma4_vision"}, {"hidden_size", 1152}}}};
}

// google/gemma-4-26B-A4B-it: the same keys with its shapes and the MoE block.
json gemma4_26b_a4b() {
  json j = gemma4_31b();
  json& t = j["text_config"];
  t["hidden_size"] = 2816;
  t["num_hidden_layers"] = 30;
  t["layer_types"] = gemma4_layer_types(30);
  t["intermediate_size"] = 2112;
  t["num_attention_heads"] = 16;
  t["num_key_value_heads"] = 8;
  t["num_global_key_value_heads"] = 2;
  t["enable_moe_block"] = true;
  t["num_experts"] = 128;
  t["top_k_experts"] = 8;
  t["moe_intermediate_size"] = 704;
  return j;
}

}  // namespace

// ---- config, plan, parameters ---------------------------------------------------------------------------------------

TEST(Gemma4Config, Published31B) {
  const ModelConfig c = parse_model_config(gemma4_31b(), "/models/gemma-4-31B-it/config.json");
  EXPECT_EQ(c.arch, Arch::Gemma4Vl);
  EXPECT_EQ(c.architecture, "Gemma4ForConditionalGeneration");
  EXPECT_EQ(family_of(c.arch).names.layer, "model.language_model.layers.");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
  EXPECT_EQ(c.mlp_act, MlpAct::GeluTanh);
  EXPECT_EQ(c.final_logit_softcap, 30.0);
  EXPECT_EQ(c.embed_scale, static_cast<double>(static_cast<float>(std::sqrt(5376.0))));
  EXPECT_EQ(c.rope_theta, 10000.0);  // the sliding layers' RoPE
  EXPECT_EQ(c.rope_alt.theta, 1e6);  // the full layers': proportional, int(0.25 * 512 // 2) = 64 pairs of 256 turn
  EXPECT_EQ(c.rope_alt.dim, 512);
  EXPECT_EQ(c.rope_alt.rotated, 128);
  EXPECT_FALSE(c.has_moe());
  for (int64_t l = 0; l < 60; ++l) {
    const LayerSpec s = c.layer(l);
    const bool full = (l + 1) % 6 == 0;
    EXPECT_EQ(s.attention.sliding_window, full ? 0 : 1024) << l;
    EXPECT_EQ(c.head_dim_of(s), full ? 512 : 256) << l;
    EXPECT_EQ(c.kv_heads_of(s), full ? 4 : 16) << l;
    EXPECT_EQ(s.attention.k_eq_v, full) << l;
    EXPECT_EQ(s.attention.rope_alt, full) << l;
    EXPECT_TRUE(s.attention.qk_norm && s.attention.v_norm && s.sandwich_norms && s.layer_scalar) << l;
    EXPECT_EQ(s.attention.scale, 1.0) << l;
    EXPECT_EQ(s.mlp_width, 21504) << l;
  }
  // parameters written out: 50 sliding and 10 full layers, the tied embedding; the card's 30.7B
  const int64_t H = 5376, V = 262144, I = 21504;
  const int64_t norms = 4 * H + 1;  // input, post-attention, pre- and post-feedforward norms, the layer scalar
  const int64_t sliding = 2 * H * 32 * 256 + 2 * H * 16 * 256 + 2 * 256 + 3 * H * I + norms;
  const int64_t full = 2 * H * 32 * 512 + H * 4 * 512 + 2 * 512 + 3 * H * I + norms;  // k = v: no v_proj
  const TargetParams p = target_params(c);
  EXPECT_EQ(p.total, V * H + H + 50 * sliding + 10 * full);
  EXPECT_NEAR(p.total / 1e9, 30.7, 0.01);
  // the drafter: z-lab/gemma-4-31B-it-DFlash's target_layer_ids [1, 12, 23, 35, 46, 57] (nf 6) are the spec's rule;
  // its shape 64 heads of 128, kv 8, MLP 10752 = 2 H, RoPE theta 1e6
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 6), (std::vector<int64_t>{1, 12, 23, 35, 46, 57}));
  const DrafterConfig d = DrafterConfig::for_target(c, 5, 16, {1, 12, 23, 35, 46, 57}, 4);
  EXPECT_EQ(d.num_heads, 64);
  EXPECT_EQ(d.num_kv_heads, 8);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.intermediate_size, 10752);
  EXPECT_EQ(d.rope_theta, 1e6);
  EXPECT_EQ(d.embed_scale, c.embed_scale);  // the block tokens embedded as the target embeds its tokens
}

TEST(Gemma4Config, Published26BA4B) {
  const ModelConfig c = parse_model_config(gemma4_26b_a4b(), "/models/gemma-4-26B-A4B-it/config.json");
  ASSERT_TRUE(c.has_moe());
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.expert_width, 704);
  EXPECT_EQ(c.moe.dense_beside_width, 2112);
  EXPECT_TRUE(c.moe.norm_topk_prob && c.moe.router_scales);
  EXPECT_EQ(c.moe.act, ExpertAct::GeluTanh);
  for (int64_t l = 0; l < 30; ++l) {
    const LayerSpec s = c.layer(l);
    EXPECT_EQ(s.mlp, ChannelMixer::MoE) << l;
    EXPECT_EQ(c.kv_heads_of(s), (l + 1) % 6 ? 8 : 2) << l;
  }
  // parameters written out: per layer the dense MLP beside 128 experts (router [E, H], its scale [H] and per-expert
  // scale [E], three more norms); active: 8 experts. The card's 25.2B total, 3.8B active.
  const int64_t H = 2816, V = 262144, I = 2112, E = 128, Ie = 704;
  const int64_t att_s = 2 * H * 16 * 256 + 2 * H * 8 * 256 + 2 * 256, att_f = 2 * H * 16 * 512 + H * 2 * 512 + 2 * 512;
  const int64_t block = 3 * H * I + E * H + H + E + 3 * H + 4 * H + 1;
  const TargetParams p = target_params(c);
  EXPECT_EQ(p.total, V * H + H + 25 * (att_s + block + E * 3 * H * Ie) + 5 * (att_f + block + E * 3 * H * Ie));
  EXPECT_EQ(p.active, V * H + H + 25 * (att_s + block + 8 * 3 * H * Ie) + 5 * (att_f + block + 8 * 3 * H * Ie));
  EXPECT_NEAR(p.total / 1e9, 25.2, 0.05);
  EXPECT_NEAR(p.active / 1e9, 3.8, 0.05);
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 8, 14, 21, 27}));
}

// Gemma4TextConfig's defaults where config.json is silent: 5 sliding + 1 full, the last layer full, window 512, the
// default RoPE per layer type, bos 2, eos 1.
TEST(Gemma4Config, TheConfigClassDefaults) {
  json j = {{"architectures", {"Gemma4ForCausalLM"}}, {"model_type", "gemma4_text"}, {"hidden_size", 64},
            {"intermediate_size", 96}, {"num_hidden_layers", 8}, {"num_attention_heads", 4}, {"vocab_size", 512}};
  const ModelConfig c = parse_model_config(j, "cfg.json");
  EXPECT_EQ(c.arch, Arch::Gemma4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.global_head_dim, 512);
  EXPECT_FALSE(c.attention_k_eq_v);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(c.final_logit_softcap, 0.0);
  EXPECT_EQ(c.rope_alt.rotated, 128);
  for (int64_t l = 0; l < 8; ++l)
    EXPECT_EQ(c.layer(l).attention.sliding_window, l == 5 || l == 7 ? 0 : 512) << l;  // l 7: the last, forced full
}

// What dflash does not run is refused, naming the key.
TEST(Gemma4Config, RefusalsNameTheField) {
  auto refused = [](const char* key, const json& value, const std::string& want) {
    json j = gemma4_31b();
    j["text_config"][key] = value;
    try {
      parse_model_config(j, "/m/config.json");
      ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused("hidden_size_per_layer_input", 256, "text_config.hidden_size_per_layer_input: 256 is not supported");
  refused("num_kv_shared_layers", 20, "text_config.num_kv_shared_layers: 20 is not supported");
  refused("use_bidirectional_attention", "all", "text_config.use_bidirectional_attention: 'all' is not supported");
  refused("attention_bias", true, "text_config.attention_bias: true is not supported");
  refused("hidden_activation", "silu", "text_config.hidden_activation: 'silu' is not supported");
  refused("final_logit_softcapping", -1.0, "text_config.final_logit_softcapping");
  refused("num_global_key_value_heads", nullptr, "missing text_config.num_global_key_value_heads");
  refused("rope_parameters", {{"full_attention", {{"rope_type", "default"}}}},
          "text_config.rope_parameters.full_attention: rope_type 'default'");
  refused("rope_parameters", {{"sliding_attention", {{"rope_type", "yarn"}, {"factor", 4.0}}}},
          "text_config.rope_parameters.sliding_attention: rope_type 'yarn'");
  refused("layer_types", json::array({"linear_attention"}), "text_config.layer_types: expected a list of 60");
  json moe = gemma4_26b_a4b();
  moe["text_config"].erase("top_k_experts");
  EXPECT_THROW(parse_model_config(moe, "m.json"), Error);
}

// The full layers' geometry as transformers 5.17 saves a Gemma 4 config: per_layer_config {"<layer>": {"head_dim",
// "num_key_value_heads"}} instead of global_head_dim / num_global_key_value_heads (seen in the configs
// tools/make_goldens_families.py saved on the GPU machine). Each golden's config rewritten so reads the same plan and
// still matches its golden (fp64); entries that would need another geometry are refused by name.
TEST(Gemma4Config, PerLayerConfigAsTransformersSavesIt) {
  const std::string tmp = cat("/tmp/dflash_test_gemma4_plc_", getpid());
  for (const char* n : {"target_gemma4", "target_gemma4_text", "target_gemma4_moe"}) {
    const json orig = json::parse(read_file(golden_dir(n) + "/config.json"));
    json j = orig;
    json& t = j.contains("text_config") ? j["text_config"] : j;
    const bool k_eq_v = t.value("attention_k_eq_v", false);
    json plc = json::object();
    for (size_t l = 0; l < t["layer_types"].size(); ++l)
      if (t["layer_types"][l] == "full_attention") {
        plc[std::to_string(l)]["head_dim"] = t["global_head_dim"];
        if (k_eq_v) plc[std::to_string(l)]["num_key_value_heads"] = t["num_global_key_value_heads"];
      }
    t["per_layer_config"] = plc;
    t.erase("global_head_dim");
    t.erase("num_global_key_value_heads");
    const ModelConfig a = parse_model_config(orig, "orig.json"), b = parse_model_config(j, "saved.json");
    EXPECT_EQ(b.global_head_dim, a.global_head_dim) << n;
    EXPECT_EQ(b.num_global_kv_heads, a.num_global_kv_heads) << n;
    for (int64_t l = 0; l < a.num_hidden_layers; ++l) {
      EXPECT_EQ(b.layer(l).attention.head_dim, a.layer(l).attention.head_dim) << n << " layer " << l;
      EXPECT_EQ(b.layer(l).attention.num_kv_heads, a.layer(l).attention.num_kv_heads) << n << " layer " << l;
    }
    const std::string dir = cat(tmp, "/", n);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    write_file_atomic(dir + "/config.json", j.dump(2));
    for (const char* f : {"model.safetensors", "golden.safetensors"})
      std::filesystem::create_symlink(golden_dir(n) + "/" + f, dir + "/" + f);
    check_golden(dir, "cpu64", {.experts = true});
    if (!k_eq_v) continue;
    auto refused = [&](const std::function<void(json&)>& edit, const std::string& want) {
      json r = j;
      edit(r["text_config"]);
      try {
        parse_model_config(r, "/m/config.json");
        ADD_FAILURE() << n << ": accepted " << r["text_config"]["per_layer_config"].dump();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      }
    };
    refused([](json& t) { t["per_layer_config"].erase("4"); }, "lists 1 of the 2 full-attention layers");
    refused([](json& t) { t["per_layer_config"]["4"]["head_dim"] = 64; }, "full layers of different head dims");
    refused([](json& t) { t["per_layer_config"]["0"]["head_dim"] = 32; }, "per_layer_config.0: a sliding layer");
    refused([](json& t) { t["per_layer_config"]["2"]["intermediate_size"] = 8; }, "per_layer_config.2.intermediate_size");
    refused([](json& t) { t["per_layer_config"]["9"] = json::object(); }, "per_layer_config.9: not a layer index");
    refused([](json& t) { t["global_head_dim"] = 64; }, "differs from global_head_dim 64");
  }
  std::filesystem::remove_all(tmp);
}

// ---- goldens of the independent reading (tools/ref_gemma4.py) -------------------------------------------------------

// target_gemma4: the published class (weights under model.language_model., vision tensors ignored), 5 layers sliding
// (window 8 under 40 tokens) and full (head dim 32, one kv head, k = v, proportional RoPE turning 8 of 32 dims),
// GELU-tanh MLP, tied embedding scaled by 8, softcap 15, layer scalars != 1; target_gemma4_text: Gemma4ForCausalLM with
// v_proj on the full layers and an untied lm_head; target_gemma4_moe: the MoE block (8 experts top-2 beside the dense
// MLP). Every layer, the final norm, the logits and the cached decode (prefill 36, then 4 one at a time).
TEST(Gemma4Golden, MatchesTheReference) {
  for (const char* n : {"target_gemma4", "target_gemma4_text", "target_gemma4_moe"}) {
    check_golden(n, "cpu", {.experts = true});
    check_golden(n, "cpu64", {.experts = true});
  }
}

// The proportional RoPE of the full layers: the first rotated / 2 frequencies theta^(-2i / d), the rest 0 (those
// pairs do not turn), as transformers' _compute_proportional_rope_parameters.
TEST(Gemma4Golden, ProportionalRopeFrequencies) {
  auto ctx = make_context("cpu");
  auto target = Target::load(golden_dir("target_gemma4"), *ctx);
  const auto f = test::to_f64(target->weights().inv_freq_alt);
  ASSERT_EQ(f.size(), 16u);
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_NEAR(f[i], i < 4 ? std::pow(1e6, -2.0 * static_cast<double>(i) / 32) : 0.0, 1e-7) << i;
}

// Two sequences in one packed prefill equal each alone (sliding windows restart per sequence).
TEST(Gemma4Target, PackedPrefillEqualsEachAlone) {
  auto ctx = make_context("cpu64");
  for (const char* n : {"target_gemma4", "target_gemma4_moe"}) {
    auto target = Target::load(golden_dir(n), *ctx);
    const std::vector<int32_t> a = {1, 5, 9, 13, 2, 7, 300, 301, 17, 40, 41, 42, 43}, b = {3, 3, 60};
    test::check_packed_prefill(*ctx, *target, a, b, {0, 2, 4}, 1e-12);
  }
}

// A random Gemma 4 target (the published options at tiny shapes) runs prefill, cached decode and the layer taps.
TEST(Gemma4Target, RandomTargetPrefillEqualsCachedDecode) {
  json j = gemma4_26b_a4b();
  json& t = j["text_config"];
  t["hidden_size"] = 64;
  t["intermediate_size"] = 48;
  t["num_hidden_layers"] = 6;
  t["layer_types"] = gemma4_layer_types(6);
  t["num_attention_heads"] = 4;
  t["num_key_value_heads"] = 2;
  t["num_global_key_value_heads"] = 1;
  t["head_dim"] = 16;
  t["global_head_dim"] = 32;
  t["num_experts"] = 8;
  t["top_k_experts"] = 2;
  t["moe_intermediate_size"] = 16;
  t["vocab_size"] = 300;
  t["sliding_window"] = 4;
  const ModelConfig c = parse_model_config(j, "tiny.json");
  auto ctx = make_context("cpu64");
  auto target = Target::random(c, *ctx, 7);
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back((i * 37 + 5) % 300);
  const std::vector<int64_t> taps = {1, 5};
  auto full = target->forward(*ctx, cpu_tensor_i32(ids, {12}), taps, true);
  KVCache cache = target->make_cache(*ctx, 12);
  target->forward(*ctx, cpu_tensor_i32(std::vector<int32_t>(ids.begin(), ids.begin() + 7), {7}), taps, true, &cache);
  std::vector<double> dec;
  for (int t2 = 7; t2 < 12; ++t2) {
    auto o = target->forward(*ctx, cpu_tensor_i32({ids[t2]}, {1}), taps, true, &cache);
    const auto v = test::to_f64(o.features);
    dec.insert(dec.end(), v.begin(), v.end());
  }
  const auto fv = test::to_f64(full.features);
  const std::vector<double> want(fv.begin() + 7 * 2 * 64, fv.end());
  EXPECT_LT(test::rel_err(dec, want), 1e-12);
}

// ---- end to end -------------------------------------------------------------------------------------------------------

// Real speculative decoding through the Gemma 4 KV cache (sliding layers of window 8 under prompts of 12-22 + 24
// tokens, full layers with k = v) reproduces the target's greedy decode; batched generation equals one at a time.
TEST(Gemma4EndToEnd, SpeculativeDecodingIsLosslessDenseAndMoe) {
  for (const char* n : {"target_gemma4", "target_gemma4_moe"}) {
    auto ctx = make_context("cpu", {.threads = 2});
    auto target = Target::load(golden_dir(n), *ctx);
    EXPECT_GT(test::check_lossless_decoding(*ctx, *target, 23, n), 32u);
  }
}

// dflash info: the family, the sliding and full layers' attention, the GeGLU, the MoE block, the ignored vision tensors.
TEST(Gemma4EndToEnd, InfoShowsThePlan) {
  const std::string tmp = test::train_tmpdir("gemma4info");
  for (const char* n : {"target_gemma4", "target_gemma4_moe"}) {
    const std::string cmd = cat(DFLASH_BINARY, " info ", golden_dir(n), " > ", tmp, "/out.txt 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp + "/out.txt");
    const std::string out = read_file(tmp + "/out.txt");
    EXPECT_NE(out.find("gemma4 (Gemma 4 (image-text checkpoint), Gemma4ForConditionalGeneration)"), std::string::npos)
        << out;
    EXPECT_NE(out.find("attention (qk-norm, sliding window 8, v-norm, scale 1) (sandwich norms)"), std::string::npos)
        << out;
    EXPECT_NE(out.find("attention (qk-norm, head_dim 32, kv heads 1, k = v, v-norm, scale 1, proportional rotary 8 of "
                       "32, theta 1e+06) (sandwich norms)"),
              std::string::npos)
        << out;
    if (std::string(n) == "target_gemma4") {
      EXPECT_NE(out.find("+ dense GeGLU (gelu_tanh) of width 96 x layer_scalar"), std::string::npos) << out;
    } else {
      EXPECT_NE(out.find("+ MoE 8 experts top-2 of width 32 (top-k renormalised; router scales; GeGLU) beside a dense "
                         "GeGLU (gelu_tanh) of width 48 x layer_scalar"),
                std::string::npos)
          << out;
    }
    EXPECT_NE(out.find("tensors under model.vision_tower."), std::string::npos) << out;
  }
  std::filesystem::remove_all(tmp);
}

// dflash capture writes HF's output_hidden_states (hidden_0 = the scaled embedding, the last = the final norm), the
// soft-capped logits and the experts chosen.
TEST(Gemma4EndToEnd, CaptureWritesHfHiddenStates) {
  const std::string tmp = test::train_tmpdir("gemma4capture");
  for (const char* name : {"target_gemma4", "target_gemma4_moe"}) {
    auto g = SafetensorsFile::open(golden_dir(name) + "/golden.safetensors");
    const Tensor ids = g->view("input_ids");
    json row = {{"input_ids", std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + ids.numel())}};
    write_file_atomic(tmp + "/ids.jsonl", row.dump() + "\n");
    const std::string out = cat(tmp, "/", name, ".safetensors");
    const std::string cmd = cat(DFLASH_BINARY, " capture --target ", golden_dir(name), " --input ", tmp,
                                "/ids.jsonl --out ", out, " --logits --router > ", tmp, "/log.txt 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp + "/log.txt");
    auto f = SafetensorsFile::open(out);
    for (int i = 0; i <= 5; ++i)
      EXPECT_LT(test::rel_err(test::to_f64(f->view(cat("row_0.hidden_", i))),
                              test::to_f64(g->view(cat("hidden_states.", i)))),
                3e-5)
          << name << " hidden_" << i;
    EXPECT_LT(test::rel_err(test::to_f64(f->view("row_0.logits")), test::to_f64(g->view("logits"))), 3e-5) << name;
    for (int l = 0; l < 5; ++l) {
      if (!g->find(cat("router_topk.", l))) continue;
      const Tensor got = f->view(cat("row_0.router_", l)), want = g->view(cat("router_topk.", l));
      ASSERT_EQ(got.numel(), want.numel()) << name << " layer " << l;
      for (int64_t i = 0; i < got.numel(); ++i)
        EXPECT_EQ(got.ptr<int32_t>()[i], want.ptr<int32_t>()[i]) << name << " layer " << l << " pair " << i;
    }
  }
  std::filesystem::remove_all(tmp);
}

// Training on the Gemma 4 targets: the loss falls; the export is the published drafter shape (64 heads of 128, kv 8,
// MLP 2 H, theta 1e6); `dflash eval` runs speculative decoding with it, losslessly; the MoE target gives 2 + 2 workers
// the loss of 1 + 1.
TEST(Gemma4Pipeline, TrainExportAndEvalDenseAndMoe) {
  const std::string root = test::train_tmpdir("gemma4pipe");
  const std::string data = test::make_train_data(root);
  for (const char* name : {"target_gemma4", "target_gemma4_moe"}) {
    TrainConfig one = test::tiny_train_config(root, data);
    one.target_dir = golden_dir(name);
    one.max_steps = 10;
    one.out_dir = cat(root, "/", name, "_one");
    one.export_at_end = true;
    train(one);
    const auto m1 = test::read_metrics_jsonl(one.out_dir);
    ASSERT_EQ(m1.size(), 10u) << name;
    EXPECT_LT(m1.back()["loss"].get<double>(), m1.front()["loss"].get<double>()) << name;
    const json ex = json::parse(read_file(one.out_dir + "/export/config.json"));
    EXPECT_EQ(ex["num_attention_heads"].get<int64_t>(), 64) << name;
    EXPECT_EQ(ex["num_key_value_heads"].get<int64_t>(), 8) << name;
    EXPECT_EQ(ex["head_dim"].get<int64_t>(), 128) << name;
    EXPECT_EQ(ex["intermediate_size"].get<int64_t>(), 128) << name;
    EXPECT_EQ(ex["rope_theta"].get<double>(), 1e6) << name;
    EXPECT_EQ(ex["dflash_config"]["embed_scale"].get<double>(), 8.0) << name;  // the target's sqrt(H), H 64
    if (std::string(name) == "target_gemma4_moe") test::expect_two_plus_two_as_one(one, cat(root, "/", name, "_two"), name);
    const std::string rep = cat(root, "/", name, "_eval.json");
    const int rc = test::run_binary({DFLASH_BINARY, "eval", "--target", one.target_dir, "--drafter",
                                     one.out_dir + "/export", "--data", data, "--mode", "both", "--max-samples", "6",
                                     "--json", rep, "--no-progress"},
                                    nullptr, root + "/eval.log");
    ASSERT_EQ(rc, 0) << read_file(root + "/eval.log");
    const json r = json::parse(read_file(rep));
    EXPECT_EQ(r["evaluated"].get<int64_t>(), 6) << name;
    EXPECT_EQ(r["lossless_mismatches"].get<int64_t>(), 0) << name << ": speculative decoding differs from greedy";
  }
  std::filesystem::remove_all(root);
}
