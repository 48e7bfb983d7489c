// core/job_control.h — the shared fault and shutdown state of a multi-threaded job (the training pipeline): the
// first failure wins and is kept with the name of the worker that raised it; every blocking wait of the job polls
// it, so no thread waits forever on a peer that has died. And what a signal does to a run: SIGINT / SIGTERM ask it to
// stop after the current step (StopOnSignals), which then writes a checkpoint and ends with exit status 130.
// defines: JobControl, JobAborted, kPollInterval, StopOnSignals
#pragma once
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

#include "core/error.h"

namespace dflash {

// Thrown by a wait that gave up because another worker failed (the job's first error is elsewhere).
class JobAborted : public Error {
 public:
  using Error::Error;
};

inline constexpr std::chrono::milliseconds kPollInterval{20};

class JobControl {
 public:
  // Records the first failure (`who`: a worker name such as "drafter 1 (cuda:6)"); later ones are ignored.
  void fail(const std::string& who, const std::string& message) {
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_.load()) return;
    who_ = who;
    message_ = message;
    failed_.store(true);
  }
  bool failed() const { return failed_.load(); }
  std::string who() const {
    std::lock_guard<std::mutex> lk(mu_);
    return who_;
  }
  std::string message() const {
    std::lock_guard<std::mutex> lk(mu_);
    return message_;
  }
  // Throws JobAborted when the job has failed: call inside every wait loop.
  void check() const {
    if (failed_.load()) throw JobAborted(cat("aborted: ", who(), " failed"));
  }
  // A normal end: producers stop handing out work, waits for work return.
  void shut_down() { shutdown_.store(true); }
  bool shutting_down() const { return shutdown_.load(); }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> failed_{false}, shutdown_{false};
  std::string who_, message_;
};

// While it lives, SIGINT and SIGTERM set a flag (flag(), for train()'s `stop`) instead of ending the process; the
// previous handlers come back when it is destroyed, so a command installs it around the part that can stop cleanly
// (the training loop) and keeps the default elsewhere. It also ignores SIGXFSZ meanwhile: a file-size limit
// (ulimit -f) then fails the write with EFBIG, reported with the file's path and the bytes needed, instead of
// killing the process mid-write. Signal dispositions are process-wide: at most one instance at a time (Error).
class StopOnSignals {
 public:
  StopOnSignals();
  ~StopOnSignals();
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;
  const std::atomic<bool>* flag() const;
  bool stopped() const { return flag()->load(); }
};

}  // namespace dflash
