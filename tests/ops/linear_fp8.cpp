// tests/ops/linear_fp8.cpp — FP8 E4M3 on the CPU: the element conversions (core/dtype.h), Context::quantize_fp8's
// block scales, and Context::linear with an FP8 LinearWeight (the dequantised weight, exactly), with its checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/context.h"
#include "common/test_util.h"

using namespace dflash;
using test::randn;
using test::to_f64;

// Every finite e4m3 code converts to its value and back to itself; the values are the OCP E4M3 table (bias 7,
// subnormals m * 2^-9, largest 448, S.1111.111 NaN).
TEST(OpsFp8, E4m3CodesRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(f32_to_f8e4m3(v), c == 0x80 ? 0x80 : c) << c << " = " << v;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x39), 1.125f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0xb8), -1.0f);
}

// Rounding: to nearest, ties to the even code; saturation at +-448; NaN stays NaN.
TEST(OpsFp8, E4m3RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);   // halfway 1 .. 1.125: to the even code (1.0)
  EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);   // halfway 1.125 .. 1.25: to 1.25 (even)
  EXPECT_EQ(f32_to_f8e4m3(1.07f), 0x39);     // above the tie
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.5f, -10)), 0x01);  // 0.75 of the subnormal step: to 1 step
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -10)), 0x00);  // half a step: the tie goes to the even code (0)
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.5f, -9)), 0x02);   // 1.5 steps: to 2 (even)
  EXPECT_EQ(f32_to_f8e4m3(440.0f), 0x7e);    // between 416 and 448, nearer 448
  EXPECT_EQ(f32_to_f8e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(std::nanf("")) & 0x7f, 0x7f);
}

// quantize_fp8 in blocks of 2 x 3 over [5, 7] (partial blocks at both edges): each block's scale is its amax / 448
// (1 for an all-zero block), and every dequantised element is within half a step of e4m3 (2^-4 relative) of w.
TEST(OpsFp8, QuantizeInBlocksWithPartialEdges) {
  auto ctx = make_context("cpu");
  Tensor w = randn({5, 7}, 3);
  for (int64_t k = 0; k < 3; ++k) w.ptr<float>()[0 * 7 + k] = w.ptr<float>()[1 * 7 + k] = 0.f;  // block (0, 0) zero
  const LinearWeight q = ctx->quantize_fp8(w, 2, 3);
  ASSERT_TRUE(q.fp8());
  EXPECT_EQ(q.w.dtype, DType::F8E4M3);
  EXPECT_EQ(q.scale.shape, (Shape{3, 3}));
  const auto wv = to_f64(w);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      double amax = 0;
      for (int64_t n = 2 * i; n < std::min<int64_t>(5, 2 * i + 2); ++n)
        for (int64_t k = 3 * j; k < std::min<int64_t>(7, 3 * j + 3); ++k) amax = std::max(amax, std::fabs(wv[n * 7 + k]));
      const float want = amax > 0 ? static_cast<float>(amax) / 448.f : 1.f;
      EXPECT_EQ(q.scale.ptr<float>()[i * 3 + j], want) << i << " " << j;
    }
  const auto d = to_f64(fp8_dequantize(q));
  for (int64_t i = 0; i < 35; ++i) {
    const double s = q.scale.ptr<float>()[(i / 7 / 2) * 3 + (i % 7) / 3];
    // a normal e4m3 value is within 2^-4 of its magnitude; a subnormal one within half of 2^-9 (times the scale)
    EXPECT_LE(std::fabs(d[i] - wv[i]), std::max(std::ldexp(std::fabs(wv[i]), -4), std::ldexp(s, -10)) * 1.000001)
        << i;
  }
}

// linear with an FP8 weight equals linear with its dequantisation, value for value (the CPU reference), in fp32
// and fp64; the bias and the beta operand as with a plain weight.
TEST(OpsFp8, LinearEqualsTheDequantisedWeight) {
  for (const char* dev : {"cpu", "cpu64"}) {
    auto ctx = make_context(dev);
    const DType dt = ctx->compute_dtype();
    const int64_t M = 6, N = 10, K = 13;
    const Tensor x = ctx->to_device(randn({M, K}, 1), dt), b = ctx->to_device(randn({N}, 2), dt);
    const Tensor c = ctx->to_device(randn({M, N}, 3), dt);
    const LinearWeight q = ctx->quantize_fp8(ctx->to_device(randn({N, K}, 4), dt), 4, 5);
    const Tensor wd = ctx->to_device(fp8_dequantize(q), dt);
    Tensor y1 = ctx->empty(dt, {M, N}), y2 = ctx->empty(dt, {M, N});
    ctx->linear(x, q, &b, y1, 0.5f, &c);
    ctx->linear(x, wd, &b, y2, 0.5f, &c);
    EXPECT_EQ(to_f64(y1), to_f64(y2)) << dev;
  }
}

// A scale grid of the wrong shape, a plain-typed weight with a scale, or block sizes < 1 are refused naming the op
// and the shapes.
TEST(OpsFp8, BadWeightsAreRefused) {
  auto ctx = make_context("cpu");
  LinearWeight q = ctx->quantize_fp8(randn({8, 8}, 5), 4, 4);
  const Tensor x = randn({2, 8}, 6);
  Tensor y = cpu_empty(DType::F32, {2, 8});
  auto error_of = [&](const LinearWeight& w) {
    try {
      ctx->linear(x, w, nullptr, y);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LinearWeight bad = q;
  bad.scale = cpu_empty(DType::F32, {2, 3});
  std::string m = error_of(bad);
  EXPECT_NE(m.find("linear"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 2]"), std::string::npos) << m;
  bad = q;
  bad.w = randn({8, 8}, 7);
  m = error_of(bad);
  EXPECT_NE(m.find("F8_E4M3"), std::string::npos) << m;
  bad = q;
  bad.block_k = 0;
  m = error_of(bad);
  EXPECT_NE(m.find(">= 1"), std::string::npos) << m;
}
