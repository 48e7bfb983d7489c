// train/memory_plan.h — the bytes every device of a training layout will hold, computed from the configs alone before
// anything loads (design.md: "memory is planned"), the check of a layout against the devices' free memory, and the
// table `dflash info --plan` prints.
// defines: MemoryItem, kMemoryItems, DevicePlan, MemoryPlan, MemoryPlanInputs, memory_plan_inputs, plan_memory,
//          check_memory_plan, memory_plan_table, to_json(MemoryPlan), parse_bytes
//
// One row per device of the layout: a CUDA device (every role placed on it: target stages, drafters), or on the CPU
// backend one row per worker context ("cpu target 0 stage 1", "cpu drafter 0"), all of which share the host's memory
// (their `pool`, "host"). Items, in bytes (a = the compute dtype's size: 2 on CUDA, 4 on "cpu", 8 on "cpu64"; p = the
// parameter dtype's: 4, 8 on "cpu64"; T = max_tokens, the longest sequence of the step):
//   target weights   the stage's decoder layers in their stored format (model/target.h TargetParams::device_bytes:
//                    plain parameters a bytes, MXFP4 17/32 byte, FP8 1 byte + F32 block scales); stage 0 the embedding
//                    (V H a), the last stage the final norm and lm_head (V H a; a copy of the embedding when tied and
//                    split). Exact. Weights already on the device for another worker are not counted twice (the
//                    trainer loads a target or a stage once per device and shares it).
//   KV / state       the largest of one layer's keys and values of a sequence (2 T nkv d a) and a linear-attention
//                    layer's recurrent state (nv dk dv p) and convolution window ((K-1) conv_dim a): the prefill holds
//                    one layer's at a time.
//   target act       the layer loop's working set for one sequence (one micro-batch): the residual stream, the normed
//                    input, the features [T, nf H], the hand-off to the next stage, the final hidden (soft labels),
//                    and the largest layer's transients (attention projections; MoE router, k routed rows and the
//                    experts' outputs). An upper estimate of what the layer loop holds at once.
//   drafter head     the target's embedding and lm_head on a drafter's device when no unsplit target shares them.
//   drafter weights  F32 masters (p bytes, the flat layout of model/params.h, padded to the shards when sharded) and the
//                    compute copies when a != p. Exact.
//   gradients        the flat gradient buffer, as the masters. Exact.
//   optimizer        AdamW's m and v: 2 p N, or 2 p S of the own shard with ZeRO-1 (train/optimizer.h). Exact.
//   packets          --queue-depth feature packets of [T, nf H] (+ [T, H] with soft labels) in act dtype. Exact.
//   drafter act      one sequence's forward/backward: per draft layer the saved activations of the N B block rows
//                    (N = max_anchors) and the context keys and values of T rows, the fused features, and the loss
//                    head's chunk of 1024 x V F32 logits and their gradient. An upper estimate.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/hf_config.h"
#include "model/drafter.h"
#include "model/target_stages.h"
#include "train/open_run.h"  // Topology
#include "train/trainer.h"   // TrainConfig

namespace dflash {

enum MemoryItem {
  kTargetWeights, kKvState, kTargetAct, kDrafterHead, kDrafterWeights, kGradients, kOptimizer, kPackets, kDrafterAct,
  kNumMemoryItems
};
// The items' names, in the table's column order: "target weights", "KV / state", ...
extern const char* const kMemoryItems[kNumMemoryItems];

struct DevicePlan {
  std::string name;    // "cuda:1", "cpu target 0 stage 1", "cpu drafter 0"
  std::string pool;    // the memory it draws from: "cuda:1", or "host" for every CPU context
  std::string roles;   // "target 0 stage 1 (layers 14-27)", "drafter 0", joined by ", "
  int64_t bytes[kNumMemoryItems] = {};
  int64_t total() const;
};

struct MemoryPlan {
  std::string backend;               // "cpu", "cpu64", "cuda"
  int split = 1;                     // stages per target worker
  std::vector<TargetStage> stages;   // the target's layers per stage (model/target_stages.h)
  std::vector<DevicePlan> devices;   // in order: the target workers' stages, then the drafters (a CUDA device once)
  int64_t max_tokens = 0;            // T
  // Bytes each pool needs (the sum of its devices) and has free (-1: unknown), in first-seen order.
  std::vector<std::pair<std::string, int64_t>> needed() const;
};

struct MemoryPlanInputs {
  ModelConfig target;
  DrafterConfig drafter;
  Topology topo;
  int nproc = 1;              // processes of the job (MPI): the drafters of the job are nproc x topo.drafters
  int64_t max_tokens = 0;     // the longest sequence a step feeds (--max-length, or the data's longest)
  int64_t max_anchors = 512;
  int queue_depth = 2;
  bool soft = false;          // --kl-weight > 0: final hidden states travel too
  bool shard_optimizer = true;
};

// The inputs from a train config: the topology (parse_topology), the target's config.json, the drafter's shape as
// train resolves it (layer ids, width, layer types, arch; mask id 0 when not given: it changes no byte), max_tokens =
// cfg.max_length, else `data_max_tokens` (the data set's longest sequence; 0: unknown). Throws Error naming the option
// for a bad one, and when neither --max-length nor a data set gives the sequence length.
MemoryPlanInputs memory_plan_inputs(const TrainConfig& cfg, int64_t data_max_tokens = 0, int nproc = 1);

// The plan (see above). Throws Error naming --target-split when it exceeds the target's layers.
MemoryPlan plan_memory(const MemoryPlanInputs& in);

// Free bytes of each pool of `plan`: `assumed` (> 0: every pool, --device-memory) or what the device reports
// (backend/device_memory.h; -1 unknown).
int64_t pool_free_bytes(const std::string& pool, int64_t assumed);

// Refuses a plan that does not fit: Error naming the first pool (device) whose bytes exceed its free bytes, the
// bytes needed (with the largest items) and free, and a layout that fits when one is found among: a larger
// --target-split over the same target devices, the same workers over more devices, a shorter --max-length. Pools
// whose free memory is unknown are not checked. `assumed` as pool_free_bytes.
void check_memory_plan(const MemoryPlanInputs& in, const MemoryPlan& plan, int64_t assumed = 0);

// The plan as a table: one row per device, a column per item, the total and the free bytes (GiB with 2 decimals;
// "-" for none), then one line per target stage (its layers and weight bytes) and per pool (needed / free).
std::string memory_plan_table(const MemoryPlan& plan, int64_t assumed = 0);
void to_json(nlohmann::json& j, const MemoryPlan& p);

// "80GiB", "80G" (= GiB), "512MiB", "1.5e9", "123456": bytes. Error naming `option` for anything else or <= 0.
int64_t parse_bytes(const std::string& s, const char* option);

}  // namespace dflash
