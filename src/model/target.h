// model/target.h — the frozen target LLM: a Llama / Qwen2 / Qwen3 dense decoder (inference only).
// defines: TargetLayer, TargetWeights, KVCache, Target
//
// Forward: embedding; per layer  x = RMSNorm_in(h); q,k,v = x W^T (+ bias for Qwen2); q/k per-head RMSNorm
// (Qwen3); RoPE (incl. Llama-3 scaling); causal GQA attention; h += o Wo^T; h += down(silu(gate(y)) * up(y)),
// y = RMSNorm_post(h); final RMSNorm; lm_head (tied to the embedding or not).
// Captured features (spec 1): h_after_layer(l) = the residual stream AFTER decoder layer l (0-based), before
// the final norm — HF's output_hidden_states[l + 1]. Never the full-vocabulary logits of every position.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/context.h"
#include "io/hf_config.h"

namespace dflash {

struct TargetLayer {
  Tensor in_norm, post_norm;           // [H]
  Tensor wq, wk, wv, wo;               // [nh*d, H], [nkv*d, H], [nkv*d, H], [H, nh*d]
  Tensor bq, bk, bv;                   // biases (Qwen2) or undefined
  Tensor q_norm, k_norm;               // [d] (Qwen3) or undefined
  Tensor w_gate, w_up, w_down;         // [I, H], [I, H], [H, I]
};

// All tensors on one device, in that context's compute dtype; immutable once built (safe to share between
// workers on the same device).
struct TargetWeights {
  Tensor embed;       // [V, H]
  Tensor lm_head;     // [V, H] (the same tensor as embed when tied)
  Tensor final_norm;  // [H]
  Tensor inv_freq;    // [d/2] F32, RoPE frequencies (with scaling)
  std::vector<TargetLayer> layers;
};

// Per-sequence key/value cache: k, v [capacity, nkv, d] per layer; positions 0..len-1 are filled.
struct KVCache {
  std::vector<Tensor> k, v;
  int64_t len = 0, capacity = 0;
  static KVCache create(Context& ctx, const ModelConfig& cfg, int64_t capacity);
  void truncate(int64_t new_len);  // forget positions >= new_len (rejected draft tokens)
};

// The target's frozen embedding and lm_head alone (what a drafter on a device without a target worker needs), in
// ctx's compute dtype; lm_head is the same tensor as embed when tied. Errors as Target::load.
struct TargetHead {
  Tensor embed, lm_head;  // [V, H]
};
TargetHead load_target_head(const std::string& dir, Context& ctx);
TargetHead random_target_head(const ModelConfig& cfg, Context& ctx, uint64_t seed = 0);  // == Target::random's

class Target {
 public:
  // Reads `dir` (config.json + safetensors) onto ctx's device in ctx.compute_dtype(). Errors name the file
  // and tensor. Tensors of the HF names model.embed_tokens.weight, model.layers.{i}.*, model.norm.weight,
  // lm_head.weight (absent when tied).
  static std::shared_ptr<const Target> load(const std::string& dir, Context& ctx);
  // A target of config `cfg` with random weights (benchmarks without a checkpoint: Linear ~ N(0, 0.02), norms 1),
  // drawn on ctx's device by fill_normal(seed, RandomTarget, tensor index): identical on every device.
  static std::shared_ptr<const Target> random(const ModelConfig& cfg, Context& ctx, uint64_t seed = 0);
  Target(ModelConfig cfg, TargetWeights w);

  const ModelConfig& config() const { return cfg_; }
  const TargetWeights& weights() const { return w_; }

  struct Output {
    Tensor features;      // [T, nf*H] act: h_after_layer(layer_ids[i]) in columns [i*H, (i+1)*H)
    Tensor final_hidden;  // [T, H] act (final-norm output), defined when want_final
  };
  // Runs token ids [T] (I32, on ctx's device or host) at positions start..start+T-1, where start = cache->len
  // (the tokens are appended to the cache) or 0 without a cache. Without a cache, layers after max(layer_ids) are
  // skipped unless want_final. Throws Error for ids outside the vocabulary or a full cache.
  Output forward(Context& ctx, const Tensor& ids, std::span<const int64_t> layer_ids, bool want_final,
                 KVCache* cache = nullptr) const;
  // Batched forward of several sequences, each with its own KV cache (generation; defined in
  // model/target_batch.cpp). Sequence i's ids[i] (host I32 values, T_i >= 1) run at positions
  // caches[i]->len .. caches[i]->len + T_i - 1 and are appended to caches[i]. The rows of all sequences are stacked
  // in sequence order ([sum T_i, H]) so every projection and the MLP are one GEMM each; RoPE gets per-row
  // positions; attention runs per sequence over its own cache. Output rows follow the same stacking. Per
  // sequence the result equals forward(ctx, ids[i], layer_ids, want_final, caches[i]) up to GEMM rounding.
  // Throws Error for a size mismatch, an empty sequence, ids outside the vocabulary or a full cache.
  Output forward_batch(Context& ctx, std::span<const std::vector<int32_t>> ids, std::span<KVCache* const> caches,
                       std::span<const int64_t> layer_ids, bool want_final) const;
  // logits [R, V] act = hidden [R, H] (final-normed) @ lm_head^T
  void logits(Context& ctx, const Tensor& hidden, const Tensor& out) const;

 private:
  // Rows [begin, end) of the stacked input are one sequence at positions start.. : with a cache they are appended
  // to it and attend to its prefix; without one they attend causally among themselves (start = 0).
  struct Segment {
    int64_t begin, end, start;
    KVCache* cache;
  };
  // The decoder over stacked rows (ids, pos on the device): the one layer loop behind forward and forward_batch.
  Output run(Context& ctx, const Tensor& ids, const Tensor& pos, std::span<const Segment> segs,
             std::span<const int64_t> layer_ids, int64_t run_layers, bool want_final) const;

  ModelConfig cfg_;
  TargetWeights w_;
};

}  // namespace dflash
