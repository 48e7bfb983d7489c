// model/target/mlp.cpp — the dense and Mixture-of-Experts channel mixers (model/target/mlp.h).
#include "model/target/mlp.h"

#include <cmath>
#include <cstring>
#include <optional>

namespace dflash {

DenseMlpWeights load_dense_mlp(WeightSource& src, const std::string& p, const WeightNames& n, int64_t H, int64_t I) {
  DenseMlpWeights w;
  w.w_gate = src.linear(p + n.gate, {I, H});
  w.w_up = src.linear(p + n.up, {I, H});
  w.w_down = src.linear(p + n.down, {H, I});
  return w;
}

void dense_mlp_forward(Context& ctx, const DenseMlpWeights& w, const Tensor& x, const Tensor& h, MlpAct act) {
  const int64_t R = x.rows(), I = w.w_gate.rows();
  Tensor g = ctx.empty(ctx.compute_dtype(), {R, I});
  Tensor u = ctx.empty(ctx.compute_dtype(), {R, I});
  ctx.linear(x, w.w_gate, nullptr, g);
  ctx.linear(x, w.w_up, nullptr, u);
  if (act == MlpAct::GeluTanh) {
    ctx.gelu_tanh_mul(g, u, g);
  } else {
    ctx.silu_mul(g, u, g);
  }
  ctx.linear(g, w.w_down, nullptr, h, 1.0f);  // h += down(...)
}

namespace {

// One projection `name` (gate_up_proj or down_proj) stored in ExpertsLayout::InterleavedColumns, in MoeWeights'
// layout on the device: rows [E, N, K] (N = 2I gate rows first for gate_up), plain (the stored [E, K, N] transposed)
// or MXFP4, then its bias [E, N]. The conversions are io's (io/model_family.h).
MoeWeights load_interleaved_projection(WeightSource& src, const std::string& name, int64_t E, int64_t N, int64_t K,
                                       bool gate_up, WeightFormat format) {
  Context& ctx = src.ctx();
  MoeWeights w;
  if (format == WeightFormat::MXFP4) {
    DFLASH_CHECK(!src.has(name), name, " is a plain tensor but config.json's quantization_config says mxfp4 (",
                 name, "_blocks / _scales expected)");
    Mxfp4Rows q = src.mxfp4(name, E, N, K);
    w.w = ctx.to_device(gate_up ? gate_up_rows_first(q.blocks) : q.blocks);
    w.scales = ctx.to_device(gate_up ? gate_up_rows_first(q.scales) : q.scales);
  } else if (src.random()) {
    w.w = src.matrix(name, {E, N, K});  // drawn in the device layout (WeightSource::random)
  } else {
    DFLASH_CHECK(!src.has(name + "_blocks"), name, "_blocks (MXFP4) found but config.json has no quantization_config "
                 "declaring ", weight_format_name(WeightFormat::MXFP4));
    const Tensor rows = columns_to_rows(src.host_f32(name, {E, K, N}));  // [E, N, K]
    w.w = ctx.to_device(gate_up ? gate_up_rows_first(rows) : rows, ctx.compute_dtype());
  }
  const Tensor bias = src.host_f32(name + "_bias", {E, N});
  w.bias = ctx.to_device(gate_up ? gate_up_rows_first(bias.reshape({E, N, 1})).reshape({E, N}) : bias,
                         ctx.compute_dtype());
  return w;
}

// Per-expert FP8 projections (an FP8 checkpoint's experts.{e}.gate_proj.weight, ...) kept FP8: gate and up rows of
// every expert stacked as [E 2I, H], down as [E H, I], with their scale rows; possible when every expert's rows
// start a block (I and H multiples of the block rows). False (nothing loaded) when the experts are not FP8 or their
// blocks straddle experts: the caller stacks them dequantised.
bool load_fp8_experts(WeightSource& src, const std::string& ex, const WeightNames& n, int64_t E, int64_t H,
                      int64_t I, MoeLayerWeights& w) {
  const std::optional<LinearWeight> g0 = src.fp8_host_if(cat(ex, 0, ".", n.expert_gate), {I, H});
  if (!g0 || I % g0->block_n != 0 || H % g0->block_n != 0) return false;
  const int64_t bn = g0->block_n;
  auto stack = [&](const std::vector<std::string>& parts, int64_t rows, int64_t K) {
    LinearWeight out;
    const int64_t per = static_cast<int64_t>(parts.size()) * rows;  // rows per expert
    out.w = cpu_empty(DType::F8E4M3, {E * per, K});
    int64_t kb = 0, r = 0, sr = 0;
    for (int64_t e = 0; e < E; ++e)
      for (const std::string& part : parts) {
        const std::optional<LinearWeight> q = src.fp8_host_if(cat(ex, e, ".", part), {rows, K});
        DFLASH_CHECK(q && q->block_n == bn, ex, e, ".", part, ": expected FP8 like ", ex, "0.", n.expert_gate);
        if (!out.scale.defined()) {
          kb = q->scale.shape[1];
          out.scale = cpu_empty(DType::F32, {E * per / bn, kb});
          out.block_n = bn;
          out.block_k = q->block_k;
        }
        std::memcpy(out.w.ptr<uint8_t>() + r * K, q->w.ptr<uint8_t>(), static_cast<size_t>(rows * K));
        std::memcpy(out.scale.ptr<float>() + sr * kb, q->scale.ptr<float>(), static_cast<size_t>(rows / bn * kb) * 4);
        r += rows;
        sr += rows / bn;
      }
    out.w = src.ctx().to_device(out.w);
    out.scale = src.ctx().to_device(out.scale);
    return out;
  };
  w.gate_up_fp8 = stack({n.expert_gate, n.expert_up}, I, H);
  w.down_fp8 = stack({n.expert_down}, H, I);
  return true;
}

}  // namespace

namespace {

// Gemma 4's experts (MoeConfig::router_scales): the router's weight with its input scale folded in, Wr[e, c] scale[c]
// H^-1/2 (the router then reads the weightless RMSNorm of its input), and the fused experts with the per-expert scale
// folded into each expert's down rows (p_j s_e down_e(..) = p_j (s_e down_e)(..)). A random target draws the router
// and the experts and keeps both scales 1.
MoeLayerWeights load_scaled_moe(WeightSource& src, const std::string& p, const WeightNames& n, int64_t H,
                                const MoeConfig& m) {
  const int64_t E = m.num_experts, I = m.expert_width;
  Context& ctx = src.ctx();
  const std::string ex = p + n.expert;
  DFLASH_CHECK(m.expert_format == WeightFormat::Plain && !m.expert_bias && !m.router_bias, p,
               ": scaled routers are read with plain experts without biases");
  MoeLayerWeights w;
  if (src.random()) {
    w.router = src.matrix(p + n.router, {E, H});
    w.gate_up = src.matrix(ex + "gate_up_proj", {E, 2 * I, H});
    w.down = src.matrix(ex + "down_proj", {E, H, I});
    return w;
  }
  Tensor router = src.host_f32(p + n.router, {E, H});
  const Tensor scale = src.host_f32(p + n.router_scale, {H});
  const Tensor per_expert = src.host_f32(p + n.per_expert_scale, {E});
  const double root = 1.0 / std::sqrt(static_cast<double>(H));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t c = 0; c < H; ++c)
      router.ptr<float>()[e * H + c] = static_cast<float>(static_cast<double>(router.ptr<float>()[e * H + c]) *
                                                          scale.ptr<float>()[c] * root);
  w.router = ctx.to_device(router, ctx.compute_dtype());
  w.gate_up = src.matrix(ex + "gate_up_proj", {E, 2 * I, H});
  Tensor down = src.host_f32(ex + "down_proj", {E, H, I});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < H * I; ++i) down.ptr<float>()[e * H * I + i] *= per_expert.ptr<float>()[e];
  w.down = ctx.to_device(down, ctx.compute_dtype());
  return w;
}

}  // namespace

MoeLayerWeights load_moe(WeightSource& src, const std::string& p, const WeightNames& n, int64_t H, const MoeConfig& m) {
  if (m.router_scales) return load_scaled_moe(src, p, n, H, m);
  const int64_t E = m.num_experts, I = m.expert_width;
  Context& ctx = src.ctx();
  MoeLayerWeights w;
  w.router = src.matrix(p + n.router, {E, H});
  if (m.router_bias) w.router_bias = src.matrix(p + n.router_bias, {E});
  if (m.score_correction_bias) w.score_bias = src.f32(p + n.router_score_bias, {E});
  const std::string ex = p + n.expert;
  if (n.experts_layout == ExpertsLayout::InterleavedColumns) {
    DFLASH_CHECK(m.expert_bias, p, ": experts stored as interleaved columns are read with their biases");
    w.gate_up = load_interleaved_projection(src, ex + "gate_up_proj", E, 2 * I, H, true, m.expert_format);
    w.down = load_interleaved_projection(src, ex + "down_proj", E, H, I, false, m.expert_format);
    return w;
  }
  if (m.expert_format == WeightFormat::INT4) {  // per-expert pack-quantized linears, kept INT4 (stack_int4_experts)
    DFLASH_CHECK(!m.expert_bias, p, ": INT4 experts with biases are not read");
    auto int4_rows = [&](int64_t rows, int64_t K) {
      MoeWeights q;
      q.int4_group = m.int4_group > 0 ? m.int4_group : K;
      DFLASH_CHECK(K % q.int4_group == 0 && q.int4_group % 32 == 0, p, ": INT4 experts of ", K,
                   " columns in groups of ", q.int4_group, " (the grouped GEMM needs groups of a multiple of 32 "
                   "dividing K)");
      q.w = ctx.empty(DType::U8, {E, rows, K / 2});
      q.scales = ctx.empty(DType::BF16, {E, rows, K / q.int4_group});
      return q;
    };
    w.gate_up = int4_rows(2 * I, H);
    w.down = int4_rows(H, I);
    src.stack_int4_experts(w.gate_up, 0, ex, n.expert_gate, {I, H});
    src.stack_int4_experts(w.gate_up, I, ex, n.expert_up, {I, H});
    src.stack_int4_experts(w.down, 0, ex, n.expert_down, {H, I});
    return w;
  }
  DFLASH_CHECK(m.expert_format == WeightFormat::Plain && !m.expert_bias, p, ": ",
               weight_format_name(m.expert_format), " experts", m.expert_bias ? " with biases" : "",
               " are read in the interleaved-columns layout only (io/model_family.h ExpertsLayout)");
  if (src.has(ex + "gate_up_proj")) {
    w.gate_up = src.matrix(ex + "gate_up_proj", {E, 2 * I, H});
    w.down = src.matrix(ex + "down_proj", {E, H, I});
    return w;
  }
  if (load_fp8_experts(src, ex, n, E, H, I, w)) return w;
  w.gate_up = ctx.empty(ctx.compute_dtype(), {E, 2 * I, H});
  w.down = ctx.empty(ctx.compute_dtype(), {E, H, I});
  src.stack_experts(w.gate_up.w, 0, ex, n.expert_gate, {I, H});
  src.stack_experts(w.gate_up.w, I, ex, n.expert_up, {I, H});
  src.stack_experts(w.down.w, 0, ex, n.expert_down, {H, I});
  return w;
}

Tensor moe_forward(Context& ctx, const MoeLayerWeights& w, const MoeConfig& m, const Tensor& x, const Tensor& h,
                   const Tensor* router_x) {
  const int64_t R = x.rows(), E = m.num_experts, k = m.top_k, I = m.expert_width, H = x.shape.back();
  const DType dt = ctx.compute_dtype();
  Tensor logits = ctx.empty(dt, {R, E});
  // in the activation dtype, as transformers' router (then fp32 softmax); with the router's bias when it has one
  ctx.linear(router_x ? *router_x : x, w.router, w.router_bias.defined() ? &w.router_bias : nullptr, logits);
  Tensor idx = ctx.empty(DType::I32, {R, k});
  Tensor weights = ctx.empty(ctx.param_dtype(), {R, k});
  // RouterKind::TopKSoftmax, the softmax over the top-k logits, is moe_route's softmax over all E renormalised over
  // the top k: the same number, exp(z_j - m) / sum_{i in top k} exp(z_i - m)
  // RouterKind::SigmoidTopK: sigmoid scores, the correction bias choosing only (MoeRouteOpts)
  MoeRouteOpts ro;
  if (m.router == RouterKind::SigmoidTopK) {
    ro.score = MoeScore::Sigmoid;
    ro.choice_bias = w.score_bias;
    ro.n_group = m.n_group;
    ro.topk_group = m.topk_group;
    ro.scale = m.routed_scaling_factor;
  }
  ctx.moe_route(logits, k, m.norm_topk_prob || m.router == RouterKind::TopKSoftmax, idx, weights, ro);
  Tensor offsets = ctx.empty(DType::I32, {E + 1});
  Tensor rows = ctx.empty(DType::I32, {R * k});
  Tensor slot = ctx.empty(DType::I32, {R * k});
  ctx.moe_group(idx, offsets, rows, slot);
  Tensor act = ctx.empty(dt, {R * k, I});
  // FP8 experts: this layer's, dequantised for the bf16 grouped GEMM (a scratch freed after the layer)
  const MoeWeights gate_up = w.gate_up_fp8.defined() ? MoeWeights(ctx.dequantize_fp8(w.gate_up_fp8).reshape({E, 2 * I, H}))
                                                      : w.gate_up;
  if (m.act == ExpertAct::GeluTanh) {  // the GEMM without an epilogue, then the GeGLU on its gate and up halves
    Tensor gu = ctx.empty(dt, {R * k, 2 * I}), u = ctx.empty(dt, {R * k, I});
    ctx.moe_linear(x, &rows, gate_up, offsets, gu, MoeAct::None);
    ctx.gather_columns(act, gu, 0);
    ctx.gather_columns(u, gu, I);
    ctx.gelu_tanh_mul(act, u, act);
  } else {
    ctx.moe_linear(x, &rows, gate_up, offsets, act,
                   m.act == ExpertAct::ClampedSwiGLU ? MoeAct::ClampedSwiGLU : MoeAct::SwiGLU);
  }
  Tensor y = ctx.empty(dt, {R * k, H});
  const MoeWeights down = w.down_fp8.defined() ? MoeWeights(ctx.dequantize_fp8(w.down_fp8).reshape({E, H, I})) : w.down;
  ctx.moe_linear(act, nullptr, down, offsets, y, MoeAct::None);  // (+ the down bias with expert_bias)
  ctx.moe_combine(y, slot, weights, h, 1.0f);  // h += sum_j p_j y_j
  return idx;
}

MlpParams mlp_params(const ModelConfig& cfg, const LayerSpec& spec) {
  const int64_t H = cfg.hidden_size, I = spec.mlp_width;
  if (spec.mlp == ChannelMixer::Dense) return {3 * H * I, 3 * H * I, 0};
  const int64_t E = cfg.moe.num_experts, k = cfg.moe.top_k;
  const int64_t router = E * H + (cfg.moe.router_bias ? E : 0) + (cfg.moe.score_correction_bias ? E : 0);
  const int64_t bias = cfg.moe.expert_bias ? 2 * I + H : 0;  // one expert's gate_up and down biases
  const int64_t mx = cfg.moe.expert_format == WeightFormat::MXFP4 ? E * 3 * H * I : 0;
  // Gemma 4: the router's two scales; the dense MLP beside the experts and the block's three extra norms
  const int64_t extra = (cfg.moe.router_scales ? H + E : 0) +
                        (cfg.moe.dense_beside_width > 0 ? 3 * H * cfg.moe.dense_beside_width + 3 * H : 0);
  const bool q4 = cfg.moe.expert_format == WeightFormat::INT4;
  const int64_t g = cfg.moe.int4_group;  // 0: one scale per row
  const int64_t int4_scales = !q4 ? 0 : g > 0 ? E * 3 * H * I / g : E * (2 * I + H);
  return {router + E * (3 * H * I + bias) + extra, router + k * (3 * H * I + bias) + extra, mx, q4 ? E * 3 * H * I : 0,
          int4_scales};
}

}  // namespace dflash
