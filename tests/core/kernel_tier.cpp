// tests/core/kernel_tier.cpp
// The CUDA kernel tiers' rules (backend/kernel_tier.h): which build runs on which card, which tier a card gets, and
// the refusals, checked on the CPU for the cards people own (A100 8.0, A10 8.6, L40S 8.9, H100 9.0, B200 10.0,
// RTX 5090 12.0) and the ones the backend cannot serve (V100 7.0, T4 7.5); and `dflash info --device`.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/kernel_tier.h"
#include "core/error.h"

using namespace dflash;

namespace {

// The default build of CMakeLists.txt (DFLASH_CUDA_ARCHS "80-real;86-real;89-real;90a-real;89-virtual").
const char* kDefault = "sm_80 sm_86 sm_89 sm_90a compute_89";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(KernelTier, ParsesTargets) {
  const auto t = parse_cuda_targets("sm_80,sm_90a compute_120");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].major, 8);
  EXPECT_EQ(t[0].minor, 0);
  EXPECT_FALSE(t[0].ptx);
  EXPECT_FALSE(t[0].arch_specific);
  EXPECT_EQ(t[1].name(), "sm_90a");
  EXPECT_TRUE(t[1].arch_specific);
  EXPECT_EQ(t[2].major, 12);
  EXPECT_EQ(t[2].minor, 0);
  EXPECT_TRUE(t[2].ptx);
  EXPECT_EQ(t[2].name(), "compute_120");
  const std::string e = error_of([] { parse_cuda_targets("sm_80 gfx90a"); });
  EXPECT_NE(e.find("'gfx90a'"), std::string::npos) << e;
  EXPECT_NE(error_of([] { parse_cuda_targets("sm_8"); }), "");
}

TEST(KernelTier, BinaryCompatibility) {
  const auto d = parse_cuda_targets(kDefault);
  // SASS of 8.0 runs on 8.x; 8.9's on 8.9; sm_90a only on 9.0; compute_89 (PTX) on 9.0, 10.0, 12.0
  for (auto [maj, min] : {std::pair{8, 0}, {8, 6}, {8, 7}, {8, 9}, {9, 0}, {10, 0}, {10, 3}, {12, 0}})
    EXPECT_TRUE(build_runs_on(d, maj, min)) << maj << "." << min;
  EXPECT_FALSE(build_runs_on(d, 7, 5));
  const auto hopper_only = parse_cuda_targets("sm_90a");
  EXPECT_TRUE(build_runs_on(hopper_only, 9, 0));
  EXPECT_FALSE(build_runs_on(hopper_only, 8, 0));
  EXPECT_FALSE(build_runs_on(hopper_only, 10, 0));  // the 'a' code does not carry over to Blackwell
  EXPECT_FALSE(build_runs_on(parse_cuda_targets("sm_86"), 8, 0));  // SASS runs on its minor version and above
  EXPECT_TRUE(build_runs_on(parse_cuda_targets("sm_80"), 8, 9));
  EXPECT_FALSE(build_runs_on(parse_cuda_targets("sm_80"), 9, 0));  // not across major versions
  EXPECT_FALSE(build_runs_on(parse_cuda_targets("compute_90a"), 10, 0));
  EXPECT_TRUE(build_runs_on(parse_cuda_targets("compute_80"), 12, 0));
}

TEST(KernelTier, ChoosesTheHopperTierOnlyWhereItRuns) {
  const auto d = parse_cuda_targets(kDefault);
  EXPECT_EQ(choose_kernel_tier("cuda:0 H100", 9, 0, d, nullptr).tier, KernelTier::Hopper);
  EXPECT_EQ(choose_kernel_tier("cuda:0 H100", 9, 0, d, "auto").tier, KernelTier::Hopper);
  EXPECT_EQ(choose_kernel_tier("cuda:0 H100", 9, 0, d, "").tier, KernelTier::Hopper);
  EXPECT_EQ(choose_kernel_tier("cuda:0 H100", 9, 0, d, "hopper").tier, KernelTier::Hopper);
  const TierChoice forced = choose_kernel_tier("cuda:0 H100", 9, 0, d, "portable");
  EXPECT_EQ(forced.tier, KernelTier::Portable);
  EXPECT_EQ(forced.reason, "DFLASH_KERNELS=portable");
  for (auto [maj, min] : {std::pair{8, 0}, {8, 6}, {8, 9}, {10, 0}, {12, 0}}) {
    const TierChoice c = choose_kernel_tier("cuda:0 X", maj, min, d, nullptr);
    EXPECT_EQ(c.tier, KernelTier::Portable) << maj << "." << min;
    EXPECT_EQ(c.reason, "compute capability " + std::to_string(maj) + "." + std::to_string(min));
  }
  // a 9.0 card with a build that has no sm_90a code (PTX of 8.9 only): portable, and the log says why
  const TierChoice p = choose_kernel_tier("cuda:0 H200", 9, 0, parse_cuda_targets("sm_80 compute_89"), nullptr);
  EXPECT_EQ(p.tier, KernelTier::Portable);
  EXPECT_NE(p.reason.find("no sm_90a code"), std::string::npos) << p.reason;
  EXPECT_STREQ(kernel_tier_name(KernelTier::Hopper), "hopper");
  EXPECT_STREQ(kernel_tier_name(KernelTier::Portable), "portable");
}

TEST(KernelTier, RefusesByNameWhatCannotRun) {
  const auto d = parse_cuda_targets(kDefault);
  std::string e = error_of([&] { choose_kernel_tier("cuda:0 Tesla V100-SXM2-32GB", 7, 0, d, nullptr); });
  EXPECT_NE(e.find("Tesla V100-SXM2-32GB (compute capability 7.0)"), std::string::npos) << e;
  EXPECT_NE(e.find("8.0 or newer"), std::string::npos) << e;
  EXPECT_NE(e.find("--device cpu"), std::string::npos) << e;
  e = error_of([&] { choose_kernel_tier("cuda:0 T4", 7, 5, d, "portable"); });  // forcing a tier does not help
  EXPECT_NE(e.find("compute capability 7.5"), std::string::npos) << e;
  // an H100-only build on an A100: names the build's targets and the entry to add
  e = error_of([] { choose_kernel_tier("cuda:1 NVIDIA A100", 8, 0, parse_cuda_targets("sm_90a"), nullptr); });
  EXPECT_NE(e.find("cuda:1 NVIDIA A100 (compute capability 8.0)"), std::string::npos) << e;
  EXPECT_NE(e.find("sm_90a"), std::string::npos) << e;
  EXPECT_NE(e.find("-DDFLASH_CUDA_ARCHS=80-real"), std::string::npos) << e;
  e = error_of([] { choose_kernel_tier("cuda:0 H100", 9, 0, parse_cuda_targets("sm_80"), nullptr); });
  EXPECT_NE(e.find("-DDFLASH_CUDA_ARCHS=90a-real"), std::string::npos) << e;
  // DFLASH_KERNELS: a bad value, and the Hopper tier forced where it cannot run
  e = error_of([&] { choose_kernel_tier("cuda:0 H100", 9, 0, d, "fast"); });
  EXPECT_NE(e.find("DFLASH_KERNELS='fast'"), std::string::npos) << e;
  e = error_of([&] { choose_kernel_tier("cuda:0 L40S", 8, 9, d, "hopper"); });
  EXPECT_NE(e.find("DFLASH_KERNELS=hopper"), std::string::npos) << e;
  EXPECT_NE(e.find("L40S (compute capability 8.9)"), std::string::npos) << e;
}

// `dflash info --device DEV`: the device and what runs each group of ops there (a CUDA device lists its tier; here,
// the CPU backend), alone or beside a model directory; nothing given is refused.
TEST(KernelTier, InfoShowsTheDevicesKernels) {
  const std::string dir = ::testing::TempDir();
  const std::string out = dir + "/info_device.json", err = dir + "/info_device.txt";
  auto run = [](const std::string& args, const std::string& to) {
    return std::system((std::string(DFLASH_BINARY) + " info " + args + " > '" + to + "' 2>&1").c_str());
  };
  auto slurp = [](const std::string& p) {
    std::FILE* f = std::fopen(p.c_str(), "rb");
    std::string s;
    if (!f) return s;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
    std::fclose(f);
    return s;
  };
  ASSERT_EQ(run("--device cpu --json", out), 0) << slurp(out);
  const nlohmann::json j = nlohmann::json::parse(slurp(out));
  EXPECT_EQ(j["device"]["name"].get<std::string>().rfind("cpu (", 0), 0u) << j.dump();
  ASSERT_EQ(j["device"]["kernels"].size(), 1u);
  EXPECT_EQ(j["device"]["kernels"][0]["ops"], "every op");
  EXPECT_FALSE(j.contains("config"));
  // beside a model directory: both
  ASSERT_EQ(run(cat("--device cpu ", DFLASH_SOURCE_DIR, "/tests/golden/target_qwen3"), out), 0) << slurp(out);
  const std::string text = slurp(out);
  EXPECT_NE(text.find("device: cpu ("), std::string::npos) << text;
  EXPECT_NE(text.find("every op"), std::string::npos) << text;
  EXPECT_NE(text.find("arch: qwen3"), std::string::npos) << text;
  EXPECT_NE(run("", err), 0);
  EXPECT_NE(slurp(err).find("give a model directory, a .safetensors file, --device or --plan"), std::string::npos)
      << slurp(err);
  EXPECT_NE(run("--device tpu", err), 0);
  EXPECT_NE(slurp(err).find("unknown device 'tpu'"), std::string::npos) << slurp(err);
}
