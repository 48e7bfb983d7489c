// tests/train/threads.cpp
// Case C01: worker threads that start at the same moment, each with its own Context and a different sequence
// length, running their first training step, give exactly the results of the same steps run one at a time.
// Run under ThreadSanitizer in CI (scripts/test.sh --tsan) to show no shared mutable state is touched unlocked.
#include <gtest/gtest.h>

#include <barrier>
#include <thread>

#include "backend/context.h"
#include "model/draft_batch.h"
#include "model/drafter.h"
#include "model/target.h"
#include "common/test_util.h"
#include "model/draft_batch.h"
#include "train/optimizer.h"

using namespace dflash;

namespace {

struct Result {
  double loss = 0;
  std::vector<float> params;
};

// One worker's first step: own context, own drafter, a sequence of length S; the target is shared (immutable).
Result first_step(const Target& target, int64_t S) {
  auto ctx = make_context("cpu", {.threads = 1});
  DrafterConfig dc = DrafterConfig::for_target(target.config(), 1, 4, {1, 2}, 511);
  Drafter d(*ctx, dc, 42);
  std::vector<int32_t> ids(static_cast<size_t>(S));
  std::vector<uint8_t> mask(static_cast<size_t>(S), 1);
  for (int64_t p = 0; p < S; ++p) ids[p] = static_cast<int32_t>((p * 13 + S) % 500);
  Rng rng(1, RngPurpose::Anchors, 0, static_cast<uint64_t>(S));
  auto anchors = sample_anchors(mask, 16, rng);
  DraftBatch b = make_draft_batch(ids, mask, anchors, static_cast<int64_t>(anchors.size()), 4, 511, 7.0);
  auto out = target.forward(*ctx, cpu_tensor_i32(ids, {S}), std::vector<int64_t>{1, 2}, false);
  auto st = d.forward_backward(*ctx, upload_draft_batch(*ctx, b, out.features), target.weights().embed,
                               target.weights().lm_head, 0.f, static_cast<float>(1.0 / b.sum_w), true);
  optimizer_step(*ctx, d.params(), OptimConfig{}, 1e-3, 1, global_grad_sq(*ctx, d.params()));
  Result r;
  r.loss = st.loss_sum;
  for (auto& p : d.params().all()) {
    auto v = to_f32_vector(p.master);
    r.params.insert(r.params.end(), v.begin(), v.end());
  }
  return r;
}

}  // namespace

TEST(Threads, ConcurrentFirstStepsEqualSequentialCaseC01) {
  auto load_ctx = make_context("cpu", {.threads = 1});
  auto target = Target::load(test::source_dir() + "/tests/golden/target_qwen3", *load_ctx);  // before the workers
  const std::vector<int64_t> lengths = {17, 40, 29, 64, 33, 51};
  std::vector<Result> seq;
  for (int64_t S : lengths) seq.push_back(first_step(*target, S));
  std::vector<Result> par(lengths.size());
  std::barrier start(static_cast<std::ptrdiff_t>(lengths.size()));
  std::vector<std::thread> workers;
  for (size_t i = 0; i < lengths.size(); ++i)
    workers.emplace_back([&, i] {
      start.arrive_and_wait();  // all first steps begin at the same moment
      par[i] = first_step(*target, lengths[i]);
    });
  for (auto& t : workers) t.join();
  for (size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(par[i].loss, seq[i].loss) << "S = " << lengths[i];
    EXPECT_EQ(par[i].params, seq[i].params) << "S = " << lengths[i];
  }
}
