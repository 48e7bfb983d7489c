// io/jinja/builtins.cpp — see builtins.h. Filters and tests follow jinja2/filters.py and jinja2/tests.py (3.1);
// methods follow Python's str / dict / list. Case mapping (upper, lower, title, capitalize) changes ASCII letters
// only; every other behaviour is Python's, on code points.
#include "io/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "io/jinja/format.h"

namespace dflash::jinja {

namespace {

[[noreturn]] void type_error(std::string_view where, const std::string& msg) { throw TemplateError(cat(where, ": ", msg)); }

[[noreturn]] void undefined_error(const Value& v, std::string_view where) {
  throw TemplateError(cat(where, ": ", v.undefined_message()));
}

uint32_t next_cp(std::string_view s, size_t& i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80; };
  auto cb = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k]) & 0x3F); };
  uint32_t c = b0;
  size_t n = 1;
  if (b0 >= 0x80) {
    if ((b0 & 0xE0) == 0xC0 && cont(1)) {
      c = ((b0 & 0x1Fu) << 6) | cb(1);
      n = 2;
    } else if ((b0 & 0xF0) == 0xE0 && cont(1) && cont(2)) {
      c = ((b0 & 0x0Fu) << 12) | (cb(1) << 6) | cb(2);
      n = 3;
    } else if ((b0 & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
      c = ((b0 & 0x07u) << 18) | (cb(1) << 12) | (cb(2) << 6) | cb(3);
      n = 4;
    }
  }
  i += n;
  return c;
}

std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}

std::string require_str(const Value& v, std::string_view where, const char* what) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) undefined_error(v, where);
  type_error(where, cat(what, " must be str, not ", v.type_name()));
}

int64_t require_int(const Value& v, std::string_view where, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_undefined()) undefined_error(v, where);
  type_error(where, cat(what, " must be an integer, not ", v.type_name()));
}

// Python str.split(sep, maxsplit) / rsplit.
List py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right, std::string_view where) {
  List out;
  if (sep.is_none() || sep.is_undefined()) {
    // runs of whitespace; no empty strings
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0, start = std::string::npos;
    while (i < s.size()) {
      size_t at = i;
      uint32_t c = next_cp(s, i);
      if (py_isspace(c)) {
        if (start != std::string::npos) words.emplace_back(start, at);
        start = std::string::npos;
      } else if (start == std::string::npos) {
        start = at;
      }
    }
    if (start != std::string::npos) words.emplace_back(start, s.size());
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
      for (auto [a, b] : words) out.emplace_back(s.substr(a, b - a));
      return out;
    }
    if (!from_right) {
      for (size_t k = 0; k < static_cast<size_t>(maxsplit); ++k) out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      out.emplace_back(py_strip(std::string_view(s).substr(words[static_cast<size_t>(maxsplit)].first), std::nullopt, false, true));
    } else {
      const size_t keep = words.size() - static_cast<size_t>(maxsplit);
      out.emplace_back(py_strip(std::string_view(s).substr(0, words[keep - 1].second), std::nullopt, true, false));
      for (size_t k = keep; k < words.size(); ++k) out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    return out;
  }
  const std::string sp = require_str(sep, where, "the separator");
  if (sp.empty()) type_error(where, "empty separator");
  std::vector<std::string> parts;
  size_t p = 0;
  for (;;) {
    size_t q = s.find(sp, p);
    if (q == std::string::npos) break;
    parts.push_back(s.substr(p, q - p));
    p = q + sp.size();
  }
  parts.push_back(s.substr(p));
  if (maxsplit >= 0 && parts.size() > static_cast<size_t>(maxsplit) + 1) {
    const size_t m = static_cast<size_t>(maxsplit);
    std::vector<std::string> merged;
    if (!from_right) {
      merged.assign(parts.begin(), parts.begin() + static_cast<long>(m));
      std::string rest = parts[m];
      for (size_t k = m + 1; k < parts.size(); ++k) rest += sp + parts[k];
      merged.push_back(rest);
    } else {
      const size_t keep = parts.size() - m;
      std::string head = parts[0];
      for (size_t k = 1; k < keep; ++k) head += sp + parts[k];
      merged.push_back(head);
      merged.insert(merged.end(), parts.begin() + static_cast<long>(keep), parts.end());
    }
    parts = std::move(merged);
  }
  for (auto& x : parts) out.emplace_back(std::move(x));
  return out;
}

// A count of code points, or a code point index -> byte offset.
size_t cp_len(const std::string& s) { return utf8_codepoints(s).size() - 1; }

Value bound(const Value& self, const std::string& name, std::function<Value(const Value&, Args&)> f) {
  return Value::function(name, [self, f = std::move(f)](Args& a) { return f(self, a); });
}

bool starts_or_ends(const std::string& s, const Value& what, bool ends, std::string_view where) {
  auto one = [&](const Value& v) {
    const std::string x = require_str(v, where, "the prefix");
    return ends ? s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 : s.rfind(x, 0) == 0;
  };
  if (what.is_list()) {
    for (const Value& v : what.list())
      if (one(v)) return true;
    return false;
  }
  return one(what);
}

Value str_method(const Value& self, const std::string& name) {
  using A = Args;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return bound(self, name, [l, r](const Value& s, A& a) {
      a.expect(1, {"chars"});
      Value c = a.get(0, "chars");
      if (c.is_none() || c.is_undefined()) return Value(py_strip(s.str(), std::nullopt, l, r));
      const std::string chars = require_str(c, a.where, "strip's argument");
      return Value(py_strip(s.str(), std::string_view(chars), l, r));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return bound(self, name, [right](const Value& s, A& a) {
      a.expect(2, {"sep", "maxsplit"});
      Value m = a.get(1, "maxsplit", Value(int64_t{-1}));
      return Value(py_split(s.str(), a.get(0, "sep", Value::none()), require_int(m, a.where, "maxsplit"), right, a.where));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool ends = name == "endswith";
    return bound(self, name, [ends](const Value& s, A& a) {
      a.expect(1, {});
      return Value(starts_or_ends(s.str(), a.get(0, ""), ends, a.where));
    });
  }
  if (name == "replace") {
    return bound(self, name, [](const Value& s, A& a) {
      a.expect(3, {"count"});
      const std::string o = require_str(a.get(0, "old"), a.where, "old"), n = require_str(a.get(1, "new"), a.where, "new");
      int64_t count = require_int(a.get(2, "count", Value(int64_t{-1})), a.where, "count");
      const std::string& x = s.str();
      std::string out;
      if (o.empty()) {  // Python inserts `new` between every character (and at both ends)
        const auto cps = utf8_codepoints(x);
        for (size_t k = 0; k + 1 < cps.size(); ++k) {
          if (count < 0 || static_cast<int64_t>(k) < count) out += n;
          out.append(x, cps[k], cps[k + 1] - cps[k]);
        }
        if (count < 0 || static_cast<int64_t>(cps.size() - 1) < count) out += n;
        return Value(out);
      }
      size_t p = 0;
      for (;;) {
        size_t q = count == 0 ? std::string::npos : x.find(o, p);
        if (q == std::string::npos) break;
        out.append(x, p, q - p);
        out += n;
        p = q + o.size();
        if (count > 0) --count;
      }
      out.append(x, p, std::string::npos);
      return Value(out);
    });
  }
  if (name == "upper" || name == "lower") {
    const bool up = name == "upper";
    return bound(self, name, [up](const Value& s, A& a) {
      a.expect(0, {});
      return Value(up ? ascii_upper(s.str()) : ascii_lower(s.str()));
    });
  }
  if (name == "title" || name == "capitalize") {
    return bound(self, name, [name](const Value& s, A& a) {
      a.expect(0, {});
      Args none;
      none.where = a.where;
      return apply_filter(name, s, none);
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return bound(self, name, [name](const Value& s, A& a) {
      a.expect(1, {});
      const std::string sub = require_str(a.get(0, "sub"), a.where, "the substring");
      const std::string& x = s.str();
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(cp_len(x) + 1));
        int64_t n = 0;
        for (size_t p = x.find(sub); p != std::string::npos; p = x.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      const size_t p = name[0] == 'r' ? x.rfind(sub) : x.find(sub);
      if (p == std::string::npos) {
        if (name.find("index") != std::string::npos) type_error(a.where, "substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(cp_len(x.substr(0, p))));
    });
  }
  if (name == "join") {
    return bound(self, name, [](const Value& s, A& a) {
      a.expect(1, {});
      std::string out;
      bool first = true;
      for (const Value& v : iterate(a.get(0, "iterable"), a.where)) {
        if (!first) out += s.str();
        first = false;
        out += require_str(v, a.where, "join's items");
      }
      return Value(out);
    });
  }
  if (name == "splitlines") {
    return bound(self, name, [](const Value& s, A& a) {
      a.expect(1, {"keepends"});
      const bool keep = a.get(0, "keepends", Value(false)).truthy();
      List out;
      const std::string& x = s.str();
      size_t p = 0;
      while (p < x.size()) {
        size_t q = x.find_first_of("\n\r", p);
        if (q == std::string::npos) {
          out.emplace_back(x.substr(p));
          break;
        }
        size_t e = q + ((x[q] == '\r' && q + 1 < x.size() && x[q + 1] == '\n') ? 2 : 1);
        out.emplace_back(x.substr(p, (keep ? e : q) - p));
        p = e;
      }
      return Value(std::move(out));
    });
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" || name == "islower" ||
      name == "isupper") {
    return bound(self, name, [name](const Value& s, A& a) {
      a.expect(0, {});
      const std::string& x = s.str();
      if (x.empty()) return Value(false);
      bool cased = false;
      for (size_t i = 0; i < x.size();) {
        const uint32_t c = next_cp(x, i);
        const bool digit = c >= '0' && c <= '9', alpha = (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
        if (name == "isdigit" && !digit) return Value(false);
        if (name == "isspace" && !py_isspace(c)) return Value(false);
        if (name == "isalpha" && !alpha) return Value(false);
        if (name == "isalnum" && !alpha && !digit) return Value(false);
        if (name == "islower" && c >= 'A' && c <= 'Z') return Value(false);
        if (name == "isupper" && c >= 'a' && c <= 'z') return Value(false);
        cased |= alpha;
      }
      return Value(name == "islower" || name == "isupper" ? cased : true);
    });
  }
  if (name == "format") {
    return bound(self, name, [](const Value& s, A& a) { return Value(py_format(s.str(), a)); });
  }
  return Value::undefined(cat("str object has no attribute '", name, "'"));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// markupsafe.escape(v) for a method argument: a str becomes escaped Markup; Markup and other types stay.
Value escape_arg(const Value& v) { return v.is_string() && !v.is_markup() ? Value::markup(html_escape(v.str())) : v; }

// A str method of `self`; on Markup, as markupsafe 3 has it: the methods that return text return Markup,
// `replace` escapes its new text, `join` its items, `format` its arguments; split and splitlines give Markup items.
Value string_method(const Value& self, const std::string& name) {
  Value m = str_method(self, name);
  if (!self.is_markup() || !m.is_function()) return m;
  static const std::set<std::string_view> kText = {"strip", "lstrip", "rstrip", "replace",    "upper",
                                                    "lower", "title",  "format", "capitalize", "join"};
  static const std::set<std::string_view> kLists = {"split", "rsplit", "splitlines"};
  if (!kText.count(name) && !kLists.count(name)) return m;
  const bool text = kText.count(name) > 0;
  return Value::function(name, [m, text, name](Args& a) -> Value {
    Args e = a;
    if (name == "replace" && e.pos.size() > 1) e.pos[1] = escape_arg(e.pos[1]);
    if (name == "format") {
      for (Value& v : e.pos) v = escape_arg(v);
      for (auto& kv : e.kw) kv.second = escape_arg(kv.second);
    }
    if (name == "join" && !e.pos.empty()) {
      List items;
      for (const Value& v : iterate(e.pos[0], a.where)) items.push_back(escape_arg(v));
      e.pos[0] = Value(std::move(items));
    }
    const Value r = m.fn()(e);
    if (text) return Value::markup(r.str());
    List out;
    for (const Value& v : r.list()) out.push_back(Value::markup(v.str()));
    return Value(std::move(out));
  });
}

Value dict_method(const Value& self, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return bound(self, name, [name](const Value& d, Args& a) {
      a.expect(0, {});
      List out;
      for (const auto& [k, v] : d.dict().items) {
        if (name == "items") {
          out.push_back(Value::tuple(List{k, v}));
        } else {
          out.push_back(name == "keys" ? k : v);
        }
      }
      return Value(std::move(out));
    });
  }
  if (name == "get") {
    return bound(self, name, [](const Value& d, Args& a) {
      a.expect(2, {});
      const Value k = a.get(0, "key");
      require_hashable(k, a.where);
      if (const Value* v = d.dict().find_key(k)) return *v;
      return a.get(1, "default", Value::none());
    });
  }
  return Value();
}

bool unsafe_list_method(const std::string& n) {
  static const std::set<std::string> kMut = {"append", "extend", "insert", "pop", "remove", "sort", "reverse", "clear"};
  return kMut.count(n) > 0;
}

int64_t index_of(int64_t i, size_t n) { return i < 0 ? i + static_cast<int64_t>(n) : i; }

// Python slice indices for a sequence of length n.
std::vector<size_t> slice_indices(size_t n, const Value& start, const Value& stop, const Value& step,
                                  std::string_view where) {
  auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
  const int64_t st = given(step) ? require_int(step, where, "the slice step") : 1;
  if (st == 0) type_error(where, "slice step cannot be zero");
  const int64_t len = static_cast<int64_t>(n);
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (!given(v)) return dflt;
    int64_t x = require_int(v, where, "a slice index");
    if (x < 0) x += len;
    if (st > 0) return std::clamp<int64_t>(x, 0, len);
    return std::clamp<int64_t>(x, -1, len - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : len - 1), e = clamp(stop, st > 0 ? len : -1);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(static_cast<size_t>(i));
  return out;
}

Value to_number(const Value& v, bool want_float, const Value& dflt) {
  if (v.is_int() || v.is_bool()) return want_float ? Value(static_cast<double>(v.as_int())) : Value(v.as_int());
  if (v.is_float()) return want_float ? v : Value(static_cast<int64_t>(v.as_float()));
  if (v.is_string()) {
    const std::string s = py_strip(v.str(), std::nullopt);
    char* end = nullptr;
    if (!want_float) {
      long long x = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end && *end == 0) return Value(static_cast<int64_t>(x));
    }
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == 0) return want_float ? Value(d) : Value(static_cast<int64_t>(d));
  }
  return dflt;
}

// The key a sort / unique / min / max filter compares: attribute, then lower-cased unless case_sensitive.
Value sort_key(const Value& v, const Value& attribute, bool case_sensitive, std::string_view where) {
  Value k = v;
  if (!attribute.is_undefined() && !attribute.is_none()) {
    for (const List& parts = py_split(require_str(attribute, where, "attribute"), Value("."), -1, false, where);
         const Value& p : parts)
      k = get_item(k, to_number(p, false, p), where);
  }
  if (!case_sensitive && k.is_string()) return Value(ascii_lower(k.str()));
  return k;
}

Value attribute_of(const Value& v, const std::string& attr, std::string_view where) {
  Value k = v;
  for (const Value& p : py_split(attr, Value("."), -1, false, where)) k = get_item(k, to_number(p, false, p), where);
  return k;
}

}  // namespace

// ---- names ------------------------------------------------------------------------------------------------

bool filter_supported(std::string_view n) {
  static const std::set<std::string_view> kNames = {
      "abs",  "attr",   "capitalize", "count", "d",       "default", "dictsort", "e",         "escape",     "first",
      "float", "indent", "int",       "items", "join",    "last",    "length",    "list",       "lower",
      "map",  "max",    "min",        "reject", "rejectattr", "replace", "reverse", "round", "safe",
      "select", "selectattr", "sort", "string", "sum",    "title",   "tojson",    "trim",       "unique",
      "upper", "wordcount"};
  return kNames.count(n) > 0;
}

bool test_supported(std::string_view n) {
  static const std::set<std::string_view> kNames = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "float",
      "ge",      "gt",       "greaterthan", "in",      "integer", "iterable", "le", "lessthan", "lower", "lt",
      "mapping", "ne",       "none",    "number",      "odd",     "sameas",  "sequence", "string", "true",
      "undefined", "upper",  "filter",  "test"};
  return kNames.count(n) > 0;
}

bool jinja2_has_filter(std::string_view n) {
  static const std::set<std::string_view> kNames = {
      "abs",    "attr",      "batch",     "capitalize", "center", "count",   "d",          "default", "dictsort",
      "e",      "escape",    "filesizeformat", "first", "float",  "forceescape", "format",  "groupby", "indent",
      "int",    "items",     "join",      "last",       "length", "list",    "lower",      "map",     "max",
      "min",    "pprint",    "random",    "reject",     "rejectattr", "replace", "reverse", "round",   "safe",
      "select", "selectattr", "slice",    "sort",       "string", "striptags", "sum",      "title",   "tojson",
      "trim",   "truncate",  "unique",    "upper",      "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr"};
  return kNames.count(n) > 0;
}

bool jinja2_has_test(std::string_view n) {
  static const std::set<std::string_view> kNames = {"!=", "<", "<=", ">", ">="};
  return test_supported(n) || kNames.count(n) > 0;
}

// ---- access ---------------------------------------------------------------------------------------------

Value get_attr(const Value& obj, const std::string& name, std::string_view where) {
  switch (obj.kind()) {
    case Value::Kind::Undefined: undefined_error(obj, where);
    case Value::Kind::String: return string_method(obj, name);
    case Value::Kind::Dict: {
      if (!obj.dict().is_namespace) {
        Value m = dict_method(obj, name);
        if (!m.is_undefined()) return m;
      }
      if (const Value* v = obj.dict().find(name)) return *v;
      return Value::undefined(cat("dict object has no attribute '", name, "'"));
    }
    case Value::Kind::List:
      if (unsafe_list_method(name) && !obj.is_generator()) {
        return Value::function(name, [name](Args& a) -> Value {
          throw TemplateError(cat(a.where, ": access to attribute '", name,
                                  "' of 'list' object is unsafe (lists are immutable in the chat-template sandbox)"));
        });
      }
      if ((name == "index" || name == "count") && !obj.is_generator()) {
        return bound(obj, name, [name](const Value& l, Args& a) {
          a.expect(1, {});
          const Value x = a.get(0, "x");
          int64_t n = 0;
          for (size_t i = 0; i < l.list().size(); ++i) {
            if (py_equal(l.list()[i], x)) {
              if (name == "index") return Value(static_cast<int64_t>(i));
              ++n;
            }
          }
          if (name == "index") type_error(a.where, "value is not in list");
          return Value(n);
        });
      }
      if (obj.is_generator()) return Value::undefined(cat("generator object has no attribute '", name, "'"));
      return Value::undefined(cat("list object has no attribute '", name, "'"));
    default: return Value::undefined(cat(obj.type_name(), " object has no attribute '", name, "'"));
  }
}

Value get_item(const Value& obj, const Value& key, std::string_view where) {
  switch (obj.kind()) {
    case Value::Kind::Undefined: undefined_error(obj, where);
    case Value::Kind::Dict:
      if (const Value* v = obj.dict().find_key(key)) return *v;
      if (key.is_string()) return get_attr(obj, key.str(), where);
      return Value::undefined(cat("dict object has no element ", py_repr(key)));
    case Value::Kind::List:
      if (obj.is_generator()) return Value::undefined("'generator' object is not subscriptable");
      if (key.is_int() || key.is_bool()) {
        const int64_t i = index_of(key.as_int(), obj.list().size());
        if (i >= 0 && i < static_cast<int64_t>(obj.list().size())) return obj.list()[static_cast<size_t>(i)];
        return Value::undefined("list index out of range");
      }
      if (key.is_string()) return get_attr(obj, key.str(), where);
      return Value::undefined("list indices must be integers");
    case Value::Kind::String:
      if (key.is_int() || key.is_bool()) {
        const auto cps = utf8_codepoints(obj.str());
        const int64_t i = index_of(key.as_int(), cps.size() - 1);
        if (i >= 0 && i + 1 < static_cast<int64_t>(cps.size())) {
          const auto k = static_cast<size_t>(i);
          std::string c = obj.str().substr(cps[k], cps[k + 1] - cps[k]);
          return obj.is_markup() ? Value::markup(std::move(c)) : Value(std::move(c));
        }
        return Value::undefined("string index out of range");
      }
      if (key.is_string()) return get_attr(obj, key.str(), where);
      return Value::undefined("string indices must be integers");
    default: return Value::undefined(cat(obj.type_name(), " object is not subscriptable"));
  }
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, std::string_view where) {
  if (obj.is_undefined()) undefined_error(obj, where);
  if (obj.is_generator()) return Value::undefined("'generator' object is not subscriptable");
  if (obj.is_list()) {
    List out;
    for (size_t i : slice_indices(obj.list().size(), start, stop, step, where)) out.push_back(obj.list()[i]);
    return Value(std::move(out));
  }
  if (obj.is_string()) {
    const auto cps = utf8_codepoints(obj.str());
    std::string out;
    for (size_t i : slice_indices(cps.size() - 1, start, stop, step, where))
      out.append(obj.str(), cps[i], cps[i + 1] - cps[i]);
    return obj.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  type_error(where, cat("'", obj.type_name(), "' object is not subscriptable"));
}

List iterate(const Value& v, std::string_view where) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.is_generator() ? v.consume() : v.list();
    case Value::Kind::Dict: {
      List out;
      for (const auto& kv : v.dict().items) out.push_back(kv.first);
      return out;
    }
    case Value::Kind::String: {
      List out;
      const auto cps = utf8_codepoints(v.str());
      for (size_t i = 0; i + 1 < cps.size(); ++i) out.emplace_back(v.str().substr(cps[i], cps[i + 1] - cps[i]));
      return out;
    }
    default: type_error(where, cat("'", v.type_name(), "' object is not iterable"));
  }
}

// ---- operators ------------------------------------------------------------------------------------------

Value binary_op(const std::string& op, const Value& a, const Value& b, std::string_view where) {
  if (op == "~") return Value(py_str(a) + py_str(b));
  if (op == "==") return Value(py_equal(a, b));
  if (op == "!=") return Value(!py_equal(a, b));
  if (op == "in" || op == "notin") {
    bool r = false;
    if (b.is_string()) {
      r = b.str().find(require_str(a, where, "the left operand of 'in'")) != std::string::npos;
    } else if (b.is_generator()) {  // consumed up to the item found
      for (Value x = b.next_item(); !r && !x.is_undefined(); x = r ? x : b.next_item()) r = py_equal(a, x);
    } else if (b.is_list()) {
      for (const Value& x : b.list()) r = r || py_equal(a, x);
    } else if (b.is_dict()) {
      require_hashable(a, where);
      r = b.dict().find_key(a) != nullptr;
    } else if (!b.is_undefined()) {
      type_error(where, cat("argument of type '", b.type_name(), "' is not iterable"));
    }
    return Value(op == "in" ? r : !r);
  }
  if (a.is_undefined()) undefined_error(a, where);
  if (b.is_undefined()) undefined_error(b, where);
  if (op == "<") return Value(py_less(a, b, where));
  if (op == ">") return Value(py_less(b, a, where));
  if (op == "<=") return Value(!py_less(b, a, where));
  if (op == ">=") return Value(!py_less(a, b, where));
  if (a.is_number() && b.is_number()) {
    const bool fl = a.is_float() || b.is_float();
    const int64_t x = a.as_int(), y = b.as_int();
    const double fx = a.as_float(), fy = b.as_float();
    if (op == "+") return fl ? Value(fx + fy) : Value(x + y);
    if (op == "-") return fl ? Value(fx - fy) : Value(x - y);
    if (op == "*") return fl ? Value(fx * fy) : Value(x * y);
    if (op == "/") {
      if (fy == 0) type_error(where, "division by zero");
      return Value(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fy == 0) type_error(where, "integer division or modulo by zero");
      if (fl) {
        const double q = std::floor(fx / fy);
        return op == "//" ? Value(q) : Value(fx - q * fy);
      }
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    if (op == "**") {
      if (!fl && y >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < y; ++k) r *= x;
        return Value(r);
      }
      return Value(std::pow(fx, fy));
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    // Markup + str escapes the str (and str + Markup), as markupsafe does
    if (a.is_markup() || b.is_markup())
      return Value::markup(escape_arg(a).str() + escape_arg(b).str());
    return Value(a.str() + b.str());
  }
  if (op == "+" && a.is_list() && b.is_list() && !a.is_generator() && !b.is_generator()) {
    List l = a.list();
    l.insert(l.end(), b.list().begin(), b.list().end());
    return Value(std::move(l));
  }
  if (op == "*" && (a.is_string() || (a.is_list() && !a.is_generator())) && (b.is_int() || b.is_bool())) {
    if (a.is_string()) {
      std::string s;
      for (int64_t k = 0; k < b.as_int(); ++k) s += a.str();
      return a.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
    }
    List l;
    for (int64_t k = 0; k < b.as_int(); ++k) l.insert(l.end(), a.list().begin(), a.list().end());
    return Value(std::move(l));
  }
  if (op == "%" && a.is_string()) type_error(where, "printf-style string formatting ('...' % x) is not supported");
  type_error(where, cat("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'"));
}

// ---- tests ----------------------------------------------------------------------------------------------

bool apply_test(const std::string& n, const Value& v, Args& a) {
  const std::string_view w = a.where;
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "boolean") return v.is_bool();
  if (n == "true") return v.is_bool() && v.as_bool();
  if (n == "false") return v.is_bool() && !v.as_bool();
  if (n == "integer") return v.is_int();
  if (n == "float") return v.is_float();
  if (n == "number") return v.is_number();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_dict();
  if (n == "sequence") return (v.is_list() && !v.is_generator()) || v.is_string() || v.is_dict();
  if (n == "iterable") return v.is_list() || v.is_string() || v.is_dict() || v.is_undefined();
  if (n == "callable") return v.is_function();
  if (n == "escaped") return v.is_markup();
  if (n == "lower") return v.is_string() && ascii_lower(v.str()) == v.str();
  if (n == "upper") return v.is_string() && ascii_upper(v.str()) == v.str();
  if (n == "odd" || n == "even") return (require_int(v, w, "the value") % 2 != 0) == (n == "odd");
  if (n == "divisibleby") {
    const int64_t d = require_int(a.get(0, "num"), w, "the divisor");
    if (d == 0) type_error(w, "division by zero");
    return require_int(v, w, "the value") % d == 0;
  }
  if (n == "filter") return v.is_string() && filter_supported(v.str());
  if (n == "test") return v.is_string() && test_supported(v.str());
  const Value o = a.get(0, "other");
  if (n == "eq" || n == "equalto" || n == "==") return py_equal(v, o);
  if (n == "ne") return !py_equal(v, o);
  if (n == "sameas") {
    if (v.is_none() || v.is_bool() || v.is_undefined()) return v.kind() == o.kind() && v.as_int() == o.as_int();
    return (v.is_dict() && o.is_dict() && v.dict_ptr() == o.dict_ptr()) || (v.is_list() && o.is_list() && &v.list() == &o.list());
  }
  if (n == "lt" || n == "lessthan") return py_less(v, o, w);
  if (n == "gt" || n == "greaterthan") return py_less(o, v, w);
  if (n == "le") return !py_less(o, v, w);
  if (n == "ge") return !py_less(v, o, w);
  if (n == "in") return binary_op("in", v, o, w).truthy();
  type_error(w, jinja2_has_test(n) ? cat("the test '", n, "' is not supported") : cat("no test named '", n, "'"));
}

// ---- filters --------------------------------------------------------------------------------------------

Value apply_filter(const std::string& n, const Value& v, Args& a) {
  const std::string_view w = a.where;
  if (n == "default" || n == "d") {
    a.expect(2, {"default_value", "boolean"});
    const bool boolean = a.get(1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value(""));
    return v;
  }
  if (n == "length" || n == "count") {
    if (v.is_generator()) type_error(w, "object of type 'generator' has no len()");
    if (v.is_string()) return Value(static_cast<int64_t>(cp_len(v.str())));
    if (v.is_list()) return Value(static_cast<int64_t>(v.list().size()));
    if (v.is_dict()) return Value(static_cast<int64_t>(v.dict().items.size()));
    if (v.is_undefined()) return Value(int64_t{0});
    type_error(w, cat("object of type '", v.type_name(), "' has no len()"));
  }
  // Markup in, Markup out for the filters that call a str method on their operand (jinja2's soft_str)
  auto like = [&v](std::string s) { return v.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s)); };
  if (n == "string") return like(py_str(v));
  if (n == "safe") return Value::markup(py_str(v));
  if (n == "e" || n == "escape") return v.is_markup() ? v : Value::markup(html_escape(py_str(v)));
  if (n == "upper") return like(ascii_upper(py_str(v)));
  if (n == "lower") return like(ascii_lower(py_str(v)));
  if (n == "capitalize") {
    std::string s = ascii_lower(py_str(v));
    if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
    return like(s);
  }
  if (n == "title") {  // jinja2: words split on runs of [-\s({\[<]; each word: first upper, rest lower
    const std::string s = py_str(v);
    std::string out;
    bool start = true;
    for (char c : s) {
      const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' || c == '\t' ||
                       c == '\n' || c == '\r' || c == '\f' || c == '\v';
      if (sep) {
        out.push_back(c);
        start = true;
        continue;
      }
      out.push_back(start ? ascii_upper(std::string(1, c))[0] : ascii_lower(std::string(1, c))[0]);
      start = false;
    }
    return Value(out);
  }
  if (n == "trim") {
    a.expect(1, {"chars"});
    const Value c = a.get(0, "chars", Value::none());
    if (c.is_none()) return like(py_strip(py_str(v), std::nullopt));
    const std::string chars = require_str(c, w, "trim's chars");
    return like(py_strip(py_str(v), std::string_view(chars)));
  }
  if (n == "replace") {
    Value m = str_method(Value(py_str(v)), "replace");
    return m.fn()(a);
  }
  if (n == "wordcount") return Value(static_cast<int64_t>(py_split(py_str(v), Value::none(), -1, false, w).size()));
  if (n == "int") return to_number(v, false, a.get(0, "default", Value(int64_t{0})));
  if (n == "float") return to_number(v, true, a.get(0, "default", Value(0.0)));
  if (n == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    const int64_t x = require_int(v, w, "abs's operand");
    return Value(x < 0 ? -x : x);
  }
  if (n == "round") {
    const int64_t prec = require_int(a.get(0, "precision", Value(int64_t{0})), w, "precision");
    const std::string method = py_str(a.get(1, "method", Value("common")));
    const double p = std::pow(10.0, static_cast<double>(prec)), x = v.as_float() * p;
    // Python's round(): halves to even
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value(r / p);
  }
  if (n == "list") return Value(iterate(v, w));
  if (n == "first" && v.is_generator()) {  // takes one item
    Value x = v.next_item();
    return x.is_undefined() ? Value::undefined("no first item, sequence was empty") : x;
  }
  if (n == "last" && v.is_generator()) type_error(w, "'generator' object is not reversible");
  if (n == "first" || n == "last") {
    List l = iterate(v, w);
    if (l.empty()) return Value::undefined(cat("no ", n, " item, sequence was empty"));
    return n == "first" ? l.front() : l.back();
  }
  if (n == "reverse") {  // a str reversed; a list or dict: an iterator (reversed()); a generator: a list
    if (v.is_string()) return slice(v, Value(), Value(), Value(int64_t{-1}), w);
    const bool gen = v.is_generator();
    List l = iterate(v, w);
    std::reverse(l.begin(), l.end());
    return gen ? Value(std::move(l)) : Value::generator(std::move(l));
  }
  if (n == "join") {
    a.expect(2, {"d", "attribute"});
    const std::string sep = py_str(a.get(0, "d", Value("")));
    const Value attr = a.get(1, "attribute", Value::none());
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v, w)) {
      if (!first) out += sep;
      first = false;
      out += py_str(attr.is_none() ? x : attribute_of(x, py_str(attr), w));
    }
    return Value(out);
  }
  if (n == "items") {
    if (v.is_undefined()) return Value::generator({});
    if (!v.is_dict()) type_error(w, cat("can only get item pairs from a mapping, not ", v.type_name()));
    return Value::generator(dict_method(v, "items").fn()(a).list());
  }
  if (n == "attr") return get_attr(v, require_str(a.get(0, "name"), w, "attr's name"), w);
  if (n == "tojson") {  // Hugging Face's: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    a.expect(4, {"ensure_ascii", "indent", "separators", "sort_keys"});
    JsonFormat f;
    f.ensure_ascii = a.get(0, "ensure_ascii", Value(false)).truthy();
    const Value ind = a.get(1, "indent", Value::none());
    if (!ind.is_none()) {
      f.indent = static_cast<int>(require_int(ind, w, "indent"));
      f.item_sep = ",";
    }
    const Value seps = a.get(2, "separators", Value::none());
    if (!seps.is_none()) {
      const List sl = iterate(seps, w);
      if (sl.size() != 2) type_error(w, cat("separators: expected 2 values to unpack, got ", sl.size()));
      f.item_sep = require_str(sl[0], w, "separators[0]");
      f.key_sep = require_str(sl[1], w, "separators[1]");
    }
    f.sort_keys = a.get(3, "sort_keys", Value(false)).truthy();
    return Value(to_json_text(v, f, w));
  }
  if (n == "indent") {
    a.expect(3, {"width", "first", "blank"});
    const Value wv = a.get(0, "width", Value(int64_t{4}));
    const std::string ind = wv.is_string() ? wv.str() : std::string(static_cast<size_t>(require_int(wv, w, "width")), ' ');
    const bool first = a.get(1, "first", Value(false)).truthy(), blank = a.get(2, "blank", Value(false)).truthy();
    Value lines_v = string_method(Value(py_str(v) + "\n"), "splitlines");
    Args none;
    none.where = w;
    const List lines = lines_v.fn()(none).list();
    std::string rv;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i].str();
      if (i > 0) rv += "\n";
      rv += (i > 0 && (blank || !l.empty())) ? ind + l : l;
    }
    if (first) rv = ind + rv;
    return like(rv);
  }
  // map, select, reject, selectattr, rejectattr: generators, empty (arguments unchecked) for a false operand
  if ((n == "map" || n == "select" || n == "reject" || n == "selectattr" || n == "rejectattr") && !v.truthy())
    return Value::generator({});
  if (n == "map") {
    List out;
    const Value attr = a.get(99, "attribute", Value());
    if (!attr.is_undefined()) {
      const Value dflt = a.get(99, "default", Value());
      for (const Value& x : iterate(v, w)) {
        Value r = attribute_of(x, py_str(attr), w);
        out.push_back(r.is_undefined() && !dflt.is_undefined() ? dflt : r);
      }
      return Value::generator(std::move(out));
    }
    if (a.pos.empty()) type_error(w, "map() needs a filter name or attribute=");
    const std::string f = require_str(a.pos[0], w, "map's filter");
    if (!filter_supported(f)) type_error(w, cat("the filter '", f, "' is not supported"));
    Args rest;
    rest.where = w;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& x : iterate(v, w)) out.push_back(apply_filter(f, x, rest));
    return Value::generator(std::move(out));
  }
  if (n == "select" || n == "reject" || n == "selectattr" || n == "rejectattr") {
    const bool attr = n.size() > 6, keep = n[0] == 's';
    size_t k = 0;
    std::string attribute;
    if (attr) attribute = require_str(a.get(k++, "attribute"), w, "the attribute");
    std::string test;
    if (k < a.pos.size()) test = require_str(a.pos[k++], w, "the test name");
    if (!test.empty() && !test_supported(test)) type_error(w, cat("the test '", test, "' is not supported"));
    Args rest;
    rest.where = w;
    if (k < a.pos.size()) rest.pos.assign(a.pos.begin() + static_cast<long>(k), a.pos.end());
    rest.kw = a.kw;
    List out;
    for (const Value& x : iterate(v, w)) {
      const Value y = attr ? attribute_of(x, attribute, w) : x;
      const bool ok = test.empty() ? y.truthy() : apply_test(test, y, rest);
      if (ok == keep) out.push_back(x);
    }
    return Value::generator(std::move(out));
  }
  if (n == "sort" || n == "unique" || n == "min" || n == "max") {
    const bool cs = a.get(n == "sort" ? 1 : 0, "case_sensitive", Value(false)).truthy();
    const Value attribute = a.get(n == "sort" ? 2 : 1, "attribute", Value::none());
    List l = iterate(v, w);
    if (n == "unique") {
      List out, keys;
      for (const Value& x : l) {
        const Value key = sort_key(x, attribute, cs, w);
        bool seen = false;
        for (const Value& s : keys) seen = seen || py_equal(s, key);
        if (!seen) {
          keys.push_back(key);
          out.push_back(x);
        }
      }
      return Value::generator(std::move(out));
    }
    std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
      return py_less(sort_key(x, attribute, cs, w), sort_key(y, attribute, cs, w), w);
    });
    if (n == "min") return l.empty() ? Value::undefined("no min item, sequence was empty") : l.front();
    if (n == "max") {
      if (l.empty()) return Value::undefined("no max item, sequence was empty");
      // Python's max returns the first maximal item
      size_t i = l.size() - 1;
      while (i > 0 && !py_less(sort_key(l[i - 1], attribute, cs, w), sort_key(l[i], attribute, cs, w), w)) --i;
      return l[i];
    }
    if (a.get(0, "reverse", Value(false)).truthy()) {
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        return py_less(sort_key(y, attribute, cs, w), sort_key(x, attribute, cs, w), w);
      });
    }
    return Value(std::move(l));
  }
  if (n == "dictsort") {  // (key, value) pairs sorted by key (or by="value"), case-insensitive by default
    if (!v.is_dict()) type_error(w, cat("dictsort expects a mapping, not ", v.type_name()));
    a.expect(3, {"case_sensitive", "by", "reverse"});
    const bool cs = a.get(0, "case_sensitive", Value(false)).truthy();
    const bool by_value = py_str(a.get(1, "by", Value("key"))) == "value";
    const bool rev = a.get(2, "reverse", Value(false)).truthy();
    List l;
    for (const auto& [k, x] : v.dict().items) l.push_back(Value::tuple(List{k, x}));
    auto key = [&](const Value& p) { return sort_key(p.list()[by_value ? 1 : 0], Value::none(), cs, w); };
    std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
      return rev ? py_less(key(y), key(x), w) : py_less(key(x), key(y), w);
    });
    return Value(std::move(l));
  }
  if (n == "sum") {
    const Value attribute = a.get(0, "attribute", Value::none());
    Value acc = a.get(1, "start", Value(int64_t{0}));
    for (const Value& x : iterate(v, w))
      acc = binary_op("+", acc, attribute.is_none() ? x : attribute_of(x, py_str(attribute), w), w);
    return acc;
  }
  type_error(w, jinja2_has_filter(n) ? cat("the filter '", n, "' is not supported") : cat("no filter named '", n, "'"));
}

// ---- Python str.strip ------------------------------------------------------------------------------------

bool py_isspace(uint32_t c) {
  if (c >= 0x09 && c <= 0x0D) return true;
  if (c >= 0x1C && c <= 0x20) return true;
  if (c == 0x85 || c == 0xA0 || c == 0x1680) return true;
  if (c >= 0x2000 && c <= 0x200A) return true;
  return c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(std::string_view s, const std::optional<std::string_view>& chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars) {
    for (size_t i = 0; i < chars->size();) set.push_back(next_cp(*chars, i));
  }
  auto strip_cp = [&](uint32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c); };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t i = b;
      if (!strip_cp(next_cp(s, i))) break;
      b = i;
    }
  }
  if (right) {
    while (e > b) {
      size_t p = e - 1;
      while (p > b && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;
      size_t i = p;
      if (!strip_cp(next_cp(s, i)) || i != e) break;
      e = p;
    }
  }
  return std::string(s.substr(b, e - b));
}

}  // namespace dflash::jinja
