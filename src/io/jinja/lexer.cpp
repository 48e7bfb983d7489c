// io/jinja/lexer.cpp — see lexer.h. Follows jinja2/lexer.py (Lexer.tokeniter): the same order of whitespace
// rules, the same string-literal escapes (Python's unicode-escape), the same operators.
#include "io/jinja/lexer.h"

#include <cctype>
#include <cstring>

#include "io/jinja/value.h"

namespace dflash::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body.
std::string unescape(std::string_view s, int line) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    auto hex = [&](size_t n) {
      uint32_t v = 0;
      for (size_t k = 0; k < n; ++k) {
        int h = i + 1 + k < s.size() ? hexval(s[i + 1 + k]) : -1;
        if (h < 0) throw TemplateError(cat("template line ", line, ": truncated \\", c, " escape in a string"));
        v = v * 16 + static_cast<uint32_t>(h);
      }
      i += n;
      return v;
    };
    switch (c) {
      case '\n': break;  // line continuation
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': append_utf8(out, hex(2)); break;
      case 'u': append_utf8(out, hex(4)); break;
      case 'U': append_utf8(out, hex(8)); break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
            v = v * 8 + static_cast<uint32_t>(s[++i] - '0');
          append_utf8(out, v);
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                            "=",  "(",  ")",  "[",  "]",  "{",  "}", ".", ":", "|", ",", ";"};

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      // the next tag start
      size_t t = pos_;
      for (;; ++t) {
        t = s_.find('{', t);
        if (t == std::string::npos || t + 1 >= s_.size()) {
          t = std::string::npos;
          break;
        }
        const char k = s_[t + 1];
        if (k == '{' || k == '%' || k == '#') break;
      }
      if (t == std::string::npos) {
        text(s_.substr(pos_));
        pos_ = s_.size();
        break;
      }
      const char kind = s_[t + 1];
      const char sign = t + 2 < s_.size() && (s_[t + 2] == '-' || s_[t + 2] == '+') ? s_[t + 2] : 0;
      std::string data = s_.substr(pos_, t - pos_);
      if (sign == '-') {
        size_t e = data.size();
        while (e > 0 && is_space(data[e - 1])) --e;
        data.resize(e);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t nl = data.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool ws = l_pos < data.size();
          for (size_t i = l_pos; i < data.size(); ++i) ws = ws && is_space(data[i]);
          if (ws) data.resize(l_pos);
        }
      }
      text(data);
      line_ += count_nl(pos_, t);
      pos_ = t + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        comment();
      } else {
        tag(kind == '{');
      }
      line_starting = pos_ > 0 && s_[pos_ - 1] == '\n';
    }
    out_.push_back({Token::Type::End, "", line_});
    return std::move(out_);
  }

 private:
  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;

  int count_nl(size_t a, size_t b) const {
    int n = 0;
    for (size_t i = a; i < b && i < s_.size(); ++i) n += s_[i] == '\n';
    return n;
  }
  [[noreturn]] void fail(const std::string& msg) const { throw TemplateError(cat("template line ", line_, ": ", msg)); }

  void text(std::string data) {
    if (!data.empty()) out_.push_back({Token::Type::Text, std::move(data), line_});
  }

  // After the tag's closing delimiter at `close` (length n): `-` strips all whitespace, trim_blocks one newline.
  void close_tag(size_t close, size_t n, bool block) {
    const bool minus = close > 0 && s_[close - 1] == '-';
    const bool plus = close > 0 && s_[close - 1] == '+';
    size_t p = close + n;
    line_ += count_nl(pos_, p);
    if (minus) {
      while (p < s_.size() && is_space(s_[p])) {
        line_ += s_[p] == '\n';
        ++p;
      }
    } else if (block && !plus && p < s_.size() && s_[p] == '\n') {
      ++line_;
      ++p;
    }
    pos_ = p;
  }

  void comment() {
    const size_t e = s_.find("#}", pos_);
    if (e == std::string::npos) fail("missing end of comment tag '#}'");
    close_tag(e, 2, true);
  }

  void tag(bool var) {
    out_.push_back({var ? Token::Type::VarBegin : Token::Type::BlockBegin, "", line_});
    const size_t first = out_.size();
    int depth = 0;  // open ( [ {
    for (;;) {
      while (pos_ < s_.size() && is_space(s_[pos_])) line_ += s_[pos_++] == '\n';
      if (pos_ >= s_.size()) fail(var ? "missing end of print tag '}}'" : "missing end of block tag '%}'");
      const char c = s_[pos_];
      // closing delimiter (only outside brackets, as in Jinja2's balancing stack)
      if (depth == 0) {
        size_t q = pos_;
        if ((c == '-' || c == '+') && q + 1 < s_.size()) ++q;
        if (s_.compare(q, 2, var ? "}}" : "%}") == 0 && (q == pos_ || s_[pos_] == '-' || !var)) {
          if (!var && out_.size() > first && out_[first].type == Token::Type::Name && out_[first].text == "raw")
            fail("{% raw %} blocks are not supported");
          out_.push_back({var ? Token::Type::VarEnd : Token::Type::BlockEnd, "", line_});
          close_tag(q, 2, !var);
          return;
        }
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80) {
        size_t e = pos_;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_' ||
                                 static_cast<unsigned char>(s_[e]) >= 0x80))
          ++e;
        out_.push_back({Token::Type::Name, s_.substr(pos_, e - pos_), line_});
        pos_ = e;
      } else if (c == '\'' || c == '"') {
        string(c);
      } else {
        const char* op = nullptr;
        for (const char* o : kOps) {
          if (s_.compare(pos_, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        }
        if (!op) fail(cat("unexpected character '", c, "'"));
        const std::string o = op;
        if (o == "(" || o == "[" || o == "{") ++depth;
        if (o == ")" || o == "]" || o == "}") {
          if (depth == 0) fail(cat("unexpected '", o, "'"));
          --depth;
        }
        out_.push_back({Token::Type::Op, o, line_});
        pos_ += o.size();
      }
    }
  }

  void number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t f = e + 1;
      if (f < s_.size() && (s_[f] == '+' || s_[f] == '-')) ++f;
      if (f < s_.size() && std::isdigit(static_cast<unsigned char>(s_[f]))) {
        is_float = true;
        e = f;
        digits();
      }
    }
    std::string t;
    for (size_t i = pos_; i < e; ++i)
      if (s_[i] != '_') t.push_back(s_[i]);
    out_.push_back({is_float ? Token::Type::Float : Token::Type::Int, t, line_});
    pos_ = e;
  }

  void string(char q) {
    size_t e = pos_ + 1;
    while (e < s_.size() && s_[e] != q) e += s_[e] == '\\' ? 2 : 1;
    if (e >= s_.size()) fail("unterminated string literal");
    out_.push_back({Token::Type::String, unescape(std::string_view(s_).substr(pos_ + 1, e - pos_ - 1), line_), line_});
    line_ += count_nl(pos_, e);
    pos_ = e + 1;
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  // newlines -> "\n"; one trailing newline dropped (keep_trailing_newline=False)
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s.push_back(source[i]);
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return Lexer(std::move(s)).run();
}

}  // namespace dflash::jinja
