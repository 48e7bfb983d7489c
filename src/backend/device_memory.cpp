// backend/device_memory.cpp — free memory of the host and of CUDA devices (backend/device_memory.h).
#include "backend/device_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#ifdef DFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dflash {

DeviceMemory host_memory() {
  DeviceMemory m;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    int64_t kib = 0;
    if (!(ls >> key >> kib)) continue;
    if (key == "MemAvailable:") m.free_bytes = kib * 1024;
    if (key == "MemTotal:") m.total_bytes = kib * 1024;
  }
  return m;
}

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    int64_t kib = 0;
    if (!(ls >> key >> kib)) continue;
    if (key == "VmRSS:") m.rss_bytes = kib * 1024;
    if (key == "VmHWM:") m.peak_rss_bytes = kib * 1024;
  }
  return m;
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
