// tests/io/tokenizer_tiktoken.cpp
// Tests of the tiktoken tokenizer directory (io/tokenizer/tiktoken_model.*: Kimi-K2 / K2.5): ids equal to those of
// tools/ref_tiktoken.py (plain Python over the `regex` module, itself checked against tiktoken's Rust core through
// the npm `tiktoken` WASM build on the same texts) for a small fixture (tests/data/tiktoken: an 862-token
// tiktoken.model learned by ref_tiktoken.py without the split, so that a wrong split changes the ids; Kimi-K2's
// special-token layout; stand-ins for tokenization_kimi.py with K2's and K2.5's pat_str), decoding, Kimi's chunking
// of long runs, the split of the real Kimi patterns on tricky text against splits derived by hand from the regex,
// the Rust-to-PCRE2 regex translation, and load errors naming the file and line. With DFLASH_KIMI_TOKENIZER set to
// a Kimi-K2 directory (tiktoken.model, tokenization_kimi.py, tokenizer_config.json; not in the repository), a few
// ids of the real vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "io/tokenizer/tiktoken_model.h"
#include "io/tokenizer/util.h"
#include "common/test_util.h"

using namespace dflash;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kData = std::string(DFLASH_SOURCE_DIR) + "/tests/data/tiktoken";

fs::path temp_dir() {
  static test::TmpDir d("tiktoken");
  return d.path;
}

// A tokenizer directory: the fixture's tiktoken.model and tokenizer_config.json, `py` as tokenization_kimi.py.
std::string fixture_dir(const std::string& name, const std::string& py) {
  fs::path d = temp_dir() / name;
  fs::create_directories(d);
  fs::copy_file(kData + "/tiktoken.model", d / "tiktoken.model", fs::copy_options::overwrite_existing);
  fs::copy_file(kData + "/tokenizer_config.json", d / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  fs::copy_file(kData + "/" + py, d / "tokenization_kimi.py", fs::copy_options::overwrite_existing);
  return d.string();
}

std::string text_of(const json& t) {
  if (t.is_string()) return t.get<std::string>();
  std::string s;
  for (int i = 0; i < t["times"].get<int>(); ++i) s += t["repeat"].get<std::string>();
  return s + t["then"].get<std::string>();
}

std::vector<int32_t> ids_of(const json& a) {
  std::vector<int32_t> v;
  for (const json& x : a) {
    if (x.is_array()) {
      v.insert(v.end(), x[1].get<size_t>(), x[0].get<int32_t>());
    } else {
      v.push_back(x.get<int32_t>());
    }
  }
  return v;
}

// The pieces of `s` under a pat_str, as the tokenizer's Split runs it (PCRE2 after the translation).
std::vector<std::string> split(const std::string& pat_str, const std::string& s) {
  tok::Regex re(tok::rust_regex_to_pcre2(pat_str, "test"), "test");
  std::vector<std::string> out;
  size_t pos = 0, ms = 0, me = 0;
  while (pos < s.size() && re.find(s, pos, tok::thread_state(), ms, me) && me > ms) {
    EXPECT_EQ(ms, pos) << "text between pieces in \"" << s << "\"";
    out.push_back(s.substr(ms, me - ms));
    pos = me;
  }
  EXPECT_EQ(pos, s.size()) << s;
  return out;
}

// pat_str of the fixture's stand-ins, read as the loader reads it.
std::string pat_of(const std::string& py) {
  return tok::TiktokenModel::load(fixture_dir("pat_" + py, py), nullptr).pat_str;
}

void expect_load_error(const std::string& dir, const std::vector<std::string>& needles) {
  try {
    Tokenizer::load(dir);
    ADD_FAILURE() << dir << ": expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "wanted \"" << n << "\" in: " << msg;
  }
}

}  // namespace

TEST(TokenizerTiktoken, MatchesReferenceIds) {
  const json want = json::parse(read_file(kData + "/expected.json"));
  const json& texts = want["texts"];
  for (const auto& [variant, py, nspecial] :
       {std::tuple{"kimi-k2", "tokenization_kimi_k2.py", 258}, {"kimi-k2.5", "tokenization_kimi_k25.py", 256}}) {
    auto t = Tokenizer::load(fixture_dir(variant, py));
    EXPECT_EQ(t->vocab_size(), 862 + nspecial) << variant;
    const json& ids = want["ids"][variant];
    ASSERT_EQ(ids.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = text_of(texts[i]);
      const std::vector<int32_t> got = t->encode(text);
      EXPECT_EQ(got, ids_of(ids[i])) << variant << " text " << i << ": \"" << text.substr(0, 60) << "\"";
      EXPECT_EQ(t->decode(got), text) << variant << " text " << i;
    }
  }
}

TEST(TokenizerTiktoken, SpecialTokens) {
  auto t = Tokenizer::load(fixture_dir("specials", "tokenization_kimi_k2.py"));
  const int32_t n = 862;
  EXPECT_EQ(t->bos_id(), n);           // [BOS]
  EXPECT_EQ(t->eos_id(), n + 1);       // [EOS]
  EXPECT_EQ(t->pad_id(), n + 255);     // [PAD]
  EXPECT_EQ(t->token_to_id("<|im_end|>"), n + 2);
  EXPECT_EQ(t->token_to_id("<|reserved_token_867|>"), n + 5);  // no added_tokens_decoder entry: reserved name
  EXPECT_EQ(t->token_to_id("<|reserved_token_1119|>"), n + 257);  // the last of 256 + 2
  EXPECT_EQ(t->id_to_token(n + 6), "<|reserved_token_868|>");
  EXPECT_TRUE(t->is_special(n + 2));
  EXPECT_TRUE(t->is_special(n + 6));
  EXPECT_FALSE(t->is_special(n + 11));  // <|tool_calls_section_begin|>: "special": false in the config
  EXPECT_FALSE(t->is_special(100));
  // Without parse_special, special tokens are text; a non-special added token still matches.
  const std::vector<int32_t> a = t->encode("<|im_end|><|tool_call_begin|>", false);
  EXPECT_GT(a.size(), 2u);
  EXPECT_EQ(a.back(), n + 13);
  EXPECT_EQ(t->decode(a), "<|im_end|><|tool_call_begin|>");
  EXPECT_EQ(t->decode(t->encode("x[EOS]y"), /*skip_special=*/true), "xy");
  // Vocabulary tokens are written in the GPT-2 byte alphabet, as Hugging Face shows them; token_bytes is raw.
  const int32_t space = t->encode(" ")[0];
  EXPECT_EQ(t->id_to_token(space), "\xC4\xA0");  // "Ġ"
  EXPECT_EQ(t->token_bytes(space), " ");
  EXPECT_EQ(t->token_to_id("\xC4\xA0"), space);
  EXPECT_EQ(t->hash().size(), 64u);
  auto k25 = Tokenizer::load(fixture_dir("specials25", "tokenization_kimi_k25.py"));
  EXPECT_NE(k25->hash(), t->hash());  // the pattern and the special count are part of the identity
}

// The real patterns on tricky text; the expected pieces are derived by hand from the regex (and agree with
// ref_tiktoken.py and tiktoken).
TEST(TokenizerTiktoken, KimiPatternSplits) {
  const std::string k2 = pat_of("tokenization_kimi_k2.py"), k25 = pat_of("tokenization_kimi_k25.py");
  using V = std::vector<std::string>;
  // Han runs; CJK punctuation is Script=Common (not Han, though its Script_Extensions has Han).
  EXPECT_EQ(split(k2, "你好。、世界"), (V{"你好", "。、", "世界"}));
  EXPECT_EQ(split(k2, "你好，世界！"), (V{"你好", "，", "世界", "！"}));
  // K2: letter runs exclude Han; K2.5: they take it (Han is Lo) once a run has started.
  EXPECT_EQ(split(k2, "abc汉字def"), (V{"abc", "汉字", "def"}));
  EXPECT_EQ(split(k25, "abc汉字def"), (V{"abc汉字def"}));
  EXPECT_EQ(split(k2, "ABC汉DEF"), (V{"ABC", "汉", "DEF"}));
  EXPECT_EQ(split(k2, "汉字abc"), (V{"汉字", "abc"}));
  EXPECT_EQ(split(k25, "汉字abc"), (V{"汉字", "abc"}));
  // 々 (Lm) 〇 (Nl) 〻 (Lm) are Script=Han; " 日々": K2 has no branch for a space before Han, K2.5's letter branch.
  EXPECT_EQ(split(k2, "々〇〻 日々"), (V{"々〇〻", " ", "日々"}));
  EXPECT_EQ(split(k25, "々〇〻 日々"), (V{"々〇〻", " 日々"}));
  EXPECT_EQ(split(k2, "こんにちは世界"), (V{"こんにちは", "世界"}));  // kana are Lo, not Han
  // Contractions stay with their word, case-insensitively; ſ folds to s (Rust's simple case folding).
  EXPECT_EQ(split(k2, "don't we're I'LL"), (V{"don't", " we're", " I'LL"}));
  EXPECT_EQ(split(k2, "Straße'S x'ſ"), (V{"Straße'S", " x'ſ"}));
  EXPECT_EQ(split(k2, "HELLOWorld"), (V{"HELLOWorld"}));
  EXPECT_EQ(split(k2, "'s"), (V{"'s"}));  // an apostrophe alone is the optional prefix of a letter run
  // Digits in threes (\p{N}: any script); punctuation with one leading space and trailing newlines.
  EXPECT_EQ(split(k2, "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(split(k2, "x١٢٣٤"), (V{"x", "١٢٣", "٤"}));
  EXPECT_EQ(split(k2, "a, ...\n\nb"), (V{"a", ",", " ...\n\n", "b"}));
  // Whitespace: a run before a word leaves its last space to the word; newlines end a run.
  EXPECT_EQ(split(k2, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split(k2, "x  \n  y"), (V{"x", "  \n", " ", " y"}));
  EXPECT_EQ(split(k2, "\n\n\n"), (V{"\n\n\n"}));
  EXPECT_EQ(split(k2, "line\r\n\r\nnext"), (V{"line", "\r\n\r\n", "next"}));
  EXPECT_EQ(split(k2, "end   "), (V{"end", "   "}));
  EXPECT_EQ(split(k2, "a\u00A0b\u3000c"), (V{"a", "\u00A0b", "\u3000c"}));  // no-break and ideographic spaces
  // U+001C is not White_Space: the optional prefix of a letter run.
  EXPECT_EQ(split(k2, "a\x1c" "b"), (V{"a", "\x1c" "b"}));
  // Combining marks are letters of a run (\p{M}).
  EXPECT_EQ(split(k2, "e\u0301\u0327x"), (V{"e\u0301\u0327x"}));
  EXPECT_EQ(split(k2, "\u0301\u0301x"), (V{"\u0301\u0301x"}));
}

TEST(TokenizerTiktoken, RegexTranslation) {
  EXPECT_EQ(tok::rust_regex_to_pcre2(R"([\p{Han}]+)", "t"), R"([\p{sc:Han}]+)");
  EXPECT_EQ(tok::rust_regex_to_pcre2(R"(\p{Script=Latin}\p{scx=Han}\p{gc=Lu}\pL\p{N})", "t"),
            R"(\p{sc:Latin}\p{scx:Han}\p{Lu}\pL\p{N})");
  EXPECT_EQ(tok::rust_regex_to_pcre2(R"([\p{Lu}\p{M}&&[^\p{Han}]]*)", "t"), R"((?:(?=[^\p{sc:Han}])[\p{Lu}\p{M}])*)");
  EXPECT_EQ(tok::rust_regex_to_pcre2(R"([a[bc]\]])", "t"), R"([abc\]])");
  EXPECT_EQ(tok::rust_regex_to_pcre2(R"([^\s\p{L}]+[\r\n]*)", "t"), R"([^\s\p{L}]+[\r\n]*)");
  EXPECT_THROW(tok::rust_regex_to_pcre2(R"([a-z--[aeiou]])", "t"), Error);
  EXPECT_THROW(tok::rust_regex_to_pcre2(R"([^a&&b])", "t"), Error);
  EXPECT_THROW(tok::rust_regex_to_pcre2(R"([a[^b]])", "t"), Error);
  EXPECT_THROW(tok::rust_regex_to_pcre2(R"([abc)", "t"), Error);
}

TEST(TokenizerTiktoken, KimiChunks) {
  auto chunks = [](const std::string& s) {
    std::vector<size_t> sizes;
    tok::kimi_chunks(s, [&](std::string_view p) { sizes.push_back(p.size()); });
    return sizes;
  };
  EXPECT_EQ(chunks(""), std::vector<size_t>{});
  EXPECT_EQ(chunks("ab cd"), std::vector<size_t>{5});
  EXPECT_EQ(chunks(std::string(25000, 'a')), std::vector<size_t>{25000});
  EXPECT_EQ(chunks(std::string(25001, 'a')), (std::vector<size_t>{25000, 1}));
  // characters, not bytes: 25,001 three-byte characters
  std::string han;
  for (int i = 0; i < 25001; ++i) han += "汉";
  EXPECT_EQ(chunks(han), (std::vector<size_t>{75000, 3}));
  // a run ends at a change of kind; U+001C counts as space (Python str.isspace)
  EXPECT_EQ(chunks(std::string(20000, 'a') + std::string(20000, '\x1c') + std::string(20000, 'a')),
            std::vector<size_t>{60000});
  EXPECT_EQ(chunks(" " + std::string(50001, 'a')), (std::vector<size_t>{25001, 25000, 1}));
  // 400,000-character slices first
  std::string mixed;
  for (int i = 0; i < 210000; ++i) mixed += "a ";
  EXPECT_EQ(chunks(mixed), (std::vector<size_t>{400000, 20000}));
}

TEST(TokenizerTiktoken, LoadErrorsNameFileAndLine) {
  const std::string good = read_file(kData + "/tiktoken.model");
  auto with_model = [&](const std::string& name, const std::string& model) {
    const std::string d = fixture_dir(name, "tokenization_kimi_k2.py");
    write_file_atomic(d + "/tiktoken.model", model);
    return d;
  };
  expect_load_error(with_model("bad_b64", "IQ== 0\n!!!! 1\n"), {"tiktoken.model:2", "base64"});
  expect_load_error(with_model("bad_rank", "IQ== 0\nIg== x\n"), {"tiktoken.model:2", "rank"});
  expect_load_error(with_model("bad_fields", "IQ==\n"), {"tiktoken.model:1", "<base64 token> <rank>"});
  expect_load_error(with_model("dup_rank", "IQ== 0\nIg== 0\n"), {"tiktoken.model:2", "rank 0"});
  expect_load_error(with_model("dup_token", "IQ== 0\nIQ== 1\n"), {"tiktoken.model:2", "line 1"});
  expect_load_error(with_model("gap", "IQ== 0\nIg== 2\n"), {"tiktoken.model", "rank 1"});
  expect_load_error(with_model("no_byte", "IQ== 0\n"), {"tiktoken.model", "single byte 0"});
  {
    const std::string d = fixture_dir("no_py", "tokenization_kimi_k2.py");
    fs::remove(d + "/tokenization_kimi.py");
    expect_load_error(d, {"tokenization_kimi.py"});
  }
  {
    const std::string d = fixture_dir("py_no_pat", "tokenization_kimi_k2.py");
    write_file_atomic(d + "/tokenization_kimi.py", "num_reserved_special_tokens = 256\n");
    expect_load_error(d, {"tokenization_kimi.py", "pat_str"});
  }
  {
    const std::string d = fixture_dir("py_bad_re", "tokenization_kimi_k2.py");
    std::string py = read_file(kData + "/tokenization_kimi_k2.py");
    py.replace(py.find(R"(r"""\s+""",)"), 10, R"(r"""(\s+""",)");
    write_file_atomic(d + "/tokenization_kimi.py", py);
    expect_load_error(d, {"tokenization_kimi.py", "pat_str"});
  }
  {
    const std::string d = fixture_dir("cfg_id", "tokenization_kimi_k2.py");
    json c = json::parse(read_file(d + "/tokenizer_config.json"));
    c["added_tokens_decoder"]["5"] = {{"content", "<x>"}, {"special", true}};
    write_file_atomic(d + "/tokenizer_config.json", c.dump());
    expect_load_error(d, {"tokenizer_config.json", "added_tokens_decoder[\"5\"]", "862"});
  }
  {
    const std::string d = (temp_dir() / "empty").string();
    fs::create_directories(d);
    expect_load_error(d, {"tokenizer.json", "tiktoken.model"});
  }
  // the file itself names the directory
  auto t = Tokenizer::load(fixture_dir("by_file", "tokenization_kimi_k2.py") + "/tiktoken.model");
  EXPECT_EQ(t->vocab_size(), 862 + 258);
}

// Kimi-K2-Thinking's chat template (tests/data/templates) over the fixture tokenizer: the rendering is one string
// whose special markers become their ids, decoding gives it back, and only the assistant's turn is supervised.
TEST(TokenizerTiktoken, KimiChatTemplateEncodes) {
  const std::string dir = fixture_dir("chat", "tokenization_kimi_k2.py");
  fs::copy_file(std::string(DFLASH_SOURCE_DIR) + "/tests/data/templates/Kimi-K2-Thinking.jinja",
                fs::path(dir) / "chat_template.jinja", fs::copy_options::overwrite_existing);
  auto tok = Tokenizer::load(dir);
  ASSERT_FALSE(tok->chat_template().empty());
  ChatEncoder enc(tok, ChatTemplate::load(*tok, "auto"));
  const auto ms = parse_messages(nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "你好，世界! don't"}, {"role": "assistant", "content": "Hello 汉字 1234.",
          "reasoning_content": "think  about it"}])"));
  const RenderedChat r = enc.render(ms, ChatOptions{});
  const ChatEncoding e = enc.encode_rendered(r);
  EXPECT_EQ(tok->decode(e.ids), r.text);
  const int32_t n = 862;
  for (int32_t id : {n + 9, n + 17, n + 3, n + 4, n + 2})  // <|im_system|> <|im_middle|> <|im_user|> <|im_assistant|> <|im_end|>
    EXPECT_NE(std::find(e.ids.begin(), e.ids.end(), id), e.ids.end()) << id;
  std::string supervised;
  for (size_t i = 0; i < e.ids.size(); ++i)
    if (e.loss_mask[i]) supervised += tok->token_bytes(e.ids[i]);
  EXPECT_NE(supervised.find("Hello 汉字 1234."), std::string::npos) << supervised;
  EXPECT_EQ(supervised.find("你好"), std::string::npos) << supervised;
  EXPECT_EQ(supervised.substr(supervised.size() - 10), "<|im_end|>") << supervised;
}

// The real Kimi-K2 vocabulary, where a copy is at hand (DFLASH_KIMI_TOKENIZER): ids as published with tiktoken.
TEST(TokenizerTiktoken, RealKimiK2IfPresent) {
  const char* dir = std::getenv("DFLASH_KIMI_TOKENIZER");
  if (!dir || !*dir) GTEST_SKIP() << "DFLASH_KIMI_TOKENIZER is not set (a Kimi-K2 tokenizer directory)";
  auto t = Tokenizer::load(dir);
  EXPECT_EQ(t->encode("Hello world"), (std::vector<int32_t>{19180, 2695}));
  EXPECT_EQ(t->encode("Hello, world!"), (std::vector<int32_t>{19180, 11, 2695, 0}));
  EXPECT_EQ(t->encode("你好世界"), (std::vector<int32_t>{33845, 2243}));
  EXPECT_EQ(t->encode("1234567890"), (std::vector<int32_t>{6694, 12972, 16242, 15}));
  EXPECT_EQ(t->encode("Hello, how are you?"), (std::vector<int32_t>{19180, 11, 1632, 554, 398, 30}));
  EXPECT_EQ(t->encode("don't we're I'll it's can't"), (std::vector<int32_t>{88709, 13810, 17916, 4643, 8971}));
  EXPECT_EQ(t->encode("Hi<|im_end|>"), (std::vector<int32_t>{18699, 163586}));
  EXPECT_EQ(t->token_to_id("[BOS]"), 163584);
  EXPECT_EQ(t->token_to_id("<|im_middle|>"), 163601);
}
