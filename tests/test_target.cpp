// Target forward against Hugging Face transformers (golden files from tools/make_goldens.py, computed in fp64),
// the KV-cache decode path, and case C10 (layer index of the captured features).
#include <gtest/gtest.h>

#include <numeric>

#include "backend/context.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "test_util.h"

using namespace dflash;
using dflash::test::rel_err;
using dflash::test::to_f64;

namespace {

// tol_f64: the bound on the "cpu64" context (the goldens' own float32 parts set it: RoPE angles; for the hybrid
// families also the RMSNorms, the gated delta rule and the gated norm, which transformers runs in float32 inside a
// float64 model).
void check_golden(const std::string& name, const std::string& device, double tol_f64 = 2e-6) {
  const std::string dir = test::source_dir() + "/tests/golden/" + name;
  auto ctx = make_context(device);
  auto target = Target::load(dir, *ctx);
  auto g = SafetensorsFile::open(dir + "/golden.safetensors");
  const ModelConfig& cfg = target->config();
  const int64_t L = cfg.num_hidden_layers, H = cfg.hidden_size, V = cfg.vocab_size;
  Tensor ids = g->view("input_ids");
  const int64_t S = ids.numel();
  std::vector<int64_t> all(L);
  std::iota(all.begin(), all.end(), 0);
  // RoPE frequencies (incl. Llama-3 scaling) as transformers computes them (goldens that record them)
  if (g->find("rope_inv_freq")) {
    EXPECT_LT(rel_err(to_f64(target->weights().inv_freq), to_f64(g->view("rope_inv_freq"))), 1e-6) << name;
  }
  auto out = target->forward(*ctx, ids, all, true);
  Tensor feats = ctx->to_host(out.features, false);
  const double tol = ctx->compute_dtype() == DType::F64 ? tol_f64 : 2e-5;  // golden angles are fp32 (see metadata)
  for (int64_t l = 0; l < L; ++l) {
    auto fv = to_f64(feats);
    std::vector<double> col(static_cast<size_t>(S * H));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t c = 0; c < H; ++c) col[t * H + c] = fv[t * L * H + l * H + c];
    EXPECT_LT(rel_err(col, to_f64(g->view(cat("layer_output.", l)))), tol) << name << " layer " << l;
    if (l + 1 < L) {  // HF hidden_states[l+1] is the same tensor, except the last which HF returns normed
      EXPECT_LT(rel_err(col, to_f64(g->view(cat("hidden_states.", l + 1)))), tol) << name << " hidden_states " << l + 1;
    }
  }
  EXPECT_LT(rel_err(to_f64(ctx->to_host(out.final_hidden, false)), to_f64(g->view("final_hidden"))), tol) << name;
  Tensor logits = ctx->empty(ctx->compute_dtype(), {S, V});
  target->logits(*ctx, out.final_hidden, logits);
  EXPECT_LT(rel_err(to_f64(ctx->to_host(logits, false)), to_f64(g->view("logits"))), tol) << name;

  // KV cache: prefill S - n tokens, then decode the last n one at a time (n = kv_decode_logits' rows: 36 + 4 of 40;
  // the hybrid goldens 140 + 10 of 150, past two chunks of 64)
  KVCache cache = KVCache::create(*ctx, cfg, S);
  std::vector<int32_t> idv(ids.ptr<int32_t>(), ids.ptr<int32_t>() + S);
  std::vector<int64_t> none;
  const int64_t n_dec = g->view("kv_decode_logits").shape[0], P = S - n_dec;
  target->forward(*ctx, cpu_tensor_i32(std::vector<int32_t>(idv.begin(), idv.begin() + P), {P}), none, true, &cache);
  std::vector<double> dec;
  for (int64_t t = P; t < S; ++t) {
    auto o = target->forward(*ctx, cpu_tensor_i32({idv[t]}, {1}), none, true, &cache);
    Tensor lg = ctx->empty(ctx->compute_dtype(), {1, V});
    target->logits(*ctx, o.final_hidden, lg);
    auto v = to_f64(ctx->to_host(lg, false));
    dec.insert(dec.end(), v.begin(), v.end());
  }
  EXPECT_EQ(cache.len, S);
  EXPECT_LT(rel_err(dec, to_f64(g->view("kv_decode_logits"))), tol) << name << " KV-cache decode";
}

}  // namespace

TEST(TargetGolden, Qwen3MatchesTransformers) { check_golden("target_qwen3", "cpu"); }
TEST(TargetGolden, Llama3WithRopeScalingMatchesTransformers) { check_golden("target_llama3", "cpu"); }
TEST(TargetGolden, Qwen2WithBiasMatchesTransformers) { check_golden("target_qwen2", "cpu"); }
TEST(TargetGolden, Qwen3InFp64) { check_golden("target_qwen3", "cpu64"); }
TEST(TargetGolden, Qwen3MoeMatchesTransformers) { check_golden("target_qwen3_moe", "cpu"); }
TEST(TargetGolden, Qwen3MoeInFp64) { check_golden("target_qwen3_moe", "cpu64"); }

// The experts each token chose, per MoE layer and in order, equal the golden's (tools/ref_dflash.py's choice, which
// transformers' was checked against); the same weights in the other expert layout, sharded over two files with
// model.safetensors.index.json, give the same bits.
TEST(TargetGolden, Qwen3MoeChoosesTheGoldensExpertsInAnyLayout) {
  const std::string dir = test::source_dir() + "/tests/golden/target_qwen3_moe";
  auto ctx = make_context("cpu");
  auto target = Target::load(dir, *ctx);
  auto g = SafetensorsFile::open(dir + "/golden.safetensors");
  const ModelConfig& cfg = target->config();
  std::vector<int64_t> all(static_cast<size_t>(cfg.num_hidden_layers));
  std::iota(all.begin(), all.end(), 0);
  const Tensor ids = g->view("input_ids");
  auto out = target->forward(*ctx, ids, all, true);
  int moe_layers = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const Tensor& r = out.router_topk[static_cast<size_t>(l)];
    if (cfg.layer(l).mlp == ChannelMixer::Dense) {
      EXPECT_FALSE(r.defined());
      continue;
    }
    ++moe_layers;
    const Tensor want = g->view(cat("router_topk.", l));
    ASSERT_EQ(r.numel(), want.numel());
    for (int64_t i = 0; i < r.numel(); ++i)
      ASSERT_EQ(r.ptr<int32_t>()[i], want.ptr<int32_t>()[i]) << "layer " << l << " pair " << i;
  }
  EXPECT_EQ(moe_layers, 3);  // layer 2 is dense (mlp_only_layers)
  auto sharded = Target::load(dir + "_sharded", *ctx);
  auto o2 = sharded->forward(*ctx, ids, all, true);
  EXPECT_EQ(to_f32_vector(o2.features), to_f32_vector(out.features));
  EXPECT_EQ(to_f32_vector(o2.final_hidden), to_f32_vector(out.final_hidden));
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
