// tests/families/gpt_oss.cpp — gpt-oss on the CPU: the published configs (gpt-oss-20b, gpt-oss-120b and
// GptOssConfig's defaults) and their plan, parameters and MXFP4 bytes; the tiny goldens of transformers (bf16 and MXFP4
// experts, the experts chosen); a checkpoint in MXFP4 against the same weights dequantised into Hugging Face's bf16
// layout (the interleaved gate / up columns); random gpt-oss targets through every forward path; loader refusals;
// `dflash info`; speculative decoding and batched generation through the gpt-oss KV cache; `dflash capture`; training,
// export and eval. Its ops: tests/ops/ (attention_causal: window and sinks; rope: YaRN; mxfp4; moe: the GLU).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/drafter_init.h"
#include "model/target.h"
#include "common/decode_checks.h"
#include "common/golden_checks.h"
#include "common/published_configs.h"
#include "common/test_util.h"
#include "common/train_fixtures.h"

using namespace dflash;
using nlohmann::json;
using test::check_golden;
using test::check_router_topk;
using test::expect_two_plus_two_as_one;
using test::gpt_oss_20b;
using test::make_train_data;
using test::read_metrics_jsonl;
using test::source_dir;
using test::tiny_train_config;
using test::train_tmpdir;
namespace fs = std::filesystem;

namespace {

using test::TmpDir;

std::string error_of(const json& j) {
  try {
    parse_model_config(j, "/models/gpt-oss/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string& golden(const char* name) {
  static std::map<std::string, std::string> dirs;
  auto& d = dirs[name];
  if (d.empty()) d = test::source_dir() + "/tests/golden/" + name;
  return d;
}

}  // namespace

// ---- config, plan, parameters ---------------------------------------------------------------------------------------

TEST(GptOssConfig, Published20B) {
  const ModelConfig c = parse_model_config(gpt_oss_20b(), "/models/gpt-oss-20b/config.json");
  EXPECT_EQ(c.arch, Arch::GptOss);
  EXPECT_STREQ(arch_name(c.arch), "gpt_oss");
  EXPECT_EQ(c.architecture, "GptOssForCausalLM");
  EXPECT_EQ(family_of(c.arch).title, std::string("gpt-oss"));
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 150000.0);
  EXPECT_EQ(c.rope_scaling.kind, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_NEAR(c.rope_scaling.attention_scaling(), 0.1 * std::log(32.0) + 1.0, 1e-15);  // 1.3466
  EXPECT_EQ(c.moe.expert_format, WeightFormat::MXFP4);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{200002}));
  EXPECT_EQ(c.moe.num_experts, 32);
  EXPECT_EQ(c.moe.top_k, 4);
  EXPECT_EQ(c.moe.expert_width, 2880);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.router, RouterKind::TopKSoftmax);
  EXPECT_TRUE(c.moe.router_bias && c.moe.expert_bias);
  EXPECT_EQ(c.moe.act, ExpertAct::ClampedSwiGLU);
  EXPECT_EQ(family_of(c.arch).names.experts_layout, ExpertsLayout::InterleavedColumns);
  ASSERT_EQ(c.layers.size(), 24u);
  for (int64_t l = 0; l < 24; ++l) {
    const LayerSpec s = c.layer(l);
    EXPECT_EQ(s.attention.sliding_window, l % 2 == 0 ? 128 : 0) << l;
    EXPECT_TRUE(s.attention.bias && s.attention.out_bias && s.attention.sinks && !s.attention.qk_norm) << l;
    EXPECT_EQ(s.mlp, ChannelMixer::MoE);
    EXPECT_EQ(s.mlp_width, 2880);
  }
  // parameters as the model card counts them: 20.91B total, 3.61B active (the unembedding counted, the embedding a
  // lookup); the experts' weights in MXFP4 make the 12.8 GiB of the published checkpoint
  const int64_t H = 2880, V = 201088, E = 32;
  const int64_t attn = 2 * H * 4096 + 2 * H * 512 + (4096 + 2 * 512) + H + 64 + 2 * H;  // + biases, sinks, norms
  const int64_t expert = 3 * H * 2880 + 2 * 2880 + H, router = E * H + E;
  const TargetParams p = target_params(c);
  EXPECT_EQ(p.total, 2 * V * H + H + 24 * (attn + router + E * expert));
  EXPECT_EQ(p.active, V * H + H + 24 * (attn + router + 4 * expert));
  EXPECT_EQ(p.mxfp4, 24 * E * 3 * H * 2880);
  EXPECT_NEAR(p.total / 1e9, 20.91, 0.005);
  EXPECT_NEAR(p.active / 1e9, 3.61, 0.005);
  EXPECT_EQ(p.device_bytes(), 2 * (p.total - p.mxfp4) + p.mxfp4 / 32 * 17);
  EXPECT_NEAR(p.device_bytes() / double(1 << 30), 12.82, 0.01);
  // the published drafter (z-lab/gpt-oss-20b-DFlash): target layers [1, 6, 11, 16, 21] (the spec's rule), MLP 7680
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 6, 11, 16, 21}));
  EXPECT_EQ(default_intermediate_size(c), 7680);
  const DrafterConfig dc = DrafterConfig::for_target(c, 8, 8, {1, 6, 11, 16, 21}, 200000);
  EXPECT_EQ(dc.intermediate_size, 7680);
  EXPECT_EQ(dc.rope_scaling.kind, "yarn");
  EXPECT_FLOAT_EQ(dc.softmax_scale(), static_cast<float>(1.0 / 8.0 * std::pow(0.1 * std::log(32.0) + 1.0, 2)));
}

TEST(GptOssConfig, Published120BAndTheConfigClassDefaults) {
  json j = gpt_oss_20b();
  j["num_hidden_layers"] = 36;
  j["num_local_experts"] = 128;
  j["layer_types"] = json::array();
  for (int l = 0; l < 36; ++l) j["layer_types"].push_back(l % 2 ? "full_attention" : "sliding_attention");
  const ModelConfig c = parse_model_config(j, "/models/gpt-oss-120b/config.json");
  const TargetParams p = target_params(c);
  EXPECT_NEAR(p.total / 1e9, 116.83, 0.005);  // the model card's 116.83B
  EXPECT_NEAR(p.active / 1e9, 5.13, 0.005);   // and 5.13B active
  EXPECT_EQ(default_target_layer_ids(36, 5), (std::vector<int64_t>{1, 9, 17, 25, 33}));  // z-lab/gpt-oss-120b-DFlash

  // keys left out take GptOssConfig's defaults (transformers 5.17 default_configs.json: the 120b shapes)
  const ModelConfig d = parse_model_config(json::parse(R"({"model_type": "gpt_oss", "hidden_size": 2880,
      "intermediate_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64, "vocab_size": 201088})"), "x");
  EXPECT_EQ(d.head_dim, 64);
  EXPECT_EQ(d.num_key_value_heads, 8);
  EXPECT_EQ(d.moe.num_experts, 128);
  EXPECT_EQ(d.moe.top_k, 4);
  EXPECT_EQ(d.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(d.rope_theta, 150000.0);
  EXPECT_EQ(d.rope_scaling.kind, "yarn");
  EXPECT_DOUBLE_EQ(d.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(d.rope_scaling.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(d.rope_scaling.beta_slow, 1.0);
  EXPECT_FALSE(d.rope_scaling.truncate);
  EXPECT_EQ(d.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_TRUE(d.attention_bias);
  EXPECT_EQ(d.sliding_window, 128);
  EXPECT_EQ(d.moe.expert_format, WeightFormat::Plain);  // bf16 experts
  EXPECT_EQ(d.layer(0).attention.sliding_window, 128);
  EXPECT_EQ(d.layer(1).attention.sliding_window, 0);
  EXPECT_EQ(d.layer(35).attention.sliding_window, 0);
  EXPECT_EQ(target_params(d).mxfp4, 0);
}

TEST(GptOssConfig, RefusalsNameTheField) {
  json j = gpt_oss_20b();
  j["layer_types"].erase(0);
  std::string m = error_of(j);
  EXPECT_TRUE(has(m, "layer_types") && has(m, "24") && has(m, "config.json")) << m;
  j = gpt_oss_20b();
  j["layer_types"][3] = "linear_attention";
  m = error_of(j);
  EXPECT_TRUE(has(m, "layer_types") && has(m, "linear_attention")) << m;
  j = gpt_oss_20b();
  j["quantization_config"]["quant_method"] = "awq";
  m = error_of(j);
  EXPECT_TRUE(has(m, "quantization_config.quant_method") && has(m, "awq")) << m;
  j = gpt_oss_20b();
  j["swiglu_limit"] = 10.0;
  m = error_of(j);
  EXPECT_TRUE(has(m, "swiglu_limit")) << m;
  j = gpt_oss_20b();
  j["num_experts_per_tok"] = 40;
  m = error_of(j);
  EXPECT_TRUE(has(m, "num_experts_per_tok")) << m;
  j = gpt_oss_20b();
  j["sliding_window"] = 0;
  m = error_of(j);
  EXPECT_TRUE(has(m, "sliding_window")) << m;
  j = gpt_oss_20b();
  j["rope_scaling"]["attention_factor"] = -1.0;
  m = error_of(j);
  EXPECT_TRUE(has(m, "rope_scaling.attention_factor")) << m;
}

// ---- goldens of transformers ----------------------------------------------------------------------------------------

// gpt-oss (tests/golden/target_gpt_oss: 4 layers sliding / full alternating with a window of 16, YaRN factor 4 over 16
// original positions, attention sinks, q/k/v/o biases, 8 experts top-2 with biases and the clamped GLU; 40 tokens, so
// positions run past the window and past YaRN's original length), its experts as HF keeps them in bf16 checkpoints
// (gate_up_proj [E, H, 2I] with interleaved columns), and the same model with MXFP4 experts (the published layout,
// quantization_config mxfp4) whose golden is transformers' forward on its own dequantisation.
TEST(TargetGolden, GptOssMatchesTransformers) { check_golden("target_gpt_oss", "cpu"); }

TEST(TargetGolden, GptOssInFp64) { check_golden("target_gpt_oss", "cpu64"); }

TEST(TargetGolden, GptOssMxfp4MatchesTransformers) { check_golden("target_gpt_oss_mxfp4", "cpu"); }

TEST(TargetGolden, GptOssMxfp4InFp64) { check_golden("target_gpt_oss_mxfp4", "cpu64"); }

// gpt-oss: the router's bias and top-k of the logits choose transformers' experts in every layer, bf16 and MXFP4.
TEST(TargetGolden, GptOssChoosesTheGoldensExperts) {
  EXPECT_EQ(check_router_topk("target_gpt_oss"), 4);
  EXPECT_EQ(check_router_topk("target_gpt_oss_mxfp4"), 4);
}

// ---- the loader: MXFP4 and bf16 checkpoints of the same weights -----------------------------------------------------

namespace {


// t [E, A, B] F32 host -> [E, B, A]
Tensor transposed(const Tensor& t) {
  const int64_t E = t.shape[0], A = t.shape[1], B = t.shape[2];
  Tensor o = cpu_empty(DType::F32, {E, B, A});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b) o.ptr<float>()[(e * B + b) * A + a] = t.ptr<float>()[(e * A + a) * B + b];
  return o;
}

// The MXFP4 golden model rewritten as a bf16-style checkpoint: every expert projection dequantised and stored in HF's
// GptOssExperts layout (gate_up_proj [E, H, 2I] with gate / up interleaved in the columns, down_proj [E, I, H]),
// config.json without quantization_config.
void write_dequantised_copy(const std::string& dst) {
  const std::string src = golden("target_gpt_oss_mxfp4");
  auto ws = WeightStore::open(src);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const std::string& n : ws.names()) {
    if (n.ends_with("_scales")) continue;
    if (n.ends_with("_blocks")) {
      const std::string base = n.substr(0, n.size() - 7);
      out.emplace_back(base, transposed(mxfp4_dequantize(ws.view(n), ws.view(base + "_scales"))));
      continue;
    }
    out.emplace_back(n, cpu_clone(ws.view(n)));
  }
  write_safetensors(dst + "/model.safetensors", out);
  json c = json::parse(read_file(src + "/config.json"));
  c.erase("quantization_config");
  write_file_atomic(dst + "/config.json", c.dump(2));
}

}  // namespace

// The MXFP4 checkpoint and its dequantisation in HF's bf16 layout load to the same model: the bf16 loader's transpose
// and de-interleaving of gate / up columns equal the MXFP4 loader's de-interleaving of rows, value for value.
TEST(GptOssLoad, Mxfp4EqualsItsDequantisationInTheBf16Layout) {
  TmpDir tmp("gptoss_deq");
  write_dequantised_copy(tmp.path);
  auto ctx = make_context("cpu");
  auto mx = Target::load(golden("target_gpt_oss_mxfp4"), *ctx);
  auto bf = Target::load(tmp.path, *ctx);
  EXPECT_EQ(mx->config().moe.expert_format, WeightFormat::MXFP4);
  EXPECT_EQ(bf->config().moe.expert_format, WeightFormat::Plain);
  EXPECT_EQ(mx->weights().layers[0].moe.gate_up.w.dtype, DType::U8);  // kept in MXFP4
  EXPECT_EQ(mx->weights().layers[0].moe.gate_up.w.shape, (Shape{8, 64, 32}));
  EXPECT_EQ(mx->weights().layers[0].moe.gate_up.scales.shape, (Shape{8, 64, 2}));
  EXPECT_EQ(bf->weights().layers[0].moe.gate_up.w.dtype, DType::F32);
  auto g = SafetensorsFile::open(golden("target_gpt_oss_mxfp4") + "/golden.safetensors");
  const std::vector<int64_t> all = {0, 1, 2, 3};
  auto a = mx->forward(*ctx, g->view("input_ids"), all, true);
  auto b = bf->forward(*ctx, g->view("input_ids"), all, true);
  EXPECT_EQ(to_f32_vector(a.features), to_f32_vector(b.features));
  EXPECT_EQ(to_f32_vector(a.final_hidden), to_f32_vector(b.final_hidden));
  // and both are transformers' forward on transformers' dequantisation (the golden)
  EXPECT_LT(test::rel_err(test::to_f64(b.final_hidden), test::to_f64(g->view("final_hidden"))), 2e-5);
}

// A checkpoint whose experts disagree with its config.json is refused naming the tensor and the key.
// The layout conversions of ExpertsLayout::InterleavedColumns (io/model_family.h): gate / up rows interleaved
// (GptOssExperts._apply_gate's ::2 / 1::2) to gate rows first, in any dtype; columns [E, K, N] to rows [E, N, K].
TEST(GptOssLoad, InterleavedColumnsLayoutConversions) {
  const int64_t E = 2, I = 3, C = 5;
  Tensor t = cpu_empty(DType::U8, {E, 2 * I, C});
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint8_t>()[i] = static_cast<uint8_t>(i / C);  // its row e 2I + j
  const Tensor g = gate_up_rows_first(t);
  ASSERT_EQ(g.shape, t.shape);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = 0; j < 2 * I; ++j)
      for (int64_t c = 0; c < C; ++c)
        EXPECT_EQ(g.ptr<uint8_t>()[(e * 2 * I + j) * C + c], e * 2 * I + (j < I ? 2 * j : 2 * (j - I) + 1))
            << "expert " << e << " row " << j;
  Tensor cols = cpu_empty(DType::F32, {E, 3, 4});
  for (int64_t i = 0; i < cols.numel(); ++i) cols.ptr<float>()[i] = static_cast<float>(i);
  const Tensor rows = columns_to_rows(cols);
  ASSERT_EQ(rows.shape, (Shape{E, 4, 3}));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t k = 0; k < 3; ++k)
        EXPECT_EQ(rows.ptr<float>()[(e * 4 + n) * 3 + k], cols.ptr<float>()[(e * 3 + k) * 4 + n]);
}

TEST(GptOssLoad, RefusesExpertsThatDisagreeWithTheConfig) {
  auto ctx = make_context("cpu");
  auto msg = [&](const std::string& dir) {
    try {
      Target::load(dir, *ctx);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  {  // MXFP4 tensors, config.json without quantization_config
    TmpDir tmp("gptoss_noquant");
    std::filesystem::copy(golden("target_gpt_oss_mxfp4") + "/model.safetensors", tmp.path + "/model.safetensors");
    json c = json::parse(read_file(golden("target_gpt_oss_mxfp4") + "/config.json"));
    c.erase("quantization_config");
    write_file_atomic(tmp.path + "/config.json", c.dump());
    const std::string m = msg(tmp.path);
    EXPECT_TRUE(has(m, "gate_up_proj_blocks") && has(m, "quantization_config")) << m;
  }
  {  // plain tensors, config.json saying mxfp4
    TmpDir tmp("gptoss_quant");
    std::filesystem::copy(golden("target_gpt_oss") + "/model.safetensors", tmp.path + "/model.safetensors");
    json c = json::parse(read_file(golden("target_gpt_oss") + "/config.json"));
    c["quantization_config"] = {{"quant_method", "mxfp4"}};
    write_file_atomic(tmp.path + "/config.json", c.dump());
    const std::string m = msg(tmp.path);
    EXPECT_TRUE(has(m, "gate_up_proj") && has(m, "mxfp4")) << m;
  }
  {  // blocks of the wrong shape
    TmpDir tmp("gptoss_badblocks");
    auto ws = WeightStore::open(golden("target_gpt_oss_mxfp4"));
    std::vector<std::pair<std::string, Tensor>> out;
    for (const std::string& n : ws.names())
      out.emplace_back(n, n == "model.layers.1.mlp.experts.down_proj_scales" ? cpu_zeros(DType::U8, {8, 64, 2})
                                                                            : cpu_clone(ws.view(n)));
    write_safetensors(tmp.path + "/model.safetensors", out);
    std::filesystem::copy(golden("target_gpt_oss_mxfp4") + "/config.json", tmp.path + "/config.json");
    const std::string m = msg(tmp.path);
    EXPECT_TRUE(has(m, "model.layers.1.mlp.experts.down_proj_scales") && has(m, "U8 [8, 64, 1]")) << m;
  }
}

// ---- random gpt-oss targets: every forward path agrees --------------------------------------------------------------

TEST(GptOssTarget, RandomTargetRunsEveryPathBf16AndMxfp4) {
  json j = gpt_oss_20b();
  j["hidden_size"] = 64;
  j["intermediate_size"] = 32;
  j["num_hidden_layers"] = 3;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 16;
  j["num_local_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["vocab_size"] = 64;
  j["sliding_window"] = 3;
  j["rope_scaling"]["original_max_position_embeddings"] = 4;
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  const json with_mxfp4 = j;
  for (bool mxfp4 : {false, true}) {
    j = with_mxfp4;
    if (!mxfp4) j.erase("quantization_config");
    const ModelConfig cfg = parse_model_config(j, "tiny");
    auto ctx = make_context("cpu64");
    auto tg = Target::random(cfg, *ctx, 3);
    EXPECT_EQ(tg->weights().layers[0].moe.down.w.dtype, mxfp4 ? DType::U8 : DType::F64);
    std::vector<int32_t> a = {1, 5, 9, 13, 2, 7, 7, 30}, b = {3, 3, 60};
    const std::vector<int64_t> ids = {0, 2};
    auto fa = test::check_packed_prefill(*ctx, *tg, a, b, ids, 1e-12);
    const auto pa = test::to_f64(fa.features);
    EXPECT_EQ(fa.router_topk[1].shape, (Shape{8, 2}));
    // KV-cached decode past the window of 3 equals the prefill's last rows
    KVCache cache = KVCache::create(*ctx, cfg, 8);
    tg->forward(*ctx, cpu_tensor_i32({1, 5, 9, 13}, {4}), {}, true, &cache);
    for (int t = 4; t < 8; ++t) {
      auto o = tg->forward(*ctx, cpu_tensor_i32({a[t]}, {1}), {}, true, &cache);
      const auto lf = test::to_f64(o.final_hidden), full = test::to_f64(fa.final_hidden);
      for (int64_t c = 0; c < 64; ++c)
        EXPECT_NEAR(lf[static_cast<size_t>(c)], full[static_cast<size_t>(t * 64 + c)], 1e-10) << "position " << t;
    }
    // the window matters: a target without it gives other features from position 3 on
    json nw = j;
    nw["sliding_window"] = 100;
    auto wide = Target::random(parse_model_config(nw, "tiny"), *ctx, 3);
    const auto fw = test::to_f64(wide->forward(*ctx, cpu_tensor_i32(a, {8}), ids, true).features);
    for (size_t i = 0; i < 3 * 128; ++i) EXPECT_NEAR(fw[i], pa[i], 1e-12);  // (the experts' groups differ: GEMM order)
    EXPECT_GT(test::rel_err(fw, pa), 1e-6);
  }
}

// ---- dflash info ----------------------------------------------------------------------------------------------------

TEST(GptOssInfo, PlanSlidingAndFullLayersAndMxfp4Bytes) {
  TmpDir tmp("gptoss_info");
  write_file_atomic(tmp.path + "/config.json", gpt_oss_20b().dump());
  const std::string cmd = cat(DFLASH_BINARY, " info ", tmp.path, " --json > ", tmp.path, "/out.json 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp.path + "/out.json");
  const json o = json::parse(read_file(tmp.path + "/out.json"))["config"];
  EXPECT_EQ(o["family"], "gpt-oss");
  // sliding and full alternate: no two neighbours share a plan, so the plan is shown for one period of 2
  ASSERT_EQ(o["layers"].size(), 2u);
  EXPECT_EQ(o["layers"][0]["layers"], "0 of every 2");
  EXPECT_EQ(o["layers"][1]["layers"], "1 of every 2");
  const std::string sliding = "attention (q/k/v bias, o bias, sinks, sliding window 128) + MoE 32 experts top-4 of "
                              "width 2880 (top-k renormalised; clamped SwiGLU, biases; MXFP4)",
                    full = "attention (q/k/v bias, o bias, sinks) + MoE 32 experts top-4 of width 2880 (top-k "
                           "renormalised; clamped SwiGLU, biases; MXFP4)";
  EXPECT_EQ(o["layers"][0]["plan"], sliding);
  EXPECT_EQ(o["layers"][1]["plan"], full);
  const TargetParams p = target_params(parse_model_config(gpt_oss_20b(), "x"));
  EXPECT_EQ(o["params"]["mxfp4"].get<int64_t>(), p.mxfp4);
  EXPECT_EQ(o["device_weight_bytes"].get<int64_t>(), p.device_bytes());
  EXPECT_EQ(o["quant_method"], "mxfp4");
  EXPECT_EQ(o["rope_scaling"]["kind"], "yarn");
  EXPECT_NEAR(o["rope_scaling"]["attention_factor"].get<double>(), 1.3466, 1e-4);
  EXPECT_EQ(o["default_target_layer_ids_nf5"], json({1, 6, 11, 16, 21}));
  EXPECT_EQ(o["drafter_default_intermediate_size"].get<int64_t>(), 7680);
  // the text form names the MXFP4 share
  const std::string txt = cat(DFLASH_BINARY, " info ", tmp.path, " > ", tmp.path, "/out.txt 2>&1");
  ASSERT_EQ(std::system(txt.c_str()), 0);
  const std::string t = read_file(tmp.path + "/out.txt");
  EXPECT_TRUE(has(t, "arch: gpt_oss (gpt-oss, GptOssForCausalLM)")) << t;
  EXPECT_TRUE(has(t, "weights on the device (bf16, experts in MXFP4): 12.82 GiB")) << t;
  EXPECT_TRUE(has(t, "of which MXFP4")) << t;
  EXPECT_TRUE(has(t, "layer 0 of every 2 " + sliding + "\n")) << t;  // alternating layers: one line per plan
  EXPECT_TRUE(has(t, "layer 1 of every 2 " + full + "\n")) << t;
}

// ---- end to end through the gpt-oss KV cache ------------------------------------------------------------------------

// Real speculative decoding through the gpt-oss target's KV cache (past its window of 16 and YaRN's 16 original
// positions) reproduces the target-only greedy decode, teacher forcing on that greedy data gives the same cycles, and
// batched generation equals one sequence at a time: bf16 and MXFP4 experts.
TEST(GptOssEndToEnd, SpeculativeDecodingAndBatchedGenerationBf16AndMxfp4) {
  for (const char* name : {"target_gpt_oss", "target_gpt_oss_mxfp4"}) {
    auto ctx = make_context("cpu", {.threads = 2});
    auto target = Target::load(golden(name), *ctx);
    EXPECT_EQ(default_intermediate_size(target->config()), 8 * 64 / 3);  // the drafter's MLP: the family's 8 H / 3
    EXPECT_GT(test::check_lossless_decoding(*ctx, *target, 19, name), 32u);  // past the window and YaRN's 16
  }
}

// dflash capture on the MXFP4 target writes HF's output_hidden_states (the embedding, every layer, the final norm),
// the logits and the experts chosen, as transformers computes them on its dequantisation.
TEST(GptOssEndToEnd, CaptureWritesHfHiddenStatesMxfp4) {
  TmpDir tmp("gptoss_capture");
  const std::string dir = golden("target_gpt_oss_mxfp4");
  auto g = SafetensorsFile::open(dir + "/golden.safetensors");
  const Tensor ids = g->view("input_ids");
  json row = {{"input_ids", std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + ids.numel())}};
  write_file_atomic(tmp.path + "/ids.jsonl", row.dump() + "\n");
  const std::string cmd = cat(DFLASH_BINARY, " capture --target ", dir, " --input ", tmp.path, "/ids.jsonl --out ",
                              tmp.path, "/f.safetensors --logits --router > ", tmp.path, "/log.txt 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp.path + "/log.txt");
  auto f = SafetensorsFile::open(tmp.path + "/f.safetensors");
  for (int i = 0; i <= 4; ++i)
    EXPECT_LT(test::rel_err(test::to_f64(f->view(cat("row_0.hidden_", i))), test::to_f64(g->view(cat("hidden_states.", i)))),
              2e-5)
        << "hidden_" << i;
  EXPECT_LT(test::rel_err(test::to_f64(f->view("row_0.logits")), test::to_f64(g->view("logits"))), 2e-5);
  auto i32 = [](const Tensor& t) { return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel()); };
  for (int l = 0; l < 4; ++l)
    EXPECT_EQ(i32(f->view(cat("row_0.router_", l))), i32(g->view(cat("router_topk.", l)))) << "layer " << l;
}

// --init-from-target cannot start a dense draft layer from a gpt-oss layer (its experts): refused by name.
TEST(GptOssInit, DraftLayersAreNotCopiedFromMoeLayers) {
  auto ctx = make_context("cpu", {.threads = 1});
  const ModelConfig tc = load_model_config(golden("target_gpt_oss"));
  DrafterConfig dc = DrafterConfig::for_target(tc, 1, 4, {0, 1}, 511);
  Drafter d(*ctx, dc, 3);
  const WeightStore ws = WeightStore::open(golden("target_gpt_oss"));
  try {
    const std::vector<int64_t> layers = {2};
    init_drafter_from_target(*ctx, d.params(), dc, ws, layers, "last");
    ADD_FAILURE() << "a gpt-oss MoE layer was copied into a dense draft layer";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "target layer 2 is a Mixture-of-Experts layer")) << e.what();
  }
}

// ---- training, export and eval --------------------------------------------------------------------------------------

// gpt-oss targets (tests/golden/target_gpt_oss and _mxfp4: sliding / full layers with a window of 16 under sequences of
// 40, sinks, YaRN, biased experts in bf16 and in MXFP4): training falls in loss and 2 + 2 workers give 1 + 1's loss;
// the export is the dense drafter with the family's MLP width (8 H / 3) and the target's YaRN; `dflash eval` runs real
// speculative decoding with it (lossless: the report's lossless mismatches are 0).
TEST(Pipeline, GptOssTargetTrainsExportsAndEvaluatesBf16AndMxfp4) {
  for (const char* name : {"target_gpt_oss", "target_gpt_oss_mxfp4"}) {
    const std::string root = train_tmpdir(cat("pipe_", name));
    const std::string data = make_train_data(root);
    TrainConfig one = tiny_train_config(root, data);
    one.target_dir = source_dir() + "/tests/golden/" + name;
    one.max_steps = 10;
    one.out_dir = root + "/one";
    one.export_at_end = true;
    train(one);
    const auto ex = nlohmann::json::parse(read_file(one.out_dir + "/export/config.json"));
    EXPECT_EQ(ex["intermediate_size"].get<int64_t>(), 8 * 64 / 3) << name;
    EXPECT_EQ(ex["rope_scaling"]["rope_type"], "yarn") << name;
    EXPECT_EQ(ex["rope_scaling"]["factor"].get<double>(), 4.0) << name;
    EXPECT_EQ(ex["rope_scaling"]["truncate"], false) << name;
    EXPECT_EQ(ex["dflash_config"]["target_layer_ids"], nlohmann::json({1, 2})) << name;
    auto m1 = read_metrics_jsonl(one.out_dir);
    ASSERT_EQ(m1.size(), 10u) << name;
    EXPECT_LT(m1.back()["loss"].get<double>(), m1.front()["loss"].get<double>()) << name;
    expect_two_plus_two_as_one(one, root + "/two", name);
    // dflash eval with the export: real speculative decoding through the gpt-oss KV cache
    const std::string cmd = cat(DFLASH_BINARY, " eval --target ", one.target_dir, " --drafter ", one.out_dir,
                                "/export --data ", data, " --max-samples 4 --stop-id 511 --no-progress --json ", root,
                                "/eval.json > ", root, "/eval.log 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(root + "/eval.log");
    const auto rep = nlohmann::json::parse(read_file(root + "/eval.json"));
    EXPECT_EQ(rep["evaluated"].get<int64_t>(), 4) << rep.dump();
    EXPECT_EQ(rep["lossless_mismatches"].get<int64_t>(), 0) << rep.dump();  // = the target-only greedy decode
    EXPECT_GE(rep["generated"]["tau"].get<double>(), 1.0);
    EXPECT_GE(rep["teacher_forced"]["tau"].get<double>(), 1.0);  // (= generated only on target-greedy data:
                                                                  // GptOssEndToEnd above)
    fs::remove_all(root);
  }
}
