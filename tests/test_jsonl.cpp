// Tests of io/jsonl: LineReader over plain and gzip files (CRLF, empty and long lines, no final newline,
// buffer boundaries, truncated gzip), read_lines, parse_json_line's error message.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
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
    // the position as the file has it (issue 12 item 8), not nlohmann's "line 1, column 15" inside the row
    EXPECT_NE(msg.find("parse error at column 15 of line 17: "), std::string::npos) << msg;
    EXPECT_EQ(msg.find("line 1,"), std::string::npos) << msg;
  }
  EXPECT_THROW(parse_json_line("", "x", 1), Error);
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
