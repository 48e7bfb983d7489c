// cli/target_devices.h — the target of `eval` and `generate` on one device or split over several (--target-split).
// defines: TargetOnDevices, load_target_on_devices, add_target_split_option
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/context.h"
#include "model/split_target.h"

namespace dflash::cli {

struct TargetOnDevices {
  // contexts[0] is `device`'s: the caller's (and a drafter's); contexts[s] runs stage s.
  std::vector<std::unique_ptr<Context>> contexts;
  std::unique_ptr<SplitTarget> target;
  Context& ctx() { return *contexts.front(); }
};

// The target in `dir` on `device` (make_context's names) cut into `split` stages (model/split_target.h): stage s on
// cuda:N+s for device cuda:N ("cuda" is cuda:0), or on a CPU context of its own for "cpu" / "cpu64" (the same
// host: a check of the split, bit for bit the unsplit run). Throws Error for split < 1, a device that does not exist,
// or the errors of SplitTarget::load.
TargetOnDevices load_target_on_devices(const std::string& dir, const std::string& device, int split);

// --target-split S on a subcommand (eval, generate).
void add_target_split_option(CLI::App* sub, int& split);

}  // namespace dflash::cli
