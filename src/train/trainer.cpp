// train/trainer.cpp — train(): topology, single-threaded warm-up, worker threads, metrics, checkpoints, faults,
// export. The step itself lives in train/drafter_worker.cpp, the target side in train/target_worker.cpp.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/collective.h"   // HostGroup, GradReducer
#include "backend/context.h"      // Context, make_context, lazy_init_count
#include "backend/mpi.h"          // Mpi: processes of a multi-host job
#include "core/fs.h"
#include "core/log.h"
#include "core/output_dir.h"
#include "io/dataset.h"
#include "io/tokenizer.h"
#include "io/safetensors.h"      // WeightStore (init from the target)
#include "model/drafter_init.h"   // init_drafter_from_target
#include "model/export.h"
#include "model/target.h"
#include "train/checkpoint.h"
#include "train/drafter_worker.h"  // DrafterWorker, StepReport
#include "train/feature_queue.h"   // FeatureQueue, JobSource
#include "train/step_plan.h"       // PlanBook, count_trainable_samples
#include "train/target_worker.h"   // TargetWorker, FaultPlan

namespace dflash {

void to_json(nlohmann::json& j, const TrainConfig& c) {
  j = nlohmann::json{{"target_dir", c.target_dir},
                     {"data_dir", c.data_dir},
                     {"out_dir", c.out_dir},
                     {"device", c.device},
                     {"targets", c.targets},
                     {"drafters", c.drafters},
                     {"colocate", c.colocate},
                     {"queue_depth", c.queue_depth},
                     {"shard_optimizer", c.shard_optimizer},
                     {"num_layers", c.num_layers},
                     {"block_size", c.block_size},
                     {"target_layer_ids", c.target_layer_ids},
                     {"num_target_features", c.num_target_features},
                     {"mask_token_id", c.mask_token_id},
                     {"intermediate_size", c.intermediate_size},
                     {"init_std", c.init_std},
                     {"init_from_target", c.init_from_target},
                     {"init_fc", c.init_fc},
                     {"sliding_window", c.sliding_window},
                     {"layer_types", c.layer_types},
                     {"max_anchors", c.max_anchors},
                     {"gamma", c.gamma},
                     {"kl_weight", c.kl_weight},
                     {"max_length", c.max_length},
                     {"lr", c.optim.lr},
                     {"beta1", c.optim.beta1},
                     {"beta2", c.optim.beta2},
                     {"adam_eps", c.optim.eps},
                     {"weight_decay", c.optim.weight_decay},
                     {"max_grad_norm", c.optim.max_grad_norm},
                     {"warmup_ratio", c.optim.warmup_ratio},
                     {"schedule", c.optim.schedule},
                     {"epochs", c.epochs},
                     {"max_steps", c.max_steps},
                     {"batch_size", c.batch_size},
                     {"seed", c.seed},
                     {"recompute", c.recompute}};
}

namespace {

// The keys that must agree between a checkpoint and a resumed run (anything that changes the trajectory). The
// topology is not among them: with another number of drafters a resumed run sees the same batches and anchors.
const char* const kResumeKeys[] = {"num_layers", "block_size",  "target_layer_ids", "mask_token_id",
                                   "intermediate_size", "max_anchors", "gamma", "kl_weight", "max_length",
                                   "lr", "beta1", "beta2", "adam_eps", "weight_decay", "max_grad_norm",
                                   "warmup_ratio", "schedule", "batch_size", "seed"};

// Expected acceptance length from per-slot accuracies (spec 2.4): EAL = 1 + sum_k prod_{i<=k} acc_i, slots 1..B-1.
double expected_acceptance(const std::vector<double>& acc) {
  double eal = 1, prod = 1;
  for (size_t i = 1; i < acc.size(); ++i) {
    prod *= acc[i];
    eal += prod;
  }
  return eal;
}

// Keeps metrics.jsonl lines with step <= upto (a resumed run rewrites what came after its checkpoint).
void truncate_metrics(const std::string& path, int64_t upto) {
  if (!file_exists(path)) return;
  std::istringstream in(read_file(path));
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.value("step", int64_t{0}) <= upto) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      break;  // a torn last line
    }
  }
  write_file_atomic(path, kept);
}

std::string fmt_tokens(double v) {
  char b[32];
  if (v >= 1e6) std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

// Which workers run where (spec 6). backend: the make_context device name without index ("cpu", "cpu64",
// "cuda"); targets/drafters: per worker the device index (CPU: 0 for every worker).
struct Topology {
  std::string backend;
  std::vector<int> targets, drafters;
  std::string device_name(int index) const { return backend == "cuda" ? cat("cuda:", index) : backend; }
};

std::vector<int> parse_index_list(const std::string& s, const char* opt) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    DFLASH_CHECK(!item.empty() && item.find_first_not_of("0123456789 ") == std::string::npos, opt, " '", s,
                 "': expected comma-separated device indices, e.g. 0,1,2");
    v.push_back(std::stoi(item));
  }
  std::set<int> seen(v.begin(), v.end());
  DFLASH_CHECK(seen.size() == v.size(), opt, " '", s, "': a device is listed twice");
  DFLASH_CHECK(!v.empty(), opt, " is empty");
  return v;
}

int parse_count(const std::string& s, const char* opt) {
  if (s.empty()) return 1;
  DFLASH_CHECK(s.find_first_not_of("0123456789") == std::string::npos && std::stoi(s) > 0, opt, " '", s,
               "': on the CPU give a number of workers (>= 1)");
  return std::stoi(s);
}

Topology parse_topology(const TrainConfig& c) {
  Topology t;
  const bool cuda = c.device == "cuda" || c.device.rfind("cuda:", 0) == 0;
  if (!cuda) {
    DFLASH_CHECK(c.device == "cpu" || c.device == "cpu64", "unknown device '", c.device, "' (cpu, cpu64, cuda, cuda:N)");
    t.backend = c.device;
    const int nd = parse_count(c.drafters, "--drafters");
    const int nt = c.colocate && c.targets.empty() ? nd : parse_count(c.targets, "--targets");
    t.targets.assign(static_cast<size_t>(nt), 0);
    t.drafters.assign(static_cast<size_t>(nd), 0);
    return t;
  }
  t.backend = "cuda";
  const int dev = c.device.size() > 5 ? std::stoi(c.device.substr(5)) : 0;
  if (c.targets.empty() && c.drafters.empty()) {
    t.targets = t.drafters = {dev};
  } else if (c.colocate) {
    DFLASH_CHECK(c.targets.empty() || c.drafters.empty() || c.targets == c.drafters,
                 "--colocate: give the devices once (--drafters 0,1 or --targets 0,1)");
    t.targets = t.drafters = parse_index_list(c.drafters.empty() ? c.targets : c.drafters, "--drafters");
  } else {
    DFLASH_CHECK(!c.targets.empty() && !c.drafters.empty(),
                 "give both --targets and --drafters (device lists), or --colocate with one list");
    t.targets = parse_index_list(c.targets, "--targets");
    t.drafters = parse_index_list(c.drafters, "--drafters");
  }
  return t;
}

}  // namespace

namespace {
TrainSummary train_impl(const TrainConfig& cfg, const std::atomic<bool>* stop);
}  // namespace

TrainSummary train(const TrainConfig& cfg, const std::atomic<bool>* stop) {
  try {
    return train_impl(cfg, stop);
  } catch (const std::exception& e) {
    // In a job of several processes an error on one (bad input, a failed worker) ends them all: the others may be
    // waiting in a collective it will never join.
    if (Mpi::active() && Mpi::size() > 1) {
      log_line("error", e.what());
      Mpi::abort_job(1);
    }
    throw;
  }
}

namespace {

TrainSummary train_impl(const TrainConfig& cfg, const std::atomic<bool>* stop) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  DFLASH_CHECK(!cfg.target_dir.empty(), "train: target_dir is not set");
  DFLASH_CHECK(!cfg.data_dir.empty(), "train: data_dir is not set");
  DFLASH_CHECK(!cfg.out_dir.empty(), "train: out_dir is not set");
  DFLASH_CHECK(cfg.batch_size > 0, "train: batch_size must be > 0");
  DFLASH_CHECK(cfg.queue_depth > 0, "train: queue_depth must be > 0");
  if (Mpi::launched()) Mpi::init();
  const bool lead = Mpi::rank() == 0;  // process 0 writes metrics, checkpoints and the export
  const int nproc = Mpi::size();
  const Topology topo = parse_topology(cfg);
  const FaultPlan fault = FaultPlan::parse(cfg.inject_fault);

  // ---- configuration: data, tokenizer, target shape, drafter shape ----------------------------------------------
  Dataset data = Dataset::open(cfg.data_dir);
  DFLASH_CHECK(data.size() > 0, cfg.data_dir, ": no samples");
  const ModelConfig tc = load_model_config(cfg.target_dir);
  std::shared_ptr<const Tokenizer> tok;
  if (file_exists(path_join(cfg.target_dir, "tokenizer.json"))) tok = Tokenizer::load(cfg.target_dir);
  const auto& man = data.manifest();
  if (tok && man.contains("tokenizer") && man["tokenizer"].contains("sha256")) {
    DFLASH_CHECK(man["tokenizer"]["sha256"].get<std::string>() == tok->hash(), cfg.data_dir,
                 "/manifest.json: the data was tokenized with a different tokenizer (sha256 ",
                 man["tokenizer"]["sha256"].get<std::string>(), ") than ", cfg.target_dir, "/tokenizer.json (",
                 tok->hash(), "); prepare the data again with the target's tokenizer");
  }
  validate_mask_token_id(cfg.mask_token_id);  // -1 (the tokenizer's) or an id >= 0
  int32_t mask_id = cfg.mask_token_id;
  if (mask_id < 0 && tok && tok->mask_id()) mask_id = *tok->mask_id();
  DFLASH_CHECK(mask_id >= 0, "train: no mask token id: pass --mask-token-id (an existing, unused row of the "
               "target's embedding) or use a tokenizer that defines one (e.g. <|MASK|>)");
  std::vector<int64_t> layer_ids = cfg.target_layer_ids;
  if (layer_ids.empty()) layer_ids = default_target_layer_ids(tc.num_hidden_layers, cfg.num_target_features);
  validate_target_layer_ids(layer_ids, tc.num_hidden_layers);  // distinct, ascending: the exported order
  DrafterConfig dc = DrafterConfig::for_target(tc, cfg.num_layers, cfg.block_size, layer_ids, mask_id);
  if (cfg.intermediate_size > 0) dc.intermediate_size = cfg.intermediate_size;
  dc.layer_types = resolve_layer_types(cfg.layer_types, dc.num_layers, cfg.sliding_window);
  dc.sliding_window = dc.layer_types.empty() ? 0 : cfg.sliding_window;
  dc.validate();
  if (dc.sliding_window > 0 && dc.sliding_window < dc.block_size)
    log_warn("train: --sliding-window ", dc.sliding_window, " is smaller than the block (", dc.block_size,
             "): spec 2.3 keeps a slot's whole causal block prefix, while Hugging Face-style sliding masks in serving "
             "engines also drop block keys more than W-1 slots back; the two agree only for W >= B");
  // where the weights start (model/drafter_init.h); only step 0 depends on it, so resume does not compare it
  const std::vector<int64_t> init_layers = resolve_init_layers(cfg.init_from_target, dc);
  DFLASH_CHECK(cfg.init_fc == "random" || cfg.init_fc == "last", "--init-fc: '", cfg.init_fc,
               "' is not one of random, last");
  const bool init_from_target = !init_layers.empty() || cfg.init_fc != "random";
  DFLASH_CHECK(!init_from_target || !cfg.random_target, "--init-from-target / --init-fc last start the drafter from "
               "the target's checkpoint: not with --random-target");
  const int64_t B = dc.block_size;
  const double gamma = cfg.gamma == 0 ? default_gamma(B) : (cfg.gamma < 0 ? 0.0 : cfg.gamma);
  const bool soft = cfg.kl_weight > 0;
  const int64_t n = static_cast<int64_t>(data.size());

  // A run that can learn nothing fails before it starts (no sample has a supervised pair after truncation).
  const int64_t trainable = count_trainable_samples(data, cfg.max_length);
  DFLASH_CHECK(trainable > 0, cfg.data_dir, ": none of the ", n, " samples has two consecutive supervised tokens",
               cfg.max_length > 0 ? cat(" within --max-length ", cfg.max_length) : std::string(),
               " (spec 2.1: an anchor needs loss_mask[a] = loss_mask[a+1] = 1), so training would learn nothing. "
               "Check the loss masks (prepare's assistant mask) or raise --max-length");
  if (trainable < n)
    log_info(n - trainable, " of ", n, " samples have no anchor", cfg.max_length > 0 ? " within --max-length" : "",
             " and will be skipped (counted per step as skipped_no_anchor)");

  int64_t total_steps =
      cfg.max_steps > 0 ? cfg.max_steps
                        : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cfg.epochs * n / cfg.batch_size)));
  nlohmann::json cfg_json = cfg;
  cfg_json["target_layer_ids"] = layer_ids;
  cfg_json["mask_token_id"] = mask_id;
  cfg_json["intermediate_size"] = dc.intermediate_size;
  cfg_json["gamma"] = gamma;
  cfg_json["init_from_target"] = init_layers;
  cfg_json["layer_types"] = dc.layer_types;  // resolved: empty = every layer full attention
  cfg_json["sliding_window"] = dc.sliding_window;
  cfg_json["data"] = data_provenance(man);  // how the data was made: in every checkpoint and the export

  // An earlier run in out_dir is refused unless --resume / --overwrite; checked once every input is valid, so a
  // bad option never costs the old run (process 0 owns the directory).
  if (lead) claim_output_dir(cfg.out_dir, cfg.resume, cfg.overwrite, OutputOf::Train);
  int64_t start = 0, start_updates = 0;
  const std::string metrics_path = path_join(cfg.out_dir, "metrics.jsonl");
  const std::string latest = cfg.resume ? latest_checkpoint(cfg.out_dir) : "";
  if (!latest.empty()) {
    const auto info = nlohmann::json::parse(read_file(path_join(latest, "state.json")));
    const auto& old = info.at("config");
    for (const char* k : kResumeKeys)
      DFLASH_CHECK(old.contains(k) && old[k] == cfg_json[k], latest, "/state.json: the checkpoint was made with ", k,
                   " = ", old.contains(k) ? old[k].dump() : "(absent)", ", this run has ", cfg_json[k].dump(),
                   "; resume needs the same setting");
    // keys added after the first checkpoints: absent = the value that was implied then (no sliding layers)
    for (const auto& [k, implied] : {std::pair<const char*, nlohmann::json>{"layer_types", nlohmann::json::array()},
                                     std::pair<const char*, nlohmann::json>{"sliding_window", 0}}) {
      const nlohmann::json was = old.contains(k) ? old[k] : implied;
      DFLASH_CHECK(was == cfg_json[k], latest, "/state.json: the checkpoint was made with ", k, " = ", was.dump(),
                   ", this run has ", cfg_json[k].dump(), "; resume needs the same setting");
    }
    start = info.at("step").get<int64_t>();
    start_updates = info.value("updates", start);
    total_steps = info.value("total_steps", total_steps);
    if (lead) truncate_metrics(metrics_path, start);
  } else {
    if (cfg.resume) log_info("no checkpoint in ", cfg.out_dir, "/checkpoints: starting from step 0");
    if (lead) write_file_atomic(metrics_path, "");
  }
  const int64_t epoch_total = total_steps;

  // ---- warm-up: every context, weight, buffer, event and communicator, in this one thread ------------------------
  JobControl control;
  const ContextOptions copt{.threads = cfg.threads, .profile_ops = cfg.profile};
  const int T = static_cast<int>(topo.targets.size()), D = static_cast<int>(topo.drafters.size());
  const int world = D * nproc, rank0 = D * Mpi::rank();
  const bool sharded = cfg.shard_optimizer && world > 1;  // ZeRO-1: the optimizer state split over the drafters
  auto worker_name = [&](const char* kind, int i, int dev) {
    return nproc > 1 ? cat(kind, " ", i, " (", topo.device_name(dev), ", process ", Mpi::rank(), ")")
                     : cat(kind, " ", i, " (", topo.device_name(dev), ")");
  };
  int64_t max_S = 1;
  for (size_t i = 0; i < data.size(); ++i) max_S = std::max<int64_t>(max_S, static_cast<int64_t>(data.get(i).tokens.size()));
  if (cfg.max_length > 0) max_S = std::min(max_S, cfg.max_length);

  std::vector<std::unique_ptr<Context>> tctx;
  for (int i = 0; i < T; ++i) tctx.push_back(make_context(topo.device_name(topo.targets[i]), copt));
  std::vector<std::unique_ptr<Context>> dctx;
  for (int i = 0; i < D; ++i) dctx.push_back(make_context(topo.device_name(topo.drafters[i]), copt));
  for (auto& a : tctx)
    for (auto& b : dctx) {
      a->enable_peer_access(*b);
      b->enable_peer_access(*a);
    }
  // the target's weights: loaded once per device, shared (immutable) by the workers of that device
  std::map<int, std::shared_ptr<const Target>> target_on;
  for (int i = 0; i < T; ++i)
    if (!target_on.count(topo.targets[i]))
      target_on[topo.targets[i]] = cfg.random_target ? Target::random(tc, *tctx[i], cfg.seed)
                                                     : Target::load(cfg.target_dir, *tctx[i]);
  std::vector<std::unique_ptr<DrafterWorker>> drafters;
  for (int i = 0; i < D; ++i) {
    Tensor embed, lm_head;
    if (auto it = target_on.find(topo.drafters[i]); it != target_on.end()) {
      embed = it->second->weights().embed;
      lm_head = it->second->weights().lm_head;
    } else {
      TargetHead h = cfg.random_target ? random_target_head(tc, *dctx[i], cfg.seed)
                                       : load_target_head(cfg.target_dir, *dctx[i]);
      embed = h.embed;
      lm_head = h.lm_head;
    }
    drafters.push_back(std::make_unique<DrafterWorker>(i, rank0 + i, worker_name("drafter", i, topo.drafters[i]),
                                                       std::move(dctx[i]), dc, cfg.seed, cfg.init_std, embed, lm_head,
                                                       sharded ? world : 1));
  }
  if (init_from_target && latest.empty()) {
    const WeightStore ws = WeightStore::open(cfg.target_dir);
    for (auto& d : drafters) init_drafter_from_target(d->ctx(), d->drafter().params(), dc, ws, init_layers, cfg.init_fc);
    log_info("drafter initialised from the target: layers ", nlohmann::json(init_layers).dump(), ", fc ", cfg.init_fc);
  }
  for (auto& d : drafters) d->ctx().synchronize();
  std::vector<std::unique_ptr<FeatureQueue>> queues;
  std::vector<FeatureQueue*> qptr;
  for (auto& d : drafters) {
    queues.push_back(std::make_unique<FeatureQueue>(d->ctx(), cfg.queue_depth, max_S, dc.nf() * dc.hidden_size,
                                                    dc.hidden_size, soft, control));
    qptr.push_back(queues.back().get());
  }
  std::vector<std::unique_ptr<TargetWorker>> targets;
  for (int i = 0; i < T; ++i)
    targets.push_back(std::make_unique<TargetWorker>(i, worker_name("target", i, topo.targets[i]), std::move(tctx[i]),
                                                     target_on.at(topo.targets[i]), layer_ids, soft, qptr));
  std::vector<std::string> dnames;
  for (auto& d : drafters) dnames.push_back(d->name());
  HostGroup host_group(dnames, control, cfg.collective_timeout_s);
  std::unique_ptr<GradReducer> reducer;
  if (topo.backend == "cuda") {
    std::vector<Context*> cs;
    for (auto& d : drafters) cs.push_back(&d->ctx());
    reducer = make_nccl_grad_reducer(cs, rank0, world, host_group, control, cfg.collective_timeout_s);
  } else {
    reducer = make_host_grad_reducer(host_group);
  }
  if (!latest.empty()) {
    for (auto& d : drafters) load_checkpoint(d->ctx(), latest, d->drafter().params(), d->optim_shard());
    log_info("resumed from ", latest, " at step ", start, " of ", total_steps, " (", start_updates, " updates)");
  }
  for (auto& t : targets) t->warm_up();
  for (auto& d : drafters) d->warm_up();
  const int64_t lazy0 = lazy_init_count();

  log_info("device ", drafters[0]->ctx().describe(), "; ", T, " target + ", D, " drafter workers",
           nproc > 1 ? cat(" per process, ", nproc, " processes") : std::string(), " (gradients: ", reducer->describe(),
           ", ", cfg.queue_depth, " packets of up to ", max_S, " tokens in flight per drafter)");
  log_info("target ", arch_name(tc.arch), " ", tc.num_hidden_layers, " layers, H ", tc.hidden_size, "; drafter ",
           dc.num_layers, " layers, B ", B, ", layer ids ", nlohmann::json(layer_ids).dump(), ", mask id ", mask_id,
           ", ", drafters[0]->drafter().params().numel(), " parameters");
  if (const OptimShard* sh = drafters[0]->optim_shard())
    log_info("optimizer state sharded over ", world, " drafters (ZeRO-1): AdamW moments of ", sh->layout.shard,
             " of ", drafters[0]->drafter().params().flat_numel(), " flat elements per drafter, ",
             std::round(80.0 * static_cast<double>(sh->layout.shard) / (1 << 20)) / 10, " MiB instead of ",
             std::round(80.0 * static_cast<double>(drafters[0]->drafter().params().numel()) / (1 << 20)) / 10, " MiB");
  log_info("data ", n, " samples, ", data.total_tokens(), " tokens; ", total_steps, " steps of ", cfg.batch_size,
           " sequences (", cfg.max_steps > 0 ? cat("max_steps") : cat(cfg.epochs, " epochs"), ")",
           cfg.time_budget_s > 0 && cfg.max_steps <= 0 && latest.empty()
               ? cat("; time budget ", cfg.time_budget_s, " s: the step count is revised from the measured step rate")
               : std::string());

  // ---- the run --------------------------------------------------------------------------------------------------
  PlanBook plans(data, PlanConfig{.batch_size = cfg.batch_size, .max_anchors = cfg.max_anchors,
                                  .max_length = cfg.max_length, .block_size = B, .mask_token_id = mask_id,
                                  .gamma = gamma, .seed = cfg.seed, .drafters = world});
  const bool budgeted = cfg.time_budget_s > 0 && cfg.max_steps <= 0 && latest.empty();
  JobSource jobs(plans, start, total_steps, rank0, D, control);
  std::ofstream metrics;
  if (lead) {
    metrics.open(metrics_path, std::ios::app);
    DFLASH_CHECK(metrics.good(), metrics_path, ": cannot open for appending");
  }
  TrainSummary sum;
  sum.total_steps = total_steps;
  sum.targets = T;
  sum.drafters = D;
  std::unique_ptr<Progress> progress;
  if (lead && !cfg.quiet) progress = std::make_unique<Progress>("train", total_steps, "step", 10.0);
  std::atomic<int64_t> last_saved{start};
  std::string last_ckpt;
  auto state_info = [&](int64_t updates) {  // state.json beside the step (save_checkpoint adds "step")
    return nlohmann::json{{"config", cfg_json}, {"total_steps", sum.total_steps}, {"updates", updates}};
  };
  // Per-step bookkeeping of local rank 0 (process 0): metrics, progress, checkpoints, the time budget.
  auto t_loop = clock::now();
  auto t_prev = t_loop;
  std::vector<int64_t> busy_prev(static_cast<size_t>(T + D), 0), wait_prev(static_cast<size_t>(T + D), 0);
  std::vector<double> step_secs;
  std::atomic<int64_t> proposed_total{0};
  auto report = [&](DrafterWorker& w, const StepReport& r) {
    const auto now = clock::now();
    sum.total_steps = r.total_steps;
    const double dt = std::chrono::duration<double>(now - t_prev).count();
    t_prev = now;
    const StepPlan& plan = *r.plan;
    nlohmann::json rec;
    rec["step"] = r.step + 1;
    rec["epoch"] = static_cast<double>((r.step + 1) * cfg.batch_size) / static_cast<double>(n);
    rec["lr"] = r.lr;
    rec["seqs"] = plan.seqs.size();
    rec["skipped_no_anchor"] = plan.skipped;
    if (!r.updated) {
      rec["loss"] = nullptr;
      log_warn("step ", r.step + 1, ": none of the ", cfg.batch_size, " sequences has a supervised pair; no update");
    } else {
      std::vector<double> acc(static_cast<size_t>(B), 0.0);
      for (int64_t i = 1; i < B; ++i) acc[i] = r.stats.count[i] > 0 ? r.stats.correct[i] / r.stats.count[i] : 0.0;
      const double loss = r.stats.loss_sum / plan.sum_w, eal = expected_acceptance(acc);
      rec["loss"] = loss;
      rec["ce"] = r.stats.ce_sum / plan.sum_w;
      if (soft) rec["kl"] = r.stats.kl_sum / plan.sum_w;
      rec["acc"] = acc;
      rec["eal"] = eal;
      rec["grad_norm"] = r.grad_norm;
      rec["clip"] = r.clip;
      sum.last_loss = loss;
      sum.last_eal = eal;
    }
    rec["updates"] = r.updates;
    rec["draft_tokens"] = plan.draft_tokens;
    rec["target_tokens"] = plan.target_tokens;
    rec["step_s"] = dt;
    rec["ctx_tokens_per_s"] = plan.target_tokens / dt;
    rec["draft_tokens_per_s"] = plan.draft_tokens / dt;
    // each worker of this process: busy and waiting fractions of this step's wall time, what it waits on now
    nlohmann::json wk = nlohmann::json::object(), mem = nlohmann::json::object();
    auto worker_row = [&](size_t slot, const std::string& name, WorkerClock& c, Context& ctx) {
      const int64_t b = c.busy_ns.load(), wt = c.wait_ns.load();
      wk[name] = {{"busy", (b - busy_prev[slot]) * 1e-9 / dt},
                  {"wait", (wt - wait_prev[slot]) * 1e-9 / dt},
                  {"waiting_on", wait_reason_name(c.waiting_on.load())}};
      busy_prev[slot] = b;
      wait_prev[slot] = wt;
      if (ctx.device() == Device::CUDA) mem[name] = ctx.memory().peak_bytes;
    };
    for (int i = 0; i < T; ++i) worker_row(static_cast<size_t>(i), targets[i]->name(), targets[i]->clock, targets[i]->ctx());
    for (int i = 0; i < D; ++i)
      worker_row(static_cast<size_t>(T + i), drafters[i]->name(), drafters[i]->clock, drafters[i]->ctx());
    rec["workers"] = wk;
    std::vector<int> depth;
    for (auto& q : queues) depth.push_back(q->depth());
    rec["queue_depth"] = depth;
    if (!mem.empty()) rec["peak_mem_bytes"] = mem;
    if (budgeted) rec["total_steps"] = sum.total_steps;
    metrics << rec.dump() << "\n" << std::flush;
    if (progress) {
      char buf[200];
      const double busy_d = wk[drafters[0]->name()]["busy"].get<double>();
      std::snprintf(buf, sizeof buf, "loss %s | EAL %.2f | lr %.2e | %s ctx tok/s | drafter busy %.0f%%",
                    r.updated ? cat(std::round(sum.last_loss * 1000) / 1000).c_str() : "-", sum.last_eal, r.lr,
                    fmt_tokens(plan.target_tokens / dt).c_str(), 100 * std::min(1.0, busy_d));
      progress->set_total(sum.total_steps);  // the time budget may have revised it
      progress->update(r.step + 1, buf);
    }
    if (r.checkpoint) {  // every checkpoint_every steps, at a stop and after the last step (the drafters decide)
      last_ckpt = save_checkpoint(w.ctx(), cfg.out_dir, w.drafter().params(), {r.step + 1, state_info(r.updates)},
                                  r.moments);
      prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
      last_saved = r.step + 1;
    }
    if (budgeted) {  // revise the step count from the measured steady-state rate (the first steps warm up)
      step_secs.push_back(dt);
      const size_t k = step_secs.size();
      if (k >= 4) {
        std::vector<double> recent(step_secs.begin() + static_cast<long>(std::max<size_t>(2, k / 2)), step_secs.end());
        std::sort(recent.begin(), recent.end());
        const double per_step = recent[recent.size() / 2];
        const double used = std::chrono::duration<double>(now - t_loop).count();
        const int64_t fit = r.step + 1 + static_cast<int64_t>(std::max(0.0, cfg.time_budget_s - used) / per_step);
        const int64_t planned = std::clamp<int64_t>(fit, r.step + 1, epoch_total);
        if (planned != sum.total_steps && std::abs(planned - sum.total_steps) * 50 > sum.total_steps)
          proposed_total = planned;  // travels to every drafter with the next step's statistics
      }
    }
  };
  DrafterRun run;
  run.first_step = start;
  run.end_step = total_steps;
  run.total_steps = total_steps;
  run.updates = start_updates;
  run.stop_after = cfg.stop_after;
  run.checkpoint_every = cfg.checkpoint_every;
  run.optim = cfg.optim;
  run.kl_weight = static_cast<float>(cfg.kl_weight);
  run.recompute = cfg.recompute;
  run.stop = stop;
  run.fault = fault.index >= 0 ? &fault : nullptr;
  run.proposed_total = budgeted && lead ? &proposed_total : nullptr;

  std::vector<std::thread> threads;
  auto guarded = [&control](const std::string& name, auto&& body) {
    try {
      body();
    } catch (const JobAborted&) {
      // another worker failed first: its message is the job's
    } catch (const std::exception& e) {
      control.fail(name, e.what());
    }
  };
  t_loop = t_prev = clock::now();
  for (auto& t : targets)
    threads.emplace_back([&, w = t.get()] { guarded(w->name(), [&] { w->run(jobs, run.fault); }); });
  std::atomic<int> drafters_done{0};
  for (auto& d : drafters)
    threads.emplace_back([&, w = d.get()] {
      guarded(w->name(), [&] {
        w->run(run, plans, *queues[static_cast<size_t>(w->local_rank())], *reducer, host_group,
               lead && w->local_rank() == 0 ? std::function<void(DrafterWorker&, const StepReport&)>(report) : nullptr);
      });
      ++drafters_done;
    });
  // The drafters end the job; meanwhile this thread watches for another process's abort message.
  bool heard_from_lead = false;
  while (drafters_done.load() < D) {
    if (auto msg = Mpi::poll_abort()) {
      control.fail("another process", msg->text);
      heard_from_lead |= msg->from == 0;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  for (size_t i = static_cast<size_t>(T); i < threads.size(); ++i) threads[i].join();
  control.shut_down();
  for (auto& q : queues) q->wake_all();
  for (int i = 0; i < T; ++i) threads[static_cast<size_t>(i)].join();
  if (progress) progress->finish();
  const int64_t steps_done = drafters[0]->params_step.load();
  sum.steps_done = steps_done;
  sum.updates = drafters[0]->updates.load();
  sum.lazy_inits_after_warmup = lazy_init_count() - lazy0;
  if (sum.lazy_inits_after_warmup != 0)
    log_warn("case C01: ", sum.lazy_inits_after_warmup, " lazy initialisation(s) after the warm-up (last: ",
             last_lazy_init(), ")");

  if (control.failed()) {
    // Checkpoint the last step whose update a healthy replica holds, then stop the job with the worker's message.
    std::string ck;
    bool fallback = false;  // sharded, and the shards could not be put together: the latest checkpoint stands
    if (lead && sharded) {
      // Sharded: the step's state is spread over the drafters (and the last update's masters may not be gathered
      // yet). In one process every shard is here: when every drafter holds the same reported step in its shard
      // (none stopped inside the optimizer), masters and moments are put together from the shards. Across
      // processes the others' shards are out of reach: the last periodic checkpoint stands.
      const int64_t at = drafters[0]->params_step.load();
      bool same = nproc == 1;
      for (auto& d : drafters)
        same = same && !d->in_optimizer.load() && d->params_step.load() == at && d->shard_step.load() == at &&
               d->updates.load() == drafters[0]->updates.load();
      if (same && at > last_saved.load()) {
        ParamSet& ps0 = drafters[0]->drafter().params();
        const Tensor& flat0 = ps0.flat_master();
        FlatState fs{cpu_zeros(flat0.dtype, {flat0.numel()}), cpu_zeros(flat0.dtype, {flat0.numel()}),
                     cpu_zeros(flat0.dtype, {flat0.numel()})};
        for (auto& d : drafters) {
          const OptimShard& sh = *d->optim_shard();
          const Tensor& flat = d->drafter().params().flat_master();
          const std::pair<Tensor*, Tensor> parts[] = {{&fs.master, flat.slice(sh.begin(), sh.end())}, {&fs.m, sh.m},
                                                      {&fs.v, sh.v}};
          for (const auto& [dst, src] : parts) {
            const Tensor h = d->ctx().to_host(src, false);
            std::memcpy(static_cast<char*>(dst->data) + static_cast<size_t>(sh.begin()) * dtype_size(h.dtype), h.data,
                        h.nbytes());
          }
        }
        ps0.zero_grad(drafters[0]->ctx());
        ck = save_checkpoint(drafters[0]->ctx(), cfg.out_dir, ps0, {at, state_info(drafters[0]->updates.load())}, fs);
        prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
      } else {
        ck = latest_checkpoint(cfg.out_dir);
        fallback = !same;
      }
    } else if (lead) {
      DrafterWorker* best = nullptr;
      for (auto& d : drafters)
        if (!d->in_optimizer.load() && (!best || d->params_step.load() > best->params_step.load())) best = d.get();
      if (best && best->params_step.load() > last_saved.load()) {
        best->drafter().params().zero_grad(best->ctx());
        ck = save_checkpoint(best->ctx(), cfg.out_dir, best->drafter().params(),
                             {best->params_step.load(), state_info(best->updates.load())});
        prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
      } else {
        ck = latest_checkpoint(cfg.out_dir);
      }
    }
    const std::string msg = control.who() == "another process" ? control.message()
                                                                : cat(control.who(), " failed: ", control.message());
    const std::string full =
        cat(msg, ck.empty() ? std::string("; no checkpoint was written")
                 : fallback ? cat("; the optimizer state is sharded and its shards could not be put together (",
                                  nproc > 1 ? "other processes hold some" : "the drafters stopped at different points",
                                  "): the latest checkpoint is ", ck, " (continue with --resume)")
                            : cat("; the last completed step is in ", ck, " (continue with --resume)"));
    if (nproc > 1) {
      // Several processes: process 0 has the checkpoint; tell the others, let them hear it, then end the job
      // (MPI_Abort: collectives left half-way cannot be finalised cleanly).
      if (lead || control.who() != "another process") Mpi::send_abort(lead ? full : msg);
      const auto t0 = clock::now();
      while (!lead && !heard_from_lead && clock::now() - t0 < std::chrono::seconds(60)) {
        if (auto m = Mpi::poll_abort()) heard_from_lead |= m->from == 0;
        std::this_thread::sleep_for(kPollInterval);
      }
    }
    DFLASH_FAIL(full);  // train() ends the other processes (MPI_Abort) after logging it
  }
  sum.checkpoint_dir = last_ckpt.empty() ? latest_checkpoint(cfg.out_dir) : last_ckpt;
  sum.interrupted = steps_done < sum.total_steps;
  const double epochs_run = static_cast<double>(steps_done * cfg.batch_size) / static_cast<double>(n);
  if (sum.interrupted) {
    log_info("stopped after step ", steps_done, " of ", sum.total_steps, " (", epochs_run, " epochs): checkpoint ",
             sum.checkpoint_dir, " (continue with --resume)");
  } else {
    log_info("trained ", steps_done, " steps (", sum.updates, " updates, ", epochs_run, " epochs)");
    if (lead && cfg.export_at_end) {
      nlohmann::json training = training_record(steps_done, cfg_json);
      sum.export_dir = path_join(cfg.out_dir, "export");
      export_drafter(drafters[0]->ctx(), sum.export_dir, dc, drafters[0]->drafter().params(), training);
      log_info("exported the drafter to ", sum.export_dir);
    }
  }
  sum.seconds = std::chrono::duration<double>(clock::now() - t_start).count();
  if (cfg.profile && lead) {
    std::string text = cat("# dflash train: time per op over ", steps_done - start, " steps (GEMMs as M x N x K)\n");
    text += cat("\n## ", drafters[0]->name(), ": drafter steps, optimizer\n",
                format_op_profile(drafters[0]->ctx().op_profile()));
    text += cat("\n## ", targets[0]->name(), ": target forward\n", format_op_profile(targets[0]->ctx().op_profile()));
    const std::string path = path_join(cfg.out_dir, "profile.txt");
    write_file_atomic(path, text);
    log_info("per-op profile: ", path);
  }
  return sum;
}

}  // namespace

}  // namespace dflash
