// io/model_family_deepseek_v3.h — the DeepSeek-V3 family of io/model_family.cpp's table (DeepseekV3ForCausalLM:
// DeepSeek-V3, V3.1, R1; Kimi-K2, whose config.json says model_type "kimi_k2" for the same architecture): its
// configuration keys and defaults, the per-layer plan and the published tensor names.
// defines: read_deepseek_v3, deepseek_v3_layer, deepseek_v3_names, deepseek_v3_drafter, yarn_get_mscale
//
// What it is (transformers 5's models/deepseek_v3, vLLM's deepseek_v2.py as served):
//   attention   multi-head latent attention (io/hf_config.h MlaConfig, model/target/latent_attention.h) in every
//               layer: q_lora_rank (null: q_proj), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
//               rope_interleave; softmax scale qk_head_dim^-1/2 x yarn_get_mscale(factor, mscale_all_dim)^2 with
//               YaRN; RoPE over qk_rope_head_dim (transformers' head_dim), default theta 10000
//   MLP         layers l < first_k_dense_replace: dense SwiGLU of intermediate_size; the others MoE: sigmoid router
//               (fp32), e_score_correction_bias for choosing only, the top num_experts_per_tok within the topk_group
//               best of n_group groups (a group's score: the sum of its two largest), renormalised
//               (norm_topk_prob), times routed_scaling_factor; n_routed_experts experts of moe_intermediate_size;
//               beside them n_shared_experts shared experts as one SwiGLU of n_shared_experts x
//               moe_intermediate_size, without a gate
//   tensors     model.layers.{l}.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
//               kv_a_layernorm, kv_b_proj, o_proj}; mlp.gate.weight [E, H], mlp.gate.e_score_correction_bias [E],
//               mlp.experts.{e}.{gate,up,down}_proj.weight, mlp.shared_experts.{gate,up,down}_proj.weight; dense
//               layers mlp.{gate,up,down}_proj.weight; FP8 block-scaled as published (DeepSeek-V3's 128 x 128
//               weight_scale_inv). The MTP layers (model.layers.{L + i}., i < num_nextn_predict_layers) are ignored
//               by name.
// Refused by name (no published model of the family uses them): scoring_func other than sigmoid, topk_method other
// than noaux_tc (DeepSeek-V2's greedy / group_limited_greedy), moe_layer_freq other than 1 (transformers ignores it,
// vLLM reads it), attention_bias, hidden_act other than silu, num_key_value_heads other than num_attention_heads
// (MLA's heads are all key-value heads), rope types other than default and yarn, n_group not dividing
// n_routed_experts.
#pragma once
#include <cstdint>
#include <vector>

#include "io/hf_config.h"
#include "io/json_fields.h"
#include "io/model_family.h"

namespace dflash {

// DeepseekV3Config's keys and defaults (transformers 5 configuration_deepseek_v3.py: the DeepSeek-V3 shapes) and the
// published config.json's own (scoring_func, topk_method, moe_layer_freq, num_nextn_predict_layers). Throws Error
// naming src and the key.
void read_deepseek_v3(const JsonFields& f, ModelConfig& c);
LayerSpec deepseek_v3_layer(const ModelConfig& c, int64_t l);
WeightNames deepseek_v3_names();
// z-lab/Kimi-K2.5-DFlash's shape (64 heads, 8 kv heads, MLP 18432 for Kimi-K2.5's 64 heads and intermediate_size
// 18432): the target's heads, 8 kv heads (all of them when the heads are not a multiple of 8) of 128, MLP of the
// target's intermediate_size.
DrafterDefaults deepseek_v3_drafter(const ModelConfig& c);
// transformers' yarn_get_mscale of modeling_deepseek_v3.py: 1 for scale <= 1, else 0.1 mscale ln(scale) + 1.
double yarn_get_mscale(double scale, double mscale);

}  // namespace dflash
