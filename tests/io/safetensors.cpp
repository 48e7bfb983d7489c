// tests/io/safetensors.cpp
// Tests of io/safetensors: round trips of every dtype, the byte layout, sharded stores, every malformed-file
// case of C15 (the error names the file and the field), truncation robustness, and `dflash info`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "io/safetensors.h"

using namespace dflash;
namespace fs = std::filesystem;

namespace {

// A fresh directory under /tmp, unique to this process and test, removed afterwards.
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
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A safetensors file from a header string and data bytes, exactly as given (for malformed inputs).
void write_raw(const std::string& path, const std::string& header, const std::string& data, int64_t n = -1) {
  const uint64_t len = n >= 0 ? static_cast<uint64_t>(n) : header.size();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(len >> (8 * i));
  write_file_atomic(path, bytes + header + data);
}

// Expects open(path) to throw an Error whose message contains the file name and every part.
void expect_open_error(const std::string& path, std::initializer_list<std::string> parts) {
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fs::path(path).filename().string()), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-dflash exception: " << e.what();
  }
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

Tensor raw_tensor(DType dt, Shape s, const void* bytes) {
  Tensor t = cpu_empty(dt, std::move(s));
  if (t.nbytes()) std::memcpy(t.data, bytes, t.nbytes());
  return t;
}

const std::string kOneF32 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

}  // namespace

TEST(Safetensors, RoundTripEveryDtypeAndShape) {
  TempDir dir;
  const float f32v[] = {1.5f, -2.25f, 3.0e-8f, 65504.0f, -0.0f, 7.0f};
  const uint16_t bf16v[] = {f32_to_bf16(1.0f), f32_to_bf16(-3.5f), f32_to_bf16(1e20f), 0x7f80};
  const uint16_t f16v[] = {0x3c00, 0xc000, 0x3555};
  const int32_t i32v[] = {-7, 0, 2147483647};
  const int64_t i64v[] = {-1, 1LL << 40};
  const uint8_t u8v[] = {0, 1, 255, 128, 7};
  const uint8_t boolv[] = {1, 0, 1};
  const float scalar = 42.5f;
  const double f64v[] = {1.0 / 3.0, -1e300};
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"model.layers.0.w", raw_tensor(DType::F32, {2, 3}, f32v)},
      {"bf", raw_tensor(DType::BF16, {4}, bf16v)},
      {"half", raw_tensor(DType::F16, {3, 1}, f16v)},
      {"ints", raw_tensor(DType::I32, {3}, i32v)},
      {"longs", raw_tensor(DType::I64, {1, 2}, i64v)},
      {"bytes", raw_tensor(DType::U8, {5}, u8v)},
      {"mask", raw_tensor(DType::Bool, {3}, boolv)},
      {"scalar", raw_tensor(DType::F32, {}, &scalar)},
      {"doubles", raw_tensor(DType::F64, {2}, f64v)},
      {"empty", cpu_empty(DType::BF16, {0, 4})},
      {"z.after_empty", raw_tensor(DType::F32, {1}, &scalar)},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"dflash.note", "ünïcode ok"}};
  const std::string path = dir / "rt.safetensors";
  write_safetensors(path, ts, meta);

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), ts.size());
  size_t expect_begin = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorInfo& info = f->tensors()[i];
    EXPECT_EQ(info.name, ts[i].first);  // header order = write order
    EXPECT_EQ(info.dtype, ts[i].second.dtype) << info.name;
    EXPECT_EQ(info.shape, ts[i].second.shape) << info.name;
    EXPECT_EQ(info.begin, expect_begin) << info.name;  // back to back, as the reference reader requires
    EXPECT_EQ(info.end - info.begin, ts[i].second.nbytes()) << info.name;
    expect_begin = info.end;
    Tensor v = f->view(info.name);
    EXPECT_EQ(v.shape, ts[i].second.shape);
    EXPECT_EQ(v.numel(), ts[i].second.numel());
    if (v.nbytes()) {
      EXPECT_EQ(std::memcmp(v.data, ts[i].second.data, v.nbytes()), 0) << info.name;
    }
  }
  EXPECT_EQ(f->view("scalar").ndim(), 0);
  EXPECT_EQ(f->view("scalar").ptr<float>()[0], 42.5f);
  EXPECT_EQ(f->view("empty").numel(), 0);
  EXPECT_EQ(f->view("longs").ptr<int64_t>()[1], 1LL << 40);
  EXPECT_EQ(f->find("nope"), nullptr);
  // The data section starts 8-byte aligned and the file ends exactly at the last tensor.
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + expect_begin);
}

TEST(Safetensors, ByteLayoutOfOneTensor) {
  TempDir dir;
  const std::string path = dir / "one.safetensors";
  write_safetensors(path, {{"w", cpu_tensor({1.0f, 2.0f}, {2})}});
  const std::string b = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(b[i]);
  ASSERT_EQ(b.size(), 8 + n + 8);
  auto h = nlohmann::json::parse(b.substr(8, n));  // trailing spaces are padding
  EXPECT_EQ(h["w"]["dtype"], "F32");
  EXPECT_EQ(h["w"]["shape"], nlohmann::json::array({2}));
  EXPECT_EQ(h["w"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_FALSE(h.contains("__metadata__"));
  const unsigned char data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40};  // 1.0f, 2.0f little-endian
  EXPECT_EQ(std::memcmp(b.data() + 8 + n, data, 8), 0);
  // Zero copy: the view points into the mapping and keeps it alive after the file object is gone.
  Tensor v;
  {
    auto f = SafetensorsFile::open(path);
    v = f->view("w");
  }
  EXPECT_EQ(v.ptr<float>()[1], 2.0f);
}

TEST(Safetensors, ReadsHandWrittenFileAndConvertsToF32) {
  // As the reference writer lays it out: __metadata__ first, header padded with spaces, BF16 before F16.
  TempDir dir;
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("h":{"dtype":"F16","shape":[3],"data_offsets":[8,14]},)"
      R"("i":{"dtype":"I32","shape":[1],"data_offsets":[16,20]}})";
  std::string padded = header;
  while ((8 + padded.size()) % 8) padded += ' ';
  const unsigned char data[20] = {0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40, 0x00, 0x00,   // bf16 1, -2, 3.140625, 0
                                  0x00, 0x3c, 0x55, 0x35, 0x00, 0xfc, 0, 0,         // f16 1, 0.33325, -inf, gap
                                  0x05, 0x00, 0x00, 0x00};                          // i32 5
  const std::string path = dir / "hand.safetensors";
  write_raw(path, padded, std::string(reinterpret_cast<const char*>(data), sizeof data));

  WeightStore ws = WeightStore::open(path);
  EXPECT_EQ(ws.names(), (std::vector<std::string>{"b", "h", "i"}));
  Tensor b = ws.f32("b", {2, 2});
  EXPECT_EQ(b.dtype, DType::F32);
  EXPECT_EQ(to_f32_vector(b), (std::vector<float>{1.0f, -2.0f, 3.140625f, 0.0f}));
  std::vector<float> h = to_f32_vector(ws.f32("h"));
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], 0.333251953125f);
  EXPECT_EQ(h[2], -INFINITY);
  EXPECT_EQ(ws.view("i").ptr<int32_t>()[0], 5);
  EXPECT_EQ(ws.info("h").dtype, DType::F16);

  std::string msg = error_of([&] { ws.f32("b", {4}); });
  EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 2]"), std::string::npos) << msg;
  msg = error_of([&] { ws.f32("i"); });
  EXPECT_NE(msg.find("'i'"), std::string::npos) << msg;
  msg = error_of([&] { ws.view("model.norm.weight"); });
  EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hand.safetensors"), std::string::npos) << msg;
  msg = error_of([&] { ws.info("lm_head.weight"); });
  EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
  EXPECT_FALSE(ws.has("lm_head.weight"));
}

TEST(Safetensors, MisalignedRangeIsCopied) {
  TempDir dir;
  // Header of 13 bytes: the data section starts at offset 21, so the F32 tensor is not 4-byte aligned.
  const std::string header = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string h = header;
  while ((8 + h.size()) % 4 != 1) h += ' ';
  const float v = 3.25f;
  const std::string path = dir / "mis.safetensors";
  write_raw(path, h, std::string(reinterpret_cast<const char*>(&v), 4));
  Tensor t = SafetensorsFile::open(path)->view("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4, 0u);
  EXPECT_EQ(t.ptr<float>()[0], 3.25f);
}

TEST(Safetensors, BadFilesNameFileAndField) {
  TempDir dir;
  const std::string d8(8, '\0');
  auto bad = [&](const std::string& name, const std::string& header, const std::string& data,
                 std::initializer_list<std::string> parts, int64_t n = -1) {
    const std::string p = dir / (name + ".safetensors");
    write_raw(p, header, data, n);
    SCOPED_TRACE(name);
    expect_open_error(p, parts);
  };
  {
    const std::string p = dir / "tiny.safetensors";
    write_file_atomic(p, "abc");
    expect_open_error(p, {"header length"});
  }
  bad("len_past_end", kOneF32, d8, {"header length", "past the end"}, 1000);
  bad("len_huge", kOneF32, d8, {"header length"}, int64_t{1} << 62);
  bad("not_json", R"({"a": {"dtype": "F32", )", d8, {"header", "invalid JSON"});
  bad("not_object", R"([1, 2, 3])", d8, {"header", "object"});
  bad("entry_not_object", R"({"a": 5})", d8, {"'a'", "entry"});
  bad("unknown_dtype", R"({"a":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,8]}})", d8, {"'a'", "dtype", "Q4_K"});
  bad("unsupported_dtype", R"({"a":{"dtype":"F8_E5M2","shape":[8],"data_offsets":[0,8]}})", d8, {"dtype", "F8_E5M2"});
  bad("dtype_not_string", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", d8, {"'a'", "dtype"});
  bad("missing_dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8, {"'a'", "dtype", "missing"});
  bad("shape_negative", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8, {"'a'", "shape"});
  bad("shape_float", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", d8, {"'a'", "shape"});
  bad("shape_string", R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", d8, {"'a'", "shape"});
  bad("shape_huge", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8,
      {"'a'", "shape"});
  bad("offsets_three", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", d8, {"'a'", "data_offsets"});
  bad("offsets_reversed", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8, {"'a'", "data_offsets"});
  bad("offsets_negative", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", d8, {"'a'", "data_offsets"});
  bad("offsets_missing", R"({"a":{"dtype":"F32","shape":[2]}})", d8, {"'a'", "data_offsets"});
  bad("size_mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(12, '\0'),
      {"'a'", "data_offsets", "needs 12"});
  bad("past_end", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", d8,
      {"'a'", "data_offsets", "past the end"});
  bad("overlap",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      d8, {"'b'", "'a'", "overlaps", "data_offsets"});
  bad("duplicate",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      d8, {"'a'", "duplicate"});
  bad("meta_not_string", R"({"__metadata__":{"format":3},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8,
      {"__metadata__", "format"});
  bad("meta_not_object", R"({"__metadata__":[1],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8,
      {"__metadata__"});
  bad("bad_utf8", std::string(R"({"a)") + "\xff" + R"(":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8,
      {"header", "invalid JSON"});
  // Empty tensors may sit anywhere inside the data, even inside another tensor's range.
  const std::string ok = dir / "empty_inside.safetensors";
  write_raw(ok,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            d8);
  EXPECT_EQ(SafetensorsFile::open(ok)->tensors().size(), 2u);
  // A missing file names the path.
  std::string msg = error_of([&] { SafetensorsFile::open(dir / "absent.safetensors"); });
  EXPECT_NE(msg.find("absent.safetensors"), std::string::npos) << msg;
}

TEST(Safetensors, TruncatedAndCorruptedFilesNeverCrash) {
  TempDir dir;
  const std::string good = dir / "good.safetensors";
  write_safetensors(good, {{"a", cpu_tensor({1, 2, 3}, {3})}, {"b", cpu_tensor({4, 5}, {1, 2})}}, {{"k", "v"}});
  const std::string bytes = read_file(good);
  const std::string p = dir / "cut.safetensors";
  int opened = 0;
  for (size_t len = 0; len < bytes.size(); ++len) {  // every truncation: an Error, never a crash
    write_file_atomic(p, bytes.substr(0, len));
    EXPECT_THROW(SafetensorsFile::open(p), Error) << len;
  }
  for (size_t i = 8; i < bytes.size(); ++i) {  // every single-byte corruption: opens or an Error
    std::string c = bytes;
    c[i] = static_cast<char>(c[i] ^ 0x5a);
    write_file_atomic(p, c);
    try {
      auto f = SafetensorsFile::open(p);
      for (const auto& t : f->tensors()) f->view(t.name);
      ++opened;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(opened, 0);  // flips in the tensor data are fine
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  const std::string p = dir / "w.safetensors";
  Tensor a = cpu_tensor({1}, {1});
  EXPECT_NE(error_of([&] { write_safetensors(p, {{"a", a}, {"a", a}}); }).find("'a'"), std::string::npos);
  EXPECT_THROW(write_safetensors(p, {{"__metadata__", a}}), Error);
  EXPECT_THROW(write_safetensors(p, {{"", a}}), Error);
  Tensor dev = a;
  dev.device = Device::CUDA;
  EXPECT_NE(error_of([&] { write_safetensors(p, {{"d", dev}}); }).find("cuda"), std::string::npos);
  EXPECT_FALSE(file_exists(p));
  // A failed write leaves an existing file as it was.
  write_safetensors(p, {{"a", a}});
  EXPECT_THROW(write_safetensors(p, {{"x", a}, {"x", a}}), Error);
  EXPECT_TRUE(SafetensorsFile::open(p)->find("a") != nullptr);
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(Safetensors, WeightStoreShardedIndex) {
  TempDir dir;
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {{"model.embed_tokens.weight", cpu_to_bf16(cpu_tensor({1, 2, 3, 4, 5, 6}, {3, 2}))},
                     {"model.layers.0.input_layernorm.weight", cpu_tensor({1, 1}, {2})}});
  write_safetensors(dir / "model-00002-of-00002.safetensors",
                    {{"model.norm.weight", cpu_tensor({0.5f, 0.25f}, {2})},
                     {"lm_head.weight", cpu_to_bf16(cpu_tensor({-1, -2, -3, -4, -5, -6}, {3, 2}))}});
  const std::string index = R"({"metadata": {"total_size": 40}, "weight_map": {
    "lm_head.weight": "model-00002-of-00002.safetensors",
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.layers.0.input_layernorm.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors"}})";
  write_file_atomic(dir / "model.safetensors.index.json", index);

  WeightStore ws = WeightStore::open(dir.path());
  EXPECT_EQ(ws.source(), dir.path());
  EXPECT_EQ(ws.names().size(), 4u);
  EXPECT_TRUE(ws.has("model.norm.weight"));
  EXPECT_EQ(to_f32_vector(ws.f32("model.embed_tokens.weight", {3, 2}))[5], 6.0f);
  EXPECT_EQ(to_f32_vector(ws.f32("lm_head.weight", {3, 2}))[0], -1.0f);
  EXPECT_EQ(to_f32_vector(ws.f32("model.norm.weight"))[1], 0.25f);
  EXPECT_EQ(ws.view("lm_head.weight").dtype, DType::BF16);
  std::string msg = error_of([&] { ws.info("model.layers.1.mlp.up_proj.weight"); });
  EXPECT_NE(msg.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.path()), std::string::npos) << msg;

  // index.json naming a missing shard
  write_file_atomic(dir / "model.safetensors.index.json",
                    R"({"weight_map": {"x": "model-00003-of-00003.safetensors"}})");
  msg = error_of([&] { WeightStore::open(dir.path()); });
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model-00003-of-00003.safetensors"), std::string::npos) << msg;
  // index.json naming a tensor its shard lacks
  write_file_atomic(dir / "model.safetensors.index.json",
                    R"({"weight_map": {"ghost": "model-00001-of-00002.safetensors"}})");
  msg = error_of([&] { WeightStore::open(dir.path()); });
  EXPECT_NE(msg.find("ghost"), std::string::npos) << msg;
  EXPECT_NE(msg.find("weight_map"), std::string::npos) << msg;
  // index.json that is not JSON / has no weight_map
  write_file_atomic(dir / "model.safetensors.index.json", "{\"weight_map\": ");
  msg = error_of([&] { WeightStore::open(dir.path()); });
  EXPECT_NE(msg.find("index.json"), std::string::npos) << msg;
  write_file_atomic(dir / "model.safetensors.index.json", "{}");
  msg = error_of([&] { WeightStore::open(dir.path()); });
  EXPECT_NE(msg.find("weight_map"), std::string::npos) << msg;
}

TEST(Safetensors, WeightStoreSingleFileAndDirectory) {
  TempDir dir;
  EXPECT_NE(error_of([&] { WeightStore::open(dir.path()); }).find(dir.path()), std::string::npos);
  EXPECT_THROW(WeightStore::open(dir / "missing"), Error);
  write_safetensors(dir / "model.safetensors", {{"w", cpu_tensor({1, 2}, {2})}});
  EXPECT_TRUE(WeightStore::open(dir.path()).has("w"));
  EXPECT_TRUE(WeightStore::open(dir / "model.safetensors").has("w"));
  // Bad bytes inside a store's file surface as the file's error.
  write_raw(dir / "model.safetensors", kOneF32, "", 1000);
  std::string msg = error_of([&] { WeightStore::open(dir.path()); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("header length"), std::string::npos) << msg;
}

TEST(Safetensors, InfoCommand) {
  TempDir dir;
  write_file_atomic(dir / "config.json", R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 36, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 10, "tie_word_embeddings": true})");
  write_safetensors(dir / "model.safetensors",
                    {{"model.embed_tokens.weight", cpu_to_bf16(cpu_zeros(DType::F32, {10, 8}))},
                     {"model.norm.weight", cpu_zeros(DType::F32, {8})}},
                    {{"format", "pt"}});
  auto run = [](const std::string& args) {
    std::string out;
    FILE* p = popen((std::string(DFLASH_BINARY) + " info " + args + " 2>&1").c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int rc = pclose(p);
    return std::make_pair(rc, out);
  };
  auto [rc, out] = run(dir.path() + " --json");
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["config"]["arch"], "qwen3");
  EXPECT_EQ(j["config"]["tie_word_embeddings"], true);
  EXPECT_EQ(j["config"]["default_target_layer_ids_nf5"], nlohmann::json::array({1, 9, 17, 25, 33}));
  EXPECT_EQ(j["weights"]["tensors"], 2);
  EXPECT_EQ(j["weights"]["params"], 88);
  EXPECT_EQ(j["weights"]["dtypes"]["BF16"], 1);
  std::tie(rc, out) = run(dir.path());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[1, 9, 17, 25, 33]"), std::string::npos) << out;
  std::tie(rc, out) = run(dir / "model.safetensors");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("model.embed_tokens.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("[10, 8]"), std::string::npos) << out;
  EXPECT_NE(out.find("format = pt"), std::string::npos) << out;
  std::tie(rc, out) = run(dir / "model.safetensors --json");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["tensors"][1]["shape"], nlohmann::json::array({8}));
  write_raw(dir / "model.safetensors", kOneF32, "", 1000);
  std::tie(rc, out) = run(dir.path());
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("header length"), std::string::npos) << out;
}
