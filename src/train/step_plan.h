// train/step_plan.h — the host-side plan of one global optimizer step (spec 2.1-2.4), made before any worker
// starts it: which sequences form the global batch (the seeded data order), their anchors and DraftBatches, the
// global loss normaliser (sum of weights over every drafter; with D-PACE, whose weights exist only after the
// forward, the number of supervised slots, as speculators normalises it: no collective after the forward), and the
// split of the sequences over the drafters, balanced by work. The plan depends only on (data, seed, step) and the
// number of drafters; the global batch, its anchors and sum_w do not depend on the number of drafters at all, so D
// drafters compute the loss and gradients of one drafter on the same batch (up to the order of floating-point sums).
// defines: PlanConfig, SeqPlan, StepPlan, StepPlanner, PlanBook, count_trainable_samples
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "io/dataset.h"
#include "model/draft_batch.h"

namespace dflash {

struct PlanConfig {
  int64_t batch_size = 8;    // sequences per optimizer step (global, over all drafters)
  int64_t max_anchors = 512;
  int64_t max_length = 0;    // 0 = as prepared
  int64_t block_size = 16;
  int32_t mask_token_id = -1;
  double gamma = 7;          // <= 0: uniform weights
  double dpace_alpha = 0;    // > 0: D-PACE weights (model/draft_loss.h); the normaliser is then the number of
                             // supervised slots of the global batch, which the weights do not change
  uint64_t seed = 0;
  int drafters = 1;          // global number of drafter workers
};

struct SeqPlan {
  int64_t k = 0;                        // position in the global batch, 0 .. batch_size-1
  size_t sample = 0;                    // index into the data set
  std::span<const int32_t> tokens;      // [S] after --max-length
  std::span<const uint8_t> loss_mask;   // [S]
  DraftBatch batch;                     // anchors (Rng(seed, Anchors, step, k)), blocks, labels, weights
  int drafter = 0;                      // global drafter rank that trains on it
  int64_t work() const { return batch.S * batch.N; }  // tokens x anchors: the balance key
};

struct StepPlan {
  int64_t step = 0;                     // 0-based optimizer step
  std::vector<SeqPlan> seqs;            // the sequences with at least one anchor, in batch order
  int64_t skipped = 0;                  // sequences of the batch without a candidate anchor (spec 2.1.3)
  double sum_w = 0;                     // the global loss normaliser: sum of w over every sequence (D-PACE: of m)
  std::vector<std::vector<int>> by_drafter;  // [drafters] indices into seqs, in batch order
  int64_t target_tokens = 0, draft_tokens = 0;  // sum S, sum N*B over seqs
  bool empty() const { return sum_w == 0; }  // no supervised pair anywhere: no update (same control path)
};

// Makes plans. Not thread-safe (keeps the current epoch's permutation); PlanBook serialises access.
class StepPlanner {
 public:
  StepPlanner(const Dataset& data, PlanConfig c);
  StepPlan plan(int64_t step);
  const PlanConfig& config() const { return c_; }
  // The sample index at global position i of the seeded order: epoch e = i / n visits the permutation of [0, n)
  // drawn by Fisher-Yates from Rng(seed, DataOrder, e).
  size_t sample_at(int64_t i);

 private:
  const Dataset& data_;
  PlanConfig c_;
  std::map<int64_t, std::vector<size_t>> perms_;
};

// The plans shared by the workers of a job: get(step) makes a plan once and hands the same immutable plan to
// every caller (thread-safe); old plans are dropped as the job moves on.
class PlanBook {
 public:
  PlanBook(const Dataset& data, PlanConfig c) : planner_(data, c) {}
  std::shared_ptr<const StepPlan> get(int64_t step);
  const PlanConfig& config() const { return planner_.config(); }

 private:
  std::mutex mu_;
  StepPlanner planner_;
  std::map<int64_t, std::shared_ptr<const StepPlan>> plans_;
};

// Samples with at least one candidate anchor after truncation to max_length (0 = none): a data set with none can
// teach the drafter nothing (checked before the first step).
int64_t count_trainable_samples(const Dataset& data, int64_t max_length);

}  // namespace dflash
