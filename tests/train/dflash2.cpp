// tests/train/dflash2.cpp — training DFlash2 drafters end to end on the tiny Qwen3 target (common/train_fixtures.h):
// it learns, 2 + 2 workers = 1, and a resume as another architecture is refused naming --arch.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/train_fixtures.h"

using namespace dflash;

namespace {

// The tiny training run of common/train_fixtures.h as DFlash2, with a selector that fits its 512-token vocabulary.
TrainConfig tiny_dflash2_run(const std::string& root, const std::string& data) {
  TrainConfig c = test::tiny_train_config(root, data);
  c.arch = "dflash2";
  c.conv_group_size = 8;
  c.selector_rank = 16;
  c.selector_top_k = 8;
  return c;
}

}  // namespace

// A DFlash2 run learns: the cross-entropy falls, the EAL (the selector's teacher-forced choices) and the share of
// labels among the candidates rise (TrainLoop.LossFallsAndEalRises' run, with D-PACE, the default objective).
TEST(DFlash2Train, CrossEntropyFallsAndEalAndRecallRise) {
  const std::string root = test::train_tmpdir("d2learn");
  TrainConfig c = tiny_dflash2_run(root, test::make_train_data(root));
  c.threads = 2;
  c.batch_size = 2;
  c.max_steps = 300;
  c.optim.lr = 1e-2;
  c.optim.warmup_ratio = 0.02;
  train(c);
  auto m = test::read_metrics_jsonl(c.out_dir);
  ASSERT_EQ(m.size(), 300u);
  ASSERT_TRUE(m[0].contains("sel_loss") && m[0].contains("sel_recall"));
  auto mean = [&](size_t b, size_t e, const char* k) {
    double s = 0;
    for (size_t i = b; i < e; ++i) s += m[i][k].get<double>();
    return s / static_cast<double>(e - b);
  };
  EXPECT_LT(mean(280, 300, "ce"), 0.75 * mean(0, 20, "ce"));
  EXPECT_GT(mean(280, 300, "eal"), mean(0, 20, "eal") + 0.3);
  EXPECT_GT(mean(280, 300, "sel_recall"), mean(0, 20, "sel_recall") + 0.2);
  // dflash plot draws the selector's curves: this run alone, and beside a DFlash run (whose rows have none)
  TrainConfig d = test::tiny_train_config(root, c.data_dir);
  d.max_steps = 4;
  d.out_dir = root + "/dflash";
  train(d);
  for (const std::vector<std::string>& runs : {std::vector<std::string>{c.out_dir}, {c.out_dir, d.out_dir}}) {
    const std::string png = root + "/curves" + std::to_string(runs.size()) + ".png";
    std::vector<std::string> args = {DFLASH_BINARY, "plot"};
    args.insert(args.end(), runs.begin(), runs.end());
    args.insert(args.end(), {"--out", png});
    ASSERT_EQ(test::run_binary(args, nullptr, root + "/plot.log"), 0) << read_file(root + "/plot.log");
    EXPECT_EQ(read_file(png).substr(1, 3), "PNG");
  }
  std::filesystem::remove_all(root);
}

// 2 target + 2 drafter workers give the DFlash2 run of one of each (the selector's codebook gradients are summed
// like every other gradient; ZeRO-1 shards them).
TEST(DFlash2Train, TwoPlusTwoMatchesOneWorker) {
  const std::string root = test::train_tmpdir("d2pipe");
  TrainConfig one = tiny_dflash2_run(root, test::make_train_data(root));
  one.max_steps = 12;
  one.out_dir = root + "/one";
  train(one);
  test::expect_two_plus_two_as_one(one, root + "/two", "dflash2");
  std::filesystem::remove_all(root);
}

// A DFlash2 checkpoint is not continued as DFlash (nor the reverse): the refusal names --arch.
TEST(DFlash2Train, ResumeAsAnotherArchIsRefusedNamingArch) {
  const std::string root = test::train_tmpdir("d2resume");
  TrainConfig c = tiny_dflash2_run(root, test::make_train_data(root, 8));
  c.max_steps = 4;
  c.stop_after = 2;
  train(c);
  c.stop_after = 0;
  c.resume = true;
  c.arch = "dflash";
  try {
    train(c);
    FAIL() << "resume of a dflash2 checkpoint as dflash must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--arch dflash2"), std::string::npos) << e.what();
  }
  c.arch = "dflash2";
  c.selector_top_k = 4;
  EXPECT_THROW(train(c), Error);
  c.selector_top_k = 8;
  TrainSummary s = train(c);  // the same settings continue
  EXPECT_EQ(s.steps_done, 4);
  std::filesystem::remove_all(root);
}

// `dflash eval --untrained-drafter --arch dflash2`: a DFlash2 baseline drafts through its selector (the untrained
// selector's path is the argmax of the logits, so speculative decoding is lossless there too).
TEST(DFlash2Train, EvalOfAnUntrainedDFlash2Drafter) {
  const std::string root = test::train_tmpdir("d2eval");
  const std::string data = test::make_train_data(root, 3);
  const std::string json = root + "/eval.json", log = root + "/eval.log";
  ASSERT_EQ(test::run_binary({DFLASH_BINARY, "eval", "--target", test::source_dir() + "/tests/golden/target_qwen3",
                              "--data", data, "--untrained-drafter", "--arch", "dflash2", "--block-size", "4",
                              "--mask-token-id", "511", "--num-target-layers", "1", "--mode", "teacher", "--no-progress", "--json", json},
                             nullptr, log),
            0)
      << read_file(log);
  const auto j = nlohmann::json::parse(read_file(json));
  EXPECT_EQ(j["drafter"]["config"]["arch"], "dflash2");
  EXPECT_EQ(j["drafter"]["config"]["selector_top_k"], 16);
  std::filesystem::remove_all(root);
}
