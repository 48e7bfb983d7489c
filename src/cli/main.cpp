// dflash — trains DFlash speculative-decoding drafters for a frozen target LLM.
// Subcommands: prepare, train, eval, export, generate, bench, info, tokenize, demo (the README's main job).
#include <cstdio>

#include "cli/commands.h"  // defines: register_* for each subcommand
#include "core/error.h"    // defines: dflash::Error

int main(int argc, char** argv) {
  CLI::App app{"dflash: train DFlash block-diffusion drafters for speculative decoding"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dflash 0.1.0");
  // Options of any subcommand can come from a TOML/INI file, in a section named after it ([train] ...); options
  // on the command line win. `--config` may be written after the subcommand (fallthrough).
  app.set_config("--config", "", "TOML/INI file of options, one [section] per subcommand, e.g. [train]");
  app.fallthrough();
  dflash::cli::register_prepare(app);
  dflash::cli::register_train(app);
  dflash::cli::register_eval(app);
  dflash::cli::register_export(app);
  dflash::cli::register_generate(app);
  dflash::cli::register_bench(app);
  dflash::cli::register_info(app);
  dflash::cli::register_tokenize(app);
  dflash::cli::register_demo(app);
  dflash::cli::register_plot(app);
  dflash::cli::register_capture(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dflash::cli::ExitCode& e) {
    return e.code;
  } catch (const dflash::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
