// model/target/attention.cpp — the target's causal attention mixer (model/target/attention.h).
#include "model/target/attention.h"

#include <cmath>

namespace dflash {

KVCache KVCache::create(Context& ctx, const ModelConfig& cfg, int64_t capacity) {
  KVCache c;
  c.capacity = capacity;
  const bool hybrid = cfg.has_linear_attention();
  if (hybrid) {
    c.lin.resize(static_cast<size_t>(cfg.num_hidden_layers));
    c.linear = cfg.linear_attn;
  }
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    if (cfg.layer(l).mixer == TokenMixer::LinearAttention) {
      c.k.emplace_back();
      c.v.emplace_back();
      c.lin[static_cast<size_t>(l)] = make_linear_state(ctx, cfg);
      continue;
    }
    c.k.push_back(ctx.empty(ctx.compute_dtype(), {capacity, cfg.num_key_value_heads, cfg.head_dim}));
    c.v.push_back(ctx.empty(ctx.compute_dtype(), {capacity, cfg.num_key_value_heads, cfg.head_dim}));
  }
  return c;
}

void KVCache::truncate(int64_t new_len) {
  DFLASH_CHECK(new_len >= 0 && new_len <= len, "KVCache::truncate to ", new_len, " of ", len);
  DFLASH_CHECK(!has_linear() || new_len == len, "KVCache::truncate to ", new_len, " of ", len,
               ": a hybrid target's linear-attention state must be rolled back (truncate(ctx, new_len))");
  len = new_len;
}

void KVCache::truncate(Context& ctx, int64_t new_len) {
  DFLASH_CHECK(new_len >= 0 && new_len <= len, "KVCache::truncate to ", new_len, " of ", len);
  for (LinearAttnState& s : lin) {
    if (!s.state.defined()) continue;  // an attention layer
    if (new_len == len) {
      s.start = -1;  // nothing to undo; the record is dropped
      continue;
    }
    DFLASH_CHECK(s.start >= 0 && new_len >= s.start, "KVCache::truncate to ", new_len, " of ", len,
                 ": a linear-attention state rolls back only into the last forward (positions ",
                 s.start < 0 ? "none recorded: set keep_rollback" : cat(s.start, " .. ", len), ")");
    rollback_linear_state(ctx, linear, s, new_len - s.start);
  }
  len = new_len;
}

namespace {

// Of a weight whose rows are nh chunks of 2d (per head d query rows, then d gate rows), the rows of `part` (0: query,
// 1: gate) of every chunk as one [nh d, K] weight. FP8 stays FP8 (its scale rows taken alike): the caller makes sure
// d is a multiple of block_n.
LinearWeight head_rows(Context& ctx, const LinearWeight& qg, int64_t nh, int64_t d, int64_t part) {
  LinearWeight o = qg;
  o.w = ctx.empty(qg.w.dtype, {nh * d, qg.cols()});
  for (int64_t hd = 0; hd < nh; ++hd)
    ctx.copy(o.w.slice(hd * d, (hd + 1) * d), qg.w.slice(hd * 2 * d + part * d, hd * 2 * d + part * d + d));
  if (qg.fp8()) {
    const int64_t b = qg.block_n, per = d / b;
    o.scale = ctx.empty(DType::F32, {nh * per, qg.scale.shape[1]});
    for (int64_t hd = 0; hd < nh; ++hd)
      ctx.copy(o.scale.slice(hd * per, (hd + 1) * per),
               qg.scale.slice((hd * 2 * d + part * d) / b, (hd * 2 * d + part * d) / b + per));
  }
  return o;
}

}  // namespace

AttentionWeights load_attention(WeightSource& src, const std::string& p, const WeightNames& n, const ModelConfig& cfg,
                                const AttentionSpec& spec) {
  const int64_t H = cfg.hidden_size, d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  AttentionWeights w;
  if (spec.output_gate) {  // q_proj [nh 2d, H]: per head d query rows, then d gate rows
    const std::string name = p + n.q + ".weight";
    LinearWeight qg = src.linear(name, {nh * 2 * d, H});
    if (qg.fp8() && d % qg.block_n != 0) qg = src.matrix(name, {nh * 2 * d, H});  // blocks straddle q and gate rows
    w.wq = head_rows(src.ctx(), qg, nh, d, 0);
    w.wg = head_rows(src.ctx(), qg, nh, d, 1);
  } else {
    w.wq = src.linear(p + n.q + ".weight", {nh * d, H});
  }
  w.wk = src.linear(p + n.k + ".weight", {nkv * d, H});
  w.wv = src.linear(p + n.v + ".weight", {nkv * d, H});
  w.wo = src.linear(p + n.o + ".weight", {H, nh * d});
  if (spec.bias) {
    w.bq = src.matrix(p + n.q + ".bias", {nh * d});
    w.bk = src.matrix(p + n.k + ".bias", {nkv * d});
    w.bv = src.matrix(p + n.v + ".bias", {nkv * d});
  }
  if (spec.qk_norm) {
    w.q_norm = src.norm(p + n.q_norm, {d});
    w.k_norm = src.norm(p + n.k_norm, {d});
  }
  if (spec.out_bias) w.bo = src.matrix(p + n.o + ".bias", {H});
  if (spec.sinks) w.sinks = src.f32(p + n.sinks, {nh});
  return w;
}

int64_t attention_params(const ModelConfig& cfg, const AttentionSpec& spec) {
  const int64_t H = cfg.hidden_size, d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  return 2 * H * nh * d + 2 * H * nkv * d + (spec.bias ? (nh + 2 * nkv) * d : 0) + (spec.qk_norm ? 2 * d : 0) +
         (spec.out_bias ? H : 0) + (spec.sinks ? nh : 0) + (spec.output_gate ? H * nh * d : 0);
}

void attention_forward(Context& ctx, const AttentionWeights& w, const AttentionSpec& spec, const ModelConfig& cfg,
                       int64_t l, const Tensor& x, const Tensor& pos, const Tensor& inv_freq,
                       std::span<const AttnSegment> segs, const Tensor& h) {
  const int64_t R = x.rows(), d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const DType dt = ctx.compute_dtype();
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  // YaRN scales q and k by its attention factor af in transformers (cos and sin times af): af^2 on the scores
  const double af = cfg.rope_scaling.attention_scaling();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d)) * static_cast<float>(af * af);
  Tensor q = ctx.empty(dt, {R, nh, d});
  Tensor k = ctx.empty(dt, {R, nkv, d});
  Tensor v = ctx.empty(dt, {R, nkv, d});
  Tensor o = ctx.empty(dt, {R, nh, d});
  Tensor none;
  ctx.linear(x, w.wq, w.bq.defined() ? &w.bq : nullptr, q.reshape({R, nh * d}));
  ctx.linear(x, w.wk, w.bk.defined() ? &w.bk : nullptr, k.reshape({R, nkv * d}));
  ctx.linear(x, w.wv, w.bv.defined() ? &w.bv : nullptr, v.reshape({R, nkv * d}));
  if (spec.qk_norm) {
    Tensor q2 = q.reshape({R * nh, d}), k2 = k.reshape({R * nkv, d});
    if (cfg.zero_centred_norms) {
      ctx.rmsnorm_gated(q2, w.q_norm, nullptr, eps, true, q2);
      ctx.rmsnorm_gated(k2, w.k_norm, nullptr, eps, true, k2);
    } else {
      ctx.rmsnorm(q2, w.q_norm, eps, q2, none);
      ctx.rmsnorm(k2, w.k_norm, eps, k2, none);
    }
  }
  ctx.rope(q, pos, inv_freq, false);
  ctx.rope(k, pos, inv_freq, false);
  // attention per sequence, all in one call: over its cache (the new rows appended first), or causally among its own
  // rows
  std::vector<CausalSeq> attn(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    const AttnSegment& s = segs[i];
    const int64_t T = s.end - s.begin;
    CausalSeq& a = attn[i];
    a.begin = s.begin;
    a.end = s.end;
    if (s.cache) {
      KVCache& c = *s.cache;
      ctx.copy(c.k[l].slice(s.start, s.start + T), k.slice(s.begin, s.end));
      ctx.copy(c.v[l].slice(s.start, s.start + T), v.slice(s.begin, s.end));
      a.k = c.k[l].slice(0, s.start + T);
      a.v = c.v[l].slice(0, s.start + T);
      a.q_offset = s.start;
    } else {
      a.k = k.slice(s.begin, s.end);
      a.v = v.slice(s.begin, s.end);
      a.q_offset = 0;
    }
  }
  CausalAttnOpts opts;
  opts.window = spec.sliding_window;
  opts.sinks = w.sinks;
  ctx.attention_causal_batch(q, o, attn, scale, opts);
  if (spec.output_gate) {  // o *= sigmoid(x Wg^T)
    Tensor gate = ctx.empty(dt, {R, nh * d});
    ctx.linear(x, w.wg, nullptr, gate);
    ctx.sigmoid_gate(o.reshape({R, nh * d}), gate);
  }
  ctx.linear(o.reshape({R, nh * d}), w.wo, w.bo.defined() ? &w.bo : nullptr, h, 1.0f);  // h += o Wo^T (+ bo)
}

}  // namespace dflash
