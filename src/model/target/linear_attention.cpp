// model/target/linear_attention.cpp — the Gated DeltaNet token mixer (model/target/linear_attention.h): its
// descriptor kGatedDeltaNetMixer for the table of model/target/mixer.h, its cache state and the rollback.
#include "model/target/linear_attention.h"

#include <vector>

#include "io/model_family_hybrid.h"
#include "model/target/mixer.h"

namespace dflash {

namespace {

// What a forward with KVCache::keep_rollback leaves in LayerCache::record: the shapes, the cache's len before it, the
// window and state it started from (copies), and its rows' inputs (views of the forward's buffers): the convolution's
// x_in [T, C] act and the delta rule's qkv [T, C] act, g, beta [T, nv] param dtype.
struct Record {
  LinearAttnConfig shape;
  int64_t start = 0;
  Tensor conv0, state0, x_in, qkv, g, beta;
};

// A copy of t on ctx's device (same dtype).
Tensor clone(Context& ctx, const Tensor& t) {
  Tensor c = ctx.empty(t.dtype, t.shape);
  ctx.copy(c, t);
  return c;
}

MixerWeights load(WeightSource& src, const std::string& prefix, const WeightNames& n, const ModelConfig& cfg,
                  const LayerSpec&) {
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

std::string missing(const MixerWeights& mw, const LayerSpec&) {
  const LinearAttnWeights* w = std::any_cast<LinearAttnWeights>(&mw);
  return w && w->w_qkv.defined() ? "" : "the weights of its linear attention are missing";
}

void forward(Context& ctx, const MixerWeights& mw, const MixerArgs& args, const Tensor& h) {
  const LinearAttnWeights& w = mixer_weights<LinearAttnWeights>(mw, "linear attention");
  const LinearAttnConfig& a = args.cfg.linear_attn;
  const Tensor& x = args.x;
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
  for (const SeqSegment& s : args.segs)
    if (!s.cache && s.begin == packed.back() && s.end >= s.begin) packed.push_back(s.end);
  const bool one_call = packed.size() > 2 && packed.back() == R && packed.size() == args.segs.size() + 1;
  if (one_call) {
    ctx.conv1d_causal(xin, w.conv, Tensor{}, qkv, packed);
    ctx.gated_delta_rule({qkv, g, beta, Tensor{}, a.num_key_heads, a.key_head_dim, nv, dv, packed}, o);
  }
  for (const SeqSegment& s : args.segs) {
    if (one_call || s.end <= s.begin) continue;
    LayerCache* st = s.cache ? &s.cache->layers[static_cast<size_t>(args.layer)] : nullptr;
    const Tensor xs = xin.slice(s.begin, s.end), ys = qkv.slice(s.begin, s.end);
    const Tensor gs = g.slice(s.begin, s.end), bs = beta.slice(s.begin, s.end);
    if (st && s.cache->keep_rollback) {  // what the replay of a rollback starts from (before the state moves on)
      st->record = Record{a, s.start, clone(ctx, st->conv), clone(ctx, st->state), xs, ys, gs, bs};
    } else if (st) {
      st->record.reset();
    }
    ctx.conv1d_causal(xs, w.conv, st ? st->conv : Tensor{}, ys);
    GatedDeltaArgs ga{ys, gs, bs, st ? st->state : Tensor{}, a.num_key_heads, a.key_head_dim, nv, dv, {}};
    ctx.gated_delta_rule(ga, o.slice(s.begin, s.end));
  }
  const Tensor o2 = o.reshape({R * nv, dv}), z2 = z.reshape({R * nv, dv});
  ctx.rmsnorm_gated(o2, w.norm, &z2, static_cast<float>(args.cfg.rms_norm_eps), false, o2);
  ctx.linear(o.reshape({R, nv * dv}), w.w_out, nullptr, h, 1.0f);  // h += o Wout^T
}

int64_t params(const ModelConfig& cfg, const LayerSpec&) {
  const LinearAttnConfig& a = cfg.linear_attn;
  const int64_t H = cfg.hidden_size, C = a.conv_dim(), VD = a.value_dim(), nv = a.num_value_heads;
  return H * C + H * VD + 2 * nv * H + C * a.conv_kernel + 2 * nv + a.value_head_dim + H * VD;
}

LayerCache make_cache(Context& ctx, const ModelConfig& cfg, const LayerSpec&, int64_t) {
  const LinearAttnConfig& a = cfg.linear_attn;
  LayerCache c;
  c.conv = ctx.zeros(ctx.compute_dtype(), {a.conv_kernel - 1, a.conv_dim()});
  c.state = ctx.zeros(ctx.param_dtype(), {a.num_value_heads, a.key_head_dim, a.value_head_dim});
  return c;
}

// c's window and state after the first `keep` of the T rows of the recorded forward r (0 <= keep <= T), by replaying
// the convolution and the recurrence from r's start.
void rollback(Context& ctx, LayerCache& c, const Record& r, int64_t keep) {
  const LinearAttnConfig& a = r.shape;
  const int64_t T = r.x_in.rows(), P = a.conv_kernel - 1;
  DFLASH_CHECK(keep >= 0 && keep <= T, "linear-attention rollback: keep ", keep, " of the last forward's ", T,
               " tokens");
  if (keep == T) return;
  // the window: the last P rows of [conv0 ; x_in[0, keep)]
  if (P > 0) {
    if (keep >= P) {
      ctx.copy(c.conv, r.x_in.slice(keep - P, keep));
    } else {
      ctx.copy(c.conv.slice(0, P - keep), r.conv0.slice(keep, P));
      if (keep > 0) ctx.copy(c.conv.slice(P - keep, P), r.x_in.slice(0, keep));
    }
  }
  // the state: the recurrence over the kept rows from the recorded start
  ctx.copy(c.state, r.state0);
  if (keep > 0) {
    Tensor out = ctx.empty(ctx.compute_dtype(), {keep, a.num_value_heads, a.value_head_dim});
    GatedDeltaArgs ga{r.qkv.slice(0, keep), r.g.slice(0, keep), r.beta.slice(0, keep), c.state,
                      a.num_key_heads, a.key_head_dim, a.num_value_heads, a.value_head_dim, {}};
    ctx.gated_delta_rule(ga, out);
  }
}

// Rolls the window and state back into the last forward (its record), then drops the record; new_len == len only
// drops it.
void truncate(Context& ctx, LayerCache& c, int64_t len, int64_t new_len) {
  if (new_len != len) {
    const Record* r = std::any_cast<Record>(&c.record);
    DFLASH_CHECK(r && new_len >= r->start, "KVCache::truncate to ", new_len, " of ", len,
                 ": a linear-attention state rolls back only into the last forward (positions ",
                 r ? cat(r->start, " .. ", len) : std::string("none recorded: set keep_rollback"), ")");
    rollback(ctx, c, *r, new_len - r->start);
  }
  c.record.reset();
}

// "Gated DeltaNet (16 key heads x 128, 32 value heads x 128, conv 4)"
std::string describe(const ModelConfig& c, const LayerSpec&) {
  const LinearAttnConfig& l = c.linear_attn;
  return cat("Gated DeltaNet (", l.num_key_heads, " key heads x ", l.key_head_dim, ", ", l.num_value_heads,
             " value heads x ", l.value_head_dim, ", conv ", l.conv_kernel, ")");
}

std::vector<std::pair<const char*, int64_t>> info_keys(const ModelConfig& c) {
  const LinearAttnConfig& l = c.linear_attn;
  return {{"linear_num_key_heads", l.num_key_heads}, {"linear_num_value_heads", l.num_value_heads},
          {"linear_key_head_dim", l.key_head_dim}, {"linear_value_head_dim", l.value_head_dim},
          {"linear_conv_kernel_dim", l.conv_kernel}};
}

}  // namespace

extern const TokenMixerKind kGatedDeltaNetMixer = {
    .kind = TokenMixer::LinearAttention,
    .name = "linear attention",
    .load = load,
    .missing = missing,
    .forward = forward,
    .params = params,
    .make_cache = make_cache,
    .truncate = truncate,
    .describe = describe,
    .info_key = "linear_attention",
    .info_keys = info_keys,
};

}  // namespace dflash
