// train/step_plan.cpp — the global step plan: data order, anchors, weights, the work-balanced split.
#include "train/step_plan.h"

#include <algorithm>
#include <numeric>

namespace dflash {

StepPlanner::StepPlanner(const Dataset& data, PlanConfig c) : data_(data), c_(c) {
  DFLASH_CHECK(c_.batch_size > 0, "plan: batch_size must be > 0");
  DFLASH_CHECK(c_.drafters > 0, "plan: at least one drafter");
  DFLASH_CHECK(data_.size() > 0, data_.dir(), ": no samples");
}

size_t StepPlanner::sample_at(int64_t i) {
  const int64_t n = static_cast<int64_t>(data_.size());
  const int64_t e = i / n;
  auto it = perms_.find(e);
  if (it == perms_.end()) {
    if (perms_.size() > 2) perms_.erase(perms_.begin());
    std::vector<size_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), size_t{0});
    Rng rng(c_.seed, RngPurpose::DataOrder, static_cast<uint64_t>(e));
    for (size_t k = p.size(); k > 1; --k) std::swap(p[k - 1], p[rng.below(k)]);
    it = perms_.emplace(e, std::move(p)).first;
  }
  return it->second[static_cast<size_t>(i % n)];
}

StepPlan StepPlanner::plan(int64_t step) {
  StepPlan sp;
  sp.step = step;
  for (int64_t k = 0; k < c_.batch_size; ++k) {
    const size_t idx = sample_at(step * c_.batch_size + k);
    SampleView s = data_.get(idx);
    std::span<const int32_t> toks = s.tokens;
    std::span<const uint8_t> mask = s.loss_mask;
    if (c_.max_length > 0 && static_cast<int64_t>(toks.size()) > c_.max_length) {
      toks = toks.subspan(0, static_cast<size_t>(c_.max_length));
      mask = mask.subspan(0, static_cast<size_t>(c_.max_length));
    }
    Rng rng(c_.seed, RngPurpose::Anchors, static_cast<uint64_t>(step), static_cast<uint64_t>(k));
    std::vector<int32_t> anchors = sample_anchors(mask, c_.max_anchors, rng);
    if (anchors.empty()) {  // spec 2.1.3: skipped and counted, never silently
      ++sp.skipped;
      continue;
    }
    SeqPlan q;
    q.k = k;
    q.sample = idx;
    q.tokens = toks;
    q.loss_mask = mask;
    q.batch = make_draft_batch(toks, mask, anchors, static_cast<int64_t>(anchors.size()), c_.block_size,
                               c_.mask_token_id, c_.gamma, c_.dpace_alpha);
    sp.sum_w += q.batch.sum_w;
    sp.target_tokens += q.batch.S;
    sp.draft_tokens += q.batch.N * q.batch.B;
    sp.seqs.push_back(std::move(q));
  }
  // Longest-processing-time-first: sequences by work (ties: batch order) to the least loaded drafter (ties: lowest
  // rank). Each drafter then takes its sequences in batch order.
  std::vector<int> order(sp.seqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sp.seqs[a].work() > sp.seqs[b].work(); });
  std::vector<int64_t> load(static_cast<size_t>(c_.drafters), 0);
  for (int i : order) {
    const int d = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    sp.seqs[static_cast<size_t>(i)].drafter = d;
    load[static_cast<size_t>(d)] += sp.seqs[static_cast<size_t>(i)].work();
  }
  sp.by_drafter.assign(static_cast<size_t>(c_.drafters), {});
  for (int i = 0; i < static_cast<int>(sp.seqs.size()); ++i)
    sp.by_drafter[static_cast<size_t>(sp.seqs[static_cast<size_t>(i)].drafter)].push_back(i);
  return sp;
}

std::shared_ptr<const StepPlan> PlanBook::get(int64_t step) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = plans_.find(step);
  if (it != plans_.end()) return it->second;
  auto p = std::make_shared<const StepPlan>(planner_.plan(step));
  plans_.emplace(step, p);
  // workers are never more than a few steps apart (bounded queues): keep a window
  while (plans_.size() > 16) plans_.erase(plans_.begin());
  return p;
}

int64_t count_trainable_samples(const Dataset& data, int64_t max_length) {
  int64_t n = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    SampleView s = data.get(i);
    size_t S = s.loss_mask.size();
    if (max_length > 0) S = std::min(S, static_cast<size_t>(max_length));
    for (size_t a = 0; a + 1 < S; ++a)
      if (s.loss_mask[a] && s.loss_mask[a + 1]) {
        ++n;
        break;
      }
  }
  return n;
}

}  // namespace dflash
