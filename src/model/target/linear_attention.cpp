// model/target/linear_attention.cpp — the Gated DeltaNet mixer, its cache state and rollback
// (model/target/linear_attention.h).
#include "model/target/linear_attention.h"

#include <vector>

#include "io/model_family_hybrid.h"
#include "model/target/attention.h"

namespace dflash {

namespace {

// A copy of t on ctx's device (same dtype).
Tensor clone(Context& ctx, const Tensor& t) {
  Tensor c = ctx.empty(t.dtype, t.shape);
  ctx.copy(c, t);
  return c;
}

}  // namespace

LinearAttnWeights load_linear_attention(WeightSource& src, const std::string& prefix, const WeightNames& n,
                                        const ModelConfig& cfg) {
  const LinearAttnConfig& a = cfg.linear_attn;
  const int64_t H = cfg.hidden_size, C = a.conv_dim(), VD = a.value_dim(), nv = a.num_value_heads;
  const std::string p = prefix + n.linear_attn;
  Context& ctx = src.ctx();
  const DType dt = ctx.compute_dtype();
  LinearAttnWeights w;
  if (src.has(p + "in_proj_qkvz.weight")) {  // fused and grouped per key head: split by io's layout conversion
    const SplitLinearAttnProjections s = split_grouped_qkvz(src.host_f32(p + "in_proj_qkvz.weight", {C + VD, H}),
                                                            src.host_f32(p + "in_proj_ba.weight", {2 * nv, H}), a);
    w.w_qkv = ctx.to_device(s.qkv, dt);
    w.w_z = ctx.to_device(s.z, dt);
    w.w_ba = ctx.to_device(s.ba, dt);
  } else {  // split
    w.w_qkv = src.linear(p + "in_proj_qkv.weight", {C, H});
    w.w_z = src.linear(p + "in_proj_z.weight", {VD, H});
    w.w_ba = ctx.empty(dt, {2 * nv, H});
    ctx.copy(w.w_ba.slice(0, nv), src.matrix(p + "in_proj_b.weight", {nv, H}));
    ctx.copy(w.w_ba.slice(nv, 2 * nv), src.matrix(p + "in_proj_a.weight", {nv, H}));
  }
  w.conv = src.matrix(p + "conv1d.weight", {C, 1, a.conv_kernel}).reshape({C, a.conv_kernel});
  w.A_log = src.matrix(p + "A_log", {nv});
  w.dt_bias = src.matrix(p + "dt_bias", {nv});
  w.norm = src.norm(p + "norm.weight", {a.value_head_dim});
  w.w_out = src.linear(p + "out_proj.weight", {H, VD});
  return w;
}

LinearAttnState make_linear_state(Context& ctx, const ModelConfig& cfg) {
  const LinearAttnConfig& a = cfg.linear_attn;
  LinearAttnState s;
  s.conv = ctx.zeros(ctx.compute_dtype(), {a.conv_kernel - 1, a.conv_dim()});
  s.state = ctx.zeros(ctx.param_dtype(), {a.num_value_heads, a.key_head_dim, a.value_head_dim});
  return s;
}

void linear_attention_forward(Context& ctx, const LinearAttnWeights& w, const ModelConfig& cfg, int64_t l,
                              const Tensor& x, std::span<const AttnSegment> segs, const Tensor& h) {
  const LinearAttnConfig& a = cfg.linear_attn;
  const int64_t R = x.rows(), C = a.conv_dim(), nv = a.num_value_heads, dv = a.value_head_dim;
  const DType dt = ctx.compute_dtype(), pt = ctx.param_dtype();
  Tensor xin = ctx.empty(dt, {R, C}), z = ctx.empty(dt, {R, nv * dv}), ba = ctx.empty(dt, {R, 2 * nv});
  ctx.linear(x, w.w_qkv, nullptr, xin);
  ctx.linear(x, w.w_z, nullptr, z);
  ctx.linear(x, w.w_ba, nullptr, ba);
  Tensor g = ctx.empty(pt, {R, nv}), beta = ctx.empty(pt, {R, nv});
  ctx.gdn_gate(ba, w.A_log, w.dt_bias, g, beta);
  Tensor qkv = ctx.empty(dt, {R, C}), o = ctx.empty(dt, {R, nv, dv});
  // Sequences without a cache that tile the rows (a packed prefill) share one conv1d_causal and one gated_delta_rule
  // call (their seqs: one launch each on CUDA); the others run one by one.
  std::vector<int64_t> packed = {0};
  for (const AttnSegment& s : segs)
    if (!s.cache && s.begin == packed.back() && s.end >= s.begin) packed.push_back(s.end);
  const bool one_call = packed.size() > 2 && packed.back() == R && packed.size() == segs.size() + 1;
  if (one_call) {
    ctx.conv1d_causal(xin, w.conv, Tensor{}, qkv, packed);
    ctx.gated_delta_rule({qkv, g, beta, Tensor{}, a.num_key_heads, a.key_head_dim, nv, dv, packed}, o);
  }
  for (const AttnSegment& s : segs) {
    if (one_call || s.end <= s.begin) continue;
    LinearAttnState* st = s.cache ? &s.cache->lin[static_cast<size_t>(l)] : nullptr;
    const Tensor xs = xin.slice(s.begin, s.end), ys = qkv.slice(s.begin, s.end);
    const Tensor gs = g.slice(s.begin, s.end), bs = beta.slice(s.begin, s.end);
    if (st && s.cache->keep_rollback) {  // what the replay of a rollback starts from (before the state moves on)
      st->start = s.start;
      st->conv0 = clone(ctx, st->conv);
      st->state0 = clone(ctx, st->state);
      st->x_in = xs;
      st->qkv = ys;
      st->g = gs;
      st->beta = bs;
    } else if (st) {
      st->start = -1;
    }
    ctx.conv1d_causal(xs, w.conv, st ? st->conv : Tensor{}, ys);
    GatedDeltaArgs ga{ys, gs, bs, st ? st->state : Tensor{}, a.num_key_heads, a.key_head_dim, nv, dv, {}};
    ctx.gated_delta_rule(ga, o.slice(s.begin, s.end));
  }
  const Tensor o2 = o.reshape({R * nv, dv}), z2 = z.reshape({R * nv, dv});
  ctx.rmsnorm_gated(o2, w.norm, &z2, static_cast<float>(cfg.rms_norm_eps), false, o2);
  ctx.linear(o.reshape({R, nv * dv}), w.w_out, nullptr, h, 1.0f);  // h += o Wout^T
}

void rollback_linear_state(Context& ctx, const LinearAttnConfig& a, LinearAttnState& s, int64_t keep) {
  DFLASH_CHECK(s.start >= 0 && s.state0.defined(), "linear-attention rollback: the last forward kept no record "
               "(set KVCache::keep_rollback before it)");
  const int64_t T = s.x_in.rows(), P = a.conv_kernel - 1;
  DFLASH_CHECK(keep >= 0 && keep <= T, "linear-attention rollback: keep ", keep, " of the last forward's ", T,
               " tokens");
  if (keep < T) {
    // the window: the last P rows of [conv0 ; x_in[0, keep)]
    if (P > 0) {
      if (keep >= P) {
        ctx.copy(s.conv, s.x_in.slice(keep - P, keep));
      } else {
        ctx.copy(s.conv.slice(0, P - keep), s.conv0.slice(keep, P));
        if (keep > 0) ctx.copy(s.conv.slice(P - keep, P), s.x_in.slice(0, keep));
      }
    }
    // the state: the recurrence over the kept rows from the recorded start
    ctx.copy(s.state, s.state0);
    if (keep > 0) {
      Tensor out = ctx.empty(ctx.compute_dtype(), {keep, a.num_value_heads, a.value_head_dim});
      GatedDeltaArgs ga{s.qkv.slice(0, keep), s.g.slice(0, keep), s.beta.slice(0, keep), s.state,
                        a.num_key_heads, a.key_head_dim, a.num_value_heads, a.value_head_dim, {}};
      ctx.gated_delta_rule(ga, out);
    }
  }
  s.start = -1;
  s.conv0 = s.state0 = s.x_in = s.qkv = s.g = s.beta = Tensor{};
}

int64_t linear_attention_params(const ModelConfig& cfg) {
  const LinearAttnConfig& a = cfg.linear_attn;
  const int64_t H = cfg.hidden_size, C = a.conv_dim(), VD = a.value_dim(), nv = a.num_value_heads;
  return H * C + H * VD + 2 * nv * H + C * a.conv_kernel + 2 * nv + a.value_head_dim + H * VD;
}

}  // namespace dflash
