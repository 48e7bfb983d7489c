// train/checkpoint.h — complete, crash-safe training state: <out>/checkpoints/step-NNNNNNNN/ holding
//   state.json         step, epoch/cursor, seed, the train config (for a compatibility check), metrics so far
//   params.safetensors master weights (F32, export names)
//   optim.safetensors  AdamW moments "m.<name>", "v.<name>" (F32)
// The same format whether the optimizer state was replicated or sharded over the drafters (train/optimizer.h): a
// sharded run gathers the moments before saving, and a load re-splits them for any drafter count, so checkpoints
// move freely between replicated and sharded runs of any topology.
// written into "<dir>.tmp-<pid>" and renamed; then <out>/checkpoints/LATEST (one line: the directory name) is
// replaced atomically. RNG needs no saved state: every stream is counter-based on (seed, purpose, step, index).
// defines: CheckpointState, FlatState, save_checkpoint, latest_checkpoint, load_checkpoint, prune_checkpoints
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/params.h"
#include "train/optimizer.h"  // OptimShard

namespace dflash {

struct CheckpointState {
  int64_t step = 0;          // optimizer steps completed
  nlohmann::json info;       // config, cursor, anything else the trainer records
};

// The state to save where it is not in ps itself: host tensors in ps's flat layout (ParamSet::flat_offset; at
// least flat_numel() elements, param_dtype), e.g. the moments all-gathered from the shards of a sharded optimizer.
// An undefined member is read from ps (masters; moments, or zeros where ps has none allocated yet).
struct FlatState {
  Tensor master, m, v;
};

// Writes a checkpoint of `ps` (masters and moments, any device; `flat` replaces any of them) for `st`; returns
// its directory.
std::string save_checkpoint(Context& ctx, const std::string& out_dir, const ParamSet& ps, const CheckpointState& st,
                            const FlatState& flat = {});
// The directory named by <out>/checkpoints/LATEST, or "" when there is none.
std::string latest_checkpoint(const std::string& out_dir);
// Restores masters (and compute copies) and moments into `ps` — or, with `shard`, the moments of the shard's
// elements into shard->m / shard->v (ps's moments stay unallocated); returns the saved state. Error names the file
// and tensor on any mismatch.
CheckpointState load_checkpoint(Context& ctx, const std::string& ckpt_dir, ParamSet& ps, OptimShard* shard = nullptr);
// Keeps the newest `keep` checkpoints (by step) and removes the rest, except the one <out>/checkpoints/LATEST
// names: that one is never removed (keep <= 0: nothing is removed).
void prune_checkpoints(const std::string& out_dir, int64_t keep);

}  // namespace dflash
