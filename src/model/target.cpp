#include "model/target.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "io/safetensors.h"

namespace dflash {

KVCache KVCache::create(Context& ctx, const ModelConfig& cfg, int64_t capacity) {
  KVCache c;
  c.capacity = capacity;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    c.k.push_back(ctx.empty(ctx.compute_dtype(), {capacity, cfg.num_key_value_heads, cfg.head_dim}));
    c.v.push_back(ctx.empty(ctx.compute_dtype(), {capacity, cfg.num_key_value_heads, cfg.head_dim}));
  }
  return c;
}

void KVCache::truncate(int64_t new_len) {
  DFLASH_CHECK(new_len >= 0 && new_len <= len, "KVCache::truncate to ", new_len, " of ", len);
  len = new_len;
}

std::shared_ptr<const Target> Target::load(const std::string& dir, Context& ctx) {
  ModelConfig cfg = load_model_config(dir);
  WeightStore ws = WeightStore::open(dir);
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, V = cfg.vocab_size;
  const DType dt = ctx.compute_dtype();
  auto get = [&](const std::string& name, Shape shape) { return ctx.to_device(ws.f32(name, shape), dt); };
  TargetWeights w;
  w.embed = get("model.embed_tokens.weight", {V, H});
  w.final_norm = get("model.norm.weight", {H});
  if (cfg.tie_word_embeddings || !ws.has("lm_head.weight")) {
    DFLASH_CHECK(cfg.tie_word_embeddings, dir, ": lm_head.weight is missing and tie_word_embeddings is false");
    w.lm_head = w.embed;
  } else {
    w.lm_head = get("lm_head.weight", {V, H});
  }
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = cat("model.layers.", l, ".");
    TargetLayer L;
    L.in_norm = get(p + "input_layernorm.weight", {H});
    L.post_norm = get(p + "post_attention_layernorm.weight", {H});
    L.wq = get(p + "self_attn.q_proj.weight", {nh * d, H});
    L.wk = get(p + "self_attn.k_proj.weight", {nkv * d, H});
    L.wv = get(p + "self_attn.v_proj.weight", {nkv * d, H});
    L.wo = get(p + "self_attn.o_proj.weight", {H, nh * d});
    if (cfg.attention_bias) {
      L.bq = get(p + "self_attn.q_proj.bias", {nh * d});
      L.bk = get(p + "self_attn.k_proj.bias", {nkv * d});
      L.bv = get(p + "self_attn.v_proj.bias", {nkv * d});
    }
    if (cfg.qk_norm) {
      L.q_norm = get(p + "self_attn.q_norm.weight", {d});
      L.k_norm = get(p + "self_attn.k_norm.weight", {d});
    }
    L.w_gate = get(p + "mlp.gate_proj.weight", {I, H});
    L.w_up = get(p + "mlp.up_proj.weight", {I, H});
    L.w_down = get(p + "mlp.down_proj.weight", {H, I});
    w.layers.push_back(std::move(L));
  }
  w.inv_freq = ctx.to_device(rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling));
  return std::make_shared<const Target>(std::move(cfg), std::move(w));
}

TargetHead load_target_head(const std::string& dir, Context& ctx) {
  ModelConfig cfg = load_model_config(dir);
  WeightStore ws = WeightStore::open(dir);
  const Shape shape = {cfg.vocab_size, cfg.hidden_size};
  TargetHead h;
  h.embed = ctx.to_device(ws.f32("model.embed_tokens.weight", shape), ctx.compute_dtype());
  if (cfg.tie_word_embeddings || !ws.has("lm_head.weight")) {
    DFLASH_CHECK(cfg.tie_word_embeddings, dir, ": lm_head.weight is missing and tie_word_embeddings is false");
    h.lm_head = h.embed;
  } else {
    h.lm_head = ctx.to_device(ws.f32("lm_head.weight", shape), ctx.compute_dtype());
  }
  return h;
}

namespace {
// Tensor k of a random target: N(0, 0.02) from stream k (norm weights: ones).
struct RandomWeights {
  Context& ctx;
  uint64_t seed;
  uint64_t k = 0;
  Tensor normal(Shape s) {
    Tensor t = ctx.empty(ctx.param_dtype(), std::move(s));
    ctx.fill_normal(t, 0.02, seed, RngPurpose::RandomTarget, k++);
    return ctx.to_device(t, ctx.compute_dtype());
  }
  Tensor ones(Shape s) {
    ++k;
    Tensor h = cpu_empty(DType::F32, std::move(s));
    for (int64_t i = 0; i < h.numel(); ++i) h.ptr<float>()[i] = 1.0f;
    return ctx.to_device(h, ctx.compute_dtype());
  }
};
}  // namespace

TargetHead random_target_head(const ModelConfig& cfg, Context& ctx, uint64_t seed) {
  RandomWeights r{ctx, seed};
  TargetHead h;
  h.embed = r.normal({cfg.vocab_size, cfg.hidden_size});
  h.lm_head = cfg.tie_word_embeddings ? h.embed : r.normal({cfg.vocab_size, cfg.hidden_size});
  return h;
}

std::shared_ptr<const Target> Target::random(const ModelConfig& cfg, Context& ctx, uint64_t seed) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  TargetHead head = random_target_head(cfg, ctx, seed);
  RandomWeights r{ctx, seed, 2};
  TargetWeights w;
  w.embed = head.embed;
  w.lm_head = head.lm_head;
  w.final_norm = r.ones({H});
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    TargetLayer L;
    L.in_norm = r.ones({H});
    L.post_norm = r.ones({H});
    L.wq = r.normal({nh * d, H});
    L.wk = r.normal({nkv * d, H});
    L.wv = r.normal({nkv * d, H});
    L.wo = r.normal({H, nh * d});
    if (cfg.attention_bias) {
      L.bq = r.normal({nh * d});
      L.bk = r.normal({nkv * d});
      L.bv = r.normal({nkv * d});
    }
    if (cfg.qk_norm) {
      L.q_norm = r.ones({d});
      L.k_norm = r.ones({d});
    }
    L.w_gate = r.normal({I, H});
    L.w_up = r.normal({I, H});
    L.w_down = r.normal({H, I});
    w.layers.push_back(std::move(L));
  }
  w.inv_freq = ctx.to_device(rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling));
  return std::make_shared<const Target>(cfg, std::move(w));
}

Target::Target(ModelConfig cfg, TargetWeights w) : cfg_(std::move(cfg)), w_(std::move(w)) {
  DFLASH_CHECK(static_cast<int64_t>(w_.layers.size()) == cfg_.num_hidden_layers, "target: ", w_.layers.size(),
               " layers given, config says ", cfg_.num_hidden_layers);
}

Target::Output Target::forward(Context& ctx, const Tensor& ids_in, std::span<const int64_t> layer_ids,
                               bool want_final, KVCache* cache) const {
  const int64_t T = ids_in.numel(), Lt = cfg_.num_hidden_layers;
  const int64_t start = cache ? cache->len : 0;
  if (cache)
    DFLASH_CHECK(start + T <= cache->capacity, "target: KV cache of ", cache->capacity, " positions cannot take ",
                 T, " more after ", start);
  int64_t last = -1;
  for (int64_t l : layer_ids) {
    DFLASH_CHECK(l >= 0 && l < Lt, "target layer id ", l, " outside [0, ", Lt, ")");
    last = std::max(last, l);
  }
  // Later layers can be skipped only when nothing needs them: not the final hidden, and not a KV cache (whose
  // every layer must hold the new positions).
  const int64_t run_layers = (want_final || cache) ? Lt : last + 1;
  std::vector<int32_t> pos_host(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos_host[t] = static_cast<int32_t>(start + t);
  const Segment seg{0, T, start, cache};
  Output out = run(ctx, ctx.to_device(ids_in), ctx.to_device(cpu_tensor_i32(pos_host, {T})), {&seg, 1}, layer_ids,
                   run_layers, want_final);
  if (cache) cache->len = start + T;
  return out;
}

Target::Output Target::run(Context& ctx, const Tensor& ids, const Tensor& pos, std::span<const Segment> segs,
                           std::span<const int64_t> layer_ids, int64_t run_layers, bool want_final) const {
  const int64_t R = ids.numel(), H = cfg_.hidden_size, d = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  const DType dt = ctx.compute_dtype();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Output out;
  out.features = ctx.empty(dt, {R, static_cast<int64_t>(layer_ids.size()) * H});
  Tensor h = ctx.empty(dt, {R, H});
  ctx.embedding(w_.embed, ids, h);
  Tensor x = ctx.empty(dt, {R, H});
  Tensor q = ctx.empty(dt, {R, nh, d});
  Tensor k = ctx.empty(dt, {R, nkv, d});
  Tensor v = ctx.empty(dt, {R, nkv, d});
  Tensor o = ctx.empty(dt, {R, nh, d});
  Tensor g = ctx.empty(dt, {R, I});
  Tensor u = ctx.empty(dt, {R, I});
  Tensor none;
  std::vector<CausalSeq> attn(segs.size());
  for (int64_t l = 0; l < run_layers; ++l) {
    const TargetLayer& L = w_.layers[l];
    ctx.rmsnorm(h, L.in_norm, eps, x, none);
    ctx.linear(x, L.wq, L.bq.defined() ? &L.bq : nullptr, q.reshape({R, nh * d}));
    ctx.linear(x, L.wk, L.bk.defined() ? &L.bk : nullptr, k.reshape({R, nkv * d}));
    ctx.linear(x, L.wv, L.bv.defined() ? &L.bv : nullptr, v.reshape({R, nkv * d}));
    if (cfg_.qk_norm) {
      Tensor q2 = q.reshape({R * nh, d}), k2 = k.reshape({R * nkv, d});
      ctx.rmsnorm(q2, L.q_norm, eps, q2, none);
      ctx.rmsnorm(k2, L.k_norm, eps, k2, none);
    }
    ctx.rope(q, pos, w_.inv_freq, false);
    ctx.rope(k, pos, w_.inv_freq, false);
    // attention per sequence, all in one call: over its cache (the new rows appended first), or causally among
    // its own rows
    for (size_t i = 0; i < segs.size(); ++i) {
      const Segment& s = segs[i];
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
    ctx.attention_causal_batch(q, o, attn, scale);
    ctx.linear(o.reshape({R, nh * d}), L.wo, nullptr, h, 1.0f);  // h += o Wo^T
    ctx.rmsnorm(h, L.post_norm, eps, x, none);
    ctx.linear(x, L.w_gate, nullptr, g);
    ctx.linear(x, L.w_up, nullptr, u);
    ctx.silu_mul(g, u, g);
    ctx.linear(g, L.w_down, nullptr, h, 1.0f);  // h += down(...)
    for (size_t f = 0; f < layer_ids.size(); ++f)
      if (layer_ids[f] == l) ctx.copy_columns(out.features, h, static_cast<int64_t>(f) * H);
  }
  if (want_final) {
    out.final_hidden = ctx.empty(dt, {R, H});
    ctx.rmsnorm(h, w_.final_norm, eps, out.final_hidden, none);
  }
  return out;
}

void Target::logits(Context& ctx, const Tensor& hidden, const Tensor& out) const {
  ctx.linear(hidden, w_.lm_head, nullptr, out);
}

}  // namespace dflash
