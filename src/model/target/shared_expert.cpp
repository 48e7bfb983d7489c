// model/target/shared_expert.cpp — the shared expert (model/target/shared_expert.h).
#include "model/target/shared_expert.h"

namespace dflash {

SharedExpertWeights load_shared_expert(WeightSource& src, const std::string& p, const WeightNames& n, int64_t H,
                                       int64_t width, bool gated) {
  WeightNames se = n;  // the dense MLP's names under the shared expert's prefix
  se.gate = n.shared_expert + "gate_proj.weight";
  se.up = n.shared_expert + "up_proj.weight";
  se.down = n.shared_expert + "down_proj.weight";
  SharedExpertWeights w;
  w.mlp = load_dense_mlp(src, p, se, H, width);
  if (gated) w.gate = src.matrix(p + n.shared_expert_gate, {1, H});
  return w;
}

void shared_expert_forward(Context& ctx, const SharedExpertWeights& w, const Tensor& x, const Tensor& h) {
  if (!w.gate.defined()) {
    dense_mlp_forward(ctx, w.mlp, x, h);
    return;
  }
  const int64_t R = x.rows(), I = w.mlp.w_gate.rows();
  const DType dt = ctx.compute_dtype();
  Tensor g = ctx.empty(dt, {R, I}), u = ctx.empty(dt, {R, I}), s = ctx.empty(dt, {R, 1});
  ctx.linear(x, w.mlp.w_gate, nullptr, g);
  ctx.linear(x, w.mlp.w_up, nullptr, u);
  ctx.silu_mul(g, u, g);
  ctx.linear(x, w.gate, nullptr, s);
  ctx.sigmoid_gate(g, s);
  ctx.linear(g, w.mlp.w_down, nullptr, h, 1.0f);  // h += down(sigmoid(s) * act)
}

int64_t shared_expert_params(int64_t H, int64_t width, bool gated) { return 3 * H * width + (gated ? H : 0); }

}  // namespace dflash
