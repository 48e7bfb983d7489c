// cli/cmd_bench.cpp — `dflash bench <what>`: measurements printed as a small table (or JSON with --json).
//   bench tokenizer --tokenizer DIR --corpus FILE_OR_DIR [--threads N] [--oracle tests/oracle/tokenize.mjs]
//     Encodes the same corpus with our Tokenizer (single-threaded, best of --repeat runs, each on a freshly loaded
//     tokenizer so its word cache starts cold) and with the npm oracle (tests/oracle/tokenize.mjs --bench: node
//     times its own encode loop, load and I/O excluded), prints both MB/s and the ratio, then ours on N threads.
//   bench chat-template --tokenizer DIR --input rows.jsonl [--chat-template FILE] [--repeat N]
//     Renders every {"messages"} / {"prompt", "completion"} row of the file through the chat template and derives
//     its supervised spans (the work prepare does before tokenizing), single-threaded, best of --repeat runs; the
//     same work as bench/chat_template_engine.py does with Python's Jinja2 (bench/RESULTS.md "Chat templates").
// Other bench subcommands get their own register_bench_* below.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "io/tokenizer/util.h"  // defines: tok::decode_utf8

namespace dflash::cli {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();)
    if (tok::decode_utf8(s, i) < 0) return false;
  return true;
}

// The corpus as documents of at most 64 KB (cut at line ends): every regular file under the path, in sorted
// order, that is valid UTF-8 (others are skipped and counted), until max_bytes.
std::vector<std::string> load_corpus(const std::string& path, size_t max_bytes, size_t& skipped) {
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code ec2;
      if (it->is_regular_file(ec2) && !it->is_symlink(ec2)) files.push_back(it->path().string());
    }
    std::sort(files.begin(), files.end());
  } else {
    DFLASH_CHECK(fs::is_regular_file(path), "bench tokenizer: --corpus ", path, ": no such file or directory");
    files.push_back(path);
  }
  std::vector<std::string> docs;
  size_t total = 0;
  skipped = 0;
  for (const std::string& f : files) {
    if (total >= max_bytes) break;
    std::string text;
    try {
      text = read_file(f);
    } catch (const Error&) {
      ++skipped;
      continue;
    }
    if (text.empty()) continue;
    if (!valid_utf8(text)) {
      ++skipped;
      continue;
    }
    for (size_t pos = 0; pos < text.size() && total < max_bytes;) {
      size_t end = pos + 65536 >= text.size() ? text.size() : text.rfind('\n', pos + 65536);
      if (end == std::string::npos || end <= pos) {
        end = std::min(text.size(), pos + 65536);
        while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
      } else if (end < text.size()) {
        ++end;
      }
      docs.push_back(text.substr(pos, end - pos));
      total += end - pos;
      pos = end;
    }
  }
  DFLASH_CHECK(!docs.empty(), "bench tokenizer: --corpus ", path, ": no valid UTF-8 text found");
  return docs;
}

std::string find_oracle(const std::string& given) {
  if (!given.empty()) {
    DFLASH_CHECK(file_exists(given), "bench tokenizer: --oracle ", given, ": no such file");
    return given;
  }
  std::vector<std::string> candidates = {"tests/oracle/tokenize.mjs"};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path d = exe.parent_path(); !d.empty() && d != d.root_path(); d = d.parent_path())
      candidates.push_back((d / "tests/oracle/tokenize.mjs").string());
  }
  for (const std::string& c : candidates)
    if (file_exists(c)) return c;
  DFLASH_FAIL("bench tokenizer: cannot find tests/oracle/tokenize.mjs (run from the repository root or pass --oracle)");
}

struct OracleResult {
  double seconds = 0;
  int64_t bytes = 0, tokens = 0;
};

OracleResult run_oracle(const std::string& script, const std::string& tokenizer, const std::vector<std::string>& docs) {
  DFLASH_CHECK(std::system("command -v node >/dev/null 2>&1") == 0,
               "bench tokenizer: node is not on PATH (run scripts/setup.sh, or pass --no-oracle)");
  fs::path dir = fs::temp_directory_path() / ("dflash_bench_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string in = (dir / "corpus.jsonl").string(), out = (dir / "out.json").string();
  {
    std::ofstream f(in, std::ios::binary);
    for (const std::string& d : docs) f << nlohmann::json{{"text", d}}.dump() << '\n';
  }
  std::string cmd = "node " + shell_quote(script) + " --tokenizer " + shell_quote(tokenizer) + " --bench < " +
                    shell_quote(in) + " > " + shell_quote(out);
  int rc = std::system(cmd.c_str());
  std::string text = file_exists(out) ? read_file(out) : "";
  std::error_code rm_ec;
  fs::remove_all(dir, rm_ec);
  DFLASH_CHECK(rc == 0, "bench tokenizer: the oracle failed (", cmd, ")");
  OracleResult r;
  try {
    auto j = nlohmann::json::parse(text);
    r.seconds = j.at("seconds").get<double>();
    r.bytes = j.at("bytes").get<int64_t>();
    r.tokens = j.at("tokens").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    DFLASH_FAIL("bench tokenizer: unexpected oracle output \"", text.substr(0, 200), "\": ", e.what());
  }
  return r;
}

struct TokenizerBenchOptions {
  std::string tokenizer, corpus, oracle;
  int threads = 0;
  int repeat = 3;
  double max_mb = 16;
  bool no_oracle = false;
  bool json = false;
};

void bench_tokenizer(const TokenizerBenchOptions& o) {
  size_t skipped = 0;
  std::vector<std::string> docs = load_corpus(o.corpus, static_cast<size_t>(o.max_mb * 1e6), skipped);
  int64_t bytes = 0;
  for (const auto& d : docs) bytes += static_cast<int64_t>(d.size());
  const double mb = static_cast<double>(bytes) / 1e6;

  // Ours, one thread: best of `repeat` passes, each with a freshly loaded tokenizer (cold word cache).
  double best1 = 1e30;
  int64_t tokens = 0;
  std::string hash;
  for (int r = 0; r < std::max(1, o.repeat); ++r) {
    auto tok = Tokenizer::load(o.tokenizer);
    hash = tok->hash();
    int64_t n = 0;
    double t0 = now_s();
    for (const auto& d : docs) n += static_cast<int64_t>(tok->encode(d).size());
    best1 = std::min(best1, now_s() - t0);
    tokens = n;
  }

  // Ours, N threads (dynamic document hand-out).
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double bestn = 1e30;
  for (int r = 0; r < std::max(1, o.repeat); ++r) {
    auto tok = Tokenizer::load(o.tokenizer);
    std::atomic<size_t> next{0};
    std::atomic<int64_t> n{0};
    double t0 = now_s();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        int64_t local = 0;
        for (size_t i; (i = next.fetch_add(1)) < docs.size();)
          local += static_cast<int64_t>(tok->encode(docs[i]).size());
        n += local;
      });
    }
    for (auto& th : pool) th.join();
    bestn = std::min(bestn, now_s() - t0);
  }

  OracleResult orc;
  if (!o.no_oracle) orc = run_oracle(find_oracle(o.oracle), o.tokenizer, docs);

  ojson out;
  out["tokenizer"] = o.tokenizer;
  out["tokenizer_sha256"] = hash;
  out["corpus"] = o.corpus;
  out["documents"] = docs.size();
  out["files_skipped_not_utf8"] = skipped;
  out["mb"] = mb;
  out["tokens"] = tokens;
  out["ours_1t_mb_s"] = mb / best1;
  out["ours_threads"] = threads;
  out["ours_nt_mb_s"] = mb / bestn;
  if (!o.no_oracle) {
    out["oracle_mb_s"] = static_cast<double>(orc.bytes) / 1e6 / orc.seconds;
    out["oracle_tokens"] = orc.tokens;
    out["ratio_1t"] = (mb / best1) / (static_cast<double>(orc.bytes) / 1e6 / orc.seconds);
  }
  if (o.json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::printf("corpus: %s: %zu documents, %.2f MB (%zu files skipped: not UTF-8), %lld tokens\n", o.corpus.c_str(),
              docs.size(), mb, skipped, static_cast<long long>(tokens));
  std::printf("ours, 1 thread:     %8.2f MB/s  (best of %d, %.3f s)\n", mb / best1, std::max(1, o.repeat), best1);
  if (!o.no_oracle) {
    double omb = static_cast<double>(orc.bytes) / 1e6 / orc.seconds;
    std::printf("oracle (node):      %8.2f MB/s  (%.3f s, load excluded)\n", omb, orc.seconds);
    std::printf("ratio ours/oracle:  %8.2fx\n", (mb / best1) / omb);
    if (orc.tokens != tokens)
      std::printf("warning: token counts differ: ours %lld, oracle %lld\n", static_cast<long long>(tokens),
                  static_cast<long long>(orc.tokens));
  }
  std::printf("ours, %d threads:    %8.2f MB/s  (best of %d, %.3f s)\n", threads, mb / bestn, std::max(1, o.repeat),
              bestn);
}

void register_bench_tokenizer(CLI::App& bench) {
  auto* sub = bench.add_subcommand("tokenizer", "tokenizer throughput: ours (1 and N threads) vs the npm oracle");
  static TokenizerBenchOptions o;
  sub->add_option("--tokenizer", o.tokenizer, "directory holding tokenizer.json")->required();
  sub->add_option("--corpus", o.corpus, "a text file, or a directory read recursively (non-UTF-8 files skipped)")
      ->required();
  sub->add_option("--threads", o.threads, "threads for the multi-threaded run (default: all cores)");
  sub->add_option("--repeat", o.repeat, "runs of ours; the best is reported")->default_val(3);
  sub->add_option("--max-mb", o.max_mb, "use at most this many MB of the corpus")->default_val(16);
  sub->add_option("--oracle", o.oracle, "path of tests/oracle/tokenize.mjs (default: found from cwd or the binary)");
  sub->add_flag("--no-oracle", o.no_oracle, "skip the node oracle");
  sub->add_flag("--json", o.json, "print JSON");
  sub->callback([] { bench_tokenizer(o); });
}

struct ChatTemplateBenchOptions : ChatTemplateChoice {
  std::string tokenizer, input;
  int repeat = 3;
};

void bench_chat_template(const ChatTemplateBenchOptions& o) {
  auto tok = Tokenizer::load(o.tokenizer);
  ChatEncoder enc(tok, ChatTemplate::load(*tok, o.chat_template, o.chat_template_name));
  std::vector<std::vector<ChatMessage>> rows;
  std::ifstream f(o.input, std::ios::binary);
  DFLASH_CHECK(f.good(), o.input, ": cannot open");
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const ojson j = ojson::parse(line);
    if (j.contains("messages")) {
      rows.push_back(parse_messages(j["messages"]));
    } else if (j.contains("prompt") && j.contains("completion")) {
      rows.push_back({{"user", j["prompt"].get<std::string>(), std::nullopt, {}},
                      {"assistant", j["completion"].get<std::string>(), std::nullopt, {}}});
    }
  }
  DFLASH_CHECK(!rows.empty(), o.input, ": no {\"messages\"} or {\"prompt\", \"completion\"} rows");
  const ChatOptions co = o.options();
  double best = 1e30;
  int64_t bad = 0;
  for (int r = 0; r < std::max(1, o.repeat); ++r) {
    bad = 0;
    const double t0 = now_s();
    for (const auto& ms : rows) {
      try {
        enc.render(ms, co);
      } catch (const BadRow&) {
        ++bad;
      }
    }
    best = std::min(best, now_s() - t0);
  }
  std::printf("chat template %s: %zu rows (%lld refused), %.3f s, %.0f rows/s (render + supervised spans, 1 thread, "
              "best of %d)\n",
              enc.chat_template().origin().c_str(), rows.size(), static_cast<long long>(bad), best,
              static_cast<double>(rows.size()) / best, std::max(1, o.repeat));
}

void register_bench_chat_template(CLI::App& bench) {
  auto* sub = bench.add_subcommand("chat-template", "chat-template rendering + mask rows/s (1 thread)");
  static ChatTemplateBenchOptions o;
  sub->add_option("--tokenizer", o.tokenizer, "directory holding tokenizer.json (+ tokenizer_config.json)")->required();
  sub->add_option("--input", o.input, "JSON Lines of {\"messages\"} or {\"prompt\", \"completion\"} rows")->required();
  sub->add_option("--chat-template", o.chat_template, "auto or a template file")->capture_default_str();
  sub->add_option("--repeat", o.repeat, "runs; the best is reported")->default_val(3);
  sub->callback([] { bench_chat_template(o); });
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* sub = app.add_subcommand("bench", "benchmarks (subcommands: tokenizer, chat-template)");
  sub->require_subcommand(1);
  register_bench_tokenizer(*sub);
  register_bench_chat_template(*sub);
}

}  // namespace dflash::cli
