// backend/kernel_tier.cpp — the CUDA kernel tiers' rules (kernel_tier.h).
#include "backend/kernel_tier.h"

#include <algorithm>

#include "core/error.h"

namespace dflash {

const char* kernel_tier_name(KernelTier t) { return t == KernelTier::Hopper ? "hopper" : "portable"; }

std::string CudaTarget::name() const {
  return cat(ptx ? "compute_" : "sm_", major, minor, arch_specific ? "a" : "");
}

std::vector<CudaTarget> parse_cuda_targets(std::string_view text) {
  std::vector<CudaTarget> out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == ',') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != ',') ++j;
    const std::string_view e = text.substr(i, j - i);
    i = j;
    CudaTarget t;
    std::string_view num;
    if (e.starts_with("sm_")) {
      num = e.substr(3);
    } else if (e.starts_with("compute_")) {
      num = e.substr(8);
      t.ptx = true;
    }
    if (num.ends_with('a')) {
      t.arch_specific = true;
      num.remove_suffix(1);
    }
    const bool digits = num.size() >= 2 && num.size() <= 3 &&
                        std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; });
    DFLASH_CHECK(digits, "CUDA targets: '", e, "' is not sm_NN[a] or compute_NN[a] (in \"", text, "\")");
    const int v = std::stoi(std::string(num));
    t.major = v / 10;
    t.minor = v % 10;
    out.push_back(t);
  }
  return out;
}

bool build_runs_on(const std::vector<CudaTarget>& build, int major, int minor) {
  for (const CudaTarget& t : build) {
    if (t.ptx) {
      // PTX of an 'a' target is specific to its capability too (CUDA C++ Programming Guide, "Feature Availability")
      if (t.arch_specific ? (t.major == major && t.minor == minor)
                          : (t.major < major || (t.major == major && t.minor <= minor)))
        return true;
    } else if (t.major == major && (t.arch_specific ? t.minor == minor : t.minor <= minor)) {
      return true;
    }
  }
  return false;
}

namespace {

std::string targets_text(const std::vector<CudaTarget>& build) {
  std::string s;
  for (const CudaTarget& t : build) s += (s.empty() ? "" : " ") + t.name();
  return s.empty() ? "none" : s;
}

bool has_hopper_code(const std::vector<CudaTarget>& build) {
  return std::any_of(build.begin(), build.end(),
                     [](const CudaTarget& t) { return !t.ptx && t.arch_specific && t.major == 9 && t.minor == 0; });
}

}  // namespace

TierChoice choose_kernel_tier(const std::string& device, int major, int minor, const std::vector<CudaTarget>& build,
                              const char* forced) {
  const std::string cc = cat(major, ".", minor);
  DFLASH_CHECK(major >= 8, device, " (compute capability ", cc,
               "): the CUDA backend needs bf16 tensor cores, compute capability 8.0 or newer (A100, A10, L40S, RTX "
               "30xx and later, H100, B200); use --device cpu on this machine");
  const std::string f = forced ? forced : "";
  DFLASH_CHECK(f.empty() || f == "auto" || f == "portable" || f == "hopper", "DFLASH_KERNELS='", f,
               "': expected auto, portable or hopper");
  DFLASH_CHECK(build_runs_on(build, major, minor), device, " (compute capability ", cc,
               "): this dflash build has no code for it (its CUDA targets: ", targets_text(build),
               "); rebuild with -DDFLASH_CUDA_ARCHS=", major, minor, major == 9 && minor == 0 ? "a" : "",
               "-real added to the list");
  const bool hopper_ok = major == 9 && minor == 0 && has_hopper_code(build);
  if (f == "hopper") {
    DFLASH_CHECK(hopper_ok, "DFLASH_KERNELS=hopper: ", device, " (compute capability ", cc,
                 ") cannot run the Hopper tier, which needs compute capability 9.0 and the build's sm_90a code (its "
                 "CUDA targets: ", targets_text(build), ")");
    return {KernelTier::Hopper, "DFLASH_KERNELS=hopper"};
  }
  if (f == "portable") return {KernelTier::Portable, "DFLASH_KERNELS=portable"};
  if (hopper_ok) return {KernelTier::Hopper, "compute capability 9.0 with sm_90a code"};
  if (major == 9 && minor == 0)
    return {KernelTier::Portable, cat("compute capability 9.0, but the build has no sm_90a code (its CUDA targets: ",
                                      targets_text(build), ")")};
  return {KernelTier::Portable, cat("compute capability ", cc)};
}

}  // namespace dflash
