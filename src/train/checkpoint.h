// train/checkpoint.h — complete, crash-safe training state: <out>/checkpoints/step-NNNNNNNN/ holding
//   state.json         step, epoch/cursor, seed, the train config (for a compatibility check), metrics so far
//   params.safetensors master weights (F32, export names)
//   optim.safetensors  AdamW moments "m.<name>", "v.<name>" (F32)
// written into "<dir>.tmp-<pid>" and renamed; then <out>/checkpoints/LATEST (one line: the directory name) is
// replaced atomically. RNG needs no saved state: every stream is counter-based on (seed, purpose, step, index).
// defines: CheckpointState, save_checkpoint, latest_checkpoint, load_checkpoint, prune_checkpoints
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/params.h"

namespace dflash {

struct CheckpointState {
  int64_t step = 0;          // optimizer steps completed
  nlohmann::json info;       // config, cursor, anything else the trainer records
};

// Writes a checkpoint of `ps` (masters and moments, any device) for `st`; returns its directory.
std::string save_checkpoint(Context& ctx, const std::string& out_dir, const ParamSet& ps, const CheckpointState& st);
// The directory named by <out>/checkpoints/LATEST, or "" when there is none.
std::string latest_checkpoint(const std::string& out_dir);
// Restores masters (and compute copies) and moments into `ps`; returns the saved state. Error names the file
// and tensor on any mismatch.
CheckpointState load_checkpoint(Context& ctx, const std::string& ckpt_dir, ParamSet& ps);
// Keeps the newest `keep` checkpoints (by step) and removes the rest, except the one <out>/checkpoints/LATEST
// names: that one is never removed (keep <= 0: nothing is removed).
void prune_checkpoints(const std::string& out_dir, int64_t keep);

}  // namespace dflash
