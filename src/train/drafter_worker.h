// train/drafter_worker.h — a drafter worker: its own Context and parameter replica on one device, the target's
// frozen embedding and lm_head on that device, and the step loop: for each global step, forward/backward of its
// share of the step plan (packets from its FeatureQueue, loss scaled by 1 / the GLOBAL sum of weights), the
// gradient all-reduce, the same clipped AdamW update as every other replica, and the all-reduce of the step's
// statistics, which also carries the stop decision. Every drafter runs every step's control path, whether it
// (or the whole step) has sequences or not, so the collectives always match (spec 5: no hang on an empty rank).
// With the sharded optimizer (ZeRO-1, train/optimizer.h) the step is instead: gradient reduce-scatter, the shard's
// sum of squares (summed over the drafters by the statistics all-reduce: the global norm), AdamW on the own
// shard, the report, and at the start of the next step the all-gather of the flat F32 masters and the refresh of
// the compute copies; at checkpoint steps the masters and the moments are all-gathered before the report (the
// moments through the spent gradient buffer: no extra device memory) and the moments handed to it.
// defines: StepStats, StepReport, DrafterWorker
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/collective.h"
#include "model/drafter.h"
#include "train/checkpoint.h"     // FlatState
#include "train/feature_queue.h"
#include "train/optimizer.h"
#include "train/target_worker.h"

namespace dflash {

// The step's statistics summed over all drafters (the stats all-reduce).
struct StepStats {
  double loss_sum = 0, ce_sum = 0, kl_sum = 0;
  double sel_sum = 0, covered = 0;     // DFlash2: sum w sel; rows whose label is among the candidates
  std::vector<double> correct, count;  // per slot [B]
  bool stop = false;                   // some worker was asked to stop (signal)
};

struct StepReport {
  int64_t step = 0;                    // 0-based step just completed
  int64_t total_steps = 0;             // the schedule's length in force (time budgets revise it)
  double lr = 0;
  std::shared_ptr<const StepPlan> plan;
  StepStats stats;
  bool updated = false;                // an optimizer update ran (the step was not empty)
  int64_t updates = 0;                 // optimizer updates so far (AdamW's step count)
  double grad_norm = 0, clip = 1;
  bool checkpoint = false;             // a checkpoint is due after this step (every drafter decides the same)
  FlatState moments;                   // sharded optimizer, checkpoint steps, the reporting drafter: the gathered
                                       // moments (host, the flat layout); undefined otherwise
};

struct DrafterRun {
  int64_t first_step = 0, end_step = 0, total_steps = 0;  // steps [first, end) of a schedule of total_steps
  int64_t updates = 0;                 // AdamW updates done before first_step (resume)
  int64_t stop_after = 0;              // > 0: stop once this many steps are done
  int64_t checkpoint_every = 0;        // > 0: a checkpoint after every this many steps (and after the last step
                                       // and a stop, always)
  OptimConfig optim;
  float kl_weight = 0;
  float selector_alpha = 1.0f;  // DFlash2: the selector loss's weight
  bool recompute = false;
  const std::atomic<bool>* stop = nullptr;  // signal flag
  const FaultPlan* fault = nullptr;
  // Time budgets: local rank 0 of process 0 may propose a new step count here (0 = none); it reaches every drafter
  // through the statistics all-reduce and applies from the step after (end_step is the upper bound).
  std::atomic<int64_t>* proposed_total = nullptr;
};

class DrafterWorker {
 public:
  // shards > 1: the optimizer state is sharded over `shards` drafters (ZeRO-1; global_rank < shards); else each
  // drafter holds all of it.
  DrafterWorker(int local_rank, int global_rank, std::string name, std::unique_ptr<Context> ctx,
                const DrafterConfig& dc, uint64_t seed, double init_std, Tensor embed, Tensor lm_head, int shards = 1);
  // Warm-up: one forward/backward of a tiny block on random features (gradients zeroed afterwards), with the run's
  // loss weights (dpace_alpha > 0: D-PACE's, model/draft_loss.h).
  void warm_up(double dpace_alpha = 0);
  // The worker thread's body. `report` runs on this thread after each step's statistics are known (local rank 0
  // of process 0 only: metrics, checkpoints). Returns after end_step or a collective stop; throws on failure.
  void run(const DrafterRun& r, PlanBook& plans, FeatureQueue& queue, GradReducer& grads, HostGroup& stats,
           const std::function<void(DrafterWorker&, const StepReport&)>& report);

  int local_rank() const { return local_rank_; }
  int global_rank() const { return global_rank_; }
  const std::string& name() const { return name_; }
  Context& ctx() { return *ctx_; }
  Drafter& drafter() { return drafter_; }
  OptimShard* optim_shard() { return shard_ ? &*shard_ : nullptr; }  // null: the optimizer state is replicated
  WorkerClock clock;
  std::atomic<int64_t> params_step{0};  // steps whose update (or skip) the replica's weights include (sharded:
                                        // steps completed and reported; the last update's masters may still wait
                                        // for the all-gather at the start of the next step)
  std::atomic<int64_t> shard_step{0};   // sharded: steps whose update (or skip) the own optimizer shard includes
  std::atomic<int64_t> updates{0};      // AdamW updates applied
  std::atomic<bool> in_optimizer{false};

 private:
  int local_rank_, global_rank_;
  std::string name_;
  std::unique_ptr<Context> ctx_;
  Drafter drafter_;
  std::optional<OptimShard> shard_;
  Tensor embed_, lm_head_;
};

}  // namespace dflash
