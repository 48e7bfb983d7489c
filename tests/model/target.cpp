// tests/model/target.cpp — the target's forward independent of any family: case C10 (the layer index of the captured
// features) on a hand-built 8-layer target. The goldens of each family against transformers: tests/families/.
#include <gtest/gtest.h>

#include <vector>

#include "backend/context.h"
#include "model/target.h"
#include "model/target/attention.h"
#include "common/test_util.h"

using namespace dflash;

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
    AttentionWeights& attn = L.mixer.emplace<AttentionWeights>();
    attn.wq = test::randn({2 * d, H}, 10 + l);
    attn.wk = test::randn({d, H}, 20 + l);
    attn.wv = cpu_zeros(DType::F32, {d, H});
    attn.bq = cpu_zeros(DType::F32, {2 * d});
    attn.bk = cpu_zeros(DType::F32, {d});
    std::vector<float> bv(d, 0.0f);
    bv[0] = 1.0f;
    attn.bv = cpu_tensor(bv, {d});
    attn.wo = cpu_zeros(DType::F32, {H, 2 * d});
    for (int64_t r = 0; r < H; ++r) attn.wo.w.ptr<float>()[r * 2 * d] = static_cast<float>(l + 1);  // head 0, dim 0
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
