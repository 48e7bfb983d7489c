// tests/common/train_fixtures.h — small training runs for the tests: a learnable toy data set for the tiny Qwen3
// golden target, a config sized for 2 CPU cores, metrics reading, the 2 + 2 = 1 workers check, a family's pipeline
// (train, 2 + 2 = 1, eval), temporary directories, child processes.
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "io/dataset.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace dflash::test {

inline std::string train_tmpdir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("dflash_test_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// Arithmetic progressions mod 64, x[p+1] = x[p] + k (k in 1..3 per sample); loss mask from `mask(sample, p)`
// (default: a 6-token prompt, then the response). `meta`: the manifest's other fields (as prepare records them).
inline std::string make_train_data(const std::string& root, int samples = 24, int len = 40,
                                   const std::function<bool(int, int)>& mask = nullptr, const std::string& name = "data",
                                   const nlohmann::json& meta = nlohmann::json::object()) {
  const std::string dir = root + "/" + name;
  DatasetWriter w(dir);
  Rng rng(5, RngPurpose::Test);
  for (int s = 0; s < samples; ++s) {
    const int k = 1 + static_cast<int>(rng.below(3));
    int x = static_cast<int>(rng.below(64));
    std::vector<int32_t> ids;
    std::vector<uint8_t> m;
    for (int p = 0; p < len; ++p) {
      ids.push_back(x % 64);
      m.push_back(mask ? mask(s, p) : p >= 6);
      x += k;
    }
    w.add(ids, m);
  }
  w.commit(meta);
  return dir;
}

inline TrainConfig tiny_train_config(const std::string& root, const std::string& data) {
  TrainConfig c;
  c.target_dir = source_dir() + "/tests/golden/target_qwen3";
  c.data_dir = data;
  c.out_dir = root + "/run";
  c.threads = 1;
  c.num_layers = 1;
  c.block_size = 4;
  c.target_layer_ids = {1, 2};
  c.mask_token_id = 511;
  c.max_anchors = 8;
  c.batch_size = 4;
  c.optim.lr = 3e-3;
  c.seed = 3;
  c.quiet = true;
  c.export_at_end = false;
  c.checkpoint_every = 0;
  return c;
}

inline std::vector<nlohmann::json> read_metrics_jsonl(const std::string& out_dir) {
  std::ifstream in(out_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> v;
  std::string line;
  while (std::getline(in, line)) v.push_back(nlohmann::json::parse(line));
  return v;
}

// Every parameter of the latest checkpoint of a run, in name order.
inline std::vector<double> final_params(const std::string& out_dir) {
  auto ws = WeightStore::open(latest_checkpoint(out_dir) + "/params.safetensors");
  std::vector<double> v;
  for (const auto& n : ws.names()) {
    auto f = to_f32_vector(ws.view(n));
    v.insert(v.end(), f.begin(), f.end());
  }
  return v;
}

// Trains `one`'s config again with 2 target + 2 drafter workers into `out_dir`, without an export (`one` itself has
// run, with one of each, for one.max_steps steps): the loss of every step and the final parameters agree within 1e-5
// (the order of floating-point sums), the parameters are not bit-equal (two drafters really sum two partial
// gradients), and nothing was initialised after the warm-up. `label` names the case in failures. Returns the metrics
// of both runs. (The 2 + 2 = 1 check of the dense, MoE, gpt-oss, hybrid and D-PACE pipeline tests.)
inline std::pair<std::vector<nlohmann::json>, std::vector<nlohmann::json>> expect_two_plus_two_as_one(
    const TrainConfig& one, const std::string& out_dir, const std::string& label = "") {
  TrainConfig two = one;
  two.export_at_end = false;
  two.targets = "2";
  two.drafters = "2";
  two.out_dir = out_dir;
  TrainSummary s2 = train(two);
  EXPECT_EQ(s2.drafters, 2) << label;
  EXPECT_EQ(s2.lazy_inits_after_warmup, 0) << label;
  auto m1 = read_metrics_jsonl(one.out_dir), m2 = read_metrics_jsonl(two.out_dir);
  EXPECT_EQ(m1.size(), static_cast<size_t>(one.max_steps)) << label;
  EXPECT_EQ(m2.size(), m1.size()) << label;
  for (size_t i = 0; i < std::min(m1.size(), m2.size()); ++i) {
    const double l1 = m1[i]["loss"].get<double>(), l2 = m2[i]["loss"].get<double>();
    EXPECT_LE(std::fabs(l1 - l2), 1e-5 * std::fabs(l1)) << label << " step " << i + 1;
  }
  const auto p1 = final_params(one.out_dir), p2 = final_params(two.out_dir);
  EXPECT_LE(rel_err(p2, p1), 1e-5) << label;
  EXPECT_GT(rel_err(p2, p1), 0.0) << label << ": two drafters must really sum two partial gradients";
  return {m1, m2};
}

// What `dflash <args>` prints (stdout and stderr, through the file `out`); a failing exit status fails the test
// with that output.
inline std::string dflash_output(const std::string& args, const std::string& out) {
  const std::string cmd = cat(DFLASH_BINARY, " ", args, " > ", out, " 2>&1");
  const int rc = std::system(cmd.c_str());
  const std::string text = read_file(out);
  EXPECT_EQ(rc, 0) << cmd << "\n" << text;
  return text;
}

// The family tests' pipeline on a golden target directory: 10 steps of tiny_train_config with an export (the loss
// falls; the export's intermediate_size is `intermediate_size` and its target layers [1, 2]), 2 + 2 workers equal to
// 1 + 1 (expect_two_plus_two_as_one), and `dflash eval` of the export on 4 samples lossless. `name` makes the
// temporary directory and labels failures.
inline void expect_family_pipeline(const std::string& target_dir, const std::string& name, int64_t intermediate_size) {
  const std::string root = train_tmpdir("pipe" + name);
  const std::string data = make_train_data(root);
  TrainConfig one = tiny_train_config(root, data);
  one.target_dir = target_dir;
  one.max_steps = 10;
  one.out_dir = root + "/one";
  one.export_at_end = true;
  train(one);
  const auto ex = nlohmann::json::parse(read_file(one.out_dir + "/export/config.json"));
  EXPECT_EQ(ex["intermediate_size"].get<int64_t>(), intermediate_size) << name;
  EXPECT_EQ(ex["dflash_config"]["target_layer_ids"], nlohmann::json({1, 2})) << name;
  auto m1 = read_metrics_jsonl(one.out_dir);
  ASSERT_EQ(m1.size(), 10u) << name;
  EXPECT_LT(m1.back()["loss"].get<double>(), m1.front()["loss"].get<double>()) << name;
  expect_two_plus_two_as_one(one, root + "/two", name);
  const std::string cmd = cat(DFLASH_BINARY, " eval --target ", one.target_dir, " --drafter ", one.out_dir,
                              "/export --data ", data, " --max-samples 4 --stop-id 511 --no-progress --json ", root,
                              "/eval.json > ", root, "/eval.log 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(root + "/eval.log");
  const auto rep = nlohmann::json::parse(read_file(root + "/eval.json"));
  EXPECT_EQ(rep["evaluated"].get<int64_t>(), 4) << rep.dump();
  EXPECT_EQ(rep["lossless_mismatches"].get<int64_t>(), 0) << rep.dump();
  std::filesystem::remove_all(root);
}

// Runs a program (args[0]: its path) in a child process. Without `child`: waits, returns its exit status (128 +
// the signal when a signal ended it). With `child`: returns 0 at once, the pid in *child. `log` (optional): the
// child's stdout and stderr go to that file.
inline int run_binary(const std::vector<std::string>& args, pid_t* child = nullptr, const std::string& log = "") {
  pid_t pid = fork();
  if (pid == 0) {
    if (!log.empty()) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (child) {
    *child = pid;
    return 0;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace dflash::test
