// io/model_family_minimax.h — the MiniMax-M2 family of io/model_family.cpp's table (MiniMaxM2ForCausalLM: MiniMax-M2,
// M2.1, M2.5, M2.7): its configuration keys and defaults, the per-layer plan and the published tensor names.
// defines: read_minimax_m2, minimax_m2_layer, minimax_m2_names
//
// What it is (transformers' models/minimax_m2, vLLM's minimax_m2.py as served): every layer is attention + MoE.
//   attention   GQA without biases; q_norm / k_norm are one RMSNorm over all heads' projection (weights [nh d] and
//               [nkv d]: qk_norm_type "per_layer"), before RoPE; RoPE on the first rotary_dim of head_dim dims
//               (rotary_dim, or partial_rotary_factor x head_dim), theta 5e6 by default
//   MoE         p = sigmoid(x Wr^T) in fp32; the top k of p + e_score_correction_bias chosen; weights p of the chosen,
//               renormalised to sum 1 (no routed scaling); experts SwiGLU of width intermediate_size
//   tensors     model.layers.{l}.block_sparse_moe.gate.weight [E, H], .e_score_correction_bias [E],
//               .experts.{e}.w1 (gate) / w3 (up) [I, H], w2 (down) [H, I]; FP8 block-scaled in the published
//               checkpoints (quantization_config fp8, fmt float8_e4m3fn, 128 x 128 blocks; router and lm_head bf16);
//               the MTP modules (model.layers.{L + i}., i < num_mtp_modules) are ignored by name.
// Refused by name: scoring_func other than sigmoid, use_qk_norm false, qk_norm_type other than per_layer, a shared
// expert (shared_intermediate_size > 0), attn_type_list entries other than 1 (MiniMax-01's lightning attention),
// a sliding window, attention biases, routed_scaling_factor other than 1, hidden_act other than silu.
#pragma once
#include <cstdint>

#include "io/hf_config.h"
#include "io/json_fields.h"
#include "io/model_family.h"

namespace dflash {

// MiniMaxM2Config's keys (transformers 5) and the published config.json's own (rotary_dim, use_qk_norm,
// qk_norm_type, scoring_func, use_routing_bias, shared_intermediate_size, attn_type_list, num_mtp_modules). Throws
// Error naming src and the key.
void read_minimax_m2(const JsonFields& f, ModelConfig& c);
LayerSpec minimax_m2_layer(const ModelConfig& c, int64_t l);
WeightNames minimax_m2_names();

}  // namespace dflash
