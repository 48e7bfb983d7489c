// bench/bench_run_inputs.cpp — what the resume check of a run's inputs costs (train/run_inputs.h, issue 39): the
// identity of the target's weights (per file: size, sha256 of the safetensors header, sha256 of 16 blocks of 64 KiB)
// against hashing every weight file whole, with a warm page cache and a cold one (the files' pages dropped with
// posix_fadvise(DONTNEED) before each run, which needs no privileges).
//   bench_run_inputs TARGET_DIR [--repeat N]
//   bench_run_inputs --make DIR --gib G      writes DIR/model.safetensors: one F32 tensor of G GiB of random bytes
//                                            (and a config.json), a stand-in for a large target
// Output: one RESULT line per measurement (bench/bench_util.h format).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <openssl/evp.h>

#include "bench_util.h"
#include "core/fs.h"
#include "core/rng.h"
#include "train/run_inputs.h"

namespace {

namespace fs = std::filesystem;

void make_target(const std::string& dir, int64_t gib) {
  fs::create_directories(dir);
  const int64_t bytes = gib << 30;
  std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(bytes / 4) +
                       "],\"data_offsets\":[0," + std::to_string(bytes) + "]}}";
  while ((8 + header.size()) % 8) header.push_back(' ');
  std::ofstream f(dir + "/model.safetensors", std::ios::binary);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  dflash::Rng rng(1, dflash::RngPurpose::Test);
  std::vector<uint64_t> block(1 << 20);
  for (int64_t done = 0; done < bytes; done += static_cast<int64_t>(block.size() * 8)) {
    for (auto& x : block) x = rng.next_u64();
    f.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(block.size() * 8));
  }
  std::ofstream(dir + "/config.json") << "{\"architectures\": [\"Qwen3ForCausalLM\"]}\n";
}

std::vector<std::string> safetensors_files(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") v.push_back(e.path().string());
  return v;
}

void drop_cache(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// sha256 of every file, read in 8 MiB blocks: what hashing the weights whole would cost.
double hash_whole(const std::vector<std::string>& files, int64_t* bytes) {
  const double t0 = bench::now_s();
  std::vector<char> buf(8 << 20);
  *bytes = 0;
  for (const auto& f : files) {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
    const int fd = ::open(f.c_str(), O_RDONLY);
    for (ssize_t r; (r = ::read(fd, buf.data(), buf.size())) > 0;) {
      EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(r));
      *bytes += r;
    }
    ::close(fd);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
  }
  return bench::now_s() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::string(argv[1]) == "--make") {
    make_target(argv[2], std::atoll(argv[4]));
    return 0;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_run_inputs TARGET_DIR [--repeat N] | --make DIR --gib G\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int repeat = argc >= 4 && std::string(argv[2]) == "--repeat" ? std::atoi(argv[3]) : 5;
  const auto files = safetensors_files(dir);
  int64_t total = 0;
  for (const auto& f : files) total += static_cast<int64_t>(fs::file_size(f));
  for (const bool cold : {false, true}) {
    std::vector<double> ident, whole;
    int64_t hashed = 0;
    for (int i = 0; i < repeat; ++i) {
      if (cold) drop_cache(files);
      const double t0 = bench::now_s();
      const auto id = dflash::target_identity(dir, false, 0);
      ident.push_back(bench::now_s() - t0);
      if (cold) drop_cache(files);
      whole.push_back(hash_whole(files, &hashed));
    }
    std::printf("RESULT name=run_inputs cache=%s files=%zu bytes=%lld identity_ms=%.2f whole_sha256_ms=%.1f "
                "whole_MBps=%.0f\n",
                cold ? "cold" : "warm", files.size(), static_cast<long long>(total), 1e3 * bench::median(ident),
                1e3 * bench::median(whole), static_cast<double>(hashed) / 1e6 / bench::median(whole));
  }
  return 0;
}
