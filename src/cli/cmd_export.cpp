// cli/cmd_export.cpp — `dflash export`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_export(CLI::App& app) {
  auto* sub = app.add_subcommand("export", "export (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash export` is not built yet"); });
}

}  // namespace dflash::cli
