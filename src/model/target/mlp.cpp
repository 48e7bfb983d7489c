// model/target/mlp.cpp — the dense and Mixture-of-Experts channel mixers (model/target/mlp.h).
#include "model/target/mlp.h"

namespace dflash {

DenseMlpWeights load_dense_mlp(WeightSource& src, const std::string& p, const WeightNames& n, int64_t H, int64_t I) {
  DenseMlpWeights w;
  w.w_gate = src.matrix(p + n.gate, {I, H});
  w.w_up = src.matrix(p + n.up, {I, H});
  w.w_down = src.matrix(p + n.down, {H, I});
  return w;
}

void dense_mlp_forward(Context& ctx, const DenseMlpWeights& w, const Tensor& x, const Tensor& h) {
  const int64_t R = x.rows(), I = w.w_gate.shape[0];
  Tensor g = ctx.empty(ctx.compute_dtype(), {R, I});
  Tensor u = ctx.empty(ctx.compute_dtype(), {R, I});
  ctx.linear(x, w.w_gate, nullptr, g);
  ctx.linear(x, w.w_up, nullptr, u);
  ctx.silu_mul(g, u, g);
  ctx.linear(g, w.w_down, nullptr, h, 1.0f);  // h += down(...)
}

MoeWeights load_moe(WeightSource& src, const std::string& p, const WeightNames& n, int64_t H, const MoeConfig& m) {
  const int64_t E = m.num_experts, I = m.expert_width;
  Context& ctx = src.ctx();
  MoeWeights w;
  w.router = src.matrix(p + n.router, {E, H});
  const std::string ex = p + n.expert;
  if (src.has(ex + "gate_up_proj")) {
    w.gate_up = src.matrix(ex + "gate_up_proj", {E, 2 * I, H});
    w.down = src.matrix(ex + "down_proj", {E, H, I});
    return w;
  }
  w.gate_up = ctx.empty(ctx.compute_dtype(), {E, 2 * I, H});
  w.down = ctx.empty(ctx.compute_dtype(), {E, H, I});
  src.stack_experts(w.gate_up, 0, ex, "gate_proj.weight", {I, H});
  src.stack_experts(w.gate_up, I, ex, "up_proj.weight", {I, H});
  src.stack_experts(w.down, 0, ex, "down_proj.weight", {H, I});
  return w;
}

Tensor moe_forward(Context& ctx, const MoeWeights& w, const MoeConfig& m, const Tensor& x, const Tensor& h) {
  const int64_t R = x.rows(), E = m.num_experts, k = m.top_k, I = m.expert_width, H = x.shape.back();
  const DType dt = ctx.compute_dtype();
  Tensor logits = ctx.empty(dt, {R, E});
  ctx.linear(x, w.router, nullptr, logits);  // in the activation dtype, as transformers' router (then fp32 softmax)
  Tensor idx = ctx.empty(DType::I32, {R, k});
  Tensor weights = ctx.empty(ctx.param_dtype(), {R, k});
  ctx.moe_route(logits, k, m.norm_topk_prob, idx, weights);
  Tensor offsets = ctx.empty(DType::I32, {E + 1});
  Tensor rows = ctx.empty(DType::I32, {R * k});
  Tensor slot = ctx.empty(DType::I32, {R * k});
  ctx.moe_group(idx, offsets, rows, slot);
  Tensor act = ctx.empty(dt, {R * k, I});
  ctx.moe_linear(x, &rows, w.gate_up, offsets, act, MoeAct::SwiGLU);
  Tensor y = ctx.empty(dt, {R * k, H});
  ctx.moe_linear(act, nullptr, w.down, offsets, y, MoeAct::None);
  ctx.moe_combine(y, slot, weights, h, 1.0f);  // h += sum_j p_j y_j
  return idx;
}

MlpParams mlp_params(const ModelConfig& cfg, const LayerSpec& spec) {
  const int64_t H = cfg.hidden_size, I = spec.mlp_width;
  if (spec.mlp == ChannelMixer::Dense) return {3 * H * I, 3 * H * I};
  const int64_t E = cfg.moe.num_experts, k = cfg.moe.top_k;
  return {E * H + E * 3 * H * I, E * H + k * 3 * H * I};
}

}  // namespace dflash
