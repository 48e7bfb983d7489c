// model/target/shared_expert.h — the shared expert of MoE layers: beside the routed experts (model/target/mlp.h),
// every token goes through one more SwiGLU, scaled by a per-token sigmoid gate when the family has one:
//   h += sigmoid(x Wsg^T) * down(silu(gate(x)) * up(x))    Wsg [1, H] (Qwen3-Next / Qwen3.5-MoE: Qwen3NextSparseMoeBlock)
//   h += down(silu(gate(x)) * up(x))                       no gate (DeepSeek-V3: DeepseekV3MoE's shared_experts)
// of width MoeConfig::shared_expert_width; the gate by MoeConfig::shared_expert_gate.
// defines: SharedExpertWeights, load_shared_expert, shared_expert_forward, shared_expert_params
#pragma once
#include <string>

#include "backend/context.h"
#include "model/target/mlp.h"

namespace dflash {

struct SharedExpertWeights {
  DenseMlpWeights mlp;  // [I, H], [I, H], [H, I]
  Tensor gate;          // [1, H] with a gate; else undefined
  bool defined() const { return mlp.w_gate.defined(); }
};

// prefix + names.shared_expert + {gate,up,down}_proj.weight, and prefix + names.shared_expert_gate when `gated`.
// Calls: gate, up, down, the gate vector.
SharedExpertWeights load_shared_expert(WeightSource& src, const std::string& prefix, const WeightNames& names,
                                       int64_t H, int64_t width, bool gated);
// h [R, H] += the shared expert of x [R, H] act. The gate, when there is one, is applied to the SwiGLU activations
// before down (the same product: it is one scalar per row).
void shared_expert_forward(Context& ctx, const SharedExpertWeights& w, const Tensor& x, const Tensor& h);
int64_t shared_expert_params(int64_t H, int64_t width, bool gated);

}  // namespace dflash
