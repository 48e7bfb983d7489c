// train/open_run.h — the first phase of train(): open or resume the run directory. Everything is read and checked
// here, before any device is touched: the options, the data, the tokenizer, the target's and the drafter's shapes;
// then the run directory is taken (held by this job alone, core/run_lock.h; an earlier result refused unless
// --resume / --overwrite, core/output_dir.h), the temporaries an interrupted write left there are removed, a resume
// is checked against its checkpoint (the settings that shape the trajectory, and the inputs: target, tokenizer,
// template and data, train/run_inputs.h), metrics.jsonl is cut back to the checkpoint, and the disk space the run
// will need is compared with what is free. The later phases (train/trainer.cpp) build the workers from the result.
// defines: Topology, OpenedRun, open_run
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/run_lock.h"
#include "io/dataset.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "model/drafter.h"
#include "train/run_files.h"     // MetricsLog
#include "train/target_worker.h"  // FaultPlan
#include "train/trainer.h"

namespace dflash {

// Which workers run where (spec 6). backend: the make_context device name without index ("cpu", "cpu64",
// "cuda"); drafters: per drafter worker its device index; targets: the target workers' devices, `split` consecutive
// ones per worker (stage s of worker i on targets[i * split + s]); CPU: index 0 for every worker and stage.
struct Topology {
  std::string backend;
  std::vector<int> targets, drafters;
  int split = 1;  // stages per target worker (train --target-split)
  int target_workers() const { return static_cast<int>(targets.size()) / split; }
  int target_device(int worker, int stage) const { return targets[static_cast<size_t>(worker * split + stage)]; }
  std::string device_name(int index) const { return backend == "cuda" ? cat("cuda:", index) : backend; }
};

// The topology of cfg's --device, --targets, --drafters, --colocate and --target-split. Throws Error naming the
// option: an unknown device, a malformed list or count, a device listed twice, --targets not a multiple of
// --target-split.
Topology parse_topology(const TrainConfig& cfg);

// The drafter's shape as train resolves it from the options and the target's config: the target layer ids (given, or
// the spec's default; validated), width, layer types and window, architecture and the DFlash2 options, with mask token
// `mask_id`. Throws Error naming the option for a bad one. Used by open_run and the memory plan (train/memory_plan.h).
DrafterConfig resolve_drafter_config(const TrainConfig& cfg, const ModelConfig& target, int32_t mask_id);

// What the first phase hands on: the run's inputs, resolved and checked, and where the run starts.
struct OpenedRun {
  explicit OpenedRun(Dataset d) : data(std::move(d)) {}
  bool lead = true;   // process 0: holds the run directory, writes metrics, checkpoints and the export
  int nproc = 1;
  Topology topo;
  FaultPlan fault;
  Dataset data;
  int64_t n = 0;      // samples
  ModelConfig tc;     // the target's config
  DrafterConfig dc;   // the drafter's, resolved (mask id, layer ids, width, layer types)
  std::vector<int64_t> init_layers;  // --init-from-target, resolved (empty: random)
  bool init_from_target = false;
  double gamma = 0;   // resolved (0 = uniform)
  double dpace_alpha = 0;  // resolved: > 0 with --loss dpace (model/draft_loss.h), 0 with decay
  bool soft = false;  // the KL term is on
  nlohmann::json cfg_json;  // the config as recorded in every checkpoint and the export (resolved values, "data",
                            // "data_changes")
  nlohmann::json inputs;    // train/run_inputs.h: this run's target, tokenizer and data identity (state.json)
  RunLock lock;             // process 0: the run directory held
  std::unique_ptr<MetricsLog> metrics;  // process 0
  std::string latest;       // the checkpoint a resume starts from; "" = step 0
  int64_t start = 0, start_updates = 0;  // steps and AdamW updates done before this run
  int64_t total_steps = 0;  // the schedule's length (the checkpoint's on resume)
  int64_t epoch_total = 0;  // the step count `epochs` allow (the upper bound of a time budget)
  bool budgeted = false;    // the step count is revised to fit the time budget
  double seconds_before = 0;  // training seconds of the run before this resume (the time budget spent)
};

// Phase 1. Throws Error (naming the file / field / option) for bad options and inputs, a run directory held by
// another process or holding an earlier result without --resume / --overwrite, a resume whose checkpoint was made
// with other settings or inputs (train/run_inputs.h), and too little free space with --require-space. Under MPI
// every process calls it; process 0 alone takes the directory, removes temporaries and checks the space.
OpenedRun open_run(const TrainConfig& cfg);

}  // namespace dflash
