// backend/op_profile.cpp — the per-op profile accumulator and its table (see op_profile.h).
#include "backend/op_profile.h"

#include <algorithm>
#include <cstdio>

#include "backend/context.h"

namespace dflash {

void OpProfile::add(const std::string& op, double ms, double flop) {
  OpProfileRow& r = rows_[op];
  if (r.op.empty()) r.op = op;
  r.calls += 1;
  r.ms += ms;
  r.flop += flop;
}

std::vector<OpProfileRow> OpProfile::rows() const {
  std::vector<OpProfileRow> v;
  v.reserve(rows_.size());
  for (const auto& [k, r] : rows_) v.push_back(r);
  std::stable_sort(v.begin(), v.end(), [](const OpProfileRow& a, const OpProfileRow& b) { return a.ms > b.ms; });
  return v;
}

std::string gemm_key(const char* op, int64_t M, int64_t N, int64_t K) {
  return std::string(op) + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
}

std::string rows_key(const char* op, int64_t R, int64_t D) {
  return std::string(op) + " " + std::to_string(R) + "x" + std::to_string(D);
}

double dflash_attn_fwd_flop(const DFlashAttnArgs& a, int64_t nh, int64_t d) {
  if (!a.anchors.defined() || a.anchors.device != Device::CPU) return 0.0;
  if (a.valid.defined() && a.valid.device != Device::CPU) return 0.0;
  const int32_t* an = a.anchors.ptr<int32_t>();
  const uint8_t* va = a.valid.defined() ? a.valid.ptr<uint8_t>() : nullptr;
  const double B = a.block_size;
  double pairs = 0;
  for (int64_t j = 0; j < a.anchors.numel(); ++j)
    if (!va || va[j]) pairs += B * (static_cast<double>(an[j]) + B);
  return 4.0 * static_cast<double>(d) * static_cast<double>(nh) * pairs;
}

std::string format_op_profile(const std::vector<OpProfileRow>& rows) {
  double total = 0;
  for (const auto& r : rows) total += r.ms;
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "%-44s %7s %11s %7s %9s\n", "op", "calls", "ms", "share", "TFLOP/s");
  s += line;
  for (const auto& r : rows) {
    char tf[32] = "-";
    if (r.flop > 0 && r.ms > 0) {  // 3 significant digits (CPU rates are a few hundredths of a TFLOP/s)
      const double t = r.flop / (r.ms * 1e-3) / 1e12;
      std::snprintf(tf, sizeof tf, t >= 100 ? "%.0f" : "%.3g", t);
    }
    std::snprintf(line, sizeof line, "%-44s %7lld %11.3f %6.1f%% %9s\n", r.op.c_str(), static_cast<long long>(r.calls),
                  r.ms, total > 0 ? 100.0 * r.ms / total : 0.0, tf);
    s += line;
  }
  std::snprintf(line, sizeof line, "%-44s %7s %11.3f\n", "total", "", total);
  s += line;
  return s;
}

}  // namespace dflash
