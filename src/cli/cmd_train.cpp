// cli/cmd_train.cpp — `dflash train`: every TrainConfig key is an option; `--config FILE` reads the same keys
// from the [train] section of a TOML/INI file (names as the long options without dashes, e.g. `block-size = 16`,
// `target-layer-ids = [1, 9, 17, 25, 33]`); command-line options override the file.
#include "cli/commands.h"
#include "core/job_control.h"  // StopOnSignals
#include "core/log.h"
#include "train/trainer.h"

namespace dflash::cli {

// The options that shape the layout and its memory (train/memory_plan.h), shared by `train` and `info --plan`.
void add_layout_options(CLI::App* sub, TrainConfig& c) {
  sub->add_option("--device", c.device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--targets", c.targets,
                  "target workers: CUDA device indices (e.g. 0,1,2,3,4), or a count on the CPU (default: 1, "
                  "co-located with the drafter on --device)");
  sub->add_option("--drafters", c.drafters,
                  "drafter workers (data-parallel): CUDA device indices (e.g. 5,6,7), or a count on the CPU");
  sub->add_flag("--colocate", c.colocate,
                "every device of the one list given runs a target worker and a drafter worker (the default for "
                "a single device)");
  sub->add_option("--target-split", c.target_split,
                  "stages per target worker: its layers cut into this many consecutive stages balanced by cost, one "
                  "device each (--targets 0,1,2,3 --target-split 2: two workers of two GPUs; CPU: --targets 4 "
                  "--target-split 2)")
      ->capture_default_str();
  sub->add_option("--device-memory", c.device_memory,
                  "free bytes per device for the memory plan, e.g. 80GiB (default: what each device reports; CPU: the "
                  "host's available memory)");
  sub->add_option("--queue-depth", c.queue_depth, "feature packets in flight per drafter (backpressure)")
      ->capture_default_str();
  // plain flags with callbacks (as --no-export): a "!--no-..." flag would show its hidden default in --help
  sub->add_flag("--shard-optimizer", [&c](int64_t n) { c.shard_optimizer = n > 0; },
                "with more than one drafter, shard the AdamW moments over the drafters (ZeRO-1: gradient "
                "reduce-scatter, master all-gather); the default");
  sub->add_flag("--no-shard-optimizer", [&c](int64_t n) { c.shard_optimizer = n <= 0; },
                "every drafter holds the whole optimizer state (gradient all-reduce)");
  sub->add_option("--num-layers", c.num_layers, "draft layers Ld")->capture_default_str();
  sub->add_option("--block-size", c.block_size, "block size B (16 for Qwen3 targets, 10 for Llama-3.1)")
      ->capture_default_str();
  sub->add_option("--target-layer-ids", c.target_layer_ids,
                  "target layers whose outputs feed the drafter, distinct and ascending (the feature order the "
                  "drafter is trained on and exported with; default: spec 1 rule for --num-target-features)")
      ->delimiter(',');
  sub->add_option("--num-target-features", c.num_target_features, "nf when --target-layer-ids is not given")
      ->capture_default_str();
  sub->add_option("--arch", c.arch,
                  "drafter architecture: dflash (spec 1) or dflash2 (dynamic convolutions around every sublayer and a "
                  "candidate selector; docs/spec.md 1.1-1.2)")
      ->capture_default_str();
  sub->add_option("--conv-kernel-size", c.conv_kernel_size, "DFlash2: taps of the dynamic convolutions")
      ->capture_default_str();
  sub->add_option("--conv-group-size", c.conv_group_size,
                  "DFlash2: channels per dynamic coefficient (must divide the hidden size)")
      ->capture_default_str();
  sub->add_option("--selector-rank", c.selector_rank, "DFlash2: rank of the selector's codebooks")->capture_default_str();
  sub->add_option("--selector-top-k", c.selector_top_k, "DFlash2: candidates per slot")->capture_default_str();
  sub->add_option("--intermediate-size", c.intermediate_size, "drafter MLP width (0 = the default: the target's dense width; 3 x hidden for an MoE target, as the published "
                  "MoE drafters)")
      ->capture_default_str();
  sub->add_option("--max-anchors", c.max_anchors, "anchors (blocks) per sequence, N")->capture_default_str();
  sub->add_option("--kl-weight", c.kl_weight, "weight of the soft-label KL term (0 = off; e.g. 0.15)")
      ->capture_default_str();
  sub->add_option("--max-length", c.max_length, "truncate sequences to this many tokens (0 = as prepared)")
      ->capture_default_str();
  sub->add_option("--batch-size", c.batch_size, "sequences per optimizer step")->capture_default_str();
}

void add_train_options(CLI::App* sub, TrainConfig& c) {
  sub->add_option("--target", c.target_dir, "Hugging Face target model directory")->required();
  sub->add_option("--data", c.data_dir, "data directory written by `dflash prepare`")->required();
  sub->add_option("--out", c.out_dir, "output directory (checkpoints/, metrics.jsonl, export/)")->required();
  add_layout_options(sub, c);
  sub->add_option("--threads", c.threads, "CPU threads per worker (0 = all cores)")->capture_default_str();
  sub->add_option("--collective-timeout", c.collective_timeout_s,
                  "seconds a gradient/statistics all-reduce may wait before the job fails naming the workers "
                  "waited on")
      ->capture_default_str();
  sub->add_flag("--random-target", c.random_target,
                "benchmarks: draw the target's weights at random from its config.json (no safetensors needed)");
  sub->add_option("--inject-fault", c.inject_fault, "testing aid: KIND:INDEX:STEP makes worker 'target N' or "
                  "'drafter N' throw at step STEP (0-based), stage:S:STEP stage S of each split target; "
                  "checkpoint:0:STEP stalls the write of the checkpoint of step STEP midway (for a test to kill the "
                  "process)");
  sub->add_option("--mask-token-id", c.mask_token_id,
                  "mask token id (an existing embedding row); -1 = the tokenizer's mask token (the only negative "
                  "value accepted)")
      ->capture_default_str();
  sub->add_option("--selector-alpha", c.selector_alpha, "DFlash2: weight of the selector's loss")->capture_default_str();
  sub->add_option("--init-std", c.init_std, "std of the Linear weights at init")->capture_default_str();
  sub->add_option("--init-from-target", c.init_from_target,
                  "start the draft layers as target decoder layers: \"next\" (the layers after the last captured "
                  "one) or one target layer index per draft layer, e.g. 6,7 (default: random, spec 1)");
  sub->add_option("--init-fc", c.init_fc, "fc at init: random (spec 1) or last (the selection of the last captured "
                  "layer's features)")
      ->capture_default_str();
  sub->add_option("--sliding-window", c.sliding_window,
                  "W > 0: sliding-window draft layers (slot i of a block sees the context keys [a_j + i - (W-1), "
                  "a_j) and its block's keys 0..i; exported as layer_types / sliding_window); which layers: "
                  "--layer-types (default: all of them)")
      ->capture_default_str();
  sub->add_option("--layer-types", c.layer_types,
                  "one per draft layer, full_attention (full) or sliding_attention (sliding), e.g. "
                  "sliding,sliding,full (default: every layer sliding with --sliding-window, else full)")
      ->delimiter(',');
  sub->add_option("--loss", c.loss,
                  "loss weights per slot: dpace (D-PACE, arXiv 2605.18810: from the drafter's own predicted acceptance; "
                  "--gamma unused) or decay (exp(-(i-1)/gamma)); spec 2.4")
      ->capture_default_str();
  sub->add_option("--gamma", c.gamma, "loss decay gamma, with --loss decay (0 = default for B; < 0 = uniform weights)")
      ->capture_default_str();
  sub->add_option("--dpace-alpha", c.dpace_alpha, "D-PACE's confidence smoothing alpha in (0, 1] (--loss dpace)")
      ->capture_default_str();
  sub->add_option("--lr", c.optim.lr, "peak learning rate")->capture_default_str();
  sub->add_option("--beta1", c.optim.beta1, "AdamW beta1")->capture_default_str();
  sub->add_option("--beta2", c.optim.beta2, "AdamW beta2")->capture_default_str();
  sub->add_option("--adam-eps", c.optim.eps, "AdamW epsilon")->capture_default_str();
  sub->add_option("--weight-decay", c.optim.weight_decay, "AdamW weight decay")->capture_default_str();
  sub->add_option("--max-grad-norm", c.optim.max_grad_norm, "global grad-norm clip (<= 0: off)")->capture_default_str();
  sub->add_option("--warmup-ratio", c.optim.warmup_ratio, "fraction of steps with linear warmup")
      ->capture_default_str();
  sub->add_option("--schedule", c.optim.schedule, "cosine or constant after warmup")->capture_default_str();
  sub->add_option("--epochs", c.epochs, "passes over the data (fractional allowed)")->capture_default_str();
  sub->add_option("--max-steps", c.max_steps, "optimizer steps; > 0 overrides --epochs")->capture_default_str();
  sub->add_option("--time-budget", c.time_budget_s,
                  "seconds of training: the step count is planned from two timed calibration steps (0 = off)")
      ->capture_default_str();
  sub->add_option("--seed", c.seed, "seed of init, data order and anchors")->capture_default_str();
  sub->add_flag("--recompute", c.recompute, "activation recompute of the draft layers");
  sub->add_option("--checkpoint-every", c.checkpoint_every, "steps between checkpoints (0 = at the end only)")
      ->capture_default_str();
  sub->add_option("--keep-checkpoints", c.keep_checkpoints, "checkpoints kept")->capture_default_str();
  sub->add_flag("--resume", c.resume, "continue from <out>/checkpoints/LATEST if present (its settings, target, "
                "tokenizer, template and data must be this run's)");
  sub->add_flag("--allow-data-change", c.allow_data_change,
                "with --resume: continue although the data set, tokenizer, chat template or its variables differ "
                "from the checkpoint's (recorded in the run's provenance, config data_changes); never another target");
  sub->add_flag("--require-space", c.require_space,
                "refuse to start when the checkpoints --keep-checkpoints holds and the export may not fit in the free "
                "space of --out's file system (default: a warning)");
  sub->add_flag("--overwrite", c.overwrite, "replace an earlier run in --out (its metrics.jsonl, checkpoints/, "
                "export/, profile.txt; other files are kept); without it or --resume, train refuses such a directory");
  sub->add_option("--stop-after", c.stop_after,
                  "checkpoint and stop after this many steps (the schedule still spans all steps; then --resume)")
      ->capture_default_str();
  // a plain flag with a callback: "!--no-export" would show its hidden default in --help as "--no-export{false}"
  sub->add_flag("--no-export", [&c](int64_t n) { c.export_at_end = n <= 0; }, "do not export at the end");
  sub->add_flag("--quiet", c.quiet, "no progress display");
  sub->add_flag("--profile", c.profile, "time every op and write the table to <out>/profile.txt at the end");
}

void register_train(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "train a DFlash drafter for a target on prepared data");
  auto cfg = std::make_shared<TrainConfig>();
  add_train_options(sub, *cfg);
  sub->callback([cfg] {
    const StopOnSignals signals;  // SIGINT/SIGTERM: a checkpoint after the current step, then exit status 130
    TrainSummary s = train(*cfg, signals.flag());
    if (s.interrupted && signals.stopped()) throw ExitCode{130};
    if (s.steps_done == s.start_step && s.start_step >= s.total_steps) {  // a finished run resumed as it was
      log_info("the run had finished at step ", s.steps_done, " of ", s.total_steps, ": nothing to train (to train it ",
               "further: --resume --max-steps N with N > ", s.total_steps, ")");
      return;
    }
    log_info("trained ", s.steps_done, " steps in ", s.seconds, " s; last loss ", s.last_loss, ", EAL ", s.last_eal);
  });
}

}  // namespace dflash::cli
