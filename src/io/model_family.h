// io/model_family.h — one description per target architecture: which config.json it is, the keys and defaults of
// its own (beyond those every family shares, read by io/hf_config.cpp), the per-layer plan made from them, the
// Hugging Face weight names and the default target layer ids. A new family is one more entry in
// io/model_family.cpp, plus a mixer in model/target/ when it brings a new kind of layer.
// defines: ExpertsLayout, WeightNames, DrafterDefaults, ModelFamily, model_families, family_by_architecture,
//          family_by_model_type, family_of, read_sparse_layers, is_sparse_layer, gate_up_rows_first, columns_to_rows
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"
#include "io/json_fields.h"

namespace dflash {

// How a family's checkpoint stores its experts; the MoE loader (model/target/mlp.cpp) takes either and converts the
// second with the layout conversions below.
enum class ExpertsLayout {
  // per expert: expert + "{e}.gate_proj.weight", ..., or fused rows: gate_up_proj [E, 2I, H] (gate rows first) and
  // down_proj [E, H, I]
  Rows,
  // fused columns, gate / up interleaved: gate_up_proj [E, H, 2I] (gate / up in columns ::2 / 1::2), down_proj
  // [E, I, H], each with a bias; or as MXFP4 rows with gate / up rows interleaved likewise (gpt-oss: below)
  InterleavedColumns,
};

// Tensor names of a family's safetensors. A layer's tensor is layer + "{l}." + one of the per-layer names; the
// projections take ".weight" (and ".bias") after their name. Experts: per expert expert + "{e}." + gate_proj.weight,
// up_proj.weight, down_proj.weight (the published checkpoints), or fused over the experts expert + gate_up_proj
// [E, 2 I, H] (gate rows first) and expert + down_proj [E, H, I] (transformers 5's in-memory layout).
struct WeightNames {
  std::string embed = "model.embed_tokens.weight";
  std::string final_norm = "model.norm.weight";
  std::string lm_head = "lm_head.weight";
  std::string layer = "model.layers.";
  std::string in_norm = "input_layernorm.weight", post_norm = "post_attention_layernorm.weight";
  std::string q = "self_attn.q_proj", k = "self_attn.k_proj", v = "self_attn.v_proj", o = "self_attn.o_proj";
  std::string q_norm = "self_attn.q_norm.weight", k_norm = "self_attn.k_norm.weight";
  // Multi-head latent attention (model/target/latent_attention.h): the query's low-rank pair and its norm, the
  // latent's projection (with the shared RoPE key), its norm and its expansion to every head's k_nope and v.
  std::string q_a = "self_attn.q_a_proj", q_a_norm = "self_attn.q_a_layernorm.weight", q_b = "self_attn.q_b_proj";
  std::string kv_a = "self_attn.kv_a_proj_with_mqa", kv_a_norm = "self_attn.kv_a_layernorm.weight";
  std::string kv_b = "self_attn.kv_b_proj";
  std::string gate = "mlp.gate_proj.weight", up = "mlp.up_proj.weight", down = "mlp.down_proj.weight";
  std::string router = "mlp.gate.weight";
  std::string expert = "mlp.experts.";
  // gpt-oss: self_attn.sinks [nh]; the router's bias; the experts fused in HF's gpt-oss layout under `expert`:
  // gate_up_proj [E, H, 2I] (gate / up interleaved in the columns: ::2 / 1::2), gate_up_proj_bias [E, 2I],
  // down_proj [E, I, H], down_proj_bias [E, H]; or in MXFP4 (quantization_config.quant_method mxfp4) as
  // gate_up_proj_blocks [E, 2I, H/32, 16] U8 + gate_up_proj_scales [E, 2I, H/32] U8 (rows interleaved likewise) and
  // down_proj_blocks [E, H, I/32, 16] + down_proj_scales [E, H, I/32].
  std::string sinks = "self_attn.sinks";
  // Gemma's sandwich norms (LayerSpec::sandwich_norms: in_norm / post_norm are then the norms before the mixers) and
  // its per-layer scalar [1] (LayerSpec::layer_scalar).
  std::string mixer_out_norm = "post_attention_layernorm.weight", mlp_out_norm = "post_feedforward_layernorm.weight";
  std::string layer_scalar = "layer_scalar";
  // Gemma 4's MoE block (MoeConfig::router_scales, dense_beside_width): the router's scale [H] and per-expert scale
  // [E]; the experts' input norm and the two sides' output norms.
  std::string router_scale = "router.scale", per_expert_scale = "router.per_expert_scale";
  std::string moe_in_norm = "pre_feedforward_layernorm_2.weight", moe_out_norm = "post_feedforward_layernorm_2.weight";
  std::string dense_out_norm = "post_feedforward_layernorm_1.weight";
  std::string router_bias = "mlp.gate.bias";
  // RouterKind::SigmoidTopK's score-correction bias [E] F32 (MoeConfig::score_correction_bias)
  std::string router_score_bias = "mlp.gate.e_score_correction_bias";
  // The per-expert projections' names after expert + "{e}." (ExpertsLayout::Rows): gate, up, down
  // (MiniMax-M2: w1, w3, w2)
  std::string expert_gate = "gate_proj.weight", expert_up = "up_proj.weight", expert_down = "down_proj.weight";
  ExpertsLayout experts_layout = ExpertsLayout::Rows;
  // Hybrid families: the Gated DeltaNet's tensors are layer + "{l}." + linear_attn + in_proj_qkv.weight, ...
  // (model/target/linear_attention.h); the shared expert's shared_expert + gate_proj.weight, ... and its gate.
  std::string linear_attn = "linear_attn.";
  std::string shared_expert = "mlp.shared_expert.", shared_expert_gate = "mlp.shared_expert_gate.weight";
  // Prefixes of checkpoint tensors that are not the language model and are ignored by name (the vision tower and
  // the multi-token-prediction head of the Qwen3.5 / Qwen3-Next checkpoints; `dflash info` counts them).
  std::vector<std::string> ignored;
};

// The published drafters' shape for a family, where it is not the target's own: each field 0 = the general rule (the
// target's heads, kv heads and head_dim; MLP width: the target's dense width, or 3 H with MoE layers). gpt-oss: MLP
// 8 H / 3 (7680 at H 2880, z-lab/gpt-oss-20b-DFlash, -120b-DFlash); the hybrid families: 32 heads of 128, kv 8 (dense)
// or 4 (MoE) instead of the target's gated head_dim-256 attention (z-lab/Qwen3.5-*-DFlash, SpecForge configs/).
struct DrafterDefaults {
  int64_t intermediate_size = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  double rope_theta = 0;  // 0: the target's rope_theta
};

struct ModelFamily {
  Arch arch;
  const char* model_type;     // config.json "model_type"
  const char* architecture;   // config.json "architectures" entry, the transformers class
  const char* title;          // "Qwen3-MoE"
  const char* published;      // published targets of this family (README, dflash info)
  // The family's own keys and transformers' defaults for them, read after the shared keys are in c (head_dim
  // default, biases, qk-norm, MoE keys, BOS/EOS defaults). Throws Error naming src and the key.
  void (*read)(const JsonFields& f, ModelConfig& c);
  // Layer l's plan from the config (c.layers is filled from this for l = 0 .. num_hidden_layers - 1).
  LayerSpec (*layer)(const ModelConfig& c, int64_t l);
  // Default target layer ids for nf taps; nullptr: the spec's rule (io/hf_config.h default_target_layer_ids).
  std::vector<int64_t> (*default_layer_ids)(const ModelConfig& c, int64_t nf) = nullptr;
  WeightNames names;
  // The drafter defaults this family sets itself (model/drafter.h DrafterConfig::for_target,
  // default_intermediate_size); nullptr, or a field left 0: the general rule.
  DrafterDefaults (*drafter)(const ModelConfig& c) = nullptr;
  // Another model_type of the same architecture (Kimi-K2's "kimi_k2" for DeepseekV3ForCausalLM), or nullptr.
  const char* model_type_alias = nullptr;
};

// Every supported family, in the order `dflash info` and the README list them.
const std::vector<ModelFamily>& model_families();
// The family of an architectures entry / a model_type (its own or its alias), or nullptr.
const ModelFamily* family_by_architecture(const std::string& name);
const ModelFamily* family_by_model_type(const std::string& model_type);
const ModelFamily& family_of(Arch a);
// The sparse-layer keys of Qwen2-MoE-style configs (decoder_sparse_step, mlp_only_layers, checked against
// num_hidden_layers; Error names src and the key), and whether layer l is then sparse: not in mlp_only_layers, experts
// present and (l + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer, Qwen3NextDecoderLayer).
void read_sparse_layers(const JsonFields& f, const ModelConfig& c, MoeConfig& m);
bool is_sparse_layer(const MoeConfig& m, int64_t l);
// "LlamaForCausalLM, Qwen2ForCausalLM, ..." and "llama, qwen2, ...": the lists the refusals name.
std::string supported_architectures();
std::string supported_model_types();

// ---- Layout conversions of ExpertsLayout::InterleavedColumns into MoeWeights' rows [E, N', K], gate rows first ----
// t [E, 2I, C] on the host (any dtype) with gate / up rows interleaved (row 2r: gate r, row 2r + 1: up r) -> gate rows
// 0 .. I-1, then up rows (GptOssExperts._apply_gate: gate_up[..., ::2], gate_up[..., 1::2]).
Tensor gate_up_rows_first(const Tensor& t);
// t [E, K, N] F32 on the host (a projection stored as columns) -> [E, N, K].
Tensor columns_to_rows(const Tensor& t);

}  // namespace dflash
