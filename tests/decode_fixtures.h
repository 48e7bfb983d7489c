// tests/decode_fixtures.h — decoding checks shared by the target-family tests (test_moe.cpp, test_hybrid.cpp):
// greedy batched generation, and real speculative decoding against the target's own greedy decode.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "eval/generate.h"
#include "eval/tau.h"
#include "model/target.h"

namespace dflash::test {

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
inline std::vector<std::vector<int32_t>> greedy_generate(Context& ctx, const Target& target,
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
// greedy decode (lossless), and teacher forcing on that response gives the same cycles. Returns the number of cycles
// in which a draft token was rejected (the target's cache cut back).
inline int64_t expect_lossless_speculative(Context& ctx, const Target& target, DraftModel& dm,
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

}  // namespace dflash::test
