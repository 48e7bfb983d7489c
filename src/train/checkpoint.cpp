// train/checkpoint.cpp — see checkpoint.h.
#include "train/checkpoint.h"

#include <fcntl.h>   // AT_FDCWD
#include <stdio.h>   // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/fs.h"
#include "io/safetensors.h"

namespace dflash {

namespace fs = std::filesystem;

namespace {
// Elements [begin, begin + n) of a contiguous tensor, as a 1-D view.
Tensor flat_range(const Tensor& t, int64_t begin, int64_t n) {
  DFLASH_CHECK(begin >= 0 && begin + n <= t.numel(), "checkpoint: elements [", begin, ", ", begin + n, ") of a tensor of ",
               t.numel());
  Tensor v = t;
  v.shape = {n};
  v.data = static_cast<char*>(t.data) + static_cast<size_t>(begin) * dtype_size(t.dtype);
  return v;
}
// The host tensor of p's shape: from a flat host buffer when given, else from the device tensor, else zeros.
Tensor host_state(Context& ctx, const Param& p, const Tensor& flat, const Tensor& own) {
  if (flat.defined()) {
    DFLASH_CHECK(p.flat_offset >= 0, "checkpoint: ", p.name, " has no flat offset (ParamSet not flattened)");
    return cpu_clone(flat_range(flat, p.flat_offset, p.master.numel()).reshape(p.shape));
  }
  if (own.defined()) return ctx.to_host(own, false);
  return cpu_zeros(p.master.dtype, p.shape);
}
}  // namespace

// Puts the complete directory `tmp` in place as `dir`. A step saved again (a fault checkpoint of the step a run resumed
// at, a finished run resumed) replaces its directory in one step: renameat2's RENAME_EXCHANGE swaps the two names
// atomically, so that `dir` (which LATEST may name) holds the old or the new checkpoint at every moment, never
// neither; `tmp` then holds the old one and goes (a crash before that leaves a temporary that resume removes). A file
// system without the exchange (EINVAL, ENOSYS) takes the old directory away first, the window in which a crash
// leaves `dir` missing.
namespace {
void publish_dir(const std::string& tmp, const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir)) {
    fs::rename(tmp, dir, ec);
    DFLASH_CHECK(!ec, dir, ": cannot publish checkpoint: ", ec.message());
    return;
  }
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);
    return;
  }
  const int err = errno;
  DFLASH_CHECK(err == EINVAL || err == ENOSYS, dir, ": cannot publish checkpoint: ", std::strerror(err));
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  DFLASH_CHECK(!ec, dir, ": cannot publish checkpoint: ", ec.message());
}
}  // namespace

std::string save_checkpoint(Context& ctx, const std::string& out_dir, const ParamSet& ps, const CheckpointState& st,
                            const FlatState& flat, const std::function<void(const std::string&)>& after_file) {
  const std::string root = path_join(out_dir, "checkpoints");
  make_dirs(root);
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(st.step));
  const std::string dir = path_join(root, name);
  const std::string tmp = cat(dir, kCheckpointTmpInfix, getpid());
  fs::remove_all(tmp);
  std::vector<std::pair<std::string, Tensor>> params, optim;
  for (const auto& p : ps.all()) {
    params.emplace_back(p.name, host_state(ctx, p, flat.master, p.master));
    optim.emplace_back("m." + p.name, host_state(ctx, p, flat.m, p.m));
    optim.emplace_back("v." + p.name, host_state(ctx, p, flat.v, p.v));
  }
  nlohmann::json j = st.info;
  j["step"] = st.step;
  const std::string state = j.dump(2) + "\n";
  try {
    make_dirs(tmp);
    write_safetensors(path_join(tmp, "params.safetensors"), params);
    if (after_file) after_file(path_join(tmp, "params.safetensors"));
    write_safetensors(path_join(tmp, "optim.safetensors"), optim);
    if (after_file) after_file(path_join(tmp, "optim.safetensors"));
    write_file_atomic(path_join(tmp, "state.json"), state);
  } catch (const Error& e) {
    // Nothing of this checkpoint stays: its temporary directory goes (it may fill what is left of the disk), the
    // earlier checkpoints and LATEST were never touched.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    int64_t need = static_cast<int64_t>(state.size());
    for (const auto* v : {&params, &optim})
      for (const auto& [n, t] : *v) need += static_cast<int64_t>(t.nbytes() + n.size() + 64);  // data + header
    const int64_t free = free_bytes(root);
    const std::string prev = latest_checkpoint(out_dir);
    DFLASH_FAIL("checkpoint of step ", st.step, ": ", e.what(), "; the checkpoint needs about ", format_bytes(need),
                " (", need, " bytes) in ", root, ", ", free >= 0 ? format_bytes(free) : std::string("an unknown amount"),
                " free there. ", prev.empty() ? std::string("There is no earlier checkpoint") :
                cat("The previous checkpoint ", prev, " is intact (continue from it with --resume once there is room)"));
  }
  publish_dir(tmp, dir);
  fsync_dir(root);
  write_file_atomic(path_join(root, "LATEST"), std::string(name) + "\n");
  return dir;
}

std::string latest_checkpoint(const std::string& out_dir) {
  const std::string root = path_join(out_dir, "checkpoints");
  const std::string latest = path_join(root, "LATEST");
  if (!file_exists(latest)) return "";
  std::string name = read_file(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const std::string dir = path_join(root, name);
  DFLASH_CHECK(file_exists(path_join(dir, "state.json")), latest, " names ", name, " but ", dir,
               "/state.json does not exist");
  return dir;
}

CheckpointState load_checkpoint(Context& ctx, const std::string& dir, ParamSet& ps, OptimShard* shard) {
  const std::string sp = path_join(dir, "state.json");
  CheckpointState st;
  try {
    st.info = nlohmann::json::parse(read_file(sp));
    st.step = st.info.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    DFLASH_FAIL(sp, ": ", e.what());
  }
  WeightStore pw = WeightStore::open(path_join(dir, "params.safetensors"));
  WeightStore ow = WeightStore::open(path_join(dir, "optim.safetensors"));
  if (shard) {
    ctx.zero(shard->m);
    ctx.zero(shard->v);
  } else {
    ps.init_moments(ctx);
  }
  for (auto& p : ps.all()) {
    DFLASH_CHECK(pw.has(p.name), dir, "/params.safetensors: missing ", p.name);
    DFLASH_CHECK(pw.info(p.name).shape == p.shape, dir, ": ", p.name, " has shape ", shape_str(pw.info(p.name).shape),
                 ", the drafter expects ", shape_str(p.shape));
    for (const char* k : {"m.", "v."})
      DFLASH_CHECK(ow.has(k + p.name) && ow.info(k + p.name).shape == p.shape, dir, "/optim.safetensors: ",
                   k + p.name, ow.has(k + p.name) ? " has another shape" : " is missing");
    ctx.copy(p.master, pw.view(p.name));
    if (shard) {  // the part of this parameter inside the shard, if any
      DFLASH_CHECK(p.flat_offset >= 0, "load_checkpoint: the parameters are not flattened for the shard");
      const int64_t lo = std::max(shard->begin(), p.flat_offset);
      const int64_t hi = std::min(shard->end(), p.flat_offset + p.master.numel());
      if (lo < hi) {
        ctx.copy(shard->m.slice(lo - shard->begin(), hi - shard->begin()),
                 flat_range(ow.view("m." + p.name), lo - p.flat_offset, hi - lo));
        ctx.copy(shard->v.slice(lo - shard->begin(), hi - shard->begin()),
                 flat_range(ow.view("v." + p.name), lo - p.flat_offset, hi - lo));
      }
    } else {
      ctx.copy(p.m, ow.view("m." + p.name));
      ctx.copy(p.v, ow.view("v." + p.name));
    }
    ctx.zero(p.grad);
  }
  ps.sync_compute(ctx);
  ctx.synchronize();
  return st;
}

void prune_checkpoints(const std::string& out_dir, int64_t keep) {
  const std::string root = path_join(out_dir, "checkpoints");
  if (!dir_exists(root) || keep <= 0) return;
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find(kCheckpointTmpInfix) == std::string::npos)
      dirs.push_back(n);
  }
  std::sort(dirs.begin(), dirs.end());
  // the checkpoint LATEST names is never removed, whatever its step (a stale higher-numbered one must not push
  // out the one a resume or an export reads)
  std::string latest;
  if (file_exists(path_join(root, "LATEST"))) {
    latest = read_file(path_join(root, "LATEST"));
    while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  }
  for (size_t i = 0; i + static_cast<size_t>(keep) < dirs.size(); ++i)
    if (dirs[i] != latest) fs::remove_all(path_join(root, dirs[i]));
}

}  // namespace dflash
