// train/run_files.cpp — see run_files.h.
#include "train/run_files.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "core/log.h"
#include "train/checkpoint.h"  // kCheckpointTmpInfix

namespace dflash {

namespace fs = std::filesystem;

// ---- metrics.jsonl ----------------------------------------------------------------------------------------------

MetricsLog::MetricsLog(std::string path, int64_t keep_upto) : path_(std::move(path)) {
  std::string kept;
  if (keep_upto >= 0 && file_exists(path_)) {
    std::istringstream in(read_file(path_));
    std::string line;
    while (std::getline(in, line)) {
      try {
        const auto j = nlohmann::json::parse(line);
        if (j.value("step", int64_t{0}) <= keep_upto) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
        break;  // a torn last line
      }
    }
  }
  write_file_atomic(path_, kept);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  DFLASH_CHECK(fd_ >= 0, path_, ": cannot open for appending: ", std::strerror(errno));
  size_ = mark_ = static_cast<int64_t>(kept.size());
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::append(const nlohmann::json& row) {
  const std::string line = row.dump() + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : ENOSPC;
      if (::ftruncate(fd_, size_) != 0) log_warn(path_, ": cannot cut a partly written row: ", std::strerror(errno));
      DFLASH_FAIL(path_, ": cannot append the row of step ", row.value("step", int64_t{-1}), " (", line.size(),
                  " bytes): ", std::strerror(e));
    }
    done += static_cast<size_t>(w);
  }
  size_ += static_cast<int64_t>(line.size());
}

void MetricsLog::mark_checkpoint() { mark_ = size_; }

void MetricsLog::rollback_to_checkpoint() {
  if (size_ == mark_) return;
  if (::ftruncate(fd_, mark_) != 0) {
    log_warn(path_, ": cannot cut the rows after the last checkpoint: ", std::strerror(errno),
             " (a resume drops them)");
    return;
  }
  size_ = mark_;
}

// ---- temporaries of an interrupted write -------------------------------------------------------------------------

std::vector<RemovedTemporary> remove_run_temporaries(const std::string& out_dir) {
  // The writers' naming: save_checkpoint "<dir>.tmp-<pid>", write_file_atomic "<file>.tmp.<pid>",
  // export_drafter "<dir>.tmp-<pid>" and "<dir>.old-<pid>".
  static const std::regex ckpt_tmp(std::string("step-[0-9]{8}") + kCheckpointTmpInfix + "[0-9]+");
  static const std::regex latest_tmp("LATEST\\.tmp\\.[0-9]+");
  static const std::regex top_tmp("(metrics\\.jsonl|profile\\.txt)\\.tmp\\.[0-9]+|export\\.tmp-[0-9]+");
  static const std::regex export_old("export\\.old-[0-9]+");
  std::vector<std::string> found;
  auto scan = [&](const std::string& dir, const std::vector<const std::regex*>& patterns) {
    std::error_code ec;
    if (!dir_exists(dir)) return;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string n = e.path().filename().string();
      for (const std::regex* p : patterns)
        if (std::regex_match(n, *p)) found.push_back(path_join(dir, n));
    }
    DFLASH_CHECK(!ec, dir, ": cannot list: ", ec.message());
  };
  scan(path_join(out_dir, "checkpoints"), {&ckpt_tmp, &latest_tmp});
  scan(out_dir, {&top_tmp});
  if (dir_exists(path_join(out_dir, "export"))) scan(out_dir, {&export_old});
  // `dflash export --out <run>/export` writes the export's temporaries too, without the run's lock: those of a
  // process still running on this host stay
  std::erase_if(found, [](const std::string& p) {
    const std::string n = fs::path(p).filename().string();
    if (n.rfind("export.", 0) != 0) return false;
    const pid_t pid = static_cast<pid_t>(std::atoll(n.c_str() + n.find('-') + 1));
    return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
  });
  std::sort(found.begin(), found.end());
  std::vector<RemovedTemporary> removed;
  for (const std::string& p : found) {
    RemovedTemporary r{p, tree_size(p)};
    std::error_code ec;
    fs::remove_all(p, ec);
    DFLASH_CHECK(!ec, p, ": cannot remove the temporary of an interrupted write: ", ec.message());
    removed.push_back(std::move(r));
  }
  if (!removed.empty()) fsync_dir(out_dir);
  return removed;
}

// ---- disk space ----------------------------------------------------------------------------------------------------

int64_t drafter_param_count(const DrafterConfig& dc, int64_t* tensors) {
  const int64_t H = dc.hidden_size, I = dc.intermediate_size, d = dc.head_dim;
  const int64_t q = dc.num_heads * d, kv = dc.num_kv_heads * d;
  // fc, hidden_norm, per layer: 2 norms, q/k/v/o, q_norm/k_norm, gate/up/down; the final norm
  int64_t per_layer = 2 * H + q * H + 2 * kv * H + H * q + 2 * d + 3 * I * H;
  int64_t n_tensors = 2 + 11 * dc.num_layers + 1, extra = 0;
  if (dc.arch == DraftArch::DFlash2) {
    // per layer: attention_conv and mlp_conv, each base_kernel [2, taps, H] + kernel_projection [coefficients, H];
    // the candidate selector: hidden_projection [r, H], predecessor and successor codebooks [V, r]
    per_layer += 2 * (2 * dc.conv_kernel_size * H + dc.conv_coefficients() * H);
    n_tensors += 4 * dc.num_layers + 3;
    extra = dc.selector_rank * H + 2 * dc.vocab_size * dc.selector_rank;
  }
  if (tensors) *tensors = n_tensors;
  return H * dc.nf() * H + H + dc.num_layers * per_layer + H + extra;
}

int64_t checkpoint_bytes_estimate(const DrafterConfig& dc) {
  int64_t tensors = 0;
  const int64_t n = drafter_param_count(dc, &tensors);
  // masters + m + v in F32; a header entry of at most ~160 bytes per tensor; state.json (the config, the data
  // manifest) well under 256 KiB
  return 12 * n + 3 * tensors * 160 + (256 << 10);
}

std::string RunSpace::describe(const std::string& out_dir, int64_t keep) const {
  return cat("up to ", held_at_peak, " checkpoint", held_at_peak == 1 ? "" : "s", " of about ",
             format_bytes(checkpoint_bytes),
             keep > 0 ? cat(" (--keep-checkpoints ", keep, " and the one being written)") : std::string(" (all kept)"),
             export_bytes > 0 ? cat(" and an export of ", format_bytes(export_bytes)) : std::string(),
             existing > 0 ? cat(", ", existing, " of them there already") : std::string(), ": about ",
             format_bytes(need), " more, ", free >= 0 ? format_bytes(free) : std::string("an unknown amount"),
             " free on the file system of ", out_dir);
}

RunSpace plan_run_space(const std::string& out_dir, const DrafterConfig& dc, int64_t keep, int64_t checkpoint_every,
                        int64_t start, int64_t total, bool export_at_end) {
  RunSpace s;
  s.checkpoint_bytes = checkpoint_bytes_estimate(dc);
  s.export_bytes = export_at_end ? 2 * drafter_param_count(dc) + (256 << 10) : 0;
  const std::string root = path_join(out_dir, "checkpoints");
  if (dir_exists(root)) {
    std::error_code ec;
    static const std::regex done("step-[0-9]{8}");
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.is_directory() && std::regex_match(e.path().filename().string(), done)) ++s.existing;
  }
  int64_t planned = start < total ? 1 : 0;  // the last step's checkpoint
  if (checkpoint_every > 0 && start < total)
    planned = total / checkpoint_every - start / checkpoint_every + (total % checkpoint_every != 0 ? 1 : 0);
  const int64_t all = s.existing + planned;
  s.held_at_peak = keep > 0 ? std::min(keep, std::max<int64_t>(all - 1, 0)) + (planned > 0 ? 1 : 0) : all;
  const int64_t held_at_end = keep > 0 ? std::min(keep, all) : all;
  s.need = std::max(s.held_at_peak * s.checkpoint_bytes, held_at_end * s.checkpoint_bytes + s.export_bytes) -
           s.existing * s.checkpoint_bytes;
  s.need = std::max<int64_t>(s.need, 0);
  s.free = free_bytes(dir_exists(out_dir) ? out_dir : ".");
  return s;
}

}  // namespace dflash
