// io/tokenizer/decoder.cpp — see decoder.h.
#include "io/tokenizer/decoder.h"

#include "io/tokenizer/util.h"

namespace dflash::tok {

namespace {

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

Decoder Decoder::load(const json& dj, const std::string& DW) {
  Decoder d;
  if (dj.is_null()) return d;
  std::vector<const json*> parts;
  if (type_of(dj, DW) == "Sequence") {
    const json& seq = field(dj, "decoders", DW);
    DFLASH_CHECK(seq.is_array(), DW, ".decoders: expected an array");
    for (const json& p : seq) parts.push_back(&p);
  } else {
    parts.push_back(&dj);
  }
  bool fused = false;
  for (size_t i = 0; i < parts.size(); ++i) {
    const json& p = *parts[i];
    const std::string SW = cat(DW, "[", i, "]");
    const std::string t = type_of(p, SW);
    DFLASH_CHECK(t == "Fuse" || t == "Strip" || d.strip_start_ + d.strip_stop_ == 0, SW, ": a ", t,
                 " step after Strip is not supported");
    if (t == "ByteLevel") {
      DFLASH_CHECK(parts.size() == 1, SW, ": ByteLevel inside a Sequence is not supported");
      d.byte_level_ = true;
    } else if (t == "Replace") {
      const json& pat = field(p, "pattern", SW);
      DFLASH_CHECK(pat.is_object() && pat.contains("String") && pat["String"].is_string() &&
                       !pat["String"].get<std::string>().empty(),
                   SW, ".pattern: only {\"String\": ...} patterns are supported, got ", pat.dump());
      const json& c = field(p, "content", SW);
      DFLASH_CHECK(c.is_string(), SW, ".content: expected a string");
      DFLASH_CHECK(!fused, SW, ": Replace after Fuse is not supported");
      d.replace_.emplace_back(pat["String"].get<std::string>(), c.get<std::string>());
    } else if (t == "ByteFallback") {
      DFLASH_CHECK(!fused, SW, ": ByteFallback after Fuse is not supported");
      d.byte_fallback_ = true;
    } else if (t == "Fuse") {
      fused = true;
    } else if (t == "Strip") {
      DFLASH_CHECK(fused, SW, ": Strip is supported after Fuse only (on the joined text)");
      const json& c = field(p, "content", SW);
      DFLASH_CHECK(c.is_string() && !c.get<std::string>().empty(), SW, ".content: expected a character");
      d.strip_content_ = c.get<std::string>();
      const json& a = field(p, "start", SW);
      const json& b = field(p, "stop", SW);
      DFLASH_CHECK(a.is_number_unsigned() && b.is_number_unsigned(), SW, ".start / .stop: expected counts");
      d.strip_start_ = a.get<size_t>();
      d.strip_stop_ = b.get<size_t>();
    } else {
      DFLASH_FAIL(SW, ": decoder type \"", t, "\" is not supported (ByteLevel, or a Sequence of Replace, ByteFallback, "
                  "Fuse, Strip)");
    }
  }
  return d;
}

std::string Decoder::token_bytes(std::string_view tok) const {
  if (byte_level_) {
    std::string raw;
    if (byte_alphabet().decode(tok, raw)) return raw;
    return std::string(tok);
  }
  if (byte_fallback_ && tok.size() == 6 && tok.substr(0, 3) == "<0x" && tok[5] == '>' && hexval(tok[3]) >= 0 &&
      hexval(tok[4]) >= 0) {
    return std::string(1, static_cast<char>(hexval(tok[3]) * 16 + hexval(tok[4])));
  }
  std::string s(tok);
  for (const auto& [a, b] : replace_) s = replace_all(s, a, b);
  return s;
}

std::string Decoder::finish(std::string bytes) const {
  const std::string& c = strip_content_;
  for (size_t k = 0; k < strip_start_ && !c.empty() && bytes.compare(0, c.size(), c) == 0; ++k) bytes.erase(0, c.size());
  for (size_t k = 0; k < strip_stop_ && !c.empty() && bytes.size() >= c.size() &&
                     bytes.compare(bytes.size() - c.size(), c.size(), c) == 0;
       ++k)
    bytes.resize(bytes.size() - c.size());
  return utf8_lossy(bytes);
}

}  // namespace dflash::tok
