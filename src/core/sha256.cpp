// core/sha256.cpp — see sha256.h.
#include "core/sha256.h"

#include <openssl/evp.h>

#include <fstream>
#include <vector>

#include "core/error.h"

namespace dflash {

Sha256::Sha256() {
  ctx_ = EVP_MD_CTX_new();
  DFLASH_CHECK(ctx_ && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1, "SHA-256 init failed");
}

Sha256::~Sha256() {
  if (ctx_) EVP_MD_CTX_free(ctx_);
}

void Sha256::update(const void* data, size_t n) {
  DFLASH_CHECK(EVP_DigestUpdate(ctx_, data, n) == 1, "SHA-256 update failed");
}

std::string Sha256::hex_digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  DFLASH_CHECK(EVP_DigestFinal_ex(ctx_, md, &len) == 1, "SHA-256 final failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.hex_digest();
}

std::string sha256_file(const std::string& path, uint64_t* bytes) {
  std::ifstream in(path, std::ios::binary);
  DFLASH_CHECK(in.good(), path, ": cannot open for reading");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  uint64_t n = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    if (got > 0) {
      h.update(buf.data(), static_cast<size_t>(got));
      n += static_cast<uint64_t>(got);
    }
  }
  DFLASH_CHECK(!in.bad(), path, ": read error");
  if (bytes) *bytes = n;
  return h.hex_digest();
}

}  // namespace dflash
