// tests/ops/rope.cpp — RoPE on the CPU: partial rotary (Qwen3-Next / Qwen3.5: only the first r of d dimensions
// rotate) against the rotation written out, and YaRN's frequencies and attention factor (gpt-oss) as transformers'
// _compute_yarn_parameters computes them, with rope_scaling_json round-tripping through parse_rope_scaling.
// RMSNorm with RoPE fused: tests/ops/rmsnorm.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "io/hf_config.h"
#include "common/published_configs.h"
#include "common/test_util.h"

using namespace dflash;
using nlohmann::json;
using test::gpt_oss_20b;

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

// gpt-oss's YaRN (head_dim 64, theta 150000, factor 32 over 4096 positions, beta 32 / 1, truncate false): the
// frequencies of transformers' _compute_yarn_parameters, computed by its formula in Python's double precision.
TEST(RopeYarn, FrequenciesAndAttentionFactorAsTransformers) {
  const ModelConfig c = parse_model_config(gpt_oss_20b(), "x");
  const std::vector<double> want = {
      1, 0.689044306, 0.474782055, 0.327145872, 0.225418, 0.155322989, 0.107024421, 0.0737445682, 0.0508132748,
      0.0317056962, 0.0193350011, 0.0115920493, 0.00679495949, 0.00386035932, 0.00209379238, 0.0010526021,
      0.000456483919, 0.000129318701, 3.83088124e-05, 2.6396469e-05, 1.81883367e-05, 1.25325698e-05, 8.63549588e-06,
      5.95023926e-06, 4.09997848e-06, 2.82506683e-06, 1.94659621e-06, 1.34129104e-06, 9.2420895e-07, 6.36820915e-07,
      4.38797825e-07, 3.02351143e-07};
  const std::vector<double> got = test::to_f64(rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-7 * want[i]) << "frequency " << i;
  // the attention factor: given, from mscale / mscale_all_dim, or 0.1 ln(factor) + 1; 1 for other kinds
  RopeScaling rs = c.rope_scaling;
  rs.attention_factor = 1.25;
  EXPECT_DOUBLE_EQ(rs.attention_scaling(), 1.25);
  rs.attention_factor = 0;
  rs.mscale = 1.0;
  rs.mscale_all_dim = 0.5;
  EXPECT_DOUBLE_EQ(rs.attention_scaling(), (0.1 * std::log(32.0) + 1) / (0.05 * std::log(32.0) + 1));
  rs.kind = "llama3";
  EXPECT_DOUBLE_EQ(rs.attention_scaling(), 1.0);
  // truncate (transformers' default) rounds the correction range outwards: [floor(8.09), ceil(17.40)] = [8, 18]
  RopeScaling t = c.rope_scaling;
  t.truncate = true;
  const std::vector<double> tf = test::to_f64(rope_inv_freq(64, 150000.0, t));
  const double base = 1.0 / std::pow(150000.0, 2.0 * 9 / 64);  // dimension 9: ramp (9 - 8) / 10 = 0.1
  EXPECT_NEAR(tf[9], base / 32 * 0.1 + base * 0.9, 1e-6 * base);
  // rope_scaling_json round-trips through parse_rope_scaling (the exported drafter's config.json)
  const json rj = rope_scaling_json(c.rope_scaling);
  EXPECT_EQ(rj["rope_type"], "yarn");
  EXPECT_EQ(rj["truncate"], false);
  EXPECT_FALSE(rj.contains("attention_factor"));  // not given: not written (serving engines derive it from factor)
  const RopeScaling back = parse_rope_scaling(rj, "x", "rope_scaling");
  EXPECT_EQ(test::to_f64(rope_inv_freq(64, 150000.0, back)), got);
  EXPECT_DOUBLE_EQ(back.attention_scaling(), c.rope_scaling.attention_scaling());
  EXPECT_TRUE(rope_scaling_json(RopeScaling{}).is_null());
}
