// backend/kernel_tier.h — which of the CUDA backend's kernel tiers runs on a device, and whether a build's code runs
// on it at all. The rules live apart from the CUDA runtime so that they are tested on any machine (tests/core).
// defines: KernelTier, CudaTarget, parse_cuda_targets, build_runs_on, choose_kernel_tier
//
// Tiers (docs/gpus.md lists each op's kernel per tier):
//   Hopper    compute capability 9.0 (H100, H200, GH200) with the build's sm_90a code: the warpgroup-MMA / TMA
//             kernels (attention forward at head dim 128 / 256, the DFlash attention backward at 128, the grouped
//             MoE GEMMs), the mma.sync kernels elsewhere.
//   Portable  every other card from compute capability 8.0 (A100, A10, L40S, RTX 30xx-50xx, B200 through PTX or its
//             own code), and any card with DFLASH_KERNELS=portable: the mma.sync (sm_80) tensor-core kernels
//             and, where those do not apply, the CUDA-core ones. GEMMs run through cuBLASLt on every tier.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

enum class KernelTier { Hopper, Portable };
const char* kernel_tier_name(KernelTier t);  // "hopper", "portable"

// One code object of a build: machine code (SASS, "sm_90a") for one compute capability, or PTX ("compute_89") that
// the driver compiles for its card at load time.
struct CudaTarget {
  int major = 0, minor = 0;
  bool arch_specific = false;  // the 'a' targets (sm_90a): their code runs on exactly that compute capability
  bool ptx = false;            // compute_NN (PTX) rather than sm_NN (SASS)
  std::string name() const;    // "sm_90a", "compute_89"
};

// Parses the build's targets as CMake writes them for the context ("sm_80 sm_86 sm_90a compute_89": space or
// comma separated). Throws Error naming the entry that is not sm_NN[a] / compute_NN[a].
std::vector<CudaTarget> parse_cuda_targets(std::string_view text);

// Whether some target of the build runs on a device of compute capability major.minor (CUDA C++ Programming Guide,
// "Binary Compatibility" and "Application Compatibility"): SASS for X.y runs on X.z with z >= y (an 'a' target only
// on X.y itself); PTX for X.y is compiled by the driver for any device of capability >= X.y.
bool build_runs_on(const std::vector<CudaTarget>& build, int major, int minor);

struct TierChoice {
  KernelTier tier = KernelTier::Portable;
  std::string reason;  // why, for the log: "compute capability 9.0 with sm_90a code", "DFLASH_KERNELS=portable", ...
};

// The tier a device runs. device: its name for messages ("cuda:0 NVIDIA A100-SXM4-80GB"); forced: the value of
// DFLASH_KERNELS (null or "" or "auto": choose; "portable": the portable tier on any card; "hopper": the Hopper tier,
// refused where it cannot run). Throws Error, naming the device and its compute capability:
//   - below 8.0 (no bf16 tensor cores: V100, T4, ...): the CUDA backend does not run there (use --device cpu);
//   - no target of the build runs on it: naming the build's targets and the DFLASH_CUDA_ARCHS entry to add;
//   - forced is not auto / portable / hopper, or is "hopper" where the Hopper tier cannot run.
TierChoice choose_kernel_tier(const std::string& device, int major, int minor, const std::vector<CudaTarget>& build,
                              const char* forced);

}  // namespace dflash
