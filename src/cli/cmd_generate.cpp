// cli/cmd_generate.cpp — `dflash generate`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_generate(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "generate (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash generate` is not built yet"); });
}

}  // namespace dflash::cli
