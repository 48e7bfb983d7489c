// tests/ops/mxfp4.cpp — MXFP4 weights on the CPU: mxfp4_dequantize against the e2m1 table of the OCP MX spec with
// hand-made bytes, and Context::moe_linear with MXFP4 experts against the same experts dequantised, for every
// activation, with and without biases, and its refusals of bad shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/context.h"
#include "core/error.h"
#include "core/rng.h"
#include "common/test_util.h"

using namespace dflash;

namespace {

Tensor cpu_tensor_u8(const std::vector<uint8_t>& v, Shape s) {
  Tensor t = cpu_empty(DType::U8, std::move(s));
  std::copy(v.begin(), v.end(), t.ptr<uint8_t>());
  return t;
}

}  // namespace

// Hand-made bytes against the e2m1 table of the OCP MX spec (transformers' FP4_VALUES): element 2j in the low nibble,
// 2j + 1 in the high nibble of byte j, times 2^(scale - 127) per block of 32; the published [*, G, 16] blocks and
// MoeWeights' [*, 16 G] rows give the same values.
TEST(Mxfp4, DequantizeHandMadeBytes) {
  const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  // two rows of two blocks: every code in both nibbles, scales 127 (x1), 128 (x2), 125 (x1/4) and 0 (x2^-127)
  Tensor blocks = cpu_empty(DType::U8, {2, 2, 16}), scales = cpu_tensor_u8({127, 128, 125, 0}, {2, 2});
  for (int64_t i = 0; i < 64; ++i) blocks.ptr<uint8_t>()[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  const Tensor out = mxfp4_dequantize(blocks, scales);
  ASSERT_EQ(out.shape, (Shape{2, 64}));
  const int exps[4] = {0, 1, -2, -127};
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t e = 0; e < 64; ++e) {
      const int64_t blk = e / 32, j = (e % 32) / 2;
      const int code = e % 2 == 0 ? static_cast<int>(j % 16) : 15 - static_cast<int>(j % 16);
      const float want = std::ldexp(fp4[code], exps[r * 2 + blk]);
      EXPECT_EQ(out.ptr<float>()[r * 64 + e], want) << "row " << r << " element " << e;
      EXPECT_EQ(std::signbit(out.ptr<float>()[r * 64 + e]), std::signbit(want)) << "-0 keeps its sign";
    }
  // a few written out: byte 0x21 under scale 128 -> 0.5 * 2, 1 * 2; byte 0xF8 under 127 -> -0, -6
  Tensor b2 = cpu_zeros(DType::U8, {1, 16}), s2 = cpu_tensor_u8({128}, {1});
  b2.ptr<uint8_t>()[0] = 0x21;
  b2.ptr<uint8_t>()[15] = 0xF8;
  const Tensor o2 = mxfp4_dequantize(b2, s2);
  EXPECT_EQ(o2.ptr<float>()[0], 1.0f);
  EXPECT_EQ(o2.ptr<float>()[1], 2.0f);
  EXPECT_EQ(o2.ptr<float>()[30], -0.0f);
  EXPECT_EQ(o2.ptr<float>()[31], -12.0f);
  // [*, 16 G] rows equal [*, G, 16] blocks
  EXPECT_EQ(to_f32_vector(mxfp4_dequantize(blocks.reshape({2, 32}), scales)), to_f32_vector(out));
  EXPECT_THROW(mxfp4_dequantize(blocks, cpu_tensor_u8({127, 127}, {2, 1})), Error);  // blocks of 2 groups
}

namespace {

// Random MXFP4 rows [E, N, K] (codes uniform, scales around 2^-3) and their dequantised values in `dt`.
struct RandomMxfp4 {
  MoeWeights w;
  Tensor plain;
};
RandomMxfp4 random_mxfp4(int64_t E, int64_t N, int64_t K, uint64_t seed, DType dt) {
  Rng rng(seed, RngPurpose::Test);
  Tensor b = cpu_empty(DType::U8, {E, N, K / 2}), s = cpu_empty(DType::U8, {E, N, K / 32});
  for (int64_t i = 0; i < b.numel(); ++i) b.ptr<uint8_t>()[i] = static_cast<uint8_t>(rng.below(256));
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<uint8_t>()[i] = static_cast<uint8_t>(122 + rng.below(4));
  RandomMxfp4 r;
  r.w.w = b;
  r.w.scales = s;
  const Tensor f = mxfp4_dequantize(b, s);
  r.plain = cpu_empty(dt, f.shape);
  for (int64_t i = 0; i < f.numel(); ++i) {
    if (dt == DType::F64) r.plain.ptr<double>()[i] = f.ptr<float>()[i];
    else r.plain.ptr<float>()[i] = f.ptr<float>()[i];
  }
  return r;
}

}  // namespace

// moe_linear with MXFP4 weights gives the bits of moe_linear with the dequantised weights (the CPU dequantises each
// expert's rows into the compute dtype, exactly), for every activation, with and without a bias.
TEST(Mxfp4, GroupedLinearEqualsTheDequantisedWeights) {
  for (const char* dev : {"cpu", "cpu64"}) {
    auto ctx = make_context(dev);
    const DType dt = ctx->compute_dtype();
    const int64_t T = 7, K = 64, N = 6, E = 3, k = 2;
    Tensor idx = cpu_tensor_i32({0, 2, 1, 2, 0, 1, 2, 1, 0, 2, 1, 0, 2, 0}, {T, k});
    Tensor off = cpu_empty(DType::I32, {E + 1}), rows = cpu_empty(DType::I32, {T * k}), slot = cpu_empty(DType::I32, {T * k});
    ctx->moe_group(idx, off, rows, slot);
    const Tensor x = test::randn({T, K}, 21, 1.0, dt);
    for (MoeAct act : {MoeAct::None, MoeAct::SwiGLU, MoeAct::ClampedSwiGLU}) {
      const int64_t Nw = act == MoeAct::None ? N : 2 * N;
      RandomMxfp4 m = random_mxfp4(E, Nw, K, 22, dt);
      for (bool bias : {false, true}) {
        MoeWeights q = m.w, p = m.plain;
        if (bias) q.bias = p.bias = test::randn({E, Nw}, 23, 0.5, dt);
        Tensor yq = cpu_empty(dt, {T * k, N}), yp = cpu_empty(dt, {T * k, N});
        ctx->moe_linear(x, &rows, q, off, yq, act);
        ctx->moe_linear(x, &rows, p, off, yp, act);
        EXPECT_EQ(test::to_f64(yq), test::to_f64(yp)) << dev << " act " << static_cast<int>(act) << " bias " << bias;
      }
    }
    // shapes: MXFP4 needs K % 32 == 0 and scales [E, N', K/32]; a bias [E, N']
    RandomMxfp4 m = random_mxfp4(E, N, K, 24, dt);
    Tensor y = cpu_empty(dt, {T * k, N});
    MoeWeights bad = m.w;
    bad.scales = cpu_empty(DType::U8, {E, N, 1});
    EXPECT_THROW(ctx->moe_linear(x, &rows, bad, off, y, MoeAct::None), Error);
    bad = m.w;
    bad.bias = cpu_empty(dt, {E, N + 1});
    EXPECT_THROW(ctx->moe_linear(x, &rows, bad, off, y, MoeAct::None), Error);
    bad = m.w;
    bad.w = m.plain;  // plain values with scales: the weights must then be U8
    EXPECT_THROW(ctx->moe_linear(x, &rows, bad, off, y, MoeAct::None), Error);
  }
}
