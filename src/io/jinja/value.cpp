// io/jinja/value.cpp — see value.h.
#include "io/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace dflash::jinja {

Value Value::function(std::string name, Function f) {
  Value v(Kind::Function);
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<Function>(std::move(f));
  return v;
}

List Value::consume() const {
  List out = std::move(*l_);
  l_->clear();
  return out;
}

Value Value::next_item() const {
  if (l_->empty()) return Value::undefined("the generator is exhausted");
  Value v = std::move(l_->front());
  l_->erase(l_->begin());
  return v;
}

bool Value::truthy() const {
  if (generator_) return true;
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0.0;
    case Kind::String: return !str().empty();
    case Kind::List: return !l_->empty();
    case Kind::Dict: return !d_->items.empty();
    case Kind::Function: return true;
  }
  return false;
}

const std::string& Value::empty_string() {
  static const std::string kEmpty;
  return kEmpty;
}

std::string Value::undefined_message() const {
  const std::string& n = str();
  if (n.empty()) return "a value is undefined";
  if (n.find(' ') != std::string::npos) return n;  // a sentence from an attribute / item lookup
  return "'" + n + "' is undefined";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return generator_ ? "generator" : tuple_ ? "tuple" : "list";
    case Kind::Dict: return d_->is_namespace ? "Namespace" : "dict";
    case Kind::Function: return "function";
  }
  return "?";
}

const Value* Dict::find(std::string_view k) const {
  for (const auto& [key, v] : items)
    if (key.is_string() && key.str() == k) return &v;
  return nullptr;
}

const Value* Dict::find_key(const Value& k) const {
  if (k.is_string()) return find(std::string_view(k.str()));
  for (const auto& [key, v] : items)
    if (!key.is_string() && py_equal(key, k)) return &v;
  return nullptr;
}

void Dict::set(const std::string& k, Value v) {
  for (auto& [key, old] : items) {
    if (key.is_string() && key.str() == k) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(Value(k), std::move(v));
}

void Dict::set_key(const Value& k, Value v) {
  for (auto& [key, old] : items) {
    if (key.is_string() == k.is_string() && py_equal(key, k)) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(k, std::move(v));
}

void require_hashable(const Value& k, std::string_view where) {
  if (k.is_list() && k.is_tuple()) {
    for (const Value& x : k.list()) require_hashable(x, where);
    return;
  }
  if (k.is_list() || k.is_dict() || k.is_undefined())
    throw TemplateError(cat(where, ": unhashable type: '", k.type_name(), "'"));
}

Value Args::get(size_t i, std::string_view name, Value dflt) const {
  if (i < pos.size()) return pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return dflt;
}

void Args::expect(size_t n, std::initializer_list<std::string_view> names) const {
  if (pos.size() > n) throw TemplateError(cat(where, ": takes at most ", n, " positional arguments, got ", pos.size()));
  for (const auto& [k, v] : kw) {
    if (std::find(names.begin(), names.end(), k) == names.end())
      throw TemplateError(cat(where, ": unexpected keyword argument '", k, "'"));
  }
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.str() == b.str();
    case Value::Kind::List: {
      if (a.is_generator() || b.is_generator()) return &a.list() == &b.list();
      const List &x = a.list(), &y = b.list();
      if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!py_equal(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      const Dict &x = a.dict(), &y = b.dict();
      if (a.dict_ptr() == b.dict_ptr()) return true;
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* o = y.find_key(k);
        if (!o || !py_equal(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::Function: return &a.fn() == &b.fn();
    default: return false;
  }
}

bool py_less(const Value& a, const Value& b, std::string_view where) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i])) return py_less(x[i], y[i], where);
    }
    return x.size() < y.size();
  }
  throw TemplateError(cat(where, ": '<' not supported between instances of '", a.type_name(), "' and '",
                          b.type_name(), "'"));
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest digits that round-trip, then Python's layout: fixed for 1e-4 <= |d| < 1e16, else d.ddde+XX.
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  const size_t e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string mant = s.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {  // Python's repr: fixed notation for 1e-4 <= |d| < 1e16
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(static_cast<size_t>(exp + 1 - static_cast<int>(digits.size())), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
    }
  }
  if (out.empty()) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return neg ? "-" + out : out;
}

namespace {

void repr_string(const std::string& s, std::string& out) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  out.push_back(q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == q) {
          out.push_back('\\');
          out.push_back(static_cast<char>(c));
        } else if (c < 0x20 || c == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\x%02x", c);
          out += b;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back(q);
}

void repr_into(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::String:
      if (v.is_markup()) out += "Markup(";
      repr_string(v.str(), out);
      if (v.is_markup()) out += ")";
      return;
    case Value::Kind::List: {
      if (v.is_generator()) {
        out += "<generator object>";
        return;
      }
      out.push_back(v.is_tuple() ? '(' : '[');
      const List& l = v.list();
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += ", ";
        repr_into(l[i], out);
      }
      if (v.is_tuple() && l.size() == 1) out.push_back(',');
      out.push_back(v.is_tuple() ? ')' : ']');
      return;
    }
    case Value::Kind::Dict: {
      if (v.dict().is_namespace) out += "<Namespace ";
      out.push_back('{');
      bool first = true;
      for (const auto& [k, x] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        repr_into(k, out);
        out += ": ";
        repr_into(x, out);
      }
      out.push_back('}');
      if (v.dict().is_namespace) out.push_back('>');
      return;
    }
    default: out += py_str(v);
  }
}

void json_string(const std::string& s, std::string& out, bool ensure_ascii) {
  out.push_back('"');
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && ensure_ascii) {
      // one code point (a malformed byte stands for itself), as \uXXXX or a surrogate pair
      uint32_t cp = c;
      size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      if (n > 1 && i + n <= s.size()) {
        cp = c & (0x7Fu >> n);
        for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
        i += n - 1;
      }
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      out += b;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

void json_into(const Value& v, const JsonFormat& f, int depth, std::string& out, std::string_view where) {
  auto newline = [&](int d) {
    out.push_back('\n');
    out.append(static_cast<size_t>(f.indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: {
      const double d = v.as_float();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : py_float_repr(d);
      return;
    }
    case Value::Kind::String: json_string(v.str(), out, f.ensure_ascii); return;
    case Value::Kind::List: {
      if (v.is_generator()) break;
      const List& l = v.list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += f.indent >= 0 ? std::string(",") : f.item_sep;
        if (f.indent >= 0) newline(depth + 1);
        json_into(l[i], f, depth + 1, out, where);
      }
      if (f.indent >= 0) newline(depth);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict().items) items.push_back(&kv);
      if (f.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [&](auto* a, auto* b) { return py_less(a->first, b->first, where); });
      }
      if (items.empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += f.indent >= 0 ? std::string(",") : f.item_sep;
        if (f.indent >= 0) newline(depth + 1);
        const Value& k = items[i]->first;
        if (k.is_string()) {
          json_string(k.str(), out, f.ensure_ascii);
        } else if (k.is_number() || k.is_none()) {
          std::string key;
          json_into(k, JsonFormat{}, 0, key, where);  // 1 -> "1", true -> "true", None -> "null", 1.5 -> "1.5"
          json_string(key, out, false);
        } else {
          throw TemplateError(cat(where, ": keys must be str, int, float, bool or None, not ", k.type_name()));
        }
        out += f.key_sep;
        json_into(items[i]->second, f, depth + 1, out, where);
      }
      if (f.indent >= 0) newline(depth);
      out.push_back('}');
      return;
    }
    default: break;
  }
  throw TemplateError(cat(where, ": Object of type ", v.type_name(), " is not JSON serializable",
                          v.is_generator() ? " (map, select, reject, selectattr, rejectattr, unique, items and reverse "
                                             "return generators in Jinja2: `| list` makes a list)"
                                           : ""));
}

}  // namespace

std::string py_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.as_bool() ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.as_int());
    case Value::Kind::Float: return py_float_repr(v.as_float());
    case Value::Kind::String: return v.str();
    case Value::Kind::Function: return "<function " + v.fn_name() + ">";
    default: {
      std::string out;
      repr_into(v, out);
      return out;
    }
  }
}

std::string py_repr(const Value& v) {
  std::string out;
  repr_into(v, out);
  return out;
}

std::string to_json_text(const Value& v, const JsonFormat& f, std::string_view where) {
  std::string out;
  json_into(v, f, 0, out, where);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get_ref<const std::string&>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d->items.emplace_back(Value(it.key()), from_json(it.value()));
      return Value(std::move(d));
    }
    default: return Value::none();
  }
}

std::vector<size_t> utf8_codepoints(std::string_view s) {
  std::vector<size_t> off;
  off.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) off.push_back(i);
  off.push_back(s.size());
  return off;
}

}  // namespace dflash::jinja
