// cli/cmd_eval.cpp — `dflash eval`: acceptance length tau of a drafter against its target on a prepared data
// directory (spec 4): teacher-forced and/or by real speculative decoding, with the acceptance histogram and the
// target-only vs speculative decode throughput. Warns, naming each field, when the data was prepared with another
// tokenizer, template or template flags than the drafter's training data (the provenance its export records).
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "cli/commands.h"
#include "cli/target_devices.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "eval/generate.h"
#include "eval/tau.h"
#include "io/dataset.h"
#include "io/tokenizer.h"
#include "model/export.h"
#include "model/target.h"

namespace dflash::cli {

namespace {

struct EvalCli {
  std::string target, drafter, data, device = "cpu", mode = "both", json_out, arch = "dflash";
  int64_t max_samples = 0, max_new_tokens = 0, anchors_per_forward = 256;
  bool untrained = false, no_baseline = false, no_progress = false;
  uint64_t seed = 0;
  int64_t block_size = 16, draft_layers = 1, num_target_layers = 0;
  int32_t mask_token_id = -1;
  int target_split = 1;
  std::vector<int32_t> stop_ids;
};

void run(const EvalCli& c) {
  DFLASH_CHECK(c.untrained != !c.drafter.empty(), "eval: give exactly one of --drafter DIR and --untrained-drafter");
  TargetOnDevices on = load_target_on_devices(c.target, c.device, c.target_split);
  Context* ctx = &on.ctx();  // the drafter's, stage 0's
  const SplitTarget& target = *on.target;
  const ModelConfig& tc = target.config();
  std::shared_ptr<const Tokenizer> tok;
  if (Tokenizer::found_in(c.target)) tok = Tokenizer::load(c.target);

  Dataset data = Dataset::open(c.data);
  const nlohmann::json& man = data.manifest();
  if (tok && man.contains("tokenizer") && man["tokenizer"].is_object() && man["tokenizer"].contains("sha256") &&
      man["tokenizer"]["sha256"] != tok->hash())
    log_warn("eval: ", c.data, " was prepared with a different tokenizer (sha256 ",
             man["tokenizer"]["sha256"].dump(), ") than the target's ", tok->hash());

  std::unique_ptr<Drafter> drafter;
  nlohmann::json drafter_desc;
  std::vector<std::string> data_diffs;  // how the evaluated data was made vs the drafter's training data
  if (c.untrained) {
    validate_mask_token_id(c.mask_token_id);
    int32_t mask = c.mask_token_id;
    if (mask < 0 && tok && tok->mask_id()) mask = *tok->mask_id();
    DFLASH_CHECK(mask >= 0, "eval --untrained-drafter: no mask token (the tokenizer defines none); pass "
                 "--mask-token-id");
    const int64_t nf = c.num_target_layers > 0 ? c.num_target_layers : std::min<int64_t>(5, tc.num_hidden_layers);
    DrafterConfig dc = DrafterConfig::for_target(tc, c.draft_layers, c.block_size,
                                                 default_target_layer_ids(tc.num_hidden_layers, nf), mask);
    dc.arch = parse_draft_arch(c.arch, "--arch");  // DFlash2's other settings: the published defaults
    dc.validate();
    drafter = std::make_unique<Drafter>(*ctx, dc, c.seed);
    drafter_desc = {{"untrained", true}, {"seed", c.seed}, {"config", dc}};
    log_info("eval: untrained drafter (random init, seed ", c.seed, "), B ", dc.block_size, ", ", dc.num_layers,
             " layers, target layers ", nlohmann::json(dc.target_layer_ids).dump());
  } else {
    drafter = load_exported_drafter(*ctx, c.drafter);
    drafter_desc = {{"dir", c.drafter}, {"config", drafter->config()}};
    log_info("eval: drafter ", c.drafter, ", B ", drafter->config().block_size, ", ",
             drafter->config().num_layers, " layers");
    // A different template or flags between the training data and the evaluated data (as between training and
    // serving) is a known cause of drafters that look good in training and accept poorly in serving: say so.
    const nlohmann::json training = read_exported_drafter(c.drafter).training;
    data_diffs = provenance_differences(training.is_object() ? training.value("data", nlohmann::json()) : nullptr,
                                        data_provenance(man));
    if (!data_diffs.empty()) {
      log_warn("eval: ", c.data, " was not prepared like the data the drafter was trained on (", data_diffs.size(),
               " difference", data_diffs.size() > 1 ? "s" : "", "); tau here may not be the tau the drafter "
               "reaches on its own template and flags:");
      for (const std::string& d : data_diffs) log_warn("eval:   ", d);
    }
  }

  TauOptions o;
  o.teacher = c.mode == "teacher" || c.mode == "both";
  o.generated = c.mode == "generate" || c.mode == "both";
  o.baseline = !c.no_baseline;
  o.max_samples = c.max_samples;
  o.max_new_tokens = c.max_new_tokens;
  o.eos_ids = stop_token_ids(c.target, tc, tok.get());
  o.eos_ids.insert(o.eos_ids.end(), c.stop_ids.begin(), c.stop_ids.end());
  o.progress = !c.no_progress;

  std::vector<SampleView> samples;
  const size_t n = c.max_samples > 0 ? std::min<size_t>(data.size(), static_cast<size_t>(c.max_samples))
                                     : data.size();
  for (size_t i = 0; i < n; ++i) samples.push_back(data.get(i));
  DFlashDraftModel dm(*drafter, tc, target.head(*ctx), c.anchors_per_forward);
  TauReport rep = evaluate_tau(*ctx, target, dm, samples, o);
  std::printf("%s", rep.table().c_str());
  if (!c.json_out.empty()) {
    nlohmann::json j = rep.to_json();
    j["target"] = c.target;
    j["data"] = c.data;
    j["drafter"] = drafter_desc;
    j["data_provenance_differences"] = data_diffs;
    j["device"] = ctx->describe();
    j["target_split"] = c.target_split;
    j["mode"] = c.mode;
    j["max_new_tokens"] = c.max_new_tokens;
    j["stop_ids"] = o.eos_ids;
    write_file_atomic(c.json_out, j.dump(2) + "\n");
    log_info("eval: wrote ", c.json_out);
  }
  DFLASH_CHECK(rep.evaluated > 0, "eval: none of the ", rep.samples, " samples has a response to evaluate (a prompt "
               "and at least 2 response tokens)");
}

}  // namespace

void register_eval(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "acceptance length tau of a drafter (spec 4, greedy): teacher-forced and by "
                                 "real speculative decoding, acceptance histogram, target-only vs speculative tokens/s");
  auto c = std::make_shared<EvalCli>();
  sub->add_option("--target", c->target, "target model directory")->required();
  sub->add_option("--drafter", c->drafter, "exported drafter directory (config.json + model.safetensors)");
  sub->add_flag("--untrained-drafter", c->untrained, "evaluate a randomly initialised drafter instead (a baseline; "
                "see --seed, --block-size, --draft-layers, --num-target-layers, --mask-token-id)");
  sub->add_option("--data", c->data, "data directory written by `dflash prepare`; each sample's response is its last "
                  "run of loss-mask-1 tokens, the prompt everything before it")
      ->required();
  sub->add_option("--device", c->device, "cpu | cuda | cuda:N")->capture_default_str();
  add_target_split_option(sub, c->target_split);
  sub->add_option("--mode", c->mode, "teacher (offline, teacher forcing), generate (real speculative decoding), both")
      ->capture_default_str()
      ->check(CLI::IsMember({"teacher", "generate", "both"}));
  sub->add_option("--max-samples", c->max_samples, "evaluate the first N samples (0 = all)")->capture_default_str();
  sub->add_option("--max-new-tokens", c->max_new_tokens, "cut each response to its first N tokens (0 = whole "
                  "response); generation stops after the response length or at a stop token")
      ->capture_default_str();
  sub->add_option("--json", c->json_out, "also write the report as JSON to this file");
  sub->add_flag("--no-baseline", c->no_baseline, "skip the target-only greedy decode (throughput baseline)");
  sub->add_option("--anchors-per-forward", c->anchors_per_forward, "teacher forcing: blocks per batched drafter "
                  "forward (memory bound)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--stop-id", c->stop_ids, "extra stop token id (repeatable); defaults: tokenizer eos, config.json "
                  "and generation_config.json eos_token_id");
  sub->add_option("--seed", c->seed, "--untrained-drafter: init seed")->capture_default_str();
  sub->add_option("--arch", c->arch, "--untrained-drafter: dflash or dflash2 (its published defaults)")
      ->capture_default_str();
  sub->add_option("--block-size", c->block_size, "--untrained-drafter: block size B")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{256}));
  sub->add_option("--draft-layers", c->draft_layers, "--untrained-drafter: drafter layers")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  sub->add_option("--num-target-layers", c->num_target_layers, "--untrained-drafter: tapped target layers nf "
                  "(0 = min(5, target layers); ids by spec 1)")
      ->capture_default_str();
  sub->add_option("--mask-token-id", c->mask_token_id, "--untrained-drafter: mask token id (default -1: the "
                  "tokenizer's mask token)");
  sub->add_flag("--no-progress", c->no_progress, "no progress display");
  sub->callback([c] { run(*c); });
}

}  // namespace dflash::cli
