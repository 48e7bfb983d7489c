// tests/train/target_split.cpp — a target worker over several devices (train --target-split): the stages of a dense,
// an MoE and a hybrid target give the unsplit forward's features and final hidden states bit for bit, and training
// with S = 2 and 3 stages gives the unsplit run's fp32 loss curve and parameters exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "common/test_util.h"
#include "common/train_fixtures.h"
#include "model/target.h"
#include "model/target_stages.h"

namespace dflash {
namespace {

std::string golden(const char* name) { return test::source_dir() + "/tests/golden/" + name; }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// Target::forward_stage over S = 1, 2, 3 stages (each loaded alone by Target::load_stage) equals Target::forward,
// bit for bit: the features of the captured layers (one in the first stage, one later) and the final hidden.
TEST(TargetSplit, StagesGiveTheUnsplitForwardBitForBit) {
  for (const char* name : {"target_qwen3", "target_qwen3_moe", "target_qwen3_next", "target_qwen3_5"}) {
    auto ctx = make_context("cpu", {.threads = 1});
    const auto whole = Target::load(golden(name), *ctx);
    std::vector<int32_t> ids;
    for (int i = 0; i < 13; ++i) ids.push_back((i * 37 + 5) % 500);
    const Tensor t_ids = cpu_tensor_i32(ids, {13});
    const std::vector<int64_t> layer_ids = {0, 2};
    const Target::Output ref = whole->forward(*ctx, t_ids, layer_ids, true);
    for (int S = 1; S <= 3; ++S) {
      const std::vector<TargetStage> stages = split_target_layers(whole->config(), S);
      Target::StageState st;
      Tensor final_hidden;
      for (int s = 0; s < S; ++s) {
        const auto part = Target::load_stage(golden(name), *ctx, stages[static_cast<size_t>(s)]);
        EXPECT_EQ(part->whole(), S == 1) << name;
        EXPECT_EQ(part->weights().embed.defined(), s == 0) << name;
        EXPECT_EQ(part->weights().lm_head.defined(), s == S - 1) << name;
        st = part->forward_stage(*ctx, t_ids, s == 0 ? nullptr : &st, layer_ids, true, &final_hidden);
      }
      EXPECT_TRUE(same_bits(st.features, ref.features)) << name << " S " << S;
      EXPECT_TRUE(same_bits(final_hidden, ref.final_hidden)) << name << " S " << S;
    }
    // a stage refuses the whole target's entry points, and a later stage without its input
    const auto second = Target::load_stage(golden(name), *ctx, {2, 4});
    EXPECT_THROW(second->forward(*ctx, t_ids, layer_ids, false), Error);
    EXPECT_THROW(second->forward_stage(*ctx, t_ids, nullptr, layer_ids, false), Error);
  }
}

// Training with the target split into S = 2 stages (one worker over 2 CPU devices) and S = 3 (two workers over 3
// each) gives the unsplit run's loss of every step and final parameters, bit for bit (the features are the same
// bits and one drafter takes them in the same order), for a dense, an MoE and a hybrid target.
TEST(TargetSplit, TrainingEqualsTheUnsplitRun) {
  const std::string root = test::train_tmpdir("target_split");
  const std::string data = test::make_train_data(root);
  for (const char* name : {"target_qwen3", "target_qwen3_moe", "target_qwen3_next"}) {
    TrainConfig one = test::tiny_train_config(root, data);
    one.target_dir = golden(name);
    one.max_steps = 6;
    one.out_dir = cat(root, "/", name, "_one");
    train(one);
    const auto m1 = test::read_metrics_jsonl(one.out_dir);
    ASSERT_EQ(m1.size(), 6u) << name;
    for (const auto& [targets, split] : {std::pair<const char*, int>{"2", 2}, {"6", 3}}) {
      TrainConfig sp = one;
      sp.targets = targets;
      sp.target_split = split;
      sp.out_dir = cat(root, "/", name, "_split", split);
      const TrainSummary s = train(sp);
      EXPECT_EQ(s.targets, split == 2 ? 1 : 2) << name;  // workers: 2 devices / 2 stages, 6 / 3
      EXPECT_EQ(s.lazy_inits_after_warmup, 0) << name;
      const auto m2 = test::read_metrics_jsonl(sp.out_dir);
      ASSERT_EQ(m2.size(), m1.size()) << name << " S " << split;
      for (size_t i = 0; i < m1.size(); ++i) {
        EXPECT_EQ(m2[i]["loss"], m1[i]["loss"]) << name << " S " << split << " step " << i + 1;
        EXPECT_EQ(m2[i]["grad_norm"], m1[i]["grad_norm"]) << name << " S " << split << " step " << i + 1;
      }
      EXPECT_EQ(test::final_params(sp.out_dir), test::final_params(one.out_dir)) << name << " S " << split;
      EXPECT_TRUE(m2[0]["workers"].contains(split == 2 ? "target 0 (cpu+cpu)" : "target 1 (cpu+cpu+cpu)"))
          << m2[0]["workers"].dump();
    }
  }
  std::filesystem::remove_all(root);
}

// A stage after the first that fails ends the whole job with its own message, after a checkpoint of the last
// completed step; --resume then completes the run, with the uninterrupted run's final parameters.
TEST(TargetSplit, AFailedStageEndsTheJobAndResumeCompletes) {
  const std::string root = test::train_tmpdir("target_split_fault");
  const std::string data = test::make_train_data(root);
  TrainConfig c = test::tiny_train_config(root, data);
  c.target_dir = golden("target_qwen3");
  c.max_steps = 12;
  c.targets = "3";
  c.target_split = 3;
  c.out_dir = root + "/clean";
  train(c);
  c.out_dir = root + "/fault";
  c.inject_fault = "stage:1:5";
  try {
    train(c);
    FAIL() << "the job must fail";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("stage 1"), std::string::npos) << m;
    EXPECT_NE(m.find("injected fault"), std::string::npos) << m;
    EXPECT_NE(m.find("--resume"), std::string::npos) << m;
  }
  const auto done = test::read_metrics_jsonl(c.out_dir);
  EXPECT_LE(done.size(), 5u);  // the stage failed on a micro-batch of step 5 (0-based): steps 0-4 at most are done
  c.inject_fault.clear();
  c.resume = true;
  const TrainSummary s = train(c);
  EXPECT_EQ(s.steps_done, 12);
  EXPECT_EQ(test::final_params(c.out_dir), test::final_params(root + "/clean"));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace dflash
