// tests/train/train.cpp
// The training loop end to end on a tiny target: loss falls and EAL rises; resume is exact (case C12);
// SIGINT writes a checkpoint; export (case C11) round-trips. An earlier run is never destroyed unless told
// to (and pruning keeps the checkpoint LATEST names); target layer ids and mask ids are validated; the export
// records how its data was prepared and eval warns on a difference; help texts show no flag defaults.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "io/dataset.h"
#include "io/hf_config.h"
#include "io/prepare.h"
#include "io/tokenizer.h"
#include "io/safetensors.h"
#include "model/draft_batch.h"
#include "model/export.h"
#include "model/target.h"
#include "common/test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "common/train_fixtures.h"

using namespace dflash;
namespace fs = std::filesystem;

namespace {

std::string tmpdir(const std::string& name) { return test::train_tmpdir("train_" + name); }

// The toy data set and config of tests/common/train_fixtures.h, with this file's historical batch of 2 and 2 threads.
std::string make_data(const std::string& root, int samples = 24, int len = 40) {
  return test::make_train_data(root, samples, len);
}

TrainConfig tiny_config(const std::string& root, const std::string& data) {
  TrainConfig c = test::tiny_train_config(root, data);
  c.threads = 2;
  c.batch_size = 2;
  return c;
}

std::vector<nlohmann::json> read_metrics(const std::string& out_dir) { return test::read_metrics_jsonl(out_dir); }

// `dflash train` on the tiny golden target and `data`, into <root>/run, block 4, batch 2, one thread; add options.
std::string tiny_train_cmd(const std::string& root, const std::string& data) {
  return std::string(DFLASH_BINARY) + " train --target " + test::source_dir() + "/tests/golden/target_qwen3 --data " +
         data + " --out " + root + "/run --block-size 4 --target-layer-ids 1,2 --mask-token-id 511 --batch-size 2 " +
         "--quiet --threads 1";
}

}  // namespace

TEST(TrainLoop, LossFallsAndEalRises) {
  const std::string root = tmpdir("learn");
  TrainConfig c = tiny_config(root, make_data(root));
  c.max_steps = 300;
  c.optim.lr = 1e-2;
  c.optim.warmup_ratio = 0.02;
  TrainSummary s = train(c);
  EXPECT_EQ(s.steps_done, 300);
  auto m = read_metrics(c.out_dir);
  ASSERT_EQ(m.size(), 300u);
  auto mean = [&](size_t b, size_t e, const char* key) {
    double t = 0;
    for (size_t i = b; i < e; ++i) t += m[i][key].get<double>();
    return t / static_cast<double>(e - b);
  };
  const double loss0 = mean(0, 20, "loss"), loss1 = mean(280, 300, "loss");
  const double eal0 = mean(0, 20, "eal"), eal1 = mean(280, 300, "eal");
  EXPECT_LT(loss1, 0.75 * loss0) << "loss " << loss0 << " -> " << loss1;
  EXPECT_GT(eal1, eal0 + 0.3) << "EAL " << eal0 << " -> " << eal1;
  fs::remove_all(root);
}

// --profile: the per-op table of the whole run, with the ops a step is made of.
TEST(TrainLoop, ProfileWritesThePerOpTable) {
  const std::string root = tmpdir("profile");
  TrainConfig c = tiny_config(root, make_data(root, 4));
  c.max_steps = 3;
  c.profile = true;
  train(c);
  const std::string text = read_file(path_join(c.out_dir, "profile.txt"));
  for (const char* op : {"over 3 steps", "linear_dw ", "dflash_attention_backward", "lm_head_loss", "adamw", "total"})
    EXPECT_NE(text.find(op), std::string::npos) << op << " missing from\n" << text;
  fs::remove_all(root);
}

TEST(TrainLoop, ResumeIsExactCaseC12) {
  const std::string root = tmpdir("resume");
  const std::string data = make_data(root);
  for (const char* loss : {"dpace", "decay"}) {  // D-PACE (the default) and the paper's objective
    SCOPED_TRACE(loss);
    TrainConfig a = tiny_config(root, data);
    a.loss = loss;
    a.max_steps = 150;
    a.out_dir = root + "/straight_" + loss;
    train(a);
    TrainConfig b = a;
    b.out_dir = root + "/split_" + loss;
    b.stop_after = 100;
    TrainSummary s1 = train(b);
    EXPECT_TRUE(s1.interrupted);
    EXPECT_EQ(s1.steps_done, 100);
    b.stop_after = 0;
    b.resume = true;
    TrainSummary s2 = train(b);
    EXPECT_EQ(s2.steps_done, 150);
    // loss curves equal step for step (and the lr schedule)
    auto ma = read_metrics(a.out_dir), mb = read_metrics(b.out_dir);
    ASSERT_EQ(ma.size(), 150u);
    ASSERT_EQ(mb.size(), 150u);
    for (size_t i = 0; i < 150; ++i) {
      EXPECT_EQ(ma[i]["step"], mb[i]["step"]);
      EXPECT_EQ(ma[i]["loss"], mb[i]["loss"]) << "step " << i + 1;
      EXPECT_EQ(ma[i]["lr"], mb[i]["lr"]) << "step " << i + 1;
      EXPECT_EQ(ma[i]["grad_norm"], mb[i]["grad_norm"]) << "step " << i + 1;
  }
  // parameters and optimizer moments equal bit for bit
  auto pa = WeightStore::open(latest_checkpoint(a.out_dir) + "/params.safetensors");
  auto pb = WeightStore::open(latest_checkpoint(b.out_dir) + "/params.safetensors");
  auto oa = WeightStore::open(latest_checkpoint(a.out_dir) + "/optim.safetensors");
  auto ob = WeightStore::open(latest_checkpoint(b.out_dir) + "/optim.safetensors");
  for (const auto& n : pa.names()) EXPECT_EQ(to_f32_vector(pa.view(n)), to_f32_vector(pb.view(n))) << n;
  for (const auto& n : oa.names()) EXPECT_EQ(to_f32_vector(oa.view(n)), to_f32_vector(ob.view(n))) << n;
  auto sa = nlohmann::json::parse(read_file(latest_checkpoint(a.out_dir) + "/state.json"));
  auto sb = nlohmann::json::parse(read_file(latest_checkpoint(b.out_dir) + "/state.json"));
  EXPECT_EQ(sa["step"], 150);
  EXPECT_EQ(sa["step"], sb["step"]);
  EXPECT_EQ(sa["config"]["loss"], loss);
  }
  fs::remove_all(root);
}

TEST(TrainLoop, ResumeRefusesAChangedSetting) {
  const std::string root = tmpdir("refuse");
  TrainConfig c = tiny_config(root, make_data(root, 4));
  c.max_steps = 4;
  c.stop_after = 2;
  train(c);
  c.stop_after = 0;
  c.resume = true;
  c.optim.lr = 1e-3;
  try {
    train(c);
    FAIL() << "resume with another lr must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

TEST(TrainLoop, SigintWritesACheckpointAndResumeFinishes) {
  const std::string root = tmpdir("sigint");
  const std::string data = make_data(root);
  const std::string out = root + "/run";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string target = test::source_dir() + "/tests/golden/target_qwen3";
    execl(DFLASH_BINARY, DFLASH_BINARY, "train", "--target", target.c_str(), "--data", data.c_str(), "--out",
          out.c_str(), "--num-layers", "1", "--block-size", "4", "--target-layer-ids", "1,2", "--mask-token-id",
          "511", "--max-steps", "100000", "--batch-size", "2", "--quiet", "--threads", "1", nullptr);
    _exit(127);
  }
  // wait until training is under way (metrics appear), then interrupt
  for (int i = 0; i < 300; ++i) {
    usleep(100000);
    std::ifstream m(out + "/metrics.jsonl");
    std::string l1, l2;
    if (std::getline(m, l1) && std::getline(m, l2)) break;
  }
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::string ck = latest_checkpoint(out);
  ASSERT_FALSE(ck.empty());
  const auto st = nlohmann::json::parse(read_file(ck + "/state.json"));
  EXPECT_GE(st["step"].get<int64_t>(), 2);
  EXPECT_EQ(read_metrics(out).size(), st["step"].get<size_t>());
  fs::remove_all(root);
}

TEST(Export, ConfigKeysExactlyAsSpecCaseC11) {
  DrafterConfig c;
  c.hidden_size = 6144;
  c.intermediate_size = 16384;
  c.num_layers = 5;
  c.num_heads = 48;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 151936;
  c.block_size = 16;
  c.target_layer_ids = {1, 12, 23, 34, 45};
  c.num_target_layers = 48;
  c.mask_token_id = 151669;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 40960;
  auto j = drafter_hf_config(c);
  std::set<std::string> keys;
  for (auto& [k, v] : j.items()) keys.insert(k);
  const std::set<std::string> want = {"architectures", "model_type", "block_size", "num_target_layers",
                                      "dflash_config", "hidden_size", "intermediate_size", "num_hidden_layers",
                                      "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                                      "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings",
                                      "attention_bias", "layer_types", "tie_word_embeddings", "vocab_size",
                                      "torch_dtype", "dtype"};
  EXPECT_EQ(keys, want);
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"DFlashDraftModel"}));
  EXPECT_EQ(j["model_type"], "qwen3");
  EXPECT_EQ(j["dflash_config"]["mask_token_id"], 151669);
  EXPECT_EQ(j["dflash_config"]["target_layer_ids"], nlohmann::json::array({1, 12, 23, 34, 45}));
  EXPECT_EQ(j["layer_types"], nlohmann::json(std::vector<std::string>(5, "full_attention")));
  EXPECT_FALSE(j.contains("sliding_window"));  // only for drafters with sliding_attention layers
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
}

TEST(Export, RoundTripGivesTheSameDrafter) {
  const std::string root = tmpdir("export");
  auto ctx = make_context("cpu");
  auto target = Target::load(test::source_dir() + "/tests/golden/target_qwen3", *ctx);
  DrafterConfig c = DrafterConfig::for_target(target->config(), 2, 4, {1, 2}, 511);
  Drafter d(*ctx, c, 9, 0.1);
  export_drafter(*ctx, root + "/export", c, d.params(), {{"note", "test"}});
  // tensor names and shapes of spec 3; bf16; no embedding / lm_head
  auto ws = WeightStore::open(root + "/export");
  EXPECT_EQ(ws.info("fc.weight").shape, (Shape{64, 128}));
  EXPECT_EQ(ws.info("fc.weight").dtype, DType::BF16);
  EXPECT_EQ(ws.info("layers.1.self_attn.q_norm.weight").shape, (Shape{32}));
  EXPECT_EQ(ws.names().size(), 3u + 11u * 2);
  for (const auto& n : ws.names()) EXPECT_EQ(n.find("embed"), std::string::npos) << n;
  auto back = load_exported_drafter(*ctx, root + "/export");
  EXPECT_EQ(nlohmann::json(back->config()).dump(), nlohmann::json(c).dump());
  EXPECT_EQ(read_exported_drafter(root + "/export").config.window_of(0), 0);
  // same hidden states up to the bf16 rounding of the weights
  std::vector<int32_t> x(30);
  for (int i = 0; i < 30; ++i) x[i] = (i * 11) % 500;
  std::vector<uint8_t> m(30, 1);
  std::vector<int32_t> anchors = {3, 17};
  DraftBatch b = make_draft_batch(x, m, anchors, 2, 4, 511, 7.0);
  auto F = target->forward(*ctx, cpu_tensor_i32(x, {30}), std::vector<int64_t>{1, 2}, false).features;
  auto h1 = test::to_f64(d.forward_hidden(*ctx, upload_draft_batch(*ctx, b, F), target->weights().embed));
  auto h2 = test::to_f64(back->forward_hidden(*ctx, upload_draft_batch(*ctx, b, F), target->weights().embed));
  EXPECT_LT(test::rel_err(h2, h1), 2e-2);
  EXPECT_GT(test::rel_err(h2, h1), 0.0);  // bf16 really rounded
  fs::remove_all(root);
}

// Sliding-window layers: Hugging Face's layer_types / use_sliding_window / sliding_window (what transformers'
// Qwen3 attention and the serving engines read), and back.
TEST(Export, SlidingWindowLayersRoundTrip) {
  const std::string root = tmpdir("export_swa");
  auto ctx = make_context("cpu");
  auto target = Target::load(test::source_dir() + "/tests/golden/target_qwen3", *ctx);
  DrafterConfig c = DrafterConfig::for_target(target->config(), 3, 4, {1, 2}, 511);
  c.layer_types = {"sliding_attention", "sliding_attention", "full_attention"};
  c.sliding_window = 7;
  const auto j = drafter_hf_config(c);
  EXPECT_EQ(j["layer_types"], nlohmann::json({"sliding_attention", "sliding_attention", "full_attention"}));
  EXPECT_EQ(j["use_sliding_window"], true);
  EXPECT_EQ(j["sliding_window"], 7);
  Drafter d(*ctx, c, 9, 0.1);
  export_drafter(*ctx, root + "/export", c, d.params());
  const DrafterConfig back = read_exported_drafter(root + "/export").config;
  EXPECT_EQ(nlohmann::json(back).dump(), nlohmann::json(c).dump());
  EXPECT_EQ(back.window_of(1), 7);
  EXPECT_EQ(back.window_of(2), 0);
  // use_sliding_window false: transformers gives every layer full attention, and so does the import
  auto off = nlohmann::json::parse(read_file(root + "/export/config.json"));
  off["use_sliding_window"] = false;
  write_file_atomic(root + "/export/config.json", off.dump());
  EXPECT_EQ(read_exported_drafter(root + "/export").config.window_of(0), 0);
  // a layer_types list of the wrong length: refused, naming the file
  auto shortl = off;
  shortl["layer_types"] = {"full_attention"};
  write_file_atomic(root + "/export/config.json", shortl.dump());
  EXPECT_THROW(read_exported_drafter(root + "/export"), Error);
  // a sliding layer without a window: refused, naming the file
  auto bad = nlohmann::json::parse(drafter_hf_config(c).dump());
  bad["sliding_window"] = nullptr;
  write_file_atomic(root + "/export/config.json", bad.dump());
  try {
    read_exported_drafter(root + "/export");
    ADD_FAILURE() << "a sliding layer without sliding_window was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sliding_window"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

// train --sliding-window through the CLI: the resolved layer types in the checkpoint and the export; a resume
// with another window is refused.
TEST(TrainCli, SlidingWindowLayersReachTheCheckpointAndTheExport) {
  const std::string root = tmpdir("cli_swa");
  const std::string data = make_data(root, 4);
  const std::string base = tiny_train_cmd(root, data) + " --max-steps 2 --num-layers 2";
  const std::string cmd = base + " --sliding-window 5 --layer-types sliding,full 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto st = nlohmann::json::parse(read_file(latest_checkpoint(root + "/run") + "/state.json"));
  EXPECT_EQ(st["config"]["layer_types"], nlohmann::json({"sliding_attention", "full_attention"}));
  EXPECT_EQ(st["config"]["sliding_window"], 5);
  const DrafterConfig ex = read_exported_drafter(root + "/run/export").config;
  EXPECT_EQ(ex.window_of(0), 5);
  EXPECT_EQ(ex.window_of(1), 0);
  const std::string other =
      base + " --resume --sliding-window 6 --layer-types sliding,full > " + root + "/resume.log 2>&1";
  EXPECT_NE(std::system(other.c_str()), 0) << other;
  EXPECT_NE(read_file(root + "/resume.log").find("sliding_window"), std::string::npos) << read_file(root + "/resume.log");
  fs::remove_all(root);
}

// --loss dpace and --dpace-alpha reach the checkpoint's config; a resume with another objective is refused naming
// it; an unknown loss or an alpha outside (0, 1] fails before any step, naming the option.
TEST(TrainCli, DPaceLossReachesTheCheckpointAndResumeKeepsIt) {
  const std::string root = tmpdir("cli_dpace");
  const std::string data = make_data(root, 4);
  const std::string base = tiny_train_cmd(root, data) + " --max-steps 3 --no-export";
  const std::string cmd = base + " --loss dpace --dpace-alpha 0.3 --stop-after 2 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto st = nlohmann::json::parse(read_file(latest_checkpoint(root + "/run") + "/state.json"));
  EXPECT_EQ(st["config"]["loss"], "dpace");
  EXPECT_EQ(st["config"]["dpace_alpha"], 0.3);
  const auto m = read_metrics(root + "/run");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_GT(m[0]["loss"].get<double>(), 0);
  const std::string log = root + "/resume.log";
  EXPECT_NE(std::system((base + " --resume --loss decay > " + log + " 2>&1").c_str()), 0);
  EXPECT_NE(read_file(log).find("loss = \"dpace\""), std::string::npos) << read_file(log);
  EXPECT_NE(std::system((base + " --resume --loss dpace --dpace-alpha 0.5 > " + log + " 2>&1").c_str()), 0);
  EXPECT_NE(read_file(log).find("dpace_alpha"), std::string::npos) << read_file(log);
  ASSERT_EQ(std::system((base + " --resume --loss dpace --dpace-alpha 0.3 2>&1").c_str()), 0);
  EXPECT_EQ(read_metrics(root + "/run").size(), 3u);
  for (const auto& [args, want] : {std::pair<const char*, const char*>{" --loss dpase", "--loss: 'dpase'"},
                                   std::pair<const char*, const char*>{" --loss dpace --dpace-alpha 0", "--dpace-alpha = 0"}}) {
    const std::string bad = base + " --overwrite" + args + " > " + log + " 2>&1";
    EXPECT_NE(std::system(bad.c_str()), 0) << bad;
    EXPECT_NE(read_file(log).find(want), std::string::npos) << read_file(log);
  }
  EXPECT_EQ(read_metrics(root + "/run").size(), 3u) << "a refused start must leave the run as it was";
  fs::remove_all(root);
}

// D-PACE is the default objective (bench/RESULTS.md "D-PACE"); a run made with the decayed cross-entropy, whether its
// checkpoint says so or predates the "loss" key, resumes only with --loss decay, and the refusal names that option.
TEST(TrainCli, DefaultLossIsDPaceAndADecayRunResumesWithTheNamedOption) {
  const std::string root = tmpdir("cli_loss_default");
  const std::string data = make_data(root, 4);
  const std::string base = tiny_train_cmd(root, data) + " --max-steps 3 --no-export";
  ASSERT_EQ(std::system((base + " --stop-after 2 2>&1").c_str()), 0);
  const auto state = [&] { return latest_checkpoint(root + "/run") + "/state.json"; };
  EXPECT_EQ(nlohmann::json::parse(read_file(state()))["config"]["loss"], "dpace");

  ASSERT_EQ(std::system((base + " --overwrite --loss decay --stop-after 2 2>&1").c_str()), 0);
  EXPECT_EQ(nlohmann::json::parse(read_file(state()))["config"]["loss"], "decay");
  const std::string log = root + "/resume.log";
  const auto refused = [&](const char* why) {
    EXPECT_NE(std::system((base + " --resume > " + log + " 2>&1").c_str()), 0) << why;
    const std::string text = read_file(log);
    EXPECT_NE(text.find("loss = \"decay\""), std::string::npos) << why << ": " << text;
    EXPECT_NE(text.find("(--loss decay)"), std::string::npos) << why << ": " << text;
  };
  refused("checkpoint with loss = decay");
  // a checkpoint without the key: its objective is the decayed cross-entropy
  auto st = nlohmann::json::parse(read_file(state()));
  st["config"].erase("loss");
  write_file_atomic(state(), st.dump(2));
  refused("checkpoint without a loss key");
  EXPECT_EQ(read_metrics(root + "/run").size(), 2u) << "a refused resume must leave the run as it was";
  ASSERT_EQ(std::system((base + " --resume --loss decay 2>&1").c_str()), 0);
  EXPECT_EQ(read_metrics(root + "/run").size(), 3u);

  // gamma is stored resolved (0 = uniform weights): the refusal names --gamma -1, not --gamma 0 (the default decay)
  ASSERT_EQ(std::system((base + " --overwrite --loss decay --gamma -1 --stop-after 2 2>&1").c_str()), 0);
  EXPECT_NE(std::system((base + " --resume --loss decay > " + log + " 2>&1").c_str()), 0);
  EXPECT_NE(read_file(log).find("(--gamma -1)"), std::string::npos) << read_file(log);
  ASSERT_EQ(std::system((base + " --resume --loss decay --gamma -1 2>&1").c_str()), 0);
  EXPECT_EQ(read_metrics(root + "/run").size(), 3u);
  fs::remove_all(root);
}

TEST(TrainCli, ConfigFileSectionAndCommandLineOverride) {
  const std::string root = tmpdir("cli");
  const std::string data = make_data(root, 4);
  const std::string cfg = root + "/run.toml";
  std::ofstream(cfg) << "# a run\n[train]\ntarget = \"" << test::source_dir() << "/tests/golden/target_qwen3\"\n"
                     << "data = \"" << data << "\"\nout = \"" << root << "/run\"\nmax-steps = 3\nblock-size = 4\n"
                     << "target-layer-ids = [1, 2]\nmask-token-id = 511\nbatch-size = 2\nlr = 0.5\nquiet = true\n"
                     << "drafters = \"2\"\nshard-optimizer = false\n";
  const std::string cmd = std::string(DFLASH_BINARY) + " train --config " + cfg + " --lr 0.002 --threads 1 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto st = nlohmann::json::parse(read_file(latest_checkpoint(root + "/run") + "/state.json"));
  EXPECT_EQ(st["step"], 3);
  EXPECT_EQ(st["config"]["block_size"], 4);
  EXPECT_EQ(st["config"]["target_layer_ids"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(st["config"]["lr"], 0.002);  // the command line wins over the file
  EXPECT_EQ(st["config"]["shard_optimizer"], false);  // a flag from the file
  fs::remove_all(root);
}

// ---- nothing lost, nothing silent -------------------------------------------------------------------------------

namespace {

// Every file under `dir` (relative path -> bytes): "byte-identical" is checked on the whole tree.
std::map<std::string, std::string> tree_bytes(const std::string& dir) {
  std::map<std::string, std::string> t;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) t[fs::relative(e.path(), dir).string()] = read_file(e.path().string());
  return t;
}

// Runs a dflash command line; returns its exit status, stdout and stderr in *out.
int run_cli(const std::string& args, std::string* out) {
  const std::string log = cat(fs::temp_directory_path().string(), "/dflash_test_train_cli_", getpid(), ".log");
  const std::string cmd = cat(DFLASH_BINARY, " ", args, " > '", log, "' 2>&1");
  const int rc = std::system(cmd.c_str());
  *out = file_exists(log) ? read_file(log) : "";
  fs::remove(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// `train --out R` on a finished run, without --resume: refused with the files named, every byte of R as it was
// (what an unguarded start would break: metrics.jsonl cut to the new run's rows, export/ replaced, the new final
// checkpoint pruned while LATEST names it); export and resume still work afterwards; --overwrite replaces exactly the
// run.
TEST(TrainGuard, AFinishedRunIsRefusedAndKeptByteForByte) {
  const std::string root = tmpdir("guard");
  TrainConfig c = tiny_config(root, make_data(root, 8));
  c.max_steps = 12;
  c.checkpoint_every = 2;  // keeps step-00000010 and step-00000012
  c.export_at_end = true;
  train(c);
  const auto before = tree_bytes(c.out_dir);
  ASSERT_EQ(read_metrics(c.out_dir).size(), 12u);
  ASSERT_TRUE(before.count("export/config.json"));

  TrainConfig again = c;
  again.max_steps = 4;
  try {
    train(again);
    FAIL() << "train over a finished run without --resume / --overwrite must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(has(msg, "already holds the result of an earlier run (checkpoints/, export/, metrics.jsonl)")) << msg;
    EXPECT_TRUE(has(msg, "--resume to continue it")) << msg;
    EXPECT_TRUE(has(msg, "--overwrite to replace it")) << msg;
  }
  EXPECT_EQ(tree_bytes(c.out_dir), before);
  // the same through the command line: non-zero exit, the message, nothing touched
  std::string out;
  const std::string target = test::source_dir() + "/tests/golden/target_qwen3";
  const std::string cli = cat("train --target ", target, " --data ", c.data_dir, " --out ", c.out_dir,
                              " --num-layers 1 --block-size 4 --target-layer-ids 1,2 --mask-token-id 511 --max-steps 4"
                              " --batch-size 2 --threads 1 --quiet");
  EXPECT_EQ(run_cli(cli, &out), 1) << out;
  EXPECT_TRUE(has(out, "--overwrite to replace it")) << out;
  EXPECT_EQ(tree_bytes(c.out_dir), before);
  // export and resume still work on the kept run
  EXPECT_EQ(run_cli(cat("export --run ", c.out_dir, " --out ", root, "/exp"), &out), 0) << out;
  // `dflash export` never replaces an earlier export unless told to
  EXPECT_EQ(run_cli(cat("export --run ", c.out_dir, " --out ", c.out_dir, "/export"), &out), 1) << out;
  EXPECT_TRUE(has(out, "--overwrite")) << out;
  EXPECT_EQ(tree_bytes(c.out_dir), before);
  EXPECT_EQ(run_cli(cat("export --run ", c.out_dir, " --out ", c.out_dir, "/export --overwrite"), &out), 0) << out;
  // nor writes into a directory that holds anything else (here: the run directory itself)
  EXPECT_EQ(run_cli(cat("export --run ", c.out_dir, " --out ", c.out_dir, " --overwrite"), &out), 1) << out;
  EXPECT_TRUE(has(out, "did not write")) << out;
  EXPECT_EQ(read_metrics(c.out_dir).size(), 12u);
  TrainConfig resumed = c;
  resumed.resume = true;
  EXPECT_EQ(train(resumed).steps_done, 12);
  // --overwrite: a new run in place of the old one, nothing of the old left
  again.overwrite = true;
  TrainSummary s = train(again);
  EXPECT_EQ(s.steps_done, 4);
  EXPECT_EQ(read_metrics(c.out_dir).size(), 4u);
  EXPECT_EQ(latest_checkpoint(c.out_dir), c.out_dir + "/checkpoints/step-00000004");
  EXPECT_FALSE(fs::exists(c.out_dir + "/checkpoints/step-00000012"));
  fs::remove_all(root);
}

// Pruning keeps the newest checkpoints but never the one LATEST names, even when stale higher-numbered ones are
// there (the failure it guards against: LATEST names step-00000004, pruning removes it, export and resume fail).
TEST(TrainGuard, PruningNeverRemovesTheCheckpointLatestNames) {
  const std::string root = tmpdir("prune");
  TrainConfig c = tiny_config(root, make_data(root, 4));
  c.max_steps = 4;
  train(c);
  const std::string ck = c.out_dir + "/checkpoints";
  for (const char* stale : {"step-00000010", "step-00000012"}) fs::copy(ck + "/step-00000004", ck + "/" + stale);
  ASSERT_EQ(latest_checkpoint(c.out_dir), ck + "/step-00000004");
  prune_checkpoints(c.out_dir, 2);
  EXPECT_TRUE(fs::exists(ck + "/step-00000004/state.json"));
  EXPECT_TRUE(fs::exists(ck + "/step-00000010"));
  EXPECT_TRUE(fs::exists(ck + "/step-00000012"));
  prune_checkpoints(c.out_dir, 1);
  EXPECT_TRUE(fs::exists(ck + "/step-00000004/state.json"));
  EXPECT_FALSE(fs::exists(ck + "/step-00000010"));
  EXPECT_TRUE(fs::exists(ck + "/step-00000012"));
  EXPECT_EQ(latest_checkpoint(c.out_dir), ck + "/step-00000004");
  std::string out;
  EXPECT_EQ(run_cli(cat("export --run ", c.out_dir, " --out ", root, "/exp"), &out), 0) << out;
  fs::remove_all(root);
}

// A finished run resumed with a larger --max-steps goes on to the new count: the steps it adds have the learning rate
// of the new count's schedule and the data of a run of that count (its loss at the first added step equals the loss
// a straight run of the new count has there only if the weights agree, so the check is on lr and the step rows),
// the extension is recorded in the export's provenance, and a resume with no larger count trains nothing and says so.
TEST(TrainLoop, AFinishedRunIsExtendedByALargerMaxSteps) {
  const std::string root = tmpdir("extend");
  TrainConfig c = tiny_config(root, make_data(root, 8));
  c.max_steps = 4;
  c.export_at_end = true;
  TrainSummary s1 = train(c);
  ASSERT_EQ(s1.steps_done, 4);
  c.resume = true;
  c.max_steps = 8;
  TrainSummary s2 = train(c);
  EXPECT_EQ(s2.start_step, 4);
  EXPECT_EQ(s2.steps_done, 8);
  EXPECT_EQ(s2.total_steps, 8);
  EXPECT_GT(s2.last_loss, 0.0);
  auto m = read_metrics(c.out_dir);
  ASSERT_EQ(m.size(), 8u);
  for (int64_t k = 4; k < 8; ++k) {
    EXPECT_EQ(m[k]["step"], k + 1);
    EXPECT_DOUBLE_EQ(m[k]["lr"].get<double>(), lr_at(c.optim, k, 8)) << "step " << k + 1;
  }
  const auto exp = nlohmann::json::parse(read_file(c.out_dir + "/export/config.json"));
  const auto& ext = exp["dflash_training"]["config"]["extensions"];
  ASSERT_EQ(ext.size(), 1u);
  EXPECT_EQ(ext[0], (nlohmann::json{{"step", 4}, {"from_total_steps", 4}, {"to_total_steps", 8}}));
  // resumed again at its own count: nothing to train, the summary says where it stands (the CLI says so, exit 0)
  TrainSummary s3 = train(c);
  EXPECT_EQ(s3.start_step, 8);
  EXPECT_EQ(s3.steps_done, 8);
  EXPECT_FALSE(s3.interrupted);
  const std::string cmd = tiny_train_cmd(root, c.data_dir) + " --seed 3 --lr 0.003 --max-anchors 8 --resume --max-steps 8 > " +
                          root + "/again.log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string out = read_file(root + "/again.log");
  EXPECT_NE(out.find("nothing to train"), std::string::npos) << out;
  EXPECT_NE(out.find("--max-steps N with N > 8"), std::string::npos) << out;
  fs::remove_all(root);
}

// A step saved again replaces its directory whole (the two directories swap names in one rename): the new state is
// there, nothing of the old one or of the temporary stays, and LATEST names it.
TEST(TrainGuard, ASavedStepSavedAgainIsReplacedWhole) {
  const std::string root = tmpdir("resave");
  auto ctx = make_context("cpu");
  ParamSet ps;
  ps.add(*ctx, "w", cpu_tensor(std::vector<float>{1, 2, 3}, {3}));
  ps.flatten_grads(*ctx);
  ps.flatten_masters(*ctx);
  const std::string dir = save_checkpoint(*ctx, root, ps, {3, {{"note", "first"}}});
  ASSERT_TRUE(fs::exists(dir + "/params.safetensors"));
  write_file_atomic(dir + "/stray", "from the first save\n");  // a file only the old directory has
  ctx->copy(ps.get("w").master, cpu_tensor(std::vector<float>{7, 8, 9}, {3}));
  EXPECT_EQ(save_checkpoint(*ctx, root, ps, {3, {{"note", "second"}}}), dir);
  EXPECT_FALSE(fs::exists(dir + "/stray"));
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/state.json"))["note"], "second");
  EXPECT_EQ(latest_checkpoint(root), dir);
  ParamSet back;
  back.add(*ctx, "w", cpu_tensor(std::vector<float>{0, 0, 0}, {3}));
  load_checkpoint(*ctx, dir, back);
  EXPECT_EQ(to_f32_vector(back.get("w").master), (std::vector<float>{7, 8, 9}));
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(root + "/checkpoints")) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 2u);  // step-00000003 and LATEST
  fs::remove_all(root);
}

// Duplicate or unsorted target layer ids, and a negative mask id other than -1, are errors.
TEST(TrainValidation, TargetLayerIdsAndMaskTokenId) {
  auto error_of = [](auto f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NO_THROW(validate_target_layer_ids({1, 9, 17, 25, 33}, 36));
  EXPECT_EQ(error_of([] { validate_target_layer_ids({1, 1, 3}, 36); }),
            "target_layer_ids [1,1,3]: layer 1 is given twice; each tapped layer must be a different one");
  const std::string unsorted = error_of([] { validate_target_layer_ids({5, 3, 1}, 36); });
  EXPECT_TRUE(has(unsorted, "target_layer_ids [5,3,1]: not in increasing order (3 after 5)")) << unsorted;
  EXPECT_TRUE(has(unsorted, "give [1,3,5]")) << unsorted;
  EXPECT_TRUE(has(error_of([] { validate_target_layer_ids({0, 36}, 36); }), "layer 36 is not a decoder layer"));
  EXPECT_TRUE(has(error_of([] { validate_target_layer_ids({}, 36); }), "empty"));
  // the drafter config (and so every exported drafter read back) follows the same rule
  DrafterConfig dc = DrafterConfig::for_target(load_model_config(test::source_dir() + "/tests/golden/target_qwen3"),
                                               1, 4, {2, 1}, 511);
  EXPECT_TRUE(has(error_of([&] { dc.validate(); }), "not in increasing order"));
  EXPECT_NO_THROW(validate_mask_token_id(-1));
  EXPECT_NO_THROW(validate_mask_token_id(0));
  EXPECT_EQ(error_of([] { validate_mask_token_id(-2); }),
            "--mask-token-id -2: not a token id (give an id >= 0, or -1 for the tokenizer's mask token)");

  // train() refuses them before any step
  const std::string root = tmpdir("validate");
  TrainConfig c = tiny_config(root, make_data(root, 4));
  c.max_steps = 2;
  c.target_layer_ids = {1, 1, 3};
  EXPECT_TRUE(has(error_of([&] { train(c); }), "layer 1 is given twice"));
  c.target_layer_ids = {3, 2, 1};
  EXPECT_TRUE(has(error_of([&] { train(c); }), "not in increasing order (2 after 3)"));
  c.target_layer_ids = {1, 2};
  c.mask_token_id = -2;
  EXPECT_TRUE(has(error_of([&] { train(c); }), "--mask-token-id -2"));
  EXPECT_FALSE(fs::exists(c.out_dir + "/metrics.jsonl"));
  // and on the command line
  std::string out;
  const std::string target = test::source_dir() + "/tests/golden/target_qwen3";
  EXPECT_EQ(run_cli(cat("train --target ", target, " --data ", c.data_dir, " --out ", c.out_dir,
                        " --block-size 4 --target-layer-ids 1 1 3 --mask-token-id 511 --max-steps 2 --quiet"),
                    &out),
            1);
  EXPECT_TRUE(has(out, "target_layer_ids [1,1,3]: layer 1 is given twice")) << out;
  fs::remove_all(root);
}

// No "{false}" in any help text; --no-export still works.
TEST(TrainCli, HelpShowsNoFlagDefaultsAndNoExportWorks) {
  std::string out;
  for (const char* cmd : {"train", "prepare", "export", "generate", "eval", "demo"}) {
    ASSERT_EQ(run_cli(cat(cmd, " --help"), &out), 0) << cmd;
    EXPECT_FALSE(has(out, "{false}") || has(out, "{true}")) << cmd << ":\n" << out;
  }
  run_cli("train --help", &out);
  EXPECT_TRUE(has(out, "  --no-export ")) << out;
  EXPECT_TRUE(has(out, "  --overwrite ")) << out;
  const std::string root = tmpdir("noexport");
  const std::string data = make_data(root, 4);
  const std::string target = test::source_dir() + "/tests/golden/target_qwen3";
  const std::string args = cat("train --target ", target, " --data ", data, " --block-size 4 --target-layer-ids 1,2 "
                               "--mask-token-id 511 --max-steps 1 --batch-size 2 --threads 1 --quiet --out ");
  ASSERT_EQ(run_cli(args + root + "/a --no-export", &out), 0) << out;
  EXPECT_FALSE(fs::exists(root + "/a/export"));
  EXPECT_TRUE(file_exists(root + "/a/metrics.jsonl"));
  ASSERT_EQ(run_cli(args + root + "/b", &out), 0) << out;
  EXPECT_TRUE(file_exists(root + "/b/export/config.json"));
  fs::remove_all(root);
}

// Two data sets prepared from the same chat rows, with thinking on and with --no-thinking, give the same
// tokens here — and exports that say which is which (tokenizer hash, template, every flag, max length), the same
// whichever command wrote the export; eval warns, naming the field, when the data differs from the training data.
TEST(TrainProvenance, TemplateFlagsReachTheExportAndEvalWarns) {
  const std::string root = tmpdir("provenance");
  const std::string demo = test::source_dir() + "/assets/demo/target";
  {
    std::ofstream f(root + "/chat.jsonl");
    for (int i = 0; i < 6; ++i)
      f << nlohmann::json{{"messages",
                           {{{"role", "user"}, {"content", cat("Write function number ", i, ".")}},
                            {{"role", "assistant"}, {"content", cat("def f", i, "(x):\n    return x + ", i, "\n")}}}}}
               .dump()
        << "\n";
  }
  auto prepare = [&](const std::string& out, bool thinking) {
    PrepareOptions o;
    o.tokenizer = demo;
    o.inputs = {root + "/chat.jsonl"};
    o.out = root + "/" + out;
    o.enable_thinking = thinking;
    o.max_length = 512;
    o.threads = 1;
    o.progress = false;
    run_prepare(o);
    return o.out;
  };
  const std::string think = prepare("think", true), nothink = prepare("nothink", false);
  auto train_on = [&](const std::string& data, const std::string& out) {
    TrainConfig c;
    c.target_dir = demo;
    c.data_dir = data;
    c.out_dir = root + "/" + out;
    c.threads = 2;
    c.block_size = 4;
    c.max_anchors = 4;
    c.batch_size = 2;
    c.max_steps = 2;
    c.quiet = true;
    return train(c);
  };
  const std::string ea = train_on(think, "run_think").export_dir, eb = train_on(nothink, "run_nothink").export_dir;
  const nlohmann::json ta = read_exported_drafter(ea).training, tb = read_exported_drafter(eb).training;
  const std::string hash = Tokenizer::load(demo)->hash();
  for (const auto* t : {&ta, &tb}) {
    const nlohmann::json& d = (*t)["data"];
    EXPECT_EQ(d["created_by"], "dflash prepare");
    EXPECT_EQ(d["tokenizer_sha256"], hash);
    EXPECT_EQ(d["chat_template"]["sha256"], sha256_hex(Tokenizer::load(demo)->chat_template()));
    EXPECT_EQ(d["chat_template"]["mask_rule"], "prefixes");
    EXPECT_EQ(d["flags"]["format"], "auto");
    EXPECT_EQ(d["flags"]["pairs"], "chat");
    EXPECT_EQ(d["flags"]["add_generation_prompt"], false);
    EXPECT_EQ(d["max_length"], 512);
    EXPECT_FALSE((*t)["config"].contains("data"));
  }
  EXPECT_EQ(ta["data"]["flags"]["enable_thinking"], true);
  EXPECT_EQ(tb["data"]["flags"]["enable_thinking"], false);
  EXPECT_NE(read_file(ea + "/config.json"), read_file(eb + "/config.json"));
  EXPECT_EQ(provenance_differences(ta["data"], tb["data"]),
            (std::vector<std::string>{"flags.enable_thinking: true (trained) vs false (evaluated)"}));
  EXPECT_TRUE(provenance_differences(ta["data"], ta["data"]).empty());
  // `dflash export` of the same checkpoint records the same block
  std::string out;
  ASSERT_EQ(run_cli(cat("export --run ", root, "/run_think --out ", root, "/exp_cli"), &out), 0) << out;
  EXPECT_EQ(read_exported_drafter(root + "/exp_cli").training, ta);
  // eval: a warning naming the flag for the other data set, none for the drafter's own
  const std::string eval = cat("eval --target ", demo, " --drafter ", ea, " --mode teacher --no-baseline "
                               "--max-samples 2 --no-progress --data ");
  ASSERT_EQ(run_cli(eval + nothink, &out), 0) << out;
  EXPECT_TRUE(has(out, "was not prepared like the data the drafter was trained on (1 difference)")) << out;
  EXPECT_TRUE(has(out, "flags.enable_thinking: true (trained) vs false (evaluated)")) << out;
  ASSERT_EQ(run_cli(eval + think, &out), 0) << out;
  EXPECT_FALSE(has(out, "was not prepared like")) << out;
  fs::remove_all(root);
}
