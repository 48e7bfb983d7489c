// io/model_family_hybrid.h — the hybrid linear-attention families of io/model_family.cpp's table: Qwen3-Next
// (Qwen3NextForCausalLM: Qwen3-Coder-Next, Qwen3-Next-80B-A3B) and Qwen3.5 / Qwen3.6, dense and MoE, as text models
// (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) and as the published image-text checkpoints
// (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration: the language model's config under
// text_config, its weights under model.language_model.; the vision tower and the MTP head are ignored by name).
// defines: read_qwen3_next, qwen3_next_layer, read_qwen3_5, qwen3_5_layer, read_qwen3_5_moe, qwen3_5_moe_layer,
//          hybrid_names, hybrid_drafter, SplitLinearAttnProjections, split_grouped_qkvz
//
// What every one of them is (transformers 5.17, models/qwen3_next, qwen3_5, qwen3_5_moe): layer l's token mixer is
// layer_types[l] ("linear_attention": Gated DeltaNet; "full_attention": gated attention with q/k norm); without
// layer_types, every full_attention_interval-th layer (default 4) is full attention:
//   linear iff (l + 1) % interval != 0                          (Qwen3NextConfig.__post_init__)
// RMSNorms are zero-centred (y = norm(x) * (1 + w)) except the linear attention's gated output norm; RoPE is
// partial: the first partial_rotary_factor * head_dim dims of a head rotate (default 0.25). Qwen3.5's M-RoPE
// (mrope_section, mrope_interleaved) reduces to this RoPE for text: its three position streams (temporal, height,
// width) are all the text position when no image is present, so every frequency turns by the same angle
// pos * inv_freq[i] whichever stream the interleaving takes it from (Qwen3_5TextRotaryEmbedding).
#pragma once
#include <cstdint>

#include "io/hf_config.h"
#include "io/json_fields.h"
#include "io/model_family.h"

namespace dflash {

// Qwen3NextConfig: linear attention + MoE with a shared expert (decoder_sparse_step, mlp_only_layers as Qwen3-MoE;
// norm_topk_prob default true). Throws Error naming src and the key.
void read_qwen3_next(const JsonFields& f, ModelConfig& c);
LayerSpec qwen3_next_layer(const ModelConfig& c, int64_t l);
// Qwen3_5TextConfig: linear attention, every layer a dense SwiGLU of intermediate_size.
void read_qwen3_5(const JsonFields& f, ModelConfig& c);
LayerSpec qwen3_5_layer(const ModelConfig& c, int64_t l);
// Qwen3_5MoeTextConfig: linear attention, every layer MoE with a shared expert, top-k always renormalised
// (Qwen3_5MoeTopKRouter); no intermediate_size.
void read_qwen3_5_moe(const JsonFields& f, ModelConfig& c);
LayerSpec qwen3_5_moe_layer(const ModelConfig& c, int64_t l);

// The weight names: model.* (text checkpoints) or model.language_model.* (image-text, `image_text`); lm_head.weight
// at the top level in both. Ignored by name: model.visual. (image-text) and mtp. (both).
WeightNames hybrid_names(bool image_text);
// The published drafters of Qwen3.5 / Qwen3.6 / Qwen3-Coder-Next: 32 heads of 128, with 8 kv heads for the dense
// targets and 4 for the MoE ones (z-lab/Qwen3.5-4B/27B-DFlash, Qwen3.5-35B-A3B-DFlash: SpecForge configs/); the MLP
// width is the general rule.
DrafterDefaults hybrid_drafter(const ModelConfig& c);

// The Gated DeltaNet's input projections in the split layout (Qwen3.5's in_proj_qkv [2 nk dk + nv dv, H], in_proj_z
// [nv dv, H], and [in_proj_b ; in_proj_a] [2 nv, H]), host tensors.
struct SplitLinearAttnProjections {
  Tensor qkv, z, ba;
};
// The projections as Qwen3-Next stores them, fused and grouped per key head (transformers'
// fix_query_key_value_ordering; r = nv / nk): qkvz [nk (2 dk + 2 r dv), H] as [q_g (dk), k_g (dk), v_g (r dv),
// z_g (r dv)] and ba [nk 2 r, H] as [b_g (r), a_g (r)] for key head g, on the host (any dtype) -> the split layout:
// a permutation of rows.
SplitLinearAttnProjections split_grouped_qkvz(const Tensor& qkvz, const Tensor& ba, const LinearAttnConfig& a);

}  // namespace dflash
