// tests/common/golden_checks.h — a target against its transformers golden (tests/golden/<name>/golden.safetensors:
// every layer's output, the final norm, the logits and a cached decode; the experts each token chose), shared by the
// family tests (tests/families/<family>.cpp).
// defines: GoldenTolerance, check_golden, check_hybrid_golden, check_router_topk
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "backend/context.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "test_util.h"

namespace dflash::test {

// The relative-error bounds per context: "cpu" (fp32) and "cpu64" (fp64, bounded by the goldens' own float32 parts:
// RoPE angles; for the hybrid families also the RMSNorms, the gated delta rule and the gated norm, which transformers
// runs in float32 inside a float64 model). experts: the experts each token chose (router_topk.{l}, where the golden
// records them) must equal transformers' in every MoE layer.
struct GoldenTolerance {
  double f32 = 2e-5, f64 = 2e-6;
  bool experts = false;
};

// Target `name` (tests/golden/<name>) on `device` against its golden: the RoPE frequencies (goldens that record them),
// every layer's output and HF's hidden_states, the final norm, the logits, and a cached decode: prefill S - n tokens,
// then the last n one at a time (n = kv_decode_logits' rows: 36 + 4 of 40; the hybrid goldens 140 + 10 of 150, past
// two chunks of 64; the linear layers' window and state carried from the prefill).
inline void check_golden(const std::string& name, const std::string& device, const GoldenTolerance& tol_ = {}) {
  const std::string dir = name.starts_with('/') ? name : source_dir() + "/tests/golden/" + name;  // or a directory
  auto ctx = make_context(device);
  auto target = Target::load(dir, *ctx);
  auto g = SafetensorsFile::open(dir + "/golden.safetensors");
  const ModelConfig& cfg = target->config();
  const int64_t L = cfg.num_hidden_layers, H = cfg.hidden_size, V = cfg.vocab_size;
  Tensor ids = g->view("input_ids");
  const int64_t S = ids.numel();
  std::vector<int64_t> all(static_cast<size_t>(L));
  std::iota(all.begin(), all.end(), 0);
  // RoPE frequencies (incl. Llama-3 scaling) as transformers computes them (goldens that record them; the others:
  // checked through every layer's output, and YaRN's in tests/ops/rope.cpp's RopeYarn)
  if (g->find("rope_inv_freq")) {
    EXPECT_LT(rel_err(to_f64(target->weights().inv_freq), to_f64(g->view("rope_inv_freq"))), 1e-6) << name;
  }
  auto out = target->forward(*ctx, ids, all, true);
  const double tol = ctx->compute_dtype() == DType::F64 ? tol_.f64 : tol_.f32;
  const auto fv = to_f64(ctx->to_host(out.features, false));
  for (int64_t l = 0; l < L; ++l) {
    std::vector<double> col(static_cast<size_t>(S * H));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t c = 0; c < H; ++c) col[t * H + c] = fv[t * L * H + l * H + c];
    EXPECT_LT(rel_err(col, to_f64(g->view(cat("layer_output.", l)))), tol) << name << " layer " << l;
    if (l + 1 < L) {  // HF hidden_states[l+1] is the same tensor, except the last which HF returns normed
      EXPECT_LT(rel_err(col, to_f64(g->view(cat("hidden_states.", l + 1)))), tol) << name << " hidden_states " << l + 1;
    }
    if (tol_.experts && g->find(cat("router_topk.", l))) {
      const Tensor want = g->view(cat("router_topk.", l));
      const Tensor got = ctx->to_host(out.router_topk[static_cast<size_t>(l)], false);
      ASSERT_EQ(got.numel(), want.numel()) << name << " layer " << l;
      int64_t same = 0;
      for (int64_t i = 0; i < got.numel(); ++i) same += got.ptr<int32_t>()[i] == want.ptr<int32_t>()[i];
      EXPECT_EQ(same, got.numel()) << name << " layer " << l << ": experts differ from transformers'";
    }
  }
  EXPECT_LT(rel_err(to_f64(ctx->to_host(out.final_hidden, false)), to_f64(g->view("final_hidden"))), tol) << name;
  Tensor logits = ctx->empty(ctx->compute_dtype(), {S, V});
  target->logits(*ctx, out.final_hidden, logits);
  EXPECT_LT(rel_err(to_f64(ctx->to_host(logits, false)), to_f64(g->view("logits"))), tol) << name;

  KVCache cache = target->make_cache(*ctx, S);
  std::vector<int32_t> idv(ids.ptr<int32_t>(), ids.ptr<int32_t>() + S);
  const std::vector<int64_t> none;
  const int64_t n_dec = g->view("kv_decode_logits").shape[0], P = S - n_dec;
  target->forward(*ctx, cpu_tensor_i32(std::vector<int32_t>(idv.begin(), idv.begin() + P), {P}), none, true, &cache);
  std::vector<double> dec;
  for (int64_t t = P; t < S; ++t) {
    auto o = target->forward(*ctx, cpu_tensor_i32({idv[t]}, {1}), none, true, &cache);
    Tensor lg = ctx->empty(ctx->compute_dtype(), {1, V});
    target->logits(*ctx, o.final_hidden, lg);
    const auto v = to_f64(ctx->to_host(lg, false));
    dec.insert(dec.end(), v.begin(), v.end());
  }
  EXPECT_EQ(cache.len, S);
  EXPECT_LT(rel_err(dec, to_f64(g->view("kv_decode_logits"))), tol) << name << " KV-cache decode";
}

// A hybrid target (linear-attention layers) against its golden: every layer's output, the final norm, the logits, the cached decode (prefill 140, then 10 tokens one at a time)
// against the golden (check_golden above); the experts chosen per MoE layer equal transformers'. transformers keeps
// float32 inside its float64 model (the golden's metadata), so fp64 agrees to ~1e-6.
inline void check_hybrid_golden(const std::string& name, const std::string& device) {
  const ModelConfig cfg = load_model_config(source_dir() + "/tests/golden/" + name);
  ASSERT_TRUE(cfg.has_linear_attention()) << name;
  auto g = SafetensorsFile::open(source_dir() + "/tests/golden/" + name + "/golden.safetensors");
  ASSERT_GT(g->view("input_ids").numel(), 128) << "the golden must pass two chunks of 64";
  check_golden(name, device, {.f32 = 3e-5, .f64 = 1e-5, .experts = true});
}

// The experts each token chose, per MoE layer and in order, equal the golden's router_topk.{l}; returns the target's
// features and final hidden (for comparisons between layouts) and the number of MoE layers.
// `name` is the model's directory, `golden` the one with golden.safetensors (the same by default).
inline int check_router_topk(const std::string& name, std::vector<float>* features = nullptr,
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

}  // namespace dflash::test
