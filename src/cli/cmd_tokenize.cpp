// cli/cmd_tokenize.cpp — `dflash tokenize --tokenizer DIR`: text on stdin -> its token ids as one JSON array
// (no BOS added); `--no-special` encodes special added tokens written in the text as plain text; `--decode` reads
// a JSON array of ids and prints the text (`--skip-special` drops special tokens). `--chat` reads one conversation
// ({"messages": [...], "tools"?: [...]} or the bare array) and prints {"ids": [...], "loss_mask": [...], "text": ...}
// exactly as `dflash prepare` renders it (the model's template or --chat-template, the same variables), to debug a
// chat template; --generation-prompt renders the prompt `dflash generate` would send instead (no mask).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/chat_options.h"
#include "cli/commands.h"
#include "core/error.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"

namespace dflash::cli {

namespace {

struct TokenizeOptions : ChatTemplateChoice {
  std::string tokenizer;
  bool generation_prompt = false;
  bool no_special = false;
  bool decode = false;
  bool skip_special = false;
  bool chat = false;
};

std::string read_stdin() {
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) s.append(buf, n);
  DFLASH_CHECK(!std::ferror(stdin), "tokenize: cannot read standard input");
  return s;
}

void run_tokenize(const TokenizeOptions& o) {
  auto tok = Tokenizer::load(o.tokenizer);
  const std::string input = read_stdin();
  if (o.chat) {
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(input);
    } catch (const nlohmann::json::exception& e) {
      DFLASH_FAIL("tokenize --chat: standard input is not JSON: ", e.what());
    }
    const nlohmann::ordered_json& msgs = j.is_object() && j.contains("messages") ? j["messages"] : j;
    std::vector<ChatMessage> ms;
    try {
      ms = parse_messages(msgs);
    } catch (const BadRow& e) {
      DFLASH_FAIL("tokenize --chat: ", e.what(), " (", e.reason(), ")");
    }
    try {
      validate_conversation(ms, o.generation_prompt);
    } catch (const BadRow& e) {
      std::fprintf(stderr, "warning: `dflash prepare` would skip this conversation (%s): %s\n", e.reason().c_str(),
                   e.what());
    }
    ChatEncoder enc(tok, ChatTemplate::load(*tok, o.chat_template, o.chat_template_name));
    ChatOptions co = o.options();
    co.add_generation_prompt = o.generation_prompt;
    if (j.is_object() && j.contains("tools") && j["tools"].is_array()) co.tools = j["tools"];
    RenderedChat r;
    ChatEncoding e;
    try {
      r = enc.render(ms, co);
      e = enc.encode_rendered(r);
    } catch (const BadRow& err) {
      DFLASH_FAIL("tokenize --chat: ", err.what(), " (", err.reason(), ")");
    }
    nlohmann::ordered_json out;
    out["ids"] = e.ids;
    out["loss_mask"] = e.loss_mask;
    out["text"] = r.text;
    const std::string line = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    return;
  }
  if (o.decode) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(input);
    } catch (const nlohmann::json::exception& e) {
      DFLASH_FAIL("tokenize --decode: standard input is not JSON: ", e.what());
    }
    DFLASH_CHECK(j.is_array(), "tokenize --decode: expected a JSON array of token ids on standard input");
    std::vector<int32_t> ids;
    ids.reserve(j.size());
    for (size_t i = 0; i < j.size(); ++i) {
      DFLASH_CHECK(j[i].is_number_integer(), "tokenize --decode: element ", i, " is not an integer: ", j[i].dump());
      int64_t v = j[i].get<int64_t>();
      DFLASH_CHECK(v >= 0 && v < tok->vocab_size(), "tokenize --decode: id ", v, " at element ", i,
                   " is outside the vocabulary [0, ", tok->vocab_size(), ")");
      ids.push_back(static_cast<int32_t>(v));
    }
    std::string text = tok->decode(ids, o.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::vector<int32_t> ids = tok->encode(input, !o.no_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("tokenize", "encode stdin to token ids (JSON array), or decode ids with --decode");
  static TokenizeOptions o;
  sub->add_option("--tokenizer", o.tokenizer, "directory holding tokenizer.json or tiktoken.model (or that file)")
      ->required();
  sub->add_flag("--no-special", o.no_special, "encode special tokens written in the text as plain text");
  sub->add_flag("--decode", o.decode, "read a JSON array of ids on stdin and print the text");
  sub->add_flag("--skip-special", o.skip_special, "with --decode: leave out special tokens");
  sub->add_flag("--chat", o.chat, "one conversation JSON ({\"messages\": [...]}) -> {\"ids\", \"loss_mask\", \"text\"}");
  sub->add_flag("--generation-prompt", o.generation_prompt, "with --chat: the prompt `dflash generate` renders "
                "(add_generation_prompt=true; the conversation ends with the user)");
  add_chat_template_options(sub, o);
  sub->callback([] { run_tokenize(o); });
}

}  // namespace dflash::cli
