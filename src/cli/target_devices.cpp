// cli/target_devices.cpp — the target of `eval` and `generate` on one device or split over several
// (cli/target_devices.h).
#include "cli/target_devices.h"

#include <chrono>

#include "backend/device_memory.h"
#include "core/error.h"
#include "core/log.h"

namespace dflash::cli {

TargetOnDevices load_target_on_devices(const std::string& dir, const std::string& device, int split) {
  DFLASH_CHECK(split >= 1, "--target-split ", split, " must be >= 1");
  TargetOnDevices t;
  t.contexts.push_back(make_context(device));
  const bool cuda = device.rfind("cuda", 0) == 0;
  const int base = cuda ? t.contexts[0]->device_index() : 0;
  for (int s = 1; s < split; ++s) t.contexts.push_back(make_context(cuda ? "cuda:" + std::to_string(base + s) : device));
  std::vector<Context*> ctxs;
  for (auto& c : t.contexts) ctxs.push_back(c.get());
  if (split == 1) {
    log_info("loading the target from ", dir, " on ", t.ctx().describe());
  } else {
    std::string where;
    for (auto& c : t.contexts) where += (where.empty() ? "" : ", ") + c->describe();
    log_info("loading the target from ", dir, " in ", split, " stages on ", where);
  }
  const auto t0 = std::chrono::steady_clock::now();
  t.target = std::make_unique<SplitTarget>(SplitTarget::load(dir, ctxs));
  for (auto& c : t.contexts) c->synchronize();
  log_info("target loaded in ", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
           " s; host memory ", describe(process_memory()));
  for (int s = 0; split > 1 && s < split; ++s)
    log_info("target stage ", s, ": layers ", t.target->stage(s).stage().first, "-",
             t.target->stage(s).stage().end - 1);
  return t;
}

void add_target_split_option(CLI::App* sub, int& split) {
  sub->add_option("--target-split", split, "cut the target into S stages of consecutive layers, stage s on the device "
                  "after --device's s times (cuda:N+s; on the CPU, S contexts): targets larger than one device")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
}

}  // namespace dflash::cli
