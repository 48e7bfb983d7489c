// io/jsonl.cpp — LineReader and JsonArrayReader over zlib's gzread (which passes plain files through unchanged),
// detect_data_file, RowReader.
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

gzFile open_gz(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  DFLASH_CHECK(f != nullptr, path, ": cannot open: ", errno ? std::strerror(errno) : "out of memory");
  gzbuffer(f, 1 << 17);
  return f;
}

// gzread into buf; 0 at a clean end of file. `where` says how far reading got, for the error message.
size_t read_gz(gzFile f, char* buf, size_t n, const std::string& path, const std::string& where) {
  const int got = gzread(f, buf, static_cast<unsigned>(n));
  if (got < 0) {
    int err = 0;
    const char* msg = gzerror(f, &err);
    DFLASH_FAIL(path, ": read error after ", where, ": ", err == Z_ERRNO ? std::strerror(errno) : msg);
  }
  if (got == 0) {
    // gzread returns 0 both at a clean end and for a truncated gzip stream; gzerror tells them apart.
    int err = 0;
    const char* msg = gzerror(f, &err);
    DFLASH_CHECK(err == Z_OK, path, ": read error after ", where, ": ", msg);
  }
  return static_cast<size_t>(got);
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string printable(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return cat("'", c, "'");
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", u);
  return buf;
}

}  // namespace

// ---- LineReader ---------------------------------------------------------------------------------------------

LineReader::LineReader(const std::string& path) : path_(path), buf_(kBuf) { gz_ = open_gz(path); }

LineReader::~LineReader() {
  if (gz_) gzclose_r(static_cast<gzFile>(gz_));
}

bool LineReader::fill() {
  if (eof_) return false;
  const size_t n = read_gz(static_cast<gzFile>(gz_), buf_.data(), buf_.size(), path_, cat("line ", number_));
  if (n == 0) {
    eof_ = true;
    return false;
  }
  pos_ = 0;
  len_ = n;
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

// ---- JsonArrayReader ----------------------------------------------------------------------------------------

JsonArrayReader::JsonArrayReader(const std::string& path) : path_(path), buf_(kBuf) { gz_ = open_gz(path); }

JsonArrayReader::~JsonArrayReader() {
  if (gz_) gzclose_r(static_cast<gzFile>(gz_));
}

bool JsonArrayReader::fill() {
  if (eof_) return false;
  const size_t n =
      read_gz(static_cast<gzFile>(gz_), buf_.data(), buf_.size(), path_, cat("byte offset ", offset()));
  if (n == 0) {
    eof_ = true;
    return false;
  }
  base_ += len_;
  pos_ = 0;
  len_ = n;
  return true;
}

int JsonArrayReader::peek() {
  if (pos_ == len_ && !fill()) return -1;
  return static_cast<unsigned char>(buf_[pos_]);
}

void JsonArrayReader::skip_ws() {
  for (int c = peek(); c >= 0 && is_ws(static_cast<char>(c)); c = peek()) {
    if (c == '\n') ++line_;
    ++pos_;
  }
}

bool JsonArrayReader::next(Element* out) {
  if (finished_) return false;
  if (!started_) {
    if (peek() == 0xEF) {  // a UTF-8 byte-order mark
      const char* bom = "\xEF\xBB\xBF";
      for (int k = 0; k < 3 && peek() == static_cast<unsigned char>(bom[k]); ++k) ++pos_;
    }
    skip_ws();
    const int c = peek();
    if (c < 0) DFLASH_FAIL(path_, ": not a JSON array: the file is empty");
    if (c != '[') {
      DFLASH_FAIL(path_, ": not a JSON array: the text starts with ", printable(static_cast<char>(c)), " (line ",
                  line_, ", byte offset ", offset(), "), not '['");
    }
    ++pos_;
    started_ = true;
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      closed_ = true;
    }
  }
  if (closed_) {
    skip_ws();
    const int c = peek();
    if (c >= 0) {
      DFLASH_FAIL(path_, ": unexpected ", printable(static_cast<char>(c)), " after the closing ']' of the JSON ",
                  "array (line ", line_, ", byte offset ", offset(), ")");
    }
    finished_ = true;
    return false;
  }
  // At the start of element index_ (after '[' or ',').
  skip_ws();
  const uint64_t start = offset();
  const int64_t start_line = line_;
  if (peek() < 0) {
    DFLASH_FAIL(path_, ": truncated JSON array: the file ends where element ", index_, " should start (line ",
                start_line, ", byte offset ", start, "), without the array's closing ']'");
  }
  elem_.clear();
  bool copied = false;  // bytes of this element were moved into elem_
  size_t seg = pos_;    // start of the element's bytes in buf_
  int64_t depth = 0;
  bool in_str = false, esc = false;
  for (;;) {
    if (pos_ == len_) {
      elem_.append(buf_.data() + seg, len_ - seg);
      copied = true;
      peak_ = std::max(peak_, buf_.size() + elem_.capacity());
      if (!fill()) {
        DFLASH_FAIL(path_, ": truncated JSON array: the file ends inside element ", index_, " (which starts at line ",
                    start_line, ", byte offset ", start, "), without the array's closing ']'");
      }
      seg = 0;
    }
    const char c = buf_[pos_];
    if (in_str) {
      if (esc) {
        esc = false;
      } else if (c == '\\') {
        esc = true;
      } else if (c == '"') {
        in_str = false;
      }
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == '}') {
      if (depth > 0) --depth;  // an unmatched '}' stays in the element, whose parse then fails
    } else if (c == ']') {
      if (depth == 0) {
        closed_ = true;
        break;
      }
      --depth;
    } else if (c == ',' && depth == 0) {
      break;
    }
    if (c == '\n') ++line_;
    ++pos_;
  }
  std::string_view text;
  if (copied) {
    elem_.append(buf_.data() + seg, pos_ - seg);
    text = elem_;
  } else {
    text = std::string_view(buf_.data() + seg, pos_ - seg);
  }
  ++pos_;  // the ',' or ']'
  while (!text.empty() && is_ws(text.back())) text.remove_suffix(1);
  peak_ = std::max(peak_, buf_.size() + elem_.capacity());
  out->index = index_++;
  out->line = start_line;
  out->offset = start;
  out->text = text;
  return true;
}

// ---- detect_data_file, RowReader ----------------------------------------------------------------------------

const char* data_format_name(DataFormat f) { return f == DataFormat::JsonArray ? "json_array" : "jsonl"; }

DataFileInfo detect_data_file(const std::string& path) {
  DataFileInfo info;
  std::string lower = path;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  auto ends_with = [&](std::string_view s) { return lower.size() >= s.size() && lower.ends_with(s); };
  const bool json_name = ends_with(".json") || ends_with(".json.gz");
  int first = -1;  // the first byte that is not whitespace (nor a byte-order mark), -1 if none
  {
    gzFile f = open_gz(path);
    std::vector<char> buf(kBuf);
    uint64_t seen = 0;
    try {
      for (;;) {
        const size_t n = read_gz(f, buf.data(), buf.size(), path, cat("byte offset ", seen));
        if (seen == 0) info.gzip = gzdirect(f) == 0;
        if (n == 0 || !json_name) break;
        size_t k = 0;
        if (seen == 0 && n >= 3 && std::memcmp(buf.data(), "\xEF\xBB\xBF", 3) == 0) k = 3;
        while (k < n && is_ws(buf[k])) ++k;
        seen += n;
        if (k < n) {
          first = static_cast<unsigned char>(buf[k]);
          break;
        }
      }
    } catch (...) {
      gzclose_r(f);
      throw;
    }
    gzclose_r(f);
  }
  if (!json_name) return info;
  DFLASH_CHECK(first >= 0, path, ": the file is empty; a .json input must hold a JSON array of rows ",
               "([{...}, {...}, ...])");
  if (first == '[') {
    info.format = DataFormat::JsonArray;
    return info;
  }
  // JSON Lines under a .json name: the first non-blank line must be one complete JSON object.
  LineReader r(path);
  LineReader::Line l;
  std::string_view text;
  while (r.next(&l)) {
    text = l.text;
    if (text.size() >= 3 && l.number == 1 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
    while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
    if (!text.empty()) break;
  }
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_object()) return info;
  const std::string what = j.is_discarded() ? std::string("its first line is not a complete JSON value")
                                            : cat("its first line is a JSON ", j.type_name());
  DFLASH_FAIL(path, ": not a JSON array of rows: a .json input must hold [{...}, {...}, ...] (or JSON Lines, one ",
              "object per line); this one starts with ", printable(static_cast<char>(first)), " and ", what);
}

RowReader::RowReader(const std::string& path) : info_(detect_data_file(path)) {
  if (info_.format == DataFormat::JsonArray) {
    array_ = std::make_unique<JsonArrayReader>(path);
  } else {
    lines_ = std::make_unique<LineReader>(path);
  }
}

RowReader::~RowReader() = default;

bool RowReader::next(Row* out) {
  if (array_) {
    JsonArrayReader::Element e;
    if (!array_->next(&e)) return false;
    out->line = e.line;
    out->index = e.index;
    out->text = e.text;
    return true;
  }
  LineReader::Line l;
  if (!lines_->next(&l)) return false;
  out->line = l.number;
  out->index = -1;
  out->text = l.text;
  return true;
}

// ---- helpers ------------------------------------------------------------------------------------------------

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
