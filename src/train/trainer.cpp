// train/trainer.cpp — train() in its phases, each a function that reads alone: open or resume the run directory
// (train/open_run.cpp), build the workers (build_workers), warm up (warm_up), the loop (StepRecorder: metrics,
// checkpoints, the time budget, per step; run_threads: the worker threads), finish (finish: the export and the
// profile, or the checkpoint and message of a failure). The step itself lives in train/drafter_worker.cpp, the target
// side in train/target_worker.cpp.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/collective.h"   // HostGroup, GradReducer
#include "backend/context.h"      // Context, make_context, lazy_init_count
#include "backend/device_memory.h"  // process_memory
#include "backend/mpi.h"          // Mpi: processes of a multi-host job
#include "core/fs.h"
#include "core/log.h"
#include "io/safetensors.h"       // WeightStore (init from the target)
#include "model/drafter_init.h"   // init_drafter_from_target
#include "model/export.h"
#include "model/target.h"
#include "model/target_stages.h"  // split_target_layers
#include "train/checkpoint.h"
#include "train/drafter_worker.h"  // DrafterWorker, StepReport
#include "train/feature_queue.h"   // FeatureQueue, JobSource
#include "train/open_run.h"        // OpenedRun, open_run: phase 1
#include "train/step_plan.h"       // PlanBook
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
                     {"target_split", c.target_split},
                     {"queue_depth", c.queue_depth},
                     {"shard_optimizer", c.shard_optimizer},
                     {"arch", c.arch},
                     {"conv_kernel_size", c.conv_kernel_size},
                     {"conv_group_size", c.conv_group_size},
                     {"selector_rank", c.selector_rank},
                     {"selector_top_k", c.selector_top_k},
                     {"selector_alpha", c.selector_alpha},
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
                     {"loss", c.loss},
                     {"gamma", c.gamma},
                     {"dpace_alpha", c.dpace_alpha},
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

using Clock = std::chrono::steady_clock;

// Expected acceptance length from per-slot accuracies (spec 2.4): EAL = 1 + sum_k prod_{i<=k} acc_i, slots 1..B-1.
double expected_acceptance(const std::vector<double>& acc) {
  double eal = 1, prod = 1;
  for (size_t i = 1; i < acc.size(); ++i) {
    prod *= acc[i];
    eal += prod;
  }
  return eal;
}

std::string fmt_tokens(double v) {
  char b[32];
  if (v >= 1e6) std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

// ---- phase 2: the workers ------------------------------------------------------------------------------------------

// Every context, weight, buffer, event and communicator of this process's workers.
struct Workers {
  JobControl control;
  int T = 0, D = 0;       // target and drafter workers of this process
  int world = 1, rank0 = 0;  // drafters of the job; the global rank of this process's first drafter
  bool sharded = false;   // ZeRO-1: the optimizer state split over the drafters
  int64_t max_S = 1;      // the longest sequence a packet holds
  std::vector<std::unique_ptr<TargetWorker>> targets;
  std::vector<std::unique_ptr<DrafterWorker>> drafters;
  std::vector<std::unique_ptr<FeatureQueue>> queues;  // one per drafter
  std::unique_ptr<HostGroup> host_group;
  std::unique_ptr<GradReducer> reducer;
};

// Builds the workers of the topology in this one thread: contexts, the target's weights (once per device, shared and
// immutable), the drafters (from the target's layers with --init-from-target on a new run), queues, collectives.
std::unique_ptr<Workers> build_workers(const TrainConfig& cfg, const OpenedRun& r) {
  auto w = std::make_unique<Workers>();
  const ContextOptions copt{.threads = cfg.threads, .profile_ops = cfg.profile};
  const Topology& topo = r.topo;
  const DrafterConfig& dc = r.dc;
  w->T = topo.target_workers();
  const int S = topo.split;
  w->D = static_cast<int>(topo.drafters.size());
  w->world = w->D * r.nproc;
  w->rank0 = w->D * Mpi::rank();
  w->sharded = cfg.shard_optimizer && w->world > 1;
  auto worker_name = [&](const char* kind, int i, int dev) {
    return r.nproc > 1 ? cat(kind, " ", i, " (", topo.device_name(dev), ", process ", Mpi::rank(), ")")
                       : cat(kind, " ", i, " (", topo.device_name(dev), ")");
  };
  for (size_t i = 0; i < r.data.size(); ++i)
    w->max_S = std::max<int64_t>(w->max_S, static_cast<int64_t>(r.data.get(i).tokens.size()));
  if (cfg.max_length > 0) w->max_S = std::min(w->max_S, cfg.max_length);

  std::vector<std::unique_ptr<Context>> tctx;  // [worker * S + stage]
  for (int dev : topo.targets) tctx.push_back(make_context(topo.device_name(dev), copt));
  std::vector<std::unique_ptr<Context>> dctx;
  for (int i = 0; i < w->D; ++i) dctx.push_back(make_context(topo.device_name(topo.drafters[i]), copt));
  for (auto& a : tctx)
    for (auto& b : dctx) {
      a->enable_peer_access(*b);
      b->enable_peer_access(*a);
    }
  for (int i = 0; i < w->T; ++i)  // a split worker hands the residual stream from each stage to the next
    for (int s = 0; s + 1 < S; ++s) {
      tctx[static_cast<size_t>(i * S + s)]->enable_peer_access(*tctx[static_cast<size_t>(i * S + s + 1)]);
      tctx[static_cast<size_t>(i * S + s + 1)]->enable_peer_access(*tctx[static_cast<size_t>(i * S + s)]);
    }
  // the target's weights: loaded once per device, shared (immutable) by the workers of that device
  std::map<int, std::shared_ptr<const Target>> target_on;
  // a split target: each stage loaded once per device (only its layers' tensors read), shared likewise
  std::map<std::pair<int, int>, std::shared_ptr<const Target>> stage_on;
  const std::vector<TargetStage> stages = split_target_layers(r.tc, S);
  const auto load_t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < w->T; ++i)
    for (int s = 0; s < S; ++s) {
      const int dev = topo.target_device(i, s);
      Context& c = *tctx[static_cast<size_t>(i * S + s)];
      if (S == 1 && !target_on.count(dev))
        target_on[dev] = cfg.random_target ? Target::random(r.tc, c, cfg.seed) : Target::load(cfg.target_dir, c);
      const TargetStage st = stages[static_cast<size_t>(s)];
      if (S > 1 && !stage_on.count({dev, s}))
        stage_on[{dev, s}] = cfg.random_target ? Target::random_stage(r.tc, c, cfg.seed, st)
                                               : Target::load_stage(cfg.target_dir, c, st);
    }
  for (auto& c : tctx) c->synchronize();
  log_info("target ", cfg.random_target ? "drawn" : "loaded", " in ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - load_t0).count(), " s (",
           S == 1 ? target_on.size() : stage_on.size(), S > 1 ? " stages" : target_on.size() > 1 ? " copies" : " copy",
           "); host memory ",
           describe(process_memory()));
  if (S > 1)
    for (size_t s = 0; s < stages.size(); ++s)
      log_info("target stage ", s, ": layers ", stages[s].first, "-", stages[s].end - 1);
  for (int i = 0; i < w->D; ++i) {
    Tensor embed, lm_head;
    if (auto it = target_on.find(topo.drafters[i]); it != target_on.end()) {
      embed = it->second->weights().embed;
      lm_head = it->second->weights().lm_head;
    } else {
      TargetHead h = cfg.random_target ? random_target_head(r.tc, *dctx[i], cfg.seed)
                                       : load_target_head(cfg.target_dir, *dctx[i]);
      embed = h.embed;
      lm_head = h.lm_head;
    }
    w->drafters.push_back(std::make_unique<DrafterWorker>(
        i, w->rank0 + i, worker_name("drafter", i, topo.drafters[i]), std::move(dctx[i]), dc, cfg.seed, cfg.init_std,
        embed, lm_head, w->sharded ? w->world : 1));
  }
  if (r.init_from_target && r.latest.empty()) {
    const WeightStore ws = WeightStore::open(cfg.target_dir);
    for (auto& d : w->drafters)
      init_drafter_from_target(d->ctx(), d->drafter().params(), dc, ws, r.init_layers, cfg.init_fc);
    log_info("drafter initialised from the target: layers ", nlohmann::json(r.init_layers).dump(), ", fc ",
             cfg.init_fc);
  }
  for (auto& d : w->drafters) d->ctx().synchronize();
  std::vector<FeatureQueue*> qptr;
  for (auto& d : w->drafters) {
    w->queues.push_back(std::make_unique<FeatureQueue>(d->ctx(), cfg.queue_depth, w->max_S, dc.nf() * dc.hidden_size,
                                                       dc.hidden_size, r.soft, w->control));
    qptr.push_back(w->queues.back().get());
  }
  for (int i = 0; i < w->T; ++i) {
    if (S == 1) {
      w->targets.push_back(std::make_unique<TargetWorker>(i, worker_name("target", i, topo.targets[i]),
                                                          std::move(tctx[i]), target_on.at(topo.targets[i]),
                                                          dc.target_layer_ids, r.soft, qptr));
      continue;
    }
    std::vector<std::unique_ptr<Context>> cs;
    std::vector<std::shared_ptr<const Target>> ts;
    std::string devs;
    for (int s = 0; s < S; ++s) {
      cs.push_back(std::move(tctx[static_cast<size_t>(i * S + s)]));
      ts.push_back(stage_on.at({topo.target_device(i, s), s}));
      devs += cat(s ? "+" : "", topo.device_name(topo.target_device(i, s)));
    }
    const std::string name = r.nproc > 1 ? cat("target ", i, " (", devs, ", process ", Mpi::rank(), ")")
                                         : cat("target ", i, " (", devs, ")");
    w->targets.push_back(std::make_unique<TargetWorker>(i, name, std::move(cs), std::move(ts), dc.target_layer_ids,
                                                        r.soft, qptr, w->control, cfg.queue_depth));
  }
  std::vector<std::string> dnames;
  for (auto& d : w->drafters) dnames.push_back(d->name());
  w->host_group = std::make_unique<HostGroup>(dnames, w->control, cfg.collective_timeout_s);
  if (topo.backend == "cuda") {
    std::vector<Context*> cs;
    for (auto& d : w->drafters) cs.push_back(&d->ctx());
    w->reducer = make_nccl_grad_reducer(cs, w->rank0, w->world, *w->host_group, w->control, cfg.collective_timeout_s);
  } else {
    w->reducer = make_host_grad_reducer(*w->host_group);
  }
  return w;
}

// ---- phase 3: warm-up ----------------------------------------------------------------------------------------------

// Restores the checkpoint a resume starts from, runs every worker once (all first-use work happens here, in one
// thread: case C01), and says what runs where. Returns lazy_init_count() after it (later ones are reported).
int64_t warm_up(const TrainConfig& cfg, const OpenedRun& r, Workers& w) {
  if (!r.latest.empty()) {
    for (auto& d : w.drafters) load_checkpoint(d->ctx(), r.latest, d->drafter().params(), d->optim_shard());
    log_info("resumed from ", r.latest, " at step ", r.start, " of ", r.total_steps, " (", r.start_updates,
             " updates)");
  }
  for (auto& t : w.targets) t->warm_up();
  for (auto& d : w.drafters) d->warm_up(r.dpace_alpha);
  const int64_t lazy0 = lazy_init_count();
  const DrafterConfig& dc = r.dc;
  const ParamSet& ps = w.drafters[0]->drafter().params();
  log_info("device ", w.drafters[0]->ctx().describe(), "; ", w.T, " target + ", w.D, " drafter workers",
           r.nproc > 1 ? cat(" per process, ", r.nproc, " processes") : std::string(),
           " (gradients: ", w.reducer->describe(), ", ", cfg.queue_depth, " packets of up to ", w.max_S,
           " tokens in flight per drafter)");
  if (w.drafters[0]->ctx().device() != Device::CPU)  // which kernel runs each op group (backend/kernel_tier.h)
    for (const auto& [ops, kernel] : w.drafters[0]->ctx().kernel_table()) log_info("kernels: ", ops, ": ", kernel);
  log_info("target ", arch_name(r.tc.arch), " ", r.tc.num_hidden_layers, " layers, H ", r.tc.hidden_size, "; drafter ",
           dc.num_layers, " layers, B ", dc.block_size, ", layer ids ", nlohmann::json(dc.target_layer_ids).dump(),
           ", mask id ", dc.mask_token_id, ", ", ps.numel(), " parameters");
  if (const OptimShard* sh = w.drafters[0]->optim_shard())
    log_info("optimizer state sharded over ", w.world, " drafters (ZeRO-1): AdamW moments of ", sh->layout.shard,
             " of ", ps.flat_numel(), " flat elements per drafter, ",
             std::round(80.0 * static_cast<double>(sh->layout.shard) / (1 << 20)) / 10, " MiB instead of ",
             std::round(80.0 * static_cast<double>(ps.numel()) / (1 << 20)) / 10, " MiB");
  log_info("data ", r.n, " samples, ", r.data.total_tokens(), " tokens; ", r.total_steps, " steps of ",
           cfg.batch_size, " sequences (", cfg.max_steps > 0 ? cat("max_steps") : cat(cfg.epochs, " epochs"), ")",
           r.budgeted ? cat("; time budget ", cfg.time_budget_s, " s", r.seconds_before > 0 ? cat(" (", std::round(
                            r.seconds_before), " s spent before this resume)") : std::string(),
                            ": the step count is revised from the measured step rate")
                      : std::string());
  return lazy0;
}

// ---- phase 4: the loop ---------------------------------------------------------------------------------------------

// What local rank 0 of process 0 does after each step, on its drafter thread: the metrics row, the progress line,
// the checkpoint when one is due, the time budget's revision of the step count. A checkpoint that cannot be written
// cuts metrics.jsonl back to the previous checkpoint and fails the job (checkpoint_failed: the failure phase writes
// no other checkpoint then).
class StepRecorder {
 public:
  StepRecorder(const TrainConfig& cfg, OpenedRun& r, Workers& w, TrainSummary& sum)
      : cfg_(cfg), r_(r), w_(w), sum_(sum) {
    last_saved = r.start;
    busy_prev_.assign(static_cast<size_t>(w.T + w.D), 0);
    wait_prev_.assign(static_cast<size_t>(w.T + w.D), 0);
    if (r.lead && !cfg.quiet) progress = std::make_unique<Progress>("train", r.total_steps, "step", 10.0);
  }
  void start_clock() { t_loop_ = t_prev_ = Clock::now(); }
  // state.json beside the step (save_checkpoint adds "step")
  nlohmann::json state_info(int64_t updates) const {
    const double secs = r_.seconds_before + std::chrono::duration<double>(Clock::now() - t_loop_).count();
    return nlohmann::json{{"config", r_.cfg_json}, {"inputs", r_.inputs}, {"total_steps", sum_.total_steps},
                          {"updates", updates}, {"train_seconds", secs}};
  }
  void operator()(DrafterWorker& dw, const StepReport& rep) {
    const auto now = Clock::now();
    sum_.total_steps = rep.total_steps;
    const double dt = std::chrono::duration<double>(now - t_prev_).count();
    t_prev_ = now;
    const nlohmann::json row = metrics_row(rep, dt);
    r_.metrics->append(row);
    if (progress) {
      char buf[200];
      const double busy_d = row["workers"][w_.drafters[0]->name()]["busy"].get<double>();
      std::snprintf(buf, sizeof buf, "loss %s | EAL %.2f | lr %.2e | %s ctx tok/s | drafter busy %.0f%%",
                    rep.updated ? cat(std::round(sum_.last_loss * 1000) / 1000).c_str() : "-", sum_.last_eal, rep.lr,
                    fmt_tokens(rep.plan->target_tokens / dt).c_str(), 100 * std::min(1.0, busy_d));
      progress->set_total(sum_.total_steps);  // the time budget may have revised it
      progress->update(rep.step + 1, buf);
    }
    if (rep.checkpoint) checkpoint(dw, rep);  // every checkpoint_every steps, at a stop, after the last step
    if (r_.budgeted) revise_total(rep, dt, now);
  }

  std::atomic<int64_t> last_saved{0};    // the step of the newest checkpoint
  std::string last_ckpt;                 // its directory ("" = none written by this run)
  std::atomic<bool> checkpoint_failed{false};
  std::atomic<int64_t> proposed_total{0};  // the time budget's step count, for the drafters
  std::unique_ptr<Progress> progress;

 private:
  nlohmann::json metrics_row(const StepReport& rep, double dt) {
    const StepPlan& plan = *rep.plan;
    const int64_t B = r_.dc.block_size;
    nlohmann::json rec;
    rec["step"] = rep.step + 1;
    rec["epoch"] = static_cast<double>((rep.step + 1) * cfg_.batch_size) / static_cast<double>(r_.n);
    rec["lr"] = rep.lr;
    rec["seqs"] = plan.seqs.size();
    rec["skipped_no_anchor"] = plan.skipped;
    if (!rep.updated) {
      rec["loss"] = nullptr;
      log_warn("step ", rep.step + 1, ": none of the ", cfg_.batch_size,
               " sequences has a supervised pair; no update");
    } else {
      std::vector<double> acc(static_cast<size_t>(B), 0.0);
      for (int64_t i = 1; i < B; ++i)
        acc[i] = rep.stats.count[i] > 0 ? rep.stats.correct[i] / rep.stats.count[i] : 0.0;
      const double loss = rep.stats.loss_sum / plan.sum_w, eal = expected_acceptance(acc);
      rec["loss"] = loss;
      rec["ce"] = rep.stats.ce_sum / plan.sum_w;
      if (r_.soft) rec["kl"] = rep.stats.kl_sum / plan.sum_w;
      if (r_.dc.dflash2()) {  // the selector: its loss (per unit weight) and how often the label is a candidate
        double rows = 0;
        for (double c : rep.stats.count) rows += c;
        rec["sel_loss"] = rep.stats.sel_sum / plan.sum_w;
        rec["sel_recall"] = rows > 0 ? rep.stats.covered / rows : 0.0;
      }
      rec["acc"] = acc;
      rec["eal"] = eal;
      rec["grad_norm"] = rep.grad_norm;
      rec["clip"] = rep.clip;
      sum_.last_loss = loss;
      sum_.last_eal = eal;
    }
    rec["updates"] = rep.updates;
    rec["draft_tokens"] = plan.draft_tokens;
    rec["target_tokens"] = plan.target_tokens;
    rec["step_s"] = dt;
    rec["ctx_tokens_per_s"] = plan.target_tokens / dt;
    rec["draft_tokens_per_s"] = plan.draft_tokens / dt;
    // each worker of this process: busy and waiting fractions of this step's wall time, what it waits on now
    nlohmann::json wk = nlohmann::json::object(), mem = nlohmann::json::object();
    auto worker_row = [&](size_t slot, const std::string& name, WorkerClock& c, Context& ctx) {
      const int64_t b = c.busy_ns.load(), wt = c.wait_ns.load();
      wk[name] = {{"busy", (b - busy_prev_[slot]) * 1e-9 / dt},
                  {"wait", (wt - wait_prev_[slot]) * 1e-9 / dt},
                  {"waiting_on", wait_reason_name(c.waiting_on.load())}};
      busy_prev_[slot] = b;
      wait_prev_[slot] = wt;
      if (ctx.device() == Device::CUDA) mem[name] = ctx.memory().peak_bytes;
    };
    for (int i = 0; i < w_.T; ++i) {
      TargetWorker& t = *w_.targets[static_cast<size_t>(i)];
      worker_row(static_cast<size_t>(i), t.name(), t.clock, t.ctx());
    }
    for (int i = 0; i < w_.D; ++i) {
      DrafterWorker& d = *w_.drafters[static_cast<size_t>(i)];
      worker_row(static_cast<size_t>(w_.T + i), d.name(), d.clock, d.ctx());
    }
    rec["workers"] = wk;
    std::vector<int> depth;
    for (auto& q : w_.queues) depth.push_back(q->depth());
    rec["queue_depth"] = depth;
    if (!mem.empty()) rec["peak_mem_bytes"] = mem;
    if (r_.budgeted) rec["total_steps"] = sum_.total_steps;
    return rec;
  }

  void checkpoint(DrafterWorker& dw, const StepReport& rep) {
    const FaultPlan& fault = r_.fault;
    const int64_t step = rep.step + 1;
    try {
      last_ckpt = save_checkpoint(dw.ctx(), cfg_.out_dir, dw.drafter().params(), {step, state_info(rep.updates)},
                                  rep.moments, [&](const std::string& f) { fault.maybe_stall_checkpoint(step, f); });
    } catch (const Error&) {
      checkpoint_failed = true;
      r_.metrics->rollback_to_checkpoint();  // metrics.jsonl ends where the intact checkpoint does
      throw;
    }
    r_.metrics->mark_checkpoint();
    prune_checkpoints(cfg_.out_dir, cfg_.keep_checkpoints);
    last_saved = step;
  }

  // Revises the step count from the measured steady-state rate (the first steps warm up); the new count travels to
  // every drafter with the next step's statistics.
  void revise_total(const StepReport& rep, double dt, Clock::time_point now) {
    step_secs_.push_back(dt);
    const size_t k = step_secs_.size();
    if (k < 4) return;
    std::vector<double> recent(step_secs_.begin() + static_cast<long>(std::max<size_t>(2, k / 2)), step_secs_.end());
    std::sort(recent.begin(), recent.end());
    const double per_step = recent[recent.size() / 2];
    const double used = r_.seconds_before + std::chrono::duration<double>(now - t_loop_).count();
    const int64_t fit = rep.step + 1 + static_cast<int64_t>(std::max(0.0, cfg_.time_budget_s - used) / per_step);
    const int64_t planned = std::clamp<int64_t>(fit, rep.step + 1, r_.epoch_total);
    if (planned != sum_.total_steps && std::abs(planned - sum_.total_steps) * 50 > sum_.total_steps)
      proposed_total = planned;
  }

  const TrainConfig& cfg_;
  OpenedRun& r_;
  Workers& w_;
  TrainSummary& sum_;
  Clock::time_point t_loop_ = Clock::now(), t_prev_ = t_loop_;
  std::vector<int64_t> busy_prev_, wait_prev_;
  std::vector<double> step_secs_;
};

// Runs one thread per worker until the drafters end the job (the last step, a stop, a failure), listening meanwhile
// for another process's abort message; then stops the targets. Returns whether process 0 sent that message.
bool run_threads(Workers& w, const DrafterRun& run, PlanBook& plans, JobSource& jobs, StepRecorder& rec, bool lead) {
  std::vector<std::thread> threads;
  JobControl& control = w.control;
  auto guarded = [&control](const std::string& name, auto&& body) {
    try {
      body();
    } catch (const JobAborted&) {
      // another worker failed first: its message is the job's
    } catch (const std::exception& e) {
      control.fail(name, e.what());
    }
  };
  rec.start_clock();
  for (auto& t : w.targets)
    threads.emplace_back([&, tw = t.get()] { guarded(tw->name(), [&] { tw->run(jobs, run.fault); }); });
  std::atomic<int> drafters_done{0};
  const std::function<void(DrafterWorker&, const StepReport&)> report = std::ref(rec);
  for (auto& d : w.drafters)
    threads.emplace_back([&, dw = d.get()] {
      guarded(dw->name(), [&] {
        dw->run(run, plans, *w.queues[static_cast<size_t>(dw->local_rank())], *w.reducer, *w.host_group,
                lead && dw->local_rank() == 0 ? report : nullptr);
      });
      ++drafters_done;
    });
  // The drafters end the job; meanwhile this thread watches for another process's abort message.
  bool heard_from_lead = false;
  while (drafters_done.load() < w.D) {
    if (auto msg = Mpi::poll_abort()) {
      control.fail("another process", msg->text);
      heard_from_lead |= msg->from == 0;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  for (size_t i = static_cast<size_t>(w.T); i < threads.size(); ++i) threads[i].join();
  control.shut_down();
  for (auto& q : w.queues) q->wake_all();
  for (int i = 0; i < w.T; ++i) threads[static_cast<size_t>(i)].join();
  if (rec.progress) rec.progress->finish();
  return heard_from_lead;
}

// ---- phase 5: finish -----------------------------------------------------------------------------------------------

// After a worker failed: checkpoints the last step whose update a healthy replica holds (process 0), and returns
// the failure's message saying where the run can continue. Sets *fallback when the sharded state could not be put
// together and the latest checkpoint stands.
std::string checkpoint_after_failure(const TrainConfig& cfg, const OpenedRun& r, Workers& w, StepRecorder& rec,
                                     bool* fallback) {
  std::string ck;
  if (rec.checkpoint_failed) {  // the failure was a checkpoint: writing another would fail the same way
    ck = latest_checkpoint(cfg.out_dir);
  } else if (w.sharded) {
    // Sharded: the step's state is spread over the drafters (and the last update's masters may not be gathered
    // yet). In one process every shard is here: when every drafter holds the same reported step in its shard
    // (none stopped inside the optimizer), masters and moments are put together from the shards. Across
    // processes the others' shards are out of reach: the last periodic checkpoint stands.
    const int64_t at = w.drafters[0]->params_step.load();
    bool same = r.nproc == 1;
    for (auto& d : w.drafters)
      same = same && !d->in_optimizer.load() && d->params_step.load() == at && d->shard_step.load() == at &&
             d->updates.load() == w.drafters[0]->updates.load();
    if (same && at > rec.last_saved.load()) {
      ParamSet& ps0 = w.drafters[0]->drafter().params();
      const Tensor& flat0 = ps0.flat_master();
      FlatState fs{cpu_zeros(flat0.dtype, {flat0.numel()}), cpu_zeros(flat0.dtype, {flat0.numel()}),
                   cpu_zeros(flat0.dtype, {flat0.numel()})};
      for (auto& d : w.drafters) {
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
      ps0.zero_grad(w.drafters[0]->ctx());
      ck = save_checkpoint(w.drafters[0]->ctx(), cfg.out_dir, ps0, {at, rec.state_info(w.drafters[0]->updates.load())},
                           fs);
      prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
      r.metrics->mark_checkpoint();
    } else {
      ck = latest_checkpoint(cfg.out_dir);
      *fallback = !same;
    }
  } else {
    DrafterWorker* best = nullptr;
    for (auto& d : w.drafters)
      if (!d->in_optimizer.load() && (!best || d->params_step.load() > best->params_step.load())) best = d.get();
    if (best && best->params_step.load() > rec.last_saved.load()) {
      best->drafter().params().zero_grad(best->ctx());
      ck = save_checkpoint(best->ctx(), cfg.out_dir, best->drafter().params(),
                           {best->params_step.load(), rec.state_info(best->updates.load())});
      prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
      r.metrics->mark_checkpoint();
    } else {
      ck = latest_checkpoint(cfg.out_dir);
    }
  }
  return ck;
}

// A failed job: the checkpoint of the failure (process 0), then the message every process ends with.
[[noreturn]] void fail_job(const TrainConfig& cfg, const OpenedRun& r, Workers& w, StepRecorder& rec,
                           bool heard_from_lead) {
  const JobControl& control = w.control;
  std::string ck, write_error;
  bool fallback = false;  // sharded, and the shards could not be put together: the latest checkpoint stands
  if (r.lead) {
    try {
      ck = checkpoint_after_failure(cfg, r, w, rec, &fallback);
    } catch (const Error& e) {  // e.g. the disk is full: the latest checkpoint stands
      write_error = e.what();
      ck = latest_checkpoint(cfg.out_dir);
    }
    r.metrics->rollback_to_checkpoint();  // rows after the checkpoint that stands are done again by a resume
  }
  const std::string msg = rec.checkpoint_failed || control.who() == "another process"
                              ? control.message()
                              : cat(control.who(), " failed: ", control.message());
  const std::string full =
      cat(msg, write_error.empty() ? std::string() : cat("; then the checkpoint of the failure: ", write_error),
          rec.checkpoint_failed ? std::string()  // its message says which checkpoint stands
          : ck.empty()          ? std::string("; no checkpoint was written")
          : fallback            ? cat("; the optimizer state is sharded and its shards could not be put together (",
                                      r.nproc > 1 ? "other processes hold some" : "the drafters stopped at different "
                                      "points", "): the latest checkpoint is ", ck, " (continue with --resume)")
                                : cat("; the last completed step is in ", ck, " (continue with --resume)"));
  if (r.nproc > 1) {
    // Several processes: process 0 has the checkpoint; tell the others, let them hear it, then end the job
    // (MPI_Abort: collectives left half-way cannot be finalised cleanly).
    if (r.lead || control.who() != "another process") Mpi::send_abort(r.lead ? full : msg);
    const auto t0 = Clock::now();
    while (!r.lead && !heard_from_lead && Clock::now() - t0 < std::chrono::seconds(60)) {
      if (auto m = Mpi::poll_abort()) heard_from_lead |= m->from == 0;
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  DFLASH_FAIL(full);  // train() ends the other processes (MPI_Abort) after logging it
}

// A job that ended by itself (the last step, or a stop): the export when it is complete, the per-op profile.
void finish(const TrainConfig& cfg, const OpenedRun& r, Workers& w, StepRecorder& rec, TrainSummary& sum) {
  const int64_t steps_done = sum.steps_done;
  sum.checkpoint_dir = rec.last_ckpt.empty() ? latest_checkpoint(cfg.out_dir) : rec.last_ckpt;
  sum.interrupted = steps_done < sum.total_steps;
  const double epochs_run = static_cast<double>(steps_done * cfg.batch_size) / static_cast<double>(r.n);
  if (sum.interrupted) {
    log_info("stopped after step ", steps_done, " of ", sum.total_steps, " (", epochs_run, " epochs): checkpoint ",
             sum.checkpoint_dir, " (continue with --resume)");
  } else {
    log_info("trained ", steps_done, " steps (", sum.updates, " updates, ", epochs_run, " epochs)");
    if (r.lead && cfg.export_at_end) {
      nlohmann::json training = training_record(steps_done, r.cfg_json);
      sum.export_dir = path_join(cfg.out_dir, "export");
      export_drafter(w.drafters[0]->ctx(), sum.export_dir, r.dc, w.drafters[0]->drafter().params(), training);
      log_info("exported the drafter to ", sum.export_dir);
    }
  }
  if (cfg.profile && r.lead) {
    std::string text = cat("# dflash train: time per op over ", steps_done - r.start, " steps (GEMMs as M x N x K)\n");
    text += cat("\n## ", w.drafters[0]->name(), ": drafter steps, optimizer\n",
                format_op_profile(w.drafters[0]->ctx().op_profile()));
    text += cat("\n## ", w.targets[0]->name(), ": target forward\n",
                format_op_profile(w.targets[0]->ctx().op_profile()));
    const std::string path = path_join(cfg.out_dir, "profile.txt");
    write_file_atomic(path, text);
    log_info("per-op profile: ", path);
  }
}

TrainSummary train_impl(const TrainConfig& cfg, const std::atomic<bool>* stop) {
  const auto t_start = Clock::now();
  OpenedRun r = open_run(cfg);                                 // phase 1
  std::unique_ptr<Workers> w = build_workers(cfg, r);          // phase 2
  const int64_t lazy0 = warm_up(cfg, r, *w);                   // phase 3

  // phase 4: the loop
  PlanBook plans(r.data, PlanConfig{.batch_size = cfg.batch_size, .max_anchors = cfg.max_anchors,
                                    .max_length = cfg.max_length, .block_size = r.dc.block_size,
                                    .mask_token_id = r.dc.mask_token_id, .gamma = r.gamma,
                                    .dpace_alpha = r.dpace_alpha, .seed = cfg.seed,
                                    .drafters = w->world});
  JobSource jobs(plans, r.start, r.total_steps, w->rank0, w->D, w->control);
  TrainSummary sum;
  sum.total_steps = r.total_steps;
  sum.start_step = r.start;
  sum.targets = w->T;
  sum.drafters = w->D;
  StepRecorder rec(cfg, r, *w, sum);
  DrafterRun run;
  run.first_step = r.start;
  run.end_step = r.total_steps;
  run.total_steps = r.total_steps;
  run.updates = r.start_updates;
  run.stop_after = cfg.stop_after;
  run.checkpoint_every = cfg.checkpoint_every;
  run.optim = cfg.optim;
  run.kl_weight = static_cast<float>(cfg.kl_weight);
  run.selector_alpha = static_cast<float>(cfg.selector_alpha);
  run.recompute = cfg.recompute;
  run.stop = stop;
  run.fault = r.fault.index >= 0 ? &r.fault : nullptr;
  run.proposed_total = r.budgeted && r.lead ? &rec.proposed_total : nullptr;
  const bool heard_from_lead = run_threads(*w, run, plans, jobs, rec, r.lead);
  sum.steps_done = w->drafters[0]->params_step.load();
  sum.updates = w->drafters[0]->updates.load();
  sum.lazy_inits_after_warmup = lazy_init_count() - lazy0;
  if (sum.lazy_inits_after_warmup != 0)
    log_warn("case C01: ", sum.lazy_inits_after_warmup, " lazy initialisation(s) after the warm-up (last: ",
             last_lazy_init(), ")");

  // phase 5: finish
  if (w->control.failed()) fail_job(cfg, r, *w, rec, heard_from_lead);
  finish(cfg, r, *w, rec, sum);
  sum.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return sum;
}

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

}  // namespace dflash
