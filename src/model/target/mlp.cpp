// model/target/mlp.cpp — the dense and Mixture-of-Experts channel mixers (model/target/mlp.h).
#include "model/target/mlp.h"

#include <cstring>

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

namespace {

// Row r of the gate-rows-first layout [2I rows] is row 2r (gate, r < I) or 2(r - I) + 1 (up) of HF's gpt-oss layout,
// whose gate / up alternate (GptOssExperts._apply_gate: gate_up[..., ::2], gate_up[..., 1::2]).
int64_t interleaved_row(int64_t r, int64_t I) { return r < I ? 2 * r : 2 * (r - I) + 1; }

// t [E, 2I, C] (host, any dtype) with its rows de-interleaved: gate rows, then up rows.
Tensor gate_rows_first(const Tensor& t) {
  const int64_t E = t.shape[0], N2 = t.shape[1], I = N2 / 2;
  const size_t row = t.nbytes() / static_cast<size_t>(E * N2);
  Tensor out = cpu_empty(t.dtype, t.shape);
  const auto* in = static_cast<const uint8_t*>(t.data);
  auto* o = static_cast<uint8_t*>(out.data);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < N2; ++r)
      std::memcpy(o + (e * N2 + r) * row, in + (e * N2 + interleaved_row(r, I)) * row, row);
  return out;
}

// t [E, A, B] F32 (host) -> [E, B, A]
Tensor transpose_last(const Tensor& t) {
  const int64_t E = t.shape[0], A = t.shape[1], B = t.shape[2];
  Tensor out = cpu_empty(DType::F32, {E, B, A});
  const float* in = t.ptr<float>();
  float* o = out.ptr<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b) o[(e * B + b) * A + a] = in[(e * A + a) * B + b];
  return out;
}

// One gpt-oss projection `name` (gate_up_proj or down_proj) in MoeWeights' layout on the device: rows [E, N, K]
// (N = 2I gate rows first for gate_up), plain (HF's [E, K, N] transposed) or MXFP4, then its bias [E, N].
MoeWeights load_gpt_oss_projection(WeightSource& src, const std::string& name, int64_t E, int64_t N, int64_t K,
                                   bool gate_up, bool mxfp4) {
  Context& ctx = src.ctx();
  MoeWeights w;
  if (mxfp4) {
    DFLASH_CHECK(!src.has(name), name, " is a plain tensor but config.json's quantization_config says mxfp4 (",
                 name, "_blocks / _scales expected)");
    Mxfp4Rows q = src.mxfp4(name, E, N, K);
    w.w = ctx.to_device(gate_up ? gate_rows_first(q.blocks) : q.blocks);
    w.scales = ctx.to_device(gate_up ? gate_rows_first(q.scales) : q.scales);
  } else if (src.random()) {
    w.w = src.matrix(name, {E, N, K});  // drawn in the device layout (WeightSource::random)
  } else {
    DFLASH_CHECK(!src.has(name + "_blocks"), name, "_blocks (MXFP4) found but config.json has no quantization_config "
                 "{\"quant_method\": \"mxfp4\"}");
    const Tensor rows = transpose_last(src.host_f32(name, {E, K, N}));  // [E, N, K]
    w.w = ctx.to_device(gate_up ? gate_rows_first(rows) : rows, ctx.compute_dtype());
  }
  const Tensor bias = src.host_f32(name + "_bias", {E, N});
  w.bias = ctx.to_device(gate_up ? gate_rows_first(bias.reshape({E, N, 1})).reshape({E, N}) : bias,
                         ctx.compute_dtype());
  return w;
}

}  // namespace

MoeLayerWeights load_moe(WeightSource& src, const std::string& p, const WeightNames& n, int64_t H, const MoeConfig& m,
                         bool mxfp4) {
  const int64_t E = m.num_experts, I = m.expert_width;
  Context& ctx = src.ctx();
  MoeLayerWeights w;
  w.router = src.matrix(p + n.router, {E, H});
  const std::string ex = p + n.expert;
  if (m.gpt_oss_experts) {
    w.router_bias = src.matrix(p + n.router_bias, {E});
    w.gate_up = load_gpt_oss_projection(src, ex + "gate_up_proj", E, 2 * I, H, true, mxfp4);
    w.down = load_gpt_oss_projection(src, ex + "down_proj", E, H, I, false, mxfp4);
    return w;
  }
  DFLASH_CHECK(!mxfp4, p, ": MXFP4 experts are read for gpt-oss only");
  if (src.has(ex + "gate_up_proj")) {
    w.gate_up = src.matrix(ex + "gate_up_proj", {E, 2 * I, H});
    w.down = src.matrix(ex + "down_proj", {E, H, I});
    return w;
  }
  w.gate_up = ctx.empty(ctx.compute_dtype(), {E, 2 * I, H});
  w.down = ctx.empty(ctx.compute_dtype(), {E, H, I});
  src.stack_experts(w.gate_up.w, 0, ex, "gate_proj.weight", {I, H});
  src.stack_experts(w.gate_up.w, I, ex, "up_proj.weight", {I, H});
  src.stack_experts(w.down.w, 0, ex, "down_proj.weight", {H, I});
  return w;
}

Tensor moe_forward(Context& ctx, const MoeLayerWeights& w, const MoeConfig& m, const Tensor& x, const Tensor& h) {
  const int64_t R = x.rows(), E = m.num_experts, k = m.top_k, I = m.expert_width, H = x.shape.back();
  const DType dt = ctx.compute_dtype();
  Tensor logits = ctx.empty(dt, {R, E});
  // in the activation dtype, as transformers' router (then fp32 softmax); gpt-oss with the router's bias
  ctx.linear(x, w.router, w.router_bias.defined() ? &w.router_bias : nullptr, logits);
  Tensor idx = ctx.empty(DType::I32, {R, k});
  Tensor weights = ctx.empty(ctx.param_dtype(), {R, k});
  // gpt-oss: softmax over the top-k logits; moe_route's softmax over all E renormalised over the top k is the same
  // number, exp(z_j - m) / sum_{i in top k} exp(z_i - m), so norm_topk_prob (true for gpt-oss) covers both
  ctx.moe_route(logits, k, m.norm_topk_prob, idx, weights);
  Tensor offsets = ctx.empty(DType::I32, {E + 1});
  Tensor rows = ctx.empty(DType::I32, {R * k});
  Tensor slot = ctx.empty(DType::I32, {R * k});
  ctx.moe_group(idx, offsets, rows, slot);
  Tensor act = ctx.empty(dt, {R * k, I});
  ctx.moe_linear(x, &rows, w.gate_up, offsets, act, m.gpt_oss_experts ? MoeAct::GptOssGLU : MoeAct::SwiGLU);
  Tensor y = ctx.empty(dt, {R * k, H});
  ctx.moe_linear(act, nullptr, w.down, offsets, y, MoeAct::None);  // (+ the down bias of gpt-oss)
  ctx.moe_combine(y, slot, weights, h, 1.0f);  // h += sum_j p_j y_j
  return idx;
}

MlpParams mlp_params(const ModelConfig& cfg, const LayerSpec& spec) {
  const int64_t H = cfg.hidden_size, I = spec.mlp_width;
  if (spec.mlp == ChannelMixer::Dense) return {3 * H * I, 3 * H * I, 0};
  const int64_t E = cfg.moe.num_experts, k = cfg.moe.top_k;
  const int64_t router = E * H + (cfg.moe.gpt_oss_experts ? E : 0);
  const int64_t bias = cfg.moe.gpt_oss_experts ? 2 * I + H : 0;  // one expert's gate_up and down biases
  const int64_t mx = cfg.quant_method == "mxfp4" ? E * 3 * H * I : 0;
  return {router + E * (3 * H * I + bias), router + k * (3 * H * I + bias), mx};
}

}  // namespace dflash
