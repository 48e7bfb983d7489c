// model/target/attention.cpp — the causal attention token mixer (model/target/attention.h): its descriptor
// kAttentionMixer for the table of model/target/mixer.h.
#include "model/target/attention.h"

#include <cmath>
#include <vector>

#include "model/target/mixer.h"

namespace dflash {

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

MixerWeights load(WeightSource& src, const std::string& p, const WeightNames& n, const ModelConfig& cfg,
                  const LayerSpec& layer) {
  const AttentionSpec& spec = layer.attention;
  const int64_t H = cfg.hidden_size, d = cfg.head_dim_of(layer), nh = cfg.num_attention_heads,
                nkv = cfg.kv_heads_of(layer);
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
  if (!spec.k_eq_v) w.wv = src.linear(p + n.v + ".weight", {nkv * d, H});
  w.wo = src.linear(p + n.o + ".weight", {H, nh * d});
  if (spec.bias) {
    w.bq = src.matrix(p + n.q + ".bias", {nh * d});
    w.bk = src.matrix(p + n.k + ".bias", {nkv * d});
    w.bv = src.matrix(p + n.v + ".bias", {nkv * d});
  }
  if (spec.qk_norm) {  // per head [d], or over all heads [nh d] / [nkv d]
    w.q_norm = src.norm(p + n.q_norm, {spec.qk_norm_all_heads ? nh * d : d});
    w.k_norm = src.norm(p + n.k_norm, {spec.qk_norm_all_heads ? nkv * d : d});
  }
  if (spec.out_bias) w.bo = src.matrix(p + n.o + ".bias", {H});
  if (spec.sinks) w.sinks = src.f32(p + n.sinks, {nh});
  if (spec.v_norm) {
    Tensor ones = cpu_empty(DType::F32, {d});
    for (int64_t i = 0; i < d; ++i) ones.ptr<float>()[i] = 1.0f;
    w.v_ones = src.ctx().to_device(ones, src.ctx().compute_dtype());
  }
  return w;
}

std::string missing(const MixerWeights& mw, const LayerSpec& spec) {
  const AttentionWeights* w = std::any_cast<AttentionWeights>(&mw);
  if (!w || !w->wq.defined()) return "the weights of its attention are missing";
  if (!spec.attention.k_eq_v && !w->wv.defined()) return "the weights of its attention's v_proj are missing";
  if (spec.attention.v_norm && !w->v_ones.defined()) return "the plan has a v_norm but its attention has none";
  if (spec.attention.sinks && !w->sinks.defined()) return "the plan has attention sinks but their weights are missing";
  return "";
}

// q, k, v of the rows; q and k normed (qk_norm: per head, or over all heads with qk_norm_all_heads) and turned by
// RoPE at each row's position.
void project_qkv(Context& ctx, const AttentionWeights& w, const MixerArgs& a, const Tensor& q, const Tensor& k,
                 const Tensor& v) {
  const ModelConfig& cfg = a.cfg;
  const int64_t R = a.x.rows(), d = cfg.head_dim_of(a.spec), nh = cfg.num_attention_heads, nkv = cfg.kv_heads_of(a.spec);
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  Tensor none;
  ctx.linear(a.x, w.wq, w.bq.defined() ? &w.bq : nullptr, q.reshape({R, nh * d}));
  ctx.linear(a.x, w.wk, w.bk.defined() ? &w.bk : nullptr, k.reshape({R, nkv * d}));
  if (a.spec.attention.k_eq_v) {  // the values are the keys' projection, taken before k_norm and RoPE
    ctx.copy(v, k);
  } else {
    ctx.linear(a.x, w.wv, w.bv.defined() ? &w.bv : nullptr, v.reshape({R, nkv * d}));
  }
  if (a.spec.attention.v_norm) {
    Tensor v2 = v.reshape({R * nkv, d});
    ctx.rmsnorm(v2, w.v_ones, eps, v2, none);
  }
  if (a.spec.attention.qk_norm) {
    const bool all = a.spec.attention.qk_norm_all_heads;
    Tensor q2 = all ? q.reshape({R, nh * d}) : q.reshape({R * nh, d});
    Tensor k2 = all ? k.reshape({R, nkv * d}) : k.reshape({R * nkv, d});
    if (cfg.zero_centred_norms) {
      ctx.rmsnorm_gated(q2, w.q_norm, nullptr, eps, true, q2);
      ctx.rmsnorm_gated(k2, w.k_norm, nullptr, eps, true, k2);
    } else {
      ctx.rmsnorm(q2, w.q_norm, eps, q2, none);
      ctx.rmsnorm(k2, w.k_norm, eps, k2, none);
    }
  }
  ctx.rope(q, a.pos, a.inv_freq, false);
  ctx.rope(k, a.pos, a.inv_freq, false);
}

void forward(Context& ctx, const MixerWeights& mw, const MixerArgs& a, const Tensor& h) {
  const AttentionWeights& w = mixer_weights<AttentionWeights>(mw, "attention");
  const AttentionSpec& spec = a.spec.attention;
  const int64_t R = a.x.rows(), d = a.cfg.head_dim_of(a.spec), nh = a.cfg.num_attention_heads,
                nkv = a.cfg.kv_heads_of(a.spec);
  const DType dt = ctx.compute_dtype();
  // YaRN scales q and k by its attention factor af in transformers (cos and sin times af): af^2 on the scores
  const double af = a.cfg.rope_scaling.attention_scaling();
  const float scale = spec.scale > 0 ? static_cast<float>(spec.scale)
                                     : 1.0f / std::sqrt(static_cast<float>(d)) * static_cast<float>(af * af);
  Tensor q = ctx.empty(dt, {R, nh, d});
  Tensor k = ctx.empty(dt, {R, nkv, d});
  Tensor v = ctx.empty(dt, {R, nkv, d});
  Tensor o = ctx.empty(dt, {R, nh, d});
  project_qkv(ctx, w, a, q, k, v);
  const std::vector<CausalSeq> attn = causal_sequences(ctx, a, k, v);
  CausalAttnOpts opts;
  opts.window = spec.sliding_window;
  opts.sinks = w.sinks;
  ctx.attention_causal_batch(q, o, attn, scale, opts);
  if (spec.output_gate) {  // o *= sigmoid(x Wg^T)
    Tensor gate = ctx.empty(dt, {R, nh * d});
    ctx.linear(a.x, w.wg, nullptr, gate);
    ctx.sigmoid_gate(o.reshape({R, nh * d}), gate);
  }
  ctx.linear(o.reshape({R, nh * d}), w.wo, w.bo.defined() ? &w.bo : nullptr, h, 1.0f);  // h += o Wo^T (+ bo)
}

int64_t params(const ModelConfig& cfg, const LayerSpec& layer) {
  const AttentionSpec& spec = layer.attention;
  const int64_t H = cfg.hidden_size, d = cfg.head_dim_of(layer), nh = cfg.num_attention_heads,
                nkv = cfg.kv_heads_of(layer);
  return 2 * H * nh * d + (spec.k_eq_v ? 1 : 2) * H * nkv * d + (spec.bias ? (nh + 2 * nkv) * d : 0) + (spec.qk_norm ? (spec.qk_norm_all_heads ? (nh + nkv) * d : 2 * d) : 0) +
         (spec.out_bias ? H : 0) + (spec.sinks ? nh : 0) + (spec.output_gate ? H * nh * d : 0);
}

LayerCache make_cache(Context& ctx, const ModelConfig& cfg, const LayerSpec& s, int64_t capacity) {
  LayerCache c;
  c.k = ctx.empty(ctx.compute_dtype(), {capacity, cfg.kv_heads_of(s), cfg.head_dim_of(s)});
  c.v = ctx.empty(ctx.compute_dtype(), {capacity, cfg.kv_heads_of(s), cfg.head_dim_of(s)});
  return c;
}

// "attention (qk-norm)", "attention (q/k/v bias, o bias, sinks, sliding window 128)"
std::string describe(const ModelConfig& c, const LayerSpec& s) {
  std::string a = "attention";
  std::vector<std::string> opts;
  if (s.attention.qk_norm) opts.push_back(s.attention.qk_norm_all_heads ? "qk-norm over all heads" : "qk-norm");
  if (s.attention.bias) opts.push_back("q/k/v bias");
  if (s.attention.out_bias) opts.push_back("o bias");
  if (s.attention.sinks) opts.push_back("sinks");
  if (s.attention.sliding_window > 0) opts.push_back(cat("sliding window ", s.attention.sliding_window));
  if (s.attention.output_gate) opts.push_back("output gate");
  if (s.attention.head_dim > 0 || s.attention.num_kv_heads > 0)
    opts.push_back(cat("head_dim ", c.head_dim_of(s), ", kv heads ", c.kv_heads_of(s)));
  if (s.attention.k_eq_v) opts.push_back("k = v");
  if (s.attention.v_norm) opts.push_back("v-norm");
  if (s.attention.scale > 0) opts.push_back(cat("scale ", s.attention.scale));
  if (s.attention.rope_alt) {
    opts.push_back(cat("proportional rotary ", c.rope_alt.rotated, " of ", c.rope_alt.dim, ", theta ", c.rope_alt.theta));
  } else if (c.rope_dim() != c.head_dim) {
    opts.push_back(cat("rotary ", c.rope_dim(), " of ", c.head_dim));
  }
  for (size_t i = 0; i < opts.size(); ++i) a += (i ? ", " : " (") + opts[i] + (i + 1 == opts.size() ? ")" : "");
  return a;
}

}  // namespace

std::vector<CausalSeq> causal_sequences(Context& ctx, const MixerArgs& a, const Tensor& k, const Tensor& v) {
  std::vector<CausalSeq> attn(a.segs.size());
  for (size_t i = 0; i < a.segs.size(); ++i) {
    const SeqSegment& s = a.segs[i];
    const int64_t T = s.end - s.begin;
    CausalSeq& c = attn[i];
    c.begin = s.begin;
    c.end = s.end;
    if (s.cache) {
      LayerCache& kv = s.cache->layers[static_cast<size_t>(a.layer)];
      ctx.copy(kv.k.slice(s.start, s.start + T), k.slice(s.begin, s.end));
      ctx.copy(kv.v.slice(s.start, s.start + T), v.slice(s.begin, s.end));
      c.k = kv.k.slice(0, s.start + T);
      c.v = kv.v.slice(0, s.start + T);
      c.q_offset = s.start;
    } else {
      c.k = k.slice(s.begin, s.end);
      c.v = v.slice(s.begin, s.end);
      c.q_offset = 0;
    }
  }
  return attn;
}

extern const TokenMixerKind kAttentionMixer = {
    .kind = TokenMixer::Attention,
    .name = "attention",
    .load = load,
    .missing = missing,
    .forward = forward,
    .params = params,
    .make_cache = make_cache,
    .truncate = nullptr,  // positional memory only
    .describe = describe,
    .info_key = nullptr,  // its keys are the config's top-level ones
    .info_keys = nullptr,
};

}  // namespace dflash
