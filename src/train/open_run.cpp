// train/open_run.cpp — see open_run.h. In order: the options and the topology, the inputs (read_inputs), the run
// directory (hold_run_dir), the resume point (resume_point), the disk space (check_space).
#include "train/open_run.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "backend/mpi.h"          // Mpi: which process writes
#include "core/fs.h"
#include "core/log.h"
#include "core/output_dir.h"      // claim_output_dir
#include "model/draft_batch.h"    // default_gamma
#include "model/draft_loss.h"     // parse_loss_kind, check_dpace_alpha
#include "model/drafter_init.h"   // resolve_init_layers
#include "train/checkpoint.h"     // latest_checkpoint
#include "train/memory_plan.h"    // plan_memory, check_memory_plan
#include "train/run_inputs.h"     // run_inputs, check_resume_inputs
#include "train/step_plan.h"      // count_trainable_samples

namespace dflash {

namespace {

// The keys that must agree between a checkpoint and a resumed run (anything that changes the trajectory), in the
// order they are checked: an option that decides how another is read comes first (the loss before gamma and
// dpace_alpha, the window before the layer types), so that a refusal names the option to give. `implied`: the value
// a checkpoint without the key was made with (no sliding layers, the decayed cross-entropy); null = the key is in
// every checkpoint. The topology is not among them: with another number of drafters a resumed run sees the
// same batches and anchors.
struct ResumeKey {
  const char* key;
  nlohmann::json implied;
};
const ResumeKey kResumeKeys[] = {
    {"arch", "dflash"}, {"conv_kernel_size", 2}, {"conv_group_size", 16}, {"selector_rank", 256},
    {"selector_top_k", 16}, {"selector_alpha", 1.0}, {"loss", "decay"}, {"gamma", nullptr}, {"dpace_alpha", kDefaultDPaceAlpha}, {"sliding_window", 0},
    {"layer_types", nlohmann::json::array()}, {"num_layers", nullptr}, {"block_size", nullptr},
    {"target_layer_ids", nullptr}, {"mask_token_id", nullptr}, {"intermediate_size", nullptr},
    {"max_anchors", nullptr}, {"kl_weight", nullptr}, {"max_length", nullptr}, {"lr", nullptr}, {"beta1", nullptr},
    {"beta2", nullptr}, {"adam_eps", nullptr}, {"weight_decay", nullptr}, {"max_grad_norm", nullptr},
    {"warmup_ratio", nullptr}, {"schedule", nullptr}, {"batch_size", nullptr}, {"seed", nullptr}};

// The train option that sets the config key `k` to `v` ("--loss decay", "--target-layer-ids 1,9,17"): the options
// are the keys with '-' for '_'; an empty list is the option left out. gamma is stored resolved: 0 = uniform
// weights, which --gamma -1 gives (--gamma 0 is the block size's default).
std::string option_for(const char* k, const nlohmann::json& v) {
  std::string flag = k;
  std::replace(flag.begin(), flag.end(), '_', '-');
  const auto text = [](const nlohmann::json& e) { return e.is_string() ? e.get<std::string>() : e.dump(); };
  if (flag == "gamma" && v.is_number() && v.get<double>() == 0) return "--gamma -1";
  if (!v.is_array()) return "--" + flag + " " + text(v);
  if (v.empty()) return "without --" + flag;
  std::string list;
  for (const auto& e : v) list += (list.empty() ? "" : ",") + text(e);
  return "--" + flag + " " + list;
}

// The keys only a DFlash2 drafter has (compared when both runs are DFlash2: "arch" is checked first).
bool is_dflash2_key(const std::string& k) {
  return k == "conv_kernel_size" || k == "conv_group_size" || k == "selector_rank" || k == "selector_top_k" ||
         k == "selector_alpha";
}

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

}  // namespace

DrafterConfig resolve_drafter_config(const TrainConfig& cfg, const ModelConfig& target, int32_t mask_id) {
  std::vector<int64_t> layer_ids = cfg.target_layer_ids;
  if (layer_ids.empty()) layer_ids = default_target_layer_ids(target.num_hidden_layers, cfg.num_target_features);
  validate_target_layer_ids(layer_ids, target.num_hidden_layers);  // distinct, ascending: the exported order
  DrafterConfig dc = DrafterConfig::for_target(target, cfg.num_layers, cfg.block_size, layer_ids, mask_id);
  if (cfg.intermediate_size > 0) dc.intermediate_size = cfg.intermediate_size;
  dc.layer_types = resolve_layer_types(cfg.layer_types, dc.num_layers, cfg.sliding_window);
  dc.sliding_window = dc.layer_types.empty() ? 0 : cfg.sliding_window;
  dc.arch = parse_draft_arch(cfg.arch, "--arch");
  dc.conv_kernel_size = cfg.conv_kernel_size;
  dc.conv_group_size = cfg.conv_group_size;
  dc.selector_rank = cfg.selector_rank;
  dc.selector_top_k = cfg.selector_top_k;
  return dc;
}

Topology parse_topology(const TrainConfig& c) {
  Topology t;
  DFLASH_CHECK(c.target_split >= 1, "--target-split ", c.target_split, ": give a number of stages >= 1");
  t.split = c.target_split;
  const int S = c.target_split;
  const bool cuda = c.device == "cuda" || c.device.rfind("cuda:", 0) == 0;
  DFLASH_CHECK(S == 1 || !c.colocate, "--target-split ", S, " with --colocate: give the stages' devices with "
               "--targets and the drafters' with --drafters");
  if (!cuda) {
    DFLASH_CHECK(c.device == "cpu" || c.device == "cpu64", "unknown device '", c.device, "' (cpu, cpu64, cuda, cuda:N)");
    t.backend = c.device;
    const int nd = parse_count(c.drafters, "--drafters");
    // CPU: --targets counts CPU devices (S per target worker); none given: one worker
    const int nt = c.colocate && c.targets.empty() ? nd : c.targets.empty() ? S : parse_count(c.targets, "--targets");
    DFLASH_CHECK(nt % S == 0, "--targets ", c.targets, " with --target-split ", S, ": the ", nt,
                 " target devices are not a whole number of workers of ", S, " stages (give a multiple of ", S, ")");
    t.targets.assign(static_cast<size_t>(nt), 0);
    t.drafters.assign(static_cast<size_t>(nd), 0);
    return t;
  }
  t.backend = "cuda";
  const int dev = c.device.size() > 5 ? std::stoi(c.device.substr(5)) : 0;
  if (c.targets.empty() && c.drafters.empty()) {
    t.drafters = {dev};
    t.targets.assign(static_cast<size_t>(S), dev);  // every stage on the one device
  } else if (c.colocate) {
    DFLASH_CHECK(c.targets.empty() || c.drafters.empty() || c.targets == c.drafters,
                 "--colocate: give the devices once (--drafters 0,1 or --targets 0,1)");
    t.targets = t.drafters = parse_index_list(c.drafters.empty() ? c.targets : c.drafters, "--drafters");
  } else {
    DFLASH_CHECK(!c.targets.empty() && !c.drafters.empty(),
                 "give both --targets and --drafters (device lists), or --colocate with one list");
    t.targets = parse_index_list(c.targets, "--targets");
    t.drafters = parse_index_list(c.drafters, "--drafters");
    DFLASH_CHECK(t.targets.size() % static_cast<size_t>(S) == 0, "--targets ", c.targets, " with --target-split ", S,
                 ": the ", t.targets.size(), " devices are not a whole number of workers of ", S,
                 " stages (give a multiple of ", S, ")");
  }
  return t;
}

namespace {

// The data, the tokenizer, the target's and the drafter's shapes; the config as recorded; this run's inputs.
void read_inputs(const TrainConfig& cfg, OpenedRun& r) {
  DFLASH_CHECK(r.data.size() > 0, cfg.data_dir, ": no samples");
  r.n = static_cast<int64_t>(r.data.size());
  r.tc = load_model_config(cfg.target_dir);
  std::shared_ptr<const Tokenizer> tok;
  if (Tokenizer::found_in(cfg.target_dir)) tok = Tokenizer::load(cfg.target_dir);
  const auto& man = r.data.manifest();
  if (tok && man.contains("tokenizer") && man["tokenizer"].contains("sha256")) {
    DFLASH_CHECK(man["tokenizer"]["sha256"].get<std::string>() == tok->hash(), cfg.data_dir,
                 "/manifest.json: the data was tokenized with a different tokenizer (sha256 ",
                 man["tokenizer"]["sha256"].get<std::string>(), ") than ", tok->source(), " (",
                 tok->hash(), "); prepare the data again with the target's tokenizer");
  }
  validate_mask_token_id(cfg.mask_token_id);  // -1 (the tokenizer's) or an id >= 0
  int32_t mask_id = cfg.mask_token_id;
  if (mask_id < 0 && tok && tok->mask_id()) mask_id = *tok->mask_id();
  DFLASH_CHECK(mask_id >= 0, "train: no mask token id: pass --mask-token-id (an existing, unused row of the "
               "target's embedding) or use a tokenizer that defines one (e.g. <|MASK|>)");
  r.dc = resolve_drafter_config(cfg, r.tc, mask_id);
  const DrafterConfig& dc = r.dc;
  DFLASH_CHECK(cfg.selector_alpha >= 0, "--selector-alpha ", cfg.selector_alpha, " must be >= 0");
  {  // the DFlash2 options mean nothing to a DFlash drafter: say so rather than ignore them silently
    const TrainConfig dflt;
    if (!dc.dflash2() &&
        (cfg.conv_kernel_size != dflt.conv_kernel_size || cfg.conv_group_size != dflt.conv_group_size ||
         cfg.selector_rank != dflt.selector_rank || cfg.selector_top_k != dflt.selector_top_k ||
         cfg.selector_alpha != dflt.selector_alpha))
      log_warn("train: --conv-kernel-size, --conv-group-size, --selector-rank, --selector-top-k and --selector-alpha "
               "apply to --arch dflash2 only; this run trains a dflash drafter and ignores them");
  }
  dc.validate();
  if (dc.sliding_window > 0 && dc.sliding_window < dc.block_size)
    log_warn("train: --sliding-window ", dc.sliding_window, " is smaller than the block (", dc.block_size,
             "): spec 2.3 keeps a slot's whole causal block prefix, while Hugging Face-style sliding masks in serving "
             "engines also drop block keys more than W-1 slots back; the two agree only for W >= B");
  // where the weights start (model/drafter_init.h); only step 0 depends on it, so resume does not compare it
  r.init_layers = resolve_init_layers(cfg.init_from_target, dc);
  DFLASH_CHECK(cfg.init_fc == "random" || cfg.init_fc == "last", "--init-fc: '", cfg.init_fc,
               "' is not one of random, last");
  r.init_from_target = !r.init_layers.empty() || cfg.init_fc != "random";
  DFLASH_CHECK(!r.init_from_target || !cfg.random_target, "--init-from-target / --init-fc last start the drafter "
               "from the target's checkpoint: not with --random-target");
  r.gamma = cfg.gamma == 0 ? default_gamma(dc.block_size) : (cfg.gamma < 0 ? 0.0 : cfg.gamma);
  r.soft = cfg.kl_weight > 0;
  const LossKind loss = parse_loss_kind(cfg.loss, "--loss");
  check_dpace_alpha(cfg.dpace_alpha, "--dpace-alpha");  // checked with either loss: a typo never waits for a switch
  if (loss == LossKind::DPace) {
    r.dpace_alpha = cfg.dpace_alpha;
    if (cfg.gamma != 0)
      log_warn("train: --gamma ", cfg.gamma, " is unused with --loss dpace (D-PACE's weights replace the decay)");
  }

  // A run that can learn nothing fails before it starts (no sample has a supervised pair after truncation).
  const int64_t trainable = count_trainable_samples(r.data, cfg.max_length);
  DFLASH_CHECK(trainable > 0, cfg.data_dir, ": none of the ", r.n, " samples has two consecutive supervised tokens",
               cfg.max_length > 0 ? cat(" within --max-length ", cfg.max_length) : std::string(),
               " (spec 2.1: an anchor needs loss_mask[a] = loss_mask[a+1] = 1), so training would learn nothing. "
               "Check the loss masks (prepare's assistant mask) or raise --max-length");
  if (trainable < r.n)
    log_info(r.n - trainable, " of ", r.n, " samples have no anchor", cfg.max_length > 0 ? " within --max-length" : "",
             " and will be skipped (counted per step as skipped_no_anchor)");

  r.epoch_total = r.total_steps =
      cfg.max_steps > 0 ? cfg.max_steps
                        : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cfg.epochs * r.n / cfg.batch_size)));
  r.cfg_json = cfg;
  r.cfg_json["target_layer_ids"] = dc.target_layer_ids;
  r.cfg_json["mask_token_id"] = mask_id;
  r.cfg_json["intermediate_size"] = dc.intermediate_size;
  r.cfg_json["gamma"] = r.gamma;
  r.cfg_json["loss"] = loss_kind_name(loss);
  r.cfg_json["init_from_target"] = r.init_layers;
  r.cfg_json["layer_types"] = dc.layer_types;  // resolved: empty = every layer full attention
  r.cfg_json["sliding_window"] = dc.sliding_window;
  r.cfg_json["data"] = data_provenance(man);  // how the data was made: in every checkpoint and the export
  r.inputs = run_inputs(cfg.target_dir, cfg.random_target, cfg.seed, tok ? tok->hash() : "", man);
}

// Process 0 takes the run directory: its lock first (a second job fails here, naming the holder), then the claim
// (an earlier result needs --resume or --overwrite; a refused start leaves the directory byte for byte as it was),
// then — the directory being ours alone — the temporaries of an interrupted write go.
void hold_run_dir(const TrainConfig& cfg, OpenedRun& r) {
  r.lock = RunLock::acquire(cfg.out_dir, "dflash train");
  try {
    claim_output_dir(cfg.out_dir, cfg.resume, cfg.overwrite, OutputOf::Train);
  } catch (...) {
    r.lock.restore_and_release();
    throw;
  }
  if (!r.lock.held()) return;  // no lock support: another process may be writing them
  int64_t bytes = 0;
  std::string names;
  const auto removed = remove_run_temporaries(cfg.out_dir);
  for (const RemovedTemporary& t : removed) {
    bytes += t.bytes;
    names += cat(names.empty() ? "" : ", ", t.path, " (", format_bytes(t.bytes), ")");
  }
  if (!removed.empty())
    log_info("train: removed ", removed.size(), " temporar", removed.size() == 1 ? "y" : "ies",
             " an interrupted run left behind, ", format_bytes(bytes), " (", bytes, " bytes) in all: ", names);
}

// Where the run starts: step 0, or the checkpoint LATEST names, whose settings and inputs must be this run's.
void resume_point(const TrainConfig& cfg, OpenedRun& r) {
  r.latest = cfg.resume ? latest_checkpoint(cfg.out_dir) : "";
  r.budgeted = cfg.time_budget_s > 0 && cfg.max_steps <= 0;
  if (r.latest.empty()) {
    if (cfg.resume) log_info("no checkpoint in ", cfg.out_dir, "/checkpoints: starting from step 0");
    r.cfg_json["data_changes"] = nlohmann::json::array();
    return;
  }
  const std::string state_path = path_join(r.latest, "state.json");
  nlohmann::json info;
  try {
    info = nlohmann::json::parse(read_file(state_path));
    DFLASH_CHECK(info.is_object() && info.contains("config") && info.contains("step"), state_path,
                 ": no \"config\" or \"step\"");
  } catch (const nlohmann::json::exception& e) {
    DFLASH_FAIL(state_path, ": invalid JSON: ", e.what());
  }
  const auto& old = info["config"];
  // a setting that differs names the option that gives the checkpoint's value (a checkpoint trained with a value
  // that is not today's default, such as --loss decay, resumes only with it spelled out)
  const bool dpace = parse_loss_kind(r.cfg_json["loss"].get<std::string>(), "--loss") == LossKind::DPace;
  const bool dflash2 = r.dc.dflash2();
  for (const auto& [k, implied] : kResumeKeys) {
    // the same loss by now: the other objective's parameter does not change the trajectory
    if (std::string(k) == (dpace ? "gamma" : "dpace_alpha")) continue;
    if (!dflash2 && is_dflash2_key(k)) continue;  // the same arch by now: a DFlash run has no selector
    DFLASH_CHECK(old.contains(k) || !implied.is_null(), state_path, ": the checkpoint's config has no \"", k, "\"");
    const nlohmann::json& was = old.contains(k) ? old[k] : implied;
    DFLASH_CHECK(was == r.cfg_json[k], r.latest, "/state.json: the checkpoint was made with ", k, " = ", was.dump(),
                 ", this run has ", r.cfg_json[k].dump(), "; resume needs the same setting (", option_for(k, was), ")");
  }
  r.start = info.at("step").get<int64_t>();
  const ResumeInputs ri = check_resume_inputs(info, r.inputs, r.cfg_json["data"], cfg.allow_data_change, r.latest,
                                              r.start);
  r.cfg_json["data_changes"] = ri.data_changes;
  r.start_updates = info.value("updates", r.start);
  r.total_steps = info.value("total_steps", r.total_steps);
  // A larger --max-steps extends the run: from the step it resumes at, the learning rate follows the schedule of the
  // new count (its warm-up and cosine over all of its steps, lr_at), the data order and anchors go on as those of a
  // run of the new count from step 0 would. Each extension is recorded in the config ("extensions"), so that the
  // checkpoints and the export say how the run was trained.
  nlohmann::json extensions = old.value("extensions", nlohmann::json::array());
  if (cfg.max_steps > r.total_steps) {
    log_info("resume: extending the run from ", r.total_steps, " to ", cfg.max_steps, " steps (--max-steps); from step ",
             r.start, " on the learning rate follows the schedule of ", cfg.max_steps, " steps");
    extensions.push_back({{"step", r.start}, {"from_total_steps", r.total_steps}, {"to_total_steps", cfg.max_steps}});
    r.total_steps = cfg.max_steps;
  }
  if (!extensions.empty()) r.cfg_json["extensions"] = extensions;
  // a time budget goes on with what is left of it (a checkpoint from before "train_seconds" keeps its step count)
  r.budgeted = r.budgeted && info.contains("train_seconds");
  r.seconds_before = info.value("train_seconds", 0.0);
  if (r.budgeted && r.seconds_before >= cfg.time_budget_s && r.total_steps > r.start) {
    log_info("resume: the time budget of ", cfg.time_budget_s, " s is spent (", r.seconds_before,
             " s of training before): the run ends at step ", r.start);
    r.total_steps = r.start;
  }
}

// Before step 1: what the checkpoints (under --keep-checkpoints) and the export will take, against the free space.
void check_space(const TrainConfig& cfg, const OpenedRun& r) {
  const RunSpace s = plan_run_space(cfg.out_dir, r.dc, cfg.keep_checkpoints, cfg.checkpoint_every, r.start,
                                    r.total_steps, cfg.export_at_end);
  if (s.enough()) return;
  DFLASH_CHECK(!cfg.require_space, "train --require-space: not enough free space for this run: it will hold ",
               s.describe(cfg.out_dir, cfg.keep_checkpoints),
               ". Free some, lower --keep-checkpoints, or give another --out");
  log_warn("train: the run may run out of disk space: it will hold ", s.describe(cfg.out_dir, cfg.keep_checkpoints),
           " (--require-space refuses to start then; a checkpoint that does not fit stops the run, the previous one "
           "intact)");
}

// Before anything loads: the bytes every device of the layout will hold against what it has free (train/memory_plan.h);
// a layout that does not fit is refused, naming the device, the bytes and a layout that fits.
void check_memory(const TrainConfig& cfg, const OpenedRun& r) {
  int64_t longest = 0;
  for (size_t i = 0; i < r.data.size(); ++i)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(r.data.get(i).tokens.size()));
  const int64_t assumed = cfg.device_memory.empty() ? 0 : parse_bytes(cfg.device_memory, "--device-memory");
  const MemoryPlanInputs in = memory_plan_inputs(cfg, longest, r.nproc);
  const MemoryPlan plan = plan_memory(in);
  check_memory_plan(in, plan, assumed);
  for (const auto& [pool, need] : plan.needed()) {
    const int64_t f = pool_free_bytes(pool, assumed);
    log_info("memory plan: ", pool, " ", format_bytes(need), f >= 0 ? cat(" of ", format_bytes(f), " free") : "",
             " (dflash info --plan: the table)");
  }
}

}  // namespace

OpenedRun open_run(const TrainConfig& cfg) {
  DFLASH_CHECK(!cfg.target_dir.empty(), "train: target_dir is not set");
  DFLASH_CHECK(!cfg.data_dir.empty(), "train: data_dir is not set");
  DFLASH_CHECK(!cfg.out_dir.empty(), "train: out_dir is not set");
  DFLASH_CHECK(cfg.batch_size > 0, "train: batch_size must be > 0");
  DFLASH_CHECK(cfg.queue_depth > 0, "train: queue_depth must be > 0");
  DFLASH_CHECK(!cfg.allow_data_change || cfg.resume, "train: --allow-data-change goes with --resume (it lets a "
               "resumed run continue on other data)");
  if (Mpi::launched()) Mpi::init();
  OpenedRun r(Dataset::open(cfg.data_dir));
  r.lead = Mpi::rank() == 0;
  r.nproc = Mpi::size();
  r.topo = parse_topology(cfg);
  r.fault = FaultPlan::parse(cfg.inject_fault);
  read_inputs(cfg, r);
  check_memory(cfg, r);
  // An earlier run in out_dir is refused unless --resume / --overwrite; checked once every input is valid, so a
  // bad option never costs the old run.
  if (r.lead) hold_run_dir(cfg, r);
  resume_point(cfg, r);
  if (r.lead) {
    check_space(cfg, r);
    // the first write of the run: a refused start leaves no metrics.jsonl behind
    r.metrics = std::make_unique<MetricsLog>(path_join(cfg.out_dir, "metrics.jsonl"), r.latest.empty() ? -1 : r.start);
  }
  return r;
}

}  // namespace dflash
