// train/checkpoint.h — complete, crash-safe training state: <out>/checkpoints/step-NNNNNNNN/ holding
//   state.json         step, epoch/cursor, seed, the train config (for a compatibility check), metrics so far
//   params.safetensors master weights (F32, export names)
//   optim.safetensors  AdamW moments "m.<name>", "v.<name>" (F32)
// The same format whether the optimizer state was replicated or sharded over the drafters (train/optimizer.h): a
// sharded run gathers the moments before saving, and a load re-splits them for any drafter count, so checkpoints
// move freely between replicated and sharded runs of any topology.
// written into "<dir>.tmp-<pid>" and renamed (a step saved again swaps the two directories atomically: the step's
// directory holds the old or the new checkpoint at every moment); then <out>/checkpoints/LATEST (one line: the
// directory name) is replaced atomically. RNG needs no saved state: every stream is counter-based on (seed, purpose, step, index).
// A write that fails (a full or unwritable disk) removes its temporary directory and leaves every earlier checkpoint
// and LATEST as they were; a process killed mid-write leaves "<dir>.tmp-<pid>", which the next start of the run
// removes (train/run_files.h remove_run_temporaries).
// defines: CheckpointState, FlatState, save_checkpoint, latest_checkpoint, load_checkpoint, prune_checkpoints,
//          kCheckpointTmpInfix
#pragma once
#include <functional>
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

// The infix of a checkpoint's temporary directory: "step-00000200" + kCheckpointTmpInfix + "<pid>".
inline constexpr const char* kCheckpointTmpInfix = ".tmp-";

// Writes a checkpoint of `ps` (masters and moments, any device; `flat` replaces any of them) for `st`; returns
// its directory. `after_file` (may be empty; a test aid) runs after each of params.safetensors and
// optim.safetensors is complete in the temporary directory, with that file's path. Error when a file cannot be
// written: the message names the file, the reason (e.g. "No space left on device"), the bytes the checkpoint
// needs and the bytes free on that file system, and says that the previous checkpoint is intact; the temporary
// directory is removed first.
std::string save_checkpoint(Context& ctx, const std::string& out_dir, const ParamSet& ps, const CheckpointState& st,
                            const FlatState& flat = {},
                            const std::function<void(const std::string&)>& after_file = {});
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
