// backend/device_memory.h — how much memory a device has free before anything is allocated on it: what the memory
// plan (train/memory_plan.h) compares its bytes with.
// defines: DeviceMemory, host_memory, cuda_device_memory, device_memory, ProcessMemory, process_memory,
//          describe (ProcessMemory)
#pragma once
#include <cstdint>
#include <string>

namespace dflash {

// Bytes free and in all; -1 where unknown.
struct DeviceMemory {
  int64_t free_bytes = -1, total_bytes = -1;
  bool known() const { return free_bytes >= 0; }
};

// The host's memory from /proc/meminfo: MemAvailable (what can be allocated without swapping) and MemTotal; unknown
// (-1) where the file is missing or has no such lines.
DeviceMemory host_memory();

// CUDA device `index` as cudaMemGetInfo reports it (it sets the device current for the call and restores the caller's).
// A build without the CUDA backend, or a device that cannot be queried: unknown (-1), never an error. Defined in
// backend/device_memory.cpp for both builds (its CUDA part over the runtime API, which dflash_core links with CUDA
// on): the one place that asks the CUDA runtime for free memory outside src/backend/cuda/.
DeviceMemory cuda_device_memory(int index);

// This process's resident host memory from /proc/self/status: VmRSS now and VmHWM, its peak so far (bytes; -1 where
// unknown). What loading a target costs the host (a stage maps only its layers' tensors: model/target.h load_stage).
struct ProcessMemory {
  int64_t rss_bytes = -1, peak_rss_bytes = -1;
};
ProcessMemory process_memory();
// "RSS 1.23 GiB, peak 2.34 GiB" ("unknown" where /proc/self/status is missing)
std::string describe(const ProcessMemory& m);

// The memory of a make_context device: "cpu" / "cpu64" -> the host's, "cuda" / "cuda:N" -> device N's (0 if no index).
DeviceMemory device_memory(const std::string& device);

}  // namespace dflash
