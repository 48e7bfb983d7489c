// tests/families/qwen3_moe.cpp — Qwen3-MoE: the config and plan (io/model_family.cpp), parameter counts of
// Qwen3-30B-A3B, the drafter's default width for an MoE target; random targets through every forward path; the tiny
// golden of transformers (every layer, the experts chosen in either expert layout); speculative decoding, batched
// generation, `dflash capture` and `dflash info`; training with 2 + 2 workers. The MoE ops: tests/ops/moe.cpp.
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
#include "common/golden_checks.h"
#include "common/test_util.h"
#include "common/train_fixtures.h"

using namespace dflash;
using nlohmann::json;
using test::check_golden;
using test::check_router_topk;
using test::expect_two_plus_two_as_one;
using test::make_train_data;
using test::source_dir;
using test::tiny_train_config;
using test::train_tmpdir;
namespace fs = std::filesystem;

namespace {

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

// ---- goldens of transformers ----------------------------------------------------------------------------------------

TEST(TargetGolden, Qwen3MoeMatchesTransformers) { check_golden("target_qwen3_moe", "cpu"); }

TEST(TargetGolden, Qwen3MoeInFp64) { check_golden("target_qwen3_moe", "cpu64"); }

// The experts each token chose, per MoE layer and in order, equal the golden's (tools/ref_dflash.py's choice, which
// transformers' was checked against); the same weights in the other expert layout, sharded over two files with
// model.safetensors.index.json, give the same bits.
TEST(TargetGolden, Qwen3MoeChoosesTheGoldensExpertsInAnyLayout) {
  std::vector<float> f1, h1, f2, h2;
  EXPECT_EQ(check_router_topk("target_qwen3_moe", &f1, &h1), 3);  // layer 2 is dense (mlp_only_layers)
  check_router_topk("target_qwen3_moe_sharded", &f2, &h2, "target_qwen3_moe");
  EXPECT_EQ(f2, f1);
  EXPECT_EQ(h2, h1);
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

// The same with a Mixture-of-Experts target (tests/golden/target_qwen3_moe: 8 experts top-2, one dense layer): 2 + 2
// workers give the loss and parameters of 1 + 1 on the same global batch, and the loss falls.
TEST(Pipeline, MoeTargetTwoPlusTwoMatchesOneWorker) {
  const std::string root = train_tmpdir("pipemoe");
  const std::string data = make_train_data(root);
  TrainConfig one = tiny_train_config(root, data);
  one.target_dir = source_dir() + "/tests/golden/target_qwen3_moe";
  one.max_steps = 12;
  one.out_dir = root + "/one";
  one.export_at_end = true;
  train(one);
  // the export: a dense Qwen3-style drafter whose MLP is 3 H wide (not the experts' 32)
  const auto ex = nlohmann::json::parse(read_file(one.out_dir + "/export/config.json"));
  EXPECT_EQ(ex["intermediate_size"].get<int64_t>(), 3 * 64);
  EXPECT_EQ(ex["dflash_config"]["target_layer_ids"], nlohmann::json({1, 2}));
  const auto m1 = expect_two_plus_two_as_one(one, root + "/two", "qwen3_moe").first;
  ASSERT_EQ(m1.size(), 12u);
  EXPECT_LT(m1.back()["loss"].get<double>(), m1.front()["loss"].get<double>());
  fs::remove_all(root);
}
