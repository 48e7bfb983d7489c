// tests/common/decode_checks.h — end-to-end checks of a target family's forward and cache, shared by the family tests
// (tests/families/: qwen3_moe, gpt_oss, qwen3_5, hybrid): packed prefill, greedy batched generation, and
// real speculative decoding against the target's own greedy decode.
// defines: check_packed_prefill, random_prompts, greedy_generate, expect_lossless_speculative, check_lossless_decoding
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "eval/generate.h"
#include "eval/tau.h"
#include "model/drafter.h"
#include "model/target.h"
#include "test_util.h"

namespace dflash::test {

// Two sequences a and b (host ids) run alone and packed in one forward_packed give the same features (taps `ids`)
// within `tol`; returns a's output alone.
inline Target::Output check_packed_prefill(Context& ctx, const Target& tg, const std::vector<int32_t>& a,
                                           const std::vector<int32_t>& b, const std::vector<int64_t>& ids, double tol) {
  auto fa = tg.forward(ctx, cpu_tensor_i32(a, {static_cast<int64_t>(a.size())}), ids, true);
  auto fb = tg.forward(ctx, cpu_tensor_i32(b, {static_cast<int64_t>(b.size())}), ids, true);
  const std::vector<std::vector<int32_t>> both = {a, b};
  auto fp = tg.forward_packed(ctx, both, ids, true);
  const auto pa = to_f64(fa.features), pb = to_f64(fb.features), pp = to_f64(fp.features);
  EXPECT_EQ(pp.size(), pa.size() + pb.size());
  for (size_t i = 0; i < pa.size() && i < pp.size(); ++i) EXPECT_NEAR(pp[i], pa[i], tol) << "a, value " << i;
  for (size_t i = 0; i < pb.size() && pa.size() + i < pp.size(); ++i)
    EXPECT_NEAR(pp[pa.size() + i], pb[i], tol) << "b, value " << i;
  return fa;
}

// n prompts of random ids below `vocab`, of lengths len0, len0 + step, ... (a Test stream of `seed`).
inline std::vector<std::vector<int32_t>> random_prompts(uint64_t seed, int n, int len0, int step, uint64_t vocab) {
  Rng rng(seed, RngPurpose::Test);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < len0 + step * i; ++t) p.push_back(static_cast<int32_t>(rng.below(vocab)));
    prompts.push_back(p);
  }
  return prompts;
}

// Greedy continuations (max_new tokens, no stop id) of `prompts` by generate_batched with `batch_size` sequences at a
// time, in prompt order.
inline std::vector<std::vector<int32_t>> greedy_generate(Context& ctx, const SplitTarget& target,
                                                         const std::vector<std::vector<int32_t>>& prompts,
                                                         int64_t max_new, int64_t batch_size) {
  DecodeOptions o;
  o.max_new_tokens = max_new;
  o.batch_size = batch_size;
  size_t next = 0;
  std::vector<std::vector<int32_t>> out(prompts.size());
  generate_batched(
      ctx, target, o,
      [&](GenerationRequest* q) {
        if (next >= prompts.size()) return false;
        q->row = next;
        q->prompt = prompts[next++];
        return true;
      },
      [&](GenerationResult&& g) { out[g.row] = g.ids; });
  return out;
}

// For each prompt followed by its greedy continuation: real speculative decoding with `dm` reproduces the target-only
// greedy decode (lossless), and teacher forcing on that response gives the same cycles and tau. Returns the number of
// cycles in which a draft token was rejected (the target's cache cut back).
inline int64_t expect_lossless_speculative(Context& ctx, const SplitTarget& target, DraftModel& dm,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<std::vector<int32_t>>& continuations,
                                           const std::string& label) {
  int64_t rejected = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> toks = prompts[i];
    toks.insert(toks.end(), continuations[i].begin(), continuations[i].end());
    std::vector<uint8_t> mask(prompts[i].size(), 0);
    mask.resize(toks.size(), 1);
    const ResponseSpan r = response_span(mask);
    const std::vector<int32_t> no_eos;
    const ResponseTau tf = teacher_forced_tau(ctx, target, dm, toks, r);
    const ResponseTau gen = generated_tau(ctx, target, dm, toks, r, no_eos);
    const ResponseTau base = target_greedy_decode(ctx, target, toks, r, no_eos);
    EXPECT_EQ(gen.tokens, base.tokens) << label << " sample " << i << ": speculative decoding is not lossless";
    EXPECT_EQ(tf.cycles.size(), gen.cycles.size()) << label << " sample " << i;
    for (size_t c = 0; c < tf.cycles.size() && c < gen.cycles.size(); ++c) {
      EXPECT_EQ(tf.cycles[c].accepted, gen.cycles[c].accepted) << label << " sample " << i << " cycle " << c;
      rejected += gen.cycles[c].accepted < static_cast<int32_t>(gen.cycles[c].drafts.size());
    }
    EXPECT_EQ(tf.tau(), gen.tau()) << label << " sample " << i;
  }
  return rejected;
}

// Three random prompts (ids < 500; 12, 17 and 22 tokens) decoded greedily for 24 tokens: batched generation equals one
// sequence at a time; real speculative decoding with a random 1-layer drafter (block 4, taps {1, 2}, mask 511) through
// the target's KV cache reproduces the target-only greedy decode (lossless), and teacher forcing on that greedy data
// gives the same cycles and tau. Returns the shortest prompt + response length. `label` names the case in failures.
inline size_t check_lossless_decoding(Context& ctx, const Target& target, uint64_t seed, const std::string& label) {
  const auto prompts = random_prompts(seed, 3, 12, 5, 500);
  const auto by1 = greedy_generate(ctx, target, prompts, 24, 1);
  EXPECT_EQ(by1, greedy_generate(ctx, target, prompts, 24, 3))
      << label << ": batched greedy decoding differs from one sequence at a time";
  Drafter dr(ctx, DrafterConfig::for_target(target.config(), 1, 4, {1, 2}, 511), 5, 0.02);
  DFlashDraftModel dm(dr, target, 8);
  expect_lossless_speculative(ctx, target, dm, prompts, by1, label);
  size_t shortest = SIZE_MAX;
  for (size_t i = 0; i < prompts.size(); ++i) shortest = std::min(shortest, prompts[i].size() + by1[i].size());
  return shortest;
}

}  // namespace dflash::test
