// model/target/mlp.h — the target's channel mixers: the dense SwiGLU MLP and the Mixture of Experts.
// defines: DenseMlpWeights, MoeLayerWeights, load_dense_mlp, dense_mlp_forward, load_moe, moe_forward, mlp_params
//
// Dense (LlamaMLP / Qwen3MLP):      h += down(silu(gate(x)) * up(x))                         width I
// (Gemma4TextMLP: gelu_tanh in place of silu, ModelConfig::mlp_act)
// MoE (Qwen3MoeSparseMoeBlock):     p = softmax(x Wr^T) (fp32, all E experts); the top_k experts of largest p,
//                                   their p renormalised to sum 1 when norm_topk_prob;
//                                   h += sum_j p_j down_e(silu(gate_e(x)) * up_e(x))         width expert_width
// MoE features (io/hf_config.h MoeConfig; gpt-oss's GptOssMLP has all of them):
//   router_bias                     z = x Wr^T + br
//   RouterKind::SigmoidTopK         p = sigmoid(z) (fp32); the top_k of p + b_corr chosen (score_correction_bias),
//                                   within the topk_group best of n_group groups, weighted by p renormalised, times
//                                   routed_scaling_factor (MiniMax-M2's MiniMaxM2TopKRouter, DeepSeek-V3's
//                                   DeepseekV3MoE)
//   RouterKind::TopKSoftmax         p = softmax over the top_k logits (= moe_route's renormalised softmax:
//                                   exp(z_j - m) / sum_{i in top k} exp(z_i - m) either way)
//   expert_bias, ExpertAct          h += sum_j p_j (down_e(act(gate_e(x) + bg, up_e(x) + bu)) + bd_e), act SwiGLU or
//                                   MoeAct::ClampedSwiGLU
//   WeightFormat                    expert weights plain or MXFP4 (kept so on every backend)
// The MoE runs as five ops on the stacked rows (backend/context.h): the router GEMM, moe_route (top-k and weights),
// moe_group (the (token, slot) pairs sorted by expert), moe_linear twice (one grouped GEMM per projection: gate and
// up together with the SwiGLU in its epilogue, then down) and moe_combine (the weighted sum into h). None of them
// reads a value back to the host: a MoE layer needs no host synchronisation.
#pragma once
#include <string>

#include "backend/context.h"
#include "io/hf_config.h"
#include "model/target/weights.h"

namespace dflash {

struct DenseMlpWeights {
  LinearWeight w_gate, w_up, w_down;  // [I, H], [I, H], [H, I]; plain or FP8
};

struct MoeLayerWeights {
  Tensor router;        // [E, H]
  Tensor router_bias;   // [E] (MoeConfig::router_bias); else undefined
  Tensor score_bias;    // [E] F32: RouterKind::SigmoidTopK's score-correction bias (choosing only); else undefined
  MoeWeights gate_up;   // [E, 2 I, H]: expert e's gate rows 0..I-1, then its up rows (transformers 5's Qwen3-MoE
                        // layout); + bias [E, 2 I] with expert_bias; plain, MXFP4 or INT4 (backend/context.h MoeWeights)
  MoeWeights down;      // [E, H, I]; + bias [E, H] with expert_bias; plain, MXFP4 or INT4
  // FP8 experts (an FP8 checkpoint whose blocks do not straddle experts or gate / up: I and H multiples of the block
  // rows): kept FP8 as [E 2I, H] and [E H, I] (gate_up, down then undefined) and dequantised to bf16 per forward.
  LinearWeight gate_up_fp8, down_fp8;
};

// Calls in this order: gate, up, down.
DenseMlpWeights load_dense_mlp(WeightSource& src, const std::string& prefix, const WeightNames& names, int64_t H,
                               int64_t I);
// h [R, H] += down(act(gate(x)) * up(x)); x [R, H] act; act SiLU (SwiGLU) or GeluTanh (Gemma's GeGLU).
void dense_mlp_forward(Context& ctx, const DenseMlpWeights& w, const Tensor& x, const Tensor& h,
                       MlpAct act = MlpAct::SiLU);

// The experts in the family's layout (io/model_family.h ExpertsLayout). Rows: per expert (prefix + names.expert +
// "{e}.gate_proj.weight", ...: the published checkpoints) or fused (prefix + names.expert + "gate_up_proj"
// [E, 2I, H] and "down_proj" [E, H, I]: what transformers 5 holds in memory); the per-expert names are the family's
// (WeightNames::expert_gate, ...). Calls: router (+ router bias, + score-correction bias), gate
// (+ up), down.
// InterleavedColumns (gpt-oss): router, router bias, then gate_up and down as columns (gate_up_proj [E, H, 2I] with
// gate / up interleaved, down_proj [E, I, H]) or as MXFP4 rows (moe.expert_format: *_blocks / *_scales, gate / up
// interleaved in the rows), each followed by its bias: rearranged on the host by io's layout conversions into
// MoeWeights' layout (rows [E, N', K], gate rows first) and uploaded; MXFP4 stays MXFP4.
// INT4 experts (moe.expert_format INT4: compressed-tensors pack-quantized, per expert as published by Kimi-K2) stay
// INT4: gate and up rows stacked as U8 [E, 2I, H/2] + BF16 scales [E, 2I, H/g], down as [E, H, I/2] + [E, H, I/g].
// Throws Error naming the tensor when one is missing, of another shape or dtype, or MXFP4 / INT4 where the config has
// no quantization_config declaring it (and the reverse).
MoeLayerWeights load_moe(WeightSource& src, const std::string& prefix, const WeightNames& names, int64_t H,
                         const MoeConfig& moe);
// h [R, H] += MoE(x); x [R, H] act. The router reads router_x [R, H] when given (Gemma 4: RMSNorm(r) without a
// weight), else x. ExpertAct::GeluTanh runs the gate / up GEMM without an epilogue, then gelu_tanh_mul on its two
// halves. Returns the experts chosen, idx [R, k] I32 (on ctx's device).
Tensor moe_forward(Context& ctx, const MoeLayerWeights& w, const MoeConfig& moe, const Tensor& x, const Tensor& h,
                   const Tensor* router_x = nullptr);

// Parameters of one layer's channel mixer: all of them, and those each token uses (router + top_k experts); mxfp4 /
// int4 = those of total held in MXFP4 / INT4 when moe.expert_format says so (the experts' weights, not their biases),
// int4_scales the INT4 experts' scales (one per group of moe.int4_group along K, or per row).
struct MlpParams {
  int64_t total = 0, active = 0, mxfp4 = 0, int4 = 0, int4_scales = 0;
};
MlpParams mlp_params(const ModelConfig& cfg, const LayerSpec& spec);

}  // namespace dflash
