// cli/cmd_demo.cpp — `dflash demo`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_demo(CLI::App& app) {
  auto* sub = app.add_subcommand("demo", "demo (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash demo` is not built yet"); });
}

}  // namespace dflash::cli
