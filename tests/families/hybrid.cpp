// tests/families/hybrid.cpp — what the hybrid linear-attention families (Qwen3-Next, Qwen3.5 / Qwen3.6, dense and
// MoE; io/model_family_hybrid.cpp) share, run on several of them: the four goldens of transformers 5.17 in fp64 (150
// tokens, past two chunks of 64), the recurrent state's rollback, speculative decoding = the target's greedy output,
// batched generation, and `dflash capture` / `train` / `eval`. Each family's own config and golden:
// tests/families/qwen3_next.cpp, tests/families/qwen3_5.cpp; the ops: tests/ops/ (conv1d_causal, gated_delta_rule,
// rmsnorm_gated, rope).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/error.h"
#include "core/fs.h"
#include "eval/generate.h"
#include "eval/tau.h"
#include "io/hf_config.h"
#include "io/model_family.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/target.h"
#include "common/decode_checks.h"
#include "common/golden_checks.h"
#include "common/test_util.h"
#include "common/train_fixtures.h"

using namespace dflash;
using nlohmann::json;
using test::check_hybrid_golden;
using test::rel_err;
using test::to_f64;

namespace {

std::string golden_dir(const std::string& name) { return test::source_dir() + "/tests/golden/" + name; }

const char* kHybridGoldens[] = {"target_qwen3_next", "target_qwen3_5", "target_qwen3_5_moe", "target_qwen3_5_vl"};

}  // namespace

// ---- goldens of transformers 5.17 ---------------------------------------------------------------------------------

TEST(HybridGolden, InFp64) {
  for (const char* n : kHybridGoldens) check_hybrid_golden(n, "cpu64");
}

// ---- rollback, speculative decoding, generation ----------------------------------------------------------------------

// A verify forward of 6 tokens rolled back to 2 leaves the cache as if only those 2 had run: the next token's logits
// (and the state) equal a cache that never saw the 4 rejected ones; rolling back all 6 or none also works.
TEST(HybridRollback, TruncateEqualsNeverHavingRunTheRejectedTokens) {
  auto ctx = make_context("cpu64");
  for (const char* name : {"target_qwen3_next", "target_qwen3_5"}) {
    auto target = Target::load(golden_dir(name), *ctx);
    const std::vector<int32_t> prompt = {5, 17, 300, 42, 7, 99, 100, 3}, verify = {11, 12, 13, 14, 15, 16};
    auto run = [&](KVCache& c, const std::vector<int32_t>& t) {
      return target->forward(*ctx, cpu_tensor_i32(t, {static_cast<int64_t>(t.size())}), {}, true, &c);
    };
    for (int64_t keep : {0, 2, 6}) {
      KVCache a = target->make_cache(*ctx, 32, true), b = target->make_cache(*ctx, 32);
      run(a, prompt);
      run(b, prompt);
      run(a, verify);
      a.truncate(*ctx, 8 + keep);
      if (keep > 0) run(b, std::vector<int32_t>(verify.begin(), verify.begin() + keep));
      ASSERT_EQ(a.len, b.len);
      for (size_t l = 0; l < a.layers.size(); ++l) {
        if (!a.layers[l].state.defined()) continue;
        EXPECT_LT(rel_err(to_f64(a.layers[l].state), to_f64(b.layers[l].state)), 1e-13) << name << " layer " << l;
        // (layer 0's window is bitwise equal; later layers' inputs went through GEMMs of other row counts)
        EXPECT_LT(rel_err(to_f64(a.layers[l].conv), to_f64(b.layers[l].conv)), 1e-13) << name << " layer " << l;
      }
      const auto oa = run(a, {77}), ob = run(b, {77});
      EXPECT_LT(rel_err(to_f64(oa.final_hidden), to_f64(ob.final_hidden)), 1e-12) << name << " keep " << keep;
    }
    // without a record the state cannot go back
    KVCache c = target->make_cache(*ctx, 32);
    run(c, prompt);
    EXPECT_THROW(c.truncate(*ctx, 4), Error);
    EXPECT_THROW(c.truncate(4), Error);
  }
}

// Real speculative decoding with a hybrid target (dense and MoE) produces exactly the target's greedy output (fp32,
// CPU), and on that output teacher forcing gives the same cycles; batched generation equals one sequence at a time.
TEST(HybridEndToEnd, SpeculativeDecodingIsLosslessAndBatchingChangesNothing) {
  auto ctx = make_context("cpu", {.threads = 2});
  for (const char* name : {"target_qwen3_5", "target_qwen3_next", "target_qwen3_5_moe"}) {
    auto target = Target::load(golden_dir(name), *ctx);
    const auto prompts = test::random_prompts(23, 3, 10, 7, 500);
    const auto by1 = test::greedy_generate(*ctx, *target, prompts, 40, 1);
    EXPECT_EQ(by1, test::greedy_generate(*ctx, *target, prompts, 40, 3))
        << name << ": batched greedy decoding differs from one sequence at a time";
    Drafter dr(*ctx, DrafterConfig::for_target(target->config(), 1, 4, {1, 2}, 511), 5, 0.02);
    DFlashDraftModel dm(dr, *target, 8);
    EXPECT_GT(test::expect_lossless_speculative(*ctx, *target, dm, prompts, by1, name), 0)
        << name << ": no cycle rolled the state back";
  }
}

// ---- the CLI on hybrid targets --------------------------------------------------------------------------------------

// dflash capture on a hybrid target writes HF's output_hidden_states and the logits.
TEST(HybridEndToEnd, CaptureWritesHfHiddenStates) {
  const std::string tmp = cat("/tmp/dflash_test_hcapture_", getpid());
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  for (const char* name : {"target_qwen3_5", "target_qwen3_next"}) {
    auto g = SafetensorsFile::open(golden_dir(name) + "/golden.safetensors");
    const Tensor ids = g->view("input_ids");
    json row = {{"input_ids", std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + ids.numel())}};
    write_file_atomic(tmp + "/ids.jsonl", row.dump() + "\n");
    const std::string out = cat(tmp, "/", name, ".safetensors");
    const std::string cmd = cat(DFLASH_BINARY, " capture --target ", golden_dir(name), " --input ", tmp,
                                "/ids.jsonl --out ", out, " --logits > ", tmp, "/log.txt 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(tmp + "/log.txt");
    auto f = SafetensorsFile::open(out);
    for (int i = 0; i <= 4; ++i)
      EXPECT_LT(rel_err(to_f64(f->view(cat("row_0.hidden_", i))), to_f64(g->view(cat("hidden_states.", i)))), 3e-5)
          << name << " hidden_" << i;
    EXPECT_LT(rel_err(to_f64(f->view("row_0.logits")), to_f64(g->view("logits"))), 3e-5) << name;
  }
  std::filesystem::remove_all(tmp);
}

// Training on the tiny hybrid targets (dense Qwen3.5 and MoE Qwen3-Next), its export, and `dflash eval` with that
// drafter (teacher forcing and real speculative decoding through the rolled-back state): the loss falls, two target +
// two drafter workers give the one-worker run's losses, the exported drafter is the published hybrid shape (32 heads
// of 128), and speculative decoding reproduces the target's greedy decode on every sample.
TEST(HybridPipeline, TrainExportAndEvalDenseAndMoe) {
  const std::string root = test::train_tmpdir("hybridpipe");
  const std::string data = test::make_train_data(root);
  for (const char* name : {"target_qwen3_5", "target_qwen3_next"}) {
    TrainConfig one = test::tiny_train_config(root, data);
    one.target_dir = golden_dir(name);
    one.max_steps = 10;
    one.out_dir = cat(root, "/", name, "_one");
    one.export_at_end = true;
    train(one);
    const auto m1 = test::read_metrics_jsonl(one.out_dir);
    ASSERT_EQ(m1.size(), 10u) << name;
    EXPECT_LT(m1.back()["loss"].get<double>(), m1.front()["loss"].get<double>()) << name;
    const json ex = json::parse(read_file(one.out_dir + "/export/config.json"));
    EXPECT_EQ(ex["num_attention_heads"].get<int64_t>(), 32) << name;
    EXPECT_EQ(ex["head_dim"].get<int64_t>(), 128) << name;
    EXPECT_EQ(ex["dflash_config"]["target_layer_ids"], json({1, 2})) << name;
    if (std::string(name) == "target_qwen3_next")  // MoE: 2 + 2 workers = 1 worker
      test::expect_two_plus_two_as_one(one, cat(root, "/", name, "_two"), name);
    const std::string rep = cat(root, "/", name, "_eval.json");
    const int rc = test::run_binary({DFLASH_BINARY, "eval", "--target", one.target_dir, "--drafter",
                                     one.out_dir + "/export", "--data", data, "--mode", "both", "--max-samples", "6",
                                     "--json", rep, "--no-progress"},
                                    nullptr, root + "/eval.log");
    ASSERT_EQ(rc, 0) << read_file(root + "/eval.log");
    const json r = json::parse(read_file(rep));
    EXPECT_EQ(r["evaluated"].get<int64_t>(), 6) << name;
    EXPECT_EQ(r["lossless_mismatches"].get<int64_t>(), 0) << name << ": speculative decoding differs from greedy";
    EXPECT_GE(r["generated"]["tau"].get<double>(), 1.0) << name;
  }
  std::filesystem::remove_all(root);
}
