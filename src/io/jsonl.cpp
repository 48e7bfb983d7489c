// io/jsonl.cpp — LineReader over zlib's gzread (which passes plain files through unchanged).
#include "io/jsonl.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dflash {

namespace {
constexpr size_t kBuf = 1 << 16;
}

LineReader::LineReader(const std::string& path) : path_(path), buf_(kBuf) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  DFLASH_CHECK(f != nullptr, path, ": cannot open: ", errno ? std::strerror(errno) : "out of memory");
  gzbuffer(f, 1 << 17);
  gz_ = f;
}

LineReader::~LineReader() {
  if (gz_) gzclose_r(static_cast<gzFile>(gz_));
}

bool LineReader::fill() {
  if (eof_) return false;
  gzFile f = static_cast<gzFile>(gz_);
  const int n = gzread(f, buf_.data(), static_cast<unsigned>(buf_.size()));
  if (n < 0) {
    int err = 0;
    const char* msg = gzerror(f, &err);
    DFLASH_FAIL(path_, ": read error after line ", number_, ": ", err == Z_ERRNO ? std::strerror(errno) : msg);
  }
  if (n == 0) {
    // gzread returns 0 both at a clean end and for a truncated gzip stream; gzerror tells them apart.
    int err = 0;
    const char* msg = gzerror(f, &err);
    DFLASH_CHECK(err == Z_OK, path_, ": read error after line ", number_, ": ", msg);
    eof_ = true;
    return false;
  }
  pos_ = 0;
  len_ = static_cast<size_t>(n);
  return true;
}

bool LineReader::next(Line* out) {
  line_.clear();
  bool partial = false;  // bytes of this line were moved into line_
  for (;;) {
    if (pos_ == len_ && !fill()) {
      if (!partial) return false;
      break;  // last line without a newline
    }
    const char* start = buf_.data() + pos_;
    const char* nl = static_cast<const char*>(std::memchr(start, '\n', len_ - pos_));
    if (nl) {
      const size_t n = static_cast<size_t>(nl - start);
      pos_ += n + 1;
      if (!partial) {  // the whole line lies in the buffer: no copy
        out->text = std::string_view(start, n);
        if (!out->text.empty() && out->text.back() == '\r') out->text.remove_suffix(1);
        out->number = ++number_;
        return true;
      }
      line_.append(start, n);
      break;
    }
    line_.append(start, len_ - pos_);
    pos_ = len_;
    partial = true;
  }
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  out->text = line_;
  out->number = ++number_;
  return true;
}

std::vector<std::string> read_lines(const std::string& path) {
  LineReader r(path);
  std::vector<std::string> out;
  LineReader::Line l;
  while (r.next(&l)) out.emplace_back(l.text);
  return out;
}

std::string json_row_error(const std::exception& e, int64_t line) {
  std::string why = e.what();
  if (!why.empty() && why.front() == '[') {  // drop nlohmann's "[json.exception.parse_error.101] " tag
    const size_t k = why.find("] ");
    if (k != std::string::npos) why.erase(0, k + 2);
  }
  // "... at line L, column C: ..." -> "... at column C of line <the row's line + L - 1>: ..."
  const std::string at = "at line ";
  const size_t p = why.find(at);
  if (p == std::string::npos) return why;
  size_t q = p + at.size();
  int64_t inner = 0;
  while (q < why.size() && std::isdigit(static_cast<unsigned char>(why[q]))) inner = inner * 10 + (why[q++] - '0');
  const std::string col = ", column ";
  if (why.compare(q, col.size(), col) != 0) return why;
  size_t r = q + col.size();
  const size_t c0 = r;
  while (r < why.size() && std::isdigit(static_cast<unsigned char>(why[r]))) ++r;
  if (r == c0) return why;
  std::string pos = "at column " + why.substr(c0, r - c0);
  if (line > 0) pos += " of line " + std::to_string(line + std::max<int64_t>(inner, 1) - 1);
  return why.substr(0, p) + pos + why.substr(r);
}

nlohmann::json parse_json_line(std::string_view text, const std::string& path, int64_t line) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    DFLASH_FAIL(path, ":", line, ": invalid JSON: ", json_row_error(e, line));
  }
}

}  // namespace dflash
