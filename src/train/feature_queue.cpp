// train/feature_queue.cpp — FeatureQueue and JobSource.
#include "train/feature_queue.h"

#include <algorithm>

namespace dflash {

const char* wait_reason_name(int r) {
  switch (r) {
    case kWaitQueueFull: return "queue full";
    case kWaitPackets: return "features";
    case kWaitCollective: return "all-reduce";
    case kWaitJobs: return "jobs";
    default: return "-";
  }
}

FeatureQueue::FeatureQueue(Context& dctx, int capacity, int64_t max_S, int64_t feature_dim, int64_t hidden,
                           bool final_hidden, JobControl& control)
    : control_(control), slots_(static_cast<size_t>(capacity)), published_(static_cast<size_t>(capacity), -1) {
  DFLASH_CHECK(capacity > 0, "feature queue: capacity must be > 0");
  for (auto& s : slots_) {
    s.features = dctx.empty(dctx.compute_dtype(), {max_S, feature_dim});
    if (final_hidden) s.final_hidden = dctx.empty(dctx.compute_dtype(), {max_S, hidden});
    s.free = dctx.create_event();
  }
}

FeaturePacket& FeatureQueue::reserve(int64_t ticket, WorkerClock& clock) {
  std::unique_lock<std::mutex> lk(mu_);
  if (ticket >= released_ + capacity()) {
    const auto t0 = std::chrono::steady_clock::now();
    clock.waiting_on = kWaitQueueFull;
    while (ticket >= released_ + capacity()) {
      control_.check();
      if (control_.shutting_down()) throw JobAborted("shutting down");
      cv_.wait_for(lk, kPollInterval);
    }
    clock.waiting_on = kWaitNone;
    clock.add_wait(std::chrono::steady_clock::now() - t0);
  }
  return slots_[static_cast<size_t>(ticket % capacity())];
}

void FeatureQueue::publish(int64_t ticket, const Event* ready, std::shared_ptr<const StepPlan> plan, int seq) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    FeaturePacket& p = slots_[static_cast<size_t>(ticket % capacity())];
    p.ready = ready;
    p.plan = std::move(plan);
    p.seq = seq;
    p.ticket = ticket;
    published_[static_cast<size_t>(ticket % capacity())] = ticket;
    ++depth_;
  }
  cv_.notify_all();
}

FeaturePacket& FeatureQueue::take(int64_t ticket, WorkerClock& clock) {
  std::unique_lock<std::mutex> lk(mu_);
  const size_t i = static_cast<size_t>(ticket % capacity());
  if (published_[i] != ticket) {
    const auto t0 = std::chrono::steady_clock::now();
    clock.waiting_on = kWaitPackets;
    while (published_[i] != ticket) {
      control_.check();
      cv_.wait_for(lk, kPollInterval);
    }
    clock.waiting_on = kWaitNone;
    clock.add_wait(std::chrono::steady_clock::now() - t0);
  }
  return slots_[i];
}

void FeatureQueue::release(int64_t ticket) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    DFLASH_CHECK(ticket == released_, "feature queue: release of ticket ", ticket, " out of order (next ", released_, ")");
    FeaturePacket& p = slots_[static_cast<size_t>(ticket % capacity())];
    p.plan.reset();
    published_[static_cast<size_t>(ticket % capacity())] = -1;
    ++released_;
    --depth_;
  }
  cv_.notify_all();
}

JobSource::JobSource(PlanBook& plans, int64_t first_step, int64_t end_step, int global_rank0, int local_drafters,
                     JobControl& control)
    : plans_(plans), control_(control), step_(first_step), end_(end_step), rank0_(global_rank0), n_(local_drafters),
      tickets_(static_cast<size_t>(local_drafters), 0) {}

std::optional<Job> JobSource::next() {
  std::lock_guard<std::mutex> lk(mu_);
  while (pending_.empty()) {
    if (step_ >= end_ || control_.shutting_down() || control_.failed()) return std::nullopt;
    auto plan = plans_.get(step_++);
    size_t longest = 0;
    for (int d = 0; d < n_; ++d) longest = std::max(longest, plan->by_drafter[static_cast<size_t>(rank0_ + d)].size());
    std::vector<Job> jobs;
    for (size_t i = 0; i < longest; ++i)
      for (int d = 0; d < n_; ++d) {
        const auto& mine = plan->by_drafter[static_cast<size_t>(rank0_ + d)];
        if (i < mine.size()) jobs.push_back({plan, mine[i], d, tickets_[static_cast<size_t>(d)]++});
      }
    pending_.assign(jobs.rbegin(), jobs.rend());
  }
  Job j = std::move(pending_.back());
  pending_.pop_back();
  return j;
}

}  // namespace dflash
