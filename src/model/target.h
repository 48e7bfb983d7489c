// model/target.h — the frozen target LLM (inference only): a decoder built from parts, one layer loop for prefill
// with capture, KV-cached decode and batched generation.
// defines: TargetLayer, TargetWeights, TargetHead, TargetParams, target_params, Target (KVCache: target/cache.h)
//
// Forward: embedding; per layer l (its LayerSpec, made by the family from config.json: io/model_family.h)
//   h += token_mixer(RMSNorm_in(h))      the kind the plan names, through its descriptor (model/target/mixer.h):
//                                        causal attention, Gated DeltaNet linear attention or
//                                        multi-head latent attention
//   h += channel_mixer(RMSNorm_post(h))  dense SwiGLU or Mixture of Experts (model/target/mlp.h), with a shared
//                                        expert when the family has one (model/target/shared_expert.h)
// then the final RMSNorm and lm_head (tied to the embedding or not). RMSNorms scale by 1 + w when the config says
// zero_centred_norms. Gemma's options (io/hf_config.h): the embedding times embed_scale; sandwich norms (each mixer's
// output RMS-normed before its residual add) and h *= layer_scalar; the MoE block beside a dense MLP; soft-capped
// logits. Families: Llama, Qwen2, Qwen3, Qwen3-MoE, gpt-oss, Qwen3-Next, Qwen3.5 / Qwen3.6 (dense and MoE), Gemma 4
// (dense and MoE), MiniMax-M2, DeepSeek-V3 / Kimi-K2.
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
#include "model/target_stages.h"         // TargetStage

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
  Tensor mixer_out_norm, mlp_out_norm;  // spec.sandwich_norms: [H] (post_attention / post_feedforward_layernorm)
  double layer_scalar = 1.0;            // spec.layer_scalar: the checkpoint's value, else 1
  // MoE with a dense MLP beside the experts (MoeConfig::dense_beside_width; `mlp` holds the dense one): the experts'
  // input norm, each side's output norm [H], and ones [H] (the router's weightless RMSNorm).
  Tensor moe_in_norm, moe_out_norm, dense_out_norm, ones;
};

// All tensors on one device, in that context's compute dtype; immutable once built (safe to share between
// workers on the same device). A stage of a split target (model/target_stages.h) holds layers [first_layer,
// first_layer + layers.size()) only: the embedding when it starts at layer 0, the final norm and lm_head when it ends
// at the last layer (else undefined).
struct TargetWeights {
  Tensor embed;       // [V, H]
  Tensor lm_head;     // [V, H] (the same tensor as embed when tied and whole)
  Tensor final_norm;  // [H]
  Tensor inv_freq;    // [r/2] F32, RoPE frequencies (with scaling); r = cfg.rope_dim() (head_dim unless partial)
  Tensor inv_freq_alt;  // [rope_alt.dim / 2] F32 when cfg.rope_alt is defined (layers with AttentionSpec::rope_alt)
  int64_t first_layer = 0;          // layers[i] is decoder layer first_layer + i
  bool stage = false;               // a stage (Target::load_stage / random_stage): layers need not be all of them
  std::vector<TargetLayer> layers;
};

// The target's frozen embedding and lm_head alone (what a drafter on a device without a target worker needs), in
// ctx's compute dtype; lm_head is the same tensor as embed when tied. Errors as Target::load.
struct TargetHead {
  Tensor embed, lm_head;  // [V, H]
};
TargetHead load_target_head(const std::string& dir, Context& ctx);
TargetHead random_target_head(const ModelConfig& cfg, Context& ctx, uint64_t seed = 0);  // == Target::random's

// logits [R, V] act = hidden [R, H] (final-normed) @ lm_head^T, soft-capped when cfg says (final_logit_softcapping:
// cap tanh(logits / cap)): Target::logits, and a drafter's logits through the target's lm_head.
void target_logits(Context& ctx, const ModelConfig& cfg, const Tensor& lm_head, const Tensor& hidden,
                   const Tensor& out);

// Parameter counts of a target config: all of them, and those one token's forward uses (the router and its top_k
// experts of each MoE layer; the embedding row counted as one lookup: not at all); mxfp4 = those of total held in
// MXFP4 (the expert weights when moe.expert_format is MXFP4: gpt-oss's); int4 = those held in INT4 (the expert
// weights when moe.expert_format is INT4: Kimi-K2's) with int4_scales bf16 scales. `bf16_bytes` = 2 * total, the
// weights in bf16; `device_bytes` what they take on a CUDA device: 2 bytes per bf16 parameter, 17/32 byte per MXFP4
// one (half a byte, plus one scale byte per 32), half a byte per INT4 one plus 2 per INT4 scale; fp8 = those of total
// held in FP8 when the config declares FP8 linears (the layer projections: attention, Gated DeltaNet, dense and
// shared-expert SwiGLU; routed experts are dequantised to bf16), one byte each plus fp8_scale_bytes (one F32 per
// block). device_bytes(e): the same with e bytes per plain parameter (the context's compute dtype: 2 for bf16 on CUDA,
// 4 for F32 on "cpu", 8 on "cpu64"); MXFP4, INT4 and FP8 stay in their format on every backend.
struct TargetParams {
  int64_t total = 0, active = 0, embedding = 0, mxfp4 = 0, fp8 = 0, fp8_scale_bytes = 0, int4 = 0, int4_scales = 0;
  int64_t bf16_bytes() const { return 2 * total; }
  int64_t device_bytes(int64_t plain_bytes = 2) const {
    return plain_bytes * (total - mxfp4 - fp8 - int4) + mxfp4 / 32 * 17 + fp8 + fp8_scale_bytes + int4 / 2 +
           2 * int4_scales;
  }
  TargetParams& operator+=(const TargetParams& o);
};
TargetParams target_params(const ModelConfig& cfg);
// The terms of target_params for decoder layer l alone (0 <= l < num_hidden_layers; embedding 0): its norms, token
// mixer and channel mixer, fp8_scale_bytes those of its FP8 projections. target_params is the head's terms (embedding,
// lm_head unless tied, final norm) plus these over every layer.
TargetParams target_layer_params(const ModelConfig& cfg, int64_t l);

// Sequences stacked into one forward's rows (Target::forward_batch, forward_packed, SplitTarget): every sequence's ids
// in order, each row's position (its cache's len + t, or t without caches) and the segments (model/target/mixer.h).
struct StackedRows {
  std::vector<int32_t> ids, pos;
  std::vector<SeqSegment> segs;
};
// caches: one per sequence, or empty for none. Throws Error (prefixed with `what`) for no sequence, an empty one, a
// missing cache, a cache too small for its new rows, or an id outside [0, vocab).
StackedRows stack_rows(std::span<const std::vector<int32_t>> seqs, std::span<KVCache* const> caches, int64_t vocab,
                       const char* what);
// The largest of layer_ids (-1 when empty). Throws Error for an id outside [0, num_hidden_layers).
int64_t check_layer_ids(const ModelConfig& cfg, std::span<const int64_t> layer_ids);

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
  // One stage of a split target (train --target-split): layers [st.first, st.end) read from `dir` (only their tensors
  // are read from the mapped shards: no other layer's bytes are touched), the embedding when st.first == 0, the final
  // norm and lm_head (the embedding's values when tied) when st.end is the last layer. Errors as load.
  static std::shared_ptr<const Target> load_stage(const std::string& dir, Context& ctx, TargetStage st);
  // The same stage of Target::random(cfg, ctx, seed): bit-identical weights (the whole random target is drawn, then
  // the stage's tensors kept: its device holds the whole target for a moment).
  static std::shared_ptr<const Target> random_stage(const ModelConfig& cfg, Context& ctx, uint64_t seed, TargetStage st);
  // w holds every layer (first_layer 0) or a stage (first_layer + layers.size() <= num_hidden_layers). Throws Error
  // naming the layer whose weights disagree with the config's plan.
  Target(ModelConfig cfg, TargetWeights w);
  // The layers this target holds: [0, num_hidden_layers) unless it is a stage.
  TargetStage stage() const { return {w_.first_layer, w_.first_layer + static_cast<int64_t>(w_.layers.size())}; }
  bool whole() const { return w_.first_layer == 0 && static_cast<int64_t>(w_.layers.size()) == cfg_.num_hidden_layers; }

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
  // What flows from one stage of a split target to the next for one sequence (a micro-batch): the residual stream
  // after the stage's last layer and the features captured so far.
  struct StageState {
    Tensor h;         // [T, H] act
    Tensor features;  // [T, nf*H] act: the columns of the captured layers up to the stage's last one are written
  };
  // This target's layers (a stage, or the whole target) over one sequence of T tokens without a cache, at positions
  // 0..T-1: forward(ctx, ids, layer_ids, want_final) cut at the stage's boundaries. `ids` [T] I32 (host or device).
  // The stage holding layer 0 starts from the embedding (in: null); a later one from `in`, the state the stage before
  // returned (on any device: copied to ctx's). Layers after max(layer_ids) are skipped unless want_final. With
  // want_final, the stage holding the last layer also returns final_hidden [T, H] (RMSNorm_final(h)) in *final_hidden.
  // Every op is the one forward runs, on the same rows in the same order: the result is forward's, bit for bit, on
  // a deterministic backend. Throws Error for a stage after layer 0 without `in`, a state of another shape, ids
  // outside the vocabulary, or want_final without final_hidden at the last stage.
  StageState forward_stage(Context& ctx, const Tensor& ids, const StageState* in, std::span<const int64_t> layer_ids,
                           bool want_final, Tensor* final_hidden = nullptr) const;
  // The one layer loop behind every forward above and the split target (model/target_stages.h StagedTarget): this
  // target's layers [stage().first, min(stage().end, run_end)) over stacked rows. segs (model/target/mixer.h
  // SeqSegment) cut the R rows into sequences, each with or without a cache (rows appended at its cache->len; the
  // caller advances len after the last stage); pos [R] I32 on ctx's device, each row's position; ids [R] I32 on ctx's
  // device, read by the stage holding layer 0 only (the embedding), a later stage starting from *in (on any device:
  // copied to ctx's). Captures layer_ids' outputs into the state's features [R, nf*H]; with want_final the stage
  // holding the last layer writes RMSNorm_final(h) [R, H] to *final_hidden; each MoE layer run appends its experts
  // [R, k] (undefined for dense layers) to *router_topk when given. Throws Error as forward_stage.
  StageState run_stage(Context& ctx, const Tensor& ids, const Tensor& pos, std::span<const SeqSegment> segs,
                       const StageState* in, std::span<const int64_t> layer_ids, int64_t run_end, bool want_final,
                       Tensor* final_hidden, std::vector<Tensor>* router_topk = nullptr) const;
  // h [R, H] act = the embedding of ids [R] (I32 on ctx's device), times cfg.embed_scale when set (Gemma's scaled
  // embedding: HF's output_hidden_states[0]).
  void embed(Context& ctx, const Tensor& ids, const Tensor& h) const;
  // logits [R, V] act = hidden [R, H] (final-normed) @ lm_head^T, soft-capped when the config says
  // (final_logit_softcapping: cap tanh(logits / cap))
  void logits(Context& ctx, const Tensor& hidden, const Tensor& out) const;
  // A cache of `capacity` positions for this target (KVCache::create), recording each forward for a rollback when
  // `rollback` (speculative decoding's verification: KVCache::truncate(ctx, n)).
  KVCache make_cache(Context& ctx, int64_t capacity, bool rollback = false) const;

 private:
  // The decoder over stacked rows (ids, pos on the device): the one layer loop behind forward and forward_batch.
  Output run(Context& ctx, const Tensor& ids, const Tensor& pos, std::span<const SeqSegment> segs,
             std::span<const int64_t> layer_ids, int64_t run_layers, bool want_final) const;
  // Layers [l0, l1) (held by this target) on h [R, H], capturing layer_ids' outputs into out.features.
  void run_layers(Context& ctx, const Tensor& h, const Tensor& pos, std::span<const SeqSegment> segs,
                  std::span<const int64_t> layer_ids, int64_t l0, int64_t l1, Output& out) const;
  void final_norm(Context& ctx, const Tensor& h, const Tensor& y) const;

  ModelConfig cfg_;
  TargetWeights w_;
};

}  // namespace dflash
