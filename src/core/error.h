// core/error.h — the one exception type of the project and the check macro.
// defines: dflash::Error, dflash::cat(...), DFLASH_CHECK(cond, parts...), DFLASH_FAIL(parts...)
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace dflash {

// Every user-facing failure (bad file, bad config field, unsupported shape, out of memory) is an Error whose
// message names the file / field / size involved. Programming errors use the same type: the CLI prints
// what() and exits non-zero.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// cat("a", 1, 'b', 2.5) -> "a1b2.5"
template <class... Ts>
std::string cat(const Ts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

[[noreturn]] inline void fail(const std::string& msg) { throw Error(msg); }

}  // namespace dflash

#define DFLASH_FAIL(...) ::dflash::fail(::dflash::cat(__VA_ARGS__))
#define DFLASH_CHECK(cond, ...)                      \
  do {                                               \
    if (!(cond)) ::dflash::fail(::dflash::cat(__VA_ARGS__)); \
  } while (0)
