// core/log.cpp — see log.h.
#include "core/log.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>

namespace dflash {

namespace {
std::mutex g_log_mu;  // serialises stderr lines only; holds no other state
}

void log_line(const char* level, const std::string& msg) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lk(g_log_mu);
  std::fprintf(stderr, "[%s %s] %s\n", ts, level, msg.c_str());
}

Progress::Progress(std::string label, int64_t total, std::string unit, double plain_interval_s)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), plain_interval_s_(plain_interval_s) {
  tty_ = isatty(STDERR_FILENO) != 0;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  if (!finished_) finish();
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::set_total(int64_t total) {
  std::lock_guard<std::mutex> lk(mu_);
  total_ = total;
}

void Progress::update(int64_t done, const std::string& suffix) {
  std::lock_guard<std::mutex> lk(mu_);
  done_ = done;
  suffix_ = suffix;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  if (since >= (tty_ ? 0.1 : plain_interval_s_)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish(const std::string& suffix) {
  std::lock_guard<std::mutex> lk(mu_);
  if (finished_) return;
  finished_ = true;
  if (!suffix.empty()) suffix_ = suffix;
  // plain lines: the last one printed already shows the final count and suffix (a terminal line is redrawn in place)
  if (!tty_ && drawn_done_ == done_ && drawn_suffix_ == suffix_) return;
  draw(true);
}

void Progress::draw(bool final_line) {
  const double el = elapsed_s();
  const double rate = el > 0 ? done_ / el : 0.0;
  char buf[256];
  if (total_ > 0) {
    const double pct = 100.0 * static_cast<double>(done_) / static_cast<double>(total_);
    const double eta = rate > 0 ? (total_ - done_) / rate : 0.0;
    std::snprintf(buf, sizeof buf, "%s %lld/%lld (%5.1f%%) %.1f %s/s %.0fs eta %.0fs", label_.c_str(),
                  static_cast<long long>(done_), static_cast<long long>(total_), pct, rate, unit_.c_str(), el, eta);
  } else {
    std::snprintf(buf, sizeof buf, "%s %lld %.1f %s/s %.0fs", label_.c_str(), static_cast<long long>(done_), rate,
                  unit_.c_str(), el);
  }
  std::string line = buf;
  if (!suffix_.empty()) line += " | " + suffix_;
  drawn_done_ = done_;
  drawn_suffix_ = suffix_;
  std::lock_guard<std::mutex> lk(g_log_mu);
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace dflash
