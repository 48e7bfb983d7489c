// model/target/shared_expert.h — the shared expert of Qwen3-Next / Qwen3.5-MoE layers (transformers'
// Qwen3NextSparseMoeBlock): beside the routed experts (model/target/mlp.h), every token goes through one more SwiGLU,
// scaled by a per-token sigmoid gate:
//   h += sigmoid(x Wsg^T) * down(silu(gate(x)) * up(x))          Wsg [1, H], width MoeConfig::shared_expert_width
// defines: SharedExpertWeights, load_shared_expert, shared_expert_forward, shared_expert_params
#pragma once
#include <string>

#include "backend/context.h"
#include "model/target/mlp.h"

namespace dflash {

struct SharedExpertWeights {
  DenseMlpWeights mlp;  // [I, H], [I, H], [H, I]
  Tensor gate;          // [1, H]
};

// prefix + names.shared_expert + {gate,up,down}_proj.weight, prefix + names.shared_expert_gate. Calls: gate, up, down,
// the gate vector.
SharedExpertWeights load_shared_expert(WeightSource& src, const std::string& prefix, const WeightNames& names,
                                       int64_t H, int64_t width);
// h [R, H] += the shared expert of x [R, H] act. The gate is applied to the SwiGLU activations before down (the same
// product: it is one scalar per row).
void shared_expert_forward(Context& ctx, const SharedExpertWeights& w, const Tensor& x, const Tensor& h);
int64_t shared_expert_params(int64_t H, int64_t width);

}  // namespace dflash
