// train/target_worker.cpp — TargetWorker and FaultPlan.
#include "train/target_worker.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
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
  DFLASH_CHECK(f.kind == "target" || f.kind == "stage" || f.kind == "drafter" || f.kind == "checkpoint",
               "--inject-fault '", spec, "': KIND is target, stage, drafter or checkpoint");
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

// A bounded queue of micro-batches from stage s - 1 to stage s. Each holds a complete state (its producer waited for
// its device), so the consumer copies it without an event; an empty `job` ends the stream.
namespace {
struct MicroBatch {
  std::optional<Job> job;
  Tensor ids;
  Target::StageState state;
};
class Channel {
 public:
  Channel(int capacity, JobControl* control) : cap_(static_cast<size_t>(capacity)), control_(control) {}
  void push(MicroBatch m) {
    std::unique_lock<std::mutex> lk(mu_);
    while (q_.size() >= cap_) wait(lk);
    q_.push_back(std::move(m));
    cv_.notify_all();
  }
  MicroBatch pop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (q_.empty()) wait(lk);
    MicroBatch m = std::move(q_.front());
    q_.pop_front();
    cv_.notify_all();
    return m;
  }

 private:
  void wait(std::unique_lock<std::mutex>& lk) {
    if (control_) {
      control_->check();
      if (control_->shutting_down()) throw JobAborted("shutting down");
    }
    cv_.wait_for(lk, kPollInterval);
  }
  size_t cap_;
  JobControl* control_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<MicroBatch> q_;
};
}  // namespace

struct TargetWorker::Pipe {
  std::vector<std::unique_ptr<Channel>> into;  // into[s]: to stage s (s >= 1)
};

TargetWorker::TargetWorker(int index, std::string name, std::unique_ptr<Context> ctx, std::shared_ptr<const Target> target,
                           std::vector<int64_t> layer_ids, bool final_hidden, const std::vector<FeatureQueue*>& queues)
    : index_(index), name_(std::move(name)), layer_ids_(std::move(layer_ids)), final_hidden_(final_hidden),
      queues_(queues) {
  ctxs_.push_back(std::move(ctx));
  targets_.push_back(std::move(target));
  for (FeatureQueue* q : queues_) {
    ready_.emplace_back();
    for (int s = 0; s < q->capacity(); ++s) ready_.back().push_back(ctxs_[0]->create_event());
  }
}

TargetWorker::TargetWorker(int index, std::string name, std::vector<std::unique_ptr<Context>> ctxs,
                           std::vector<std::shared_ptr<const Target>> stages, std::vector<int64_t> layer_ids,
                           bool final_hidden, const std::vector<FeatureQueue*>& queues, JobControl& control, int depth)
    : index_(index), name_(std::move(name)), ctxs_(std::move(ctxs)), targets_(std::move(stages)),
      layer_ids_(std::move(layer_ids)), final_hidden_(final_hidden), queues_(queues), control_(&control),
      depth_(std::max(1, depth)) {
  DFLASH_CHECK(!ctxs_.empty() && ctxs_.size() == targets_.size(), name_, ": ", ctxs_.size(), " contexts for ",
               targets_.size(), " stages");
  int64_t last = -1;
  for (int64_t l : layer_ids_) last = std::max(last, l);
  const int64_t need = final_hidden_ ? targets_[0]->config().num_hidden_layers - 1 : last;
  for (size_t s = 0; s < targets_.size(); ++s) {
    DFLASH_CHECK(s == 0 ? targets_[s]->stage().first == 0 : targets_[s]->stage().first == targets_[s - 1]->stage().end,
                 name_, ": stage ", s, " starts at layer ", targets_[s]->stage().first, ", not where stage ", s - 1,
                 " ends");
    if (targets_[s]->stage().holds(need)) last_stage_ = static_cast<int>(s);
  }
  for (FeatureQueue* q : queues_) {
    ready_.emplace_back();
    for (int s = 0; s < q->capacity(); ++s) ready_.back().push_back(ctxs_[static_cast<size_t>(last_stage_)]->create_event());
  }
  pipe_ = std::make_unique<Pipe>();
  for (int s = 0; s <= last_stage_; ++s)
    pipe_->into.push_back(s == 0 ? nullptr : std::make_unique<Channel>(depth_, control_));
}

TargetWorker::~TargetWorker() = default;

Target::Output TargetWorker::forward_all(const Tensor& ids) {
  if (targets_.size() == 1) return targets_[0]->forward(*ctxs_[0], ids, layer_ids_, final_hidden_);
  Target::Output out;
  Target::StageState st;
  for (int s = 0; s <= last_stage_; ++s) {
    Context& c = *ctxs_[static_cast<size_t>(s)];
    Target::StageState next = targets_[static_cast<size_t>(s)]->forward_stage(
        c, ids, s == 0 ? nullptr : &st, layer_ids_, final_hidden_, &out.final_hidden);
    c.synchronize();
    st = std::move(next);
  }
  out.features = st.features;
  return out;
}

void TargetWorker::warm_up() {
  const int64_t T = 8;
  std::vector<int32_t> ids(T);
  for (int64_t i = 0; i < T; ++i) ids[i] = static_cast<int32_t>(i);
  Target::Output out = forward_all(cpu_tensor_i32(ids, {T}));
  Context& c = *ctxs_[static_cast<size_t>(last_stage_)];
  WorkerClock dummy;
  for (FeatureQueue* q : queues_) {
    FeaturePacket& p = q->reserve(0, dummy);
    c.copy(p.features.slice(0, T), out.features);
    if (final_hidden_) c.copy(p.final_hidden.slice(0, T), out.final_hidden);
  }
  for (auto& x : ctxs_) x->synchronize();
}

void TargetWorker::deliver(Context& ctx, const Job& job, const Tensor& features, const Tensor& final_hidden) {
  const SeqPlan& sq = job.plan->seqs[static_cast<size_t>(job.seq)];
  FeatureQueue& q = *queues_[static_cast<size_t>(job.drafter)];
  FeaturePacket& slot = q.reserve(job.ticket, clock);  // backpressure: waits while the drafter is behind
  const int64_t S = sq.batch.S;
  ctx.wait(*slot.free);  // the drafter's last read of this slot
  ctx.copy(slot.features.slice(0, S), features);
  if (final_hidden_) ctx.copy(slot.final_hidden.slice(0, S), final_hidden);
  Event& ready = *ready_[static_cast<size_t>(job.drafter)][static_cast<size_t>(job.ticket % q.capacity())];
  ctx.record(ready);
  ctx.host_wait(ready);  // busy time = device time (and the packet is complete when published)
  q.publish(job.ticket, &ready, job.plan, job.seq);
}

// Stage s >= 1 of a split worker: micro-batches from stage s - 1, on to stage s + 1 or into the drafter's packet.
void TargetWorker::stage_loop(int s, const FaultPlan* fault) {
  Channel& in = *pipe_->into[static_cast<size_t>(s)];
  Context& c = *ctxs_[static_cast<size_t>(s)];
  const Target& t = *targets_[static_cast<size_t>(s)];
  for (;;) {
    MicroBatch m = in.pop();
    if (!m.job) {
      if (s < last_stage_) pipe_->into[static_cast<size_t>(s) + 1]->push(std::move(m));
      return;
    }
    if (fault) fault->maybe_throw("stage", s, m.job->plan->step);
    Tensor final_hidden;
    Target::StageState next = t.forward_stage(c, m.ids, &m.state, layer_ids_, final_hidden_, &final_hidden);
    c.synchronize();  // the copy of m.state is done (its memory goes back to stage s - 1's pool) and next is complete
    if (s < last_stage_) {
      pipe_->into[static_cast<size_t>(s) + 1]->push({std::move(m.job), m.ids, std::move(next)});
    } else {
      deliver(c, *m.job, next.features, final_hidden);
    }
  }
}

void TargetWorker::run(JobSource& jobs, const FaultPlan* fault) {
  using clock_t = std::chrono::steady_clock;
  std::vector<std::thread> threads;
  std::atomic<bool> stage_failed{false};
  for (int s = 1; s <= last_stage_; ++s)
    threads.emplace_back([this, s, fault, &stage_failed] {
      try {
        stage_loop(s, fault);
      } catch (const JobAborted&) {
        // another worker failed first, or the job is ending
      } catch (const std::exception& e) {
        stage_failed = true;
        control_->fail(cat(name_, " stage ", s), e.what());
      }
    });
  auto join_all = [&] {
    for (auto& th : threads) th.join();
  };
  try {
    for (;;) {
      auto t0 = clock_t::now();
      clock.waiting_on = kWaitJobs;
      std::optional<Job> job = jobs.next();
      clock.waiting_on = kWaitNone;
      clock.add_wait(clock_t::now() - t0);
      if (!job) {
        if (last_stage_ > 0) pipe_->into[1]->push({std::nullopt, Tensor(), {}});
        break;
      }
      if (stage_failed) break;
      const SeqPlan& sq = job->plan->seqs[static_cast<size_t>(job->seq)];
      if (fault) fault->maybe_throw("target", index_, job->plan->step);
      if (targets_.size() == 1) queues_[static_cast<size_t>(job->drafter)]->reserve(job->ticket, clock);  // backpressure
      t0 = clock_t::now();
      const int64_t S = sq.batch.S;
      Tensor ids = cpu_tensor_i32(std::vector<int32_t>(sq.tokens.begin(), sq.tokens.end()), {S});
      if (targets_.size() == 1) {
        Target::Output out = targets_[0]->forward(*ctxs_[0], ids, layer_ids_, final_hidden_);
        deliver(*ctxs_[0], *job, out.features, out.final_hidden);
      } else {
        Tensor final_hidden;
        Target::StageState st = targets_[0]->forward_stage(*ctxs_[0], ids, nullptr, layer_ids_, final_hidden_,
                                                            &final_hidden);
        ctxs_[0]->synchronize();
        if (last_stage_ == 0) deliver(*ctxs_[0], *job, st.features, final_hidden);
        else pipe_->into[1]->push({std::move(job), ids, std::move(st)});
      }
      clock.add_busy(clock_t::now() - t0);
    }
  } catch (const JobAborted&) {
    join_all();  // the stage threads see the same failure or shutdown
    throw;
  } catch (const std::exception& e) {
    if (control_) control_->fail(name_, e.what());  // first: the stage threads stop waiting
    join_all();
    throw;
  }
  join_all();
}

}  // namespace dflash
