// train/run_files.h — the files of a run directory besides the checkpoints' contents, and what an interruption
// leaves of them: metrics.jsonl (MetricsLog: appended row by row, cut back to the last checkpoint when a checkpoint
// fails or a run resumes), the temporaries a killed write leaves behind (remove_run_temporaries), and the disk space
// a run will need (plan_run_space: checkpoints held under --keep-checkpoints, the export).
// defines: MetricsLog, RemovedTemporary, remove_run_temporaries, drafter_param_count, checkpoint_bytes_estimate,
//          RunSpace, plan_run_space
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/drafter.h"  // DrafterConfig

namespace dflash {

// <out>/metrics.jsonl, one JSON object per step, written by process 0 only. Each row is appended with one write()
// and the file is never rewritten in place except by resume and rollback, so a kill leaves at most a torn last
// line, which open() drops.
class MetricsLog {
 public:
  // Opens `path`. keep_upto < 0: a new run (the file is emptied). keep_upto >= 0: a resumed run at that step: keeps
  // the rows of steps <= keep_upto, in order, up to the first line that is not JSON (a torn last line), and drops the
  // rest (the steps a resume does again). Error names the path when it cannot be read or written.
  MetricsLog(std::string path, int64_t keep_upto);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Appends one row and a newline. A failed write (e.g. a full disk) cuts the file back to before the row and throws
  // Error naming the path and the reason.
  void append(const nlohmann::json& row);
  // The rows so far belong to the checkpoint just written (rollback_to_checkpoint() comes back here).
  void mark_checkpoint();
  // Cuts the rows written after the last mark (or after open): metrics.jsonl then ends at the step of the latest
  // intact checkpoint. Needs no free space (ftruncate). Never throws (a failure is logged).
  void rollback_to_checkpoint();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0, mark_ = 0;
};

struct RemovedTemporary {
  std::string path;
  int64_t bytes = 0;  // the sizes of its files
};

// Removes, in out_dir, the temporaries that train's own writers leave when a process is killed mid-write, and only
// those (by their naming; anything else in the directory is never touched):
//   checkpoints/step-<8 digits>.tmp-<pid>/   save_checkpoint's temporary directory (train/checkpoint.h)
//   checkpoints/LATEST.tmp.<pid>, metrics.jsonl.tmp.<pid>, profile.txt.tmp.<pid>   write_file_atomic (core/fs.h)
//   export.tmp-<pid>/                        export_drafter's new export before the swap (model/export.h)
//   export.old-<pid>/                        the previous export moved aside during the swap: only when export/
//                                            exists (else it is the only export there is, and stays)
// The caller must hold the run directory's lock (core/run_lock.h): then no other process of the run can be writing
// any of them (in a job of several processes only process 0 writes there). The export's temporaries are also
// written by `dflash export --out <run>/export`, which does not take the run's lock: they stay while a process of
// their pid runs on this host. Returns what was removed, sorted by path. Error names a path that cannot be removed.
std::vector<RemovedTemporary> remove_run_temporaries(const std::string& out_dir);

// The number of trainable parameters of a drafter of config dc (the tensors of model/drafter.cpp's constructor;
// tests/train/train.cpp checks it against a built drafter), and the number of those tensors.
int64_t drafter_param_count(const DrafterConfig& dc, int64_t* tensors = nullptr);
// About the bytes of one checkpoint of that drafter (train/checkpoint.h): F32 masters and both AdamW moments, the
// safetensors headers and state.json. An upper estimate within a few KiB per tensor.
int64_t checkpoint_bytes_estimate(const DrafterConfig& dc);

// The disk a run will need beyond what its directory holds now.
struct RunSpace {
  int64_t checkpoint_bytes = 0;  // one checkpoint (estimate)
  int64_t held_at_peak = 0;      // checkpoints on disk at the worst moment (a new one is complete before pruning)
  int64_t existing = 0;          // complete checkpoints already there (a resumed run)
  int64_t export_bytes = 0;      // the export at the end (bf16), 0 without one
  int64_t need = 0;              // bytes still to be written at the worst moment
  int64_t free = -1;             // free bytes on the run directory's file system (-1: unknown)
  bool enough() const { return free < 0 || free >= need; }
  // "up to 3 checkpoints of about 1.20 GiB (--keep-checkpoints 2 and the one being written) and an export of
  // 204 MiB: about 3.60 GiB more, 1.00 GiB free on the file system of <dir>"
  std::string describe(const std::string& out_dir, int64_t keep) const;
};

// The space a run of config dc needs in out_dir: checkpoints written at steps that are multiples of
// checkpoint_every in (start, total] plus one at the end (checkpoint_every <= 0: only the end), keep of them held
// (keep <= 0: all), the export when export_at_end. Compares with free_bytes(out_dir).
RunSpace plan_run_space(const std::string& out_dir, const DrafterConfig& dc, int64_t keep, int64_t checkpoint_every,
                        int64_t start, int64_t total, bool export_at_end);

}  // namespace dflash
