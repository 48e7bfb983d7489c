// model/split_target.h — a target over one or several devices as one object, for a single caller thread (eval and
// generate: one sequence, or one batch of decoding sequences, flows through the stages in turn).
// defines: SplitTarget
//
// Stage s holds the consecutive layers model/target_stages.h split_target_layers gives it (Target::load_stage) and
// runs on its own Context; the residual stream and the features captured so far go from each stage to the next
// (Target::run_stage, the layer loop every forward uses), so a split run computes what the whole target does on one
// device, op for op: the same result bit for bit on a deterministic backend (tests/model/split_target.cpp). A KV
// cache keeps each layer's part on its stage's device (KVCache::create with per-layer contexts).
// Training splits its target workers itself (train/target_worker.h: stages in threads of their own, micro-batches in
// flight); this object is the sequential form for decoding.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/target.h"

namespace dflash {

class SplitTarget {
 public:
  // One stage: the whole target, run on the context each call passes (the unsplit case; implicit, so that a Target
  // goes where a SplitTarget is taken). `whole` must outlive this object.
  SplitTarget(const Target& whole);  // NOLINT(google-explicit-constructor)
  // Stages in layer order, stage s on *ctxs[s] (contexts and targets outlive this object; a context may hold several
  // stages). Throws Error unless the stages cover layers 0 .. num_hidden_layers - 1 in order, one context each.
  SplitTarget(std::vector<Context*> ctxs, std::vector<std::shared_ptr<const Target>> stages);
  // The target in `dir` cut into ctxs.size() stages (split_target_layers), stage s read onto *ctxs[s]
  // (Target::load_stage: only its layers' tensors are read); one context: Target::load. Errors as Target::load and
  // split_target_layers.
  static SplitTarget load(const std::string& dir, std::vector<Context*> ctxs);

  const ModelConfig& config() const { return stages_.front()->config(); }
  int size() const { return static_cast<int>(stages_.size()); }
  const Target& stage(int s) const { return *stages_[static_cast<size_t>(s)]; }

  // Target::forward, forward_batch, logits and make_cache over the stages, called from `ctx` (the caller's device):
  // ids and hidden rows from the host or ctx's device; outputs (features, final_hidden, logits) on ctx's device. With
  // one stage they are Target's own calls on ctx. router_topk: each MoE layer's tensor on its stage's device. Errors
  // as Target's.
  Target::Output forward(Context& ctx, const Tensor& ids, std::span<const int64_t> layer_ids, bool want_final,
                         KVCache* cache = nullptr) const;
  Target::Output forward_batch(Context& ctx, std::span<const std::vector<int32_t>> ids,
                               std::span<KVCache* const> caches, std::span<const int64_t> layer_ids,
                               bool want_final) const;
  // logits [R, V] on ctx = hidden [R, H] (final-normed, on ctx) through the last stage's lm_head (and soft-cap)
  void logits(Context& ctx, const Tensor& hidden, const Tensor& out) const;
  // A cache whose layer l lives on the device of the stage holding l (one stage: ctx's), recording each forward for
  // a rollback when `rollback`.
  KVCache make_cache(Context& ctx, int64_t capacity, bool rollback = false) const;
  // KVCache::truncate with each layer's rollback on its stage's context (one stage: ctx).
  void truncate(Context& ctx, KVCache& cache, int64_t new_len) const;
  // The embedding and lm_head on ctx's device, for a drafter there: the target's own tensors when the stage holding
  // them runs on ctx (or with one stage), else copies made on ctx.
  TargetHead head(Context& ctx) const;

 private:
  // The context of each layer (num_hidden_layers entries) for caches; one stage: ctx.
  std::vector<Context*> layer_contexts(Context& ctx) const;
  // The stages' forward over stacked rows (pos_host: each row's position), as Target::forward_batch runs it whole.
  Target::Output run(Context& ctx, const std::vector<int32_t>& ids_host, const std::vector<int32_t>& pos_host,
                     std::span<const SeqSegment> segs, std::span<const int64_t> layer_ids, int64_t run_end,
                     bool want_final) const;

  std::vector<Context*> ctxs_;                          // [S]; empty: one stage run on the caller's context
  std::vector<std::shared_ptr<const Target>> stages_;   // [S]
};

}  // namespace dflash
