// io/chat_template.cpp — see chat_template.h for the rendering and loss-mask rules.
#include "io/chat_template.h"

#include <algorithm>
#include <cstring>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "io/tokenizer.h"
#include "io/unicode_nfc.h"

namespace dflash {

namespace {

// ---- UTF-8 helpers ---------------------------------------------------------------------------------------

// Decodes the code point at s[i] and advances i. An invalid byte decodes as itself (0x80..0xFF), length 1.
uint32_t next_cp(std::string_view s, size_t& i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80; };
  auto cb = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k]) & 0x3F); };
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  if ((b0 & 0xE0) == 0xC0 && b0 >= 0xC2 && cont(1)) {
    uint32_t c = ((b0 & 0x1Fu) << 6) | cb(1);
    i += 2;
    return c;
  }
  if ((b0 & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    uint32_t c = ((b0 & 0x0Fu) << 12) | (cb(1) << 6) | cb(2);
    if (c >= 0x800 && (c < 0xD800 || c > 0xDFFF)) {
      i += 3;
      return c;
    }
  }
  if ((b0 & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    uint32_t c = ((b0 & 0x07u) << 18) | (cb(1) << 12) | (cb(2) << 6) | cb(3);
    if (c >= 0x10000 && c <= 0x10FFFF) {
      i += 4;
      return c;
    }
  }
  i += 1;
  return b0;
}

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

// Python's str.isspace() (Unicode 14): bidi class WS, B or S, or general category Zs.
bool py_isspace(uint32_t c) {
  if (c >= 0x09 && c <= 0x0D) return true;
  if (c >= 0x1C && c <= 0x20) return true;
  if (c == 0x85 || c == 0xA0 || c == 0x1680) return true;
  if (c >= 0x2000 && c <= 0x200A) return true;
  return c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_blank(std::string_view s) { return py_strip(s, std::nullopt).empty(); }

bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

// Python: s.split(sep)[0] and s.split(sep)[-1].
std::string_view split_first(std::string_view s, std::string_view sep) {
  size_t p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view split_last(std::string_view s, std::string_view sep) {
  size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

// Unescapes a Jinja string literal body (the escapes that occur in chat templates).
std::string jinja_unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char c = s[++i];
      switch (c) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        default: out.push_back(c); break;
      }
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The default system text a ChatML template writes when the conversation has no system message, read from a
// literal '<|im_start|>system\n<text><|im_end|>' in its source ("" when there is none).
std::string chatml_default_system(std::string_view jinja) {
  static const std::regex re(R"(<\|im_start\|>system\\n([^'"<]+?)<\|im_end\|>)");
  std::match_results<std::string_view::const_iterator> m;
  if (std::regex_search(jinja.begin(), jinja.end(), m, re)) return jinja_unescape(std::string(m[1].first, m[1].second));
  return "";
}

std::string llama_date_string(std::string_view jinja) {
  static const std::regex re(R"(set\s+date_string\s*=\s*["']([^"']+)["'])");
  std::match_results<std::string_view::const_iterator> m;
  if (std::regex_search(jinja.begin(), jinja.end(), m, re)) return std::string(m[1].first, m[1].second);
  return "26 Jul 2024";
}

bool is_qwen3_source(std::string_view j) {
  return contains(j, "<|im_start|>") && contains(j, "</think>") && contains(j, "last_query_index") &&
         contains(j, "reasoning_content");
}

// ---- rendering ---------------------------------------------------------------------------------------------

class Builder {
 public:
  void add(std::string_view s, bool supervised) {
    if (s.empty()) return;
    size_t b = r_.text.size();
    r_.text.append(s);
    if (!r_.segments.empty() && r_.segments.back().supervised == supervised) {
      r_.segments.back().end = r_.text.size();
    } else {
      r_.segments.push_back({b, r_.text.size(), supervised});
    }
  }
  RenderedChat take() { return std::move(r_); }

 private:
  RenderedChat r_;
};

void check_role(const ChatMessage& m, size_t i) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant") {
    throw BadRow("unknown_role", cat("message ", i, ": unknown role \"", m.role, "\" (system, user, assistant)"));
  }
}

void render_chatml(const ChatTemplate& t, std::span<const ChatMessage> ms, const ChatOptions& o, Builder& b) {
  size_t start = 0;
  if (!ms.empty() && ms[0].role == "system") {
    b.add(cat("<|im_start|>system\n", ms[0].content, "<|im_end|>\n"), false);
    start = 1;
  } else if (!t.default_system.empty()) {
    b.add(cat("<|im_start|>system\n", t.default_system, "<|im_end|>\n"), false);
  }
  for (size_t i = start; i < ms.size(); ++i) {
    const ChatMessage& m = ms[i];
    if (m.role == "assistant") {
      b.add("<|im_start|>assistant\n", false);
      b.add(m.content, true);
      b.add("<|im_end|>", true);
      b.add("\n", false);
    } else {
      b.add(cat("<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"), false);
    }
  }
  if (o.add_generation_prompt) b.add("<|im_start|>assistant\n", false);
}

void render_qwen3(std::span<const ChatMessage> ms, const ChatOptions& o, Builder& b) {
  const size_t n = ms.size();
  if (n > 0 && ms[0].role == "system") b.add(cat("<|im_start|>system\n", ms[0].content, "<|im_end|>\n"), false);
  // The last user message that is not a tool response (the template's ns.last_query_index).
  size_t last_query = n == 0 ? 0 : n - 1;
  for (size_t k = n; k-- > 0;) {
    const std::string& c = ms[k].content;
    bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (ms[k].role == "user" && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = ms[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      b.add(cat("<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"), false);
    } else if (m.role == "assistant") {
      std::string content = m.content;
      std::string reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (contains(m.content, "</think>")) {
        content = py_strip(split_last(m.content, "</think>"), "\n", true, false);
        std::string before = py_strip(split_first(m.content, "</think>"), "\n", false, true);
        reasoning = py_strip(split_last(before, "<think>"), "\n", true, false);
      }
      b.add("<|im_start|>assistant\n", false);
      if (i > last_query && (i == n - 1 || !reasoning.empty())) {
        std::string r = py_strip(reasoning, "\n");
        b.add(cat("<think>\n", r, "\n</think>\n\n"), !r.empty());
        b.add(py_strip(content, "\n", true, false), true);
      } else {
        b.add(content, true);
      }
      b.add("<|im_end|>", true);
      b.add("\n", false);
    }
  }
  if (o.add_generation_prompt) {
    b.add("<|im_start|>assistant\n", false);
    if (!o.enable_thinking) b.add("<think>\n\n</think>\n\n", false);
  }
}

void render_llama3(const ChatTemplate& t, std::span<const ChatMessage> ms, const ChatOptions& o, Builder& b) {
  size_t start = 0;
  if (t.llama_system_block) {
    b.add(t.bos_token, false);
    std::string sys;
    if (!ms.empty() && ms[0].role == "system") {
      sys = py_strip(ms[0].content, std::nullopt);
      start = 1;
    }
    b.add(cat("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ",
              t.date_string, "\n\n", sys, "<|eot_id|>"),
          false);
  }
  for (size_t i = start; i < ms.size(); ++i) {
    const ChatMessage& m = ms[i];
    if (i == 0 && !t.llama_system_block) b.add(t.bos_token, false);
    b.add(cat("<|start_header_id|>", m.role, "<|end_header_id|>\n\n"), false);
    const bool sup = m.role == "assistant";
    b.add(py_strip(m.content, std::nullopt), sup);
    b.add("<|eot_id|>", sup);
  }
  if (o.add_generation_prompt) b.add("<|start_header_id|>assistant<|end_header_id|>\n\n", false);
}

// GPT-2 byte-level alphabet: code point -> byte (-1 where the code point is not in the alphabet).
const std::vector<int>& byte_decoder() {
  static const std::vector<int> dec = [] {
    std::vector<int> d(512, -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      if (direct) {
        d[b] = b;
      } else {
        d[256 + n] = b;
        ++n;
      }
    }
    return d;
  }();
  return dec;
}

// Token start offsets of `ids` in `text`, or nullopt when the token bytes do not reproduce text exactly.
// On mismatch *bad_at is the byte offset where they first differ.
std::optional<std::vector<size_t>> token_starts(const ChatEncoder& enc, const std::vector<int32_t>& ids,
                                                std::string_view text, size_t* bad_at) {
  std::vector<size_t> starts(ids.size());
  size_t pos = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string_view tb = enc.token_bytes(ids[i]);
    starts[i] = pos;
    if (tb.empty() || pos + tb.size() > text.size() || std::memcmp(text.data() + pos, tb.data(), tb.size()) != 0) {
      *bad_at = pos;
      return std::nullopt;
    }
    pos += tb.size();
  }
  if (pos != text.size()) {
    *bad_at = pos;
    return std::nullopt;
  }
  return starts;
}

std::vector<uint8_t> mask_from_starts(const std::vector<size_t>& starts, const RenderedChat& r) {
  std::vector<uint8_t> mask(starts.size(), 0);
  size_t s = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    while (s < r.segments.size() && r.segments[s].end <= starts[i]) ++s;
    mask[i] = s < r.segments.size() && r.segments[s].supervised ? 1 : 0;
  }
  return mask;
}

std::string snippet(std::string_view s, size_t at) {
  size_t b = at >= 20 ? at - 20 : 0;
  return nlohmann::json(std::string(s.substr(b, 40))).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

// ---- public API ----------------------------------------------------------------------------------------

std::string py_strip(std::string_view s, const std::optional<std::string_view>& chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars) {
    for (size_t i = 0; i < chars->size();) set.push_back(next_cp(*chars, i));
  }
  auto strip_cp = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
  };
  std::vector<std::pair<uint32_t, size_t>> cps;  // code point, byte offset
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    cps.emplace_back(next_cp(s, i), at);
  }
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_cp(cps[b].first)) ++b;
  }
  if (right) {
    while (e > b && strip_cp(cps[e - 1].first)) --e;
  }
  const size_t bb = b < cps.size() ? cps[b].second : s.size();
  const size_t eb = e < cps.size() ? cps[e].second : s.size();
  return std::string(s.substr(bb, eb - bb));
}

std::vector<ChatMessage> parse_messages(const nlohmann::json& j) {
  if (!j.is_array()) throw BadRow("bad_message", "\"messages\" is not an array");
  std::vector<ChatMessage> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& m = j[i];
    if (!m.is_object()) throw BadRow("bad_message", cat("message ", i, " is not an object"));
    auto r = m.find("role");
    if (r == m.end() || !r->is_string()) throw BadRow("bad_message", cat("message ", i, ": \"role\" is not a string"));
    ChatMessage cm;
    cm.role = r->get<std::string>();
    check_role(cm, i);
    auto c = m.find("content");
    if (c == m.end() || !c->is_string()) {
      throw BadRow("bad_message", cat("message ", i, " (", cm.role, "): \"content\" is missing or not a string"));
    }
    cm.content = c->get<std::string>();
    auto tc = m.find("tool_calls");
    if (tc != m.end() && !tc->is_null() && !(tc->is_array() && tc->empty())) {
      throw BadRow("unsupported_tool_calls", cat("message ", i, ": tool_calls are not supported"));
    }
    auto rc = m.find("reasoning_content");
    if (rc != m.end() && !rc->is_null()) {
      if (!rc->is_string()) throw BadRow("bad_message", cat("message ", i, ": \"reasoning_content\" is not a string"));
      cm.reasoning_content = rc->get<std::string>();
    }
    out.push_back(std::move(cm));
  }
  return out;
}

void validate_conversation(std::span<const ChatMessage> ms, bool allow_no_assistant) {
  if (ms.empty()) throw BadRow("empty_messages", "the conversation has no messages");
  for (size_t i = 0; i < ms.size(); ++i) check_role(ms[i], i);
  size_t first = 0;
  while (first < ms.size() && ms[first].role == "system") ++first;
  if (first == ms.size()) throw BadRow("system_only", "the conversation has only system messages");
  for (size_t i = 1; i < ms.size(); ++i) {
    if (ms[i].role == "system") {
      throw BadRow("not_alternating", cat("message ", i, " is a system message; only the first may be"));
    }
  }
  if (ms[first].role == "assistant") {
    throw BadRow("assistant_first", cat("message ", first, ": the first turn is the assistant's, not the user's"));
  }
  bool any_assistant = false;
  for (size_t i = first + 1; i < ms.size(); ++i) {
    if (ms[i].role == ms[i - 1].role) {
      throw BadRow("not_alternating", cat("messages ", i - 1, " and ", i, " are both ", ms[i].role,
                                          " turns; user and assistant must alternate"));
    }
    any_assistant |= ms[i].role == "assistant";
  }
  if (!any_assistant && !allow_no_assistant) throw BadRow("no_assistant", "the conversation has no assistant turn");
  for (size_t i = first; i < ms.size(); ++i) {
    const ChatMessage& m = ms[i];
    if (m.role == "user" && is_blank(m.content)) {
      throw BadRow("empty_content", cat("message ", i, ": the user turn is empty"));
    }
    if (m.role == "assistant" && is_blank(m.content) && (!m.reasoning_content || is_blank(*m.reasoning_content))) {
      throw BadRow("empty_content", cat("message ", i, ": the assistant turn is empty"));
    }
  }
}

ChatTemplate ChatTemplate::detect(std::string_view jinja, const std::string& bos_token) {
  ChatTemplate t;
  if (contains(jinja, "<|im_start|>")) {
    if (is_qwen3_source(jinja)) {
      t = select("qwen3", jinja, bos_token);
    } else if (contains(jinja, "<think>") || contains(jinja, "</think>")) {
      DFLASH_FAIL("chat template: a ChatML template with think tags that is not Qwen3's (e.g. QwQ or a distilled "
                  "reasoning model) is not supported; pass --chat-template qwen3 or chatml if one of them renders it");
    } else {
      t = select("chatml", jinja, bos_token);
    }
  } else if (contains(jinja, "<|start_header_id|>") && contains(jinja, "<|eot_id|>")) {
    t = select(contains(jinja, "Cutting Knowledge Date") ? "llama3.1" : "llama3", jinja, bos_token);
  } else if (jinja.empty()) {
    DFLASH_FAIL("the tokenizer has no chat template (tokenizer_config.json \"chat_template\"); pass --chat-template "
                "qwen3|chatml|llama3|llama3.1 or use --format raw");
  } else {
    DFLASH_FAIL("chat template not recognized (supported: ChatML / Qwen2 / Qwen2.5 / Qwen3, Llama-3 / Llama-3.1); "
                "pass --chat-template qwen3|chatml|llama3|llama3.1 to choose one");
  }
  return t;
}

ChatTemplate ChatTemplate::select(const std::string& name, std::string_view jinja, const std::string& bos_token) {
  if (name == "auto" || name.empty()) return detect(jinja, bos_token);
  ChatTemplate t;
  t.name = name;
  t.source_sha256 = jinja.empty() ? "" : sha256_hex(jinja);
  if (name == "qwen3") {
    t.family = Family::ChatML;
    t.qwen3_think = true;
  } else if (name == "chatml") {
    t.family = Family::ChatML;
    if (contains(jinja, "<|im_start|>")) t.default_system = chatml_default_system(jinja);
  } else if (name == "llama3" || name == "llama3.1") {
    t.family = Family::Llama3;
    t.llama_system_block = name == "llama3.1";
    if (t.llama_system_block) t.date_string = llama_date_string(jinja);
    // The template writes bos_token itself; a template without it (or no template) still gets the tokenizer's.
    t.bos_token = bos_token;
    if (contains(jinja, "<|start_header_id|>") && !contains(jinja, "bos_token")) t.bos_token.clear();
  } else {
    DFLASH_FAIL("unknown chat template name \"", name, "\" (auto, qwen3, chatml, llama3, llama3.1)");
  }
  return t;
}

nlohmann::json ChatTemplate::to_json() const {
  nlohmann::json j = {{"name", name}, {"source_sha256", source_sha256}};
  if (family == Family::ChatML) j["default_system"] = default_system;
  if (family == Family::Llama3) j["bos_token"] = bos_token;
  if (llama_system_block) j["date_string"] = date_string;
  return j;
}

RenderedChat render_chat(const ChatTemplate& t, std::span<const ChatMessage> ms, const ChatOptions& o) {
  for (size_t i = 0; i < ms.size(); ++i) check_role(ms[i], i);
  Builder b;
  if (t.family == ChatTemplate::Family::Llama3) {
    render_llama3(t, ms, o, b);
  } else if (t.qwen3_think) {
    render_qwen3(ms, o, b);
  } else {
    render_chatml(t, ms, o, b);
  }
  return b.take();
}

ChatEncoder::ChatEncoder(std::shared_ptr<const Tokenizer> tokenizer, ChatTemplate tmpl)
    : tok_(std::move(tokenizer)), tmpl_(std::move(tmpl)) {
  DFLASH_CHECK(tok_ != nullptr, "ChatEncoder: no tokenizer");
  const auto& dec = byte_decoder();
  const int64_t v = tok_->vocab_size();
  bytes_.resize(static_cast<size_t>(std::max<int64_t>(v, 0)));
  for (int64_t id = 0; id < v; ++id) {
    std::string s = tok_->id_to_token(static_cast<int32_t>(id));
    if (s.empty() || tok_->is_special(static_cast<int32_t>(id))) {
      bytes_[id] = std::move(s);
      continue;
    }
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      uint32_t c = next_cp(s, i);
      if (c < dec.size() && dec[c] >= 0) {
        out.push_back(static_cast<char>(dec[c]));
      } else {
        append_utf8(out, c);  // not in the byte alphabet: an added token's literal text
      }
    }
    bytes_[id] = std::move(out);
  }
}

std::string_view ChatEncoder::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= bytes_.size()) return {};
  return bytes_[id];
}

ChatEncoding ChatEncoder::encode(std::span<const ChatMessage> messages, const ChatOptions& opts) const {
  return encode_rendered(render_chat(tmpl_, messages, opts));
}

ChatEncoding ChatEncoder::encode_rendered(const RenderedChat& r) const {
  ChatEncoding e;
  e.ids = tok_->encode(r.text, /*parse_special=*/true);
  size_t bad_at = 0;
  if (auto starts = token_starts(*this, e.ids, r.text, &bad_at)) {
    e.loss_mask = mask_from_starts(*starts, r);
    return e;
  }
  // The tokenizer may have normalized the text (NFC): redo the spans on the NFC form of each segment. Added
  // tokens split the text before normalization and every segment boundary sits next to template text, so
  // per-segment NFC equals the tokenizer's view whenever it applies at all.
  if (!is_nfc_quick(r.text)) {
    RenderedChat n;
    for (const auto& s : r.segments) {
      size_t b = n.text.size();
      n.text += nfc(std::string_view(r.text).substr(s.begin, s.end - s.begin));
      n.segments.push_back({b, n.text.size(), s.supervised});
    }
    size_t bad2 = 0;
    if (auto starts = token_starts(*this, e.ids, n.text, &bad2)) {
      e.loss_mask = mask_from_starts(*starts, n);
      return e;
    }
  }
  throw BadRow("tokenization_mismatch",
               cat("the tokens do not reproduce the rendered text at byte ", bad_at, " (near ", snippet(r.text, bad_at),
                   "); is the tokenizer byte-level BPE?"));
}

}  // namespace dflash
