// cli/cmd_tokenize.cpp — `dflash tokenize`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("tokenize", "tokenize (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash tokenize` is not built yet"); });
}

}  // namespace dflash::cli
