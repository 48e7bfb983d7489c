// tests/core/core.cpp
// Tests of core/: dtype conversion, tensor views, counter-based RNG, atomic files, SHA-256, the plain progress lines.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>

#include "core/dtype.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/sha256.h"
#include "core/tensor.h"

using namespace dflash;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly half way between bf16 1.0 and 1.0078125: ties to even -> 1.0
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256.0f), 1.0f);
  // 1 + 3*2^-9 rounds up to 1 + 2^-7
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 512.0f), 1.0f + 1.0f / 128.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-INFINITY)), -INFINITY);
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(5.960464477539063e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0001), 5.960464477539063e-08f);
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive f16 round-trips
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(DType, Names) {
  DType t;
  ASSERT_TRUE(dtype_from_name("BF16", &t));
  EXPECT_EQ(t, DType::BF16);
  ASSERT_TRUE(dtype_from_name("F8_E4M3", &t));
  EXPECT_EQ(t, DType::F8E4M3);
  EXPECT_EQ(dtype_size(DType::F8E4M3), 1u);
  EXPECT_FALSE(dtype_from_name("F8_E5M2", &t));
  EXPECT_STREQ(dtype_name(DType::Bool), "BOOL");
}

TEST(Tensor, ReshapeSliceAndTypedAccess) {
  Tensor t = cpu_tensor({0, 1, 2, 3, 4, 5}, {3, 2});
  EXPECT_EQ(t.rows(), 3);
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape, (Shape{2, 2}));
  EXPECT_EQ(s.ptr<float>()[0], 2.0f);
  EXPECT_THROW(t.reshape({4}), Error);
  EXPECT_THROW(t.ptr<int32_t>(), Error);
  EXPECT_EQ(to_f32_vector(cpu_to_bf16(t))[5], 5.0f);
}

TEST(Rng, PhiloxKnownAnswer) {
  // Known-answer vector of Random123 (kat_vectors: philox4x32_10, counter/key all 0).
  auto r = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  auto r2 = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r2[0], 0x408f276du);
  EXPECT_EQ(r2[1], 0x41c83b0eu);
  EXPECT_EQ(r2[2], 0xa20bc7c6u);
  EXPECT_EQ(r2[3], 0x6d5451fdu);
}

TEST(Rng, StreamsAreIndependentAndResumable) {
  Rng a(7, RngPurpose::Anchors, 3, 1), b(7, RngPurpose::Anchors, 3, 2);
  std::vector<uint32_t> va, vb;
  for (int i = 0; i < 16; ++i) va.push_back(a.next_u32()), vb.push_back(b.next_u32());
  EXPECT_NE(va, vb);
  Rng c(7, RngPurpose::Anchors, 3, 1);
  c.set_position(5);
  EXPECT_EQ(c.next_u32(), va[5]);
  // below() stays in range and hits every value
  std::set<uint64_t> seen;
  for (int i = 0; i < 400; ++i) {
    uint64_t x = a.below(10);
    ASSERT_LT(x, 10u);
    seen.insert(x);
  }
  EXPECT_EQ(seen.size(), 10u);
  // normal(): mean ~0, var ~1 over 20000 draws (5 sigma bounds)
  double s = 0, s2 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    double x = a.normal();
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 5.0 / std::sqrt(n));
  EXPECT_NEAR(s2 / n, 1.0, 5.0 * std::sqrt(2.0 / n));
}

TEST(Rng, FillNormalIndependentOfThreadsWithUnitMoments) {
  const int64_t n = 300000;  // several chunks, the last partial
  std::vector<float> a(n), b(n);
  fill_normal(a.data(), n, 2.0, 11, RngPurpose::Init, 4, 1);
  fill_normal(b.data(), n, 2.0, 11, RngPurpose::Init, 4, 3);
  EXPECT_EQ(a, b);
  double s = 0, s2 = 0;
  for (float x : a) {
    s += x;
    s2 += static_cast<double>(x) * x;
  }
  EXPECT_NEAR(s / n, 0.0, 5 * 2.0 / std::sqrt(n));
  EXPECT_NEAR(s2 / n, 4.0, 5 * 4.0 * std::sqrt(2.0 / n));
  fill_normal(b.data(), n, 2.0, 11, RngPurpose::Init, 5, 2);
  EXPECT_NE(a, b);  // another stream
}

TEST(Files, AtomicWriteReplacesWholeFileOnlyOnCommit) {
  auto dir = std::filesystem::temp_directory_path() / "dflash_test_atomic";
  std::filesystem::create_directories(dir);
  std::string p = (dir / "f.txt").string();
  write_file_atomic(p, "old");
  {
    AtomicFile f(p);
    f.write("new content");
    // not committed: destroyed here
  }
  EXPECT_EQ(read_file(p), "old");
  for (auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string(), "f.txt") << "temp file left behind";
  write_file_atomic(p, "new");
  EXPECT_EQ(read_file(p), "new");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::filesystem::remove_all(dir);
}

// The streaming hasher, the one-shot digest and the file digest agree (FIPS 180-2's "abc" vector).
TEST(Files, Sha256StreamBytesAndFileAgree) {
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  Sha256 h;
  h.update("a");
  h.update("");
  h.update("bc", 2);
  EXPECT_EQ(h.hex_digest(), abc);
  const std::string p = (std::filesystem::temp_directory_path() / "dflash_test_sha256.bin").string();
  write_file_atomic(p, "abc");
  uint64_t bytes = 0;
  EXPECT_EQ(sha256_file(p, &bytes), abc);
  EXPECT_EQ(bytes, 3u);
  const std::string big(3 << 20 | 5, 'x');  // several 1 MiB reads and a partial one
  write_file_atomic(p, big);
  EXPECT_EQ(sha256_file(p), sha256_hex(big));
  std::filesystem::remove(p);
  EXPECT_THROW(sha256_file(p), Error);
}

namespace {
// What `f` writes to stderr (redirected to a file, so stderr is not a terminal and Progress prints plain lines).
std::string stderr_of(const std::function<void()>& f) {
  const std::string path = cat(std::filesystem::temp_directory_path().string(), "/dflash_test_core_stderr_", getpid());
  std::fflush(stderr);
  const int saved = dup(2);
  FILE* file = std::fopen(path.c_str(), "w");
  dup2(fileno(file), 2);
  f();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(file);
  std::string text = read_file(path);
  std::filesystem::remove(path);
  return text;
}
size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }
}  // namespace

// A run that stops right after a printed progress line (SIGINT, the last step) does not print that
// line a second time at finish(); a final state not yet printed still is.
TEST(Progress, FinishDoesNotRepeatThePrintedLine) {
  const std::string a = stderr_of([] {
    Progress p("train", 10, "step", 0.0);  // interval 0: every update prints
    p.update(4, "loss 1.0");
    p.update(5, "loss 0.9");
    p.finish();
  });
  EXPECT_EQ(count_lines(a), 2u) << a;
  EXPECT_EQ(a.find("train 5/10"), a.rfind("train 5/10")) << a;
  const std::string b = stderr_of([] {
    Progress p("train", 10, "step", 3600.0);  // nothing printed before finish
    p.update(5, "loss 0.9");
    p.finish();
  });
  EXPECT_EQ(count_lines(b), 1u) << b;
  EXPECT_NE(b.find("train 5/10"), std::string::npos) << b;
  const std::string c = stderr_of([] {
    Progress p("prepare", 0, "rows", 0.0);
    p.update(7, "x");
    p.finish("done");  // a new suffix: printed
  });
  EXPECT_EQ(count_lines(c), 2u) << c;
}

// A total revised during the run (train's time budget) shows from the next line on, not the first estimate.
TEST(Progress, ARevisedTotalIsShown) {
  const std::string a = stderr_of([] {
    Progress p("train", 3000, "step", 0.0);
    p.update(10, "a");
    p.set_total(600);
    p.update(11, "b");
    p.finish();
  });
  EXPECT_NE(a.find("train 10/3000"), std::string::npos) << a;
  EXPECT_NE(a.find("train 11/600"), std::string::npos) << a;
  EXPECT_EQ(a.find("11/3000"), std::string::npos) << a;
}
