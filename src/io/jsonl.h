// io/jsonl.h — reading the rows of data files with bounded memory: line by line (JSON Lines), element by element
// (a JSON array `[{...}, {...}, ...]`, streamed, never read whole), either plain or gzip-compressed (detected from
// the content, so a ".gz" name is not required); which of the two a file is; JSON parsing of one line with a
// "<path>:<line>" error.
// defines: LineReader, JsonArrayReader, DataFormat, DataFileInfo, data_format_name, detect_data_file, RowReader,
//          read_lines, parse_json_line, json_row_error
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
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

// The elements of a file holding one JSON array, one at a time, without parsing them: a scanner that tracks
// bracket depth outside strings (escapes respected) finds where each top-level element ends. The element texts
// are then parsed by the caller, so one malformed element is that element's problem only. Memory use is one read
// buffer plus the longest element, whatever the file size. A UTF-8 byte-order mark at the start is skipped.
class JsonArrayReader {
 public:
  struct Element {
    int64_t index = 0;    // 0-based position in the array
    int64_t line = 0;     // 1-based line on which the element starts
    uint64_t offset = 0;  // byte offset at which it starts, in the (decompressed) text
    std::string_view text;  // its JSON text without surrounding whitespace ("" for an empty slot as in `[1,,2]`);
                            // valid until the next call to next()
  };

  // Opens `path` (plain text or gzip). Throws Error naming the path if it cannot be opened.
  explicit JsonArrayReader(const std::string& path);
  ~JsonArrayReader();
  JsonArrayReader(const JsonArrayReader&) = delete;
  JsonArrayReader& operator=(const JsonArrayReader&) = delete;

  // Reads the next element into *out; returns false after the closing ']' (checking that only whitespace
  // follows it). Throws Error naming the path: the text does not start with '[' ("not a JSON array"), the file
  // ends before the closing ']' ("truncated JSON array", with the element index, line and byte offset where it
  // ends), text other than whitespace after the ']', or a read error / corrupt or truncated gzip stream.
  bool next(Element* out);
  const std::string& path() const { return path_; }
  // The most bytes the reader has held at once (read buffer + element copy), for tests of the memory bound.
  size_t peak_buffer_bytes() const { return peak_; }

 private:
  bool fill();     // reads more bytes into buf_; false at end of file
  int peek();      // the next byte, or -1 at end of file
  void skip_ws();  // consumes JSON whitespace
  uint64_t offset() const { return base_ + pos_; }
  std::string path_;
  void* gz_ = nullptr;  // gzFile
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  uint64_t base_ = 0;  // bytes of the text before buf_[0]
  std::string elem_;   // an element that spans buffer refills
  int64_t line_ = 1, index_ = 0;
  size_t peak_ = 0;
  bool eof_ = false, started_ = false, closed_ = false, finished_ = false;
};

// How the rows of a data file are laid out.
enum class DataFormat { JsonLines, JsonArray };
const char* data_format_name(DataFormat f);  // "jsonl" | "json_array"

struct DataFileInfo {
  DataFormat format = DataFormat::JsonLines;
  bool gzip = false;  // the bytes are gzip-compressed
};

// Detects the layout of a data file. A name ending in ".json" or ".json.gz" (any case) holds a JSON array of rows
// when its text starts with '[' (after a byte-order mark and whitespace), or JSON Lines when its first non-blank
// line is one complete JSON object (as Hugging Face datasets' to_json writes); every other name is JSON Lines.
// Reads at most the start of the file. Throws Error naming the path: it cannot be opened or read, or a .json
// file is empty or neither of the two (e.g. one pretty-printed object, or a bare number).
DataFileInfo detect_data_file(const std::string& path);

// The rows of one data file, whatever its layout (detect_data_file): each line of JSON Lines, each element of a
// JSON array. Errors as LineReader / JsonArrayReader / detect_data_file.
class RowReader {
 public:
  struct Row {
    int64_t line = 0;    // 1-based line (JSON array: the line on which the element starts)
    int64_t index = -1;  // JSON array: the element's 0-based index; JSON Lines: -1
    std::string_view text;  // valid until the next call to next()
  };
  explicit RowReader(const std::string& path);
  ~RowReader();
  bool next(Row* out);
  const DataFileInfo& info() const { return info_; }

 private:
  DataFileInfo info_;
  std::unique_ptr<LineReader> lines_;
  std::unique_ptr<JsonArrayReader> array_;
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
