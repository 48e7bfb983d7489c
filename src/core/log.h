// core/log.h — messages to stderr and a progress display.
// defines: log_info, log_warn, Progress
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/error.h"

namespace dflash {

void log_line(const char* level, const std::string& msg);  // thread safe, one line, to stderr
template <class... Ts> void log_info(const Ts&... p) { log_line("info", cat(p...)); }
template <class... Ts> void log_warn(const Ts&... p) { log_line("warn", cat(p...)); }

// A progress display. On a terminal (stderr is a tty) it redraws one line at most 10 times a second;
// otherwise it prints a plain line every `plain_interval_s` seconds and once at finish() — unless the last line
// printed already shows the final count and suffix (so a run that stops right after a printed line, e.g. on SIGINT,
// does not print that line twice). Thread safe.
// Shows done/total, percent, rate in `unit`/s, the elapsed time, an ETA and a caller-supplied suffix.
class Progress {
 public:
  Progress(std::string label, int64_t total, std::string unit, double plain_interval_s = 10.0);
  ~Progress();
  // Sets the absolute count; `suffix` is shown after the counters (e.g. "loss 2.31 | 12.3 MB/s").
  void update(int64_t done, const std::string& suffix = "");
  // Changes the total (e.g. a training step count revised to fit a time budget); shown from the next line on.
  void set_total(int64_t total);
  void finish(const std::string& suffix = "");
  double elapsed_s() const;

 private:
  void draw(bool final_line);
  std::string label_, unit_, suffix_;
  int64_t total_, done_ = 0;
  int64_t drawn_done_ = -1;  // done_ and suffix_ of the last line drawn (drawn_done_ -1: none yet)
  std::string drawn_suffix_;
  double plain_interval_s_;
  bool tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mu_;
};

}  // namespace dflash
