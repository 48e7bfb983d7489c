// Hybrid linear-attention targets (issue 37: Qwen3-Next, Qwen3.5 / Qwen3.6, dense and MoE): the new ops on the CPU
// against formulas written out here (convolution with its window, the gated delta rule in pieces, gates, norms,
// partial RoPE), the families' configs (published shapes, image-text checkpoints, refusals), the four goldens of
// transformers 5.17 (150 tokens, past two chunks of 64: every layer, the logits, the KV/state-cached decode, the
// experts chosen) in fp32 and fp64, the recurrent state's rollback, speculative decoding = the target's greedy
// output, batched generation, and `dflash info` / `capture` / `train` / `eval` on them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "eval/generate.h"
#include "eval/tau.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "io/model_family_hybrid.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/target.h"
#include "decode_checks.h"
#include "golden_checks.h"
#include "test_util.h"
#include "train_fixtures.h"

using namespace dflash;
using nlohmann::json;
using test::rel_err;
using test::to_f64;

namespace {

std::string golden_dir(const std::string& name) { return test::source_dir() + "/tests/golden/" + name; }

const char* kHybridGoldens[] = {"target_qwen3_next", "target_qwen3_5", "target_qwen3_5_moe", "target_qwen3_5_vl"};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

// ---- ops ---------------------------------------------------------------------------------------------------------

// y[t, c] = silu(sum_j w[c, j] x[t + j - 3, c]) with zeros before the start; the same sequence in pieces of 2, 1 and
// 4 rows with the state carried between them gives the same rows, and the state ends as the last 3 inputs.
TEST(HybridOps, CausalConvWithItsWindow) {
  auto ctx = make_context("cpu64");
  const int64_t T = 7, C = 5, K = 4;
  const Tensor x = test::randn({T, C}, 1, 1.0, DType::F64), w = test::randn({C, K}, 2, 0.5, DType::F64);
  Tensor y = cpu_empty(DType::F64, {T, C});
  ctx->conv1d_causal(x, w, Tensor{}, y);
  const double* X = x.ptr<double>();
  const double* W = w.ptr<double>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = t + j - (K - 1);
        if (s >= 0) acc += W[c * K + j] * X[s * C + c];
      }
      EXPECT_NEAR(y.ptr<double>()[t * C + c], acc * sigmoid(acc), 1e-14) << t << "," << c;
    }
  Tensor state = cpu_zeros(DType::F64, {K - 1, C}), yp = cpu_empty(DType::F64, {T, C});
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 3}, {3, 7}})
    ctx->conv1d_causal(x.slice(b, e), w, state, yp.slice(b, e));
  EXPECT_EQ(to_f64(yp), to_f64(y));
  for (int64_t i = 0; i < (K - 1) * C; ++i) EXPECT_EQ(state.ptr<double>()[i], X[(T - (K - 1)) * C + i]);
  // errors name the op and the tensor
  try {
    ctx->conv1d_causal(x, w, cpu_zeros(DType::F64, {2, C}), yp);
    ADD_FAILURE() << "a window of 2 rows accepted for K = 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv1d_causal: state"), std::string::npos) << e.what();
  }
}

// Several sequences in one call (seqs, a packed prefill): each from a zero window, the rows of one call per sequence;
// a window or offsets that do not tile the rows are refused.
TEST(HybridOps, CausalConvPackedSequences) {
  auto ctx = make_context("cpu64");
  const int64_t C = 5, K = 4;
  const std::vector<int64_t> seqs = {0, 2, 2, 9, 10};
  const int64_t T = seqs.back();
  const Tensor x = test::randn({T, C}, 3, 1.0, DType::F64), w = test::randn({C, K}, 4, 0.5, DType::F64);
  Tensor y = cpu_empty(DType::F64, {T, C}), ys = cpu_empty(DType::F64, {T, C});
  ctx->conv1d_causal(x, w, Tensor{}, y, seqs);
  for (size_t i = 0; i + 1 < seqs.size(); ++i)
    ctx->conv1d_causal(x.slice(seqs[i], seqs[i + 1]), w, Tensor{}, ys.slice(seqs[i], seqs[i + 1]));
  EXPECT_EQ(to_f64(y), to_f64(ys));
  Tensor whole = cpu_empty(DType::F64, {T, C});  // one sequence: row 2 (sequence 3's first) sees rows 0, 1
  ctx->conv1d_causal(x, w, Tensor{}, whole);
  EXPECT_NE(to_f64(whole.slice(2, 3)), to_f64(y.slice(2, 3)));
  const auto refused = [&](const Tensor& state, std::vector<int64_t> s, const char* what) {
    try {
      ctx->conv1d_causal(x, w, state, y, s);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("conv1d_causal: "), std::string::npos) << e.what();
    }
  };
  refused(cpu_zeros(DType::F64, {K - 1, C}), seqs, "a window with seqs");
  refused(Tensor{}, {0, 4, 9}, "seqs ending before T");
  refused(Tensor{}, {0, 5, 4, 10}, "seqs descending");
}

// beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), softplus passing x > 20 through (torch).
TEST(HybridOps, GdnGates) {
  auto ctx = make_context("cpu64");
  const std::vector<double> ba = {0.5, -1.0, 2.0, 25.0};  // one token, nv = 2: b = (0.5, -1), a = (2, 25)
  Tensor t = cpu_empty(DType::F64, {1, 4});
  std::copy(ba.begin(), ba.end(), t.ptr<double>());
  Tensor al = cpu_empty(DType::F64, {2}), dt = cpu_empty(DType::F64, {2});
  al.ptr<double>()[0] = std::log(3.0);
  al.ptr<double>()[1] = std::log(0.5);
  dt.ptr<double>()[0] = 0.25;
  dt.ptr<double>()[1] = -1.0;
  Tensor g = cpu_empty(DType::F64, {1, 2}), beta = cpu_empty(DType::F64, {1, 2});
  ctx->gdn_gate(t, al, dt, g, beta);
  EXPECT_NEAR(beta.ptr<double>()[0], sigmoid(0.5), 1e-15);
  EXPECT_NEAR(beta.ptr<double>()[1], sigmoid(-1.0), 1e-15);
  EXPECT_NEAR(g.ptr<double>()[0], -3.0 * std::log1p(std::exp(2.25)), 1e-14);
  EXPECT_NEAR(g.ptr<double>()[1], -0.5 * 24.0, 1e-14);  // 25 - 1 = 24 > 20: softplus is the identity
}

namespace {
// The gated delta rule written out with explicit matrices (one value head h over its key head h / (nv / nk)).
std::vector<double> delta_rule_reference(const Tensor& qkv, const Tensor& g, const Tensor& beta, int64_t nk,
                                         int64_t dk, int64_t nv, int64_t dv, std::vector<double>* state) {
  const int64_t T = qkv.shape[0], C = qkv.shape[1];
  std::vector<double> out(static_cast<size_t>(T * nv * dv));
  for (int64_t h = 0; h < nv; ++h) {
    const int64_t kh = h / (nv / nk);
    std::vector<double> S(static_cast<size_t>(dk * dv), 0.0);
    if (state) std::copy(state->begin() + h * dk * dv, state->begin() + (h + 1) * dk * dv, S.begin());
    for (int64_t t = 0; t < T; ++t) {
      const double* r = qkv.ptr<double>() + t * C;
      std::vector<double> q(r + kh * dk, r + (kh + 1) * dk), k(r + nk * dk + kh * dk, r + nk * dk + (kh + 1) * dk);
      const double* v = r + 2 * nk * dk + h * dv;
      double nq = 0, nkk = 0;
      for (int64_t i = 0; i < dk; ++i) nq += q[i] * q[i], nkk += k[i] * k[i];
      for (int64_t i = 0; i < dk; ++i) {
        q[i] /= std::sqrt(nq + 1e-6) * std::sqrt(double(dk));
        k[i] /= std::sqrt(nkk + 1e-6);
      }
      const double a = std::exp(g.ptr<double>()[t * nv + h]), b = beta.ptr<double>()[t * nv + h];
      // S_t = a (I - b k k^T) S_{t-1} + b k v^T   (the same update, as a matrix product)
      std::vector<double> kS(static_cast<size_t>(dv), 0.0);
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) kS[j] += k[i] * S[i * dv + j];
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] = a * (S[i * dv + j] - b * k[i] * kS[j]) + b * k[i] * v[j];
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * q[i];
        out[(t * nv + h) * dv + j] = o;
      }
    }
    if (state) std::copy(S.begin(), S.end(), state->begin() + h * dk * dv);
  }
  return out;
}
}  // namespace

// The op against the matrix form S_t = a (I - b k k^T) S_{t-1} + b k v^T, o_t = S_t^T q_t (value heads grouped over
// key heads); and run in pieces with the state carried, the same outputs and final state.
TEST(HybridOps, GatedDeltaRuleMatchesTheMatrixFormAndRunsInPieces) {
  auto ctx = make_context("cpu64");
  const int64_t T = 9, nk = 2, dk = 4, nv = 4, dv = 3, C = 2 * nk * dk + nv * dv;
  const Tensor qkv = test::randn({T, C}, 5, 1.0, DType::F64);
  Tensor g = test::randn({T, nv}, 6, 0.5, DType::F64), beta = test::randn({T, nv}, 7, 1.0, DType::F64);
  for (int64_t i = 0; i < T * nv; ++i) {
    g.ptr<double>()[i] = -std::fabs(g.ptr<double>()[i]);
    beta.ptr<double>()[i] = sigmoid(beta.ptr<double>()[i]);
  }
  Tensor out = cpu_empty(DType::F64, {T, nv, dv});
  ctx->gated_delta_rule({qkv, g, beta, Tensor{}, nk, dk, nv, dv, {}}, out);
  const std::vector<double> want = delta_rule_reference(qkv, g, beta, nk, dk, nv, dv, nullptr);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out.ptr<double>()[i], want[i], 1e-13) << i;
  // pieces 0..3, 3..4, 4..9 from a non-zero start state
  Tensor st = test::randn({nv, dk, dv}, 8, 0.3, DType::F64);
  std::vector<double> ref_state = to_f64(st);
  const std::vector<double> want2 = delta_rule_reference(qkv, g, beta, nk, dk, nv, dv, &ref_state);
  Tensor out2 = cpu_empty(DType::F64, {T, nv, dv});
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 4}, {4, 9}})
    ctx->gated_delta_rule({qkv.slice(b, e), g.slice(b, e), beta.slice(b, e), st, nk, dk, nv, dv, {}},
                          out2.slice(b, e));
  for (size_t i = 0; i < want2.size(); ++i) EXPECT_NEAR(out2.ptr<double>()[i], want2[i], 1e-13) << i;
  const std::vector<double> got_state = to_f64(st);
  for (size_t i = 0; i < ref_state.size(); ++i) EXPECT_NEAR(got_state[i], ref_state[i], 1e-13) << i;
  EXPECT_THROW(ctx->gated_delta_rule({qkv, g, beta, Tensor{}, 3, dk, nv, dv, {}}, out), Error);  // nv % nk != 0
  // several sequences in one call (seqs): each from zeros, as three calls would run them
  Tensor out3 = cpu_empty(DType::F64, {T, nv, dv});
  ctx->gated_delta_rule({qkv, g, beta, Tensor{}, nk, dk, nv, dv, {0, 4, 4, 9}}, out3);
  Tensor out4 = cpu_empty(DType::F64, {T, nv, dv});
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 9}})
    ctx->gated_delta_rule({qkv.slice(b, e), g.slice(b, e), beta.slice(b, e), Tensor{}, nk, dk, nv, dv, {}},
                          out4.slice(b, e));
  EXPECT_EQ(to_f64(out3), to_f64(out4));
  EXPECT_THROW(ctx->gated_delta_rule({qkv, g, beta, st, nk, dk, nv, dv, {0, 4, 9}}, out3), Error);  // no state
  EXPECT_THROW(ctx->gated_delta_rule({qkv, g, beta, Tensor{}, nk, dk, nv, dv, {0, 4, 8}}, out3), Error);  // != T
}

// Zero-centred RMSNorm x rstd (1 + w), the gated norm x rstd w silu(z), and sigmoid_gate per element and per row.
TEST(HybridOps, NormsAndGates) {
  auto ctx = make_context("cpu64");
  const int64_t R = 3, D = 5;
  const Tensor x = test::randn({R, D}, 9, 1.0, DType::F64), w = test::randn({D}, 10, 0.3, DType::F64);
  const Tensor z = test::randn({R, D}, 11, 1.0, DType::F64);
  Tensor y1 = cpu_empty(DType::F64, {R, D}), y2 = cpu_empty(DType::F64, {R, D});
  ctx->rmsnorm_gated(x, w, nullptr, 1e-6f, true, y1);
  ctx->rmsnorm_gated(x, w, &z, 1e-6f, false, y2);
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += x.ptr<double>()[r * D + i] * x.ptr<double>()[r * D + i];
    const double inv = 1.0 / std::sqrt(ss / D + double(1e-6f));
    for (int64_t i = 0; i < D; ++i) {
      const double n = x.ptr<double>()[r * D + i] * inv, zz = z.ptr<double>()[r * D + i];
      EXPECT_NEAR(y1.ptr<double>()[r * D + i], n * (1 + w.ptr<double>()[i]), 1e-14);
      EXPECT_NEAR(y2.ptr<double>()[r * D + i], n * w.ptr<double>()[i] * zz * sigmoid(zz), 1e-14);
    }
  }
  Tensor a = cpu_clone(x), b = cpu_clone(x);
  const Tensor row = test::randn({R, 1}, 12, 1.0, DType::F64);
  ctx->sigmoid_gate(a, z);
  ctx->sigmoid_gate(b, row);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < D; ++i) {
      const double v = x.ptr<double>()[r * D + i];
      EXPECT_NEAR(a.ptr<double>()[r * D + i], v * sigmoid(z.ptr<double>()[r * D + i]), 1e-15);
      EXPECT_NEAR(b.ptr<double>()[r * D + i], v * sigmoid(row.ptr<double>()[r]), 1e-15);
    }
  EXPECT_THROW(ctx->sigmoid_gate(a, cpu_zeros(DType::F64, {R, 2})), Error);
}

// Partial rotary: inv_freq of r/2 < d/2 entries rotates (x_i, x_{i+r/2}) for i < r/2 and leaves dims r..d-1.
TEST(HybridOps, PartialRope) {
  auto ctx = make_context("cpu64");
  const int64_t T = 3, heads = 2, d = 8, r = 4;
  const Tensor x0 = test::randn({T, heads, d}, 13, 1.0, DType::F64);
  Tensor x = cpu_clone(x0);
  const Tensor inv = rope_inv_freq(r, 10000.0, RopeScaling{});
  ASSERT_EQ(inv.numel(), 2);
  ctx->rope(x, cpu_tensor_i32({0, 5, 11}, {T}), inv, false);
  const int pos[3] = {0, 5, 11};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const double* a = x0.ptr<double>() + (t * heads + h) * d;
      const double* b = x.ptr<double>() + (t * heads + h) * d;
      for (int64_t i = 0; i < r / 2; ++i) {
        const double ang = static_cast<float>(pos[t]) * inv.ptr<float>()[i];
        EXPECT_NEAR(b[i], a[i] * std::cos(ang) - a[i + r / 2] * std::sin(ang), 1e-6);
        EXPECT_NEAR(b[i + r / 2], a[i + r / 2] * std::cos(ang) + a[i] * std::sin(ang), 1e-6);
      }
      for (int64_t i = r; i < d; ++i) EXPECT_EQ(b[i], a[i]);
    }
}

// ---- configs ------------------------------------------------------------------------------------------------------

namespace {
// Qwen/Qwen3.5-9B's shape (transformers' Qwen3_5TextConfig defaults, "Qwen3.5-9B style") as an image-text checkpoint
// writes it: the language model under text_config, M-RoPE keys in rope_parameters.
json qwen3_5_9b() {
  json t = {{"model_type", "qwen3_5_text"}, {"hidden_size", 4096}, {"intermediate_size", 12288},
            {"num_hidden_layers", 32}, {"num_attention_heads", 16}, {"num_key_value_heads", 4}, {"head_dim", 256},
            {"linear_num_key_heads", 16}, {"linear_num_value_heads", 32}, {"linear_key_head_dim", 128},
            {"linear_value_head_dim", 128}, {"linear_conv_kernel_dim", 4}, {"full_attention_interval", 4},
            {"vocab_size", 248320}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 262144},
            {"eos_token_id", 248044}, {"hidden_act", "silu"}, {"tie_word_embeddings", false},
            {"rope_parameters", {{"mrope_interleaved", true}, {"mrope_section", {11, 11, 10}}, {"rope_type", "default"},
                                 {"rope_theta", 10000000}, {"partial_rotary_factor", 0.25}}}};
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"},
          {"tie_word_embeddings", false}, {"text_config", t}, {"vision_config", {{"depth", 27}}}};
}
// Qwen/Qwen3.5-35B-A3B's (Qwen3_5MoeTextConfig defaults), image-text.
json qwen3_5_35b_a3b() {
  json j = qwen3_5_9b();
  j["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
  j["model_type"] = "qwen3_5_moe";
  json& t = j["text_config"];
  t["model_type"] = "qwen3_5_moe_text";
  t.erase("intermediate_size");
  t["hidden_size"] = 2048;
  t["num_hidden_layers"] = 40;
  t["num_key_value_heads"] = 2;
  t["num_experts"] = 256;
  t["num_experts_per_tok"] = 8;
  t["moe_intermediate_size"] = 512;
  t["shared_expert_intermediate_size"] = 512;
  return j;
}
}  // namespace

TEST(HybridConfig, Qwen3_5_9B) {
  const ModelConfig c = parse_model_config(qwen3_5_9b(), "/models/Qwen3.5-9B/config.json");
  EXPECT_EQ(c.arch, Arch::Qwen3_5Vl);
  EXPECT_EQ(c.architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope_dim(), 64);  // 0.25 of 256
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_TRUE(c.zero_centred_norms);
  EXPECT_FALSE(c.has_moe());
  ASSERT_TRUE(c.has_linear_attention());
  for (int64_t l = 0; l < 32; ++l) {
    const LayerSpec s = c.layer(l);
    EXPECT_EQ(s.mixer == TokenMixer::LinearAttention, (l + 1) % 4 != 0) << l;
    EXPECT_TRUE(s.attention.output_gate);
    EXPECT_EQ(s.mlp_width, 12288);
  }
  EXPECT_EQ(c.linear_attn.conv_dim(), 2 * 16 * 128 + 32 * 128);
  EXPECT_EQ(family_of(c.arch).names.layer, "model.language_model.layers.");
  // params: 24 linear layers, 8 gated attention layers, dense MLPs; the published 9B counts the vision tower too
  const int64_t H = 4096, V = 248320, C = 8192, VD = 4096;
  const int64_t lin = H * C + H * VD + 2 * 32 * H + C * 4 + 2 * 32 + 128 + H * VD;
  const int64_t att = 2 * H * 16 * 256 + 2 * H * 4 * 256 + 2 * 256 + H * 16 * 256;
  const int64_t per = 2 * H + 3 * H * 12288;
  const TargetParams p = target_params(c);
  EXPECT_EQ(p.total, 2 * V * H + H + 24 * (lin + per) + 8 * (att + per));
  EXPECT_NEAR(p.total / 1e9, 8.95, 0.01);
  // the drafter: the spec's layer ids (SpecForge / z-lab: Qwen3.5-4B [1, 8, 15, 22, 29] at 32 layers), 32 heads of
  // 128 with 8 kv heads, the target's MLP width and full rotary at the target's theta
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 8, 15, 22, 29}));
  const DrafterConfig d = DrafterConfig::for_target(c, 5, 16, {1, 8, 15, 22, 29}, 248070);
  EXPECT_EQ(d.num_heads, 32);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.num_kv_heads, 8);
  EXPECT_EQ(d.intermediate_size, 12288);
  EXPECT_EQ(d.rope_theta, 1e7);
}

TEST(HybridConfig, Qwen3_5_35B_A3B) {
  const ModelConfig c = parse_model_config(qwen3_5_35b_a3b(), "/models/Qwen3.5-35B-A3B/config.json");
  EXPECT_EQ(c.arch, Arch::Qwen3_5MoeVl);
  EXPECT_EQ(c.intermediate_size, 0);  // Qwen3_5MoeTextConfig has none: every layer is MoE
  EXPECT_TRUE(c.moe.norm_topk_prob);  // always renormalised
  EXPECT_EQ(c.moe.shared_expert_width, 512);
  for (int64_t l = 0; l < 40; ++l) EXPECT_EQ(c.layer(l).mlp, ChannelMixer::MoE);
  // SpecForge's qwen3.5-35b-a3b-dflash: target_layer_ids [1, 10, 19, 28, 37], 32 x 128 heads, kv 4, MLP 6144 = 3 H
  EXPECT_EQ(default_target_layer_ids(c.num_hidden_layers, 5), (std::vector<int64_t>{1, 10, 19, 28, 37}));
  const DrafterConfig d = DrafterConfig::for_target(c, 8, 16, {1, 10, 19, 28, 37}, 248070);
  EXPECT_EQ(d.num_kv_heads, 4);
  EXPECT_EQ(d.intermediate_size, 6144);
  const TargetParams p = target_params(c);
  EXPECT_NEAR(p.total / 1e9, 34.66, 0.05);   // the card's 35B (language model)
  EXPECT_NEAR(p.active / 1e9, 2.95, 0.01);   // A3B: the router, 8 of 256 experts and the shared expert per layer
  EXPECT_NEAR((p.active + p.embedding) / 1e9, 3.45, 0.01);
}

TEST(HybridConfig, DefaultsLayerTypesAndRefusals) {
  // Qwen3-Next-80B-A3B's published keys: partial_rotary_factor and rope_theta at the top level, no layer_types
  json n = {{"architectures", {"Qwen3NextForCausalLM"}}, {"model_type", "qwen3_next"}, {"hidden_size", 2048},
            {"intermediate_size", 5120}, {"num_hidden_layers", 48}, {"num_attention_heads", 16},
            {"num_key_value_heads", 2}, {"head_dim", 256}, {"vocab_size", 151936}, {"partial_rotary_factor", 0.25},
            {"rope_theta", 10000000}, {"full_attention_interval", 4}, {"num_experts", 512},
            {"num_experts_per_tok", 10}, {"moe_intermediate_size", 512}, {"shared_expert_intermediate_size", 512},
            {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()}};
  const ModelConfig c = parse_model_config(n, "/m/config.json");
  EXPECT_EQ(c.arch, Arch::Qwen3Next);
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.layer(3).mixer, TokenMixer::Attention);
  EXPECT_EQ(c.layer(4).mixer, TokenMixer::LinearAttention);
  EXPECT_EQ(c.layer(0).mlp, ChannelMixer::MoE);
  EXPECT_EQ(c.moe.top_k, 10);
  EXPECT_NEAR(target_params(c).total / 1e9, 79.67, 0.1);  // Qwen3-Next-80B-A3B
  auto msg = [](json x) {
    try {
      parse_model_config(x, "/m/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json bad = n;
  bad["layer_types"] = {"linear_attention", "mamba"};
  EXPECT_NE(msg(bad).find("layer_types"), std::string::npos) << msg(bad);
  bad["layer_types"] = json(std::vector<std::string>(48, "sliding_attention"));
  EXPECT_NE(msg(bad).find("layer_types[0]: 'sliding_attention'"), std::string::npos) << msg(bad);
  bad = n;
  bad["linear_num_value_heads"] = 24;
  bad["linear_num_key_heads"] = 16;
  EXPECT_NE(msg(bad).find("linear_num_value_heads 24"), std::string::npos) << msg(bad);
  bad = n;
  bad["partial_rotary_factor"] = 0.005;  // 1.28 dims
  EXPECT_NE(msg(bad).find("partial_rotary_factor"), std::string::npos) << msg(bad);
  json d = qwen3_5_9b();
  d["text_config"].erase("intermediate_size");
  EXPECT_NE(msg(d).find("missing text_config.intermediate_size"), std::string::npos) << msg(d);
}

// ---- goldens of transformers 5.17 ---------------------------------------------------------------------------------

namespace {
// Every layer's output, the final norm, the logits, the cached decode (prefill 140, then 10 tokens one at a time)
// against the golden (tests/golden_checks.h); the experts chosen per MoE layer equal transformers'. transformers keeps
// float32 inside its float64 model (the golden's metadata), so fp64 agrees to ~1e-6.
void check_hybrid_golden(const std::string& name, const std::string& device) {
  const ModelConfig cfg = load_model_config(golden_dir(name));
  ASSERT_TRUE(cfg.has_linear_attention()) << name;
  auto g = SafetensorsFile::open(golden_dir(name) + "/golden.safetensors");
  ASSERT_GT(g->view("input_ids").numel(), 128) << "the golden must pass two chunks of 64";
  test::check_golden(name, device, {.f32 = 3e-5, .f64 = 1e-5, .experts = true});
}
}  // namespace

// Qwen3-Next's fused projections split by io's layout conversion (transformers' fix_query_key_value_ordering): qkvz
// viewed as [nk, q (dk) | k (dk) | v (r dv) | z (r dv)] and ba as [nk, b (r) | a (r)]; the split layout concatenates
// all key heads' q, then k, then v (and z, b, a alone). Every value names its source row.
TEST(HybridConfig, GroupedQkvzSplitsPerKeyHead) {
  LinearAttnConfig a;
  a.num_key_heads = 2, a.num_value_heads = 4, a.key_head_dim = 3, a.value_head_dim = 2, a.conv_kernel = 4;
  const int64_t nk = 2, dk = 3, r = 2, vd = r * 2, group = 2 * dk + 2 * vd, nv = 4, H = 2;
  Tensor qkvz = cpu_empty(DType::F32, {nk * group, H}), ba = cpu_empty(DType::F32, {2 * nv, H});
  for (int64_t i = 0; i < qkvz.numel(); ++i) qkvz.ptr<float>()[i] = static_cast<float>(i / H);
  for (int64_t i = 0; i < ba.numel(); ++i) ba.ptr<float>()[i] = static_cast<float>(100 + i / H);
  const SplitLinearAttnProjections s = split_grouped_qkvz(qkvz, ba, a);
  ASSERT_EQ(s.qkv.shape, (Shape{a.conv_dim(), H}));
  ASSERT_EQ(s.z.shape, (Shape{a.value_dim(), H}));
  ASSERT_EQ(s.ba.shape, (Shape{2 * nv, H}));
  std::vector<float> qkv, z, b, av;  // the expected source rows, in order
  for (int64_t part = 0; part < 3; ++part)  // q, k, v
    for (int64_t g = 0; g < nk; ++g)
      for (int64_t i = 0; i < (part < 2 ? dk : vd); ++i) qkv.push_back(static_cast<float>(g * group + part * dk + i));
  for (int64_t g = 0; g < nk; ++g)
    for (int64_t i = 0; i < vd; ++i) z.push_back(static_cast<float>(g * group + 2 * dk + vd + i));
  for (int64_t g = 0; g < nk; ++g)
    for (int64_t i = 0; i < r; ++i) {
      b.push_back(static_cast<float>(100 + g * 2 * r + i));
      av.push_back(static_cast<float>(100 + g * 2 * r + r + i));
    }
  b.insert(b.end(), av.begin(), av.end());
  auto rows = [H](const Tensor& t) {
    std::vector<float> v;
    for (int64_t i = 0; i < t.shape[0]; ++i) {
      EXPECT_EQ(t.ptr<float>()[i * H], t.ptr<float>()[i * H + 1]) << "row " << i << " mixes two source rows";
      v.push_back(t.ptr<float>()[i * H]);
    }
    return v;
  };
  EXPECT_EQ(rows(s.qkv), qkv);
  EXPECT_EQ(rows(s.z), z);
  EXPECT_EQ(rows(s.ba), b);
}

TEST(HybridGolden, Qwen3NextMatchesTransformers) { check_hybrid_golden("target_qwen3_next", "cpu"); }
TEST(HybridGolden, Qwen3_5MatchesTransformers) { check_hybrid_golden("target_qwen3_5", "cpu"); }
TEST(HybridGolden, Qwen3_5MoeMatchesTransformers) { check_hybrid_golden("target_qwen3_5_moe", "cpu"); }
TEST(HybridGolden, Qwen3_5ImageTextCheckpointMatchesTransformers) { check_hybrid_golden("target_qwen3_5_vl", "cpu"); }
TEST(HybridGolden, InFp64) {
  for (const char* n : kHybridGoldens) check_hybrid_golden(n, "cpu64");
}

// ---- rollback, speculative decoding, generation ----------------------------------------------------------------------

// A verify forward of 6 tokens rolled back to 2 leaves the cache as if only those 2 had run: the next token's logits
// (and the state) equal a cache that never saw the 4 rejected ones; rolling back all 6 or none also works.
TEST(HybridRollback, TruncateEqualsNeverHavingRunTheRejectedTokens) {
  auto ctx = make_context("cpu64");
  for (const char* name : {"target_qwen3_next", "target_qwen3_5"}) {
    auto target = Target::load(golden_dir(name), *ctx);
    const std::vector<int32_t> prompt = {5, 17, 300, 42, 7, 99, 100, 3}, verify = {11, 12, 13, 14, 15, 16};
    auto run = [&](KVCache& c, const std::vector<int32_t>& t) {
      return target->forward(*ctx, cpu_tensor_i32(t, {static_cast<int64_t>(t.size())}), {}, true, &c);
    };
    for (int64_t keep : {0, 2, 6}) {
      KVCache a = target->make_cache(*ctx, 32, true), b = target->make_cache(*ctx, 32);
      run(a, prompt);
      run(b, prompt);
      run(a, verify);
      a.truncate(*ctx, 8 + keep);
      if (keep > 0) run(b, std::vector<int32_t>(verify.begin(), verify.begin() + keep));
      ASSERT_EQ(a.len, b.len);
      for (size_t l = 0; l < a.lin.size(); ++l) {
        if (!a.lin[l].state.defined()) continue;
        EXPECT_LT(rel_err(to_f64(a.lin[l].state), to_f64(b.lin[l].state)), 1e-13) << name << " layer " << l;
        // (layer 0's window is bitwise equal; later layers' inputs went through GEMMs of other row counts)
        EXPECT_LT(rel_err(to_f64(a.lin[l].conv), to_f64(b.lin[l].conv)), 1e-13) << name << " layer " << l;
      }
      const auto oa = run(a, {77}), ob = run(b, {77});
      EXPECT_LT(rel_err(to_f64(oa.final_hidden), to_f64(ob.final_hidden)), 1e-12) << name << " keep " << keep;
    }
    // without a record the state cannot go back
    KVCache c = target->make_cache(*ctx, 32);
    run(c, prompt);
    EXPECT_THROW(c.truncate(*ctx, 4), Error);
    EXPECT_THROW(c.truncate(4), Error);
  }
}

// Real speculative decoding with a hybrid target (dense and MoE) produces exactly the target's greedy output (fp32,
// CPU), and on that output teacher forcing gives the same cycles; batched generation equals one sequence at a time.
TEST(HybridEndToEnd, SpeculativeDecodingIsLosslessAndBatchingChangesNothing) {
  auto ctx = make_context("cpu", {.threads = 2});
  for (const char* name : {"target_qwen3_5", "target_qwen3_next", "target_qwen3_5_moe"}) {
    auto target = Target::load(golden_dir(name), *ctx);
    const auto prompts = test::random_prompts(23, 3, 10, 7, 500);
    const auto by1 = test::greedy_generate(*ctx, *target, prompts, 40, 1);
    EXPECT_EQ(by1, test::greedy_generate(*ctx, *target, prompts, 40, 3))
        << name << ": batched greedy decoding differs from one sequence at a time";
    Drafter dr(*ctx, DrafterConfig::for_target(target->config(), 1, 4, {1, 2}, 511), 5, 0.02);
    DFlashDraftModel dm(dr, *target, 8);
    EXPECT_GT(test::expect_lossless_speculative(*ctx, *target, dm, prompts, by1, name), 0)
        << name << ": no cycle rolled the state back";
  }
}

// Several sequences in one packed prefill (the training target's forward) equal each run alone: the convolution and
// the recurrence restart at every sequence.
TEST(HybridTarget, PackedPrefillRestartsTheStatePerSequence) {
  auto ctx = make_context("cpu64");
  auto target = Target::load(golden_dir("target_qwen3_5_moe"), *ctx);
  const std::vector<int32_t> a = {1, 5, 9, 13, 2, 7, 300, 301}, b = {3, 3, 60};
  const std::vector<int64_t> ids = {0, 3};
  test::check_packed_prefill(*ctx, *target, a, b, ids, 1e-12);
}

// ---- the CLI on hybrid targets --------------------------------------------------------------------------------------

// dflash info on the image-text golden: the plan (Gated DeltaNet and gated attention layers), the ignored vision and
// MTP tensors.
TEST(HybridEndToEnd, InfoShowsThePlanAndTheIgnoredTensors) {
  const std::string tmp = cat("/tmp/dflash_test_hinfo_", getpid());
  std::filesystem::create_directories(tmp);
  const std::string cmd = cat(DFLASH_BINARY, " info ", golden_dir("target_qwen3_5_vl"), " > ", tmp, "/out.txt 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp + "/out.txt");
  const std::string out = read_file(tmp + "/out.txt");
  EXPECT_NE(out.find("qwen3_5 (Qwen3.5 (image-text checkpoint), Qwen3_5ForConditionalGeneration)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("layer 0-2     Gated DeltaNet (2 key heads x 16, 4 value heads x 16, conv 4) + dense SwiGLU of "
                     "width 128"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("layer 3       attention (qk-norm, output gate, rotary 8 of 32) + dense SwiGLU"), std::string::npos)
      << out;
  EXPECT_NE(out.find("ignored by name (not the language model): 2 tensors under mtp."), std::string::npos) << out;
  EXPECT_NE(out.find("tensors under model.visual."), std::string::npos) << out;
  std::filesystem::remove_all(tmp);
}

// dflash capture on a hybrid target writes HF's output_hidden_states and the logits.
TEST(HybridEndToEnd, CaptureWritesHfHiddenStates) {
  const std::string tmp = cat("/tmp/dflash_test_hcapture_", getpid());
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  for (const char* name : {"target_qwen3_5", "target_qwen3_next"}) {
    auto g = SafetensorsFile::open(golden_dir(name) + "/golden.safetensors");
    const Tensor ids = g->view("input_ids");
    json row = {{"input_ids", std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + ids.numel())}};
    write_file_atomic(tmp + "/ids.jsonl", row.dump() + "\n");
    const std::string out = cat(tmp, "/", name, ".safetensors");
    const std::string cmd = cat(DFLASH_BINARY, " capture --target ", golden_dir(name), " --input ", tmp,
                                "/ids.jsonl --out ", out, " --logits > ", tmp, "/log.txt 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp + "/log.txt");
    auto f = SafetensorsFile::open(out);
    for (int i = 0; i <= 4; ++i)
      EXPECT_LT(rel_err(to_f64(f->view(cat("row_0.hidden_", i))), to_f64(g->view(cat("hidden_states.", i)))), 3e-5)
          << name << " hidden_" << i;
    EXPECT_LT(rel_err(to_f64(f->view("row_0.logits")), to_f64(g->view("logits"))), 3e-5) << name;
  }
  std::filesystem::remove_all(tmp);
}

// Training on the tiny hybrid targets (dense Qwen3.5 and MoE Qwen3-Next), its export, and `dflash eval` with that
// drafter (teacher forcing and real speculative decoding through the rolled-back state): the loss falls, two target +
// two drafter workers give the one-worker run's losses, the exported drafter is the published hybrid shape (32 heads
// of 128), and speculative decoding reproduces the target's greedy decode on every sample.
TEST(HybridPipeline, TrainExportAndEvalDenseAndMoe) {
  const std::string root = test::train_tmpdir("hybridpipe");
  const std::string data = test::make_train_data(root);
  for (const char* name : {"target_qwen3_5", "target_qwen3_next"}) {
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
    EXPECT_EQ(ex["num_attention_heads"].get<int64_t>(), 32) << name;
    EXPECT_EQ(ex["head_dim"].get<int64_t>(), 128) << name;
    EXPECT_EQ(ex["dflash_config"]["target_layer_ids"], json({1, 2})) << name;
    if (std::string(name) == "target_qwen3_next")  // MoE: 2 + 2 workers = 1 worker
      test::expect_two_plus_two_as_one(one, cat(root, "/", name, "_two"), name);
    const std::string rep = cat(root, "/", name, "_eval.json");
    const int rc = test::run_binary({DFLASH_BINARY, "eval", "--target", one.target_dir, "--drafter",
                                     one.out_dir + "/export", "--data", data, "--mode", "both", "--max-samples", "6",
                                     "--json", rep, "--no-progress"},
                                    nullptr, root + "/eval.log");
    ASSERT_EQ(rc, 0) << read_file(root + "/eval.log");
    const json r = json::parse(read_file(rep));
    EXPECT_EQ(r["evaluated"].get<int64_t>(), 6) << name;
    EXPECT_EQ(r["lossless_mismatches"].get<int64_t>(), 0) << name << ": speculative decoding differs from greedy";
    EXPECT_GE(r["generated"]["tau"].get<double>(), 1.0) << name;
  }
  std::filesystem::remove_all(root);
}
