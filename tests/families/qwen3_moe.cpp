// tests/families/qwen3_moe.cpp
// Tests of the Mixture-of-Experts ops on the CPU (backend/context.h moe_*) with values worked out by hand, the MoE
// layer (model/target/mlp.h moe_forward) against a per-token loop written out here, the Qwen3-MoE config and plan
// (io/model_family.cpp), parameter counts of Qwen3-30B-A3B, and the drafter's default width for an MoE target.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "eval/generate.h"
#include "eval/tau.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/target.h"
#include "common/decode_checks.h"
#include "common/test_util.h"

using namespace dflash;
using nlohmann::json;

namespace {

std::vector<int32_t> ints(const Tensor& t) { return std::vector<int32_t>(t.ptr<int32_t>(), t.ptr<int32_t>() + t.numel()); }
std::vector<float> floats(const Tensor& t) { return to_f32_vector(t); }

// Qwen/Qwen3-30B-A3B config.json
const char* kQwen3_30B_A3B = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

}  // namespace

TEST(MoeOps, RouteTopKTiesAndWeights) {
  auto ctx = make_context("cpu");
  // token 0: experts 1 and 3 tie at 2.0 (lower index first), then 0; token 1: a clear order 2 > 0 > 3
  Tensor z = cpu_tensor({1.0f, 2.0f, 0.5f, 2.0f, /**/ 0.0f, -1.0f, 3.0f, -0.5f}, {2, 4});
  Tensor idx = cpu_empty(DType::I32, {2, 3}), w = cpu_empty(DType::F32, {2, 3});
  ctx->moe_route(z, 3, false, idx, w);
  EXPECT_EQ(ints(idx), (std::vector<int32_t>{1, 3, 0, 2, 0, 3}));
  const double s0 = std::exp(1.0) + 2 * std::exp(2.0) + std::exp(0.5);
  const double s1 = std::exp(0.0) + std::exp(-1.0) + std::exp(3.0) + std::exp(-0.5);
  const std::vector<double> want = {std::exp(2.0) / s0, std::exp(2.0) / s0, std::exp(1.0) / s0,
                                    std::exp(3.0) / s1, 1.0 / s1,           std::exp(-0.5) / s1};
  const std::vector<float> got = floats(w);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  ctx->moe_route(z, 3, true, idx, w);  // renormalised over the chosen three
  const std::vector<float> gn = floats(w);
  const double c0 = want[0] + want[1] + want[2], c1 = want[3] + want[4] + want[5];
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(gn[i], want[i] / c0, 1e-6);
  for (size_t i = 3; i < 6; ++i) EXPECT_NEAR(gn[i], want[i] / c1, 1e-6);
  EXPECT_NEAR(gn[0] + gn[1] + gn[2], 1.0, 1e-6);
  EXPECT_THROW(ctx->moe_route(z, 5, true, idx, w), Error);  // k > E
}

TEST(MoeOps, GroupSortsPairsByExpertThenToken) {
  auto ctx = make_context("cpu");
  // pairs (token, slot): (0,0)->2 (0,1)->0 (1,0)->2 (1,1)->1 (2,0)->0 (2,1)->2
  Tensor idx = cpu_tensor_i32({2, 0, 2, 1, 0, 2}, {3, 2});
  Tensor off = cpu_empty(DType::I32, {4}), rows = cpu_empty(DType::I32, {6}), slot = cpu_empty(DType::I32, {6});
  ctx->moe_group(idx, off, rows, slot);
  EXPECT_EQ(ints(off), (std::vector<int32_t>{0, 2, 3, 6}));        // expert 0: 2 pairs, 1: 1, 2: 3
  EXPECT_EQ(ints(rows), (std::vector<int32_t>{0, 2, 1, 0, 1, 2}));  // each expert's tokens ascending
  EXPECT_EQ(ints(slot), (std::vector<int32_t>{3, 0, 4, 2, 1, 5}));  // pair (t, j) -> its grouped row
  Tensor bad = cpu_tensor_i32({0, 3}, {1, 2});
  Tensor o2 = cpu_empty(DType::I32, {4}), r2 = cpu_empty(DType::I32, {2}), s2 = cpu_empty(DType::I32, {2});
  try {
    ctx->moe_group(bad, o2, r2, s2);
    ADD_FAILURE() << "expert 3 of 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 3"), std::string::npos) << e.what();
  }
}

TEST(MoeOps, GroupedLinearAndCombineEqualPerRowProducts) {
  auto ctx = make_context("cpu64");
  const int64_t T = 5, H = 6, N = 4, E = 3, k = 2;
  Tensor idx = cpu_tensor_i32({0, 2, 2, 1, 0, 1, 2, 0, 1, 2}, {T, k});
  Tensor off = cpu_empty(DType::I32, {E + 1}), rows = cpu_empty(DType::I32, {T * k}), slot = cpu_empty(DType::I32, {T * k});
  ctx->moe_group(idx, off, rows, slot);
  const Tensor x = test::randn({T, H}, 1, 1.0, DType::F64), w = test::randn({E, 2 * N, H}, 2, 0.5, DType::F64);
  Tensor y = cpu_empty(DType::F64, {T * k, 2 * N}), a = cpu_empty(DType::F64, {T * k, N});
  ctx->moe_linear(x, &rows, w, off, y, MoeAct::None);
  ctx->moe_linear(x, &rows, w, off, a, MoeAct::SwiGLU);
  const double* X = x.ptr<double>();
  const double* W = w.ptr<double>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx.ptr<int32_t>()[t * k + j], r = slot.ptr<int32_t>()[t * k + j];
      ASSERT_EQ(rows.ptr<int32_t>()[r], t);
      for (int64_t n = 0; n < 2 * N; ++n) {
        double dot = 0;
        for (int64_t c = 0; c < H; ++c) dot += X[t * H + c] * W[(e * 2 * N + n) * H + c];
        EXPECT_NEAR(y.ptr<double>()[r * 2 * N + n], dot, 1e-12);
      }
      for (int64_t n = 0; n < N; ++n) {
        const double g = y.ptr<double>()[r * 2 * N + n], u = y.ptr<double>()[r * 2 * N + N + n];
        EXPECT_NEAR(a.ptr<double>()[r * N + n], g / (1 + std::exp(-g)) * u, 1e-12);
      }
    }
  // combine: out[t] = 0.5 out[t] + sum_j w_tj a[slot(t, j)]
  const Tensor wts = test::randn({T, k}, 3, 1.0, DType::F64), o0 = test::randn({T, N}, 4, 1.0, DType::F64);
  Tensor out = cpu_clone(o0);
  ctx->moe_combine(a, slot, wts, out, 0.5f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double want = 0.5 * o0.ptr<double>()[t * N + n];
      for (int64_t j = 0; j < k; ++j)
        want += wts.ptr<double>()[t * k + j] * a.ptr<double>()[slot.ptr<int32_t>()[t * k + j] * N + n];
      EXPECT_NEAR(out.ptr<double>()[t * N + n], want, 1e-12);
    }
}

// The MoE layer (router GEMM, route, group, two grouped GEMMs, combine) against transformers' rule written out per
// token: softmax over all experts, the top k, renormalised, sum_j p_j down_e(silu(gate_e x) * up_e x).
TEST(MoeLayer, MatchesPerTokenLoop) {
  auto ctx = make_context("cpu64");
  MoeConfig m;
  m.num_experts = 6;
  m.top_k = 3;
  m.expert_width = 5;
  m.norm_topk_prob = true;
  const int64_t T = 9, H = 8, E = 6, k = 3, I = 5;
  MoeLayerWeights w;
  w.router = test::randn({E, H}, 11, 0.7, DType::F64);
  w.gate_up = test::randn({E, 2 * I, H}, 12, 0.4, DType::F64);
  w.down = test::randn({E, H, I}, 13, 0.4, DType::F64);
  const Tensor x = test::randn({T, H}, 14, 1.0, DType::F64), h0 = test::randn({T, H}, 15, 1.0, DType::F64);
  Tensor h = cpu_clone(h0);
  const Tensor chosen = moe_forward(*ctx, w, m, x, h);
  const double* X = x.ptr<double>();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> z(E), p(E);
    for (int64_t e = 0; e < E; ++e) {
      z[e] = 0;
      for (int64_t c = 0; c < H; ++c) z[e] += X[t * H + c] * w.router.ptr<double>()[e * H + c];
    }
    const double mx = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += p[e] = std::exp(z[e] - mx);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
    double cs = 0;
    for (int64_t j = 0; j < k; ++j) cs += p[order[j]] / s;
    for (int64_t j = 0; j < k; ++j) EXPECT_EQ(chosen.ptr<int32_t>()[t * k + j], order[j]) << "token " << t;
    for (int64_t c = 0; c < H; ++c) {
      double want = h0.ptr<double>()[t * H + c];
      for (int64_t j = 0; j < k; ++j) {
        const int e = order[j];
        double yc = 0;
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int64_t q = 0; q < H; ++q) {
            g += X[t * H + q] * w.gate_up.w.ptr<double>()[(e * 2 * I + i) * H + q];
            u += X[t * H + q] * w.gate_up.w.ptr<double>()[(e * 2 * I + I + i) * H + q];
          }
          yc += g / (1 + std::exp(-g)) * u * w.down.w.ptr<double>()[(e * H + c) * I + i];
        }
        want += p[e] / s / cs * yc;
      }
      EXPECT_NEAR(h.ptr<double>()[t * H + c], want, 1e-11) << "token " << t << " column " << c;
    }
  }
}

TEST(MoeConfig, Qwen3_30B_A3B) {
  const ModelConfig c = parse_model_config(json::parse(kQwen3_30B_A3B), "/models/Qwen3-30B-A3B/config.json");
  EXPECT_EQ(c.arch, Arch::Qwen3Moe);
  EXPECT_STREQ(arch_name(c.arch), "qwen3_moe");
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.expert_width, 768);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  ASSERT_EQ(static_cast<int64_t>(c.layers.size()), 48);
  for (const LayerSpec& s : c.layers) {
    EXPECT_EQ(s.mlp, ChannelMixer::MoE);
    EXPECT_EQ(s.mlp_width, 768);
    EXPECT_TRUE(s.attention.qk_norm);
  }
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 12, 23, 34, 45}));
  // parameters: 30.53B in all (the model card's 30.5B), 3.04B per token (lm_head included, the embedding lookup not;
  // the card's 3.3B counts the embedding too)
  const int64_t H = 2048, V = 151936, attn = 2 * H * 4096 + 2 * H * 512 + 2 * 128 + 2 * H;
  const int64_t experts = 128 * 3 * H * 768, router = 128 * H;
  const TargetParams p = target_params(c);
  EXPECT_EQ(p.total, 2 * V * H + H + 48 * (attn + router + experts));
  EXPECT_EQ(p.active, V * H + H + 48 * (attn + router + 8 * 3 * H * 768));
  EXPECT_NEAR(p.total / 1e9, 30.53, 0.01);
  EXPECT_NEAR((p.active + p.embedding) / 1e9, 3.35, 0.01);
  // the drafter's MLP: 3 H (the published MoE drafters' 6144), not the experts' 768
  EXPECT_EQ(default_intermediate_size(c), 6144);
  EXPECT_EQ(DrafterConfig::for_target(c, 5, 16, {1, 12, 23, 34, 45}, 151669).intermediate_size, 6144);
}

TEST(MoeConfig, SparseStepDenseLayersAndRefusals) {
  json j = json::parse(kQwen3_30B_A3B);
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const ModelConfig c = parse_model_config(j, "x/config.json");
  std::vector<int> moe;
  for (int64_t l = 0; l < 6; ++l) moe.push_back(c.layer(l).mlp == ChannelMixer::MoE);
  EXPECT_EQ(moe, (std::vector<int>{0, 1, 0, 0, 0, 1}));  // (l + 1) % 2 == 0, but not layer 3
  EXPECT_EQ(c.layer(3).mlp_width, 6144);                  // dense layers are intermediate_size wide
  EXPECT_EQ(c.layer(1).mlp_width, 768);
  auto msg = [](json x) {
    try {
      parse_model_config(x, "/m/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json bad = json::parse(kQwen3_30B_A3B);
  bad["num_experts_per_tok"] = 200;
  EXPECT_NE(msg(bad).find("num_experts_per_tok"), std::string::npos);
  bad = json::parse(kQwen3_30B_A3B);
  bad["mlp_only_layers"] = {48};
  EXPECT_NE(msg(bad).find("mlp_only_layers"), std::string::npos);
  bad = json::parse(kQwen3_30B_A3B);
  bad["use_sliding_window"] = true;
  bad["sliding_window"] = 4096;
  EXPECT_NE(msg(bad).find("use_sliding_window"), std::string::npos) << msg(bad);
  bad = json::parse(kQwen3_30B_A3B);
  bad["architectures"] = {"MixtralForCausalLM"};
  bad["model_type"] = "mixtral";
  const std::string m = msg(bad);
  EXPECT_NE(m.find("unsupported architecture 'MixtralForCausalLM'"), std::string::npos) << m;
  EXPECT_NE(m.find("Qwen3MoeForCausalLM"), std::string::npos) << m;  // the list of supported ones
}

TEST(MoeConfig, NumLocalExpertsAsTransformers5WritesIt) {
  json j = json::parse(kQwen3_30B_A3B);
  j.erase("num_experts");
  j["num_local_experts"] = 64;
  EXPECT_EQ(parse_model_config(j, "x").moe.num_experts, 64);
  j.erase("num_local_experts");
  EXPECT_EQ(parse_model_config(j, "x").moe.num_experts, 128);  // Qwen3MoeConfig's default
}

TEST(MoeConfig, TextConfigOfImageTextCheckpoints) {
  // keys under text_config (as image-text checkpoints write them) are read from there
  json t = json::parse(kQwen3_30B_A3B);
  json top = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
              {"tie_word_embeddings", false}, {"text_config", t}};
  top["text_config"].erase("architectures");
  const ModelConfig c = parse_model_config(top, "x/config.json");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
}

TEST(MoeTarget, RandomTargetRunsEveryPath) {
  // a small random MoE target: prefill, packed prefill and a KV-cached decode agree
  json j = json::parse(kQwen3_30B_A3B);
  j["hidden_size"] = 32;
  j["intermediate_size"] = 48;
  j["moe_intermediate_size"] = 16;
  j["num_hidden_layers"] = 3;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 8;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["mlp_only_layers"] = {1};
  j["vocab_size"] = 64;
  const ModelConfig cfg = parse_model_config(j, "tiny");
  auto ctx = make_context("cpu64");
  auto tg = Target::random(cfg, *ctx, 3);
  std::vector<int32_t> a = {1, 5, 9, 13, 2, 7}, b = {3, 3, 60};
  auto fa = test::check_packed_prefill(*ctx, *tg, a, b, {0, 2}, 1e-12);
  EXPECT_FALSE(fa.router_topk[1].defined());  // the dense layer
  EXPECT_EQ(fa.router_topk[0].shape, (Shape{6, 2}));
  KVCache cache = KVCache::create(*ctx, cfg, 8);
  tg->forward(*ctx, cpu_tensor_i32({1, 5, 9, 13}, {4}), {}, true, &cache);
  tg->forward(*ctx, cpu_tensor_i32({2}, {1}), {}, true, &cache);
  auto last = tg->forward(*ctx, cpu_tensor_i32({7}, {1}), {}, true, &cache);
  const auto lf = test::to_f64(last.final_hidden), full = test::to_f64(fa.final_hidden);
  for (int64_t c = 0; c < 32; ++c) EXPECT_NEAR(lf[static_cast<size_t>(c)], full[static_cast<size_t>(5 * 32 + c)], 1e-10);
}

// ---- end to end with the tiny Qwen3-MoE golden target (tests/golden/target_qwen3_moe) ----------------------------------
namespace {
const std::string& moe_dir() {
  static const std::string d = test::source_dir() + "/tests/golden/target_qwen3_moe";
  return d;
}
}  // namespace

// Real speculative decoding through the MoE target's KV cache reproduces the target-only greedy decode (lossless), and
// teacher forcing on that greedy data gives the same cycles; batched generation equals one sequence at a time.
TEST(MoeEndToEnd, SpeculativeDecodingAndBatchedGenerationThroughTheMoeCache) {
  auto ctx = make_context("cpu", {.threads = 2});
  auto target = Target::load(moe_dir(), *ctx);
  EXPECT_EQ(default_intermediate_size(target->config()), 3 * target->config().hidden_size);  // the drafter's MLP
  test::check_lossless_decoding(*ctx, *target, 17, "qwen3_moe");
}

// dflash capture writes HF's output_hidden_states of the golden (the embedding, every layer, the final norm), the
// logits and the experts chosen.
TEST(MoeEndToEnd, CaptureWritesHfHiddenStates) {
  const std::string tmp = cat("/tmp/dflash_test_capture_", getpid());
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  auto g = SafetensorsFile::open(moe_dir() + "/golden.safetensors");
  const Tensor ids = g->view("input_ids");
  json row = {{"input_ids", std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + ids.numel())}};
  write_file_atomic(tmp + "/ids.jsonl", row.dump() + "\n");
  const std::string cmd = cat(DFLASH_BINARY, " capture --target ", moe_dir(), " --input ", tmp, "/ids.jsonl --out ", tmp,
                              "/f.safetensors --logits --router > ", tmp, "/log.txt 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp + "/log.txt");
  auto f = SafetensorsFile::open(tmp + "/f.safetensors");
  for (int i = 0; i <= 4; ++i) {
    const double e = test::rel_err(test::to_f64(f->view(cat("row_0.hidden_", i))),
                                   test::to_f64(g->view(cat("hidden_states.", i))));
    EXPECT_LT(e, 2e-5) << "hidden_" << i;
  }
  EXPECT_LT(test::rel_err(test::to_f64(f->view("row_0.logits")), test::to_f64(g->view("logits"))), 2e-5);
  EXPECT_EQ(f->view("row_0.router_0").shape, (Shape{ids.numel(), 2}));
  EXPECT_EQ(f->find("row_0.router_2"), nullptr);  // the dense layer
  // a second run refuses to replace the file
  EXPECT_NE(std::system(cmd.c_str()), 0);
  std::filesystem::remove_all(tmp);
}

// dflash info on an MoE config: the family, the per-layer plan as runs, parameters and the drafter's default width.
TEST(MoeEndToEnd, InfoPrintsThePlanAndParameters) {
  const std::string tmp = cat("/tmp/dflash_test_info_", getpid());
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  json j = json::parse(kQwen3_30B_A3B);
  j["num_hidden_layers"] = 6;
  j["mlp_only_layers"] = {4};
  write_file_atomic(tmp + "/config.json", j.dump());
  const std::string cmd = cat(DFLASH_BINARY, " info ", tmp, " --json > ", tmp, "/out.json 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp + "/out.json");
  const json o = json::parse(read_file(tmp + "/out.json"))["config"];
  EXPECT_EQ(o["family"], "Qwen3-MoE");
  ASSERT_EQ(o["layers"].size(), 3u);  // 0-3 MoE, 4 dense, 5 MoE
  EXPECT_EQ(o["layers"][0]["layers"], "0-3");
  EXPECT_EQ(o["layers"][1]["layers"], "4");
  EXPECT_NE(o["layers"][1]["plan"].get<std::string>().find("dense SwiGLU of width 6144"), std::string::npos);
  EXPECT_NE(o["layers"][2]["plan"].get<std::string>().find("MoE 128 experts top-8 of width 768"), std::string::npos);
  const ModelConfig c = parse_model_config(j, "x");
  const TargetParams p = target_params(c);
  EXPECT_EQ(o["params"]["total"].get<int64_t>(), p.total);
  EXPECT_EQ(o["params"]["active_per_token"].get<int64_t>(), p.active);
  EXPECT_EQ(o["device_weight_bytes_bf16"].get<int64_t>(), 2 * p.total);
  EXPECT_EQ(o["drafter_default_intermediate_size"].get<int64_t>(), 6144);
  std::filesystem::remove_all(tmp);
}
