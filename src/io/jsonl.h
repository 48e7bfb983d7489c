// io/jsonl.h — line-by-line reading of text files, plain or gzip-compressed (detected from the content, so a
// ".gz" name is not required), with bounded memory; JSON parsing of one line with a "<path>:<line>" error.
// defines: LineReader, read_lines, parse_json_line, json_row_error
#pragma once
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dflash {

class LineReader {
 public:
  struct Line {
    int64_t number = 0;     // 1-based
    std::string_view text;  // without the "\n" or "\r\n"; valid until the next call to next()
  };

  // Opens `path` (plain text or gzip). Throws Error naming the path if it cannot be opened.
  explicit LineReader(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Reads the next line into *out; returns false at the end of the file. A last line without a newline is
  // still returned; empty lines are returned (as empty text). Memory use is one read buffer plus the longest
  // line. Throws Error("<path>: read error ...") on an I/O error or a corrupt / truncated gzip stream.
  bool next(Line* out);
  const std::string& path() const { return path_; }

 private:
  bool fill();  // reads more bytes into buf_; false at end of file
  std::string path_;
  void* gz_ = nullptr;  // gzFile
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  std::string line_;  // a line that spans buffer refills
  int64_t number_ = 0;
  bool eof_ = false;
};

// All lines of a plain or gzip text file (without line terminators). Throws Error naming the path.
std::vector<std::string> read_lines(const std::string& path);

// Parses `text` as JSON. Throws Error("<path>:<line>: invalid JSON: <reason>"), the reason as json_row_error says it.
nlohmann::json parse_json_line(std::string_view text, const std::string& path, int64_t line);

// The reason of a JSON parse error of one row, told in the file's terms: nlohmann's "[json.exception...] " tag
// dropped, and its position inside the row ("at line 1, column 90") said as "at column 90 of line <line>" — the
// row's line in the file (line <= 0: "at column 90"). Any other message is returned without the tag.
std::string json_row_error(const std::exception& e, int64_t line);

}  // namespace dflash
