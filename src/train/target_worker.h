// train/target_worker.h — a target worker: its own Context on one device (or one per stage over S devices: a split
// target), the frozen target (weights shared, immutable, with any other worker of the same device), and a loop
// that takes jobs from the JobSource, runs the target forward with hidden-state capture (spec 2.1.1) and publishes
// the feature packet into the job's drafter queue (train/feature_queue.h). Never produces full-vocabulary logits.
// defines: TargetWorker
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/job_control.h"
#include "model/target.h"
#include "train/feature_queue.h"

namespace dflash {

struct FaultPlan;

class TargetWorker {
 public:
  // Warm-up phase (single-threaded): takes its context; makes one `ready` event per slot of every queue.
  TargetWorker(int index, std::string name, std::unique_ptr<Context> ctx, std::shared_ptr<const Target> target,
               std::vector<int64_t> layer_ids, bool final_hidden, const std::vector<FeatureQueue*>& queues);
  // A worker over S > 1 devices (train --target-split): stage s (Target::load_stage, layers in order) runs on ctxs[s]
  // in a thread of its own; a job's sequence flows through the stages as one micro-batch (Target::forward_stage),
  // handed on through bounded queues of `depth` micro-batches, so that the stages work on consecutive sequences at
  // the same time; the stage holding the last needed layer (the last captured one, or the last layer with soft
  // labels) copies the features into the drafter's packet. `control`: the job's, polled by every wait.
  TargetWorker(int index, std::string name, std::vector<std::unique_ptr<Context>> ctxs,
               std::vector<std::shared_ptr<const Target>> stages, std::vector<int64_t> layer_ids, bool final_hidden,
               const std::vector<FeatureQueue*>& queues, JobControl& control, int depth = 2);
  ~TargetWorker();
  // Dry run of the forward on a short sequence, and one copy into every queue's first slot (peer paths set up).
  void warm_up();
  // The worker thread's body: until the JobSource is exhausted or the job stops. Throws on failure (a stage's
  // failure names the stage).
  void run(JobSource& jobs, const FaultPlan* fault);

  const std::string& name() const { return name_; }
  Context& ctx() { return *ctxs_[0]; }      // stage 0's
  int stages() const { return static_cast<int>(ctxs_.size()); }
  WorkerClock clock;

 private:
  struct Pipe;  // the bounded queues between the stages (target_worker.cpp)
  // Runs the job's sequence through stages [0, S) one after the other in this thread (S = 1, the warm-up).
  Target::Output forward_all(const Tensor& ids);
  // The job's features (in ctx) into its drafter's packet, then publish.
  void deliver(Context& ctx, const Job& job, const Tensor& features, const Tensor& final_hidden);
  void stage_loop(int s, const FaultPlan* fault);

  int index_;
  std::string name_;
  std::vector<std::unique_ptr<Context>> ctxs_;
  std::vector<std::shared_ptr<const Target>> targets_;  // one per stage (the whole target when unsplit)
  std::vector<int64_t> layer_ids_;
  bool final_hidden_;
  int last_stage_ = 0;  // the stage that delivers: the last one needed
  std::vector<FeatureQueue*> queues_;
  std::vector<std::vector<std::unique_ptr<Event>>> ready_;  // [drafter][slot], the delivering stage's events
  JobControl* control_ = nullptr;
  int depth_ = 2;
  std::unique_ptr<Pipe> pipe_;
};

// Test aid (--inject-fault KIND:INDEX:STEP): the worker "target N" or "drafter N" (local index) throws when it
// reaches global step STEP (0-based) or a later one, to test how the job stops. KIND "stage" (INDEX S >= 1): stage S
// of every split target worker (--target-split) throws on a micro-batch of step STEP or later. KIND "checkpoint" (INDEX 0): the
// write of the checkpoint of step STEP (its directory step-<STEP>) stalls once params.safetensors is complete in its
// temporary directory, for a test to kill the process mid-write (it throws after 600 s if nobody does).
struct FaultPlan {
  std::string kind;  // "target", "stage", "drafter" or "checkpoint"
  int index = -1;
  int64_t step = -1;
  static FaultPlan parse(const std::string& spec);  // "" -> no fault; Error names a malformed spec
  void maybe_throw(const char* k, int i, int64_t s) const;
  // KIND checkpoint: stalls when `file` (just written) is the params.safetensors of the checkpoint of step s.
  void maybe_stall_checkpoint(int64_t s, const std::string& file) const;
};

}  // namespace dflash
