#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/output_dir.h"
#include "io/dataset.h"
#include "io/tokenizer.h"
#include "model/drafter.h"
#include "model/export.h"
#include "model/target.h"
#include "train/checkpoint.h"
#include "train/draft_batch.h"

namespace dflash {

void to_json(nlohmann::json& j, const TrainConfig& c) {
  j = nlohmann::json{{"target_dir", c.target_dir},
                     {"data_dir", c.data_dir},
                     {"out_dir", c.out_dir},
                     {"device", c.device},
                     {"num_layers", c.num_layers},
                     {"block_size", c.block_size},
                     {"target_layer_ids", c.target_layer_ids},
                     {"num_target_features", c.num_target_features},
                     {"mask_token_id", c.mask_token_id},
                     {"intermediate_size", c.intermediate_size},
                     {"init_std", c.init_std},
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

// The keys that must agree between a checkpoint and a resumed run (anything that changes the trajectory).
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

// Sample order: epoch e visits a permutation of [0, n) drawn from Rng(seed, DataOrder, e).
class SampleOrder {
 public:
  SampleOrder(size_t n, uint64_t seed) : n_(n), seed_(seed) {}
  size_t at(int64_t global_index) {
    const int64_t e = global_index / static_cast<int64_t>(n_);
    auto it = perms_.find(e);
    if (it == perms_.end()) {
      if (perms_.size() > 2) perms_.erase(perms_.begin());
      std::vector<size_t> p(n_);
      for (size_t i = 0; i < n_; ++i) p[i] = i;
      Rng rng(seed_, RngPurpose::DataOrder, static_cast<uint64_t>(e));
      for (size_t i = n_; i > 1; --i) std::swap(p[i - 1], p[rng.below(i)]);
      it = perms_.emplace(e, std::move(p)).first;
    }
    return it->second[static_cast<size_t>(global_index % static_cast<int64_t>(n_))];
  }

 private:
  size_t n_;
  uint64_t seed_;
  std::map<int64_t, std::vector<size_t>> perms_;
};

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

}  // namespace

TrainSummary train(const TrainConfig& cfg, const std::atomic<bool>* stop) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  DFLASH_CHECK(!cfg.target_dir.empty(), "train: target_dir is not set");
  DFLASH_CHECK(!cfg.data_dir.empty(), "train: data_dir is not set");
  DFLASH_CHECK(!cfg.out_dir.empty(), "train: out_dir is not set");
  DFLASH_CHECK(cfg.batch_size > 0, "train: batch_size must be > 0");
  claim_output_dir(cfg.out_dir, cfg.resume, cfg.overwrite, OutputOf::Train);  // an earlier run: --resume/--overwrite

  auto ctx = make_context(cfg.device, {.threads = cfg.threads, .profile_ops = cfg.profile});
  Dataset data = Dataset::open(cfg.data_dir);
  DFLASH_CHECK(data.size() > 0, cfg.data_dir, ": no samples");
  auto target = Target::load(cfg.target_dir, *ctx);
  const ModelConfig& tc = target->config();

  // tokenizer: the mask token and a check that the data was tokenized by the target's tokenizer
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
  Drafter drafter(*ctx, dc, cfg.seed, cfg.init_std);
  const int64_t B = dc.block_size;
  const double gamma = cfg.gamma == 0 ? default_gamma(B) : (cfg.gamma < 0 ? 0.0 : cfg.gamma);
  const bool soft = cfg.kl_weight > 0;
  const int64_t n = static_cast<int64_t>(data.size());
  SampleOrder order(data.size(), cfg.seed);

  // Gradients of optimizer step `step` (data order, anchors and loss of spec 2), accumulated into the drafter's
  // grads, globally normalised by the step's total weight.
  struct StepAcc {
    int64_t seqs = 0, skipped = 0, draft_tokens = 0, target_tokens = 0;
    double sum_w = 0, loss_sum = 0, ce_sum = 0, kl_sum = 0;
    std::vector<double> correct, count;
  };
  auto accumulate = [&](int64_t step) {
    StepAcc acc;
    acc.correct.assign(static_cast<size_t>(B), 0.0);
    acc.count.assign(static_cast<size_t>(B), 0.0);
    struct Seq {
      std::span<const int32_t> tokens;
      DraftBatch batch;
    };
    std::vector<Seq> seqs;
    for (int64_t k = 0; k < cfg.batch_size; ++k) {
      SampleView s = data.get(order.at(step * cfg.batch_size + k));
      std::span<const int32_t> toks = s.tokens;
      std::span<const uint8_t> mask = s.loss_mask;
      if (cfg.max_length > 0 && static_cast<int64_t>(toks.size()) > cfg.max_length) {
        toks = toks.subspan(0, static_cast<size_t>(cfg.max_length));
        mask = mask.subspan(0, static_cast<size_t>(cfg.max_length));
      }
      Rng rng(cfg.seed, RngPurpose::Anchors, static_cast<uint64_t>(step), static_cast<uint64_t>(k));
      std::vector<int32_t> anchors = sample_anchors(mask, cfg.max_anchors, rng);
      if (anchors.empty()) {  // spec 2.1.3: skipped and counted, never silently
        ++acc.skipped;
        continue;
      }
      DraftBatch b = make_draft_batch(toks, mask, anchors, static_cast<int64_t>(anchors.size()), B, mask_id, gamma);
      acc.sum_w += b.sum_w;
      seqs.push_back({toks, std::move(b)});
    }
    acc.seqs = static_cast<int64_t>(seqs.size());
    if (acc.sum_w == 0) return acc;
    for (auto& sq : seqs) {
      const int64_t S = static_cast<int64_t>(sq.tokens.size());
      Tensor ids = cpu_tensor_i32(std::vector<int32_t>(sq.tokens.begin(), sq.tokens.end()), {S});
      Target::Output out = target->forward(*ctx, ids, layer_ids, soft);
      DraftInputs in = upload_draft_batch(*ctx, sq.batch, out.features, soft ? out.final_hidden : Tensor{});
      out = Target::Output{};
      DraftStepStats st = drafter.forward_backward(*ctx, in, target->weights().embed, target->weights().lm_head,
                                                   static_cast<float>(cfg.kl_weight),
                                                   static_cast<float>(1.0 / acc.sum_w), true, cfg.recompute);
      acc.loss_sum += st.loss_sum;
      acc.ce_sum += st.ce_sum;
      acc.kl_sum += st.kl_sum;
      for (size_t r = 0; r < st.correct.size(); ++r) {
        acc.correct[sq.batch.slots[r]] += st.correct[r];
        acc.count[sq.batch.slots[r]] += 1;
      }
      acc.draft_tokens += sq.batch.N * B;
      acc.target_tokens += S;
    }
    return acc;
  };

  int64_t total_steps =
      cfg.max_steps > 0 ? cfg.max_steps
                        : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cfg.epochs * n / cfg.batch_size)));
  nlohmann::json cfg_json = cfg;
  cfg_json["target_layer_ids"] = layer_ids;
  cfg_json["mask_token_id"] = mask_id;
  cfg_json["intermediate_size"] = dc.intermediate_size;
  cfg_json["gamma"] = gamma;
  cfg_json["data"] = data_provenance(man);  // how the data was made: in every checkpoint and the export

  int64_t start = 0;
  const std::string metrics_path = path_join(cfg.out_dir, "metrics.jsonl");
  const std::string latest = cfg.resume ? latest_checkpoint(cfg.out_dir) : "";
  if (!latest.empty()) {
    CheckpointState st = load_checkpoint(*ctx, latest, drafter.params());
    const auto& old = st.info.at("config");
    for (const char* k : kResumeKeys)
      DFLASH_CHECK(old.contains(k) && old[k] == cfg_json[k], latest, "/state.json: the checkpoint was made with ", k,
                   " = ", old.contains(k) ? old[k].dump() : "(absent)", ", this run has ", cfg_json[k].dump(),
                   "; resume needs the same setting");
    start = st.step;
    total_steps = st.info.value("total_steps", total_steps);
    truncate_metrics(metrics_path, start);
    log_info("resumed from ", latest, " at step ", start, " of ", total_steps);
  } else {
    if (cfg.resume) log_info("no checkpoint in ", cfg.out_dir, "/checkpoints: starting from step 0");
    write_file_atomic(metrics_path, "");
    if (cfg.time_budget_s > 0 && cfg.max_steps <= 0) {
      // Fit the run into the budget: time two steps' gradients (then discard them) and plan the schedule on that.
      const auto c0 = clock::now();
      for (int64_t s = 0; s < 2; ++s) accumulate(s);
      ctx->synchronize();
      drafter.params().zero_grad(*ctx);
      const double per_step = std::chrono::duration<double>(clock::now() - c0).count() / 2 * 1.05;
      const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(cfg.time_budget_s / per_step));
      log_info("time budget ", cfg.time_budget_s, " s at ~", per_step, " s/step: ", std::min(fit, total_steps),
               " steps (", total_steps, " for ", cfg.epochs, " epochs)");
      total_steps = std::min(fit, total_steps);
    }
  }
  log_info("device ", ctx->describe(), "; target ", arch_name(tc.arch), " ", tc.num_hidden_layers, " layers, H ",
           tc.hidden_size, "; drafter ", dc.num_layers, " layers, B ", B, ", layer ids ",
           nlohmann::json(layer_ids).dump(), ", mask id ", mask_id, ", ", drafter.params().numel(), " parameters");
  log_info("data ", n, " samples, ", data.total_tokens(), " tokens; ", total_steps, " steps of ", cfg.batch_size,
           " sequences (", cfg.max_steps > 0 ? cat("max_steps") : cat(cfg.epochs, " epochs"), ")");

  std::ofstream metrics(metrics_path, std::ios::app);
  DFLASH_CHECK(metrics.good(), metrics_path, ": cannot open for appending");
  TrainSummary sum;
  sum.total_steps = total_steps;
  std::unique_ptr<Progress> progress;
  if (!cfg.quiet) progress = std::make_unique<Progress>("train", total_steps, "step", 10.0);
  int64_t last_saved = start;
  int64_t step = start;

  for (; step < total_steps; ++step) {
    const auto t0 = clock::now();
    const double lr = lr_at(cfg.optim, step, total_steps);
    ctx->reset_peak_memory();
    const StepAcc sa = accumulate(step);
    nlohmann::json rec;
    rec["step"] = step + 1;
    rec["epoch"] = static_cast<double>((step + 1) * cfg.batch_size) / static_cast<double>(n);
    rec["lr"] = lr;
    rec["seqs"] = sa.seqs;
    rec["skipped_no_anchor"] = sa.skipped;
    if (sa.sum_w == 0) {
      log_warn("step ", step + 1, ": none of the ", cfg.batch_size, " sequences has a supervised pair; no update");
      rec["loss"] = nullptr;
      metrics << rec.dump() << "\n" << std::flush;
      continue;
    }
    const double sum_w = sa.sum_w, loss_sum = sa.loss_sum, ce_sum = sa.ce_sum, kl_sum = sa.kl_sum;
    const std::vector<double>&correct = sa.correct, &count = sa.count;
    const int64_t draft_tokens = sa.draft_tokens, target_tokens = sa.target_tokens;
    const double grad_sq = global_grad_sq(*ctx, drafter.params());
    StepResult res = optimizer_step(*ctx, drafter.params(), cfg.optim, lr, step + 1, grad_sq);
    ctx->synchronize();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    std::vector<double> acc(static_cast<size_t>(B), 0.0);
    for (int64_t i = 1; i < B; ++i) acc[i] = count[i] > 0 ? correct[i] / count[i] : 0.0;
    const double loss = loss_sum / sum_w, eal = expected_acceptance(acc);
    rec["loss"] = loss;
    rec["ce"] = ce_sum / sum_w;
    if (soft) rec["kl"] = kl_sum / sum_w;
    rec["acc"] = acc;
    rec["eal"] = eal;
    rec["grad_norm"] = res.grad_norm;
    rec["clip"] = res.clip_scale;
    rec["draft_tokens"] = draft_tokens;
    rec["target_tokens"] = target_tokens;
    rec["step_s"] = dt;
    rec["draft_tokens_per_s"] = draft_tokens / dt;
    rec["peak_mem_bytes"] = ctx->memory().peak_bytes;
    metrics << rec.dump() << "\n" << std::flush;
    sum.last_loss = loss;
    sum.last_eal = eal;
    if (progress) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "loss %.3f | EAL %.2f | acc1 %.2f | lr %.2e | %s draft tok/s", loss, eal,
                    B > 1 ? acc[1] : 0.0, lr, fmt_tokens(draft_tokens / dt).c_str());
      progress->update(step + 1, buf);
    }
    const bool interrupt = (stop && stop->load()) || (cfg.stop_after > 0 && step + 1 >= cfg.stop_after);
    if ((cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) || interrupt) {
      sum.checkpoint_dir = save_checkpoint(*ctx, cfg.out_dir, drafter.params(), {step + 1, {{"config", cfg_json}, {"total_steps", total_steps}}});
      prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
      last_saved = step + 1;
    }
    if (interrupt) {
      ++step;
      sum.interrupted = true;
      break;
    }
  }
  if (progress) progress->finish();
  sum.steps_done = step;
  if (last_saved != step || (sum.checkpoint_dir.empty() && latest.empty())) {
    sum.checkpoint_dir = save_checkpoint(*ctx, cfg.out_dir, drafter.params(), {step, {{"config", cfg_json}, {"total_steps", total_steps}}});
    prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
  }
  if (sum.interrupted) {
    log_info("interrupted after step ", step, ": checkpoint ", sum.checkpoint_dir, " (continue with --resume)");
  } else if (cfg.export_at_end) {
    nlohmann::json training = training_record(step, cfg_json);
    sum.export_dir = path_join(cfg.out_dir, "export");
    export_drafter(*ctx, sum.export_dir, dc, drafter.params(), training);
    log_info("exported the drafter to ", sum.export_dir);
  }
  sum.seconds = std::chrono::duration<double>(clock::now() - t_start).count();
  if (cfg.profile) {
    const std::string path = path_join(cfg.out_dir, "profile.txt");
    write_file_atomic(path, cat("# dflash train: time per op over ", step, " steps on ", ctx->describe(),
                                " (every op of the run: target forward, drafter steps, optimizer; GEMMs as M x N x K)\n",
                                format_op_profile(ctx->op_profile())));
    log_info("per-op profile: ", path);
  }
  return sum;
}

}  // namespace dflash
