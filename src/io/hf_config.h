// io/hf_config.h — a Hugging Face config.json of a target decoder as one typed struct, with its per-layer plan.
// defines: Arch, AttentionSpec, TokenMixer, ChannelMixer, LayerSpec, WeightFormat, weight_format_name, Fp8Format,
//          Int4Format, parse_quantization_config, RouterKind,
//          ExpertAct, MoeConfig, LinearAttnConfig, MlaConfig, LayerType, ModelConfig, load_model_config,
//          parse_model_config,
//          parse_rope_scaling, rope_scaling_json, to_json / from_json (RopeScaling), default_target_layer_ids,
//          validate_target_layer_ids, kAutoMaskTokenId, validate_mask_token_id
//
// What differs between architectures (their config keys and defaults, nested text_config, weight names, which
// layer is dense or Mixture-of-Experts) is written once per family in io/model_family.cpp; this file reads the keys
// every family shares and asks the family for the rest.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/rope_scaling.h"  // RopeScaling

namespace dflash {

// The target families (io/model_family.h describes each).
enum class Arch {
  Llama, Qwen2, Qwen3, Qwen3Moe, GptOss,
  // hybrid linear-attention families (io/model_family_hybrid.cpp); the *Vl ones are the image-text checkpoints
  // (Qwen3_5ForConditionalGeneration, ...) whose language model is read alone
  Qwen3Next, Qwen3_5, Qwen3_5Vl, Qwen3_5Moe, Qwen3_5MoeVl,
  // Gemma 4 text models (io/model_family_gemma4.cpp): Gemma4ForCausalLM and the image-text checkpoints'
  // (Gemma4ForConditionalGeneration) language model
  Gemma4, Gemma4Vl,
  MiniMaxM2,
  // DeepSeek-V3 (io/model_family_deepseek_v3.cpp): DeepseekV3ForCausalLM, model_type deepseek_v3 or Kimi-K2's kimi_k2
  DeepseekV3,
};
// the family's model_type: "llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_next", ...
const char* arch_name(Arch a);

// The token mixer of one target layer: causal softmax attention (GQA, RoPE) and its options. The options later
// families add (an output gate, partial rotary; linear attention as another mixer) join here. YaRN's attention
// factor is the config's (ModelConfig::rope_scaling.attention_scaling(), the same for every layer).
struct AttentionSpec {
  bool bias = false;            // q/k/v projections with biases (Qwen2, gpt-oss)
  bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (Qwen3, Qwen3-MoE)
  // With qk_norm: one RMSNorm over all heads' q (nh d, weight [nh d]) and one over all of k (nkv d), not per head
  // (MiniMax-M2: qk_norm_type "per_layer", transformers' MiniMaxM2Attention).
  bool qk_norm_all_heads = false;
  int64_t sliding_window = 0;   // 0 = full causal attention; W > 0: the query at p sees keys p - W + 1 .. p
  bool out_bias = false;        // o_proj with a bias (gpt-oss)
  bool sinks = false;           // a learned per-head sink logit in the softmax's denominator (gpt-oss)
  // Gated attention (Qwen3-Next, Qwen3.5: transformers' Qwen3NextAttention): q_proj yields per head [q (d) | gate (d)];
  // the attention output is multiplied by sigmoid(gate) before o_proj.
  bool output_gate = false;
  // Per-layer geometry and Gemma 4's options (transformers' Gemma4TextAttention). head_dim / num_kv_heads: 0 = the
  // config's head_dim / num_key_value_heads (ModelConfig::head_dim_of, kv_heads_of); Gemma 4's full-attention layers
  // have their own (global_head_dim, num_global_key_value_heads).
  int64_t head_dim = 0, num_kv_heads = 0;
  bool k_eq_v = false;    // no v_proj: the values are the k projection's output before k_norm (attention_k_eq_v)
  bool v_norm = false;    // the values RMS-normed per head without a weight (Gemma 4's v_norm)
  double scale = 0;       // the softmax scale; 0 = 1 / sqrt(d) (times YaRN's af^2). Gemma 4: 1 (q and k are normed);
                          // LatentAttention: qk_head_dim^-1/2 times mscale_all_dim's YaRN factor squared
  bool rope_alt = false;  // RoPE of ModelConfig::rope_alt instead of the config's (Gemma 4's full-attention layers)
};

// The activation of the dense MLPs: down(act(gate(x)) * up(x)).
enum class MlpAct {
  SiLU,      // SwiGLU (Llama, Qwen)
  GeluTanh,  // gelu_pytorch_tanh: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (Gemma)
};

// The token mixer of one target layer.
enum class TokenMixer {
  Attention,        // causal softmax attention (AttentionSpec)
  LinearAttention,  // Gated DeltaNet (LinearAttnConfig; model/target/linear_attention.h)
  LatentAttention,  // multi-head latent attention (MlaConfig; model/target/latent_attention.h), AttentionSpec::scale
};

// The channel mixer of one target layer.
enum class ChannelMixer {
  Dense,  // down(silu(gate(x)) * up(x)), width = LayerSpec::mlp_width
  MoE,    // Mixture of Experts (MoeConfig): a router and num_experts gated experts of width moe.expert_width
};

// One decoder layer of the target: h += token_mixer(RMSNorm_in(h)); h += channel_mixer(RMSNorm_post(h)).
struct LayerSpec {
  TokenMixer mixer = TokenMixer::Attention;
  AttentionSpec attention;      // mixer == Attention (LatentAttention: its scale)
  ChannelMixer mlp = ChannelMixer::Dense;
  int64_t mlp_width = 0;  // Dense: its intermediate size; MoE: each expert's (moe.expert_width)
  // Gemma's sandwich norms: the token mixer's and the channel mixer's outputs are RMS-normed before each residual
  // add (h += RMSNorm_mo(mixer(..)), h += RMSNorm_co(mlp(..)); transformers' post_attention_layernorm and
  // post_feedforward_layernorm; the norm before the channel mixer is pre_feedforward_layernorm).
  bool sandwich_norms = false;
  // h *= layer_scalar at the end of the layer (a [1] weight of the checkpoint: Gemma 4's layer_scalar).
  bool layer_scalar = false;
};

// How a group of weights is stored on the device (decided once from config.json's quantization_config:
// parse_quantization_config).
enum class WeightFormat {
  Plain,  // the compute dtype (bf16), converted from the checkpoint's dtype when loaded
  MXFP4,  // OCP MX: e2m1 elements with one e8m0 scale per 32 (backend/context.h MoeWeights), kept so on the device
  FP8,    // FP8 E4M3 elements with F32 scales per block (backend/context.h LinearWeight), kept so on the device
  INT4,   // symmetric 4-bit integers with one bf16 scale per group along K (Int4Format; backend/context.h MoeWeights),
          // routed experts kept so on the device; other INT4 linears are dequantised when loaded
};
// "plain" / "mxfp4" / "fp8" / "int4".
const char* weight_format_name(WeightFormat f);

// FP8 linear weights as a checkpoint declares them (ModelConfig::fp8): each quantized linear's `weight` is F8_E4M3
// [N, K] beside a scale tensor `scale_name` (F32 or BF16) of one value per block of block_n rows x block_k columns
// (partial blocks at the edges), w = q * scale. A linear stored in another dtype is a plain one (the modules the
// config leaves unconverted). Activations are quantized on the fly, per token (and per 128 channels on the FP8
// tensor cores); only the dynamic scheme exists.
//   quant_method "fp8" (transformers' FineGrainedFP8Config; Qwen's and DeepSeek's -FP8 checkpoints): fmt "e4m3",
//     activation_scheme "dynamic", weight_block_size [bn, bk] (absent: one scale per tensor), scale
//     "weight_scale_inv", modules_to_not_convert.
//   quant_method "compressed-tensors", format "float-quantized" (llm-compressor's FP8 / FP8-dynamic / FP8-block):
//     config_groups' weights {num_bits 8, type float, symmetric, strategy channel | tensor | block with
//     block_structure [bn, bk]}, input_activations dynamic (or absent), scale "weight_scale", `ignore`.
struct Fp8Format {
  std::string method;      // "fp8" or "compressed-tensors"
  std::string scale_name;  // the scale tensor's name in place of "weight": "weight_scale_inv" or "weight_scale"
  int64_t block_n = 0;     // rows per scale; 0 = all rows of the tensor
  int64_t block_k = 0;     // columns per scale; 0 = all columns (per channel: block_n 1, block_k 0)
  std::vector<std::string> not_converted;  // modules_to_not_convert / ignore, as written (shown by dflash info)
  // The scale grid of a weight [N, K]: {ceil(N / bn), ceil(K / bk)} with 0 read as the whole dimension.
  int64_t rows_per_scale(int64_t N) const { return block_n > 0 ? block_n : N; }
  int64_t cols_per_scale(int64_t K) const { return block_k > 0 ? block_k : K; }
  // "block 128x128", "per channel", "per tensor" (dflash info).
  std::string granularity() const;
};

// INT4 linear weights as compressed-tensors' "pack-quantized" format stores them (Kimi-K2-Thinking, Kimi-K2.5: routed
// experts only; llm-compressor's W4A16 schemes). Source: neuralmagic/compressed-tensors,
// compressors/quantized_compressors/pack_quantized.py (pack_to_int32, unpack_from_int32) and
// quantization/lifecycle/forward.py (quantize / dequantize); vLLM's compressed_tensors_moe.py reads the same tensors
// (WNA16: scalar type uint4b8, "unsigned 4-bit with bias 8"). A quantized linear of weight [N, K] is stored as
//   <module>.weight_packed  I32 [N, ceil(K / 8)]: element k of row n in word k / 8, bits 4 (k % 8) .. 4 (k % 8) + 3
//                           (pack_to_int32: packed |= u[:, i::8] << 4 i), as the unsigned code c = q + 8 of the
//                           signed integer q in [-8, 7] (its offset 2^(num_bits - 1)); little-endian, so byte j of a
//                           row holds elements 2 j (low nibble) and 2 j + 1 (high nibble)
//   <module>.weight_scale   [N, K / group] in the checkpoint's dtype (BF16 for Kimi): the scale of columns
//                           [g group, (g + 1) group) (strategy "channel": [N, 1])
//   <module>.weight_shape   I32 [2] = {N, K}
//   w[n, k] = (c - 8) * weight_scale[n, k / group]     (symmetric: no weight_zero_point)
// quantization_config: {quant_method "compressed-tensors", format "pack-quantized", config_groups {group_0: {targets
// ["Linear"], weights {num_bits 4, type "int", symmetric true, strategy "group", group_size 32, dynamic false,
// actorder null}, input_activations null}}, ignore [...], quantization_status "compressed"}; Kimi-K2-Thinking's ignore
// is ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"] (its
// routed experts mlp.experts.{e}.*_proj are the only INT4 linears).
struct Int4Format {
  bool declared = false;
  int64_t group_size = 0;                // elements per scale along K; 0 = one scale per row (strategy "channel")
  std::vector<std::string> targets;      // config_groups' targets: "Linear" (every linear) or "re:" regexes
  std::vector<std::string> ignore;       // as written: module names and "re:" regexes
  // Whether the linear `module` ("model.layers.3.mlp.experts.0.gate_proj", no ".weight") is quantized: a target
  // matches it and no ignore entry does. compressed-tensors' matching (utils/match.py): "re:<p>" is Python's
  // re.match(p, module) (anchored at the start, not the end), any other entry the whole module name (or "Linear").
  bool covers(const std::string& module) const;
  int64_t group_of(int64_t K) const { return group_size > 0 ? group_size : K; }
};

// How a MoE router turns the logits z = x Wr^T (+ br) into the weights of the top_k experts.
enum class RouterKind {
  SoftmaxTopK,  // p = softmax(z) over all experts, the top_k largest, renormalised to sum 1 when norm_topk_prob
  TopKSoftmax,  // the top_k largest z, softmax over those k: the renormalised SoftmaxTopK, exp(z_j - m) /
                // sum_{i in top k} exp(z_i - m) either way (gpt-oss's router)
  SigmoidTopK,  // p = sigmoid(z) per expert in fp32; the top_k largest p + b chosen (b: the score-correction bias
                // when MoeConfig::score_correction_bias, else 0; within the kept groups when MoeConfig::n_group > 1),
                // weighted by their p, renormalised to sum 1 when norm_topk_prob, times routed_scaling_factor
                // (MiniMax-M2's MiniMaxM2TopKRouter; DeepSeek-V3's DeepseekV3MoE)
};

// The gated activation of an expert (backend/context.h MoeAct of the same names).
enum class ExpertAct {
  SwiGLU,         // silu(g) * u
  ClampedSwiGLU,  // (clamp(u, -7, 7) + 1) * min(g, 7) * sigmoid(1.702 min(g, 7)) (vLLM's swigluoai; gpt-oss)
  GeluTanh,       // gelu_tanh(g) * u (Gemma 4's experts; not run yet: refused where the plan would need it)
};

// Mixture-of-Experts keys and features (Qwen3-MoE: transformers' Qwen3MoeSparseMoeBlock). Router: p = softmax(x Wr^T)
// in fp32 over all experts, the top_k largest chosen, their p renormalised to sum 1 when norm_topk_prob; output =
// sum_j p_j expert_j(x), expert = down(act(gate(x), up(x))) of width expert_width. With router_bias the logits are
// x Wr^T + br; with expert_bias expert = down(act(gate(x) + bg, up(x) + bu)) + bd (gpt-oss: TopKSoftmax, both biases,
// ClampedSwiGLU).
struct MoeConfig {
  int64_t num_experts = 0;        // E (0: no MoE layer)
  int64_t top_k = 0;              // num_experts_per_tok
  int64_t expert_width = 0;       // moe_intermediate_size (gpt-oss: intermediate_size)
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;     // layer l is MoE when (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and l is not listed here (those are dense of intermediate_size)
  RouterKind router = RouterKind::SoftmaxTopK;
  bool router_bias = false;       // the router has a bias [E]
  bool score_correction_bias = false;  // SigmoidTopK: a bias [E] added to the scores for choosing only
                                       // (e_score_correction_bias)
  bool expert_bias = false;       // every expert's gate / up and down projections have biases
  ExpertAct act = ExpertAct::SwiGLU;
  WeightFormat expert_format = WeightFormat::Plain;  // the experts' projection weights (not their biases)
  int64_t int4_group = 0;  // INT4 experts: elements per scale along K (Int4Format::group_size; 0 = per channel)
  // A shared expert beside the routed ones (Qwen3-Next, Qwen3.5-MoE: Qwen3NextSparseMoeBlock): every token also goes
  // through a SwiGLU of this width, scaled by sigmoid(x Wsg^T) (Wsg [1, H]) when shared_expert_gate, and added. 0 =
  // none. Without the gate it is added as it is (DeepSeek-V3's shared_experts: n_shared_experts x
  // moe_intermediate_size wide).
  int64_t shared_expert_width = 0;
  bool shared_expert_gate = true;
  // RouterKind::SigmoidTopK's group-limited choice and weight scale (DeepSeek-V3's n_group, topk_group,
  // routed_scaling_factor: backend/context.h MoeRouteOpts): the top_k are chosen within the topk_group best of
  // n_group groups of experts, and their (renormalised) weights multiplied by routed_scaling_factor.
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  // Gemma 4's router (Gemma4TextRouter): it reads RMSNorm(x) without a weight, times a learned scale [H] and H^-1/2
  // (folded into the router's weight when loaded), and the renormalised top-k weights are multiplied by a learned
  // per-expert scale [E] (folded into each expert's down rows when loaded).
  bool router_scales = false;
  // Gemma 4's MoE block: a dense MLP of this width (of ModelConfig::mlp_act) beside the experts on the same residual
  // stream r, each side with its own norms: h = r + RMSNorm_co(RMSNorm_d(dense(RMSNorm_pre(r))) +
  // RMSNorm_e(experts(RMSNorm_pre2(r)))), the router reading r (LayerSpec::sandwich_norms). 0 = none.
  int64_t dense_beside_width = 0;
};

// Gated DeltaNet keys (transformers' Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet; model/target/linear_attention.h).
struct LinearAttnConfig {
  int64_t num_key_heads = 0;     // nk (linear_num_key_heads)
  int64_t num_value_heads = 0;   // nv (linear_num_value_heads), a multiple of nk
  int64_t key_head_dim = 0;      // dk (linear_key_head_dim)
  int64_t value_head_dim = 0;    // dv (linear_value_head_dim)
  int64_t conv_kernel = 0;       // K (linear_conv_kernel_dim)
  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels of the convolution: q, k, v
};

// Multi-head latent attention (DeepSeek-V2 / V3: transformers' DeepseekV3Attention; model/target/latent_attention.h).
// Per head: a query of qk_nope + qk_rope dims (q_proj, or q_b_proj(RMSNorm(q_a_proj x)) with a q_lora_rank); keys
// and values from one latent of kv_lora_rank dims (kv_b_proj(RMSNorm(latent)) -> per head [k_nope | v]) and one
// RoPE key of qk_rope dims shared by all heads.
struct MlaConfig {
  int64_t q_lora_rank = 0;       // 0: q_proj [nh (nope + rope), H] (DeepSeek-V2-Lite); else q_a_proj / q_b_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // the RoPE dims of q_b_proj's / kv_a_proj_with_mqa's rows are interleaved pairs (2i, 2i + 1), transformers'
  // apply_rotary_pos_emb_interleave (rope_interleave true), rather than rotate-half pairs (i, i + rope / 2)
  bool rope_interleave = true;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// The kind of one layer's token mixer as config.json's layer_types names it ("full_attention", "sliding_attention",
// "linear_attention"), read by the family (io/model_family*.cpp) into its LayerSpec.
enum class LayerType { FullAttention, SlidingAttention, LinearAttention };

// A second RoPE for the layers whose AttentionSpec::rope_alt is set: transformers' "proportional" RoPE of Gemma 4's
// full-attention layers over heads of `dim`: the pairs (i, i + dim/2) for i < rotated/2 turn by pos * theta^(-2i/dim),
// the other pairs do not turn (inv_freq [dim/2] with zeros after the first rotated/2: rope_inv_freq_proportional).
struct RopeAlt {
  double theta = 0;
  int64_t dim = 0;      // the head dim it turns (0: no second RoPE)
  int64_t rotated = 0;  // dims rotated: 2 int(partial_rotary_factor dim / 2)
  bool defined() const { return dim > 0; }
};
struct ModelConfig {
  Arch arch = Arch::Qwen3;
  std::string model_type;            // as in config.json: "llama", "qwen2", "qwen3", "qwen3_moe"
  std::string architecture;          // the class name: "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", ...
  int64_t hidden_size = 0;           // H
  int64_t intermediate_size = 0;     // I (dense layers)
  int64_t num_hidden_layers = 0;     // Lt
  int64_t num_attention_heads = 0;   // nh
  int64_t num_key_value_heads = 0;   // nkv (GQA), defaults to nh
  int64_t head_dim = 0;              // d, defaults to H / nh
  int64_t vocab_size = 0;            // V
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;       // q/k/v biases (Qwen2 always; Llama if attention_bias true)
  bool qk_norm = false;              // per-head RMSNorm on q and k (Qwen3, Qwen3-MoE)
  // RoPE rotates the first rotary_dim dims of each head (partial_rotary_factor * head_dim; 0 = all of head_dim).
  int64_t rotary_dim = 0;
  // RMSNorm weights are zero-centred: y = norm(x) * (1 + w) (Qwen3-Next, Qwen3.5: the input, post-attention, final
  // and q/k norms; not the gated norm of the linear-attention output).
  bool zero_centred_norms = false;
  MlpAct mlp_act = MlpAct::SiLU;     // the dense MLPs' activation (Gemma: gelu_pytorch_tanh)
  // The embedding output times embed_scale (0: none; Gemma: sqrt(H) rounded to float32, transformers'
  // Gemma4TextScaledWordEmbedding, then to the compute dtype).
  double embed_scale = 0;
  // logits = cap tanh(logits / cap) (final_logit_softcapping; 0: none).
  double final_logit_softcap = 0;
  RopeAlt rope_alt;                  // the RoPE of layers with AttentionSpec::rope_alt (Gemma 4's full attention)
  // Gemma 4's full-attention layers: their head dim (global_head_dim), their kv heads when attention_k_eq_v
  // (num_global_key_value_heads), and whether their values are the keys' projection (the family's plan reads them).
  int64_t global_head_dim = 0, num_global_kv_heads = 0;
  bool attention_k_eq_v = false;
  MoeConfig moe;
  LinearAttnConfig linear_attn;      // layers whose mixer is LinearAttention
  MlaConfig mla;                     // layers whose mixer is LatentAttention
  // config.json layer_types, one per layer (SlidingAttention / FullAttention: gpt-oss; LinearAttention /
  // FullAttention: the hybrid families, derived from full_attention_interval when absent; empty: absent and not
  // derived), and the window of the sliding layers (gpt-oss: AttentionSpec::sliding_window of those layers). The
  // family's plan reads them (io/model_family.cpp).
  std::vector<LayerType> layer_types;
  int64_t sliding_window = 0;
  // The per-layer plan [num_hidden_layers], made by the family from the keys above (io/model_family.cpp). A config
  // built by hand with `layers` empty means every layer is dense attention + SwiGLU of intermediate_size with the
  // attention_bias / qk_norm flags (the Llama / Qwen2 / Qwen3 plan): see layer().
  std::vector<LayerSpec> layers;
  LayerSpec layer(int64_t l) const;
  bool has_moe() const;  // some layer's channel mixer is MoE
  bool has_linear_attention() const;  // some layer's token mixer is LinearAttention (a hybrid target)
  int64_t rope_dim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  // The attention geometry of a layer: its own head dim / kv heads (AttentionSpec), else the config's.
  int64_t head_dim_of(const LayerSpec& s) const { return s.attention.head_dim > 0 ? s.attention.head_dim : head_dim; }
  int64_t kv_heads_of(const LayerSpec& s) const {
    return s.attention.num_kv_heads > 0 ? s.attention.num_kv_heads : num_key_value_heads;
  }
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  // Prefixes of checkpoint tensors that are not the language model, read from this config beyond the family's own
  // (WeightNames::ignored): MiniMax-M2's MTP modules model.layers.{L + i}. (num_mtp_modules). dflash info counts them.
  std::vector<std::string> ignored_weights;
  std::string torch_dtype = "bfloat16";
  // The linears' storage (quantization_config): Plain, or FP8 with `fp8` (MXFP4 is the experts' alone:
  // moe.expert_format).
  WeightFormat linear_format = WeightFormat::Plain;
  Fp8Format fp8;
  // compressed-tensors pack-quantized INT4 (declared = false without): the routed experts it covers are kept INT4
  // (moe.expert_format INT4); the other linears stored INT4 are dequantised when loaded.
  Int4Format int4;
};

// config.json's quantization_config object `q` of file `src` into c (c.linear_format and c.fp8, c.int4 for
// compressed-tensors "pack-quantized", or c.moe.expert_format for "mxfp4"). Throws Error naming the file and the field
// for an unsupported quant_method, fmt, activation scheme (static scales), compressed-tensors format or strategy, an
// INT4 scheme other than symmetric 4-bit integers in groups of a multiple of 32 or per channel (zero points,
// other bit widths, actorder, quantized activations), or an ill-formed value. parse_model_config then sets
// c.moe.expert_format INT4 when c.int4 covers the family's routed experts.
void parse_quantization_config(const nlohmann::json& q, const std::string& src, ModelConfig& c);

// Parses `<dir>/config.json` (or a path to the file). Throws Error naming the file and the missing or
// ill-typed field; refuses unknown `architectures` / `model_type` by name.
ModelConfig load_model_config(const std::string& dir_or_file);
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source_name);

// rope_scaling / rope_parameters object `r` of config file `src` (`name` is its key, for messages) as a RopeScaling;
// original_max_position_embeddings defaults to `max_positions` (transformers' standardize_rope_params) for yarn.
// Throws Error naming the file and the field; an unsupported rope_type is refused by name.
RopeScaling parse_rope_scaling(const nlohmann::json& r, const std::string& src, const std::string& name,
                               int64_t max_positions = 0);
// The Hugging Face rope_scaling object of `rs` (rope_type and the keys of its kind; yarn's optional keys only when
// given), null for kind "none": what an exported drafter's config.json carries.
nlohmann::json rope_scaling_json(const RopeScaling& rs);
// RopeScaling as dflash's checkpoints store it (DrafterConfig's "rope_scaling", model/drafter.cpp): every member
// under its own name. Reading: kind, factor, low_freq_factor, high_freq_factor and original_max_position_embeddings
// are required; YaRN's keys, absent in checkpoints written before YaRN, keep the struct's defaults.
void to_json(nlohmann::json& j, const RopeScaling& rs);
void from_json(const nlohmann::json& j, RopeScaling& rs);

// Spec 1: nf == 1 -> [Lt/2]; else ids[i] = round(1 + i*(Lt-4)/(nf-1)).
std::vector<int64_t> default_target_layer_ids(int64_t num_target_layers, int64_t nf);

// The rule for target layer ids, whether given (--target-layer-ids, a config file) or read from an exported
// drafter: at least one; each a decoder layer in [0, num_target_layers) (num_target_layers <= 0: not checked);
// no layer twice; and in strictly increasing order. The order is not a free choice: it is the order of the column
// blocks of F = concat(h_after_layer(ids[i])) that fc.weight is trained on, and SGLang / vLLM rebuild F in the
// order of the exported list, so the trained order, the exported order and the served order must be one order —
// ascending, as every default and every public DFlash drafter has it. Throws Error naming the list and the first
// id that breaks the rule (a duplicate, an id out of range, an id after a larger one, with the sorted list).
void validate_target_layer_ids(const std::vector<int64_t>& ids, int64_t num_target_layers);

// The value of --mask-token-id that means "the tokenizer's mask token" (the only negative value accepted).
inline constexpr int64_t kAutoMaskTokenId = -1;
// Checks a mask token id as given by the user: kAutoMaskTokenId, or an id >= 0 (< vocab_size when vocab_size > 0).
// Throws Error naming `option` and the value for anything else.
void validate_mask_token_id(int64_t id, int64_t vocab_size = 0, const char* option = "--mask-token-id");

}  // namespace dflash
