// cli/cmd_info.cpp — `dflash info`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_info(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "info (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash info` is not built yet"); });
}

}  // namespace dflash::cli
