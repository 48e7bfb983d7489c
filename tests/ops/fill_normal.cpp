// tests/ops/fill_normal.cpp — Context::fill_normal on the CPU draws the values of core/rng.h fill_normal (any thread
// count; widened in fp64), with mean 0 and the asked standard deviation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/context.h"
#include "core/rng.h"
#include "common/test_util.h"

using namespace dflash;
using test::randn;
using test::to_f64;

// Context::fill_normal on the CPU draws the values of core/rng.h fill_normal (any thread count), widened in F64.
TEST(OpFillNormal, CpuContextMatchesCoreFillNormal) {
  const int64_t n = (int64_t{1} << 16) + 5;
  std::vector<float> want(static_cast<size_t>(n));
  fill_normal(want.data(), n, 0.5, 42, RngPurpose::Init, 9, 1);
  auto c1 = make_context("cpu", {.threads = 2});
  auto c64 = make_context("cpu64", {.threads = 1});
  Tensor a = cpu_empty(DType::F32, {n}), b = cpu_empty(DType::F64, {n});
  c1->fill_normal(a, 0.5, 42, RngPurpose::Init, 9);
  c64->fill_normal(b, 0.5, 42, RngPurpose::Init, 9);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a.ptr<float>()[i], want[static_cast<size_t>(i)]) << i;
    ASSERT_EQ(b.ptr<double>()[i], static_cast<double>(want[static_cast<size_t>(i)])) << i;
  }
  double s = 0, s2 = 0;
  for (float x : want) {
    s += x;
    s2 += double(x) * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);                  // mean 0 (std of the mean 0.5/256)
  EXPECT_NEAR(std::sqrt(s2 / n), 0.5, 0.01);      // std 0.5
}
