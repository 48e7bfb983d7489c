// tests/io/jsonl.cpp
// Tests of io/jsonl: LineReader over plain and gzip files (CRLF, empty and long lines, no final newline,
// buffer boundaries, truncated gzip), read_lines, parse_json_line's error message; JsonArrayReader (strings,
// escapes and nesting, index / line / offset, streaming with a bounded buffer, truncated and malformed arrays),
// detect_data_file and RowReader.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <functional>
#include <ostream>
#include <tuple>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "io/jsonl.h"

using namespace dflash;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = cat("/tmp/dflash_test_", getpid(), "_", info->test_suite_name(), "_", info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// (number, text) of every line.
std::vector<std::pair<int64_t, std::string>> all_lines(const std::string& path) {
  std::vector<std::pair<int64_t, std::string>> out;
  LineReader r(path);
  LineReader::Line l;
  while (r.next(&l)) out.emplace_back(l.number, std::string(l.text));
  return out;
}

}  // namespace

TEST(Jsonl, PlainAndGzipGiveTheSameLines) {
  TempDir dir;
  const std::string long_line = "{\"x\": \"" + std::string(300000, 'a') + "\"}";
  const std::string text = "{\"a\": 1}\r\n\n" + long_line + "\nplain\r\n  \n{\"last\": true}";
  const std::vector<std::pair<int64_t, std::string>> expect = {
      {1, "{\"a\": 1}"}, {2, ""}, {3, long_line}, {4, "plain"}, {5, "  "}, {6, "{\"last\": true}"}};
  write_file_atomic(dir / "d.jsonl", text);
  write_gz(dir / "d.jsonl.gz", text);
  write_gz(dir / "gz_without_suffix.jsonl", text);
  EXPECT_EQ(all_lines(dir / "d.jsonl"), expect);
  EXPECT_EQ(all_lines(dir / "d.jsonl.gz"), expect);
  EXPECT_EQ(all_lines(dir / "gz_without_suffix.jsonl"), expect);
  EXPECT_EQ(read_lines(dir / "d.jsonl.gz").size(), 6u);
  EXPECT_EQ(read_lines(dir / "d.jsonl")[2].size(), long_line.size());
}

TEST(Jsonl, EdgeCases) {
  TempDir dir;
  write_file_atomic(dir / "empty", "");
  EXPECT_TRUE(all_lines(dir / "empty").empty());
  write_file_atomic(dir / "nl", "\n");
  EXPECT_EQ(all_lines(dir / "nl"), (std::vector<std::pair<int64_t, std::string>>{{1, ""}}));
  write_file_atomic(dir / "two", "a\nb\n");
  EXPECT_EQ(read_lines(dir / "two"), (std::vector<std::string>{"a", "b"}));
  write_file_atomic(dir / "cr_last", "a\r\nb\r");
  EXPECT_EQ(read_lines(dir / "cr_last"), (std::vector<std::string>{"a", "b"}));
  write_file_atomic(dir / "inner_cr", "a\rb\n");
  EXPECT_EQ(read_lines(dir / "inner_cr"), (std::vector<std::string>{"a\rb"}));
  write_gz(dir / "empty.gz", "");
  EXPECT_TRUE(read_lines(dir / "empty.gz").empty());
}

TEST(Jsonl, ManyLinesAcrossBufferBoundaries) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "{\"i\": " + std::to_string(i) + ", \"pad\": \"" + std::string(i % 37, 'x') +
                                          "\"}" + (i % 3 ? "\n" : "\r\n");
  write_file_atomic(dir / "many.jsonl", text);
  write_gz(dir / "many.jsonl.gz", text);
  for (const char* name : {"many.jsonl", "many.jsonl.gz"}) {
    LineReader r(dir / name);
    LineReader::Line l;
    int64_t n = 0;
    while (r.next(&l)) {
      ++n;
      ASSERT_EQ(l.number, n);
      nlohmann::json j = parse_json_line(l.text, r.path(), l.number);
      ASSERT_EQ(j["i"].get<int64_t>(), n - 1) << name;
      ASSERT_EQ(j["pad"].get<std::string>().size(), static_cast<size_t>((n - 1) % 37));
    }
    EXPECT_EQ(n, 20000) << name;
  }
}

TEST(Jsonl, ErrorsNameThePath) {
  TempDir dir;
  try {
    LineReader r(dir / "absent.jsonl");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.jsonl"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_lines(dir / "absent.jsonl"), Error);

  // A truncated gzip stream is an error after the lines that could be read, never a silent short read.
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "{\"row\": " + std::to_string(i * 7919 % 10007) + "}\n";
  write_gz(dir / "full.gz", text);
  const std::string gz = read_file(dir / "full.gz");
  write_file_atomic(dir / "cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  try {
    read_lines(dir / "cut.jsonl.gz");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jsonl.gz"), std::string::npos) << e.what();
  }
  // Corrupt deflate data.
  std::string bad = gz;
  for (size_t i = 20; i < 60 && i < bad.size(); ++i) bad[i] = static_cast<char>(bad[i] ^ 0xff);
  write_file_atomic(dir / "bad.jsonl.gz", bad);
  EXPECT_THROW(read_lines(dir / "bad.jsonl.gz"), Error);
  // A directory cannot be read as lines.
  EXPECT_THROW(read_lines(dir / ""), Error);
}

TEST(Jsonl, ParseJsonLineError) {
  EXPECT_EQ(parse_json_line(R"({"messages": []})", "d.jsonl", 1)["messages"].size(), 0u);
  try {
    parse_json_line(R"({"messages": [})", "/data/train.jsonl", 17);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("/data/train.jsonl:17: invalid JSON: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;
    // the position as the file has it, not nlohmann's "line 1, column 15" inside the row
    EXPECT_NE(msg.find("parse error at column 15 of line 17: "), std::string::npos) << msg;
    EXPECT_EQ(msg.find("line 1,"), std::string::npos) << msg;
  }
  EXPECT_THROW(parse_json_line("", "x", 1), Error);
}

namespace {

// (index, line, offset, text) of every element.
struct El {
  int64_t index, line;
  uint64_t offset;
  std::string text;
  bool operator==(const El&) const = default;
};
std::ostream& operator<<(std::ostream& os, const El& e) {
  return os << "{" << e.index << ", " << e.line << ", " << e.offset << ", " << e.text << "}";
}

std::vector<El> all_elements(const std::string& path) {
  std::vector<El> out;
  JsonArrayReader r(path);
  JsonArrayReader::Element e;
  while (r.next(&e)) out.push_back({e.index, e.line, e.offset, std::string(e.text)});
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(JsonArray, ElementsWithStringsEscapesAndNesting) {
  TempDir dir;
  // Brackets, braces, commas and escaped quotes inside strings; nested arrays and objects; scalars; a BOM,
  // CRLF and blank space around elements.
  const std::string e0 = R"({"a": "x,]}\"[{", "b": [1, [2, {"c": "\\"}]], "d": {"e": [], "f": "\\\""}})";
  const std::string e1 = "42";
  const std::string e2 = R"("s\"], \\")";
  const std::string e3 = "[]";
  const std::string e4 = "{ }";
  const std::string e5 = "{\"m\": [\r\n  1,\r\n  2\r\n]}";
  std::string text = "\xEF\xBB\xBF \r\n[\r\n  ";
  std::vector<El> expect;
  auto add = [&](int64_t line, const std::string& e, const std::string& after) {
    expect.push_back({static_cast<int64_t>(expect.size()), line, text.size(), e});
    text += e + after;
  };
  add(3, e0, ",\r\n  ");
  add(4, e1, " , ");
  add(4, e2, ",\n");
  add(5, e3, ",");
  add(5, e4, ",\n\n");
  add(7, e5, "\n]\n  \n");
  write_file_atomic(dir / "a.json", text);
  write_gz(dir / "a.json.gz", text);
  write_gz(dir / "gz_without_suffix", text);
  EXPECT_EQ(all_elements(dir / "a.json"), expect);
  EXPECT_EQ(all_elements(dir / "a.json.gz"), expect);
  EXPECT_EQ(all_elements(dir / "gz_without_suffix"), expect);
  for (const El& e : all_elements(dir / "a.json")) EXPECT_NO_THROW(nlohmann::json::parse(e.text)) << e.text;
  EXPECT_EQ(nlohmann::json::parse(e0)["a"], "x,]}\"[{");

  write_file_atomic(dir / "empty_array.json", " [ \n ] ");
  EXPECT_TRUE(all_elements(dir / "empty_array.json").empty());
  write_file_atomic(dir / "tight.json", "[1,2]");
  EXPECT_EQ(all_elements(dir / "tight.json"), (std::vector<El>{{0, 1, 1, "1"}, {1, 1, 3, "2"}}));
  // Empty slots are yielded as empty text (the caller skips them); an unmatched '}' stays in its element.
  write_file_atomic(dir / "slots.json", "[1,,2,]");
  EXPECT_EQ(all_elements(dir / "slots.json"),
            (std::vector<El>{{0, 1, 1, "1"}, {1, 1, 3, ""}, {2, 1, 4, "2"}, {3, 1, 6, ""}}));
  write_file_atomic(dir / "brace.json", "[{\"a\": 1}}, 2]");
  EXPECT_EQ(all_elements(dir / "brace.json"), (std::vector<El>{{0, 1, 1, "{\"a\": 1}}"}, {1, 1, 12, "2"}}));
}

TEST(JsonArray, StreamsElementByElementWithABoundedBuffer) {
  TempDir dir;
  // ~6 MB of rows, plus one element of 300 KB that spans several read buffers.
  std::string text = "[\n";
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    if (i == 1234) {
      text += "{\"i\": " + std::to_string(i) + ", \"big\": \"" + std::string(300000, 'b') + "\"},\n";
      continue;
    }
    text += "{\"i\": " + std::to_string(i) + ", \"conversations\": [{\"from\": \"human\", \"value\": \"q" +
            std::string(i % 97, 'x') + "\"}, {\"from\": \"gpt\", \"value\": \"a, [b] {c} \\\"d\\\"\"}]}" +
            (i + 1 < n ? ",\n" : "\n");
  }
  text += "]\n";
  ASSERT_GT(text.size(), 6u << 20);
  write_file_atomic(dir / "big.json", text);
  write_gz(dir / "big.json.gz", text);
  for (const char* name : {"big.json", "big.json.gz"}) {
    JsonArrayReader r(dir / name);
    JsonArrayReader::Element e;
    int64_t k = 0;
    size_t peak_small = 0;  // the peak before the big element
    while (r.next(&e)) {
      ASSERT_EQ(e.index, k);
      ASSERT_EQ(e.line, k + 2);
      const nlohmann::json j = nlohmann::json::parse(e.text);
      ASSERT_EQ(j["i"].get<int64_t>(), k) << name;
      if (k == 1234) {
        EXPECT_EQ(j["big"].get<std::string>().size(), 300000u);
      } else {
        ASSERT_EQ(j["conversations"][1]["value"], "a, [b] {c} \"d\"");
      }
      if (k == 1233) peak_small = r.peak_buffer_bytes();
      ++k;
    }
    EXPECT_EQ(k, n) << name;
    // One 64 KiB read buffer plus the longest element: far below the file's size.
    EXPECT_LE(peak_small, 72u << 10) << name;
    EXPECT_LE(r.peak_buffer_bytes(), 1u << 20) << name;
  }

  // The elements come out before the end of the file is read: a file cut in the middle yields the rows before
  // the cut, then fails naming the file and where it ends.
  write_file_atomic(dir / "cut.json", text.substr(0, text.size() / 2));
  JsonArrayReader r(dir / "cut.json");
  JsonArrayReader::Element e;
  int64_t got = 0;
  std::string err;
  try {
    while (r.next(&e)) ++got;
  } catch (const Error& ex) {
    err = ex.what();
  }
  EXPECT_GT(got, n / 3);
  EXPECT_LT(got, n);
  EXPECT_NE(err.find(dir / "cut.json"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated JSON array"), std::string::npos) << err;
  EXPECT_NE(err.find(cat("element ", got, " ")), std::string::npos) << err;
  EXPECT_NE(err.find(cat("line ", got + 2, ",")), std::string::npos) << err;
  EXPECT_NE(err.find("byte offset"), std::string::npos) << err;
}

TEST(JsonArray, MalformedArraysAreErrorsNamingTheFileAndPlace) {
  TempDir dir;
  auto err = [&](const std::string& name, const std::string& text) {
    write_file_atomic(dir / name, text);
    const std::string msg = error_of([&] { all_elements(dir / name); });
    EXPECT_NE(msg.find(dir / name), std::string::npos) << msg;
    return msg;
  };
  EXPECT_NE(err("obj.json", "{\"a\": [1, 2]}").find("not a JSON array: the text starts with '{' (line 1, byte "
                                                     "offset 0)"),
            std::string::npos);
  EXPECT_NE(err("empty.json", "  \n").find("not a JSON array: the file is empty"), std::string::npos);
  EXPECT_NE(err("open.json", "[").find("the file ends where element 0 should start (line 1, byte offset 1)"),
            std::string::npos);
  EXPECT_NE(err("comma.json", "[1,\n 2,\n").find("the file ends where element 2 should start (line 3, byte "
                                                "offset 8)"),
            std::string::npos);
  EXPECT_NE(err("inside.json", "[1,\n {\"a\": \"x]").find(
                "truncated JSON array: the file ends inside element 1 (which starts at line 2, byte offset 5)"),
            std::string::npos);
  EXPECT_NE(err("unclosed.json", "[1, 2").find("the file ends inside element 1"), std::string::npos);
  EXPECT_NE(err("after.json", "[1, 2]\n x").find("unexpected 'x' after the closing ']' of the JSON array (line 2, "
                                                  "byte offset 8)"),
            std::string::npos);
  EXPECT_NE(err("two.json", "[1] [2]").find("unexpected '['"), std::string::npos);
  // A truncated gzip stream is a read error, never a short array.
  std::string text = "[";
  for (int i = 0; i < 5000; ++i) text += std::to_string(i * 7919 % 10007) + ",";
  text += "0]";
  write_gz(dir / "full.json.gz", text);
  const std::string gz = read_file(dir / "full.json.gz");
  write_file_atomic(dir / "cut.json.gz", gz.substr(0, gz.size() / 2));
  EXPECT_NE(error_of([&] { all_elements(dir / "cut.json.gz"); }).find(dir / "cut.json.gz"), std::string::npos);
  EXPECT_THROW(JsonArrayReader(dir / "absent.json"), Error);
}

TEST(JsonArray, DetectDataFileAndRowReader) {
  TempDir dir;
  const std::string arr = "[{\"a\": 1},\n {\"a\": 2}]";
  const std::string jl = "{\"a\": 1}\n{\"a\": 2}\n";
  write_file_atomic(dir / "a.json", arr);
  write_gz(dir / "a.json.gz", arr);
  write_file_atomic(dir / "A.JSON", "\xEF\xBB\xBF\n " + arr);
  write_file_atomic(dir / "lines.json", "\n" + jl);  // JSON Lines under a .json name (HF datasets' to_json)
  write_file_atomic(dir / "a.jsonl", jl);
  write_gz(dir / "a.jsonl.gz", jl);
  write_gz(dir / "noext", jl);
  write_file_atomic(dir / "array_row.jsonl", "[1, 2]\n{\"a\": 1}\n");  // a .jsonl is lines, whatever its rows
  auto fmt = [&](const std::string& name) {
    const DataFileInfo i = detect_data_file(dir / name);
    return cat(data_format_name(i.format), i.gzip ? "+gz" : "");
  };
  EXPECT_EQ(fmt("a.json"), "json_array");
  EXPECT_EQ(fmt("a.json.gz"), "json_array+gz");
  EXPECT_EQ(fmt("A.JSON"), "json_array");
  EXPECT_EQ(fmt("lines.json"), "jsonl");
  EXPECT_EQ(fmt("a.jsonl"), "jsonl");
  EXPECT_EQ(fmt("a.jsonl.gz"), "jsonl+gz");
  EXPECT_EQ(fmt("noext"), "jsonl+gz");
  EXPECT_EQ(fmt("array_row.jsonl"), "jsonl");

  // A .json file that is neither an array nor JSON Lines is an error naming it.
  write_file_atomic(dir / "pretty.json", "{\n  \"data\": [\n    {\"a\": 1}\n  ]\n}\n");
  write_file_atomic(dir / "number.json", "42\n");
  write_file_atomic(dir / "blank.json", " \n\n");
  std::string msg = error_of([&] { detect_data_file(dir / "pretty.json"); });
  EXPECT_NE(msg.find(dir / "pretty.json" + ": not a JSON array of rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("starts with '{' and its first line is not a complete JSON value"), std::string::npos) << msg;
  msg = error_of([&] { detect_data_file(dir / "number.json"); });
  EXPECT_NE(msg.find("its first line is a JSON number"), std::string::npos) << msg;
  msg = error_of([&] { detect_data_file(dir / "blank.json"); });
  EXPECT_NE(msg.find(dir / "blank.json" + ": the file is empty"), std::string::npos) << msg;
  EXPECT_THROW(RowReader(dir / "pretty.json"), Error);

  auto rows = [&](const std::string& name) {
    std::vector<std::tuple<int64_t, int64_t, std::string>> v;
    RowReader r(dir / name);
    RowReader::Row row;
    while (r.next(&row)) v.emplace_back(row.line, row.index, std::string(row.text));
    return v;
  };
  using R = std::vector<std::tuple<int64_t, int64_t, std::string>>;
  EXPECT_EQ(rows("a.json.gz"), (R{{1, 0, "{\"a\": 1}"}, {2, 1, "{\"a\": 2}"}}));
  EXPECT_EQ(rows("a.jsonl"), (R{{1, -1, "{\"a\": 1}"}, {2, -1, "{\"a\": 2}"}}));
  EXPECT_EQ(rows("lines.json"), (R{{1, -1, ""}, {2, -1, "{\"a\": 1}"}, {3, -1, "{\"a\": 2}"}}));
  EXPECT_EQ(RowReader(dir / "A.JSON").info().format, DataFormat::JsonArray);
}

TEST(Jsonl, RowErrorSaysColumnOfLine) {
  auto what = [](const std::string& text) -> std::string {
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      ADD_FAILURE() << "parsed: " << j.dump();
    } catch (const nlohmann::json::exception& e) {
      return json_row_error(e, 3);
    }
    return "";
  };
  const std::string row = R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant" "content": "x"}]})";
  const std::string m = what(row);
  EXPECT_EQ(m.rfind("parse error at column 79 of line 3: syntax error", 0), 0u) << m;
  // without a line number: the column alone; a message without a position: only the tag dropped
  try {
    const nlohmann::json j = nlohmann::json::parse(row);
    ADD_FAILURE() << "parsed: " << j.dump();
  } catch (const nlohmann::json::exception& e) {
    EXPECT_EQ(json_row_error(e, 0).rfind("parse error at column 79: ", 0), 0u) << json_row_error(e, 0);
  }
  const std::runtime_error plain("[json.exception.type_error.302] type must be string");
  EXPECT_EQ(json_row_error(plain, 3), "type must be string");
}
