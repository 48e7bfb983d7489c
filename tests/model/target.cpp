// tests/model/target.cpp
// Target forward against Hugging Face transformers (golden files from tools/make_goldens.py, computed in fp64),
// the KV-cache decode path, and case C10 (layer index of the captured features).
#include <gtest/gtest.h>

#include <numeric>

#include "backend/context.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "common/golden_checks.h"
#include "common/test_util.h"

using namespace dflash;
using dflash::test::rel_err;
using dflash::test::to_f64;

using dflash::test::check_golden;

TEST(TargetGolden, Qwen3MatchesTransformers) { check_golden("target_qwen3", "cpu"); }
TEST(TargetGolden, Llama3WithRopeScalingMatchesTransformers) { check_golden("target_llama3", "cpu"); }
TEST(TargetGolden, Qwen2WithBiasMatchesTransformers) { check_golden("target_qwen2", "cpu"); }
TEST(TargetGolden, Qwen3InFp64) { check_golden("target_qwen3", "cpu64"); }
TEST(TargetGolden, Qwen3MoeMatchesTransformers) { check_golden("target_qwen3_moe", "cpu"); }
TEST(TargetGolden, Qwen3MoeInFp64) { check_golden("target_qwen3_moe", "cpu64"); }

// gpt-oss (tests/golden/target_gpt_oss: 4 layers sliding / full alternating with a window of 16, YaRN factor 4 over 16
// original positions, attention sinks, q/k/v/o biases, 8 experts top-2 with biases and the clamped GLU; 40 tokens, so
// positions run past the window and past YaRN's original length), its experts as HF keeps them in bf16 checkpoints
// (gate_up_proj [E, H, 2I] with interleaved columns), and the same model with MXFP4 experts (the published layout,
// quantization_config mxfp4) whose golden is transformers' forward on its own dequantisation.
TEST(TargetGolden, GptOssMatchesTransformers) { check_golden("target_gpt_oss", "cpu"); }
TEST(TargetGolden, GptOssInFp64) { check_golden("target_gpt_oss", "cpu64"); }
TEST(TargetGolden, GptOssMxfp4MatchesTransformers) { check_golden("target_gpt_oss_mxfp4", "cpu"); }
TEST(TargetGolden, GptOssMxfp4InFp64) { check_golden("target_gpt_oss_mxfp4", "cpu64"); }

namespace {

// The experts each token chose, per MoE layer and in order, equal the golden's router_topk.{l}; returns the target's
// features and final hidden (for comparisons between layouts) and the number of MoE layers.
// `name` is the model's directory, `golden` the one with golden.safetensors (the same by default).
int check_router_topk(const std::string& name, std::vector<float>* features = nullptr,
                      std::vector<float>* final_hidden = nullptr, const std::string& golden = "") {
  const std::string dir = test::source_dir() + "/tests/golden/" + name;
  auto ctx = make_context("cpu");
  auto target = Target::load(dir, *ctx);
  auto g = SafetensorsFile::open(test::source_dir() + "/tests/golden/" + (golden.empty() ? name : golden) +
                                 "/golden.safetensors");
  const ModelConfig& cfg = target->config();
  std::vector<int64_t> all(static_cast<size_t>(cfg.num_hidden_layers));
  std::iota(all.begin(), all.end(), 0);
  auto out = target->forward(*ctx, g->view("input_ids"), all, true);
  int moe_layers = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const Tensor& r = out.router_topk[static_cast<size_t>(l)];
    if (cfg.layer(l).mlp == ChannelMixer::Dense) {
      EXPECT_FALSE(r.defined());
      continue;
    }
    ++moe_layers;
    const Tensor want = g->view(cat("router_topk.", l));
    EXPECT_EQ(r.numel(), want.numel()) << name << " layer " << l;
    for (int64_t i = 0; i < std::min(r.numel(), want.numel()); ++i)
      if (r.ptr<int32_t>()[i] != want.ptr<int32_t>()[i]) {
        ADD_FAILURE() << name << " layer " << l << " pair " << i << ": expert " << r.ptr<int32_t>()[i] << ", golden "
                      << want.ptr<int32_t>()[i];
        break;
      }
  }
  if (features) *features = to_f32_vector(out.features);
  if (final_hidden) *final_hidden = to_f32_vector(out.final_hidden);
  return moe_layers;
}

}  // namespace

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

// gpt-oss: the router's bias and top-k of the logits choose transformers' experts in every layer, bf16 and MXFP4.
TEST(TargetGolden, GptOssChoosesTheGoldensExperts) {
  EXPECT_EQ(check_router_topk("target_gpt_oss"), 4);
  EXPECT_EQ(check_router_topk("target_gpt_oss_mxfp4"), 4);
}

TEST(Target, LayerIndexCaseC10) {
  // 8-layer toy (Qwen2 layout: q/k/v biases): W_v = 0 and b_v = e_0 make every attention output e_0 whatever the
  // pattern; W_o maps e_0 to (l+1) * ones; the MLP is zero. So h_after_layer(l) = sum_{m<=l} (m+1) exactly.
  auto ctx = make_context("cpu");
  ModelConfig cfg;
  cfg.arch = Arch::Qwen2;
  cfg.hidden_size = 8;
  cfg.intermediate_size = 4;
  cfg.num_hidden_layers = 8;
  cfg.num_attention_heads = 2;
  cfg.num_key_value_heads = 1;
  cfg.head_dim = 4;
  cfg.vocab_size = 10;
  cfg.attention_bias = true;
  const int64_t H = 8, d = 4;
  TargetWeights w;
  w.embed = cpu_zeros(DType::F32, {10, H});
  w.lm_head = w.embed;
  w.final_norm = cpu_tensor(std::vector<float>(H, 1.0f), {H});
  w.inv_freq = rope_inv_freq(d, 10000.0, RopeScaling{});
  for (int l = 0; l < 8; ++l) {
    TargetLayer L;
    L.in_norm = cpu_tensor(std::vector<float>(H, 1.0f), {H});
    L.post_norm = L.in_norm;
    L.attn.wq = test::randn({2 * d, H}, 10 + l);
    L.attn.wk = test::randn({d, H}, 20 + l);
    L.attn.wv = cpu_zeros(DType::F32, {d, H});
    L.attn.bq = cpu_zeros(DType::F32, {2 * d});
    L.attn.bk = cpu_zeros(DType::F32, {d});
    std::vector<float> bv(d, 0.0f);
    bv[0] = 1.0f;
    L.attn.bv = cpu_tensor(bv, {d});
    L.attn.wo = cpu_zeros(DType::F32, {H, 2 * d});
    for (int64_t r = 0; r < H; ++r) L.attn.wo.ptr<float>()[r * 2 * d] = static_cast<float>(l + 1);  // head 0, dim 0
    L.mlp.w_gate = cpu_zeros(DType::F32, {4, H});
    L.mlp.w_up = cpu_zeros(DType::F32, {4, H});
    L.mlp.w_down = cpu_zeros(DType::F32, {H, 4});
    w.layers.push_back(L);
  }
  Target t(cfg, w);
  std::vector<int64_t> ids = {0, 3, 7};
  auto out = t.forward(*ctx, cpu_tensor_i32({1, 2, 3, 4, 5}, {5}), ids, true);
  auto f = to_f32_vector(out.features);
  for (int64_t pos = 0; pos < 5; ++pos)
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t l = ids[i];
      const float expect = static_cast<float>((l + 1) * (l + 2) / 2);  // sum_{m<=l} (m+1)
      for (int64_t c = 0; c < H; ++c)
        ASSERT_EQ(f[pos * 3 * H + i * H + c], expect) << "layer id " << l << " position " << pos;
    }
  // the last captured layer (7) is pre-final-norm: 36, while the final-norm output is 1
  EXPECT_EQ(f[2 * H], 36.0f);
  EXPECT_NEAR(to_f32_vector(out.final_hidden)[0], 1.0f, 1e-5);
}
