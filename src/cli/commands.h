// cli/commands.h — one registration function per subcommand; each lives in cli/cmd_<name>.cpp.
// A registration adds the subcommand, its options and its callback to the app. A callback reports failure
// by throwing dflash::Error; main() prints the message and exits with status 1.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

namespace dflash {
struct TrainConfig;  // train/trainer.h
}

namespace dflash::cli {

void register_prepare(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_export(CLI::App& app);
void register_generate(CLI::App& app);
void register_bench(CLI::App& app);
void register_info(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_demo(CLI::App& app);
void register_plot(CLI::App& app);
void register_capture(CLI::App& app);

// The train options that shape the layout and its memory (devices, workers, --target-split, drafter shape, sequence
// length, queue depth, optimizer sharding, --device-memory): `train` and `info --plan` (cli/cmd_train.cpp).
void add_layout_options(CLI::App* sub, TrainConfig& c);

// `s` as one shell word for a std::system / popen command line: single-quoted, each ' written as '\''.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Exit status a callback may request instead of throwing (e.g. `eval` with no valid rows).
struct ExitCode {
  int code;
};

}  // namespace dflash::cli
