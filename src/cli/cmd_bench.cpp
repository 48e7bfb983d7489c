// cli/cmd_bench.cpp — `dflash bench`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "bench (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash bench` is not built yet"); });
}

}  // namespace dflash::cli
