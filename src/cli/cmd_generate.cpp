// cli/cmd_generate.cpp — `dflash generate`: the target regenerates the responses of a prompts file (spec 2.6),
// batched, greedy or sampled, resumable; the output is prompt/completion JSONL that `dflash prepare` reads.
#include <cstdio>

#include "backend/context.h"
#include "cli/chat_options.h"
#include "cli/commands.h"
#include "cli/target_devices.h"
#include "core/error.h"
#include "core/log.h"
#include "eval/generate.h"
#include "io/tokenizer.h"
#include "model/target.h"

namespace dflash::cli {

namespace {

struct GenerateCli {
  GenerateOptions g;
  std::string target, device = "cpu", tokenizer;
  std::vector<int32_t> stop_ids;
  bool no_default_stops = false;
  int target_split = 1;
};

void run(const GenerateCli& c) {
  const std::string tok_path = c.tokenizer.empty() ? c.target : c.tokenizer;
  auto tok = Tokenizer::load(tok_path);
  TargetOnDevices on = load_target_on_devices(c.target, c.device, c.target_split);
  GenerateOptions g = c.g;
  if (!c.no_default_stops) g.decode.eos_ids = stop_token_ids(c.target, on.target->config(), tok.get());
  g.decode.eos_ids.insert(g.decode.eos_ids.end(), c.stop_ids.begin(), c.stop_ids.end());
  GenerateSummary s = run_generate(on.ctx(), *on.target, tok, g);
  std::printf("%s", s.to_string().c_str());
}

}  // namespace

void register_generate(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "generate", "regenerate responses with the target (batched greedy / sampled decoding, resumable); writes "
                  "prompt/completion JSONL for `dflash prepare`");
  auto c = std::make_shared<GenerateCli>();
  sub->add_option("--target", c->target, "target model directory (config.json, *.safetensors, tokenizer.json)")
      ->required();
  sub->add_option("--prompts", c->g.prompts, "prompts JSONL (plain or .gz): {\"prompt\": \"...\"} or "
                  "{\"messages\": [...]} (last message from the user)")
      ->required();
  sub->add_option("--out", c->g.out, "output JSONL, one row per prompt in input order: {\"index\", \"prompt\", "
                  "\"completion\", \"finish_reason\"} (messages rows: the conversation plus the assistant reply); an "
                  "existing output needs --resume or --overwrite")
      ->required();
  sub->add_option("--tokenizer", c->tokenizer, "tokenizer.json / tiktoken.model or its directory (default: the target directory)");
  sub->add_option("--device", c->device, "cpu | cuda | cuda:N")->capture_default_str();
  add_target_split_option(sub, c->target_split);
  sub->add_option("--batch-size", c->g.decode.batch_size, "sequences decoded together (continuous batching; the "
                  "output does not depend on it)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--max-new-tokens", c->g.decode.max_new_tokens, "generated tokens per row, stop token included")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--temperature", c->g.decode.sampling.temperature, "sampling temperature; 0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--top-p", c->g.decode.sampling.top_p, "nucleus sampling mass in (0, 1] (with --temperature > 0)")
      ->capture_default_str()
      ->check(CLI::Range(1e-9, 1.0));
  sub->add_option("--seed", c->g.decode.sampling.seed, "sampling seed; a row's tokens depend on (seed, row index, "
                  "token index) only")
      ->capture_default_str();
  sub->add_option("--format", c->g.format, "{\"prompt\"} rows: chat (user turn + assistant generation prompt), raw "
                  "([bos] + prompt tokens), auto (chat when the tokenizer has a chat template); use the same as "
                  "`dflash prepare --format`")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "chat", "raw"}));
  add_chat_template_options(sub, c->g);
  sub->add_option("--stop-id", c->stop_ids, "extra stop token id (repeatable); the defaults are the tokenizer's eos, "
                  "config.json and generation_config.json eos_token_id");
  sub->add_flag("--no-default-stops", c->no_default_stops, "use only the --stop-id ids");
  sub->add_flag("--write-ids", c->g.write_ids, "also write \"prompt_ids\" and \"completion_ids\" (exact token ids)");
  sub->add_flag("--resume", c->g.resume, "continue an existing output: rows already there are kept and skipped");
  sub->add_flag("--overwrite", c->g.overwrite, "replace an existing output file");
  sub->add_flag("--no-progress", [c](int64_t) { c->g.progress = false; }, "no progress display");
  sub->callback([c] { run(*c); });
}

}  // namespace dflash::cli
