// model/target.h — the frozen target LLM (inference only): a decoder built from parts, one layer loop for prefill
// with capture, KV-cached decode and batched generation.
// defines: TargetLayer, TargetWeights, TargetHead, TargetParams, target_params, Target (KVCache: target/cache.h)
//
// Forward: embedding; per layer l (its LayerSpec, made by the family from config.json: io/model_family.h)
//   h += token_mixer(RMSNorm_in(h))      the kind the plan names, through its descriptor (model/target/mixer.h):
//                                        causal attention or Gated DeltaNet linear attention
//   h += channel_mixer(RMSNorm_post(h))  dense SwiGLU or Mixture of Experts (model/target/mlp.h), with a shared
//                                        expert when the family has one (model/target/shared_expert.h)
// then the final RMSNorm and lm_head (tied to the embedding or not). RMSNorms scale by 1 + w when the config says
// zero_centred_norms. Families: Llama, Qwen2, Qwen3, Qwen3-MoE, gpt-oss, Qwen3-Next, Qwen3.5 / Qwen3.6 (dense and
// MoE).
// Captured features (spec 1): h_after_layer(l) = the residual stream AFTER decoder layer l (0-based), before
// the final norm — HF's output_hidden_states[l + 1]. Never the full-vocabulary logits of every position.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/context.h"
#include "io/hf_config.h"
#include "model/target/cache.h"          // KVCache
#include "model/target/mixer.h"          // MixerWeights, SeqSegment
#include "model/target/mlp.h"            // DenseMlpWeights, MoeLayerWeights
#include "model/target/shared_expert.h"  // SharedExpertWeights

namespace dflash {

// One decoder layer: its plan (set from the config by Target's constructor) and the weights of its mixers (the
// channel mixer's of spec.mlp only).
struct TargetLayer {
  LayerSpec spec;
  Tensor in_norm, post_norm;  // [H]
  MixerWeights mixer;         // the token mixer's, of spec.mixer's kind (AttentionWeights, LinearAttnWeights)
  DenseMlpWeights mlp;        // spec.mlp == Dense
  MoeLayerWeights moe;        // spec.mlp == MoE
  SharedExpertWeights shared; // spec.mlp == MoE and moe.shared_expert_width > 0
};

// All tensors on one device, in that context's compute dtype; immutable once built (safe to share between
// workers on the same device).
struct TargetWeights {
  Tensor embed;       // [V, H]
  Tensor lm_head;     // [V, H] (the same tensor as embed when tied)
  Tensor final_norm;  // [H]
  Tensor inv_freq;    // [r/2] F32, RoPE frequencies (with scaling); r = cfg.rope_dim() (head_dim unless partial)
  std::vector<TargetLayer> layers;
};

// The target's frozen embedding and lm_head alone (what a drafter on a device without a target worker needs), in
// ctx's compute dtype; lm_head is the same tensor as embed when tied. Errors as Target::load.
struct TargetHead {
  Tensor embed, lm_head;  // [V, H]
};
TargetHead load_target_head(const std::string& dir, Context& ctx);
TargetHead random_target_head(const ModelConfig& cfg, Context& ctx, uint64_t seed = 0);  // == Target::random's

// Parameter counts of a target config: all of them, and those one token's forward uses (the router and its top_k
// experts of each MoE layer; the embedding row counted as one lookup: not at all); mxfp4 = those of total held in
// MXFP4 (the expert weights when moe.expert_format is MXFP4: gpt-oss's). `bf16_bytes` = 2 * total, the weights in bf16;
// `device_bytes` what they take on a CUDA device: 2 bytes per bf16 parameter and 17/32 byte per MXFP4 one (half a
// byte, plus one scale byte per 32); fp8 = those of total held in FP8 when the config declares FP8 linears (the
// layer projections: attention, Gated DeltaNet, dense and shared-expert SwiGLU; routed experts are dequantised to
// bf16), one byte each plus fp8_scale_bytes (one F32 per block).
struct TargetParams {
  int64_t total = 0, active = 0, embedding = 0, mxfp4 = 0, fp8 = 0, fp8_scale_bytes = 0;
  int64_t bf16_bytes() const { return 2 * total; }
  int64_t device_bytes() const { return 2 * (total - mxfp4 - fp8) + mxfp4 / 32 * 17 + fp8 + fp8_scale_bytes; }
};
TargetParams target_params(const ModelConfig& cfg);

class Target {
 public:
  // Reads `dir` (config.json + safetensors, one file or shards with model.safetensors.index.json) onto ctx's device
  // in ctx.compute_dtype(). Errors name the file and tensor. Tensor names are the family's (io/model_family.h):
  // model.embed_tokens.weight, model.layers.{i}.*, model.norm.weight, lm_head.weight (absent when tied).
  static std::shared_ptr<const Target> load(const std::string& dir, Context& ctx);
  // A target of config `cfg` with random weights (benchmarks without a checkpoint: Linear ~ N(0, 0.02), norms 1),
  // drawn on ctx's device by fill_normal(seed, RandomTarget, tensor index): identical on every device. With MoE
  // layers the router logits of random weights are nearly equal, so the experts are chosen almost uniformly.
  static std::shared_ptr<const Target> random(const ModelConfig& cfg, Context& ctx, uint64_t seed = 0);
  Target(ModelConfig cfg, TargetWeights w);

  const ModelConfig& config() const { return cfg_; }
  const TargetWeights& weights() const { return w_; }

  struct Output {
    Tensor features;      // [T, nf*H] act: h_after_layer(layer_ids[i]) in columns [i*H, (i+1)*H)
    Tensor final_hidden;  // [T, H] act (final-norm output), defined when want_final
    // Per layer run: the experts each row chose, [T, k] I32 on the device (MoE layers; undefined for dense ones).
    std::vector<Tensor> router_topk;
  };
  // Runs token ids [T] (I32, on ctx's device or host) at positions start..start+T-1, where start = cache->len
  // (the tokens are appended to the cache) or 0 without a cache. Without a cache, layers after max(layer_ids) are
  // skipped unless want_final. Throws Error for ids outside the vocabulary or a full cache.
  Output forward(Context& ctx, const Tensor& ids, std::span<const int64_t> layer_ids, bool want_final,
                 KVCache* cache = nullptr) const;
  // One sequence without a cache at explicit positions pos[t] (host I32, as HF's position_ids; causal attention over
  // the rows in their order, the positions only turn RoPE). Every layer runs. Throws Error for a size mismatch or
  // ids outside the vocabulary.
  Output forward_at(Context& ctx, const Tensor& ids, const std::vector<int32_t>& pos,
                    std::span<const int64_t> layer_ids, bool want_final) const;
  // Batched forward of several sequences, each with its own KV cache (generation; defined in
  // model/target_batch.cpp). Sequence i's ids[i] (host I32 values, T_i >= 1) run at positions
  // caches[i]->len .. caches[i]->len + T_i - 1 and are appended to caches[i]. The rows of all sequences are stacked
  // in sequence order ([sum T_i, H]) so every projection and the MLP are one GEMM each; RoPE gets per-row
  // positions; attention runs per sequence over its own cache. Output rows follow the same stacking. Per
  // sequence the result equals forward(ctx, ids[i], layer_ids, want_final, caches[i]) up to GEMM rounding.
  // Throws Error for a size mismatch, an empty sequence, ids outside the vocabulary or a full cache.
  Output forward_batch(Context& ctx, std::span<const std::vector<int32_t>> ids, std::span<KVCache* const> caches,
                       std::span<const int64_t> layer_ids, bool want_final) const;
  // Several sequences without caches in one pass (a batch's prefill): sequence i's ids[i] (host I32, T_i >= 1) at
  // positions 0 .. T_i - 1, causal within itself; rows stacked in sequence order, every projection and expert GEMM one
  // call over all rows. Layers after max(layer_ids) are skipped unless want_final. Per sequence the result equals
  // forward(ctx, ids[i], layer_ids, want_final) up to GEMM rounding. Throws Error as forward_batch.
  Output forward_packed(Context& ctx, std::span<const std::vector<int32_t>> ids, std::span<const int64_t> layer_ids,
                        bool want_final) const;
  // logits [R, V] act = hidden [R, H] (final-normed) @ lm_head^T
  void logits(Context& ctx, const Tensor& hidden, const Tensor& out) const;
  // A cache of `capacity` positions for this target (KVCache::create), recording each forward for a rollback when
  // `rollback` (speculative decoding's verification: KVCache::truncate(ctx, n)).
  KVCache make_cache(Context& ctx, int64_t capacity, bool rollback = false) const;

 private:
  // The decoder over stacked rows (ids, pos on the device): the one layer loop behind forward and forward_batch.
  Output run(Context& ctx, const Tensor& ids, const Tensor& pos, std::span<const SeqSegment> segs,
             std::span<const int64_t> layer_ids, int64_t run_layers, bool want_final) const;

  ModelConfig cfg_;
  TargetWeights w_;
};

}  // namespace dflash
