// train/trainer.h — the training system (spec 2, spec 6): target workers and drafter workers, one thread per
// device role, in one or several processes. `train` builds the topology, warms everything up in one thread, runs
// the workers, writes metrics and checkpoints, and exports. The single-device run is the 1-device co-located case.
// defines: TrainConfig, TrainSummary, train, to_json(TrainConfig)
//
// The pieces, in data-flow order: train/step_plan (host: global batch, anchors, normaliser, split over drafters),
// train/feature_queue (jobs for targets; bounded packet queues in drafter memory), train/target_worker,
// train/drafter_worker (forward/backward, gradient all-reduce or reduce-scatter, AdamW replicated or sharded),
// backend/collective (threads, NCCL, MPI).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "train/optimizer.h"

namespace dflash {

struct TrainConfig {
  // inputs / outputs
  std::string target_dir;   // Hugging Face target (config.json, safetensors, tokenizer.json)
  std::string data_dir;     // written by `dflash prepare`
  std::string out_dir;      // checkpoints/, metrics.jsonl, export/
  std::string device = "cpu";
  int threads = 0;          // CPU threads per worker context (0 = all cores)
  // topology (spec 6). CPU: worker counts ("2"); CUDA: device indices ("0,1,2,3,4"). Empty = one worker each,
  // co-located on `device`. colocate: every listed device runs a target worker and a drafter worker (give one list).
  std::string targets, drafters;
  bool colocate = false;
  int target_split = 1;            // stages per target worker: its layers cut into this many consecutive stages, one
                                   // device each (model/target_stages.h), --targets listing split devices per worker
  std::string device_memory;       // the free bytes per device the memory plan checks against ("80GiB", "2.5e9"); "":
                                   // what each device reports (CPU: the host's available memory)
  int queue_depth = 2;             // feature packets in flight per drafter (memory: depth x max_S x nf*H)
  bool shard_optimizer = true;     // with more than one drafter in the job (all processes): the AdamW moments are
                                   // sharded over the drafters (ZeRO-1, train/optimizer.h), gradients
                                   // reduce-scattered, masters all-gathered; false: every drafter holds all of it
  double collective_timeout_s = 600;  // a collective waiting longer fails the job naming the workers waited on
  std::string inject_fault;        // test aid: KIND:INDEX:STEP (train/target_worker.h FaultPlan)
  bool random_target = false;      // benchmark aid: target weights drawn at random from its config.json alone
  // drafter shape (spec 1)
  std::string arch = "dflash";  // "dflash" (spec 1) or "dflash2" (spec 1.1-1.2: dynamic convolutions, candidate selector)
  int64_t conv_kernel_size = 2;  // DFlash2: taps of the dynamic convolutions
  int64_t conv_group_size = 16;  // DFlash2: channels per dynamic coefficient (divides the hidden size)
  int64_t selector_rank = 256;   // DFlash2: rank r of the selector's codebooks
  int64_t selector_top_k = 16;   // DFlash2: candidates per slot
  int64_t num_layers = 1;
  int64_t block_size = 16;
  std::vector<int64_t> target_layer_ids;  // empty = default_target_layer_ids(Lt, num_target_features); else
                                          // distinct and ascending (validate_target_layer_ids), exported as given
  int64_t num_target_features = 5;
  int32_t mask_token_id = -1;             // -1 = the tokenizer's mask token (error if it has none); < -1: error
  int64_t intermediate_size = 0;          // 0 = default_intermediate_size(target) (model/drafter.h)
  double init_std = 0.02;
  std::string init_from_target;  // "" (random, spec 1), "next" or "L0,L1,..": draft layers start as these target
                                 // layers (model/drafter_init.h); needs the target's checkpoint
  std::string init_fc = "random";  // "random" (spec 1) or "last": fc starts as the selection of the last feature
  int64_t sliding_window = 0;            // W > 0: sliding-window draft layers (spec 2.3), see layer_types
  std::vector<std::string> layer_types;  // one per draft layer, full(_attention) / sliding(_attention); empty =
                                         // all sliding when sliding_window > 0 (model/drafter.h resolve_layer_types)
  // objective (spec 2.1-2.4)
  int64_t max_anchors = 512;
  std::string loss = "dpace";  // the loss weights (model/draft_loss.h): "dpace" (D-PACE, spec 2.4: from the drafter's
                               // own confidences; gamma unused; the default, as bench/RESULTS.md "The training
                               // objectives" measured) or "decay" (spec 2.4's exp(-(i-1)/gamma))
  double gamma = 0;         // 0 = default for the block size (spec 2.4); < 0 = uniform weights
  double dpace_alpha = 0.5; // D-PACE's smoothing alpha in (0, 1] (kDefaultDPaceAlpha); used with loss "dpace"
  double kl_weight = 0;     // > 0 adds the soft-label KL term (with D-PACE weighted by the same w)
  double selector_alpha = 1.0;  // DFlash2: weight of the selector's loss (SpecForge's dflash2_selector_loss_alpha)
  int64_t max_length = 0;   // truncate sequences to this many tokens (0 = as prepared)
  // optimisation (spec 2.5)
  OptimConfig optim;
  double epochs = 6;
  int64_t max_steps = 0;    // > 0 overrides epochs; with resume, more than the checkpoint's step count extends the run
                            // (open_run.h resume_point: the learning rate follows the new count's schedule)
  double time_budget_s = 0; // > 0 (and no max_steps): plan the step count to fit this many seconds of training,
                            // measured on two calibration steps; never more than `epochs` allow
  int64_t batch_size = 8;   // sequences per optimizer step
  uint64_t seed = 0;
  bool recompute = false;   // activation recompute of the draft layers (case C06)
  // bookkeeping
  int64_t checkpoint_every = 200;  // steps; 0 = only at the end / on interruption
  int64_t keep_checkpoints = 2;
  bool resume = false;             // continue from <out>/checkpoints/LATEST when it exists
  bool allow_data_change = false;  // with resume: continue although the data set, tokenizer or template differ from
                                   // the checkpoint's (recorded in config "data_changes"); never another target
  bool overwrite = false;          // replace an earlier run's results in <out> (else train refuses to start there)
  bool require_space = false;      // refuse to start when the checkpoints --keep-checkpoints holds and the export
                                   // may not fit in the free space of <out>'s file system (else a warning)
  int64_t stop_after = 0;          // > 0: checkpoint and stop once this many steps are done (a time slice of a
                                   // longer run: the schedule still spans all steps; continue with resume)
  bool export_at_end = true;       // <out>/export in the z-lab format
  bool quiet = false;              // no progress bar
  bool profile = false;            // time every op of the run (Context::op_profile) and write the table to
                                   // <out>/profile.txt at the end: where the device time went, op by op
};

struct TrainSummary {
  int64_t steps_done = 0, total_steps = 0;
  int64_t start_step = 0;           // the step this call started at (a resume's checkpoint; 0 for a new run)
  int64_t updates = 0;              // AdamW updates (steps with at least one supervised pair)
  int64_t lazy_inits_after_warmup = 0;  // case C01: must stay 0
  int targets = 0, drafters = 0;    // workers of this process
  bool interrupted = false;
  double last_loss = 0, last_eal = 0;
  double seconds = 0;
  std::string export_dir, checkpoint_dir;
};

// Runs (or resumes) training. `stop` (may be null) is polled after each step: when set, every drafter stops after
// the same step, a checkpoint is written and train() returns with interrupted = true. The phases (each a function of
// its own): open or resume the run directory (train/open_run.h: every check of the inputs, the directory, a resume
// and the disk space), build the workers, warm up, the loop, finish (the export, or the checkpoint of a failure).
// Throws Error for bad inputs (naming file / field); first of all when out_dir is held by another process (naming
// it: host, pid, start time; core/run_lock.h), when it already holds an earlier run's results (metrics.jsonl,
// checkpoints/, export/, profile.txt) and neither resume nor overwrite is set (core/output_dir.h: nothing is touched
// then), when a resume's checkpoint was made with other settings or on other inputs (train/run_inputs.h), for target
// layer ids that are not distinct and ascending (validate_target_layer_ids), for a mask_token_id below -1, for a data
// set without one trainable sample, with require_space and too little free space, when a checkpoint cannot be
// written (naming the file, the bytes needed and free; the previous checkpoint stays intact and metrics.jsonl is cut
// back to its step), and when a worker fails (the message names the worker; a checkpoint of the last completed step
// is written first). Under an MPI launcher every process calls train() with the same config; process 0 holds the
// run directory and writes the files.
TrainSummary train(const TrainConfig& cfg, const std::atomic<bool>* stop = nullptr);

void to_json(nlohmann::json& j, const TrainConfig& c);

}  // namespace dflash
