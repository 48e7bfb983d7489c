// tests/ops/op_profile.cpp — the per-op profile of a Context (ContextOptions::profile_ops): calls and FLOP per op,
// GEMMs keyed by their shape, and nothing recorded without the option.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "backend/context.h"
#include "common/test_util.h"

using namespace dflash;
using test::randn;
using test::to_f64;

// The per-op profile (ContextOptions::profile_ops): GEMMs keyed by M x N x K with 2*M*N*K flop per call, attention
// with the FlashAttention-convention FLOP count from the anchors, and nothing at all recorded without the option.
TEST(OpProfile, CountsCallsAndFlopsPerOpOnlyWhenEnabled) {
  auto prof = make_context("cpu", {.threads = 1, .profile_ops = true});
  auto plain = make_context("cpu", {.threads = 1});
  Tensor x = randn({6, 5}, 1), w = randn({3, 5}, 2), y = cpu_empty(DType::F32, {6, 3});
  for (Context* c : {prof.get(), plain.get()}) {
    c->linear(x, w, nullptr, y);
    c->linear(x, w, nullptr, y);
    c->add(y, y);
  }
  // DFlash attention: S 8, two blocks of B 4 at anchors 2 and 5 (the second a padding block), nh 2, d 4
  const int64_t S = 8, B = 4, N = 2, nh = 2, nkv = 1, d = 4;
  DFlashAttnArgs a;
  a.q = randn({N * B, nh, d}, 3);
  a.k_ctx = randn({S, nkv, d}, 4);
  a.v_ctx = randn({S, nkv, d}, 5);
  a.k_blk = randn({N * B, nkv, d}, 6);
  a.v_blk = randn({N * B, nkv, d}, 7);
  a.anchors = cpu_empty(DType::I32, {N});
  a.valid = cpu_empty(DType::U8, {N});
  a.anchors.ptr<int32_t>()[0] = 2;
  a.anchors.ptr<int32_t>()[1] = 5;
  a.valid.ptr<uint8_t>()[0] = 1;
  a.valid.ptr<uint8_t>()[1] = 0;
  a.block_size = static_cast<int>(B);
  a.scale = 0.5f;
  Tensor out = cpu_empty(DType::F32, {N * B, nh, d}), lse = cpu_empty(DType::F32, {N * B, nh});
  prof->dflash_attention(a, out, lse);

  EXPECT_TRUE(plain->op_profile().empty());
  const std::vector<OpProfileRow> rows = prof->op_profile();
  ASSERT_EQ(rows.size(), 3u);
  std::map<std::string, OpProfileRow> by;
  for (const auto& r : rows) {
    by[r.op] = r;
    EXPECT_GE(r.ms, 0.0);
  }
  ASSERT_TRUE(by.count("linear 6x3x5"));
  EXPECT_EQ(by["linear 6x3x5"].calls, 2);
  EXPECT_DOUBLE_EQ(by["linear 6x3x5"].flop, 2 * 2.0 * 6 * 3 * 5);
  EXPECT_EQ(by["add"].calls, 1);
  EXPECT_DOUBLE_EQ(by["add"].flop, 0.0);
  EXPECT_DOUBLE_EQ(by["dflash_attention"].flop, 4.0 * d * nh * (B * (2 + B)));  // the padding block is not counted
  EXPECT_NE(format_op_profile(rows).find("linear 6x3x5"), std::string::npos);
  prof->reset_op_profile();
  EXPECT_TRUE(prof->op_profile().empty());
}
