// tests/ops/attention_causal.cpp — Context::attention_causal (the target's attention) on the CPU against a softmax
// written out directly: plain causal attention over more than one query tile and as a decode step at an offset; a
// sliding window and attention sinks (gpt-oss), prefill and decode, and the refusals of bad options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/context.h"
#include "core/error.h"
#include "common/test_util.h"

using namespace dflash;
using test::randn;
using test::to_f64;

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

namespace {

// out[t, h] of attention_causal written out directly (double): keys lo..p, p = q_offset + t, one softmax with the sink
std::vector<double> direct_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, double scale,
                                     int64_t window, const std::vector<float>& sinks) {
  const int64_t T = q.shape[0], nh = q.shape[1], d = q.shape[2], nkv = k.shape[1], rep = nh / nkv;
  const auto Q = test::to_f64(q), Kx = test::to_f64(k), Vx = test::to_f64(v);
  std::vector<double> out(static_cast<size_t>(T * nh * d), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t p = q_offset + t, lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0, g = h / rep;
      std::vector<double> x;
      for (int64_t j = lo; j <= p; ++j) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += Q[(t * nh + h) * d + c] * Kx[(j * nkv + g) * d + c];
        x.push_back(s * scale);
      }
      double m = *std::max_element(x.begin(), x.end());
      if (!sinks.empty()) m = std::max(m, double(sinks[h]));
      double den = sinks.empty() ? 0 : std::exp(sinks[h] - m);
      for (double s : x) den += std::exp(s - m);
      for (int64_t j = lo; j <= p; ++j)
        for (int64_t c = 0; c < d; ++c)
          out[(t * nh + h) * d + c] += std::exp(x[j - lo] - m) / den * Vx[(j * nkv + g) * d + c];
    }
  return out;
}

}  // namespace

// Windows of 1, 5 and one longer than the keys (= full attention), with and without sinks, prefill (a tile boundary
// at 64 rows inside the window) and decode at an offset, against the direct softmax.
TEST(AttentionCausal, SlidingWindowAndSinksAsTheDirectSoftmax) {
  auto ctx = make_context("cpu64");
  const int64_t Tk = 70, nh = 4, nkv = 2, d = 8;
  const Tensor q = test::randn({Tk, nh, d}, 41, 1.0, DType::F64), k = test::randn({Tk, nkv, d}, 42, 1.0, DType::F64),
               v = test::randn({Tk, nkv, d}, 43, 1.0, DType::F64);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  const double scale = 0.3;
  for (int64_t window : {0, 1, 5, 100})
    for (bool with_sinks : {false, true}) {
      CausalAttnOpts o;
      o.window = window;
      if (with_sinks) o.sinks = cpu_tensor(sinks, {nh});
      const std::vector<float> sk = with_sinks ? sinks : std::vector<float>{};
      Tensor out = cpu_empty(DType::F64, {Tk, nh, d});
      ctx->attention_causal(q, k, v, out, 0, static_cast<float>(scale), o);
      const auto want = direct_attention(q, k, v, 0, static_cast<float>(scale), window, sk);
      EXPECT_LT(test::rel_err(test::to_f64(out), want), 1e-13) << "window " << window << " sinks " << with_sinks;
      // decode: the last 3 queries against the whole prefix
      Tensor o3 = cpu_empty(DType::F64, {3, nh, d});
      ctx->attention_causal(q.slice(Tk - 3, Tk), k, v, o3, Tk - 3, static_cast<float>(scale), o);
      const auto w3 = direct_attention(q.slice(Tk - 3, Tk), k, v, Tk - 3, static_cast<float>(scale), window, sk);
      EXPECT_LT(test::rel_err(test::to_f64(o3), w3), 1e-13) << "decode, window " << window;
    }
  // a window longer than every prefix is full attention; window 1 sees only the query's own key (out = v without sinks)
  Tensor full = cpu_empty(DType::F64, {Tk, nh, d}), wide = cpu_empty(DType::F64, {Tk, nh, d});
  ctx->attention_causal(q, k, v, full, 0, 0.3f);
  ctx->attention_causal(q, k, v, wide, 0, 0.3f, CausalAttnOpts{Tk, Tensor{}});
  EXPECT_EQ(test::to_f64(full), test::to_f64(wide));
  Tensor one = cpu_empty(DType::F64, {Tk, nh, d});
  ctx->attention_causal(q, k, v, one, 0, 0.3f, CausalAttnOpts{1, Tensor{}});
  for (int64_t t = 0; t < Tk; ++t)
    for (int64_t c = 0; c < d; ++c) EXPECT_NEAR(one.ptr<double>()[(t * nh + 3) * d + c], v.ptr<double>()[(t * nkv + 1) * d + c], 1e-15);
  // refusals: a negative window, sinks of another length or dtype
  EXPECT_THROW(ctx->attention_causal(q, k, v, full, 0, 0.3f, CausalAttnOpts{-1, Tensor{}}), Error);
  EXPECT_THROW(ctx->attention_causal(q, k, v, full, 0, 0.3f, CausalAttnOpts{0, cpu_tensor({1.0f}, {1})}), Error);
  EXPECT_THROW(ctx->attention_causal(q, k, v, full, 0, 0.3f, CausalAttnOpts{0, test::randn({nh}, 1, 1.0, DType::F64)}),
               Error);
}
