// cli/cmd_prepare.cpp — `dflash prepare`: JSON Lines or JSON-array files of conversations (messages, ShareGPT /
// SpecForge conversations), pairs or pre-tokenized rows -> a data directory.
#include <cstdio>

#include "cli/chat_options.h"
#include "cli/commands.h"
#include "core/error.h"
#include "io/prepare.h"

namespace dflash::cli {

void register_prepare(CLI::App& app) {
  auto* sub = app.add_subcommand("prepare", "tokenize chat data into a training data directory (spec 2.6)");
  auto o = std::make_shared<PrepareOptions>();
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer.json / tiktoken.model or the model directory holding it")->required();
  sub->add_option("--input", o->inputs, "input files, plain or .gz: JSON Lines, or .json holding one array of rows; "
                  "rows: {\"messages\": [...]}, {\"conversations\": [...]} (ShareGPT from/value or role/content), "
                  "{\"prompt\", \"completion\"} or {\"input_ids\", \"loss_mask\"}")
      ->required();
  sub->add_option("--out", o->out, "output data directory (must not exist unless --overwrite)")->required();
  sub->add_option("--max-length", o->max_length, "tokens per sample; longer samples are cut")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  sub->add_option("--threads", o->threads, "tokenization threads (0 = all cores); output is identical for any N")
      ->capture_default_str();
  sub->add_option("--format", o->format, "prompt/completion rows: chat (through the model's chat template), raw "
                  "(prompt + completion + eos), auto (chat when there is a chat template)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "chat", "raw"}));
  add_chat_template_options(sub, *o);
  sub->add_flag("--overwrite", o->overwrite, "replace an existing data directory");
  sub->callback([o] {
    PrepareSummary s = run_prepare(*o);
    std::printf("%s\n", s.to_string().c_str());
  });
}

}  // namespace dflash::cli
