#include "core/thread_pool.h"

#include <algorithm>

namespace dflash {

ThreadPool::ThreadPool(int threads) {
  nthreads_ = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < nthreads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* job = job_;
    for (;;) {
      if (next_ >= job_n_) break;
      const int64_t b = next_;
      const int64_t e = std::min(job_n_, b + job_chunk_);
      next_ = e;
      lk.unlock();
      try {
        (*job)(b, e);
      } catch (...) {
        lk.lock();
        if (!error_) error_ = std::current_exception();
        continue;
      }
      lk.lock();
    }
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (nthreads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  const int64_t chunks_wanted = static_cast<int64_t>(nthreads_) * 4;
  const int64_t chunk = std::max(grain, (n + chunks_wanted - 1) / chunks_wanted);
  std::unique_lock<std::mutex> lk(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_ = 0;
  error_ = nullptr;
  pending_ = nthreads_ - 1;
  ++generation_;
  cv_.notify_all();
  // The caller works too.
  for (;;) {
    if (next_ >= job_n_) break;
    const int64_t b = next_;
    const int64_t e = std::min(job_n_, b + job_chunk_);
    next_ = e;
    lk.unlock();
    try {
      fn(b, e);
    } catch (...) {
      lk.lock();
      if (!error_) error_ = std::current_exception();
      continue;
    }
    lk.lock();
  }
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace dflash
