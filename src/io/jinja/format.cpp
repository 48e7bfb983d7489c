// io/jinja/format.cpp — see format.h. Follows CPython's Objects/stringlib/unicode_format.h (fields, auto and
// manual numbering, conversions) and Python/formatter_unicode.c (the mini-language) for str, int and float.
#include "io/jinja/format.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "io/jinja/builtins.h"

namespace dflash::jinja {

namespace {

[[noreturn]] void fail(std::string_view where, const std::string& msg) { throw TemplateError(cat(where, ": ", msg)); }

struct Spec {
  std::string fill = " ";
  char align = 0;  // < > = ^, 0: the type's default
  char sign = 0;   // + - space
  bool alt = false, zero = false;
  int64_t width = -1, precision = -1;
  char grouping = 0;  // , _
  char type = 0;
};

size_t cp_count(std::string_view s) { return utf8_codepoints(s).size() - 1; }

Spec parse_spec(std::string_view s, std::string_view where) {
  Spec p;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '=' || c == '^'; };
  // [[fill]align]: the fill is one code point
  size_t first_len = 1;
  if (!s.empty()) {
    const auto b = static_cast<unsigned char>(s[0]);
    first_len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
  }
  if (s.size() > first_len && is_align(s[first_len])) {
    p.fill = std::string(s.substr(0, first_len));
    p.align = s[first_len];
    i = first_len + 1;
  } else if (!s.empty() && is_align(s[0])) {
    p.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) p.sign = s[i++];
  if (i < s.size() && s[i] == '#') {
    p.alt = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    p.zero = true;
    ++i;
  }
  auto digits = [&]() {
    int64_t v = -1;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') v = (v < 0 ? 0 : v * 10) + (s[i++] - '0');
    return v;
  };
  p.width = digits();
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) p.grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    p.precision = digits();
    if (p.precision < 0) fail(where, "Format specifier missing precision");
  }
  if (i < s.size()) p.type = s[i++];
  if (i < s.size()) fail(where, "Invalid format specifier");
  if (p.zero && !p.align) {
    p.fill = "0";
    p.align = '=';
  }
  return p;
}

// body padded to the width; '=' puts the padding after the sign / prefix (the first `lead` bytes of body).
std::string pad(const std::string& body, size_t lead, const Spec& p, char default_align) {
  const char align = p.align ? p.align : default_align;
  const int64_t n = static_cast<int64_t>(cp_count(body));
  if (p.width <= n) return body;
  const int64_t k = p.width - n;
  auto fill = [&](int64_t m) {
    std::string f;
    for (int64_t j = 0; j < m; ++j) f += p.fill;
    return f;
  };
  switch (align) {
    case '<': return body + fill(k);
    case '^': return fill(k / 2) + body + fill(k - k / 2);
    case '=': return body.substr(0, lead) + fill(k) + body.substr(lead);
    default: return fill(k) + body;
  }
}

// digits grouped by `sep` every `every` digits from the right
std::string group(const std::string& digits, char sep, size_t every) {
  if (!sep) return digits;
  std::string out;
  const size_t n = digits.size();
  for (size_t j = 0; j < n; ++j) {
    if (j > 0 && (n - j) % every == 0) out.push_back(sep);
    out.push_back(digits[j]);
  }
  return out;
}

std::string sign_of(bool negative, char sign) {
  if (negative) return "-";
  return sign == '+' ? "+" : sign == ' ' ? " " : "";
}

std::string format_int(int64_t v, const Spec& p, std::string_view where) {
  if (p.precision >= 0) fail(where, "Precision not allowed in integer format specifier");
  const char t = p.type ? p.type : 'd';
  if (t == 'c') {
    if (v < 0 || v > 0x10FFFF) fail(where, "%c arg not in range(0x110000)");
    std::string s;
    const auto c = static_cast<uint32_t>(v);
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      s += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    } else if (c < 0x10000) {
      s += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
            static_cast<char>(0x80 | (c & 0x3F))};
    } else {
      s += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
            static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
    }
    return pad(s, 0, p, '<');
  }
  unsigned base = 10;
  std::string prefix;
  if (t == 'b') base = 2, prefix = "0b";
  if (t == 'o') base = 8, prefix = "0o";
  if (t == 'x' || t == 'X') base = 16, prefix = t == 'x' ? "0x" : "0X";
  if (t != 'd' && t != 'n' && base == 10) fail(where, cat("Unknown format code '", t, "' for object of type 'int'"));
  if (p.grouping == ',' && base != 10) fail(where, cat("Cannot specify ',' with '", t, "'."));
  const bool neg = v < 0;
  uint64_t u = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits;
  do {
    const unsigned d = static_cast<unsigned>(u % base);
    digits.insert(digits.begin(), static_cast<char>(d < 10 ? '0' + d : (t == 'X' ? 'A' : 'a') + d - 10));
    u /= base;
  } while (u);
  const std::string lead = sign_of(neg, p.sign) + (p.alt ? prefix : "");
  return pad(lead + group(digits, p.grouping, base == 10 ? 3 : 4), lead.size(), p, '>');
}

std::string format_float(double v, const Spec& p, std::string_view where) {
  char t = p.type;
  if (t && std::string_view("eEfFgGn%").find(t) == std::string_view::npos)
    fail(where, cat("Unknown format code '", t, "' for object of type 'float'"));
  const bool neg = std::signbit(v) && !std::isnan(v);
  const double a = std::fabs(v);
  std::string body;
  if (std::isinf(a) || std::isnan(a)) {
    body = std::isinf(a) ? "inf" : "nan";
    if (t == 'E' || t == 'F' || t == 'G')
      for (char& c : body) c = static_cast<char>(c - 'a' + 'A');
    if (t == '%') body += "%";
  } else if (!t && p.precision < 0) {
    body = py_float_repr(a);
  } else {
    int prec = p.precision < 0 ? 6 : static_cast<int>(p.precision);
    double x = a;
    char ct = t == 'n' ? 'g' : t == '%' ? 'f' : t;
    bool none_type = !t;
    if (none_type) {
      ct = 'g';
      if (prec == 0) prec = 1;
    }
    if (t == '%') x *= 100;
    char fmt[16], buf[512];
    std::snprintf(fmt, sizeof fmt, "%%%s.%d%c", p.alt ? "#" : "", prec, ct);
    std::snprintf(buf, sizeof buf, fmt, x);
    body = buf;
    // no type: like 'g', but fixed-point output keeps one digit past the point
    if (none_type && body.find_first_of(".eEn") == std::string::npos) body += ".0";
    if (t == '%') body += "%";
  }
  // grouping applies to the integer digits
  if (p.grouping) {
    size_t e = 0;
    while (e < body.size() && body[e] >= '0' && body[e] <= '9') ++e;
    body = group(body.substr(0, e), p.grouping, 3) + body.substr(e);
  }
  const std::string lead = sign_of(neg, p.sign);
  return pad(lead + body, lead.size(), p, '>');
}

}  // namespace

std::string py_format_value(const Value& v, std::string_view spec, std::string_view where) {
  if (v.is_undefined()) {
    if (!spec.empty()) fail(where, "unsupported format string passed to Undefined.__format__");
    return "";
  }
  if (v.is_bool() && spec.empty()) return py_str(v);
  const Spec p = parse_spec(spec, where);
  if (v.is_string()) {
    if (p.type && p.type != 's') fail(where, cat("Unknown format code '", p.type, "' for object of type 'str'"));
    if (p.sign) fail(where, "Sign not allowed in string format specifier");
    if (p.alt) fail(where, "Alternate form (#) not allowed in string format specifier");
    if (p.align == '=' && !p.zero) fail(where, "'=' alignment not allowed in string format specifier");
    if (p.grouping) fail(where, cat("Cannot specify '", p.grouping, "' with 's'."));
    std::string s = v.str();
    if (p.precision >= 0) {
      const auto cps = utf8_codepoints(s);
      if (static_cast<size_t>(p.precision) + 1 < cps.size()) s.resize(cps[static_cast<size_t>(p.precision)]);
    }
    Spec q = p;
    if (p.zero && p.align == '=') q.align = '<';  // '0' before the width pads a str on the right with zeros
    return pad(s, 0, q, '<');
  }
  if (v.is_int() || v.is_bool()) {
    if (p.type && std::string_view("eEfFgG%").find(p.type) != std::string_view::npos)
      return format_float(static_cast<double>(v.as_int()), p, where);
    return format_int(v.as_int(), p, where);
  }
  if (v.is_float()) return format_float(v.as_float(), p, where);
  if (!spec.empty()) fail(where, cat("unsupported format string passed to ", v.type_name(), ".__format__"));
  return py_str(v);
}

std::string py_format(std::string_view fmt, const Args& a) {
  const std::string_view where = a.where;
  std::string out;
  int auto_index = 0;  // the next automatic field ("{}")
  bool manual = false;
  // One replacement field's text (between the braces), formatted.
  std::function<std::string(std::string_view, int)> field = [&](std::string_view f, int depth) -> std::string {
    if (depth > 1) fail(where, "Max string recursion exceeded");
    // field_name [!conversion] [:format_spec]; the name ends at the first '!' or ':' outside brackets
    size_t e = 0;
    for (bool in_bracket = false; e < f.size(); ++e) {
      if (f[e] == '[') in_bracket = true;
      if (f[e] == ']') in_bracket = false;
      if (!in_bracket && (f[e] == '!' || f[e] == ':')) break;
    }
    const std::string_view name = f.substr(0, e);
    char conv = 0;
    std::string_view spec;
    if (e < f.size() && f[e] == '!') {
      if (e + 1 >= f.size()) fail(where, "end of string while looking for conversion specifier");
      conv = f[e + 1];
      e += 2;
      if (e < f.size() && f[e] != ':') fail(where, "expected ':' after conversion specifier");
    }
    if (e < f.size() && f[e] == ':') spec = f.substr(e + 1);
    // the argument: index, keyword, or the next automatic one
    size_t k = 0;
    while (k < name.size() && name[k] != '.' && name[k] != '[') ++k;
    const std::string_view first = name.substr(0, k);
    Value obj;
    if (first.empty()) {
      if (manual) fail(where, "cannot switch from manual field specification to automatic field numbering");
      const auto idx = static_cast<size_t>(auto_index++);
      if (idx >= a.pos.size()) fail(where, cat("Replacement index ", idx, " out of range for positional args tuple"));
      obj = a.pos[idx];
    } else if (first.find_first_not_of("0123456789") == std::string_view::npos) {
      if (auto_index > 0) fail(where, "cannot switch from automatic field numbering to manual field specification");
      manual = true;
      const auto idx = static_cast<size_t>(std::strtoull(std::string(first).c_str(), nullptr, 10));
      if (idx >= a.pos.size()) fail(where, cat("Replacement index ", idx, " out of range for positional args tuple"));
      obj = a.pos[idx];
    } else {
      bool found = false;
      for (const auto& [kw, v] : a.kw) {
        if (kw == first) {
          obj = v;
          found = true;
        }
      }
      if (!found) fail(where, cat("'", first, "'"));  // KeyError
    }
    // .attribute and [key] accessors, read as the template reads them
    while (k < name.size()) {
      if (name[k] == '.') {
        size_t j = k + 1;
        while (j < name.size() && name[j] != '.' && name[j] != '[') ++j;
        if (j == k + 1) fail(where, "Empty attribute in format string");
        obj = get_attr(obj, std::string(name.substr(k + 1, j - k - 1)), where);
        k = j;
      } else if (name[k] == '[') {
        const size_t j = name.find(']', k);
        if (j == std::string_view::npos) fail(where, "Missing ']' in format string");
        const std::string key(name.substr(k + 1, j - k - 1));
        if (key.empty()) fail(where, "Empty attribute in format string");
        const bool num = key.find_first_not_of("0123456789") == std::string::npos;
        obj = get_item(obj, num ? Value(static_cast<int64_t>(std::strtoll(key.c_str(), nullptr, 10))) : Value(key), where);
        k = j + 1;
      } else {
        fail(where, "Only '.' or '[' may follow ']' in format field specifier");
      }
    }
    if (conv == 'r' || conv == 'a') {
      obj = Value(py_repr(obj));
    } else if (conv == 's') {
      obj = Value(py_str(obj));
    } else if (conv) {
      fail(where, cat("Unknown conversion specifier ", conv));
    }
    // nested fields inside the spec
    std::string full_spec;
    for (size_t j = 0; j < spec.size(); ++j) {
      if (spec[j] == '{') {
        const size_t close = spec.find('}', j);
        if (close == std::string_view::npos) fail(where, "unmatched '{' in format spec");
        full_spec += field(spec.substr(j + 1, close - j - 1), depth + 1);
        j = close;
      } else {
        full_spec.push_back(spec[j]);
      }
    }
    return py_format_value(obj, full_spec, where);
  };
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      fail(where, "Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    // the matching '}', counting nested braces of the spec
    size_t j = i + 1;
    int depth = 1;
    for (; j < fmt.size(); ++j) {
      if (fmt[j] == '{') ++depth;
      if (fmt[j] == '}' && --depth == 0) break;
    }
    if (j >= fmt.size()) fail(where, "Single '{' encountered in format string");
    out += field(fmt.substr(i + 1, j - i - 1), 0);
    i = j;
  }
  return out;
}

}  // namespace dflash::jinja
