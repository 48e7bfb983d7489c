// core/job_control.h — the shared fault and shutdown state of a multi-threaded job (the training pipeline): the
// first failure wins and is kept with the name of the worker that raised it; every blocking wait of the job polls
// it, so no thread waits forever on a peer that has died.
// defines: JobControl, JobAborted, kPollInterval
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

}  // namespace dflash
