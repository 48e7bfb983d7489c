// CPU op checks against independent dense references: DFlash attention vs the spec-2.3 mask built densely
// (cases C05 one-tile problems, anchors at 0 and S-2, padding blocks), its backward vs finite differences, and
// causal attention vs a direct formula, rmsnorm with RopeArgs vs rmsnorm then rope (its backward vs central
// differences). The CUDA op table (tests/cuda) compares CUDA against these CPU ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "backend/context.h"
#include "test_util.h"

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

TEST(OpsAttentionCausal, MatchesDirectFormulaAndDecodeOffsets) {
  auto ctx = make_context("cpu");
  const int64_t T = 150, nh = 4, nkv = 2, d = 16;  // more than one query tile
  Tensor q = randn({T, nh, d}, 1), k = randn({T, nkv, d}, 2), v = randn({T, nkv, d}, 3);
  Tensor out = cpu_empty(DType::F32, {T, nh, d});
  ctx->attention_causal(q, k, v, out, 0, 0.25f);
  auto qv = to_f64(q), kv = to_f64(k), vv = to_f64(v), ov = to_f64(out);
  for (int64_t t = 0; t < T; t += 13)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / 2;
      std::vector<double> s(static_cast<size_t>(t + 1));
      double mx = -INFINITY, l = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += qv[(t * nh + h) * d + i] * kv[(j * nkv + g) * d + i];
        mx = std::max(mx, s[j] = dot * 0.25);
      }
      for (double& x : s) l += x = std::exp(x - mx);
      for (int64_t i = 0; i < d; ++i) {
        double o = 0;
        for (int64_t j = 0; j <= t; ++j) o += s[j] / l * vv[(j * nkv + g) * d + i];
        ASSERT_NEAR(ov[(t * nh + h) * d + i], o, 1e-5);
      }
    }
  // the last 5 rows as a decode step (q_offset) give the same result as the prefill
  Tensor out2 = cpu_empty(DType::F32, {5, nh, d});
  ctx->attention_causal(q.slice(T - 5, T), k, v, out2, T - 5, 0.25f);
  auto o2 = to_f64(out2);
  for (int64_t i = 0; i < 5 * nh * d; ++i) EXPECT_NEAR(o2[i], ov[(T - 5) * nh * d + i], 1e-6);
}

// linear with a separate beta operand c (the drafter's residual adds): y = x w^T + beta c, c untouched, the same as
// copying c into y and accumulating.
TEST(OpsLinear, SeparateBetaOperandMatchesCopyThenAccumulate) {
  auto ctx = make_context("cpu", {.threads = 2});
  const int64_t M = 5, N = 4, K = 3;
  Tensor x = randn({M, K}, 11), w = randn({N, K}, 12), c = randn({M, N}, 13);
  const std::vector<double> c0 = to_f64(c);
  Tensor y = cpu_empty(DType::F32, {M, N});
  ctx->linear(x, w, nullptr, y, 0.5f, &c);
  const auto yv = to_f64(y), xv = to_f64(x), wv = to_f64(w);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.5 * c0[m * N + n];
      for (int64_t k = 0; k < K; ++k) s += xv[m * K + k] * wv[n * K + k];
      EXPECT_NEAR(yv[m * N + n], s, 1e-5) << m << " " << n;
    }
  EXPECT_EQ(to_f64(c), c0);
  // c == y: the plain accumulation
  Tensor y2 = cpu_empty(DType::F32, {M, N});
  std::copy_n(c.ptr<float>(), M * N, y2.ptr<float>());
  ctx->linear(x, w, nullptr, y2, 0.5f, &y2);
  EXPECT_EQ(to_f64(y2), yv);
}

// rmsnorm / rmsnorm_backward with RopeArgs (the drafter's per-head q / k norms, RoPE fused): the forward is rmsnorm
// then rope on the rows as [T, heads, D] (also in place); the backward rotates dy back (rope inverse) and runs the
// plain backward, dy untouched. In fp64 that backward is the adjoint of the forward: dx . v and dw . u equal central
// differences of L = sum(dy y) along directions v (of x) and u (of w).
TEST(OpsRmsNorm, RopeArgsAreRmsNormThenRope) {
  for (const char* dev : {"cpu", "cpu64"}) {
    auto ctx = make_context(dev, {.threads = 2});
    const DType dt = ctx->compute_dtype();
    const int64_t T = 3, heads = 2, D = 8, R = T * heads;
    const auto rnd = [&](Shape s, uint64_t seed, double sd, double mean) {
      Tensor t = randn(std::move(s), seed, sd, DType::F64);
      for (double& v : t.span<double>()) v += mean;
      return ctx->to_device(t, dt);
    };
    const Tensor x = rnd({R, D}, 31, 1.5, 0.0), w = rnd({D}, 32, 0.3, 1.0), dy = rnd({R, D}, 33, 1.0, 0.0);
    const Tensor dx_init = rnd({R, D}, 34, 1.0, 0.0), dw_init = rnd({D}, 35, 1.0, 0.0);
    const Tensor pos = cpu_tensor_i32({0, 7, 1234}, {T});
    Tensor inv = cpu_empty(DType::F32, {D / 2});
    for (int64_t i = 0; i < D / 2; ++i) inv.ptr<float>()[i] = std::pow(10000.0f, -2.0f * i / D);
    const RopeArgs rope{pos, inv, heads};
    // forward
    Tensor y = ctx->empty(dt, {R, D}), rstd = ctx->empty(dt, {R}), none;
    ctx->rmsnorm(x, w, 1e-6f, y, rstd, &rope);
    Tensor y0 = ctx->empty(dt, {R, D}), rstd0 = ctx->empty(dt, {R});
    ctx->rmsnorm(x, w, 1e-6f, y0, rstd0);
    ctx->rope(y0.reshape({T, heads, D}), pos, inv, false);
    EXPECT_EQ(to_f64(y), to_f64(y0)) << dev;
    EXPECT_EQ(to_f64(rstd), to_f64(rstd0)) << dev;
    Tensor xi = cpu_clone(x);
    ctx->rmsnorm(xi, w, 1e-6f, xi, none, &rope);
    EXPECT_EQ(to_f64(xi), to_f64(y0)) << dev;
    // backward: beta 1 with dw, and dx = dy (beta 0, no dw)
    const std::vector<double> dyv = to_f64(dy);
    Tensor dx = cpu_clone(dx_init), dw = cpu_clone(dw_init);
    ctx->rmsnorm_backward(dy, x, w, rstd, dx, dw, 1.0f, &rope);
    EXPECT_EQ(to_f64(dy), dyv) << dev;
    Tensor g = cpu_clone(dy), dx0 = cpu_clone(dx_init), dw0 = cpu_clone(dw_init);
    ctx->rope(g.reshape({T, heads, D}), pos, inv, true);
    ctx->rmsnorm_backward(g, x, w, rstd, dx0, dw0, 1.0f);
    EXPECT_EQ(to_f64(dx), to_f64(dx0)) << dev;
    EXPECT_EQ(to_f64(dw), to_f64(dw0)) << dev;
    Tensor gi = cpu_clone(dy);
    ctx->rmsnorm_backward(gi, x, w, rstd, gi, none, 0.0f, &rope);
    Tensor dxb = ctx->empty(dt, {R, D});
    ctx->rmsnorm_backward(g, x, w, rstd, dxb, none, 0.0f);
    EXPECT_EQ(to_f64(gi), to_f64(dxb)) << dev;
    if (dt != DType::F64) continue;
    // the adjoint, by central differences (fp64)
    const auto loss = [&](const Tensor& xs, const Tensor& ws) {
      Tensor ys = ctx->empty(dt, {R, D});
      ctx->rmsnorm(xs, ws, 1e-6f, ys, none, &rope);
      double l = 0;
      const auto yv = to_f64(ys);
      for (size_t i = 0; i < yv.size(); ++i) l += dyv[i] * yv[i];
      return l;
    };
    const auto along = [&](const Tensor& t, const Tensor& dir, double h) {
      Tensor o = cpu_clone(t);
      for (int64_t i = 0; i < o.numel(); ++i) o.ptr<double>()[i] += h * dir.ptr<double>()[i];
      return o;
    };
    const Tensor v = rnd({R, D}, 36, 1.0, 0.0), u = rnd({D}, 37, 1.0, 0.0);
    Tensor dxa = ctx->empty(dt, {R, D}), dwa = ctx->zeros(dt, {D});
    ctx->rmsnorm_backward(dy, x, w, rstd, dxa, dwa, 0.0f, &rope);
    const double h = 1e-5;
    const double fd_x = (loss(along(x, v, h), w) - loss(along(x, v, -h), w)) / (2 * h);
    const double fd_w = (loss(x, along(w, u, h)) - loss(x, along(w, u, -h))) / (2 * h);
    double an_x = 0, an_w = 0;
    for (int64_t i = 0; i < R * D; ++i) an_x += dxa.ptr<double>()[i] * v.ptr<double>()[i];
    for (int64_t i = 0; i < D; ++i) an_w += dwa.ptr<double>()[i] * u.ptr<double>()[i];
    EXPECT_NEAR(an_x, fd_x, 1e-7 * std::max(1.0, std::fabs(fd_x)));
    EXPECT_NEAR(an_w, fd_w, 1e-7 * std::max(1.0, std::fabs(fd_w)));
  }
}

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

// Context::fill_normal on the CPU draws the values of core/rng.h fill_normal (any thread count), widened in F64.
TEST(OpFillNormal, CpuContextMatchesCoreFillNormal) {
  const int64_t n = (int64_t{1} << 16) + 5;
  std::vector<float> want(static_cast<size_t>(n));
  fill_normal(want.data(), n, 0.5, 42, RngPurpose::Init, 9, 1);
  auto c1 = make_context("cpu", {.threads = 2});
  auto c64 = make_context("cpu64", {.threads = 1});
  Tensor a = cpu_empty(DType::F32, {n}), b = cpu_empty(DType::F64, {n});
  c1->fill_normal(a, 0.5, 42, RngPurpose::Init, 9);
  c64->fill_normal(b, 0.5, 42, RngPurpose::Init, 9);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a.ptr<float>()[i], want[static_cast<size_t>(i)]) << i;
    ASSERT_EQ(b.ptr<double>()[i], static_cast<double>(want[static_cast<size_t>(i)])) << i;
  }
  double s = 0, s2 = 0;
  for (float x : want) {
    s += x;
    s2 += double(x) * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);                  // mean 0 (std of the mean 0.5/256)
  EXPECT_NEAR(std::sqrt(s2 / n), 0.5, 0.01);      // std 0.5
}
