// tests/train/memory_plan.cpp — the memory plan of a training layout (train/memory_plan.h) and the stages of a split
// target (model/target_stages.h): the weights per stage against the bytes of the checkpoint's own tensors, the
// drafter's items against a real drafter's parameter set, the balance against a brute force, the refusal and its
// suggested layout, `dflash info --plan`.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>

#include <nlohmann/json.hpp>

#include "backend/device_memory.h"
#include "common/published_configs.h"
#include "common/test_util.h"
#include "common/train_fixtures.h"
#include "core/fs.h"
#include "io/model_family.h"
#include "io/safetensors.h"
#include "model/drafter.h"
#include "model/target.h"
#include "model/target_stages.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"

namespace dflash {
namespace {

using json = nlohmann::json;
using test::source_dir;

std::string golden(const char* name) { return source_dir() + "/tests/golden/" + name; }

// Bytes the "cpu" backend (F32) holds for the tensors of the checkpoint that `keep` selects: every stored tensor as
// numel x 4, except MXFP4 blocks and scales (U8), kept as stored. Written from the safetensors headers alone.
int64_t checkpoint_bytes(const std::string& dir, const std::function<bool(const std::string&)>& keep) {
  const WeightStore ws = WeightStore::open(dir);
  int64_t b = 0;
  for (const std::string& n : ws.names()) {
    if (!keep(n)) continue;
    const TensorInfo& t = ws.info(n);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    b += t.dtype == DType::U8 ? static_cast<int64_t>(t.end - t.begin) : 4 * numel;
  }
  return b;
}

// The layer index of a tensor name "model.layers.{l}.*" (or -1).
int64_t layer_of(const std::string& n, const std::string& prefix) {
  if (!n.starts_with(prefix)) return -1;
  return std::stoll(n.substr(prefix.size()));
}

TrainConfig plan_config(const std::string& target, const std::string& targets, int split) {
  TrainConfig c;
  c.target_dir = target;
  c.targets = targets;
  c.target_split = split;
  c.max_length = 40;
  c.num_layers = 1;
  c.block_size = 4;
  c.target_layer_ids = {1, 2};
  c.max_anchors = 8;
  return c;
}

// Every stage's weights are the bytes of its own tensors in the checkpoint (+ the embedding in stage 0, the final
// norm and lm_head in the last, a copy of the tied embedding when split), for a dense, an MoE, a hybrid and an MXFP4
// target and S = 1, 2, 3; a weight shared by two workers of one device is counted once.
TEST(MemoryPlan, StageWeightsAreTheCheckpointsTensorBytes) {
  for (const char* name : {"target_qwen3", "target_qwen3_moe", "target_qwen3_next", "target_gpt_oss_mxfp4"}) {
    const std::string dir = golden(name);
    const ModelConfig cfg = load_model_config(dir);
    const WeightNames& wn = family_of(cfg.arch).names;
    const int64_t L = cfg.num_hidden_layers;
    for (int S = 1; S <= 3; ++S) {
      const MemoryPlanInputs in = memory_plan_inputs(plan_config(dir, std::to_string(2 * S), S));
      const MemoryPlan p = plan_memory(in);
      ASSERT_EQ(p.stages.size(), static_cast<size_t>(S)) << name;
      ASSERT_EQ(p.devices.size(), static_cast<size_t>(2 * S + 1)) << name;  // 2 workers x S stages, 1 drafter
      int64_t covered = 0;
      for (int s = 0; s < S; ++s) {
        const TargetStage st = p.stages[static_cast<size_t>(s)];
        EXPECT_EQ(st.first, covered) << name;
        covered = st.end;
        const bool last = s == S - 1;
        int64_t want = checkpoint_bytes(dir, [&](const std::string& n) {
          const int64_t l = layer_of(n, wn.layer);
          if (l >= 0) return st.holds(l);
          for (const std::string& ig : wn.ignored)
            if (n.starts_with(ig)) return false;
          return (s == 0 && n == wn.embed) || (last && (n == wn.final_norm || n == wn.lm_head));
        });
        if (last && S > 1 && cfg.tie_word_embeddings) want += 4 * cfg.vocab_size * cfg.hidden_size;
        if (last && S == 1 && !cfg.tie_word_embeddings) {
          EXPECT_TRUE(WeightStore::open(dir).has(wn.lm_head));
        }
        EXPECT_EQ(p.devices[static_cast<size_t>(s)].bytes[kTargetWeights], want) << name << " S " << S << " stage " << s;
        // worker 1's stage s holds the same tensors on the same (CPU) device: shared, not counted again
        EXPECT_EQ(p.devices[static_cast<size_t>(S + s)].bytes[kTargetWeights], 0) << name;
        EXPECT_GT(p.devices[static_cast<size_t>(S + s)].bytes[kTargetAct], 0) << name;
      }
      EXPECT_EQ(covered, L) << name;
      for (const DevicePlan& d : p.devices) EXPECT_EQ(d.pool, "host");
    }
  }
}

// The drafter's weights, gradients and optimizer state are those of a real drafter's parameter set (model/params.h),
// replicated and sharded over 3 drafters (ZeRO-1: shard = round_up(ceil(flat / 3), 64)); the packets are
// queue_depth x T x nf H floats.
TEST(MemoryPlan, DrafterItemsAreTheTrainersBuffers) {
  TrainConfig c = plan_config(golden("target_qwen3"), "1", 1);
  c.queue_depth = 3;
  MemoryPlanInputs in = memory_plan_inputs(c);
  auto ctx = make_context("cpu");
  Drafter dr(*ctx, in.drafter, 1);
  const int64_t numel = dr.params().numel(), flat = dr.params().flat_numel();
  ASSERT_GT(flat, numel);  // the 64-element alignment pads some parameter
  MemoryPlan p = plan_memory(in);
  ASSERT_EQ(p.devices.size(), 2u);
  const DevicePlan& d = p.devices[1];
  EXPECT_EQ(d.name, "cpu drafter 0");
  EXPECT_EQ(d.bytes[kDrafterWeights], 4 * numel);  // F32 masters are the compute weights on the CPU
  EXPECT_EQ(d.bytes[kGradients], 4 * flat);
  EXPECT_EQ(d.bytes[kOptimizer], 8 * numel);
  EXPECT_EQ(d.bytes[kPackets], 3 * 40 * 2 * 64 * 4);
  EXPECT_EQ(d.bytes[kDrafterHead], 0);  // the unsplit target on the same device lends its embedding and lm_head
  EXPECT_EQ(p.devices[0].bytes[kDrafterWeights], 0);

  c.drafters = "3";
  in = memory_plan_inputs(c);
  p = plan_memory(in);
  ASSERT_EQ(p.devices.size(), 4u);
  const int64_t shard = ((flat + 2) / 3 + 63) / 64 * 64;
  for (int i = 1; i <= 3; ++i) {
    EXPECT_EQ(p.devices[static_cast<size_t>(i)].bytes[kOptimizer], 2 * 4 * shard);
    EXPECT_EQ(p.devices[static_cast<size_t>(i)].bytes[kGradients], 4 * 3 * shard);
  }
  c.shard_optimizer = false;
  p = plan_memory(memory_plan_inputs(c));
  EXPECT_EQ(p.devices[1].bytes[kOptimizer], 8 * numel);

  // split: the drafter holds its own head (V x H, tied: one tensor)
  c = plan_config(golden("target_qwen3"), "2", 2);
  p = plan_memory(memory_plan_inputs(c));
  EXPECT_EQ(p.devices.back().bytes[kDrafterHead], 4 * 512 * 64);
}

// The stages minimise the largest stage cost: the same optimum as a brute force over every cut, for a dense, an MoE
// (a dense first layer) and a hybrid target.
TEST(MemoryPlan, StagesMinimiseTheLargestStageCost) {
  for (const char* name : {"target_qwen3", "target_qwen3_moe", "target_qwen3_next", "target_gpt_oss"}) {
    const ModelConfig cfg = load_model_config(golden(name));
    const int64_t L = cfg.num_hidden_layers, VH = cfg.vocab_size * cfg.hidden_size;
    auto cost = [&](int64_t a, int64_t b) {
      int64_t c = (a == 0 ? VH : 0) + (b == L ? 2 * VH + cfg.hidden_size : 0);
      for (int64_t l = a; l < b; ++l) {
        const TargetParams tp = target_layer_params(cfg, l);
        c += tp.total + tp.active;
      }
      return c;
    };
    for (int S = 1; S <= std::min<int64_t>(3, L); ++S) {
      int64_t brute = std::numeric_limits<int64_t>::max();
      std::function<void(int64_t, int, int64_t)> go = [&](int64_t a, int left, int64_t m) {
        if (left == 1) {
          brute = std::min(brute, std::max(m, cost(a, L)));
          return;
        }
        for (int64_t b = a + 1; b <= L - left + 1; ++b) go(b, left - 1, std::max(m, cost(a, b)));
      };
      go(0, S, 0);
      int64_t got = 0;
      for (const TargetStage& st : split_target_layers(cfg, S)) got = std::max(got, cost(st.first, st.end));
      EXPECT_EQ(got, brute) << name << " S " << S;
    }
    try {
      split_target_layers(cfg, static_cast<int>(L) + 1);
      ADD_FAILURE() << "more stages than layers accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--target-split"), std::string::npos) << e.what();
    }
  }
}

// A layout that does not fit is refused before anything loads, naming the device, the bytes needed and free, and a
// layout that fits: Qwen3-8B in bf16 on two 12 GiB GPUs as two unsplit workers does not fit, as one worker of two
// stages it does.
TEST(MemoryPlan, RefusalNamesTheDeviceTheBytesAndALayoutThatFits) {
  test::TmpDir tmp("plan_refuse");
  write_file_atomic(tmp.path + "/config.json", test::kQwen3_8B);
  TrainConfig c = plan_config(tmp.path, "0,1", 1);
  c.device = "cuda";
  c.drafters = "2";
  c.target_layer_ids = {};
  c.max_length = 2048;
  const MemoryPlanInputs in = memory_plan_inputs(c);
  const MemoryPlan p = plan_memory(in);
  ASSERT_EQ(p.devices.size(), 3u);
  EXPECT_EQ(p.devices[0].name, "cuda:0");
  const TargetParams tp = target_params(in.target);
  EXPECT_EQ(p.devices[0].bytes[kTargetWeights], tp.device_bytes(2));  // tied: false, embedding + lm_head in it
  const int64_t twelve = int64_t{12} << 30;
  try {
    check_memory_plan(in, p, twelve);
    ADD_FAILURE() << "a 16 GB target fitted a 12 GiB device";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:0 needs " + std::to_string(p.devices[0].total()) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("has " + std::to_string(twelve) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("--target-split 2 over the same 2 target devices"), std::string::npos) << m;
  }
  MemoryPlanInputs two = in;
  two.topo.split = 2;
  EXPECT_NO_THROW(check_memory_plan(two, plan_memory(two), twelve));
  // train refuses it before loading anything (the data are the only input read)
  const std::string root = test::train_tmpdir("plan_refuse_train");
  TrainConfig t = test::tiny_train_config(root, test::make_train_data(root));
  t.device_memory = "1MiB";
  try {
    train(t);
    ADD_FAILURE() << "train started in 1 MiB";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the host (every CPU worker) needs"), std::string::npos) << m;
    EXPECT_NE(m.find("has 1048576 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("--max-length"), std::string::npos) << m;
    EXPECT_FALSE(std::filesystem::exists(t.out_dir + "/metrics.jsonl"));
  }
  std::filesystem::remove_all(root);
}

// Bad layout options name the option and the value.
// process_memory (what train, eval and generate report after loading the target): a 64 MiB buffer written in full
// raises the resident set by about that much, and the peak is never below it.
TEST(MemoryPlan, ProcessMemoryCountsAResidentBuffer) {
  const ProcessMemory before = process_memory();
  ASSERT_GT(before.rss_bytes, 0);
  std::vector<char> buf(size_t{64} << 20);
  for (size_t i = 0; i < buf.size(); i += 4096) buf[i] = static_cast<char>(i);
  const ProcessMemory after = process_memory();
  EXPECT_GE(after.rss_bytes - before.rss_bytes, int64_t{48} << 20) << describe(before) << " -> " << describe(after);
  EXPECT_GE(after.peak_rss_bytes, after.rss_bytes);
  EXPECT_NE(describe(after).find(" GiB, peak "), std::string::npos);
  EXPECT_EQ(describe(ProcessMemory{}), "unknown");
  EXPECT_NE(buf[4096], 1);  // (keeps the writes)
}

TEST(MemoryPlan, BadOptionsNameTheOption) {
  auto message = [](const TrainConfig& c) {
    try {
      plan_memory(memory_plan_inputs(c));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TrainConfig c = plan_config(golden("target_qwen3"), "3", 2);
  EXPECT_NE(message(c).find("--targets 3 with --target-split 2"), std::string::npos) << message(c);
  c = plan_config(golden("target_qwen3"), "", 0);
  EXPECT_NE(message(c).find("--target-split 0"), std::string::npos) << message(c);
  c = plan_config(golden("target_qwen3"), "5", 5);
  EXPECT_NE(message(c).find("--target-split 5: the target has only 4 layers"), std::string::npos) << message(c);
  c = plan_config(golden("target_qwen3"), "", 1);
  c.max_length = 0;
  EXPECT_NE(message(c).find("--max-length"), std::string::npos) << message(c);
  EXPECT_EQ(parse_bytes("80GiB", "--device-memory"), int64_t{80} << 30);
  EXPECT_EQ(parse_bytes("2.5e9", "--device-memory"), 2500000000);
  EXPECT_EQ(parse_bytes("512M", "--device-memory"), int64_t{512} << 20);
  try {
    parse_bytes("lots", "--device-memory");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device-memory 'lots'"), std::string::npos) << e.what();
  }
}

// `dflash info --plan` prints the table (a row per CPU context, the stages) and the JSON of the same plan; with too
// little memory it exits 1 with train's refusal.
TEST(MemoryPlan, InfoPlanPrintsTheTable) {
  test::TmpDir tmp("info_plan");
  const std::string base = cat(DFLASH_BINARY, " info --plan --target ", golden("target_qwen3"),
                               " --targets 4 --target-split 2 --max-length 40 --block-size 4 --max-anchors 8"
                               " --target-layer-ids 1,2");
  ASSERT_EQ(std::system((base + " > " + tmp.path + "/t.txt 2>&1").c_str()), 0) << read_file(tmp.path + "/t.txt");
  const std::string t = read_file(tmp.path + "/t.txt");
  for (const char* want : {"target weights", "optimizer", "cpu target 0 stage 0", "cpu target 1 stage 1",
                           "cpu drafter 0", "stage 0: layers 0-1", "stage 1: layers 2-3", "host: needs"})
    EXPECT_NE(t.find(want), std::string::npos) << want << "\n" << t;
  ASSERT_EQ(std::system((base + " --json > " + tmp.path + "/t.json 2>&1").c_str()), 0);
  const json j = json::parse(read_file(tmp.path + "/t.json"));
  const MemoryPlan p = plan_memory(memory_plan_inputs(plan_config(golden("target_qwen3"), "4", 2)));
  ASSERT_EQ(j["devices"].size(), 5u);
  EXPECT_EQ(j["needed"]["host"].get<int64_t>(), p.needed()[0].second);
  EXPECT_EQ(j["devices"][0]["bytes"]["target weights"].get<int64_t>(), p.devices[0].bytes[kTargetWeights]);
  EXPECT_GT(j["free"]["host"].get<int64_t>(), 0);  // MemAvailable
  const int rc = std::system((base + " --device-memory 64KiB > " + tmp.path + "/f.txt 2>&1").c_str());
  EXPECT_NE(rc, 0);
  EXPECT_NE(read_file(tmp.path + "/f.txt").find("has 65536 bytes"), std::string::npos) << read_file(tmp.path + "/f.txt");
}

}  // namespace
}  // namespace dflash
