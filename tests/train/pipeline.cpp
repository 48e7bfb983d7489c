// tests/train/pipeline.cpp
// The training system (target workers and drafter workers): the step plan, D drafters = 1 drafter on the same
// global batch, bit-identical repeats, faults (a worker that throws, a drafter with no anchors, SIGTERM mid-run),
// resume with the same and with another topology, 2 processes under mpirun = 2 drafters in one process, nothing
// lazily initialised after the warm-up (case C01), time budgets, runs that cannot learn, `dflash plot`; the
// sharded optimizer (ZeRO-1): its layout, the host reduce-scatter / all-gather, sharded = replicated, resume.
// Threads.* also run under ThreadSanitizer (scripts/test.sh).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <atomic>
#include <thread>

#include "backend/collective.h"  // HostGroup
#include "core/fs.h"
#include "core/job_control.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/step_plan.h"
#include "common/train_fixtures.h"

using namespace dflash;
using namespace dflash::test;
namespace fs = std::filesystem;

namespace {

// Every tensor of the latest checkpoint's `file` (params or optim), by name.
std::map<std::string, std::vector<double>> checkpoint_tensors(const std::string& out_dir, const char* file) {
  auto ws = WeightStore::open(latest_checkpoint(out_dir) + "/" + file + ".safetensors");
  std::map<std::string, std::vector<double>> m;
  for (const auto& n : ws.names()) {
    auto f = to_f32_vector(ws.view(n));
    m[n].assign(f.begin(), f.end());
  }
  return m;
}
std::vector<double> concat(const std::map<std::string, std::vector<double>>& m, const char* prefix = "") {
  std::vector<double> v;
  for (const auto& [n, x] : m)
    if (n.rfind(prefix, 0) == 0) v.insert(v.end(), x.begin(), x.end());
  return v;
}

std::vector<std::string> train_args(const TrainConfig& c) {
  std::vector<std::string> a = {DFLASH_BINARY, "train", "--target", c.target_dir, "--data", c.data_dir, "--out",
                                c.out_dir, "--num-layers", "1", "--block-size", "4", "--target-layer-ids", "1,2",
                                "--mask-token-id", "511", "--max-anchors", "8", "--batch-size",
                                std::to_string(c.batch_size), "--lr", "0.003", "--seed", "3", "--threads", "1",
                                "--quiet", "--no-export"};
  return a;
}

}  // namespace

// The plan: the global batch, its anchors and sum_w do not depend on the number of drafters; the split is
// balanced by tokens x anchors and every sequence goes to exactly one drafter.
TEST(StepPlan, GlobalBatchIsIndependentOfTheDrafterCount) {
  const std::string root = train_tmpdir("plan");
  const std::string data = make_train_data(root, 30, 40, [](int s, int p) { return p >= 3 + (s % 7) * 4; });
  Dataset ds = Dataset::open(data);
  PlanConfig pc{.batch_size = 7, .max_anchors = 5, .block_size = 4, .mask_token_id = 511, .gamma = 4, .seed = 9};
  StepPlanner one(ds, pc);
  pc.drafters = 3;
  StepPlanner three(ds, pc);
  for (int64_t step : {0, 4, 9}) {
    StepPlan a = one.plan(step), b = three.plan(step);
    ASSERT_EQ(a.seqs.size(), b.seqs.size());
    EXPECT_EQ(a.sum_w, b.sum_w);
    EXPECT_GT(a.sum_w, 0);
    for (size_t i = 0; i < a.seqs.size(); ++i) {
      EXPECT_EQ(a.seqs[i].sample, b.seqs[i].sample);
      EXPECT_EQ(a.seqs[i].batch.anchors, b.seqs[i].batch.anchors);
    }
    // every sequence on one drafter; loads within the largest single sequence of each other (LPT)
    std::vector<int> seen(b.seqs.size(), 0);
    std::vector<int64_t> load(3, 0);
    int64_t biggest = 0;
    for (int d = 0; d < 3; ++d)
      for (int i : b.by_drafter[d]) {
        ++seen[i];
        load[d] += b.seqs[i].work();
        biggest = std::max(biggest, b.seqs[i].work());
      }
    for (int c : seen) EXPECT_EQ(c, 1);
    EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), biggest);
  }
  fs::remove_all(root);
}

// 2 target + 2 drafter workers give the loss and parameters of 1 + 1 on the same global batch (up to the order of
// floating-point sums), and the same topology repeated gives identical bits.
TEST(Pipeline, TwoPlusTwoMatchesOneWorkerAndRepeatsBitForBit) {
  const std::string root = train_tmpdir("pipe22");
  const std::string data = make_train_data(root);
  TrainConfig one = tiny_train_config(root, data);
  one.loss = "decay";  // the paper's objective here; D-PACE (the default) in DPaceTwoPlusTwoMatchesOneWorker
  one.max_steps = 20;
  one.out_dir = root + "/one";
  TrainSummary s1 = train(one);
  EXPECT_EQ(s1.steps_done, 20);
  EXPECT_EQ(s1.targets, 1);
  EXPECT_EQ(s1.drafters, 1);
  const auto [m1, m2] = expect_two_plus_two_as_one(one, root + "/two");  // into root/two
  TrainConfig again = one;
  again.targets = again.drafters = "2";
  again.out_dir = root + "/again";
  train(again);
  auto m3 = read_metrics_jsonl(again.out_dir);
  ASSERT_EQ(m2.size(), 20u);
  ASSERT_EQ(m3.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(m2[i]["loss"], m3[i]["loss"]) << "step " << i + 1;
    EXPECT_EQ(m2[i]["grad_norm"], m3[i]["grad_norm"]) << "step " << i + 1;
    EXPECT_EQ(m1[i]["target_tokens"], m2[i]["target_tokens"]);
    EXPECT_TRUE(m2[i]["workers"].contains("drafter 1 (cpu)"));
  }
  EXPECT_EQ(final_params(root + "/two"), final_params(again.out_dir));
  fs::remove_all(root);
}

// D-PACE's normaliser is the global batch's number of supervised slots: planned on the host like the decay's sum of
// w, the same for any drafter count, though its weights exist only after each drafter's forward.
TEST(StepPlan, DPaceNormaliserCountsTheSupervisedSlots) {
  const std::string root = train_tmpdir("plan_dpace");
  const std::string data = make_train_data(root, 30, 40, [](int s, int p) { return p >= 3 + (s % 7) * 4; });
  Dataset ds = Dataset::open(data);
  PlanConfig pc{.batch_size = 7, .max_anchors = 5, .block_size = 4, .mask_token_id = 511, .gamma = 4,
                .dpace_alpha = 0.5, .seed = 9};
  StepPlanner one(ds, pc);
  pc.drafters = 3;
  StepPlanner three(ds, pc);
  pc.dpace_alpha = 0;
  StepPlanner decay(ds, pc);
  for (int64_t step : {0, 4, 9}) {
    StepPlan a = one.plan(step), b = three.plan(step), c = decay.plan(step);
    double slots = 0;
    for (const SeqPlan& s : a.seqs) {
      slots += static_cast<double>(s.batch.rows.size());
      EXPECT_EQ(s.batch.dpace_alpha, 0.5);
      for (float w : s.batch.weights) EXPECT_EQ(w, 1.0f);
    }
    EXPECT_GT(slots, 0);
    EXPECT_EQ(a.sum_w, slots);
    EXPECT_EQ(b.sum_w, slots);
    EXPECT_LT(c.sum_w, slots);  // the decay's sum of w: the same rows, weights below 1 after slot 1
    ASSERT_EQ(a.seqs.size(), c.seqs.size());
    for (size_t i = 0; i < a.seqs.size(); ++i) EXPECT_EQ(a.seqs[i].batch.rows, c.seqs[i].batch.rows);
  }
  fs::remove_all(root);
}

// --loss dpace with the KL term: 2 + 2 workers give the loss and parameters of 1 + 1 on the same global batch (each
// drafter weights its own blocks after its forward; the normaliser is global and planned), and the run records
// its objective.
TEST(Pipeline, DPaceTwoPlusTwoMatchesOneWorker) {
  const std::string root = train_tmpdir("pipedpace");
  const std::string data = make_train_data(root);
  TrainConfig one = tiny_train_config(root, data);
  one.loss = "dpace";
  one.kl_weight = 0.15;
  one.max_steps = 20;
  one.out_dir = root + "/one";
  train(one);
  const auto m1 = expect_two_plus_two_as_one(one, root + "/two").first;
  TrainConfig decay = one;
  decay.loss = "decay";
  decay.out_dir = root + "/decay";
  train(decay);
  const auto md = read_metrics_jsonl(decay.out_dir);
  ASSERT_EQ(m1.size(), 20u);
  for (const auto& row : m1) EXPECT_GT(row["kl"].get<double>(), 0) << "step " << row["step"];
  EXPECT_NE(m1[0]["loss"], md[0]["loss"]) << "--loss dpace must change the loss";
  const nlohmann::json st = nlohmann::json::parse(read_file(latest_checkpoint(one.out_dir) + "/state.json"));
  EXPECT_EQ(st["config"]["loss"], "dpace");
  EXPECT_EQ(st["config"]["dpace_alpha"], 0.5);
  fs::remove_all(root);
}

// Eight workers (4 + 4) for 50 steps: run under ThreadSanitizer by scripts/test.sh; nothing is initialised lazily
// once the worker threads run (case C01).
TEST(Threads, Pipeline4Plus4RunsCleanCaseC01) {
  const std::string root = train_tmpdir("pipe44");
  TrainConfig c = tiny_train_config(root, make_train_data(root, 16, 24));
  c.targets = "4";
  c.drafters = "4";
  c.batch_size = 6;
  c.max_steps = 50;
  c.queue_depth = 1;
  TrainSummary s = train(c);
  EXPECT_EQ(s.steps_done, 50);
  EXPECT_EQ(s.lazy_inits_after_warmup, 0);
  EXPECT_EQ(read_metrics_jsonl(c.out_dir).size(), 50u);
  fs::remove_all(root);
}

// A worker that throws stops the whole job with its own message, after a checkpoint of the last completed step
// (with the optimizer state sharded, put together from the shards; and replicated).
TEST(Pipeline, AWorkerThatThrowsStopsTheJobAfterACheckpoint) {
  const std::string root = train_tmpdir("pipefault");
  const std::string data = make_train_data(root);
  for (const bool shard : {true, false}) {
    for (const char* spec : {"drafter:1:4", "target:1:4"}) {
      SCOPED_TRACE(shard ? "sharded optimizer" : "replicated optimizer");
      TrainConfig c = tiny_train_config(root, data);
      c.targets = "2";
      c.drafters = "2";
      c.max_steps = 30;
      c.shard_optimizer = shard;
      c.out_dir = root + "/" + std::string(spec).substr(0, 6) + (shard ? "_sharded" : "");
      c.inject_fault = spec;
      try {
        train(c);
        FAIL() << spec << ": the job must fail";
      } catch (const Error& e) {
        const std::string m = e.what(), kind = std::string(spec).substr(0, std::string(spec).find(':'));
        EXPECT_NE(m.find(kind + " 1 (cpu) failed: injected fault"), std::string::npos) << m;
        EXPECT_NE(m.find("--resume"), std::string::npos) << m;
      }
      const std::string ck = latest_checkpoint(c.out_dir);
      ASSERT_FALSE(ck.empty()) << spec;
      const auto st = nlohmann::json::parse(read_file(ck + "/state.json"));
      if (spec[0] == 'd') EXPECT_EQ(st["step"], 4) << spec;  // drafter 1 never started step 5
      else EXPECT_LE(st["step"].get<int>(), 4) << spec;       // the target failed on a packet of step 5
      EXPECT_EQ(read_metrics_jsonl(c.out_dir).size(), st["step"].get<size_t>()) << spec;
      // and the run continues from there
      c.inject_fault.clear();
      c.resume = true;
      TrainSummary s = train(c);
      EXPECT_EQ(s.steps_done, 30);
    }
  }
  fs::remove_all(root);
}

// A drafter whose share of a step is empty still joins every collective; steps without any supervised pair run
// the same control path (metrics row, checkpoint, stop-after) without an optimizer update, and AdamW's step count
// counts only real updates: the first real update moves every fc weight by lr (bias-corrected step 1).
TEST(Pipeline, EmptyDraftersAndEmptyStepsJoinEveryCollective) {
  const std::string root = train_tmpdir("pipeempty");
  // 4 rows of 40 ids: rows 0 and 2 supervised from token 5, rows 1 and 3 only from token 32 (beyond --max-length)
  const std::string data = make_train_data(root, 4, 40, [](int s, int p) { return p >= (s % 2 ? 32 : 5); });
  TrainConfig c = tiny_train_config(root, data);
  c.max_length = 20;
  c.batch_size = 1;
  {  // a seed whose first step is empty, so that the first real update comes after an empty step
    Dataset ds = Dataset::open(data);
    for (c.seed = 0;; ++c.seed) {
      StepPlanner p(ds, PlanConfig{.batch_size = 1, .max_anchors = 8, .max_length = 20, .block_size = 4,
                                   .mask_token_id = 511, .gamma = 4, .seed = c.seed});
      if (p.plan(0).empty()) break;
    }
  }
  c.checkpoint_every = 1;
  c.keep_checkpoints = 100;
  c.max_steps = 8;
  c.targets = "2";
  c.drafters = "2";
  TrainSummary s = train(c);
  EXPECT_EQ(s.steps_done, 8);
  auto m = read_metrics_jsonl(c.out_dir);
  ASSERT_EQ(m.size(), 8u);
  int64_t updates = 0, first_real = -1;
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_TRUE(file_exists(cat(c.out_dir, "/checkpoints/step-", std::string(8 - std::to_string(i + 1).size(), '0'),
                                i + 1, "/state.json")))
        << "step " << i + 1 << " must checkpoint, empty or not";
    if (!m[i]["loss"].is_null()) {
      ++updates;
      if (first_real < 0) first_real = static_cast<int64_t>(i);
    }
    EXPECT_EQ(m[i]["updates"], updates) << "step " << i + 1;
  }
  EXPECT_EQ(s.updates, updates);
  ASSERT_GT(first_real, 0) << "the seeded order must start with an empty step for this test to mean something";
  ASSERT_LT(updates, 8);
  // fc.weight before and after the first real update
  auto at = [&](int64_t step) {
    auto ws = WeightStore::open(cat(c.out_dir, "/checkpoints/step-", std::string(8 - std::to_string(step).size(), '0'),
                                    step, "/params.safetensors"));
    return to_f32_vector(ws.view("fc.weight"));
  };
  const auto before = at(first_real), after = at(first_real + 1);
  const double lr = m[static_cast<size_t>(first_real)]["lr"].get<double>();
  std::vector<double> moved;
  for (size_t i = 0; i < before.size(); ++i)
    if (after[i] != before[i]) moved.push_back(std::fabs(after[i] - before[i]));
  ASSERT_GT(moved.size(), before.size() / 2);
  std::sort(moved.begin(), moved.end());
  EXPECT_NEAR(moved[moved.size() / 2] / lr, 1.0, 1e-3) << "bias correction of AdamW step 1";
  // --stop-after counts every step, empty or not
  TrainConfig st = c;
  st.out_dir = root + "/stop";
  st.stop_after = 1;
  TrainSummary s1 = train(st);
  EXPECT_EQ(s1.steps_done, 1);
  EXPECT_TRUE(s1.interrupted);
  fs::remove_all(root);
}

// A data set that cannot teach anything fails before the first step, and nothing is exported.
TEST(Pipeline, ARunThatCannotLearnFailsBeforeTheFirstStep) {
  const std::string root = train_tmpdir("pipenone");
  const std::string late = make_train_data(root, 2, 16, [](int, int p) { return p >= 11; }, "late");
  const std::string none = make_train_data(root, 3, 16, [](int, int) { return false; }, "none");
  for (const auto& [data, max_len] : std::vector<std::pair<std::string, int64_t>>{{late, 8}, {none, 0}}) {
    TrainConfig c = tiny_train_config(root, data);
    c.max_length = max_len;
    c.max_steps = 3;
    c.export_at_end = true;
    c.out_dir = data + "_run";
    try {
      train(c);
      FAIL() << data;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("learn nothing"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(c.out_dir + "/export"));
    EXPECT_TRUE(latest_checkpoint(c.out_dir).empty());
  }
  fs::remove_all(root);
}

// Resume with another number of drafters continues the same data order and anchors: the loss curve continues
// that of the uninterrupted run (equal up to floating-point summation order).
TEST(Pipeline, ResumeWithAnotherDrafterCountContinuesTheSameRun) {
  const std::string root = train_tmpdir("piperesume");
  const std::string data = make_train_data(root);
  TrainConfig a = tiny_train_config(root, data);
  a.max_steps = 16;
  a.targets = a.drafters = "2";
  a.out_dir = root + "/straight";
  train(a);
  TrainConfig b = a;
  b.out_dir = root + "/split";
  b.stop_after = 8;
  train(b);
  b.stop_after = 0;
  b.resume = true;
  b.targets = b.drafters = "1";
  TrainSummary s = train(b);
  EXPECT_EQ(s.steps_done, 16);
  auto ma = read_metrics_jsonl(a.out_dir), mb = read_metrics_jsonl(b.out_dir);
  ASSERT_EQ(mb.size(), 16u);
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(ma[i]["target_tokens"], mb[i]["target_tokens"]) << "same batch at step " << i + 1;
    const double la = ma[i]["loss"].get<double>(), lb = mb[i]["loss"].get<double>();
    EXPECT_LE(std::fabs(la - lb), 1e-5 * std::fabs(la)) << "step " << i + 1;
  }
  EXPECT_LE(rel_err(final_params(b.out_dir), final_params(a.out_dir)), 1e-5);
  fs::remove_all(root);
}

// SIGTERM in the middle of a 2 + 2 run: every drafter stops after the same step, a checkpoint of that step is
// written, exit status 130; --resume then ends exactly where the uninterrupted run ends (same topology: bit for bit).
TEST(Pipeline, SigtermMidRunCheckpointsAndResumesBitForBit) {
  const std::string root = train_tmpdir("pipesigterm");
  const std::string data = make_train_data(root);
  TrainConfig c = tiny_train_config(root, data);
  c.out_dir = root + "/run";
  auto args = train_args(c);
  for (const char* a : {"--targets", "2", "--drafters", "2", "--max-steps", "400"}) args.push_back(a);
  pid_t pid = 0;
  run_binary(args, &pid);
  for (int i = 0; i < 600; ++i) {
    usleep(50000);
    if (read_metrics_jsonl(c.out_dir).size() >= 3) break;
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::string ck = latest_checkpoint(c.out_dir);
  ASSERT_FALSE(ck.empty());
  const auto st = nlohmann::json::parse(read_file(ck + "/state.json"));
  const int64_t at = st["step"].get<int64_t>();
  EXPECT_GE(at, 3);
  EXPECT_LT(at, 400);
  EXPECT_EQ(read_metrics_jsonl(c.out_dir).size(), static_cast<size_t>(at));
  // finish it, and compare with the same steps run straight
  auto resume = args;
  resume.push_back("--resume");
  EXPECT_EQ(run_binary(resume), 0);
  TrainConfig straight = c;
  straight.out_dir = root + "/straight";
  auto sargs = train_args(straight);
  for (const char* a : {"--targets", "2", "--drafters", "2", "--max-steps", "400"}) sargs.push_back(a);
  EXPECT_EQ(run_binary(sargs), 0);
  EXPECT_EQ(final_params(c.out_dir), final_params(straight.out_dir));
  fs::remove_all(root);
}

// The shard split is a pure function of (flat elements, shards): equal shards, multiples of 64 elements, covering
// the flat space with less than 64 elements of padding per shard.
TEST(ZeroShard, LayoutIsAPureFunctionOfSizeAndCount) {
  for (int64_t n : {int64_t{1}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{1000}, int64_t{123457}})
    for (int d : {1, 2, 3, 7}) {
      const ShardLayout l = shard_layout(n, d);
      EXPECT_EQ(l.shards, d);
      EXPECT_EQ(l.shard % 64, 0) << n << " / " << d;
      EXPECT_GE(l.padded(), n) << n << " / " << d;
      EXPECT_LT(l.padded() - n, 64 * d) << n << " / " << d;
      EXPECT_EQ(l.shard, shard_layout(n, d).shard);
    }
  EXPECT_EQ(shard_layout(1000, 3).shard, 384);  // ceil(1000 / 3) = 334, rounded up to 64
  EXPECT_EQ(shard_layout(1000, 3).begin(2), 768);
}

// The host reduce-scatter leaves in each rank's own shard exactly what the all-reduce gives there (summed in rank
// order in double) and the rest untouched; the all-gather hands every rank every owner's shard. 3 threads.
// HostGroup::barrier (the NCCL launch rule, backend/collective.h): nobody leaves before everybody arrived, it can be
// used between collectives of the same group, and a rank that never comes is named after the timeout.
TEST(Threads, HostBarrierHoldsEveryRankUntilAllArrive) {
  constexpr int R = 3;
  JobControl control;
  HostGroup g({"r0", "r1", "r2"}, control, 60);
  std::atomic<int> arrived{0};
  std::vector<int> seen(R, -1);
  std::vector<double> sums(R);
  std::vector<std::thread> th;
  for (int r = 0; r < R; ++r)
    th.emplace_back([&, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30 * r));  // rank 2 comes last
      arrived.fetch_add(1);
      g.barrier(r);
      seen[static_cast<size_t>(r)] = arrived.load();
      std::vector<double> x = {static_cast<double>(r + 1)};
      g.all_reduce(r, std::span<double>(x));
      sums[static_cast<size_t>(r)] = x[0];
      g.barrier(r);
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(seen[static_cast<size_t>(r)], R) << "rank " << r << " left the barrier early";
    EXPECT_EQ(sums[static_cast<size_t>(r)], 6.0);
  }
  JobControl c2;
  HostGroup lonely({"drafter 0", "drafter 1"}, c2, 0.2);
  try {
    lonely.barrier(0);
    ADD_FAILURE() << "a barrier with a missing rank returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("barrier #1: drafter 0 waited 0 s (--collective-timeout) for drafter 1"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(c2.failed());
}

TEST(Threads, HostReduceScatterAndAllGatherMatchAllReduce) {
  constexpr int R = 3;
  constexpr size_t S = 5, N = S * R;
  JobControl control;
  HostGroup g({"r0", "r1", "r2"}, control, 60);
  ASSERT_EQ(g.world(), R);
  auto input = [](int r) {
    std::vector<float> x(N);
    for (size_t i = 0; i < N; ++i) x[i] = 0.1f * static_cast<float>(i + 1) / static_cast<float>(r + 3) + (r == 1 ? 1e7f : 0.f);
    return x;
  };
  std::vector<std::vector<float>> ar(R), rs(R), ag(R);
  std::vector<std::vector<double>> agd(R);
  std::vector<std::thread> th;
  for (int r = 0; r < R; ++r)
    th.emplace_back([&, r] {
      ar[r] = input(r);
      g.all_reduce(r, std::span<float>(ar[r]));
      rs[r] = input(r);
      g.reduce_scatter(r, std::span<float>(rs[r]), S);
      ag[r].assign(N, -1.f);
      agd[r].assign(N, -1.0);
      for (size_t i = 0; i < S; ++i) {
        ag[r][r * S + i] = static_cast<float>(100 * r + i);
        agd[r][r * S + i] = 100.0 * r + static_cast<double>(i) + 0.5;
      }
      g.all_gather(r, std::span<float>(ag[r]), S);
      g.all_gather(r, std::span<double>(agd[r]), S);
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < R; ++r) {
    const auto in = input(r);
    for (size_t i = 0; i < N; ++i) {
      const bool own = i / S == static_cast<size_t>(r);
      EXPECT_EQ(rs[r][i], own ? ar[0][i] : in[i]) << "rank " << r << " element " << i;
      EXPECT_EQ(ag[r][i], static_cast<float>(100 * (i / S) + i % S)) << "rank " << r << " element " << i;
      EXPECT_EQ(agd[r][i], 100.0 * static_cast<double>(i / S) + static_cast<double>(i % S) + 0.5);
    }
  }
}

// The sharded optimizer (ZeRO-1) gives the replicated optimizer's run on the same data: 3 drafters (shard
// boundaries inside parameters, a padded last shard) and an odd MLP width (gaps in the flat layout). Loss, grad
// norm, final weights and the saved moments agree to 1e-6 (only the grad norm's summation order differs), the
// checkpoints have the same tensors, and the sharded run repeats bit for bit.
TEST(Pipeline, ShardedOptimizerMatchesReplicated) {
  const std::string root = train_tmpdir("pipezero");
  const std::string data = make_train_data(root);
  TrainConfig rep = tiny_train_config(root, data);
  rep.intermediate_size = 37;
  rep.max_steps = 12;
  rep.batch_size = 6;
  rep.drafters = "3";
  rep.shard_optimizer = false;
  rep.out_dir = root + "/replicated";
  train(rep);
  TrainConfig sh = rep;
  sh.shard_optimizer = true;
  sh.out_dir = root + "/sharded";
  TrainSummary s = train(sh);
  EXPECT_EQ(s.steps_done, 12);
  EXPECT_EQ(s.lazy_inits_after_warmup, 0);
  TrainConfig again = sh;
  again.out_dir = root + "/again";
  train(again);
  auto mr = read_metrics_jsonl(rep.out_dir), ms = read_metrics_jsonl(sh.out_dir), ma = read_metrics_jsonl(again.out_dir);
  ASSERT_EQ(mr.size(), 12u);
  ASSERT_EQ(ms.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    const double lr = mr[i]["loss"].get<double>(), ls = ms[i]["loss"].get<double>();
    EXPECT_LE(std::fabs(lr - ls), 1e-6 * std::fabs(lr)) << "step " << i + 1;
    const double gr = mr[i]["grad_norm"].get<double>(), gs = ms[i]["grad_norm"].get<double>();
    EXPECT_LE(std::fabs(gr - gs), 1e-6 * std::fabs(gr)) << "step " << i + 1;
    EXPECT_EQ(ms[i]["loss"], ma[i]["loss"]) << "step " << i + 1;
  }
  const auto pr = checkpoint_tensors(rep.out_dir, "params"), ps = checkpoint_tensors(sh.out_dir, "params");
  const auto orp = checkpoint_tensors(rep.out_dir, "optim"), os = checkpoint_tensors(sh.out_dir, "optim");
  ASSERT_EQ(pr.size(), ps.size());
  ASSERT_EQ(orp.size(), os.size());
  for (const auto& [n, x] : orp) ASSERT_TRUE(os.count(n) && os.at(n).size() == x.size()) << n;
  EXPECT_LE(rel_err(concat(ps), concat(pr)), 1e-6);
  EXPECT_LE(rel_err(concat(os, "m."), concat(orp, "m.")), 1e-6);
  EXPECT_LE(rel_err(concat(os, "v."), concat(orp, "v.")), 1e-6);
  EXPECT_GT(concat(os, "v.")[0], 0.0) << "the moments must have been gathered, not left zero";
  EXPECT_EQ(concat(ps), concat(checkpoint_tensors(again.out_dir, "params")));
  EXPECT_EQ(os, checkpoint_tensors(again.out_dir, "optim"));
  fs::remove_all(root);
}

// A sharded run stopped and resumed ends exactly where the straight sharded run ends (same topology: bit for bit,
// weights and moments); one continued across optimizer layouts and drafter counts (2 replicated -> 3 sharded ->
// 2 sharded, each checkpoint re-split on load) continues the same run up to summation order.
TEST(Pipeline, ShardedResumeEndsAsTheStraightRun) {
  const std::string root = train_tmpdir("pipezeroresume");
  const std::string data = make_train_data(root);
  TrainConfig a = tiny_train_config(root, data);
  a.intermediate_size = 37;
  a.max_steps = 12;
  a.drafters = "2";
  a.out_dir = root + "/straight";
  train(a);
  TrainConfig b = a;
  b.out_dir = root + "/stopped";
  b.stop_after = 5;
  train(b);
  b.stop_after = 0;
  b.resume = true;
  EXPECT_EQ(train(b).steps_done, 12);
  EXPECT_EQ(checkpoint_tensors(b.out_dir, "params"), checkpoint_tensors(a.out_dir, "params"));
  EXPECT_EQ(checkpoint_tensors(b.out_dir, "optim"), checkpoint_tensors(a.out_dir, "optim"));
  TrainConfig c = a;
  c.out_dir = root + "/mixed";
  c.shard_optimizer = false;
  c.stop_after = 4;
  train(c);
  c.resume = true;
  c.shard_optimizer = true;
  c.drafters = "3";
  c.stop_after = 8;
  train(c);
  c.drafters = "2";
  c.stop_after = 0;
  EXPECT_EQ(train(c).steps_done, 12);
  auto ma = read_metrics_jsonl(a.out_dir), mc = read_metrics_jsonl(c.out_dir);
  ASSERT_EQ(mc.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    const double la = ma[i]["loss"].get<double>(), lc = mc[i]["loss"].get<double>();
    EXPECT_LE(std::fabs(la - lc), 1e-5 * std::fabs(la)) << "step " << i + 1;
  }
  EXPECT_LE(rel_err(concat(checkpoint_tensors(c.out_dir, "params")), concat(checkpoint_tensors(a.out_dir, "params"))),
            1e-5);
  EXPECT_LE(rel_err(concat(checkpoint_tensors(c.out_dir, "optim")), concat(checkpoint_tensors(a.out_dir, "optim"))),
            1e-5);
  fs::remove_all(root);
}

#ifdef DFLASH_MPIEXEC
// Two processes under mpirun, one target + one drafter each, train exactly as one process with 2 + 2.
TEST(Pipeline, TwoMpiProcessesMatchTheInProcessRun) {
  const std::string root = train_tmpdir("pipempi");
  const std::string data = make_train_data(root);
  TrainConfig c = tiny_train_config(root, data);
  c.max_steps = 12;
  c.out_dir = root + "/inproc";
  c.targets = c.drafters = "2";
  train(c);
  TrainConfig m = c;
  m.out_dir = root + "/mpi";
  std::vector<std::string> args = {DFLASH_MPIEXEC, "-n", "2", "--oversubscribe", "--allow-run-as-root",
                                   "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"};
  for (const auto& a : train_args(m)) args.push_back(a);
  for (const char* a : {"--targets", "1", "--drafters", "1", "--max-steps", "12"}) args.push_back(a);
  ASSERT_EQ(run_binary(args), 0) << "mpirun failed";
  auto mi = read_metrics_jsonl(c.out_dir), mm = read_metrics_jsonl(m.out_dir);
  ASSERT_EQ(mm.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    const double a = mi[i]["loss"].get<double>(), b = mm[i]["loss"].get<double>();
    EXPECT_LE(std::fabs(a - b), 1e-6 * std::fabs(a)) << "step " << i + 1;
  }
  EXPECT_LE(rel_err(final_params(m.out_dir), final_params(c.out_dir)), 1e-6);
  // a fault in process 1 stops both processes with its message, process 0 writes the checkpoint
  TrainConfig f = c;
  f.out_dir = root + "/mpifault";
  std::vector<std::string> fargs(args.begin(), args.begin() + 11);
  for (const auto& a : train_args(f)) fargs.push_back(a);
  for (const char* a : {"--targets", "1", "--drafters", "1", "--max-steps", "12", "--inject-fault", "drafter:0:5",
                        "--collective-timeout", "60"})
    fargs.push_back(a);
  // both processes get the fault spec; each process's drafter 0 throws at step 5, so both fail the same way.
  // Replicated optimizer state: process 0 checkpoints the last completed step.
  std::vector<std::string> rargs = fargs;
  rargs.push_back("--no-shard-optimizer");
  EXPECT_NE(run_binary(rargs), 0);
  const std::string ck = latest_checkpoint(f.out_dir);
  ASSERT_FALSE(ck.empty());
  EXPECT_EQ(nlohmann::json::parse(read_file(ck + "/state.json"))["step"], 5);
  // Sharded across the processes (the default): process 1's shard is out of reach, the last periodic checkpoint
  // (step 4 of every 2) is the one to resume from
  TrainConfig g = c;
  g.out_dir = root + "/mpifault_sharded";
  std::vector<std::string> sargs(args.begin(), args.begin() + 11);
  for (const auto& a : train_args(g)) sargs.push_back(a);
  for (const char* a : {"--targets", "1", "--drafters", "1", "--max-steps", "12", "--inject-fault", "drafter:0:5",
                        "--collective-timeout", "60", "--checkpoint-every", "2"})
    sargs.push_back(a);
  EXPECT_NE(run_binary(sargs), 0);
  const std::string ck2 = latest_checkpoint(g.out_dir);
  ASSERT_FALSE(ck2.empty());
  EXPECT_EQ(nlohmann::json::parse(read_file(ck2 + "/state.json"))["step"], 4);
  fs::remove_all(root);
}
#endif

// A time budget is planned from the measured steady-state step rate: the run uses most of its budget and stops
// within it (loose bounds: the machine may be busy).
TEST(Pipeline, TimeBudgetIsUsedAndKept) {
  const std::string root = train_tmpdir("pipebudget");
  TrainConfig c = tiny_train_config(root, make_train_data(root));
  c.epochs = 100000;  // the budget decides
  c.time_budget_s = 4;
  const auto t0 = std::chrono::steady_clock::now();
  TrainSummary s = train(c);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(s.interrupted);
  EXPECT_EQ(s.steps_done, s.total_steps);
  double train_s = 0;
  for (const auto& r : read_metrics_jsonl(c.out_dir)) train_s += r["step_s"].get<double>();
  EXPECT_GT(train_s, 0.6 * c.time_budget_s) << s.steps_done << " steps";
  EXPECT_LT(train_s, 1.5 * c.time_budget_s + 1.0) << s.steps_done << " steps, " << sec << " s in all";
  fs::remove_all(root);
}

// `dflash plot RUN`: a PNG of the curves, drawn by gnuplot, with the per-slot accuracy along the block (the mean of
// metrics "acc" over the last --tail of the steps, and its prefix products), also printed per run.
TEST(Plot, WritesAPngOfTheCurves) {
  const std::string root = train_tmpdir("plot");
  TrainConfig c = tiny_train_config(root, make_train_data(root, 8));
  c.max_steps = 6;
  c.optim.lr = 3e-2;  // a few slots right already
  train(c);
  const std::string png = root + "/curves.png", log = root + "/plot.log";
  ASSERT_EQ(run_binary({DFLASH_BINARY, "plot", c.out_dir, c.out_dir, "--out", png, "--x", "seconds", "--tail", "0.5"},
                       nullptr, log),
            0);
  const std::string bytes = read_file(png);
  ASSERT_GT(bytes.size(), 8000u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  // the PNG's height (IHDR, big-endian at byte 20): several runs share one legend strip below the six panels
  auto height = [](const std::string& b) {
    uint32_t h = 0;
    for (int k = 20; k < 24; ++k) h = h << 8 | static_cast<unsigned char>(b[k]);
    return h;
  };
  const std::string one = root + "/one.png";
  ASSERT_EQ(run_binary({DFLASH_BINARY, "plot", c.out_dir, "--out", one}, nullptr, root + "/one.log"), 0);
  EXPECT_EQ(height(read_file(one)), 1250u);
  EXPECT_EQ(height(bytes), 1250u + 24 + 16) << "2 runs: one row of legend";
  auto m = read_metrics_jsonl(c.out_dir);
  ASSERT_EQ(m.size(), 6u);
  std::string want;  // the last 3 of 6 steps
  double prefix = 1;
  for (size_t i = 1; i < 4; ++i) {
    const double mean = (m[3]["acc"][i].get<double>() + m[4]["acc"][i].get<double>() + m[5]["acc"][i].get<double>()) / 3;
    prefix *= mean;
    char b[96];
    std::snprintf(b, sizeof b, "\n  %zu\t%.6g\t%.6g", i, mean, prefix);
    want += b;
  }
  const std::string out = read_file(log);
  EXPECT_NE(out.find("per-slot accuracy along the block (last 50% of the steps; slot, acc_i, prod_{k<=i} acc_k):" + want),
            std::string::npos) << out << "\nwanted:" << want;
  EXPECT_NE(run_binary({DFLASH_BINARY, "plot", root + "/nothing"}), 0);
  EXPECT_NE(run_binary({DFLASH_BINARY, "plot", c.out_dir, "--tail", "0"}), 0);
  fs::remove_all(root);
}
