// tests/families/deepseek_v3.cpp — DeepSeek-V3 (io/model_family_deepseek_v3.h) and Kimi-K2 (model_type kimi_k2): the
// published config.json (DeepSeek-V3's, FP8) parsed, its plan, parameters (671.03B total, 36.63B active: the card's
// 671B / 37B) and default target layers; refusals by name; the tiny goldens of tools/ref_deepseek_v3.py (an
// independent float64 reading of transformers' forward: multi-head latent attention with q_lora_rank, YaRN with
// mscale / mscale_all_dim, interleaved RoPE; the group-limited sigmoid router with the correction bias and the routed
// scaling factor, the shared expert, a dense first layer, the cached decode; and a Kimi-K2-style one with q_proj,
// rotate-half RoPE and one group); a random target through every forward path; the FP8 layout (kept FP8 where the
// RoPE rows lie in one block, dequantised where not) against its dequantisation; `dflash info`; speculative decoding;
// `dflash capture`; training 2 + 2 = 1 worker and eval.
// The router op's groups and scale: tests/ops/moe.cpp (MoeOps.RouteSigmoidGroupLimited).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "io/model_family_deepseek_v3.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/target.h"
#include "model/target/latent_attention.h"
#include "common/decode_checks.h"
#include "common/golden_checks.h"
#include "common/test_util.h"
#include "common/train_fixtures.h"

using namespace dflash;
using nlohmann::json;
using test::check_golden;
using test::TmpDir;

namespace {

// deepseek-ai/DeepSeek-V3 config.json as published (auto_map left out)
json deepseek_v3() {
  return json::parse(R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})");
}

// moonshotai/Kimi-K2-Instruct's shape: the same architecture under model_type kimi_k2 (64 heads, 384 experts in one
// group, one dense layer, routed_scaling_factor 2.827, YaRN factor 32)
json kimi_k2() {
  json j = deepseek_v3();
  j["model_type"] = "kimi_k2";
  j["num_attention_heads"] = 64;
  j["num_key_value_heads"] = 64;
  j["n_routed_experts"] = 384;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["first_k_dense_replace"] = 1;
  j["routed_scaling_factor"] = 2.827;
  j["num_nextn_predict_layers"] = 0;
  j["vocab_size"] = 163840;
  j["rope_theta"] = 50000.0;
  j["rope_scaling"] = {{"beta_fast", 1.0}, {"beta_slow", 1.0}, {"factor", 32.0}, {"mscale", 1.0},
                       {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}, {"type", "yarn"}};
  return j;
}

std::string error_of(const json& j) {
  try {
    parse_model_config(j, "/models/DeepSeek-V3/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string golden_dir(const char* name = "target_deepseek_v3") { return test::source_dir() + "/tests/golden/" + name; }

}  // namespace

// ---- config, plan, parameters ---------------------------------------------------------------------------------------

TEST(DeepseekV3Config, PublishedV3) {
  const ModelConfig c = parse_model_config(deepseek_v3(), "/models/DeepSeek-V3/config.json");
  EXPECT_EQ(c.arch, Arch::DeepseekV3);
  EXPECT_STREQ(arch_name(c.arch), "deepseek_v3");
  EXPECT_EQ(family_of(c.arch).title, std::string("DeepSeek-V3"));
  EXPECT_EQ(c.head_dim, 64);  // DeepseekV3Config.head_dim: the RoPE's dims
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.num_key_value_heads, 128);
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.mla.qk_head_dim(), 192);
  EXPECT_EQ(c.mla.v_head_dim, 128);
  EXPECT_TRUE(c.mla.rope_interleave);
  EXPECT_EQ(c.rope_scaling.kind, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.attention_scaling(), 1.0);  // mscale == mscale_all_dim
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  const MoeConfig& m = c.moe;
  EXPECT_EQ(m.num_experts, 256);
  EXPECT_EQ(m.top_k, 8);
  EXPECT_EQ(m.expert_width, 2048);
  EXPECT_EQ(m.router, RouterKind::SigmoidTopK);
  EXPECT_TRUE(m.score_correction_bias && m.norm_topk_prob);
  EXPECT_EQ(m.n_group, 8);
  EXPECT_EQ(m.topk_group, 4);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 2.5);
  EXPECT_EQ(m.shared_expert_width, 2048);
  EXPECT_FALSE(m.shared_expert_gate);
  EXPECT_EQ(c.linear_format, WeightFormat::FP8);
  EXPECT_EQ(c.ignored_weights, (std::vector<std::string>{"model.layers.61."}));
  ASSERT_EQ(c.layers.size(), 61u);
  // softmax scale: 192^-1/2 x yarn_get_mscale(40, 1.0)^2 = (0.1 ln 40 + 1)^2 / sqrt(192)
  const double ms = 0.1 * std::log(40.0) + 1.0;
  for (int64_t l = 0; l < 61; ++l) {
    const LayerSpec& s = c.layers[static_cast<size_t>(l)];
    EXPECT_EQ(s.mixer, TokenMixer::LatentAttention);
    EXPECT_NEAR(s.attention.scale, ms * ms / std::sqrt(192.0), 1e-15);
    EXPECT_EQ(s.mlp, l < 3 ? ChannelMixer::Dense : ChannelMixer::MoE) << l;
    EXPECT_EQ(s.mlp_width, l < 3 ? 18432 : 2048) << l;
  }
  const WeightNames& n = family_of(c.arch).names;
  EXPECT_EQ(n.router, "mlp.gate.weight");
  EXPECT_EQ(n.router_score_bias, "mlp.gate.e_score_correction_bias");
  EXPECT_EQ(n.shared_expert, "mlp.shared_experts.");
  EXPECT_EQ(n.kv_a, "self_attn.kv_a_proj_with_mqa");
  // parameters, written out: MLA (q_a, q_a_layernorm, q_b, kv_a_proj_with_mqa, kv_a_layernorm, kv_b, o) and the two
  // norms in every layer; 3 dense MLPs; 58 MoE layers of a router with its bias, 256 experts and the shared expert
  const int64_t H = 7168, V = 129280, Ie = 2048, E = 256;
  const int64_t attn = H * 1536 + 1536 + 1536 * 128 * 192 + H * 576 + 512 + 512 * 128 * 256 + 128 * 128 * H + 2 * H;
  const int64_t dense = 3 * H * 18432, router = E * H + E, expert = 3 * H * Ie;
  const TargetParams p = target_params(c);
  EXPECT_EQ(p.total, 2 * V * H + H + 61 * attn + 3 * dense + 58 * (router + E * expert + expert));
  EXPECT_EQ(p.active, V * H + H + 61 * attn + 3 * dense + 58 * (router + 8 * expert + expert));
  EXPECT_EQ(p.total, 671026419200);   // the card's "671B total parameters" (the MTP module's 14B apart)
  EXPECT_NEAR(p.active / 1e9, 36.63, 0.005);  // and "37B activated"
  // FP8: every projection (not the router, the norms, the embedding or lm_head)
  EXPECT_EQ(p.fp8, 61 * (attn - 2 * H - 1536 - 512) + 3 * dense + 58 * (E * expert + expert));
  // default target layers: the spec's rule over 61 layers
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 15, 30, 44, 58}));
  // with 6 taps it is z-lab/Kimi-K2.5-DFlash's published target_layer_ids (6 draft layers, block 8, mask id 163838)
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 6), (std::vector<int64_t>{1, 12, 24, 35, 47, 58}));
  // the drafter: z-lab/Kimi-K2.5-DFlash's shape (the target's heads, 8 kv heads of 128, MLP intermediate_size)
  const DrafterConfig dc = DrafterConfig::for_target(c, 5, 16, {1, 15, 30, 44, 58}, 128000);
  EXPECT_EQ(dc.intermediate_size, 18432);
  EXPECT_EQ(dc.num_heads, 128);
  EXPECT_EQ(dc.num_kv_heads, 8);
  EXPECT_EQ(dc.head_dim, 128);
}

TEST(DeepseekV3Config, KimiK2IsTheSameArchitecture) {
  const ModelConfig c = parse_model_config(kimi_k2(), "/models/Kimi-K2-Instruct/config.json");
  EXPECT_EQ(c.arch, Arch::DeepseekV3);
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_EQ(c.moe.num_experts, 384);
  EXPECT_EQ(c.moe.n_group, 1);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.827);
  EXPECT_EQ(c.layers[0].mlp, ChannelMixer::Dense);
  EXPECT_EQ(c.layers[1].mlp, ChannelMixer::MoE);
  EXPECT_TRUE(c.ignored_weights.empty());
  const TargetParams p = target_params(c);
  EXPECT_NEAR(p.total / 1e12, 1.03, 0.01);   // the card's "1T total"
  EXPECT_NEAR(p.active / 1e9, 31.69, 0.005);  // and "32B activated"
  json j = kimi_k2();
  j["model_type"] = "kimi_k25";  // the image-text checkpoint is not read
  EXPECT_TRUE(has(error_of(j), "unsupported model_type 'kimi_k25'")) << error_of(j);
  EXPECT_TRUE(has(supported_model_types(), "deepseek_v3, kimi_k2"));
}

TEST(DeepseekV3Config, DefaultsAndQProj) {
  json j = deepseek_v3();
  j["q_lora_rank"] = nullptr;  // DeepSeek-V2-Lite's q_proj
  for (const char* k : {"n_group", "topk_group", "routed_scaling_factor", "first_k_dense_replace", "rope_interleave",
                        "num_nextn_predict_layers", "num_key_value_heads", "bos_token_id", "eos_token_id"})
    j.erase(k);
  const ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_EQ(c.moe.n_group, 8);  // DeepseekV3Config's defaults
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.layers[2].mlp, ChannelMixer::Dense);
  EXPECT_EQ(c.layers[3].mlp, ChannelMixer::MoE);
  EXPECT_TRUE(c.mla.rope_interleave);
  EXPECT_TRUE(c.ignored_weights.empty());
  EXPECT_EQ(c.num_key_value_heads, 128);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  // without YaRN the scale is qk_head_dim^-1/2
  j.erase("rope_scaling");
  EXPECT_DOUBLE_EQ(parse_model_config(j, "x").layers[0].attention.scale, 1.0 / std::sqrt(192.0));
}

TEST(DeepseekV3Config, RefusalsNameTheField) {
  auto refused = [](const char* key, const json& value, const std::string& part) {
    json j = deepseek_v3();
    j[key] = value;
    const std::string e = error_of(j);
    EXPECT_TRUE(has(e, key) && has(e, part)) << key << ": " << e;
  };
  refused("scoring_func", "softmax", "'softmax' is not supported (sigmoid)");
  refused("topk_method", "group_limited_greedy", "'group_limited_greedy' is not supported");
  refused("moe_layer_freq", 2, "moe_layer_freq: 2 is not supported");
  refused("attention_bias", true, "no biases");
  refused("hidden_act", "gelu", "'gelu' is not supported (silu)");
  refused("num_key_value_heads", 16, "num_key_value_heads: 16 is not supported");
  refused("n_group", 7, "must divide n_routed_experts = 256");
  refused("topk_group", 9, "must be in [1, n_group = 8]");
  refused("qk_rope_head_dim", 63, "positive even number");
  refused("v_head_dim", 256, "wider than");
  refused("first_k_dense_replace", 62, "first_k_dense_replace: 62");
  json j = deepseek_v3();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_TRUE(has(error_of(j), "rope type 'linear' is not supported")) << error_of(j);
  j = deepseek_v3();
  j["n_group"] = 64;  // groups of 4 experts, 4 kept: 16 candidates >= 8
  j["topk_group"] = 1;  // 4 candidates < 8
  EXPECT_TRUE(has(error_of(j), "cannot give num_experts_per_tok = 8")) << error_of(j);
}

// ---- the goldens of tools/ref_deepseek_v3.py -------------------------------------------------------------------------

TEST(TargetGolden, DeepseekV3MatchesTheReference) {
  check_golden("target_deepseek_v3", "cpu", {.experts = true});
}
// fp64: bounded by the golden's F32 storage (~3e-8 relative), the reference being float64 but for the RoPE angles;
// 1e-6 leaves room for transformers' own golden (tools/make_goldens_families.py), whose router runs in fp32 even in a
// float64 model (DeepseekV3TopkRouter casts to float32)
TEST(TargetGolden, DeepseekV3InFp64) { check_golden("target_deepseek_v3", "cpu64", {.f64 = 1e-6, .experts = true}); }
TEST(TargetGolden, DeepseekV3KimiMatchesTheReference) {
  check_golden("target_deepseek_v3_kimi", "cpu", {.experts = true});
}
TEST(TargetGolden, DeepseekV3KimiInFp64) {
  check_golden("target_deepseek_v3_kimi", "cpu64", {.f64 = 1e-6, .experts = true});
}

// The golden's softmax scale and RoPE attention factor are those its config implies (mscale_all_dim 0.707 makes both
// differ from the plain ones): the scale of the plan, af^2 on the RoPE part of q.
TEST(TargetGolden, DeepseekV3ScaleAndAttentionFactor) {
  const ModelConfig c = load_model_config(golden_dir());
  auto g = SafetensorsFile::open(golden_dir() + "/golden.safetensors");
  const double want = std::stod(g->metadata().at("softmax_scale")), af = std::stod(g->metadata().at("rope_attention_factor"));
  EXPECT_NEAR(c.layers[0].attention.scale, want, 1e-15);
  EXPECT_NE(want, 1.0 / std::sqrt(24.0));
  EXPECT_NEAR(c.rope_scaling.attention_scaling(), af, 1e-15);
  EXPECT_GT(std::abs(af - 1.0), 0.01);
}

// A random DeepSeek-V3 target (MLA with q_lora_rank, groups, shared expert, a dense first layer): prefill, packed
// prefill and a KV-cached decode agree.
TEST(DeepseekV3Target, RandomTargetRunsEveryPath) {
  json j = json::parse(read_file(golden_dir() + "/config.json"));
  j["num_hidden_layers"] = 3;
  j["num_nextn_predict_layers"] = 0;
  j["vocab_size"] = 64;
  const ModelConfig cfg = parse_model_config(j, "tiny");
  auto ctx = make_context("cpu64");
  auto tg = Target::random(cfg, *ctx, 4);
  std::vector<int32_t> a = {1, 5, 9, 13, 2, 7}, b = {3, 3, 60};
  auto fa = test::check_packed_prefill(*ctx, *tg, a, b, {0, 2}, 1e-12);
  EXPECT_EQ(fa.router_topk[1].shape, (Shape{6, 4}));
  KVCache cache = KVCache::create(*ctx, cfg, 8);
  tg->forward(*ctx, cpu_tensor_i32({1, 5, 9, 13}, {4}), {}, true, &cache);
  tg->forward(*ctx, cpu_tensor_i32({2}, {1}), {}, true, &cache);
  auto last = tg->forward(*ctx, cpu_tensor_i32({7}, {1}), {}, true, &cache);
  const auto lf = test::to_f64(last.final_hidden), full = test::to_f64(fa.final_hidden);
  for (int64_t c = 0; c < 64; ++c) EXPECT_NEAR(lf[static_cast<size_t>(c)], full[static_cast<size_t>(5 * 64 + c)], 1e-10);
  EXPECT_EQ(cache.layers[0].k.shape, (Shape{8, 4, 24}));  // expanded k and v: nh x (nope + rope)
}

// FP8 as published (weight_scale_inv blocks; the router, its bias and the norms not converted): with 16 x 16 blocks
// each head's RoPE rows lie in one block and the reordered projections stay FP8; with 12-row blocks kv_a_proj's RoPE
// rows straddle two and it is dequantised when loaded. Either way the forward equals the model with every weight
// dequantised, value for value.
TEST(DeepseekV3Load, Fp8CheckpointEqualsItsDequantisation) {
  for (const int bn : {16, 12}) {
    TmpDir q(cat("deepseek_fp8_", bn)), p(cat("deepseek_fp8_plain_", bn));
    auto cpu = make_context("cpu");
    auto ws = WeightStore::open(golden_dir());
    std::vector<std::pair<std::string, Tensor>> qt, pt;
    for (const std::string& n : ws.names()) {
      const Tensor v = ws.f32(n);
      const bool proj = n.starts_with("model.layers.") && n.ends_with("proj.weight") && v.ndim() == 2;
      const bool mqa = n.ends_with("kv_a_proj_with_mqa.weight");
      if (!proj && !mqa) {
        qt.emplace_back(n, v);
        pt.emplace_back(n, v);
        continue;
      }
      const LinearWeight w = cpu->quantize_fp8(v, bn, 16);
      qt.emplace_back(n, w.w);
      qt.emplace_back(n.substr(0, n.size() - 6) + "weight_scale_inv", w.scale);
      pt.emplace_back(n, fp8_dequantize(w));
    }
    write_safetensors(q.path + "/model.safetensors", qt);
    write_safetensors(p.path + "/model.safetensors", pt);
    json c = json::parse(read_file(golden_dir() + "/config.json"));
    write_file_atomic(p.path + "/config.json", c.dump(2));
    c["quantization_config"] = deepseek_v3()["quantization_config"];
    c["quantization_config"]["weight_block_size"] = {bn, 16};
    write_file_atomic(q.path + "/config.json", c.dump(2));
    auto ctx = make_context("cpu");
    auto a = Target::load(q.path, *ctx), b = Target::load(p.path, *ctx);
    const auto* mla = std::any_cast<LatentAttnWeights>(&a->weights().layers[1].mixer);
    ASSERT_NE(mla, nullptr);
    EXPECT_TRUE(mla->wq_b.fp8() && mla->wkv_b.fp8() && mla->wo.fp8());
    EXPECT_EQ(mla->wkv_a.fp8(), bn == 16) << bn;  // rows 32..39: one block of 16, two of 12
    // the experts (I = 16) stay FP8 in 16-row blocks; 12-row blocks straddle two experts: dequantised when loaded
    EXPECT_EQ(a->weights().layers[1].moe.gate_up_fp8.defined(), bn == 16) << bn;
    const Tensor ids = SafetensorsFile::open(golden_dir() + "/golden.safetensors")->view("input_ids");
    const std::vector<int64_t> all = {0, 1, 2, 3};
    auto fa = a->forward(*ctx, ids, all, true);
    auto fb = b->forward(*ctx, ids, all, true);
    EXPECT_EQ(to_f32_vector(fa.features), to_f32_vector(fb.features)) << bn;
    EXPECT_EQ(to_f32_vector(fa.final_hidden), to_f32_vector(fb.final_hidden)) << bn;
  }
}

// ---- dflash info ------------------------------------------------------------------------------------------------------

TEST(DeepseekV3Info, PlanParametersAndIgnoredMtp) {
  TmpDir tmp("deepseek_info");
  write_file_atomic(tmp.path + "/config.json", deepseek_v3().dump());
  const json o = json::parse(test::dflash_output("info " + tmp.path + " --json", tmp.path + "/out.json"))["config"];
  EXPECT_EQ(o["family"], "DeepSeek-V3");
  ASSERT_EQ(o["layers"].size(), 2u);
  EXPECT_EQ(o["layers"][0]["layers"], "0-2");
  EXPECT_EQ(o["layers"][1]["layers"], "3-60");
  const std::string mla = "latent attention (q rank 1536, kv rank 512, 128 heads of 128 + 64 rope, v 128, "
                          "interleaved rope, scale ";
  EXPECT_TRUE(has(o["layers"][1]["plan"].get<std::string>(), mla)) << o["layers"][1]["plan"];
  EXPECT_TRUE(has(o["layers"][1]["plan"].get<std::string>(),
                  "+ MoE 256 experts top-8 of width 2048 (sigmoid router, score-correction bias; top-4 of 8 groups; "
                  "top-k renormalised; x 2.5) + shared expert of width 2048 (no gate)"))
      << o["layers"][1]["plan"];
  EXPECT_EQ(o["latent_attention"]["kv_lora_rank"], 512);
  EXPECT_EQ(o["params"]["total"].get<int64_t>(), 671026419200);
  EXPECT_EQ(o["default_target_layer_ids_nf5"], json({1, 15, 30, 44, 58}));
  const std::string t = test::dflash_output("info " + tmp.path, tmp.path + "/out.txt");
  EXPECT_TRUE(has(t, "arch: deepseek_v3 (DeepSeek-V3, DeepseekV3ForCausalLM)")) << t;
  EXPECT_TRUE(has(t, "params: 671.03B total, 36.63B active per token")) << t;
  // the golden directory: its MTP layer's tensors (model.layers.4.*) are counted and ignored by name
  const std::string g = test::dflash_output("info " + golden_dir(), tmp.path + "/g.txt");
  EXPECT_TRUE(has(g, "ignored by name (not the language model): 2 tensors under model.layers.4.")) << g;
}

// ---- end to end -------------------------------------------------------------------------------------------------------

// Real speculative decoding through the DeepSeek-V3 target's expanded MLA cache reproduces the target-only greedy
// decode, and batched generation equals one sequence at a time.
TEST(DeepseekV3EndToEnd, SpeculativeDecodingAndBatchedGeneration) {
  auto ctx = make_context("cpu", {.threads = 2});
  auto target = Target::load(golden_dir(), *ctx);
  test::check_lossless_decoding(*ctx, *target, 29, "deepseek_v3");
}

// dflash capture writes HF's output_hidden_states (the embedding, every layer, the final norm), the logits and the
// experts chosen in the MoE layers (none for the dense layer 0), as the reference computes them.
TEST(DeepseekV3EndToEnd, CaptureWritesHfHiddenStates) {
  TmpDir tmp("deepseek_capture");
  auto g = SafetensorsFile::open(golden_dir() + "/golden.safetensors");
  const Tensor ids = g->view("input_ids");
  json row = {{"input_ids", std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + ids.numel())}};
  write_file_atomic(tmp.path + "/ids.jsonl", row.dump() + "\n");
  test::dflash_output(cat("capture --target ", golden_dir(), " --input ", tmp.path, "/ids.jsonl --out ", tmp.path,
                          "/f.safetensors --logits --router"), tmp.path + "/log.txt");
  auto f = SafetensorsFile::open(tmp.path + "/f.safetensors");
  for (int i = 0; i <= 4; ++i)
    EXPECT_LT(test::rel_err(test::to_f64(f->view(cat("row_0.hidden_", i))), test::to_f64(g->view(cat("hidden_states.", i)))),
              2e-5)
        << "hidden_" << i;
  EXPECT_LT(test::rel_err(test::to_f64(f->view("row_0.logits")), test::to_f64(g->view("logits"))), 2e-5);
  EXPECT_EQ(f->find("row_0.router_0"), nullptr);  // the dense layer
  auto i32 = [](const Tensor& t) { return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel()); };
  for (int l = 1; l < 4; ++l)
    EXPECT_EQ(i32(f->view(cat("row_0.router_", l))), i32(g->view(cat("router_topk.", l)))) << "layer " << l;
}

// Training on the DeepSeek-V3 golden target: 2 + 2 workers give the loss and parameters of 1 + 1, the loss falls, the
// export evaluates losslessly.
TEST(Pipeline, DeepseekV3TargetTwoPlusTwoMatchesOneWorkerAndEvaluates) {
  test::expect_family_pipeline(golden_dir(), "deepseek_v3", 96);
}
