// tests/train/interrupt.cpp — what an interruption leaves behind (train/open_run.h, train/run_files.h,
// train/run_inputs.h, core/run_lock.h): a checkpoint write killed with SIGKILL leaves its temporary, which the next
// start removes (saying how many bytes) before a resume that ends bit-identical to a straight run; a full disk during
// a checkpoint (a write limit, RLIMIT_FSIZE, always; and a real small tmpfs where a mount namespace can be made) stops
// the run naming the file and the bytes needed, the previous checkpoint intact and metrics.jsonl cut back to it, and
// the run resumes elsewhere; the space check before step 1; a resume onto another data set, tokenizer or template
// variable is refused naming the field and both values, and accepted with --allow-data-change (recorded), never onto
// another target; a second process on a held run directory is refused naming the holder, and a resume after the
// holder was killed succeeds; `dflash demo` stops on SIGINT with a checkpoint and exit 130, and --resume finishes it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "core/job_control.h"  // StopOnSignals
#include "core/run_lock.h"
#include "core/sha256.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/export.h"
#include "train/checkpoint.h"
#include "train/run_files.h"
#include "train/run_inputs.h"
#include "common/train_fixtures.h"

using namespace dflash;
using namespace dflash::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string tmpdir(const std::string& name) { return train_tmpdir("interrupt_" + name); }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string host() {
  char b[256] = {};
  gethostname(b, sizeof b - 1);
  return b;
}

// The tiny config as `dflash train` options: 6 steps, a checkpoint every 2.
std::vector<std::string> train_cli(const TrainConfig& c, const std::string& out) {
  return {DFLASH_BINARY, "train", "--target", c.target_dir, "--data", c.data_dir, "--out", out, "--num-layers", "1",
          "--block-size", "4", "--target-layer-ids", "1,2", "--mask-token-id", "511", "--max-anchors", "8",
          "--batch-size", "4", "--lr", "0.003", "--seed", "3", "--threads", "1", "--max-steps", "6",
          "--checkpoint-every", "2", "--quiet", "--no-export"};
}

TrainConfig six_steps(const std::string& root, const std::string& data) {
  TrainConfig c = tiny_train_config(root, data);
  c.max_steps = 6;
  c.checkpoint_every = 2;
  return c;
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Every file under `dir` (relative path -> bytes).
std::map<std::string, std::string> tree_bytes(const std::string& dir) {
  std::map<std::string, std::string> t;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) t[fs::relative(e.path(), dir).string()] = read_file(e.path().string());
  return t;
}

// The entries of <out>/checkpoints whose name has a temporary's infix.
std::vector<std::string> checkpoint_temporaries(const std::string& out) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints"))
    if (has(e.path().filename().string(), ".tmp")) v.push_back(e.path().string());
  return v;
}

// The final state of two runs is the same bit for bit: the checkpoint files, and the metrics step for step.
void expect_same_run(const std::string& a, const std::string& b, size_t steps) {
  for (const char* f : {"/params.safetensors", "/optim.safetensors"})
    EXPECT_TRUE(read_file(latest_checkpoint(a) + f) == read_file(latest_checkpoint(b) + f)) << f;
  const auto ma = read_metrics_jsonl(a), mb = read_metrics_jsonl(b);
  ASSERT_EQ(ma.size(), steps);
  ASSERT_EQ(mb.size(), steps);
  for (size_t i = 0; i < steps; ++i) {
    EXPECT_EQ(ma[i]["step"], mb[i]["step"]);
    EXPECT_EQ(ma[i]["loss"], mb[i]["loss"]) << "step " << i + 1;
    EXPECT_EQ(ma[i]["lr"], mb[i]["lr"]) << "step " << i + 1;
    EXPECT_EQ(ma[i]["grad_norm"], mb[i]["grad_norm"]) << "step " << i + 1;
  }
}

// After a checkpoint of step 4 failed on a full disk: the run's previous checkpoint (step 2) is LATEST, byte for
// byte as before when `before` is given, no temporary is left, metrics.jsonl holds exactly steps 1 and 2.
void expect_intact_at_step_2(const std::string& out, const std::map<std::string, std::string>* before = nullptr) {
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoints/step-00000002");
  if (before) {
    EXPECT_TRUE(tree_bytes(out + "/checkpoints/step-00000002") == *before);
  }
  EXPECT_TRUE(checkpoint_temporaries(out).empty());
  const auto m = read_metrics_jsonl(out);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0]["step"], 1);
  EXPECT_EQ(m[1]["step"], 2);
}

// The bytes a checkpoint error says it needed: "... needs about 720 KiB (737280 bytes) in ...".
int64_t needed_bytes(const std::string& msg) {
  std::smatch m;
  const std::regex re("needs about [^(]+\\(([0-9]+) bytes\\)");
  return std::regex_search(msg, m, re) ? std::stoll(m[1]) : -1;
}

}  // namespace

// Items 1 and 4: a checkpoint write killed with SIGKILL mid-way (after params.safetensors, through the test aid
// --inject-fault checkpoint:0:4) leaves checkpoints/step-00000004.tmp-<pid>. While it is stalled, holding the run
// directory, a second `train --resume` there is refused naming it. After the kill the resume is not blocked, removes
// the temporary (saying what and how many bytes) and ends bit-identical to a straight run.
TEST(Interrupt, CheckpointKilledMidWriteIsCleanedUpAndTheResumeIsBitIdentical) {
  const std::string root = tmpdir("kill");
  const TrainConfig c = six_steps(root, make_train_data(root, 12));
  const std::string straight = root + "/straight", killed = root + "/killed";
  ASSERT_EQ(run_binary(train_cli(c, straight)), 0);

  pid_t a = 0;
  run_binary(plus(train_cli(c, killed), {"--inject-fault", "checkpoint:0:4"}), &a, root + "/a.log");
  const std::string tmp = cat(killed, "/checkpoints/step-00000004.tmp-", a);
  for (int i = 0; i < 600 && !file_exists(tmp + "/params.safetensors"); ++i) usleep(50000);
  ASSERT_TRUE(file_exists(tmp + "/params.safetensors")) << read_file(root + "/a.log");

  // the run directory is held; a second process fails at once naming the holder
  const LockHolder h = read_lock_holder(killed);
  EXPECT_EQ(h.pid, a);
  EXPECT_EQ(h.host, host());
  EXPECT_EQ(h.command, "dflash train");
  EXPECT_TRUE(std::regex_match(h.started, std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")))
      << h.started;
  EXPECT_EQ(run_binary(plus(train_cli(c, killed), {"--resume"}), nullptr, root + "/b.log"), 1);
  const std::string b = read_file(root + "/b.log");
  EXPECT_TRUE(has(b, cat("train: ", killed, " is in use by another process (dflash train, pid ", a, " on host ", host(),
                         ", started ", h.started, ")")))
      << b;
  EXPECT_TRUE(dir_exists(tmp)) << "the refused process must not touch the holder's files";

  kill(a, SIGKILL);
  int status = 0;
  waitpid(a, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_EQ(latest_checkpoint(killed), killed + "/checkpoints/step-00000002");
  EXPECT_EQ(read_metrics_jsonl(killed).size(), 4u);  // rows 3 and 4 came before the checkpoint of step 4
  const int64_t bytes = tree_size(tmp);
  EXPECT_GE(bytes, static_cast<int64_t>(fs::file_size(straight + "/checkpoints/step-00000006/params.safetensors")));

  // the resume after SIGKILL: not blocked by the dead holder; the temporary goes, and is reported
  ASSERT_EQ(run_binary(plus(train_cli(c, killed), {"--resume"}), nullptr, root + "/c.log"), 0)
      << read_file(root + "/c.log");
  const std::string log = read_file(root + "/c.log");
  EXPECT_TRUE(has(log, cat("train: removed 1 temporary an interrupted run left behind, ", format_bytes(bytes), " (",
                           bytes, " bytes) in all: ", tmp, " (", format_bytes(bytes), ")")))
      << log;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(checkpoint_temporaries(killed).empty());
  expect_same_run(straight, killed, 6);
  fs::remove_all(root);
}

// Only the run's own temporaries go: other names in checkpoints/ and the run directory stay.
TEST(Interrupt, OnlyTheRunsOwnTemporariesAreRemoved) {
  const std::string out = tmpdir("own") + "/run";
  for (const char* d : {"checkpoints/step-00000010.tmp-123", "checkpoints/step-00000010", "checkpoints/mine.tmp-1",
                        "export.tmp-4194999", "notes.tmp-5"})
    fs::create_directories(out + "/" + d);  // pid 4194999: above any pid_max, never running
  const std::string live_export = cat(out, "/export.tmp-", getpid());  // a `dflash export` still writing
  fs::create_directories(live_export);
  for (const char* f : {"checkpoints/step-00000010.tmp-123/params.safetensors", "checkpoints/LATEST.tmp.9",
                        "metrics.jsonl.tmp.44", "metrics.jsonl.tmpx", "export.tmp-4194999/model.safetensors"})
    std::ofstream(out + "/" + f) << std::string(1000, 'x');
  const auto removed = remove_run_temporaries(out);
  ASSERT_EQ(removed.size(), 4u);
  EXPECT_EQ(removed[0].path, out + "/checkpoints/LATEST.tmp.9");
  EXPECT_EQ(removed[1].path, out + "/checkpoints/step-00000010.tmp-123");
  EXPECT_EQ(removed[1].bytes, 1000);
  EXPECT_EQ(removed[2].path, out + "/export.tmp-4194999");
  EXPECT_EQ(removed[3].path, out + "/metrics.jsonl.tmp.44");
  for (const char* kept : {"checkpoints/step-00000010", "checkpoints/mine.tmp-1", "notes.tmp-5", "metrics.jsonl.tmpx"})
    EXPECT_TRUE(fs::exists(out + "/" + kept)) << kept;
  EXPECT_TRUE(fs::exists(live_export));
  fs::remove_all(fs::path(out).parent_path());
}

// A full disk as a write limit (RLIMIT_FSIZE below the size of params.safetensors: the write fails with EFBIG, as
// `ulimit -f` does; StopOnSignals ignores SIGXFSZ so the process is not killed by it). The checkpoint of step 4
// fails: the error names the file, the reason and the bytes needed (the size of a checkpoint), the checkpoint of
// step 2 is intact byte for byte and loadable, metrics.jsonl ends at step 2; copied elsewhere, the run resumes and
// ends bit-identical to a straight run.
TEST(Interrupt, CheckpointBeyondAWriteLimitStopsTheRunThePreviousOneIntact) {
  const std::string root = tmpdir("fsize");
  TrainConfig c = six_steps(root, make_train_data(root, 12));
  c.stop_after = 2;
  train(c);
  const std::string prev = latest_checkpoint(c.out_dir);
  const auto prev_bytes = tree_bytes(prev);
  const int64_t prev_size = tree_size(prev);
  c.stop_after = 0;
  c.resume = true;
  std::string msg;
  {
    const StopOnSignals signals;
    struct rlimit old{};
    getrlimit(RLIMIT_FSIZE, &old);
    struct rlimit lim = old;
    lim.rlim_cur = static_cast<rlim_t>(fs::file_size(prev + "/params.safetensors") / 2);
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    try {
      train(c);
    } catch (const Error& e) {
      msg = e.what();
    }
    setrlimit(RLIMIT_FSIZE, &old);
  }
  ASSERT_FALSE(msg.empty()) << "the checkpoint beyond the write limit must stop the run";
  EXPECT_TRUE(has(msg, cat("checkpoint of step 4: ", c.out_dir, "/checkpoints/step-00000004.tmp-"))) << msg;
  EXPECT_TRUE(has(msg, "params.safetensors.tmp.")) << msg;
  EXPECT_TRUE(has(msg, std::strerror(EFBIG))) << msg;
  EXPECT_TRUE(has(msg, cat("The previous checkpoint ", prev, " is intact"))) << msg;
  const int64_t need = needed_bytes(msg);
  EXPECT_GT(need, prev_size * 99 / 100) << msg;
  EXPECT_LT(need, prev_size * 101 / 100) << msg;
  expect_intact_at_step_2(c.out_dir, &prev_bytes);

  // a resume elsewhere (the run copied to a disk with room) finishes it, as if nothing had happened
  const std::string elsewhere = root + "/elsewhere";
  fs::copy(c.out_dir, elsewhere, fs::copy_options::recursive);
  TrainConfig e = c;
  e.out_dir = elsewhere;
  EXPECT_EQ(train(e).steps_done, 6);
  TrainConfig s = six_steps(root, c.data_dir);
  s.out_dir = root + "/straight";
  train(s);
  expect_same_run(s.out_dir, elsewhere, 6);
  fs::remove_all(root);
}

// A full disk on a real file system that fills up: a tmpfs of 1.5 checkpoints, mounted in a mount namespace of its own
// (`unshare -rm`; skipped where no namespace can be made — the write-limit test above covers the same path). First
// `--require-space` refuses to start (3 checkpoints will not fit); then a run without it warns, writes the checkpoint
// of step 2 and stops at step 4 with "No space left on device", the bytes needed and the previous checkpoint
// named; the run, copied out of the namespace, resumes elsewhere.
TEST(Interrupt, CheckpointOnAFullTmpfsStopsTheRunThePreviousOneIntact) {
  if (std::system("unshare -rm true > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no mount namespace here (unshare -rm): the RLIMIT_FSIZE test covers the full-disk path";
  const std::string root = tmpdir("tmpfs");
  TrainConfig c = six_steps(root, make_train_data(root, 12));
  c.stop_after = 2;
  train(c);  // a checkpoint's real size, to size the tmpfs
  const int64_t ckpt = tree_size(latest_checkpoint(c.out_dir));
  const std::string mnt = root + "/mnt", run = mnt + "/run";
  fs::create_directories(mnt);
  auto quoted = [](const std::vector<std::string>& a) {
    std::string s;
    for (const auto& x : a) s += " '" + x + "'";
    return s;
  };
  const std::string script =
      cat("mount -t tmpfs -o size=", (ckpt * 3 / 2) / 1024, "k tmpfs '", mnt, "' || exit 99; ",
          quoted(plus(train_cli(c, run), {"--require-space"})), " > '", root, "/require.log' 2>&1; echo $? > '", root,
          "/require.rc'; ", quoted(train_cli(c, run)), " > '", root, "/full.log' 2>&1; echo $? > '", root,
          "/full.rc'; cp -a '", run, "' '", root, "/copied'");
  const int rc = run_binary({"/usr/bin/env", "unshare", "-rm", "sh", "-c", script});
  if (rc == 99) GTEST_SKIP() << "tmpfs cannot be mounted in a namespace here";
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(read_file(root + "/require.rc"), "1\n");
  const std::string req = read_file(root + "/require.log");
  EXPECT_TRUE(has(req, "train --require-space: not enough free space for this run: it will hold up to 3 checkpoints "
                       "of about "))
      << req;
  EXPECT_TRUE(has(req, cat("free on the file system of ", run))) << req;
  EXPECT_EQ(read_file(root + "/full.rc"), "1\n");
  const std::string full = read_file(root + "/full.log");
  EXPECT_TRUE(has(full, "train: the run may run out of disk space")) << full;
  EXPECT_TRUE(has(full, cat("checkpoint of step 4: ", run, "/checkpoints/step-00000004.tmp-"))) << full;
  EXPECT_TRUE(has(full, std::strerror(ENOSPC))) << full;
  EXPECT_TRUE(has(full, cat("The previous checkpoint ", run, "/checkpoints/step-00000002 is intact"))) << full;
  const int64_t need = needed_bytes(full);
  EXPECT_GT(need, ckpt * 99 / 100) << full;
  EXPECT_LT(need, ckpt * 101 / 100) << full;
  const std::string copied = root + "/copied";
  expect_intact_at_step_2(copied);
  TrainConfig e = six_steps(root, c.data_dir);
  e.out_dir = copied;
  e.resume = true;
  EXPECT_EQ(train(e).steps_done, 6);
  fs::remove_all(root);
}

// The estimate behind the space check: the parameter count of a drafter config equals the built drafter's, one
// checkpoint's estimate is at least its real size and at most 300 KiB more, and the plan counts what
// --keep-checkpoints holds at the worst moment.
TEST(Interrupt, SpacePlanCountsTheCheckpointsKeptAndTheExport) {
  const std::string root = tmpdir("space");
  const std::string data = make_train_data(root, 8);
  for (const char* arch : {"dflash2", "dflash"}) {  // (DFlash2: the convolutions and the selector's codebooks too)
    TrainConfig c = six_steps(root, data);
    c.max_steps = 2;
    c.arch = arch;
    c.overwrite = true;
    train(c);
    DrafterConfig d = DrafterConfig::for_target(load_model_config(c.target_dir), 1, 4, {1, 2}, 511);
    d.arch = parse_draft_arch(arch, "--arch");
    const WeightStore ws = WeightStore::open(latest_checkpoint(c.out_dir) + "/params.safetensors");
    int64_t numel = 0, tensors = 0;
    for (const auto& n : ws.names()) numel += ws.view(n).numel();
    EXPECT_EQ(drafter_param_count(d, &tensors), numel) << arch;
    EXPECT_EQ(tensors, static_cast<int64_t>(ws.names().size())) << arch;
    const int64_t real = tree_size(latest_checkpoint(c.out_dir)), est = checkpoint_bytes_estimate(d);
    EXPECT_GE(est, real) << arch;
    EXPECT_LE(est, real + (300 << 10)) << arch;
  }
  TrainConfig c = six_steps(root, data);
  const DrafterConfig dc = DrafterConfig::for_target(load_model_config(c.target_dir), 1, 4, {1, 2}, 511);
  const int64_t est = checkpoint_bytes_estimate(dc);
  const std::string empty = root + "/empty";
  RunSpace s = plan_run_space(empty, dc, /*keep=*/2, /*every=*/2, /*start=*/0, /*total=*/6, /*export=*/true);
  EXPECT_EQ(s.checkpoint_bytes, est);
  EXPECT_EQ(s.held_at_peak, 3);  // 2 kept + the one being written
  EXPECT_EQ(s.export_bytes, 2 * drafter_param_count(dc) + (256 << 10));
  EXPECT_EQ(s.need, 3 * est);
  EXPECT_GT(s.free, 0);
  s = plan_run_space(empty, dc, 0, 2, 0, 6, true);  // all kept: 3 checkpoints and the export
  EXPECT_EQ(s.held_at_peak, 3);
  EXPECT_EQ(s.need, 3 * est + s.export_bytes);
  s = plan_run_space(empty, dc, 5, 4, 0, 6, false);  // steps 4 and 6
  EXPECT_EQ(s.held_at_peak, 2);
  EXPECT_EQ(s.need, 2 * est);
  s = plan_run_space(c.out_dir, dc, 2, 2, 2, 6, false);  // a resume at step 2: one is there already
  EXPECT_EQ(s.existing, 1);
  EXPECT_EQ(s.held_at_peak, 3);
  EXPECT_EQ(s.need, 2 * est);
  EXPECT_TRUE(has(s.describe("R", 2), "up to 3 checkpoints of about ")) << s.describe("R", 2);
  fs::remove_all(root);
}

// A resume onto another data set, tokenizer or template variable is refused, naming the field and both
// values; the same data read from another place resumes; another target is refused even with --allow-data-change;
// --allow-data-change continues on the new data and records it in the checkpoints and the export.
TEST(Interrupt, ResumeOntoOtherInputsIsRefusedNamingTheFieldUnlessAllowed) {
  const std::string root = tmpdir("inputs");
  // manifests as prepare writes them (the fields compared are whatever the manifest holds)
  auto meta = [](const std::string& tok, bool thinking, const std::string& input) {
    return json{{"created_by", "dflash prepare"},
                {"tokenizer", {{"path", "/models/t"}, {"sha256", tok}}},
                {"chat_template", {{"sha256", "c0ffee"}, {"origin", "tokenizer_config.json"}}},
                {"flags", {{"format", "auto"}, {"pairs", "chat"}, {"enable_thinking", thinking}}},
                {"inputs", json::array({{{"path", input}, {"sha256", "5eed"}}})}};
  };
  const std::string base = make_train_data(root, 12, 40, nullptr, "base", meta("aaaa", true, "/d/chat.jsonl"));
  TrainConfig c = tiny_train_config(root, base);
  c.max_steps = 4;
  c.stop_after = 2;
  train(c);
  c.stop_after = 0;
  c.resume = true;
  auto refusal = [&](const TrainConfig& x) -> std::string {
    try {
      train(x);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TrainConfig x = c;
  x.data_dir = make_train_data(root, 16, 40, nullptr, "other", meta("aaaa", true, "/d/chat.jsonl"));
  std::string msg = refusal(x);
  EXPECT_TRUE(has(msg, cat("train --resume: ", c.out_dir, "/checkpoints/step-00000002 was trained on other data than "
                           "this run's")))
      << msg;
  EXPECT_TRUE(has(msg, "data.counts.samples_written: 12 (checkpoint) vs 16 (this run)")) << msg;
  EXPECT_TRUE(has(msg, "pass --allow-data-change with --resume")) << msg;
  x.data_dir = make_train_data(root, 12, 40, nullptr, "tok", meta("bbbb", true, "/d/chat.jsonl"));
  msg = refusal(x);
  EXPECT_TRUE(has(msg, "(1 difference):\n  data.tokenizer.sha256: \"aaaa\" (checkpoint) vs \"bbbb\" (this run)\n"))
      << msg;
  const std::string nothink = make_train_data(root, 12, 40, nullptr, "nothink", meta("aaaa", false, "/d/chat.jsonl"));
  x.data_dir = nothink;
  msg = refusal(x);
  EXPECT_TRUE(has(msg, "(1 difference):\n  data.flags.enable_thinking: true (checkpoint) vs false (this run)\n")) << msg;
  EXPECT_EQ(read_metrics_jsonl(c.out_dir).size(), 2u);  // refused: nothing of the run changed

  // the same data set, its input read from another path and the directory elsewhere: the same inputs
  x.data_dir = make_train_data(root, 12, 40, nullptr, "moved", meta("aaaa", true, "/elsewhere/chat.jsonl"));
  x.stop_after = 3;
  EXPECT_EQ(train(x).steps_done, 3);

  // another target (its config.json differs) is refused even with --allow-data-change
  const std::string other_target = root + "/target";
  fs::create_directories(other_target);
  json cfg = json::parse(read_file(c.target_dir + "/config.json"));
  cfg["transformers_version"] = "other";
  std::ofstream(other_target + "/config.json") << cfg.dump(2);
  fs::create_symlink(c.target_dir + "/model.safetensors", other_target + "/model.safetensors");
  x = c;
  x.target_dir = other_target;
  x.allow_data_change = true;
  msg = refusal(x);
  EXPECT_TRUE(has(msg, "was trained on another target than this run's (1 difference):\n  target.config_sha256: \""))
      << msg;
  EXPECT_TRUE(has(msg, "--allow-data-change does not cover it")) << msg;

  // deliberately on the new data: continues, and the change is recorded in the checkpoints and the export
  x = c;
  x.data_dir = nothink;
  x.allow_data_change = true;
  x.export_at_end = true;
  const TrainSummary s = train(x);
  EXPECT_EQ(s.steps_done, 4);
  const json st = json::parse(read_file(latest_checkpoint(c.out_dir) + "/state.json"));
  const json& changes = st["config"]["data_changes"];
  ASSERT_EQ(changes.size(), 1u) << st.dump(2);
  EXPECT_EQ(changes[0]["step"], 3);
  EXPECT_EQ(changes[0]["differences"],
            json::array({"data.flags.enable_thinking: true (checkpoint) vs false (this run)"}));
  EXPECT_EQ(changes[0]["before"]["flags"]["enable_thinking"], true);
  EXPECT_EQ(st["inputs"]["data"]["flags"]["enable_thinking"], false);
  EXPECT_EQ(read_exported_drafter(s.export_dir).training["config"]["data_changes"], changes);
  fs::remove_all(root);
}

// json_differences: objects key by key, arrays element by element, absent keys, location keys skipped at any
// depth; a checkpoint without an "inputs" record is compared on config.data alone.
TEST(Interrupt, InputDifferencesAreFoundFieldByField) {
  const json a = {{"x", 1}, {"o", {{"k", "v"}, {"path", "/a"}}}, {"l", {1, 2}}, {"gone", true}};
  const json b = {{"x", 2}, {"o", {{"k", "v"}, {"path", "/b"}}}, {"l", {1, 3, 4}}, {"new", nullptr}};
  EXPECT_EQ(json_differences(a, b, "d", {"path"}),
            (std::vector<std::string>{"d.gone: true (checkpoint) vs (absent) (this run)",
                                      "d.l[1]: 2 (checkpoint) vs 3 (this run)",
                                      "d.l[2]: (absent) (checkpoint) vs 4 (this run)",
                                      "d.new: (absent) (checkpoint) vs null (this run)",
                                      "d.x: 1 (checkpoint) vs 2 (this run)"}));
  EXPECT_TRUE(json_differences(a, a, "d", {}).empty());
  const json old_state = {{"step", 5}, {"config", {{"data", {{"flags", {{"enable_thinking", true}}}}}}}};
  const json prov = {{"flags", {{"enable_thinking", false}}}};
  try {
    check_resume_inputs(old_state, json::object(), prov, false, "ck", 5);
    FAIL() << "another template variable must be refused";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "data.flags.enable_thinking: true (checkpoint) vs false (this run)")) << e.what();
  }
  const ResumeInputs r = check_resume_inputs(old_state, json::object(), prov, true, "ck", 5);
  ASSERT_EQ(r.data_changes.size(), 1u);
  EXPECT_EQ(r.data_changes[0]["step"], 5);
}

// The target's identity: the weight files the loader reads (the index's shards, not golden.safetensors beside a
// model.safetensors), each with its size and header hash; a changed weight byte inside a sampled block and a changed
// config.json are seen; a copy elsewhere has the same identity.
TEST(Interrupt, TargetIdentityFollowsTheLoadersFilesAndSeesChangedWeights) {
  const std::string golden = source_dir() + "/tests/golden";
  const json sharded = target_identity(golden + "/target_qwen3_moe_sharded", false, 0);
  ASSERT_EQ(sharded["weights"].size(), 2u) << sharded.dump(2);
  EXPECT_EQ(sharded["weights"][0]["file"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(sharded["weights"][1]["file"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(sharded["weights"][1]["bytes"], 514224);
  EXPECT_EQ(sharded["config_sha256"], sha256_hex(read_file(golden + "/target_qwen3_moe_sharded/config.json")));
  const json one = target_identity(golden + "/target_qwen3", false, 0);
  ASSERT_EQ(one["weights"].size(), 1u) << one.dump(2);
  EXPECT_EQ(one["weights"][0]["file"], "model.safetensors");
  EXPECT_EQ(target_identity(golden + "/target_qwen3", true, 7)["weights"], json({{"random_seed", 7}}));

  const std::string root = tmpdir("identity"), copy = root + "/copy";
  fs::copy(golden + "/target_qwen3", copy, fs::copy_options::recursive);
  EXPECT_EQ(target_identity(copy, false, 0), one);
  {  // one byte of the last weights (the last sampled block ends at the end of the file)
    std::fstream f(copy + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  const json changed = target_identity(copy, false, 0);
  EXPECT_EQ(changed["weights"][0]["header_sha256"], one["weights"][0]["header_sha256"]);
  EXPECT_NE(changed["weights"][0]["sample_sha256"], one["weights"][0]["sample_sha256"]);
  EXPECT_EQ(json_differences(one, changed, "target", {}),
            (std::vector<std::string>{cat("target.weights[0].sample_sha256: ", one["weights"][0]["sample_sha256"].dump(),
                                          " (checkpoint) vs ", changed["weights"][0]["sample_sha256"].dump(),
                                          " (this run)")}));
  fs::remove_all(root);
}

// The run lock in one process: the lock names its holder; a second acquire fails at once naming it; released, the
// directory can be taken again; a refused start puts the previous record back byte for byte.
TEST(Interrupt, RunLockNamesItsHolderAndIsReleased) {
  const std::string dir = tmpdir("lock") + "/run";
  {
    RunLock l = RunLock::acquire(dir, "dflash train");
    EXPECT_TRUE(l.held());
    const LockHolder h = read_lock_holder(dir);
    EXPECT_EQ(h.pid, getpid());
    EXPECT_EQ(h.host, host());
    try {
      RunLock::acquire(dir, "dflash demo");
      FAIL() << "a held directory must be refused";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(cat("dflash demo: ", dir, " is in use by another process (dflash train, "
                                                "pid ", getpid(), " on host ", host(), ", started ", h.started, ")"), 0),
                0u)
          << e.what();
    }
  }
  std::ofstream(dir + "/" + kRunLockFile) << "an earlier record\n";
  {
    RunLock l = RunLock::acquire(dir, "dflash train");
    EXPECT_EQ(read_lock_holder(dir).pid, getpid());
    l.restore_and_release();
  }
  EXPECT_EQ(read_file(dir + "/" + kRunLockFile), "an earlier record\n");
  RunLock again = RunLock::acquire(dir, "dflash train");
  EXPECT_TRUE(again.held());
  fs::remove_all(fs::path(dir).parent_path());
}

// `dflash demo` interrupted by SIGINT during training writes a checkpoint and exits 130; --resume continues
// it from there (the time budget goes on with what is left) and finishes with the summary and the export.
TEST(Interrupt, DemoStopsOnSigintAndResumes) {
  const std::string root = tmpdir("demo");
  const std::string out = root + "/demo";
  const std::vector<std::string> args = {DFLASH_BINARY, "demo", "--out", out, "--assets",
                                         source_dir() + "/assets/demo", "--budget", "3", "--eval-samples", "2",
                                         "--generated-samples", "1", "--threads", "1"};
  pid_t pid = 0;
  run_binary(args, &pid, root + "/first.log");
  for (int i = 0; i < 1200 && read_metrics_jsonl(out + "/run").empty(); ++i) usleep(50000);
  ASSERT_FALSE(read_metrics_jsonl(out + "/run").empty()) << read_file(root + "/first.log");
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string first = read_file(root + "/first.log");
  ASSERT_TRUE(WIFEXITED(status)) << first;
  EXPECT_EQ(WEXITSTATUS(status), 130) << first;
  EXPECT_TRUE(has(first, "demo: interrupted during training (checkpoint ")) << first;
  const std::string ck = latest_checkpoint(out + "/run");
  ASSERT_FALSE(ck.empty());
  const int64_t at = json::parse(read_file(ck + "/state.json"))["step"].get<int64_t>();
  EXPECT_EQ(read_metrics_jsonl(out + "/run").size(), static_cast<size_t>(at));
  EXPECT_FALSE(file_exists(out + "/summary.json"));

  ASSERT_EQ(run_binary(plus(args, {"--resume"}), nullptr, root + "/second.log"), 0) << read_file(root + "/second.log");
  const std::string second = read_file(root + "/second.log");
  EXPECT_TRUE(has(second, cat("resumed from ", ck, " at step ", at))) << second;
  const json summary = json::parse(read_file(out + "/summary.json"));
  EXPECT_GE(summary["train"]["steps"].get<int64_t>(), at);
  EXPECT_TRUE(file_exists(out + "/run/export/model.safetensors"));
  fs::remove_all(root);
}
