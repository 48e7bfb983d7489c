// model/target/latent_attention.h — multi-head latent attention (MLA: DeepSeek-V2 / V3, Kimi-K2), one token-mixer kind
// of the target (its descriptor: model/target/latent_attention.cpp, in the table of model/target/mixer.h), run in the
// expanded form, and its weights.
// defines: LatentAttnWeights
//
// Per layer (transformers' DeepseekV3Attention; vLLM's DeepseekV2MLAAttention serves the same function absorbed),
// with nope = qk_nope_head_dim, r = qk_rope_head_dim, dq = nope + r, dv = v_head_dim (io/hf_config.h MlaConfig):
//   q      = x Wq^T, or RMSNorm_qa(x Wqa^T) Wqb^T (q_lora_rank)      [R, nh, dq]: per head [q_nope | q_rope]
//   c, kr  = x Wkva^T split [kv_lora_rank | r]                         the latent and one RoPE key for all heads
//   kv     = RMSNorm_kva(c) Wkvb^T                                     [R, nh, nope + dv]: per head [k_nope | v]
//   q_rope, kr = RoPE(q_rope), RoPE(kr)                                rotate-half at each row's position over r dims
//                                                                      (with rope_interleave the weights' RoPE rows are
//                                                                      reordered when loaded: below)
//   k      = [k_nope | kr] per head                                    [R, nh, dq]
//   o      = softmax(q k^T s + causal) v                               s = AttentionSpec::scale (qk_head_dim^-1/2
//                                                                      times YaRN's mscale_all_dim factor squared)
//   h     += o Wo^T                                                    Wo [H, nh dv]
// YaRN's attention factor af (RopeScaling::attention_scaling, 1 when mscale == mscale_all_dim as published) multiplies
// transformers' cos and sin, i.e. q_rope and kr: here q_rope alone is multiplied by af^2 after its RoPE.
//
// rope_interleave (transformers' apply_rotary_pos_emb_interleave): the RoPE dims of q and kr come out of the
// projections as interleaved pairs (2i, 2i + 1); transformers reorders them to [evens | odds] and turns them
// rotate-half. The same reordering is applied once to the weights' RoPE rows when loaded (row i of the r RoPE rows of
// every head of Wq / Wqb and of Wkva's RoPE rows takes row 2i for i < r/2, row 2(i - r/2) + 1 after), so the forward
// is the plain rotate-half one. FP8 weights keep their scales when each head's RoPE rows lie in one block (the
// published 128-row blocks: heads of 192 rows with the RoPE rows last, and Wkva's 512..575), else they are
// dequantised when loaded.
//
// The expanded form: k and v are materialised per head and the attention ops run as multi-head attention over dq
// dims; v is padded with zeros from dv to dq (the ops take one head dim) and the output's first dv dims kept. Its
// cost: v's cache and the P V product are dq / dv = 1.5x (DeepSeek-V3) what v needs; the cache holds the expanded
// k and v, 2 nh dq values per token and layer (49152 at DeepSeek-V3's shapes) where the absorbed form's latent cache
// holds kv_lora_rank + r = 576 (vLLM's). kr is broadcast to the heads by one GEMM with a stacked identity [nh r, r]
// (exact: one product of 1 per output).
// Checkpoint (names under "model.layers.{l}."; loaded in this order: a random target draws in it): q_proj.weight, or
// q_a_proj.weight, q_a_layernorm.weight, q_b_proj.weight; kv_a_proj_with_mqa.weight, kv_a_layernorm.weight,
// kv_b_proj.weight, o_proj.weight (all under self_attn.). No biases (attention_bias is refused by the family).
// Cache (model/target/cache.h): positional, k and v [capacity, nh, dq] act (v's last dq - dv dims zero).
#pragma once
#include "backend/context.h"  // Tensor, LinearWeight

namespace dflash {

struct LatentAttnWeights {
  LinearWeight wq;                // no q_lora_rank: [nh dq, H]; else undefined
  LinearWeight wq_a;              // [q_lora_rank, H]
  Tensor q_a_norm;                // [q_lora_rank]
  LinearWeight wq_b;              // [nh dq, q_lora_rank]
  LinearWeight wkv_a;             // [kv_lora_rank + r, H]
  Tensor kv_a_norm;               // [kv_lora_rank]
  LinearWeight wkv_b;             // [nh (nope + dv), kv_lora_rank]
  LinearWeight wo;                // [H, nh dv]
  Tensor heads_eye;               // [nh r, r] act: nh identities stacked (kr's broadcast to the heads); not a parameter
};

}  // namespace dflash
