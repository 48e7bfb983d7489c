// model/target/attention.h — the target's token mixer: causal GQA softmax attention with RoPE, and its KV cache.
// defines: KVCache, AttentionWeights, AttnSegment, load_attention, attention_forward, attention_params
//
// Per layer (transformers' LlamaAttention / Qwen2Attention / Qwen3Attention / Qwen3MoeAttention / GptOssAttention):
//   q, k, v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)          x = RMSNorm_in(h), [R, H]
//   q, k = RMSNorm_head(q), RMSNorm_head(k)                       (qk_norm: per head over d)
//   q, k = RoPE(q), RoPE(k)                                       (rotate-half, at each row's position)
//   h += softmax(q k^T af^2 / sqrt(d) + causal) v Wo^T (+bo)     (GQA: nh / nkv query heads per kv head)
// af = YaRN's attention factor (1 without YaRN: RopeScaling::attention_scaling); with a sliding window W the query
// at p sees keys p - W + 1 .. p; with sinks a per-head logit joins the softmax's denominator (gpt-oss:
// backend/context.h CausalAttnOpts).
#pragma once
#include <span>
#include <string>
#include <vector>

#include "backend/context.h"
#include "io/hf_config.h"
#include "model/target/weights.h"

namespace dflash {

// Per-sequence key/value cache: k, v [capacity, nkv, d] per layer; positions 0..len-1 are filled.
struct KVCache {
  std::vector<Tensor> k, v;
  int64_t len = 0, capacity = 0;
  static KVCache create(Context& ctx, const ModelConfig& cfg, int64_t capacity);
  void truncate(int64_t new_len);  // forget positions >= new_len (rejected draft tokens)
};

struct AttentionWeights {
  Tensor wq, wk, wv, wo;  // [nh*d, H], [nkv*d, H], [nkv*d, H], [H, nh*d]
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
// calls: wq, wk, wv, wo, [bq, bk, bv], [q_norm, k_norm], [bo], [sinks].
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
