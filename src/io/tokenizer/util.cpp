// io/tokenizer/util.cpp — see util.h.
#include "io/tokenizer/util.h"

#include <atomic>

namespace dflash::tok {

int32_t decode_utf8(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  unsigned c = p[i];
  if (c < 0x80) {
    ++i;
    return static_cast<int32_t>(c);
  }
  auto cont = [&](size_t k) { return k < n && (p[k] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF && cont(i + 1)) {
    int32_t cp = static_cast<int32_t>(((c & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu));
    i += 2;
    return cp;
  }
  if (c >= 0xE0 && c <= 0xEF && cont(i + 1) && cont(i + 2)) {
    uint32_t cp = ((c & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
      i += 3;
      return static_cast<int32_t>(cp);
    }
  }
  if (c >= 0xF0 && c <= 0xF4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    uint32_t cp = ((c & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu);
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
      i += 4;
      return static_cast<int32_t>(cp);
    }
  }
  ++i;
  return -1;
}

int32_t last_cp_before(std::string_view s, size_t end) {
  if (end == 0) return -1;
  size_t b = end - 1;
  while (b > 0 && end - b < 4 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  size_t i = b;
  int32_t cp = decode_utf8(s, i);
  return i == end ? cp : -1;
}

bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  static constexpr char kRepl[] = "\xEF\xBF\xBD";
  for (size_t i = 0; i < n;) {
    unsigned c = p[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    if (len == 0) {
      out.append(kRepl, 3);
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k < len && i + k < n; ++k) {
      unsigned b = p[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    }
    if (k == len) {
      out.append(s.substr(i, len));
    } else {
      out.append(kRepl, 3);
    }
    i += k;
  }
  return out;
}

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

ThreadState& thread_state() {
  thread_local ThreadState ts;
  return ts;
}

std::string onig_whitespace(const std::string& re) {
  static const std::string kSpace = "\\t\\n\\x{0B}\\f\\r\\x{85}\\p{Z}";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      char d = re[++i];
      if (d == 's') {
        out += in_class ? kSpace : "[" + kSpace + "]";
      } else if (d == 'S' && !in_class) {
        out += "[^" + kSpace + "]";
      } else {
        out.push_back(c);
        out.push_back(d);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < re.size() && re[i + 1] == '^') out.push_back(re[++i]);
      if (i + 1 < re.size() && re[i + 1] == ']') out.push_back(re[++i]);  // leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < re.size() && re[i + 1] == ':') {  // POSIX class [:name:]
      size_t e = re.find(":]", i + 2);
      if (e != std::string::npos) {
        out.append(re, i, e + 2 - i);
        i = e + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

std::string replace_all(std::string_view s, std::string_view a, std::string_view b) {
  std::string out;
  size_t p = 0;
  for (size_t q; (q = s.find(a, p)) != std::string_view::npos; p = q + a.size()) {
    out.append(s, p, q - p);
    out.append(b);
  }
  out.append(s, p, std::string_view::npos);
  return out;
}

uint64_t next_instance_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace dflash::tok
