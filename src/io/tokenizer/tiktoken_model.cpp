// io/tokenizer/tiktoken_model.cpp — see tiktoken_model.h.
#include "io/tokenizer/tiktoken_model.h"

#include <cctype>
#include <climits>
#include <functional>
#include <map>

#include "core/fs.h"
#include "core/sha256.h"

namespace dflash::tok {

namespace {

// RFC 4648 base64 with padding, as Python's base64.b64decode reads it (no whitespace inside a token).
bool base64_decode(std::string_view s, std::string& out) {
  out.clear();
  if (s.size() % 4 != 0) return false;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < s.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i + static_cast<size_t>(k)];
      if (c == '=' && i + 4 == s.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else {
        if (pad > 0) return false;  // '=' only at the end
        v[k] = val(c);
        if (v[k] < 0) return false;
      }
    }
    const uint32_t n = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xFF));
  }
  return true;
}

std::vector<std::string> read_ranks(const std::string& path, const std::string& bytes) {
  std::vector<std::string> tokens;
  std::vector<bool> seen;
  std::map<std::string, size_t> line_of;  // token bytes -> line (for duplicate errors)
  size_t line = 0;
  std::string tok;
  for (size_t pos = 0; pos < bytes.size();) {
    size_t eol = bytes.find('\n', pos);
    if (eol == std::string::npos) eol = bytes.size();
    std::string_view l(bytes.data() + pos, eol - pos);
    pos = eol + 1;
    ++line;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.empty()) continue;
    const size_t sp = l.find(' ');
    DFLASH_CHECK(sp != std::string_view::npos && l.find(' ', sp + 1) == std::string_view::npos, path, ":", line,
                 ": expected \"<base64 token> <rank>\", got \"", std::string(l.substr(0, 80)), "\"");
    DFLASH_CHECK(base64_decode(l.substr(0, sp), tok) && !tok.empty(), path, ":", line, ": \"",
                 std::string(l.substr(0, std::min<size_t>(sp, 80))), "\" is not a base64 token");
    const std::string_view r = l.substr(sp + 1);
    int64_t rank = 0;
    bool ok = !r.empty() && r.size() <= 10;
    for (char c : r) {
      ok = ok && c >= '0' && c <= '9';
      if (ok) rank = rank * 10 + (c - '0');
    }
    DFLASH_CHECK(ok && rank < INT32_MAX, path, ":", line, ": rank \"", std::string(r.substr(0, 20)),
                 "\" is not a non-negative integer");
    const size_t u = static_cast<size_t>(rank);
    if (u >= tokens.size()) {
      tokens.resize(u + 1);
      seen.resize(u + 1, false);
    }
    DFLASH_CHECK(!seen[u], path, ":", line, ": rank ", rank, " is given twice");
    auto [it, fresh] = line_of.emplace(tok, line);
    DFLASH_CHECK(fresh, path, ":", line, ": the token of line ", it->second, " again");
    seen[u] = true;
    tokens[u] = tok;
  }
  DFLASH_CHECK(!tokens.empty(), path, ": no tokens");
  for (size_t i = 0; i < seen.size(); ++i)
    DFLASH_CHECK(seen[i], path, ": no token has rank ", i, " (the ranks must be 0 .. ", seen.size() - 1,
                 ", each once: they are the ids)");
  for (int b = 0; b < 256; ++b)
    DFLASH_CHECK(line_of.count(std::string(1, static_cast<char>(b))), path, ": no token for the single byte ", b,
                 " (a byte-level BPE vocabulary has all 256)");
  return tokens;
}

// A Python string literal at s[i] (prefix r/R/u/U/b? and ', ", ''' or """); raw only, or without backslashes.
bool py_literal(std::string_view s, size_t& i, std::string& out) {
  size_t j = i;
  bool raw = false;
  while (j < s.size() && std::string_view("rRuU").find(s[j]) != std::string_view::npos) raw |= (s[j++] | 0x20) == 'r';
  if (j >= s.size() || (s[j] != '"' && s[j] != '\'')) return false;
  const std::string q = s.substr(j, 3) == std::string(3, s[j]) ? std::string(3, s[j]) : std::string(1, s[j]);
  const size_t a = j + q.size();
  const size_t b = s.find(q, a);
  if (b == std::string_view::npos) return false;
  out.assign(s.substr(a, b - a));
  if (!raw && out.find('\\') != std::string::npos) return false;
  i = b + q.size();
  return true;
}

void skip_py_space(std::string_view s, size_t& i) {
  while (i < s.size()) {
    if (s[i] == '#') {
      while (i < s.size() && s[i] != '\n') ++i;
    } else if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\\') {
      ++i;
    } else {
      break;
    }
  }
}

// pat_str = "|".join([lit, lit, ...])  or  pat_str = lit [lit ...]  or  pat_str = (lit lit ...)
std::string read_pat_str(std::string_view py, const std::string& W) {
  size_t at = std::string_view::npos;
  for (size_t p = py.find("pat_str"); p != std::string_view::npos; p = py.find("pat_str", p + 1)) {
    size_t q = p + 7;
    while (q < py.size() && (py[q] == ' ' || py[q] == '\t')) ++q;
    const bool word_start = p == 0 || !(std::isalnum(static_cast<unsigned char>(py[p - 1])) || py[p - 1] == '_' ||
                                        py[p - 1] == '.');
    if (word_start && q < py.size() && py[q] == '=' && (q + 1 >= py.size() || py[q + 1] != '=')) {
      at = q + 1;
      break;
    }
  }
  DFLASH_CHECK(at != std::string_view::npos, W, ": no `pat_str = ...` assignment (the split regex)");
  size_t i = at;
  skip_py_space(py, i);
  std::string lit, joined;
  auto fail = [&]() { DFLASH_FAIL(W, ": pat_str: expected \"|\".join([r\"...\", ...]) or raw string literals"); };
  if (py.substr(i, 9) == "\"|\".join(" || py.substr(i, 9) == "'|'.join(") {
    i += 9;
    skip_py_space(py, i);
    if (i >= py.size() || py[i] != '[') fail();
    ++i;
    bool first = true;
    for (;;) {
      skip_py_space(py, i);
      if (i < py.size() && py[i] == ']') break;
      if (!py_literal(py, i, lit)) fail();
      // adjacent literals concatenate
      for (std::string more;;) {
        size_t k = i;
        skip_py_space(py, k);
        if (!py_literal(py, k, more)) break;
        lit += more;
        i = k;
      }
      joined += first ? lit : "|" + lit;
      first = false;
      skip_py_space(py, i);
      if (i < py.size() && py[i] == ',') ++i;
    }
    if (first) fail();
    return joined;
  }
  const bool paren = i < py.size() && py[i] == '(';
  if (paren) ++i;
  for (bool first = true;; first = false) {
    if (paren || first) {
      skip_py_space(py, i);
    } else {  // adjacent literals continue on the same line only, outside parentheses
      while (i < py.size() && (py[i] == ' ' || py[i] == '\t')) ++i;
    }
    if (!py_literal(py, i, lit)) break;
    joined += lit;
  }
  if (paren) {
    skip_py_space(py, i);
    if (i >= py.size() || py[i] != ')') fail();
  } else if (i < py.size() && py[i] != '\n' && py[i] != '\r' && py[i] != '#') {
    fail();  // an expression goes on: not a plain literal
  }
  if (joined.empty()) fail();
  return joined;
}

// The number of special ids: num_reserved_special_tokens = N, plus K in range(..., num_base_tokens +
// self.num_reserved_special_tokens + K).
int64_t read_special_count(std::string_view py, const std::string& W) {
  auto int_after = [&](size_t p, int64_t& v) {
    while (p < py.size() && (py[p] == ' ' || py[p] == '\t')) ++p;
    size_t d = p;
    v = 0;
    while (d < py.size() && d - p < 9 && py[d] >= '0' && py[d] <= '9') v = v * 10 + (py[d++] - '0');
    return d > p;
  };
  int64_t n = -1;
  const std::string_view key = "num_reserved_special_tokens";
  for (size_t p = py.find(key); p != std::string_view::npos && n < 0; p = py.find(key, p + 1)) {
    size_t q = p + key.size();
    while (q < py.size() && (py[q] == ' ' || py[q] == '\t')) ++q;
    if (q + 1 < py.size() && py[q] == '=' && py[q + 1] != '=' && !int_after(q + 1, n)) n = -1;
  }
  DFLASH_CHECK(n >= 0, W, ": no `num_reserved_special_tokens = <number>`");
  // num_base_tokens + self.num_reserved_special_tokens [+ K], spaces and line breaks allowed around the '+'
  auto blank = [&](size_t& q) {
    while (q < py.size() && (py[q] == ' ' || py[q] == '\t' || py[q] == '\n' || py[q] == '\r')) ++q;
  };
  const std::string_view base = "num_base_tokens", sum = "self.num_reserved_special_tokens";
  int64_t extra = -1;
  for (size_t p = py.find(base); p != std::string_view::npos && extra < 0; p = py.find(base, p + 1)) {
    size_t q = p + base.size();
    blank(q);
    if (q >= py.size() || py[q] != '+') continue;
    ++q;
    blank(q);
    if (py.substr(q, sum.size()) != sum) continue;
    q += sum.size();
    blank(q);
    extra = 0;
    if (q < py.size() && py[q] == '+')
      DFLASH_CHECK(int_after(q + 1, extra), W, ": num_base_tokens + self.num_reserved_special_tokens + ?");
  }
  DFLASH_CHECK(extra >= 0, W,
               ": no `num_base_tokens + self.num_reserved_special_tokens` (the range of special ids)");
  DFLASH_CHECK(py.find("<|reserved_token_{i}|>") != std::string_view::npos, W,
               ": reserved special tokens are not named \"<|reserved_token_{i}|>\" (the only naming dflash knows)");
  return n + extra;
}

bool is_gc_abbrev(std::string_view n) {
  static const char* const kGc[] = {"L",  "Lu", "Ll", "Lt", "Lm", "Lo", "LC", "L&", "M",  "Mn", "Mc", "Me", "N",
                                    "Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm",
                                    "Sc", "Sk", "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn"};
  for (const char* g : kGc)
    if (n == g) return true;
  return false;
}

// \p{...} / \P{...}: the name translated (see the header).
std::string translate_property(std::string_view name, const std::string& W) {
  const size_t eq = name.find_first_of("=:");
  if (eq != std::string_view::npos) {
    const std::string_view k = name.substr(0, eq), v = name.substr(eq + 1);
    if (k == "Script" || k == "sc") return cat("sc:", v);
    if (k == "Script_Extensions" || k == "scx") return cat("scx:", v);
    if (k == "General_Category" || k == "gc") return std::string(v);
    DFLASH_FAIL(W, ": pat_str: the property \\p{", name, "} is not supported (Script, Script_Extensions, "
                "General_Category)");
  }
  if (is_gc_abbrev(name)) return std::string(name);
  return cat("sc:", name);
}

}  // namespace

bool python_isspace(int32_t cp) { return is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

std::string rust_regex_to_pcre2(std::string_view re, const std::string& W) {
  std::string out;
  // An escape at re[i] ('\\'): appends its translation, returns the index after it.
  auto escape = [&](size_t i, std::string& dst) -> size_t {
    DFLASH_CHECK(i + 1 < re.size(), W, ": pat_str ends with a backslash");
    const char c = re[i + 1];
    if ((c == 'p' || c == 'P') && i + 2 < re.size() && re[i + 2] == '{') {
      const size_t e = re.find('}', i + 3);
      DFLASH_CHECK(e != std::string_view::npos, W, ": pat_str: unterminated \\", c, "{");
      dst += cat('\\', c, '{', translate_property(re.substr(i + 3, e - i - 3), W), '}');
      return e + 1;
    }
    dst.append(re.substr(i, 2));
    return i + 2;
  };
  // The class at re[i] == '[': a plain class (body, negated) or an intersection (its PCRE2 group, in `group`).
  // Returns the index after its closing ']'.
  struct Class {
    std::string body, group;
    bool negated = false;
  };
  std::function<size_t(size_t, Class&)> parse_class = [&](size_t i, Class& cl) -> size_t {
    ++i;
    if (i < re.size() && re[i] == '^') {
      cl.negated = true;
      ++i;
    }
    std::vector<std::string> ops;  // the operands of &&, each a PCRE2 class
    std::string items;             // the current operand: items and inlined nested classes
    std::string sole;              // ... or one nested class alone (negated or not)
    int parts = 0;                 // items / nested classes in the current operand
    auto close_operand = [&]() {
      DFLASH_CHECK(parts > 0, W, ": pat_str: an empty operand of && in a character class");
      ops.push_back(parts == 1 && !sole.empty() ? sole : cat('[', items, ']'));
      items.clear();
      sole.clear();
      parts = 0;
    };
    for (bool first = true;; first = false) {
      DFLASH_CHECK(i < re.size(), W, ": pat_str: unterminated character class");
      const char c = re[i];
      if (c == ']' && !first) {
        ++i;
        break;
      }
      if (c == '\\') {
        i = escape(i, items);
        ++parts;
      } else if (c == '[' && i + 1 < re.size() && re[i + 1] == ':') {  // [:alpha:]
        const size_t e = re.find(":]", i + 2);
        DFLASH_CHECK(e != std::string_view::npos, W, ": pat_str: unterminated [: :]");
        items.append(re.substr(i, e + 2 - i));
        i = e + 2;
        ++parts;
      } else if (c == '[') {
        Class inner;
        i = parse_class(i, inner);
        DFLASH_CHECK(inner.group.empty(), W, ": pat_str: an intersection nested in a class is not supported");
        sole = cat('[', inner.negated ? "^" : "", inner.body, ']');
        if (!inner.negated) items += inner.body;
        ++parts;
        DFLASH_CHECK(!inner.negated || parts == 1, W,
                     ": pat_str: a negated class in a union is not supported (only as an operand of &&)");
      } else if (c == '&' && i + 1 < re.size() && re[i + 1] == '&') {
        close_operand();
        i += 2;
      } else if ((c == '-' || c == '~') && i + 1 < re.size() && re[i + 1] == c) {
        DFLASH_FAIL(W, ": pat_str: class difference / symmetric difference (", c, c, ") is not supported");
      } else {
        items.push_back(c);
        ++i;
        ++parts;
      }
      if (parts > 1 && !sole.empty() && sole[1] == '^')
        DFLASH_FAIL(W, ": pat_str: a negated class in a union is not supported (only as an operand of &&)");
    }
    if (ops.empty()) {  // no intersection: a plain class
      DFLASH_CHECK(parts > 0, W, ": pat_str: an empty character class");
      if (parts == 1 && !sole.empty() && sole[1] == '^') {
        DFLASH_CHECK(!cl.negated, W, ": pat_str: a doubly negated class is not supported");
        cl.negated = true;
        cl.body = sole.substr(2, sole.size() - 3);
      } else {
        cl.body = items;
      }
      return i;
    }
    close_operand();
    DFLASH_CHECK(!cl.negated, W, ": pat_str: a negated class intersection is not supported");
    cl.group = "(?:";
    for (size_t k = 1; k < ops.size(); ++k) cl.group += cat("(?=", ops[k], ")");
    cl.group += ops[0] + ")";
    return i;
  };
  for (size_t i = 0; i < re.size();) {
    const char c = re[i];
    if (c == '\\') {
      i = escape(i, out);
    } else if (c == '[') {
      Class cl;
      i = parse_class(i, cl);
      out += cl.group.empty() ? cat('[', cl.negated ? "^" : "", cl.body, ']') : cl.group;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

TiktokenModel TiktokenModel::load(const std::string& dir, const json& config) {
  TiktokenModel m;
  const std::string model_path = path_join(dir, "tiktoken.model");
  const std::string py_path = path_join(dir, "tokenization_kimi.py");
  const std::string cfg_path = path_join(dir, "tokenizer_config.json");  // for messages
  const std::string bytes = read_file(model_path);
  m.tokens = read_ranks(model_path, bytes);

  DFLASH_CHECK(file_exists(py_path), dir, ": tiktoken.model without tokenization_kimi.py: dflash reads the split ",
               "regex (pat_str) and the number of special tokens from it");
  const std::string py = read_file(py_path);
  m.pat_str = read_pat_str(py, py_path);
  const int64_t nspecial = read_special_count(py, py_path);
  m.pattern = rust_regex_to_pcre2(m.pat_str, py_path);
  Regex check(m.pattern, py_path + ": pat_str");  // fails here, naming the file, if PCRE2 rejects it
  (void)check;

  const int64_t base = static_cast<int64_t>(m.tokens.size());
  std::map<int64_t, AddedToken> given;
  const json* decoder = nullptr;
  if (config.is_object()) {
    if (auto it = config.find("added_tokens_decoder"); it != config.end() && !it->is_null()) decoder = &*it;
  }
  if (decoder) {
    const json& d = *decoder;
    DFLASH_CHECK(d.is_object(), cfg_path, ": added_tokens_decoder: expected an object of id -> token");
    for (const auto& [key, v] : d.items()) {
      const std::string AW = cat(cfg_path, ": added_tokens_decoder[\"", key, "\"]");
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
      }
      DFLASH_CHECK(id >= base && id < base + nspecial, AW, ": the id is not one of the special ids ", base, " .. ",
                   base + nspecial - 1, " (tiktoken.model has ", base, " tokens; ", py_path, " gives ", nspecial,
                   " special ids after them)");
      DFLASH_CHECK(v.is_object(), AW, ": expected an object");
      const json& content = field(v, "content", AW);
      DFLASH_CHECK(content.is_string() && !content.get<std::string>().empty(), AW,
                   ".content: expected a non-empty string");
      AddedToken t;
      t.content = content.get<std::string>();
      t.id = static_cast<int32_t>(id);
      t.special = opt_bool(v, "special", true, AW);
      t.lstrip = opt_bool(v, "lstrip", false, AW);
      t.rstrip = opt_bool(v, "rstrip", false, AW);
      t.single_word = opt_bool(v, "single_word", false, AW);
      t.normalized = false;  // no normalizer: one matcher over the raw text
      given[id] = std::move(t);
    }
  }
  std::string ident = bytes;
  ident += "\n" + m.pat_str + "\n";
  for (int64_t id = base; id < base + nspecial; ++id) {
    AddedToken t;
    if (auto it = given.find(id); it != given.end()) {
      t = it->second;
    } else {
      t.content = cat("<|reserved_token_", id, "|>");
      t.id = static_cast<int32_t>(id);
      t.special = true;
    }
    ident += cat(id, t.special ? " special " : " ", t.content, "\n");
    m.specials.push_back(std::move(t));
  }
  m.hash = sha256_hex(ident);
  return m;
}

json TiktokenModel::pre_tokenizer_json() const {
  return json{{"type", "Sequence"},
              {"pretokenizers",
               json::array({json{{"type", "Split"},
                                 {"pattern", json{{"Regex", pattern}}},
                                 {"behavior", "Isolated"},
                                 {"invert", false}},
                            json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

json TiktokenModel::decoder_json() { return json{{"type", "ByteLevel"}}; }

}  // namespace dflash::tok
