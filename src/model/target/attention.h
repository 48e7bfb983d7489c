// model/target/attention.h — causal GQA softmax attention with RoPE, one token-mixer kind of the target (its
// descriptor: model/target/attention.cpp, in the table of model/target/mixer.h), and its weights.
// defines: AttentionWeights
//
// Per layer (transformers' LlamaAttention / Qwen2Attention / Qwen3Attention / Qwen3MoeAttention / GptOssAttention /
// Qwen3NextAttention):
//   q, k, v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)          x = RMSNorm_in(h), [R, H]
//   q, k = RMSNorm_head(q), RMSNorm_head(k)                       (qk_norm: per head over d; zero-centred weights
//                                                                  when cfg.zero_centred_norms)
//   q, k = RoPE(q), RoPE(k)                                       (rotate-half, at each row's position; the first
//                                                                  cfg.rope_dim() dims of a head)
//   v = RMSNorm_head(v) without a weight                          (v_norm; with k_eq_v: v = the k projection)
//   o = softmax(q k^T af^2 / sqrt(d) + causal) v                  (GQA: nh / nkv query heads per kv head; scale:
//                                                                  AttentionSpec::scale when set, Gemma 4's 1)
//   o = o * sigmoid(x Wg^T)                                       (output_gate: Wg = the gate rows of q_proj)
//   h += o Wo^T (+bo)
// af = YaRN's attention factor (1 without YaRN: RopeScaling::attention_scaling); with a sliding window W the query
// at p sees keys p - W + 1 .. p; with sinks a per-head logit joins the softmax's denominator (gpt-oss:
// backend/context.h CausalAttnOpts). The options are the layer's AttentionSpec (io/hf_config.h).
//
// Checkpoint (names under "model.layers.{l}." of the family's WeightNames; loaded in this order: a random target
// draws in it): q, k, v, o ".weight", [q, k, v ".bias"], [q_norm, k_norm], [o ".bias"], [sinks]. With output_gate,
// q_proj is [nh 2d, H], per head d query rows then d gate rows (Qwen3NextAttention's chunk of the view [.., nh, 2d]):
// split into wq and wg.
// Cache (model/target/cache.h): positional, k and v [capacity, nkv, d] act; the rows of a forward with a cache are
// written at positions start.. and its queries attend to positions 0 .. start + T - 1 of them.
#pragma once
#include "backend/context.h"  // Tensor

namespace dflash {

// d = cfg.head_dim_of(spec), nh = num_attention_heads, nkv = cfg.kv_heads_of(spec) (the layer's own with Gemma 4's
// full-attention layers); in the compute dtype unless said. With spec.k_eq_v there is no v_proj (wv undefined).
struct AttentionWeights {
  LinearWeight wq, wk, wv, wo;  // [nh*d, H], [nkv*d, H], [nkv*d, H], [H, nh*d]; plain or FP8
  LinearWeight wg;  // spec.output_gate: [nh*d, H], the gate rows of q_proj; else undefined
  Tensor bq, bk, bv;      // spec.bias: [nh*d], [nkv*d], [nkv*d]; else undefined
  Tensor q_norm, k_norm;  // spec.qk_norm: [d]; else undefined
  Tensor bo;              // spec.out_bias: [H]; else undefined
  Tensor sinks;           // spec.sinks: [nh] F32; else undefined
  Tensor v_ones;          // spec.v_norm: [d] ones, the weight of the values' weightless RMSNorm; else undefined
};

}  // namespace dflash
