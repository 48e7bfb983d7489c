// tests/families/minimax_m2.cpp — MiniMax-M2 (io/model_family_minimax.h): the published config.json (MiniMax-M2.5's,
// FP8) parsed, its plan, parameters (against the checkpoint's tensor count) and default target layers; refusals by
// name; the tiny golden of tools/ref_minimax_m2.py (an independent float64 reading of transformers' forward: every
// layer, the experts chosen with the score-correction bias, the cached decode); the bias changing the choice; a
// random target through every forward path; the FP8 checkpoint layout (w1 / w3 / w2 experts kept FP8) against its
// dequantisation; `dflash info`; speculative decoding; training 2 + 2 = 1 worker and eval.
// The router op: tests/ops/moe.cpp (MoeOps.RouteSigmoidWithChoiceBias).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/target.h"
#include "model/target/attention.h"
#include "common/decode_checks.h"
#include "common/golden_checks.h"
#include "common/test_util.h"
#include "common/train_fixtures.h"

using namespace dflash;
using nlohmann::json;
using test::check_golden;
using test::source_dir;
using test::TmpDir;
namespace fs = std::filesystem;

namespace {

// MiniMaxAI/MiniMax-M2.5 config.json as published (attn_type_list: 62 entries of 1, written out below)
json minimax_m25() {
  json j = json::parse(R"({
  "architectures": ["MiniMaxM2ForCausalLM"],
  "auto_map": {"AutoConfig": "configuration_minimax_m2.MiniMaxM2Config",
               "AutoModelForCausalLM": "modeling_minimax_m2.MiniMaxM2ForCausalLM"},
  "dtype": "bfloat16", "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
  "max_position_embeddings": 204800, "model_type": "minimax_m2", "mtp_transformer_layers": 1,
  "num_attention_heads": 48, "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8,
  "num_local_experts": 256, "num_mtp_modules": 3, "qk_norm_type": "per_layer",
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                          "weight_block_size": [128, 128],
                          "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]},
  "rms_norm_eps": 1e-06, "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid",
  "shared_intermediate_size": 0, "tie_word_embeddings": false, "transformers_version": "4.46.1", "use_cache": true,
  "use_mtp": true, "use_qk_norm": true, "use_routing_bias": true, "vocab_size": 200064})");
  j["attn_type_list"] = std::vector<int>(62, 1);
  return j;
}

std::string error_of(const json& j) {
  try {
    parse_model_config(j, "/models/MiniMax-M2.5/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string& golden_dir() {
  static const std::string d = test::source_dir() + "/tests/golden/target_minimax_m2";
  return d;
}

}  // namespace

// ---- config, plan, parameters ---------------------------------------------------------------------------------------

TEST(MiniMaxM2Config, PublishedM25) {
  const ModelConfig c = parse_model_config(minimax_m25(), "/models/MiniMax-M2.5/config.json");
  EXPECT_EQ(c.arch, Arch::MiniMaxM2);
  EXPECT_STREQ(arch_name(c.arch), "minimax_m2");
  EXPECT_EQ(c.architecture, "MiniMaxM2ForCausalLM");
  EXPECT_EQ(family_of(c.arch).title, std::string("MiniMax-M2"));
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_dim(), 64);  // rotary_dim 64 of 128
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.rope_scaling.kind, "none");
  EXPECT_EQ(c.max_position_embeddings, 204800);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 200034);  // MiniMaxM2Config's defaults: the file names neither
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{200020}));
  EXPECT_EQ(c.moe.num_experts, 256);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.expert_width, 1536);
  EXPECT_EQ(c.moe.router, RouterKind::SigmoidTopK);
  EXPECT_TRUE(c.moe.score_correction_bias);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_FALSE(c.moe.router_bias || c.moe.expert_bias);
  EXPECT_EQ(c.moe.shared_expert_width, 0);
  EXPECT_EQ(c.linear_format, WeightFormat::FP8);
  EXPECT_EQ(c.fp8.granularity(), "block 128x128");
  EXPECT_EQ(c.fp8.scale_name, "weight_scale_inv");
  EXPECT_EQ(c.ignored_weights, (std::vector<std::string>{"model.layers.62.", "model.layers.63.", "model.layers.64."}));
  ASSERT_EQ(c.layers.size(), 62u);
  for (const LayerSpec& s : c.layers) {
    EXPECT_EQ(s.mixer, TokenMixer::Attention);
    EXPECT_TRUE(s.attention.qk_norm && s.attention.qk_norm_all_heads);
    EXPECT_FALSE(s.attention.bias || s.attention.out_bias || s.attention.sinks || s.attention.output_gate);
    EXPECT_EQ(s.attention.sliding_window, 0);
    EXPECT_EQ(s.mlp, ChannelMixer::MoE);
    EXPECT_EQ(s.mlp_width, 1536);
  }
  const WeightNames& n = family_of(c.arch).names;
  EXPECT_EQ(n.router, "block_sparse_moe.gate.weight");
  EXPECT_EQ(n.router_score_bias, "block_sparse_moe.e_score_correction_bias");
  EXPECT_EQ(n.expert, "block_sparse_moe.experts.");
  EXPECT_EQ(n.expert_gate + n.expert_up + n.expert_down, "w1.weightw3.weightw2.weight");
  // parameters, written out: attention (q, k, v, o; q_norm [nh d] and k_norm [nkv d] over all heads), the two
  // norms, the router and its correction bias, 256 experts of 3 H I; the embedding, lm_head and final norm
  const int64_t H = 3072, V = 200064, I = 1536, E = 256, L = 62;
  const int64_t attn = 2 * H * 48 * 128 + 2 * H * 8 * 128 + (48 + 8) * 128 + 2 * H;
  const int64_t router = E * H + E, expert = 3 * H * I;
  const TargetParams p = target_params(c);
  EXPECT_EQ(p.total, 2 * V * H + H + L * (attn + router + E * expert));
  EXPECT_EQ(p.active, V * H + H + L * (attn + router + 8 * expert));
  EXPECT_NEAR(p.total / 1e9, 228.69, 0.005);  // the card's "230B total"
  EXPECT_NEAR(p.active / 1e9, 10.42, 0.005);  // and "10B active"
  // the FP8 projections (attention q/k/v/o, every expert) and one F32 scale per 128 x 128 block: the checkpoint holds
  // these tensors' elements plus the scales; Hugging Face's count of MiniMax-M2.5's safetensors is 228,703,644,928
  const int64_t proj = 2 * H * 48 * 128 + 2 * H * 8 * 128 + E * expert;
  EXPECT_EQ(p.fp8, L * proj);
  const int64_t scales = L * (2 * (48 * 128 / 128) * (H / 128) + 2 * (8 * 128 / 128) * (H / 128) +
                              E * 3 * (I / 128) * (H / 128));
  EXPECT_EQ(p.fp8_scale_bytes, 4 * scales);
  EXPECT_EQ(p.total + scales, 228703644928);
  // default target layers: the spec's rule over 62 layers (round half away from zero: 15.5 -> 16, 44.5 -> 45)
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 16, 30, 45, 59}));
  // the drafter: the general rule (the target's 48 heads of 128, 8 kv heads; MLP 3 H for an MoE target)
  EXPECT_EQ(default_intermediate_size(c), 3 * H);
  const DrafterConfig dc = DrafterConfig::for_target(c, 5, 16, {1, 16, 30, 45, 59}, 200063);
  EXPECT_EQ(dc.intermediate_size, 3 * H);
  EXPECT_EQ(dc.num_heads, 48);
  EXPECT_EQ(dc.num_kv_heads, 8);
}

TEST(MiniMaxM2Config, RotaryAndDefaults) {
  json j = minimax_m25();
  j.erase("rotary_dim");
  EXPECT_EQ(parse_model_config(j, "x").rope_dim(), 128);  // neither key: all of head_dim
  j["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(parse_model_config(j, "x").rope_dim(), 64);
  j.erase("partial_rotary_factor");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000000.0}, {"partial_rotary_factor", 0.5}};
  EXPECT_EQ(parse_model_config(j, "x").rope_dim(), 64);  // as transformers 5 writes it
  j["rotary_dim"] = 64;
  EXPECT_EQ(parse_model_config(j, "x").rope_dim(), 64);  // both, agreeing
  j = minimax_m25();
  for (const char* k : {"num_key_value_heads", "rope_theta", "num_mtp_modules", "use_routing_bias", "qk_norm_type"})
    j.erase(k);
  const ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.num_key_value_heads, 8);       // MiniMaxM2Config's default
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);       // its default_theta
  EXPECT_TRUE(c.ignored_weights.empty());
  EXPECT_TRUE(c.moe.score_correction_bias);  // the block always has the buffer
  EXPECT_TRUE(c.layer(0).attention.qk_norm_all_heads);
  j["use_routing_bias"] = false;
  EXPECT_FALSE(parse_model_config(j, "x").moe.score_correction_bias);
}

TEST(MiniMaxM2Config, RefusalsNameTheField) {
  auto refused = [](const char* key, const json& value, const std::string& part) {
    json j = minimax_m25();
    j[key] = value;
    const std::string e = error_of(j);
    EXPECT_TRUE(has(e, key) && has(e, part)) << key << ": " << e;
  };
  refused("scoring_func", "softmax", "'softmax' is not supported (sigmoid)");
  refused("use_qk_norm", false, "use_qk_norm: false is not supported");
  refused("qk_norm_type", "per_head", "'per_head' is not supported");
  refused("shared_intermediate_size", 1536, "a shared expert");
  refused("routed_scaling_factor", 2.5, "not supported");
  refused("sliding_window", 4096, "full causal");
  refused("attention_bias", true, "no biases");
  refused("hidden_act", "gelu", "'gelu' is not supported (silu)");
  refused("rotary_dim", 63, "even number");
  refused("num_experts_per_tok", 300, "num_local_experts = 256");
  json j = minimax_m25();
  j["attn_type_list"][5] = 0;  // MiniMax-01's lightning attention
  EXPECT_TRUE(has(error_of(j), "attn_type_list[5]: 0 is not supported")) << error_of(j);
  j = minimax_m25();
  j["partial_rotary_factor"] = 0.25;
  EXPECT_TRUE(has(error_of(j), "rotary_dim 64 disagrees with partial_rotary_factor")) << error_of(j);
  j = minimax_m25();
  j["quantization_config"]["fmt"] = "e5m2";
  EXPECT_TRUE(has(error_of(j), "quantization_config.fmt: 'e5m2' is not supported")) << error_of(j);
}

// ---- the golden of tools/ref_minimax_m2.py ----------------------------------------------------------------------------

TEST(TargetGolden, MiniMaxM2MatchesTheReference) {
  check_golden("target_minimax_m2", "cpu", {.experts = true});
}

// fp64: bounded by the golden's F32 storage (~3e-8 relative), the reference being float64 throughout
TEST(TargetGolden, MiniMaxM2InFp64) { check_golden("target_minimax_m2", "cpu64", {.f64 = 1e-7, .experts = true}); }

// The correction bias decides which experts: the same weights read with use_routing_bias false choose other experts
// for some tokens of every layer (as the reference printed: 16-21 of 40), and the golden's choice needs it.
TEST(TargetGolden, MiniMaxM2CorrectionBiasChangesTheExpertsChosen) {
  TmpDir tmp("minimax_nobias");
  json c = json::parse(read_file(golden_dir() + "/config.json"));
  c["use_routing_bias"] = false;
  write_file_atomic(tmp.path + "/config.json", c.dump(2));
  fs::create_symlink(golden_dir() + "/model.safetensors", tmp.path + "/model.safetensors");
  auto ctx = make_context("cpu64");
  auto g = SafetensorsFile::open(golden_dir() + "/golden.safetensors");
  auto with = Target::load(golden_dir(), *ctx), without = Target::load(tmp.path, *ctx);
  const Tensor ids = g->view("input_ids");
  auto a = with->forward(*ctx, ids, {}, true), b = without->forward(*ctx, ids, {}, true);
  for (int l = 0; l < 4; ++l) {
    const Tensor want = g->view(cat("router_topk.", l));
    const Tensor ta = a.router_topk[static_cast<size_t>(l)], tb = b.router_topk[static_cast<size_t>(l)];
    int64_t rows_differ = 0;
    for (int64_t t = 0; t < ids.numel(); ++t) {
      bool d = false;
      for (int j = 0; j < 2; ++j) {
        EXPECT_EQ(ta.ptr<int32_t>()[t * 2 + j], want.ptr<int32_t>()[t * 2 + j]) << "layer " << l << " token " << t;
        d |= tb.ptr<int32_t>()[t * 2 + j] != want.ptr<int32_t>()[t * 2 + j];
      }
      rows_differ += d;
    }
    EXPECT_GE(rows_differ, 8) << "layer " << l;
  }
}

// A random MiniMax-M2 target (partial rotary, all-heads q/k norm, sigmoid router): prefill, packed prefill and a
// KV-cached decode agree.
TEST(MiniMaxM2Target, RandomTargetRunsEveryPath) {
  json j = minimax_m25();
  j.erase("quantization_config");
  j["hidden_size"] = 32;
  j["intermediate_size"] = 16;
  j["num_hidden_layers"] = 3;
  j["attn_type_list"] = {1, 1, 1};
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 16;
  j["rotary_dim"] = 8;
  j["num_local_experts"] = 8;
  j["num_experts_per_tok"] = 3;
  j["vocab_size"] = 64;
  const ModelConfig cfg = parse_model_config(j, "tiny");
  auto ctx = make_context("cpu64");
  auto tg = Target::random(cfg, *ctx, 4);
  std::vector<int32_t> a = {1, 5, 9, 13, 2, 7}, b = {3, 3, 60};
  auto fa = test::check_packed_prefill(*ctx, *tg, a, b, {0, 2}, 1e-12);
  EXPECT_EQ(fa.router_topk[1].shape, (Shape{6, 3}));
  KVCache cache = KVCache::create(*ctx, cfg, 8);
  tg->forward(*ctx, cpu_tensor_i32({1, 5, 9, 13}, {4}), {}, true, &cache);
  tg->forward(*ctx, cpu_tensor_i32({2}, {1}), {}, true, &cache);
  auto last = tg->forward(*ctx, cpu_tensor_i32({7}, {1}), {}, true, &cache);
  const auto lf = test::to_f64(last.final_hidden), full = test::to_f64(fa.final_hidden);
  for (int64_t c = 0; c < 32; ++c) EXPECT_NEAR(lf[static_cast<size_t>(c)], full[static_cast<size_t>(5 * 32 + c)], 1e-10);
}

// The published FP8 layout: attention projections and the w1 / w3 / w2 experts in F8_E4M3 with weight_scale_inv
// blocks (16 x 16 here), the router and the correction bias not converted, quantization_config as published (fmt
// float8_e4m3fn). The experts stay FP8 (stacked per layer); the forward equals the model with every weight
// dequantised, value for value.
TEST(MiniMaxM2Load, Fp8CheckpointEqualsItsDequantisation) {
  TmpDir q("minimax_fp8"), p("minimax_fp8_plain");
  auto cpu = make_context("cpu");
  auto ws = WeightStore::open(golden_dir());
  std::vector<std::pair<std::string, Tensor>> qt, pt;
  int quantized = 0;
  for (const std::string& n : ws.names()) {
    const Tensor v = ws.f32(n);
    const bool proj = n.starts_with("model.layers.") && n.ends_with(".weight") && v.ndim() == 2 &&
                      (has(n, "_proj.") || has(n, ".w1.") || has(n, ".w2.") || has(n, ".w3."));
    if (!proj) {
      qt.emplace_back(n, v);
      pt.emplace_back(n, v);
      continue;
    }
    const LinearWeight w = cpu->quantize_fp8(v, 16, 16);
    qt.emplace_back(n, w.w);
    qt.emplace_back(n.substr(0, n.size() - 6) + "weight_scale_inv", w.scale);
    pt.emplace_back(n, fp8_dequantize(w));
    ++quantized;
  }
  EXPECT_EQ(quantized, 4 * (4 + 8 * 3) + 1);  // + the MTP module's q_proj
  write_safetensors(q.path + "/model.safetensors", qt);
  write_safetensors(p.path + "/model.safetensors", pt);
  json c = json::parse(read_file(golden_dir() + "/config.json"));
  write_file_atomic(p.path + "/config.json", c.dump(2));
  c["quantization_config"] = minimax_m25()["quantization_config"];
  c["quantization_config"]["weight_block_size"] = {16, 16};
  write_file_atomic(q.path + "/config.json", c.dump(2));
  auto ctx = make_context("cpu");
  auto a = Target::load(q.path, *ctx), b = Target::load(p.path, *ctx);
  const auto& moe = a->weights().layers[0].moe;
  ASSERT_TRUE(moe.gate_up_fp8.defined());
  EXPECT_EQ(moe.gate_up_fp8.w.shape, (Shape{8 * 64, 64}));  // [E 2I, H]
  EXPECT_TRUE(moe.score_bias.defined());
  const auto* attn = std::any_cast<AttentionWeights>(&a->weights().layers[0].mixer);
  ASSERT_NE(attn, nullptr);
  EXPECT_TRUE(attn->wq.fp8());
  EXPECT_EQ(attn->q_norm.numel(), 4 * 32);  // over all heads
  const Tensor ids = SafetensorsFile::open(golden_dir() + "/golden.safetensors")->view("input_ids");
  const std::vector<int64_t> all = {0, 1, 2, 3};
  auto fa = a->forward(*ctx, ids, all, true);
  auto fb = b->forward(*ctx, ids, all, true);
  EXPECT_EQ(to_f32_vector(fa.features), to_f32_vector(fb.features));
  EXPECT_EQ(to_f32_vector(fa.final_hidden), to_f32_vector(fb.final_hidden));
}

// ---- dflash info ------------------------------------------------------------------------------------------------------

TEST(MiniMaxM2Info, PlanParametersAndIgnoredMtp) {
  TmpDir tmp("minimax_info");
  write_file_atomic(tmp.path + "/config.json", minimax_m25().dump());
  const json o = json::parse(test::dflash_output("info " + tmp.path + " --json", tmp.path + "/out.json"))["config"];
  EXPECT_EQ(o["family"], "MiniMax-M2");
  ASSERT_EQ(o["layers"].size(), 1u);
  EXPECT_EQ(o["layers"][0]["layers"], "0-61");
  const std::string plan = "attention (qk-norm over all heads, rotary 64 of 128) + MoE 256 experts top-8 of width "
                           "1536 (sigmoid router, score-correction bias; top-k renormalised)";
  EXPECT_EQ(o["layers"][0]["plan"], plan);
  const TargetParams p = target_params(parse_model_config(minimax_m25(), "x"));
  EXPECT_EQ(o["params"]["total"].get<int64_t>(), p.total);
  EXPECT_EQ(o["params"]["active_per_token"].get<int64_t>(), p.active);
  EXPECT_EQ(o["default_target_layer_ids_nf5"], json({1, 16, 30, 45, 59}));
  const std::string t = test::dflash_output("info " + tmp.path, tmp.path + "/out.txt");
  EXPECT_TRUE(has(t, "arch: minimax_m2 (MiniMax-M2, MiniMaxM2ForCausalLM)")) << t;
  EXPECT_TRUE(has(t, "params: 228.69B total, 10.42B active per token")) << t;
  EXPECT_TRUE(has(t, "layer 0-61    " + plan)) << t;
  // the golden directory: its MTP module's tensors (model.layers.4.*) are counted and ignored by name
  const std::string g = test::dflash_output("info " + golden_dir(), tmp.path + "/g.txt");
  EXPECT_TRUE(has(g, "ignored by name (not the language model): 2 tensors under model.layers.4.")) << g;
}

// ---- end to end -------------------------------------------------------------------------------------------------------

// Real speculative decoding through the MiniMax-M2 target's KV cache reproduces the target-only greedy decode, and
// batched generation equals one sequence at a time.
TEST(MiniMaxM2EndToEnd, SpeculativeDecodingAndBatchedGeneration) {
  auto ctx = make_context("cpu", {.threads = 2});
  auto target = Target::load(golden_dir(), *ctx);
  test::check_lossless_decoding(*ctx, *target, 23, "minimax_m2");
}

// Training on the MiniMax-M2 golden target: 2 + 2 workers give the loss and parameters of 1 + 1, the loss falls, the
// export evaluates losslessly.
TEST(Pipeline, MiniMaxM2TargetTwoPlusTwoMatchesOneWorkerAndEvaluates) {
  test::expect_family_pipeline(golden_dir(), "minimax_m2", 3 * 64);
}
