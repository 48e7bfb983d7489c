// cli/cmd_tokenize.cpp — `dflash tokenize --tokenizer DIR`: text on stdin -> its token ids as one JSON array
// (no BOS added); `--no-special` encodes special added tokens written in the text as plain text; `--decode` reads
// a JSON array of ids and prints the text (`--skip-special` drops special tokens). `--chat` (one conversation JSON
// -> ids and loss mask, through the chat-template module) is reserved for the chat-template work.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/tokenizer.h"

namespace dflash::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer;
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
    // Chat mode: one conversation JSON -> {"input_ids": [...], "loss_mask": [...]}, rendered with the target's chat
    // template. Added by the chat-template module.
    DFLASH_FAIL("`dflash tokenize --chat` is not built yet");
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
  sub->add_option("--tokenizer", o.tokenizer, "directory holding tokenizer.json (or the tokenizer.json file)")
      ->required();
  sub->add_flag("--no-special", o.no_special, "encode special tokens written in the text as plain text");
  sub->add_flag("--decode", o.decode, "read a JSON array of ids on stdin and print the text");
  sub->add_flag("--skip-special", o.skip_special, "with --decode: leave out special tokens");
  sub->add_flag("--chat", o.chat, "one conversation JSON -> ids and loss mask (not built yet)");
  sub->callback([] { run_tokenize(o); });
}

}  // namespace dflash::cli
