// train/target_worker.h — a target worker: its own Context on one device, the frozen target (weights shared,
// immutable, with any other worker of the same device), and a loop that takes jobs from the JobSource, runs the
// target forward with hidden-state capture (spec 2.1.1) and publishes the feature packet into the job's drafter
// queue (train/feature_queue.h). Never produces full-vocabulary logits.
// defines: TargetWorker
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/target.h"
#include "train/feature_queue.h"

namespace dflash {

struct FaultPlan;

class TargetWorker {
 public:
  // Warm-up phase (single-threaded): takes its context; makes one `ready` event per slot of every queue.
  TargetWorker(int index, std::string name, std::unique_ptr<Context> ctx, std::shared_ptr<const Target> target,
               std::vector<int64_t> layer_ids, bool final_hidden, const std::vector<FeatureQueue*>& queues);
  // Dry run of the forward on a short sequence, and one copy into every queue's first slot (peer paths set up).
  void warm_up();
  // The worker thread's body: until the JobSource is exhausted or the job stops. Throws on failure.
  void run(JobSource& jobs, const FaultPlan* fault);

  const std::string& name() const { return name_; }
  Context& ctx() { return *ctx_; }
  WorkerClock clock;

 private:
  int index_;
  std::string name_;
  std::unique_ptr<Context> ctx_;
  std::shared_ptr<const Target> target_;
  std::vector<int64_t> layer_ids_;
  bool final_hidden_;
  std::vector<FeatureQueue*> queues_;
  std::vector<std::vector<std::unique_ptr<Event>>> ready_;  // [drafter][slot], this context's events
};

// Test aid (--inject-fault KIND:INDEX:STEP): the worker "target N" or "drafter N" (local index) throws when it
// reaches global step STEP (0-based) or a later one, to test how the job stops. KIND "checkpoint" (INDEX 0): the
// write of the checkpoint of step STEP (its directory step-<STEP>) stalls once params.safetensors is complete in its
// temporary directory, for a test to kill the process mid-write (it throws after 600 s if nobody does).
struct FaultPlan {
  std::string kind;  // "target", "drafter" or "checkpoint"
  int index = -1;
  int64_t step = -1;
  static FaultPlan parse(const std::string& spec);  // "" -> no fault; Error names a malformed spec
  void maybe_throw(const char* k, int i, int64_t s) const;
  // KIND checkpoint: stalls when `file` (just written) is the params.safetensors of the checkpoint of step s.
  void maybe_stall_checkpoint(int64_t s, const std::string& file) const;
};

}  // namespace dflash
