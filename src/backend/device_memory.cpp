// backend/device_memory.cpp — free memory of the host and of CUDA devices (backend/device_memory.h).
#include "backend/device_memory.h"

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <vector>

#ifdef DFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dflash {

namespace {

// The values of `keys` (in kB) from a /proc file of "Key:   N kB" lines, in bytes; -1 for a key not found.
std::vector<int64_t> proc_kib_fields(const char* path, std::initializer_list<const char*> keys) {
  std::vector<int64_t> out(keys.size(), -1);
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    int64_t kib = 0;
    if (!(ls >> key >> kib)) continue;
    size_t i = 0;
    for (const char* k : keys) {
      if (key == k) out[i] = kib * 1024;
      ++i;
    }
  }
  return out;
}

}  // namespace

DeviceMemory host_memory() {
  const std::vector<int64_t> v = proc_kib_fields("/proc/meminfo", {"MemAvailable:", "MemTotal:"});
  return {v[0], v[1]};
}

ProcessMemory process_memory() {
  const std::vector<int64_t> v = proc_kib_fields("/proc/self/status", {"VmRSS:", "VmHWM:"});
  return {v[0], v[1]};
}

std::string describe(const ProcessMemory& m) {
  if (m.rss_bytes < 0) return "unknown";
  char b[96];
  std::snprintf(b, sizeof b, "RSS %.2f GiB, peak %.2f GiB", m.rss_bytes / 1073741824.0, m.peak_rss_bytes / 1073741824.0);
  return b;
}

DeviceMemory cuda_device_memory(int index) {
  DeviceMemory m;
#ifdef DFLASH_HAVE_CUDA
  int old = -1;
  if (cudaGetDevice(&old) != cudaSuccess) old = -1;
  size_t free_b = 0, total_b = 0;
  if (cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    m.free_bytes = static_cast<int64_t>(free_b);
    m.total_bytes = static_cast<int64_t>(total_b);
  }
  cudaGetLastError();  // a failed query leaves no sticky error for the contexts made later
  if (old >= 0 && old != index) cudaSetDevice(old);
#else
  (void)index;
#endif
  return m;
}

DeviceMemory device_memory(const std::string& device) {
  if (device == "cpu" || device == "cpu64") return host_memory();
  if (device == "cuda") return cuda_device_memory(0);
  if (device.rfind("cuda:", 0) == 0) return cuda_device_memory(std::stoi(device.substr(5)));
  return {};
}

}  // namespace dflash
