// tests/common/test_util.h — small helpers shared by the test files.
// defines: source_dir, TmpDir, randn, to_f64, rel_err, max_abs
#pragma once
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace dflash::test {

inline std::string source_dir() { return DFLASH_SOURCE_DIR; }

// A temporary directory /tmp/dflash_test_<pid>_<name>, empty when made, removed with everything in it at the end of
// its scope.
struct TmpDir {
  std::string path;
  explicit TmpDir(const std::string& name) : path(cat("/tmp/dflash_test_", getpid(), "_", name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TmpDir() { std::filesystem::remove_all(path); }
  TmpDir(const TmpDir&) = delete;
  TmpDir& operator=(const TmpDir&) = delete;
};

// Host tensor of dtype dt (F32 or F64) with N(0, std) entries from a test stream.
inline Tensor randn(Shape s, uint64_t seed, double std = 1.0, DType dt = DType::F32) {
  Rng rng(seed, RngPurpose::Test);
  Tensor t = cpu_empty(dt, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = rng.normal() * std;
    if (dt == DType::F64) t.ptr<double>()[i] = x;
    else t.ptr<float>()[i] = static_cast<float>(x);
  }
  return t;
}

inline std::vector<double> to_f64(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::F64) {
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.ptr<double>()[i];
  } else {
    auto f = to_f32_vector(t);
    for (size_t i = 0; i < f.size(); ++i) v[i] = f[i];
  }
  return v;
}

// ||a - b|| / ||b||
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace dflash::test
