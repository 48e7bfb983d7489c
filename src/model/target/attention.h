// model/target/attention.h — the target's token mixer: causal GQA softmax attention with RoPE, and its KV cache.
// defines: KVCache, AttentionWeights, AttnSegment, load_attention, attention_forward, attention_params
//
// Per layer (transformers' LlamaAttention / Qwen2Attention / Qwen3Attention / Qwen3MoeAttention / GptOssAttention /
// Qwen3NextAttention):
//   q, k, v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)          x = RMSNorm_in(h), [R, H]
//   q, k = RMSNorm_head(q), RMSNorm_head(k)                       (qk_norm: per head over d; zero-centred weights
//                                                                  when cfg.zero_centred_norms)
//   q, k = RoPE(q), RoPE(k)                                       (rotate-half, at each row's position; the first
//                                                                  cfg.rope_dim() dims of a head)
//   o = softmax(q k^T af^2 / sqrt(d) + causal) v                  (GQA: nh / nkv query heads per kv head)
//   o = o * sigmoid(x Wg^T)                                       (output_gate: Wg = the gate rows of q_proj)
//   h += o Wo^T (+bo)
// af = YaRN's attention factor (1 without YaRN: RopeScaling::attention_scaling); with a sliding window W the query
// at p sees keys p - W + 1 .. p; with sinks a per-head logit joins the softmax's denominator (gpt-oss:
// backend/context.h CausalAttnOpts).
#pragma once
#include <span>
#include <string>
#include <vector>

#include "backend/context.h"
#include "io/hf_config.h"
#include "model/target/linear_attention.h"
#include "model/target/weights.h"

namespace dflash {

// Per-sequence cache: k, v [capacity, nkv, d] per attention layer; positions 0..len-1 are filled. A hybrid target's
// linear-attention layers hold their window and recurrent state in lin[l] instead (their k, v are undefined; lin is
// empty for a target without them).
struct KVCache {
  std::vector<Tensor> k, v;
  std::vector<LinearAttnState> lin;
  LinearAttnConfig linear;   // the shapes of lin's layers
  int64_t len = 0, capacity = 0;
  // Record each forward's linear-attention inputs so that truncate can roll the state back (speculative decoding's
  // verification); off: a forward keeps nothing beyond the state (generation).
  bool keep_rollback = false;
  static KVCache create(Context& ctx, const ModelConfig& cfg, int64_t capacity);
  // Forget positions >= new_len (rejected draft tokens). Attention layers just shorten; linear-attention layers roll
  // their state back (rollback_linear_state), which is possible only into the last forward with keep_rollback:
  // new_len in [its start, len]. Throws Error otherwise. The overload without a context serves caches without
  // linear-attention layers (and new_len == len).
  void truncate(Context& ctx, int64_t new_len);
  void truncate(int64_t new_len);
  bool has_linear() const { return !lin.empty(); }
};

struct AttentionWeights {
  LinearWeight wq, wk, wv, wo;  // [nh*d, H], [nkv*d, H], [nkv*d, H], [H, nh*d]; plain or FP8
  LinearWeight wg;  // spec.output_gate: [nh*d, H], the gate rows of q_proj; else undefined
  Tensor bq, bk, bv;      // spec.bias: [nh*d], [nkv*d], [nkv*d]; else undefined
  Tensor q_norm, k_norm;  // spec.qk_norm: [d]; else undefined
  Tensor bo;              // spec.out_bias: [H]; else undefined
  Tensor sinks;           // spec.sinks: [nh] F32; else undefined
};

// Rows [begin, end) of the stacked input are one sequence at positions start.. : with a cache they are appended
// to it and attend to its prefix; without one they attend causally among themselves (start = 0).
struct AttnSegment {
  int64_t begin, end, start;
  KVCache* cache;
};

// The layer's attention weights under `prefix` ("model.layers.{l}."), names of `names`. Order of the source's
// calls: wq, wk, wv, wo, [bq, bk, bv], [q_norm, k_norm], [bo], [sinks]. With output_gate, q_proj is [nh 2d, H], per
// head d query rows then d gate rows (Qwen3NextAttention's chunk of the view [.., nh, 2d]): split into wq and wg.
AttentionWeights load_attention(WeightSource& src, const std::string& prefix, const WeightNames& names,
                                const ModelConfig& cfg, const AttentionSpec& spec);

// h [R, H] += attention(x) for layer l: x [R, H] act (normed), pos [R] I32 on the device, segs partition the rows;
// each segment with a cache gets its new k / v at positions start.. of layer l's cache.
void attention_forward(Context& ctx, const AttentionWeights& w, const AttentionSpec& spec, const ModelConfig& cfg,
                       int64_t l, const Tensor& x, const Tensor& pos, const Tensor& inv_freq,
                       std::span<const AttnSegment> segs, const Tensor& h);

// Parameters of one layer's attention (weights, biases, norms, sinks).
int64_t attention_params(const ModelConfig& cfg, const AttentionSpec& spec);

}  // namespace dflash
