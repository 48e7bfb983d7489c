// core/job_control.cpp — StopOnSignals (see job_control.h): the only process-wide state of the project, since
// signal dispositions are process-wide; written by the signal handler, read by the training loop.
#include "core/job_control.h"

#include <csignal>

namespace dflash {

namespace {
std::atomic<bool> g_stop{false};
std::atomic<bool> g_installed{false};
struct sigaction g_prev_int, g_prev_term, g_prev_xfsz;
extern "C" void on_stop_signal(int) { g_stop.store(true); }
}  // namespace

StopOnSignals::StopOnSignals() {
  DFLASH_CHECK(!g_installed.exchange(true), "StopOnSignals: already installed in this process");
  g_stop.store(false);
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_prev_int);
  sigaction(SIGTERM, &sa, &g_prev_term);
  struct sigaction ign{};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGXFSZ, &ign, &g_prev_xfsz);
}

StopOnSignals::~StopOnSignals() {
  sigaction(SIGINT, &g_prev_int, nullptr);
  sigaction(SIGTERM, &g_prev_term, nullptr);
  sigaction(SIGXFSZ, &g_prev_xfsz, nullptr);
  g_installed.store(false);
}

const std::atomic<bool>* StopOnSignals::flag() const { return &g_stop; }

}  // namespace dflash
