// tests/model/split_target.cpp — a target split over several devices for decoding (model/split_target.h; eval and
// generate --target-split), on CPU contexts: the cached forward, the rollback of a hybrid target's state, batched
// generation and speculative decoding give the whole target's results bit for bit, and `dflash eval` / `dflash
// generate` with --target-split 2 write what they write unsplit. (Training's split target: tests/train/target_split.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/decode_checks.h"
#include "common/test_util.h"
#include "core/fs.h"
#include "eval/tau.h"
#include "model/split_target.h"
#include "model/target_stages.h"

namespace dflash {
namespace {

std::string golden(const char* name) { return test::source_dir() + "/tests/golden/" + name; }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() && a.dtype == b.dtype && a.shape == b.shape &&
         std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// S CPU contexts (one thread each, as the whole target's: the same GEMM blocking) and the target split over them.
struct Split {
  std::vector<std::unique_ptr<Context>> ctxs;
  std::unique_ptr<SplitTarget> target;
  Split(const char* name, int S) {
    std::vector<Context*> p;
    for (int s = 0; s < S; ++s) {
      ctxs.push_back(make_context("cpu", {.threads = 1}));
      p.push_back(ctxs.back().get());
    }
    target = std::make_unique<SplitTarget>(SplitTarget::load(golden(name), p));
  }
};

// Prefill with capture, a verify block, a rollback into it (the hybrid target's recurrent state recomputed on its
// stage's context) and one more token, through S = 2 and 3 stages on their own contexts: every output equals the whole
// target's, bit for bit, for a dense, an MoE and a hybrid target.
TEST(SplitTarget, CachedForwardAndRollbackEqualTheWholeTargetBitForBit) {
  for (const char* name : {"target_qwen3", "target_qwen3_moe", "target_qwen3_next"}) {
    auto ctx = make_context("cpu", {.threads = 1});
    const auto whole = Target::load(golden(name), *ctx);
    const std::vector<int64_t> taps = {0, 2};
    auto run = [&](const SplitTarget& t, Context& c, KVCache& cache, const std::vector<int32_t>& ids) {
      return t.forward(c, cpu_tensor_i32(ids, {static_cast<int64_t>(ids.size())}), taps, true, &cache);
    };
    std::vector<Target::Output> ref;
    KVCache rc = whole->make_cache(*ctx, 40, true);
    ref.push_back(run(*whole, *ctx, rc, {5, 17, 300, 42, 7, 99, 100, 3}));
    ref.push_back(run(*whole, *ctx, rc, {11, 12, 13, 14, 15}));
    rc.truncate(*ctx, 10);
    ref.push_back(run(*whole, *ctx, rc, {77}));
    for (int S : {2, 3}) {
      Split sp(name, S);
      ASSERT_EQ(sp.target->size(), S);
      Context& c0 = *sp.ctxs[0];
      KVCache cache = sp.target->make_cache(c0, 40, true);
      std::vector<Target::Output> got;
      got.push_back(run(*sp.target, c0, cache, {5, 17, 300, 42, 7, 99, 100, 3}));
      got.push_back(run(*sp.target, c0, cache, {11, 12, 13, 14, 15}));
      sp.target->truncate(c0, cache, 10);
      got.push_back(run(*sp.target, c0, cache, {77}));
      EXPECT_EQ(cache.len, rc.len);
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_TRUE(same_bits(got[i].features, ref[i].features)) << name << " S " << S << " forward " << i;
        EXPECT_TRUE(same_bits(got[i].final_hidden, ref[i].final_hidden)) << name << " S " << S << " forward " << i;
      }
      // the logits through the last stage's lm_head, called from stage 0's context
      const int64_t V = whole->config().vocab_size;
      Tensor a = ctx->empty(ctx->compute_dtype(), {1, V}), b = c0.empty(c0.compute_dtype(), {1, V});
      whole->logits(*ctx, ref.back().final_hidden, a);
      sp.target->logits(c0, got.back().final_hidden, b);
      EXPECT_TRUE(same_bits(a, b)) << name << " S " << S;
      // the embedding and lm_head for a drafter on stage 0's context: the values of the whole target's
      const TargetHead h = sp.target->head(c0);
      EXPECT_TRUE(same_bits(h.embed, whole->weights().embed)) << name;
      EXPECT_TRUE(same_bits(h.lm_head, whole->weights().lm_head)) << name;
    }
  }
}

// Batched greedy generation and real speculative decoding (a drafter on stage 0's context, its cycles rolling the
// hybrid target's state back) through 2 stages: the whole target's tokens and cycles.
TEST(SplitTarget, GenerationAndSpeculativeDecodingEqualTheWholeTarget) {
  for (const char* name : {"target_qwen3_moe", "target_qwen3_next"}) {
    auto ctx = make_context("cpu", {.threads = 1});
    const auto whole = Target::load(golden(name), *ctx);
    const auto prompts = test::random_prompts(29, 3, 9, 5, 500);
    const auto ref = test::greedy_generate(*ctx, *whole, prompts, 24, 2);
    Split sp(name, 2);
    Context& c0 = *sp.ctxs[0];
    EXPECT_EQ(test::greedy_generate(c0, *sp.target, prompts, 24, 2), ref) << name;
    const DrafterConfig dc = DrafterConfig::for_target(whole->config(), 1, 4, {1, 2}, 511);
    Drafter d_whole(*ctx, dc, 5, 0.02), d_split(c0, dc, 5, 0.02);
    DFlashDraftModel m_whole(d_whole, *whole, 8);
    DFlashDraftModel m_split(d_split, sp.target->config(), sp.target->head(c0), 8);
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> tokens = prompts[i];
      tokens.insert(tokens.end(), ref[i].begin(), ref[i].end());
      const ResponseSpan r{static_cast<int64_t>(prompts[i].size()), static_cast<int64_t>(tokens.size())};
      const ResponseTau a = generated_tau(*ctx, *whole, m_whole, tokens, r, {});
      const ResponseTau b = generated_tau(c0, *sp.target, m_split, tokens, r, {});
      EXPECT_EQ(a.tokens, b.tokens) << name << " prompt " << i;
      ASSERT_EQ(a.cycles.size(), b.cycles.size()) << name << " prompt " << i;
      for (size_t k = 0; k < a.cycles.size(); ++k) {
        EXPECT_EQ(a.cycles[k].drafts, b.cycles[k].drafts) << name << " prompt " << i << " cycle " << k;
        EXPECT_EQ(a.cycles[k].accepted, b.cycles[k].accepted) << name << " prompt " << i << " cycle " << k;
      }
      const ResponseTau base = target_greedy_decode(c0, *sp.target, tokens, r, {});
      EXPECT_EQ(base.tokens, a.tokens) << name << " prompt " << i << ": lossless through the split";
    }
  }
}

// A SplitTarget refuses stages that do not cover the target in order.
TEST(SplitTarget, RefusesStagesOutOfOrder) {
  auto a = make_context("cpu", {.threads = 1}), b = make_context("cpu", {.threads = 1});
  const std::vector<TargetStage> st = split_target_layers(load_model_config(golden("target_qwen3")), 2);
  auto s0 = Target::load_stage(golden("target_qwen3"), *a, st[0]);
  auto s1 = Target::load_stage(golden("target_qwen3"), *b, st[1]);
  EXPECT_THROW(SplitTarget({b.get(), a.get()}, {s1, s0}), Error);
  EXPECT_THROW(SplitTarget({a.get()}, {s0}), Error);
  EXPECT_THROW(SplitTarget({a.get(), b.get()}, {s0}), Error);
  EXPECT_THROW(SplitTarget{*s1}, Error);  // a stage is not a whole target
  EXPECT_NO_THROW(SplitTarget({a.get(), b.get()}, {s0, s1}));
}

// `dflash eval --target-split 2` and `dflash generate --target-split 2` on the CPU write the unsplit runs' results.
TEST(SplitTarget, EvalAndGenerateCommandsWithTargetSplit) {
  const std::string tmp = cat("/tmp/dflash_test_split_eval_", getpid());
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  const std::string target = test::source_dir() + "/assets/demo/target";
  auto sh = [&](const std::string& cmd) {
    ASSERT_EQ(std::system((cmd + " > " + tmp + "/log.txt 2>&1").c_str()), 0) << cmd << "\n" << read_file(tmp + "/log.txt");
  };
  // prompts -> the target's own continuations (split and not) -> prepared data -> eval (split and not)
  write_file_atomic(tmp + "/prompts.jsonl", "{\"prompt\": \"Name three colours.\"}\n{\"prompt\": \"Count to five.\"}\n");
  for (int S : {1, 2})
    sh(cat(DFLASH_BINARY, " generate --target ", target, " --prompts ", tmp, "/prompts.jsonl --out ", tmp, "/gen", S,
           ".jsonl --max-new-tokens 24 --batch-size 2 --target-split ", S));
  EXPECT_EQ(read_file(tmp + "/gen1.jsonl"), read_file(tmp + "/gen2.jsonl"));
  sh(cat(DFLASH_BINARY, " prepare --tokenizer ", target, " --input ", tmp, "/gen1.jsonl --out ", tmp, "/data"));
  for (int S : {1, 2})
    sh(cat(DFLASH_BINARY, " eval --target ", target, " --untrained-drafter --data ", tmp, "/data --block-size 4 ",
           "--json ", tmp, "/eval", S, ".json --no-progress --target-split ", S));
  nlohmann::json e1 = nlohmann::json::parse(read_file(tmp + "/eval1.json"));
  nlohmann::json e2 = nlohmann::json::parse(read_file(tmp + "/eval2.json"));
  EXPECT_EQ(e2["target_split"], 2);
  for (const char* mode : {"teacher_forced", "generated"}) {
    ASSERT_TRUE(e1.contains(mode)) << e1.dump();
    EXPECT_EQ(e1[mode]["tau"], e2[mode]["tau"]) << mode;
    EXPECT_EQ(e1[mode]["histogram"], e2[mode]["histogram"]) << mode;
  }
  EXPECT_EQ(e2["lossless_mismatches"], 0);
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace dflash
