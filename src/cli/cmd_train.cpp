// cli/cmd_train.cpp — `dflash train`.
#include "cli/commands.h"
#include "core/error.h"

namespace dflash::cli {

void register_train(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "train (not built yet)");
  sub->callback([] { DFLASH_FAIL("`dflash train` is not built yet"); });
}

}  // namespace dflash::cli
