// core/sha256.h — SHA-256 digests (libcrypto's EVP) as 64 lower-case hex digits: the one hasher behind every digest a
// manifest or checkpoint records (data shards and inputs, tokenizer.json, chat templates, target configs).
// defines: Sha256, sha256_hex, sha256_file
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace dflash {

// A streaming SHA-256: update() any number of times, then hex_digest() once. Not copyable; Error on a libcrypto
// failure.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  // The digest of every byte given so far; the hasher is finished after it.
  std::string hex_digest();

 private:
  evp_md_ctx_st* ctx_ = nullptr;
};

// SHA-256 of bytes.
std::string sha256_hex(std::string_view bytes);
// SHA-256 of a file's bytes, read in 1 MiB pieces; the file's size goes to *bytes when given. Error naming the path
// when it cannot be opened or read.
std::string sha256_file(const std::string& path, uint64_t* bytes = nullptr);

}  // namespace dflash
