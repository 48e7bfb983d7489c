// train/feature_queue.h — the transport between target workers and drafter workers: per drafter, a bounded ring
// of feature packets in the DRAFTER's device memory (allocated once, in the warm-up: capacity x [max_S, nf*H]
// (+ [max_S, H] final hidden states with soft labels), so the memory is known at start), and the job list that
// tells target workers what to compute next.
// defines: FeaturePacket, FeatureQueue, Job, JobSource, WorkerClock
//
// Ordering (no host round trip for the data): a target worker reserves the packet slot of its job's ticket (it
// blocks while the drafter holds `capacity` unconsumed packets: backpressure), makes its stream wait on the slot's
// `free` event (the drafter's last read of the slot), copies its features into the slot on its own stream,
// records its own `ready` event and publishes. The drafter takes tickets in order, makes its stream wait on `ready`,
// reads, records `free` and releases. On the CPU the events are trivially complete. Every blocking wait polls
// the job's JobControl, so a failed worker never leaves another waiting forever.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/context.h"
#include "core/job_control.h"
#include "train/step_plan.h"

namespace dflash {

struct FeaturePacket {
  Tensor features;                   // [max_S, nf*H] act, on the drafter's device; rows [0, S) valid once ready
  Tensor final_hidden;               // [max_S, H] act (soft labels) or undefined
  std::unique_ptr<Event> free;       // recorded by the drafter (its context) after its last read
  const Event* ready = nullptr;      // recorded by the target worker that filled it (its context)
  std::shared_ptr<const StepPlan> plan;
  int seq = -1;                      // index into plan->seqs
  int64_t ticket = -1;
};

// Time a worker spent computing vs waiting, by reason (read by the metrics writer from another thread).
struct WorkerClock {
  std::atomic<int64_t> busy_ns{0}, wait_ns{0};
  std::atomic<int> waiting_on{0};  // 0 nothing, else a reason code (see wait_reason_name)
  void add_busy(std::chrono::steady_clock::duration d) { busy_ns += std::chrono::nanoseconds(d).count(); }
  void add_wait(std::chrono::steady_clock::duration d) { wait_ns += std::chrono::nanoseconds(d).count(); }
};
enum WaitReason : int { kWaitNone = 0, kWaitQueueFull = 1, kWaitPackets = 2, kWaitCollective = 3, kWaitJobs = 4 };
const char* wait_reason_name(int r);

class FeatureQueue {
 public:
  // Allocates `capacity` packets on the drafter's context `dctx` (single-threaded warm-up).
  FeatureQueue(Context& dctx, int capacity, int64_t max_S, int64_t feature_dim, int64_t hidden, bool final_hidden,
               JobControl& control);
  int capacity() const { return static_cast<int>(slots_.size()); }
  // Producer: blocks until ticket's slot is free (ticket < released + capacity). Returns the slot.
  FeaturePacket& reserve(int64_t ticket, WorkerClock& clock);
  // Producer: the slot of `ticket` is filled (ready recorded) for seq of plan.
  void publish(int64_t ticket, const Event* ready, std::shared_ptr<const StepPlan> plan, int seq);
  // Consumer: blocks until `ticket` (the next in order) is published.
  FeaturePacket& take(int64_t ticket, WorkerClock& clock);
  // Consumer: done with `ticket` (after recording its free event).
  void release(int64_t ticket);
  int depth() const { return depth_.load(); }  // published, not yet released
  void wake_all() { cv_.notify_all(); }

 private:
  JobControl& control_;
  std::vector<FeaturePacket> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t released_ = 0;                  // tickets < released_ are done
  std::vector<int64_t> published_;        // per slot: the ticket published there (-1 none)
  std::atomic<int> depth_{0};
};

// One target job: compute features of plan->seqs[seq] for drafter `drafter` (local index) under `ticket`.
struct Job {
  std::shared_ptr<const StepPlan> plan;
  int seq = -1;
  int drafter = -1;   // local drafter index
  int64_t ticket = -1;
};

// Hands out target jobs in a fixed order: step by step from `first_step`, within a step round-robin over the
// local drafters (each drafter's sequences in batch order), each drafter's tickets consecutive. Thread-safe.
class JobSource {
 public:
  JobSource(PlanBook& plans, int64_t first_step, int64_t end_step, int global_rank0, int local_drafters,
            JobControl& control);
  // The next job, or nullopt when all steps are handed out or the job is shutting down.
  std::optional<Job> next();

 private:
  PlanBook& plans_;
  JobControl& control_;
  std::mutex mu_;
  int64_t step_, end_;
  int rank0_, n_;
  std::vector<Job> pending_;  // this step's jobs not yet handed out (reversed)
  std::vector<int64_t> tickets_;
};

}  // namespace dflash
