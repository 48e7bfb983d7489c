// cli/chat_options.h — the chat-template options that prepare, generate and tokenize share, one entry each.
// defines: add_chat_template_options
#pragma once
#include <CLI/CLI.hpp>

#include "io/chat_template.h"

namespace dflash::cli {

// --chat-template, --chat-template-name, --thinking / --no-thinking, --reasoning-effort, --template-arg into `c`.
inline void add_chat_template_options(CLI::App* sub, ChatTemplateChoice& c) {
  sub->add_option("--chat-template", c.chat_template, "the chat template: auto (the tokenizer's own: "
                  "tokenizer_config.json \"chat_template\", else chat_template.jinja), or a file: FILE.jinja, or a "
                  "JSON file with \"chat_template\" (e.g. another model's tokenizer_config.json)")
      ->capture_default_str();
  sub->add_option("--chat-template-name", c.chat_template_name, "with a list of named templates: which one "
                  "(default: \"default\", else the first)");
  auto* on = sub->add_flag("--thinking", [&c](int64_t) { c.enable_thinking = true; },
                           "pass enable_thinking=true to the template (without --thinking / --no-thinking the "
                           "template sees it undefined, as apply_chat_template leaves it; recorded in the manifest)");
  auto* off = sub->add_flag("--no-thinking", [&c](int64_t) { c.enable_thinking = false; },
                            "pass enable_thinking=false to the template (recorded in the manifest)");
  on->excludes(off);
  sub->add_option("--reasoning-effort", c.reasoning_effort, "passed to the template as reasoning_effort (gpt-oss: "
                  "low, medium, high); not passed when not given");
  sub->add_option("--template-arg", c.template_args, "KEY=VALUE: one more template variable (VALUE read as JSON "
                  "when it parses, else as a string; repeatable), e.g. --template-arg thinking=true");
}

}  // namespace dflash::cli
