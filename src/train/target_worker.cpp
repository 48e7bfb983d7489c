// train/target_worker.cpp — TargetWorker and FaultPlan.
#include "train/target_worker.h"

#include <chrono>
#include <thread>

#include "core/log.h"

namespace dflash {

FaultPlan FaultPlan::parse(const std::string& spec) {
  FaultPlan f;
  if (spec.empty()) return f;
  const size_t a = spec.find(':'), b = spec.find(':', a == std::string::npos ? a : a + 1);
  DFLASH_CHECK(a != std::string::npos && b != std::string::npos, "--inject-fault '", spec,
               "': expected KIND:INDEX:STEP, e.g. drafter:1:3");
  f.kind = spec.substr(0, a);
  DFLASH_CHECK(f.kind == "target" || f.kind == "drafter" || f.kind == "checkpoint", "--inject-fault '", spec,
               "': KIND is target, drafter or checkpoint");
  f.index = std::stoi(spec.substr(a + 1, b - a - 1));
  f.step = std::stoll(spec.substr(b + 1));
  return f;
}

void FaultPlan::maybe_throw(const char* k, int i, int64_t s) const {
  if (index >= 0 && kind == k && index == i && s >= step)
    DFLASH_FAIL("injected fault (--inject-fault ", kind, ":", index, ":", step, ")");
}

void FaultPlan::maybe_stall_checkpoint(int64_t s, const std::string& file) const {
  if (kind != "checkpoint" || s != step || file.size() < 18 || file.substr(file.size() - 18) != "params.safetensors")
    return;
  log_warn("injected fault (--inject-fault checkpoint:", index, ":", step, "): the checkpoint write stalls in ", file);
  std::this_thread::sleep_for(std::chrono::seconds(600));
  DFLASH_FAIL("injected fault (--inject-fault checkpoint:", index, ":", step, "): nobody killed the stalled write");
}

TargetWorker::TargetWorker(int index, std::string name, std::unique_ptr<Context> ctx, std::shared_ptr<const Target> target,
                           std::vector<int64_t> layer_ids, bool final_hidden, const std::vector<FeatureQueue*>& queues)
    : index_(index), name_(std::move(name)), ctx_(std::move(ctx)), target_(std::move(target)), layer_ids_(std::move(layer_ids)),
      final_hidden_(final_hidden), queues_(queues) {
  for (FeatureQueue* q : queues_) {
    ready_.emplace_back();
    for (int s = 0; s < q->capacity(); ++s) ready_.back().push_back(ctx_->create_event());
  }
}

void TargetWorker::warm_up() {
  const int64_t T = 8;
  std::vector<int32_t> ids(T);
  for (int64_t i = 0; i < T; ++i) ids[i] = static_cast<int32_t>(i);
  Target::Output out = target_->forward(*ctx_, cpu_tensor_i32(ids, {T}), layer_ids_, final_hidden_);
  WorkerClock dummy;
  for (FeatureQueue* q : queues_) {
    FeaturePacket& p = q->reserve(0, dummy);
    ctx_->copy(p.features.slice(0, T), out.features);
    if (final_hidden_) ctx_->copy(p.final_hidden.slice(0, T), out.final_hidden);
  }
  ctx_->synchronize();
}

void TargetWorker::run(JobSource& jobs, const FaultPlan* fault) {
  using clock_t = std::chrono::steady_clock;
  for (;;) {
    auto t0 = clock_t::now();
    clock.waiting_on = kWaitJobs;
    std::optional<Job> job = jobs.next();
    clock.waiting_on = kWaitNone;
    clock.add_wait(clock_t::now() - t0);
    if (!job) return;
    const SeqPlan& sq = job->plan->seqs[static_cast<size_t>(job->seq)];
    if (fault) fault->maybe_throw("target", index_, job->plan->step);
    FeatureQueue& q = *queues_[static_cast<size_t>(job->drafter)];
    FeaturePacket& slot = q.reserve(job->ticket, clock);  // backpressure: waits while the drafter is behind
    t0 = clock_t::now();
    const int64_t S = sq.batch.S;
    Tensor ids = cpu_tensor_i32(std::vector<int32_t>(sq.tokens.begin(), sq.tokens.end()), {S});
    Target::Output out = target_->forward(*ctx_, ids, layer_ids_, final_hidden_);
    ctx_->wait(*slot.free);  // the drafter's last read of this slot
    ctx_->copy(slot.features.slice(0, S), out.features);
    if (final_hidden_) ctx_->copy(slot.final_hidden.slice(0, S), out.final_hidden);
    Event& ready = *ready_[static_cast<size_t>(job->drafter)][static_cast<size_t>(job->ticket % q.capacity())];
    ctx_->record(ready);
    ctx_->host_wait(ready);  // busy time = device time (and the packet is complete when published)
    clock.add_busy(clock_t::now() - t0);
    q.publish(job->ticket, &ready, job->plan, job->seq);
  }
}

}  // namespace dflash
