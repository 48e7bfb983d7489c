// io/model_family_gemma4.h — the Gemma 4 text models of io/model_family.cpp's table: Gemma4ForCausalLM (model_type
// gemma4_text) and the published image-text checkpoints' language model (Gemma4ForConditionalGeneration, model_type
// gemma4: the config under text_config, the weights under model.language_model.; the vision and audio towers and
// their embedders are ignored by name).
// defines: read_gemma4, gemma4_layer, gemma4_names, gemma4_drafter
//
// What a Gemma 4 layer is (transformers' Gemma4TextDecoderLayer, Gemma4TextAttention; models/gemma4):
//   h = h + RMSNorm_po(attn(RMSNorm_in(h)))                        sandwich norms (post_attention_layernorm)
//   h = h + RMSNorm_pf(down(gelu_tanh(gate(x)) * up(x))), x = RMSNorm_pre(h)   (pre/post_feedforward_layernorm)
//   h = h * layer_scalar
// attention: q, k RMS-normed per head (with weights), v RMS-normed per head without a weight, softmax scale 1;
// layer_types[l] "sliding_attention" (window sliding_window, head_dim, num_key_value_heads, RoPE "default" of the
// sliding rope_theta) or "full_attention" (global_head_dim; with attention_k_eq_v no v_proj: v is the k projection
// before k_norm, and num_global_key_value_heads kv heads; the "proportional" RoPE of rope_parameters.full_attention:
// io/hf_config.h RopeAlt). The embedding is scaled by sqrt(H), the logits soft-capped (final_logit_softcapping).
// RMSNorms scale by w (not 1 + w as Gemma 1-3). What the published gemma-4-31B-it / 26B-A4B-it do not use is refused
// by name: per-layer input embeddings (hidden_size_per_layer_input), KV sharing (num_kv_shared_layers),
// use_bidirectional_attention "all", attention_bias, other activations and RoPE types. With enable_moe_block
// (gemma-4-26B-A4B-it) every layer runs its dense MLP and num_experts experts (top_k_experts, width
// moe_intermediate_size, GeGLU) side by side (io/hf_config.h MoeConfig::dense_beside_width, router_scales).
#pragma once
#include <cstdint>

#include "io/hf_config.h"
#include "io/json_fields.h"
#include "io/model_family.h"

namespace dflash {

// Gemma4TextConfig's keys with its defaults. Throws Error naming src and the key for a value not run.
void read_gemma4(const JsonFields& f, ModelConfig& c);
LayerSpec gemma4_layer(const ModelConfig& c, int64_t l);
// model.* (Gemma4ForCausalLM) or model.language_model.* (image-text); lm_head.weight at the top level (tied by default).
WeightNames gemma4_names(bool image_text);
// The published drafter z-lab/gemma-4-31B-it-DFlash: 64 heads of 128 with 8 kv heads, MLP 2 H, RoPE theta of the
// target's full-attention layers (1e6); target layer ids by the spec's rule ([1, 12, 23, 35, 46, 57] of 60 for nf 6).
DrafterDefaults gemma4_drafter(const ModelConfig& c);

}  // namespace dflash
