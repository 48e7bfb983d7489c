// cli/cmd_eval.cpp — `dflash eval`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_eval(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "eval (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash eval` is not built yet"); });
}

}  // namespace dflash::cli
