// model/target/latent_attention.cpp — the multi-head latent attention token mixer (model/target/latent_attention.h):
// its descriptor kLatentAttentionMixer for the table of model/target/mixer.h.
#include "model/target/latent_attention.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "model/target/mixer.h"

namespace dflash {

namespace {

// transformers' DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm with DeepseekV3RMSNorm's default eps, not
// rms_norm_eps (vLLM passes rms_norm_eps; every published config has 1e-6 for both).
constexpr float kLatentNormEps = 1e-6f;

// The rows [s, s + r) of the host tensor t [N, C] (any dtype) for every s of starts, reordered in place from
// interleaved pairs to [evens | odds]: row s + i takes row s + 2i for i < r/2, row s + 2(i - r/2) + 1 after.
void deinterleave_rows(const Tensor& t, const std::vector<int64_t>& starts, int64_t r) {
  const size_t row = t.nbytes() / static_cast<size_t>(t.shape[0]);
  std::vector<uint8_t> tmp(row * static_cast<size_t>(r));
  auto* b = static_cast<uint8_t*>(t.data);
  for (int64_t s : starts) {
    std::memcpy(tmp.data(), b + s * row, tmp.size());
    for (int64_t i = 0; i < r; ++i) {
      const int64_t from = i < r / 2 ? 2 * i : 2 * (i - r / 2) + 1;
      std::memcpy(b + (s + i) * row, tmp.data() + from * row, row);
    }
  }
}

// A projection whose rows [s, s + r) for s in starts are RoPE dims: as src.linear, with those rows reordered from
// interleaved pairs when `interleave` (the header). A random source draws it as it is. FP8 stays FP8 when every
// range lies in one block of rows (the scale rows then stay), else it is dequantised.
LinearWeight load_rope_rows(WeightSource& src, const std::string& name, const Shape& shape,
                            const std::vector<int64_t>& starts, int64_t r, bool interleave) {
  if (!interleave || src.random()) return src.linear(name, shape);
  Context& ctx = src.ctx();
  if (const std::optional<LinearWeight> q = src.fp8_host_if(name, shape)) {
    bool in_block = true;
    for (int64_t s : starts) in_block = in_block && s / q->block_n == (s + r - 1) / q->block_n;
    if (in_block) {
      LinearWeight out = *q;
      Tensor w = cpu_empty(q->w.dtype, q->w.shape);
      std::memcpy(w.data, q->w.data, w.nbytes());
      deinterleave_rows(w, starts, r);
      out.w = ctx.to_device(w);
      out.scale = ctx.to_device(q->scale);
      return out;
    }
  }
  const Tensor v = src.host_f32(name, shape);  // (FP8: dequantised)
  Tensor w = cpu_empty(DType::F32, shape);
  std::memcpy(w.data, v.data, w.nbytes());
  deinterleave_rows(w, starts, r);
  return ctx.to_device(w, ctx.compute_dtype());
}

MixerWeights load(WeightSource& src, const std::string& p, const WeightNames& n, const ModelConfig& cfg,
                  const LayerSpec&) {
  const MlaConfig& m = cfg.mla;
  const int64_t H = cfg.hidden_size, nh = cfg.num_attention_heads, r = m.qk_rope_head_dim, dq = m.qk_head_dim();
  std::vector<int64_t> q_rope(static_cast<size_t>(nh));
  for (int64_t h = 0; h < nh; ++h) q_rope[static_cast<size_t>(h)] = h * dq + m.qk_nope_head_dim;
  LatentAttnWeights w;
  if (m.q_lora_rank == 0) {
    w.wq = load_rope_rows(src, p + n.q + ".weight", {nh * dq, H}, q_rope, r, m.rope_interleave);
  } else {
    w.wq_a = src.linear(p + n.q_a + ".weight", {m.q_lora_rank, H});
    w.q_a_norm = src.norm(p + n.q_a_norm, {m.q_lora_rank});
    w.wq_b = load_rope_rows(src, p + n.q_b + ".weight", {nh * dq, m.q_lora_rank}, q_rope, r, m.rope_interleave);
  }
  w.wkv_a = load_rope_rows(src, p + n.kv_a + ".weight", {m.kv_lora_rank + r, H}, {m.kv_lora_rank}, r,
                           m.rope_interleave);
  w.kv_a_norm = src.norm(p + n.kv_a_norm, {m.kv_lora_rank});
  w.wkv_b = src.linear(p + n.kv_b + ".weight", {nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
  w.wo = src.linear(p + n.o + ".weight", {H, nh * m.v_head_dim});
  Tensor eye = cpu_empty(DType::F32, {nh * r, r});
  std::memset(eye.data, 0, eye.nbytes());
  for (int64_t i = 0; i < nh * r; ++i) eye.ptr<float>()[i * r + i % r] = 1.0f;
  w.heads_eye = src.ctx().to_device(eye, src.ctx().compute_dtype());
  return w;
}

std::string missing(const MixerWeights& mw, const LayerSpec&) {
  const LatentAttnWeights* w = std::any_cast<LatentAttnWeights>(&mw);
  if (!w || !(w->wq.defined() || w->wq_b.defined()) || !w->wkv_a.defined() || !w->wkv_b.defined() ||
      !w->heads_eye.defined())
    return "the weights of its latent attention are missing";
  return "";
}

void forward(Context& ctx, const MixerWeights& mw, const MixerArgs& a, const Tensor& h) {
  const LatentAttnWeights& w = mixer_weights<LatentAttnWeights>(mw, "latent attention");
  const MlaConfig& m = a.cfg.mla;
  const int64_t R = a.x.rows(), nh = a.cfg.num_attention_heads, nope = m.qk_nope_head_dim, r = m.qk_rope_head_dim,
                dv = m.v_head_dim, dq = nope + r, kvr = m.kv_lora_rank;
  const DType dt = ctx.compute_dtype();
  const Tensor none;
  // q [R, nh, dq]: per head [q_nope | q_rope], q_rope turned (and times af^2: the header)
  Tensor q = ctx.empty(dt, {R, nh, dq});
  const Tensor q2 = q.reshape({R * nh, dq});
  if (w.wq.defined()) {
    ctx.linear(a.x, w.wq, nullptr, q.reshape({R, nh * dq}));
  } else {
    Tensor qa = ctx.empty(dt, {R, m.q_lora_rank});
    ctx.linear(a.x, w.wq_a, nullptr, qa);
    ctx.rmsnorm(qa, w.q_a_norm, kLatentNormEps, qa, none);
    ctx.linear(qa, w.wq_b, nullptr, q.reshape({R, nh * dq}));
  }
  Tensor qr = ctx.empty(dt, {R, nh, r});
  ctx.gather_columns(qr.reshape({R * nh, r}), q2, nope);
  ctx.rope(qr, a.pos, a.inv_freq, false);
  const double af = a.cfg.rope_scaling.attention_scaling();
  if (af != 1.0) ctx.add(qr, qr, static_cast<float>(af * af - 1.0));  // qr (1 + (af^2 - 1)), one rounding
  ctx.copy_columns(q2, qr.reshape({R * nh, r}), nope);
  // the latent c (normed) and the RoPE key kr, turned and broadcast to the heads
  Tensor ckv = ctx.empty(dt, {R, kvr + r}), c = ctx.empty(dt, {R, kvr}), kr = ctx.empty(dt, {R, 1, r});
  ctx.linear(a.x, w.wkv_a, nullptr, ckv);
  ctx.gather_columns(c, ckv, 0);
  ctx.rmsnorm(c, w.kv_a_norm, kLatentNormEps, c, none);
  ctx.gather_columns(kr.reshape({R, r}), ckv, kvr);
  ctx.rope(kr, a.pos, a.inv_freq, false);
  Tensor krh = ctx.empty(dt, {R * nh, r});
  ctx.linear(kr.reshape({R, r}), w.heads_eye, nullptr, krh.reshape({R, nh * r}));
  // k = [k_nope | kr], v = [v | 0] per head, [R, nh, dq]
  Tensor kv = ctx.empty(dt, {R * nh, nope + dv});
  ctx.linear(c, w.wkv_b, nullptr, kv.reshape({R, nh * (nope + dv)}));
  Tensor k = ctx.empty(dt, {R, nh, dq}), v = ctx.zeros(dt, {R, nh, dq});
  const Tensor k2 = k.reshape({R * nh, dq}), v2 = v.reshape({R * nh, dq});
  Tensor kn = ctx.empty(dt, {R * nh, nope}), vn = ctx.empty(dt, {R * nh, dv});
  ctx.gather_columns(kn, kv, 0);
  ctx.copy_columns(k2, kn, 0);
  ctx.copy_columns(k2, krh, nope);
  ctx.gather_columns(vn, kv, nope);
  ctx.copy_columns(v2, vn, 0);
  // attention per sequence in one call, as model/target/attention.cpp; then the first dv dims of each head
  Tensor o = ctx.empty(dt, {R, nh, dq});
  const float scale = static_cast<float>(a.spec.attention.scale > 0 ? a.spec.attention.scale
                                                                    : 1.0 / std::sqrt(static_cast<double>(dq)));
  ctx.attention_causal_batch(q, o, causal_sequences(ctx, a, k, v), scale);
  Tensor ov = ctx.empty(dt, {R * nh, dv});
  ctx.gather_columns(ov, o.reshape({R * nh, dq}), 0);
  ctx.linear(ov.reshape({R, nh * dv}), w.wo, nullptr, h, 1.0f);  // h += o Wo^T
}

int64_t params(const ModelConfig& cfg, const LayerSpec&) {
  const MlaConfig& m = cfg.mla;
  const int64_t H = cfg.hidden_size, nh = cfg.num_attention_heads, dq = m.qk_head_dim();
  const int64_t q = m.q_lora_rank == 0 ? H * nh * dq : H * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * nh * dq;
  return q + H * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank +
         m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim) + nh * m.v_head_dim * H;
}

LayerCache make_cache(Context& ctx, const ModelConfig& cfg, const LayerSpec&, int64_t capacity) {
  LayerCache c;
  const int64_t nh = cfg.num_attention_heads, dq = cfg.mla.qk_head_dim();
  c.k = ctx.empty(ctx.compute_dtype(), {capacity, nh, dq});
  c.v = ctx.zeros(ctx.compute_dtype(), {capacity, nh, dq});
  return c;
}

// "latent attention (q rank 1536, kv rank 512, 128 heads of 128 + 64 rope, v 128, interleaved rope, scale 0.1147)"
std::string describe(const ModelConfig& c, const LayerSpec& s) {
  const MlaConfig& m = c.mla;
  std::string d = "latent attention (";
  d += m.q_lora_rank > 0 ? cat("q rank ", m.q_lora_rank, ", ") : std::string("q_proj, ");
  d += cat("kv rank ", m.kv_lora_rank, ", ", c.num_attention_heads, " heads of ", m.qk_nope_head_dim, " + ",
           m.qk_rope_head_dim, " rope, v ", m.v_head_dim);
  if (m.rope_interleave) d += ", interleaved rope";
  if (s.attention.scale > 0) d += cat(", scale ", s.attention.scale);
  return d + ")";
}

std::vector<std::pair<const char*, int64_t>> info_keys(const ModelConfig& c) {
  const MlaConfig& m = c.mla;
  return {{"q_lora_rank", m.q_lora_rank}, {"kv_lora_rank", m.kv_lora_rank},
          {"qk_nope_head_dim", m.qk_nope_head_dim}, {"qk_rope_head_dim", m.qk_rope_head_dim},
          {"v_head_dim", m.v_head_dim}};
}

}  // namespace

extern const TokenMixerKind kLatentAttentionMixer = {
    .kind = TokenMixer::LatentAttention,
    .name = "latent attention",
    .load = load,
    .missing = missing,
    .forward = forward,
    .params = params,
    .make_cache = make_cache,
    .truncate = nullptr,  // positional memory only
    .describe = describe,
    .info_key = "latent_attention",
    .info_keys = info_keys,
};

}  // namespace dflash
