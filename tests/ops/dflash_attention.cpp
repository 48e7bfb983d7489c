// tests/ops/dflash_attention.cpp — Context::dflash_attention on the CPU against the spec-2.3 mask built densely
// (cases C05 one-tile problems, anchors at 0 and S-2, padding blocks, sliding windows) and its backward against finite
// differences in fp64. The CUDA op table (tests/cuda) compares CUDA against these CPU ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/context.h"
#include "common/test_util.h"

using namespace dflash;
using test::randn;
using test::to_f64;

namespace {

// Dense reference of spec 2.3 in fp64: keys = [context 0..S-1 | blocks]; allowed = valid_j and
// ((k < S and k < a_j) or (k >= S and (k-S) div B == j)); with a sliding window W > 0 (slot i = r mod B) context keys
// also need k >= a_j + i - (W-1) and block keys (k-S) mod B <= i.
std::vector<double> dense_dflash(const std::vector<double>& q, const std::vector<double>& kc,
                                 const std::vector<double>& vc, const std::vector<double>& kb,
                                 const std::vector<double>& vb, const std::vector<int32_t>& anchors,
                                 const std::vector<uint8_t>& valid, int64_t S, int64_t B, int64_t nh, int64_t nkv,
                                 int64_t d, double scale, int64_t window = 0) {
  const int64_t N = static_cast<int64_t>(anchors.size()), NB = N * B, rep = nh / nkv;
  std::vector<double> out(static_cast<size_t>(NB * nh * d), 0.0);
  for (int64_t r = 0; r < NB; ++r)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t j = r / B, g = h / rep;
      std::vector<double> s;
      std::vector<const double*> vs;
      for (int64_t k = 0; k < S + NB; ++k) {
        const int64_t i = r % B;
        const bool ctx_ok = k < S && k < anchors[j] && (window == 0 || k >= anchors[j] + i - (window - 1));
        const bool blk_ok = k >= S && (k - S) / B == j && (window == 0 || (k - S) % B <= i);
        const bool allowed = valid[j] && (ctx_ok || blk_ok);
        if (!allowed) continue;
        const double* kr = k < S ? &kc[(k * nkv + g) * d] : &kb[((k - S) * nkv + g) * d];
        double dot = 0;
        for (int64_t t = 0; t < d; ++t) dot += q[(r * nh + h) * d + t] * kr[t];
        s.push_back(dot * scale);
        vs.push_back(k < S ? &vc[(k * nkv + g) * d] : &vb[((k - S) * nkv + g) * d]);
      }
      if (s.empty()) continue;  // fully masked row: zeros
      double mx = -INFINITY, l = 0;
      for (double x : s) mx = std::max(mx, x);
      for (double& x : s) l += x = std::exp(x - mx);
      for (size_t k = 0; k < s.size(); ++k)
        for (int64_t t = 0; t < d; ++t) out[(r * nh + h) * d + t] += s[k] / l * vs[k][t];
    }
  return out;
}

struct AttnCase {
  int64_t S, N, B, nh, nkv, d;
  std::vector<int32_t> anchors;
  std::vector<uint8_t> valid;
  int window = 0;
};

void check_forward(const AttnCase& c, uint64_t seed) {
  auto ctx = make_context("cpu");
  const int64_t NB = c.N * c.B;
  DFlashAttnArgs a;
  a.q = randn({NB, c.nh, c.d}, seed);
  a.k_ctx = randn({c.S, c.nkv, c.d}, seed + 1);
  a.v_ctx = randn({c.S, c.nkv, c.d}, seed + 2);
  a.k_blk = randn({NB, c.nkv, c.d}, seed + 3);
  a.v_blk = randn({NB, c.nkv, c.d}, seed + 4);
  a.anchors = cpu_tensor_i32(c.anchors, {c.N});
  a.valid = cpu_empty(DType::U8, {c.N});
  std::copy(c.valid.begin(), c.valid.end(), a.valid.ptr<uint8_t>());
  a.block_size = static_cast<int>(c.B);
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  a.window = c.window;
  Tensor out = cpu_empty(DType::F32, {NB, c.nh, c.d}), lse = cpu_empty(DType::F32, {NB, c.nh});
  for (float& x : out.span<float>()) x = std::numeric_limits<float>::quiet_NaN();  // poison
  ctx->dflash_attention(a, out, lse);
  auto ref = dense_dflash(to_f64(a.q), to_f64(a.k_ctx), to_f64(a.v_ctx), to_f64(a.k_blk), to_f64(a.v_blk), c.anchors,
                          c.valid, c.S, c.B, c.nh, c.nkv, c.d, a.scale, c.window);
  auto got = to_f64(out);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "unwritten or NaN output at " << i;
    ASSERT_NEAR(got[i], ref[i], 2e-5) << "S " << c.S << " N " << c.N << " W " << c.window << " at " << i;
  }
  for (int64_t j = 0; j < c.N; ++j) {
    if (c.valid[j]) continue;
    for (int64_t r = j * c.B; r < (j + 1) * c.B; ++r) {
      EXPECT_EQ(lse.ptr<float>()[r * c.nh], -INFINITY);
    }
  }
}

}  // namespace

TEST(OpsDFlashAttention, OneTileProblemsCaseC05) {
  // (Q, KV) with Q = N*B and KV = S + N*B, from case C05: (16,1)->S=1 is not a training shape (anchor <= S-2),
  // so S is chosen so that Q and the total key count match where the rule allows.
  const std::vector<AttnCase> cases = {
      {2, 1, 16, 4, 2, 64, {0}, {1}},                  // Q 16, anchor 0: no context key, own block only
      {2, 1, 16, 4, 2, 64, {0}, {0}},                  // a padding block only: all rows see nothing -> zeros
      {17, 1, 16, 4, 2, 64, {15}, {1}},                // anchor S-2
      {127, 8, 16, 4, 2, 128, {0, 3, 20, 50, 90, 100, 120, 125}, {1, 1, 1, 1, 1, 1, 1, 1}},
      {128, 8, 16, 4, 4, 64, {1, 2, 3, 4, 5, 6, 7, 126}, {1, 1, 1, 1, 1, 1, 1, 1}},
      {130, 8, 16, 8, 2, 64, {5, 9, 33, 60, 77, 91, 128, 0}, {1, 1, 1, 1, 1, 1, 1, 0}},  // + a padding block
      {4096, 8, 16, 4, 2, 64, {0, 100, 1000, 2000, 3000, 4000, 4093, 4094}, {1, 1, 1, 1, 1, 1, 1, 1}},
  };
  uint64_t seed = 100;
  for (const auto& c : cases) check_forward(c, seed += 10);
}

TEST(OpsDFlashAttention, SlidingWindowMatchesTheDenseRule) {
  // windows narrower than, equal to and wider than the block; W 1 sees only its own position (no context key)
  const std::vector<AttnCase> cases = {
      {40, 4, 8, 4, 2, 16, {0, 7, 20, 38}, {1, 1, 0, 1}, 3},
      {40, 4, 8, 4, 2, 16, {0, 7, 20, 38}, {1, 1, 1, 1}, 8},
      {300, 6, 16, 4, 1, 32, {5, 60, 61, 150, 250, 298}, {1, 1, 1, 1, 1, 1}, 100},
      {17, 1, 16, 2, 2, 8, {15}, {1}, 1},
  };
  uint64_t seed = 500;
  for (const auto& c : cases) check_forward(c, seed += 10);
}

TEST(OpsDFlashAttention, BackwardMatchesFiniteDifferencesFp64) {
  for (const int window : {0, 6}) {
    SCOPED_TRACE(cat("window ", window));
    auto ctx = make_context("cpu64");
    const int64_t S = 23, N = 3, B = 4, nh = 4, nkv = 2, d = 8, NB = N * B;
    DFlashAttnArgs a;
    a.q = randn({NB, nh, d}, 1, 1.0, DType::F64);
    a.k_ctx = randn({S, nkv, d}, 2, 1.0, DType::F64);
    a.v_ctx = randn({S, nkv, d}, 3, 1.0, DType::F64);
    a.k_blk = randn({NB, nkv, d}, 4, 1.0, DType::F64);
    a.v_blk = randn({NB, nkv, d}, 5, 1.0, DType::F64);
    a.anchors = cpu_tensor_i32({0, 9, 21}, {N});
    a.valid = cpu_empty(DType::U8, {N});
    for (int j = 0; j < 3; ++j) a.valid.ptr<uint8_t>()[j] = 1;
    a.block_size = static_cast<int>(B);
    a.scale = 0.35f;
    a.window = window;
    Tensor w = randn({NB, nh, d}, 6, 1.0, DType::F64);  // loss = sum(w * out)
    auto loss = [&]() {
      Tensor out = cpu_empty(DType::F64, {NB, nh, d}), lse = cpu_empty(DType::F64, {NB, nh});
      ctx->dflash_attention(a, out, lse);
      double l = 0;
      for (int64_t i = 0; i < out.numel(); ++i) l += out.ptr<double>()[i] * w.ptr<double>()[i];
      return l;
    };
    Tensor out = cpu_empty(DType::F64, {NB, nh, d}), lse = cpu_empty(DType::F64, {NB, nh});
    ctx->dflash_attention(a, out, lse);
    Tensor dq = cpu_empty(DType::F64, a.q.shape), dkc = cpu_empty(DType::F64, a.k_ctx.shape),
           dvc = cpu_empty(DType::F64, a.v_ctx.shape), dkb = cpu_empty(DType::F64, a.k_blk.shape),
           dvb = cpu_empty(DType::F64, a.v_blk.shape);
    ctx->dflash_attention_backward(a, out, lse, w, dq, dkc, dvc, dkb, dvb);
    const std::pair<Tensor*, Tensor*> pairs[] = {{&a.q, &dq}, {&a.k_ctx, &dkc}, {&a.v_ctx, &dvc}, {&a.k_blk, &dkb},
                                                 {&a.v_blk, &dvb}};
    for (auto [x, g] : pairs) {
      for (int64_t i = 0; i < x->numel(); i += 7) {
        double* p = x->ptr<double>() + i;
        const double x0 = *p, h = 1e-6;
        *p = x0 + h;
        const double lp = loss();
        *p = x0 - h;
        const double lm = loss();
        *p = x0;
        EXPECT_NEAR(g->ptr<double>()[i], (lp - lm) / (2 * h), 1e-7) << i;
      }
    }
    // context keys at or after the last anchor are never attended: zero gradient
    for (int64_t k = 21; k < S; ++k)
      for (int64_t t = 0; t < nkv * d; ++t) EXPECT_EQ(dkc.ptr<double>()[k * nkv * d + t], 0.0);
    if (window > 0) {  // window 6: block 1 (anchor 9) sees context keys [4 + i, 9), block 2 (anchor 21) [16 + i, 21)
      for (const int64_t k : {0, 1, 2, 3, 9, 10, 15})
        for (int64_t t = 0; t < nkv * d; ++t) EXPECT_EQ(dkc.ptr<double>()[k * nkv * d + t], 0.0) << "key " << k;
    }
  }
}
