// cli/cmd_prepare.cpp — `dflash prepare`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_prepare(CLI::App& app) {
  auto* sub = app.add_subcommand("prepare", "prepare (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash prepare` is not built yet"); });
}

}  // namespace dflash::cli
