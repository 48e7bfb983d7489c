// train/checkpoint.cpp — see checkpoint.h.
#include "train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/fs.h"
#include "io/safetensors.h"

namespace dflash {

namespace fs = std::filesystem;

std::string save_checkpoint(Context& ctx, const std::string& out_dir, const ParamSet& ps, const CheckpointState& st) {
  const std::string root = path_join(out_dir, "checkpoints");
  make_dirs(root);
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(st.step));
  const std::string dir = path_join(root, name);
  const std::string tmp = cat(dir, ".tmp-", getpid());
  fs::remove_all(tmp);
  make_dirs(tmp);
  std::vector<std::pair<std::string, Tensor>> params, optim;
  for (const auto& p : ps.all()) {
    params.emplace_back(p.name, ctx.to_host(p.master, false));
    optim.emplace_back("m." + p.name, ctx.to_host(p.m, false));
    optim.emplace_back("v." + p.name, ctx.to_host(p.v, false));
  }
  write_safetensors(path_join(tmp, "params.safetensors"), params);
  write_safetensors(path_join(tmp, "optim.safetensors"), optim);
  nlohmann::json j = st.info;
  j["step"] = st.step;
  write_file_atomic(path_join(tmp, "state.json"), j.dump(2) + "\n");
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  DFLASH_CHECK(!ec, dir, ": cannot publish checkpoint: ", ec.message());
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

CheckpointState load_checkpoint(Context& ctx, const std::string& dir, ParamSet& ps) {
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
  for (auto& p : ps.all()) {
    DFLASH_CHECK(pw.has(p.name), dir, "/params.safetensors: missing ", p.name);
    DFLASH_CHECK(pw.info(p.name).shape == p.shape, dir, ": ", p.name, " has shape ", shape_str(pw.info(p.name).shape),
                 ", the drafter expects ", shape_str(p.shape));
    ctx.copy(p.master, pw.view(p.name));
    ctx.copy(p.m, ow.view("m." + p.name));
    ctx.copy(p.v, ow.view("v." + p.name));
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
    if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find(".tmp-") == std::string::npos) dirs.push_back(n);
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
