// tests/ops/int4.cpp — INT4 weights (compressed-tensors pack-quantized, backend/context.h MoeWeights) on the CPU:
// int4_dequantize against hand-made words and against tools/ref_int4.py's independent packing (the signed integers
// and dequantised values it stored beside its golden), and Context::moe_linear with INT4 experts against the same
// experts dequantised, for every activation, with and without biases, group sizes 32 and 64 and per channel, and its
// refusals of bad shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/context.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "common/test_util.h"

using namespace dflash;

// Hand-made words: element k of a row is nibble k % 8 of int32 word k / 8 (pack_to_int32: packed |= c[:, i::8] << 4i),
// the integer c - 8, times the scale of its group; as I32 words and as their bytes (U8) alike.
TEST(Int4, DequantizeHandMadeWords) {
  // row 0: word 0 = 0x76543210 -> codes 0..7 -> -8..-1; word 1 = 0xFEDCBA98 -> 8..15 -> 0..7; scale 0.5
  // row 1: word 0 = 0x80000008 (codes 8, 0 x 6, 8 -> 0, -8 x 6, 0); word 1 = 0x0000000F -> 7, -8 x 7; scale -2
  Tensor w = cpu_empty(DType::I32, {2, 2});
  const uint32_t words[4] = {0x76543210u, 0xFEDCBA98u, 0x80000008u, 0x0000000Fu};
  std::copy_n(reinterpret_cast<const int32_t*>(words), 4, w.ptr<int32_t>());
  const Tensor s = cpu_tensor({0.5f, -2.0f}, {2, 1});
  const Tensor out = int4_dequantize(w, s, 16);
  ASSERT_EQ(out.shape, (Shape{2, 16}));
  for (int k = 0; k < 16; ++k) EXPECT_EQ(out.ptr<float>()[k], 0.5f * static_cast<float>(k - 8)) << k;
  const float row1[16] = {0, -8, -8, -8, -8, -8, -8, 0, 7, -8, -8, -8, -8, -8, -8, -8};
  for (int k = 0; k < 16; ++k) EXPECT_EQ(out.ptr<float>()[16 + k], -2.0f * row1[k]) << k;
  Tensor bytes = w;  // the same memory as U8 [2, 8]
  bytes.dtype = DType::U8;
  bytes.shape = {2, 8};
  EXPECT_EQ(to_f32_vector(int4_dequantize(bytes, s, 16)), to_f32_vector(out));
  // groups of 8: one scale per word
  const Tensor s8 = cpu_tensor({1.f, 2.f, 3.f, 4.f}, {2, 2});
  const Tensor o8 = int4_dequantize(w, s8, 8);
  EXPECT_EQ(o8.ptr<float>()[9], 2.0f * 1);   // row 0 element 9: code 9 -> 1, scale 2
  EXPECT_EQ(o8.ptr<float>()[24], 4.0f * 7);  // row 1 element 8: code 15 -> 7, scale 4
  EXPECT_THROW(int4_dequantize(w, cpu_tensor({1.f, 2.f, 3.f}, {1, 3}), 16), Error);  // scales of another row count
  EXPECT_THROW(int4_dequantize(w, s, 12), Error);                                // a group not dividing K
}

// tools/ref_int4.py packs with its own loop (nibble i of word j = q[8 j + i] + 8) and stores, for two linears of its
// checkpoint, the signed integers and q * scale: the file's weight_packed and weight_scale dequantise to those values.
TEST(Int4, UnpacksWhatTheIndependentPackerWrote) {
  const std::string dir = test::source_dir() + "/tests/golden/target_qwen3_moe_int4";
  auto ws = WeightStore::open(dir);
  auto g = SafetensorsFile::open(dir + "/golden.safetensors");
  for (const char* m : {"model.layers.0.mlp.experts.3.gate_proj", "model.layers.2.mlp.down_proj"}) {
    const std::string base = std::string(m) + ".";
    const Tensor packed = ws.view(base + "weight_packed"), scale = ws.view(base + "weight_scale");
    EXPECT_EQ(packed.dtype, DType::I32) << m;
    EXPECT_EQ(scale.dtype, DType::BF16) << m;
    const Tensor codes = g->view(std::string("int4_codes.") + m), want = g->view(std::string("int4_dequantised.") + m);
    const int64_t N = want.shape[0], K = want.shape[1];
    const Tensor got = int4_dequantize(packed, scale, 32);
    ASSERT_EQ(got.shape, (Shape{N, K})) << m;
    EXPECT_EQ(to_f32_vector(got), to_f32_vector(want)) << m;
    // the integers themselves: unit scales
    Tensor ones = cpu_empty(DType::F32, {N, K / 32});
    std::fill_n(ones.ptr<float>(), ones.numel(), 1.0f);
    const std::vector<float> q = to_f32_vector(int4_dequantize(packed, ones, 32));
    int lo = 0, hi = 0;
    for (int64_t i = 0; i < N * K; ++i) {
      EXPECT_EQ(q[static_cast<size_t>(i)], static_cast<float>(codes.ptr<int32_t>()[i])) << m << " element " << i;
      lo = std::min(lo, codes.ptr<int32_t>()[i]);
      hi = std::max(hi, codes.ptr<int32_t>()[i]);
    }
    EXPECT_EQ(lo, -8) << m;  // both ends of the range occur
    EXPECT_EQ(hi, 7) << m;
  }
}

namespace {

// Random INT4 rows [E, N, K] (codes uniform, bf16 scales of 8 significant bits around 2^-4) in groups of `group`, and
// their dequantised values in `dt` (exact: a 4-bit integer times a bf16 scale).
struct RandomInt4 {
  MoeWeights w;
  Tensor plain;
};
RandomInt4 random_int4(int64_t E, int64_t N, int64_t K, int64_t group, uint64_t seed, DType dt) {
  Rng rng(seed, RngPurpose::Test);
  Tensor b = cpu_empty(DType::U8, {E, N, K / 2}), s = cpu_empty(DType::F32, {E, N, K / group});
  for (int64_t i = 0; i < b.numel(); ++i) b.ptr<uint8_t>()[i] = static_cast<uint8_t>(rng.below(256));
  for (int64_t i = 0; i < s.numel(); ++i)
    s.ptr<float>()[i] = std::ldexp(static_cast<float>(128 + rng.below(128)), -11) * (rng.below(2) ? 1.f : -1.f);
  RandomInt4 r;
  r.w.w = b;
  r.w.scales = cpu_to_bf16(s);
  r.w.int4_group = group;
  const Tensor f = int4_dequantize(b, r.w.scales, group);
  r.plain = cpu_empty(dt, f.shape);
  for (int64_t i = 0; i < f.numel(); ++i) {
    if (dt == DType::F64) r.plain.ptr<double>()[i] = f.ptr<float>()[i];
    else r.plain.ptr<float>()[i] = f.ptr<float>()[i];
  }
  return r;
}

}  // namespace

// moe_linear with INT4 weights gives the bits of moe_linear with the dequantised weights (the CPU dequantises each
// expert's rows into the compute dtype, exactly), for every activation, with and without a bias, in groups of 32, 64
// and one group per row (K 128).
TEST(Int4, GroupedLinearEqualsTheDequantisedWeights) {
  for (const char* dev : {"cpu", "cpu64"}) {
    auto ctx = make_context(dev);
    const DType dt = ctx->compute_dtype();
    const int64_t T = 7, K = 128, N = 6, E = 3, k = 2;
    Tensor idx = cpu_tensor_i32({0, 2, 1, 2, 0, 1, 2, 1, 0, 2, 1, 0, 2, 0}, {T, k});
    Tensor off = cpu_empty(DType::I32, {E + 1}), rows = cpu_empty(DType::I32, {T * k}), slot = cpu_empty(DType::I32, {T * k});
    ctx->moe_group(idx, off, rows, slot);
    const Tensor x = test::randn({T, K}, 31, 1.0, dt);
    for (int64_t group : {32, 64, 128})
      for (MoeAct act : {MoeAct::None, MoeAct::SwiGLU, MoeAct::ClampedSwiGLU}) {
        const int64_t Nw = act == MoeAct::None ? N : 2 * N;
        RandomInt4 m = random_int4(E, Nw, K, group, 32 + group, dt);
        for (bool bias : {false, true}) {
          MoeWeights q = m.w, p = m.plain;
          if (bias) q.bias = p.bias = test::randn({E, Nw}, 33, 0.5, dt);
          Tensor yq = cpu_empty(dt, {T * k, N}), yp = cpu_empty(dt, {T * k, N});
          ctx->moe_linear(x, &rows, q, off, yq, act);
          ctx->moe_linear(x, &rows, p, off, yp, act);
          EXPECT_EQ(test::to_f64(yq), test::to_f64(yp))
              << dev << " group " << group << " act " << static_cast<int>(act) << " bias " << bias;
        }
      }
    EXPECT_STREQ(moe_linear_op_name(MoeAct::SwiGLU, random_int4(E, 2 * N, K, 32, 1, dt).w), "moe_linear_swiglu_int4");
    // shapes: scales BF16 [E, N', K/group], the group a multiple of 32 dividing K, the codes U8
    RandomInt4 m = random_int4(E, N, K, 32, 34, dt);
    Tensor y = cpu_empty(dt, {T * k, N});
    MoeWeights bad = m.w;
    bad.scales = cpu_to_f32(m.w.scales);  // F32 scales
    EXPECT_THROW(ctx->moe_linear(x, &rows, bad, off, y, MoeAct::None), Error);
    bad = m.w;
    bad.int4_group = 64;  // scales of groups of 32
    EXPECT_THROW(ctx->moe_linear(x, &rows, bad, off, y, MoeAct::None), Error);
    bad = random_int4(E, N, K, 16, 35, dt).w;  // groups of 16
    EXPECT_THROW(ctx->moe_linear(x, &rows, bad, off, y, MoeAct::None), Error);
    bad = m.w;
    bad.w = m.plain;  // plain values with scales
    EXPECT_THROW(ctx->moe_linear(x, &rows, bad, off, y, MoeAct::None), Error);
  }
}
