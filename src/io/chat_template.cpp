// io/chat_template.cpp — see chat_template.h for where templates come from, the variables and the mask rule.
#include "io/chat_template.h"

#include <algorithm>
#include <cstring>

#include "core/fs.h"
#include "core/sha256.h"
#include "io/jinja/template.h"
#include "io/tokenizer.h"
#include "io/unicode_nfc.h"

namespace dflash {

namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kSentinel = "dflashsentinel7f3a";

bool is_blank(std::string_view s) { return py_strip(s, std::nullopt).empty(); }

bool known_role(const std::string& r) {
  return r == "system" || r == "developer" || r == "user" || r == "assistant" || r == "tool";
}

size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  const size_t m = std::min(a.size(), b.size());
  while (n < m && a[n] == b[n]) ++n;
  while (n > 0 && n < b.size() && (static_cast<unsigned char>(b[n]) & 0xC0) == 0x80) --n;  // a UTF-8 boundary
  return n;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The aligned common prefix of a and b (chat_template.h): the longest common prefix, shortened until it ends
// inside no added token of either.
size_t aligned_prefix(std::string_view a, std::string_view b, const AddedTokens& added) {
  size_t n = common_prefix(a, b);
  for (;;) {
    const size_t m = std::min(added.straddling(a, n), added.straddling(b, n));
    if (m >= n) return n;
    n = m;
  }
}

std::string snippet(std::string_view s, size_t at) {
  size_t b = at >= 20 ? at - 20 : 0;
  return nlohmann::json(std::string(s.substr(b, 40))).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

// ---- messages -------------------------------------------------------------------------------------------------

jinja::Value message_value(const ChatMessage& m) {
  if (!m.source.is_null()) return jinja::from_json(m.source);
  auto d = std::make_shared<jinja::Dict>();
  d->items.emplace_back("role", jinja::Value(m.role));
  d->items.emplace_back("content", jinja::Value(m.content));
  if (m.reasoning_content) d->items.emplace_back("reasoning_content", jinja::Value(*m.reasoning_content));
  return jinja::Value(std::move(d));
}

bool ChatMessage::has_tool_calls() const {
  if (!source.is_object()) return false;
  auto it = source.find("tool_calls");
  return it != source.end() && it->is_array() && !it->empty();
}

std::vector<ChatMessage> parse_messages(const ojson& j) {
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
    if (!known_role(cm.role)) {
      throw BadRow("unknown_role",
                   cat("message ", i, ": unknown role \"", cm.role, "\" (system, developer, user, assistant, tool)"));
    }
    cm.source = m;
    auto tc = m.find("tool_calls");
    if (tc != m.end() && !tc->is_null() && !tc->is_array())
      throw BadRow("bad_message", cat("message ", i, ": \"tool_calls\" is not an array"));
    auto c = m.find("content");
    const bool null_ok = cm.role == "assistant" && cm.has_tool_calls();
    if (c != m.end() && c->is_string()) {
      cm.content = c->get<std::string>();
    } else if (!(null_ok && (c == m.end() || c->is_null()))) {
      throw BadRow("bad_message", cat("message ", i, " (", cm.role, "): \"content\" is missing or not a string"));
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
  for (size_t i = 0; i < ms.size(); ++i) {
    if (!known_role(ms[i].role))
      throw BadRow("unknown_role", cat("message ", i, ": unknown role \"", ms[i].role, "\""));
  }
  auto is_system = [](const ChatMessage& m) { return m.role == "system" || m.role == "developer"; };
  size_t first = 0;
  while (first < ms.size() && is_system(ms[first])) ++first;
  if (first == ms.size()) throw BadRow("system_only", "the conversation has only system messages");
  for (size_t i = 1; i < ms.size(); ++i) {
    if (is_system(ms[i])) {
      throw BadRow("not_alternating", cat("message ", i, " is a ", ms[i].role, " message; only the first may be"));
    }
  }
  if (ms[first].role == "assistant") {
    throw BadRow("assistant_first", cat("message ", first, ": the first turn is the assistant's, not the user's"));
  }
  if (ms[first].role == "tool") throw BadRow("not_alternating", cat("message ", first, ": a tool message opens the turns"));
  bool any_assistant = false;
  for (size_t i = first + 1; i < ms.size(); ++i) {
    const ChatMessage &p = ms[i - 1], &m = ms[i];
    if (m.role == "tool") {
      if (!(p.role == "tool" || (p.role == "assistant" && p.has_tool_calls())))
        throw BadRow("not_alternating", cat("message ", i, ": a tool message that answers no assistant tool call"));
    } else if (m.role == p.role) {
      throw BadRow("not_alternating", cat("messages ", i - 1, " and ", i, " are both ", m.role,
                                          " turns; user and assistant must alternate"));
    }
    any_assistant |= m.role == "assistant";
  }
  if (!any_assistant && !allow_no_assistant) throw BadRow("no_assistant", "the conversation has no assistant turn");
  for (size_t i = first; i < ms.size(); ++i) {
    const ChatMessage& m = ms[i];
    if (m.role == "user" && is_blank(m.content)) throw BadRow("empty_content", cat("message ", i, ": the user turn is empty"));
    if (m.role == "assistant" && is_blank(m.content) && (!m.reasoning_content || is_blank(*m.reasoning_content)) &&
        !m.has_tool_calls()) {
      throw BadRow("empty_content", cat("message ", i, ": the assistant turn is empty"));
    }
  }
}

// ---- options ----------------------------------------------------------------------------------------------

ChatOptions ChatTemplateChoice::options() const {
  ChatOptions o;
  o.enable_thinking = enable_thinking;
  if (!reasoning_effort.empty()) o.reasoning_effort = reasoning_effort;
  for (const std::string& kv : template_args) {
    const size_t eq = kv.find('=');
    DFLASH_CHECK(eq != std::string::npos && eq > 0, "--template-arg \"", kv, "\": expected key=value");
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    DFLASH_CHECK(k != "messages" && k != "tools" && k != "documents" && k != "add_generation_prompt",
                 "--template-arg ", k, ": this variable is set by dflash itself");
    ojson val = ojson::parse(v, nullptr, /*allow_exceptions=*/false);
    if (val.is_discarded()) val = v;
    o.template_args.emplace_back(k, std::move(val));
  }
  o.now = now != 0 ? now : std::time(nullptr);
  return o;
}

nlohmann::json chat_flags(const ChatOptions& o, const ChatTemplate* t) {
  nlohmann::json f = {{"add_generation_prompt", o.add_generation_prompt}};
  if (o.enable_thinking) f["enable_thinking"] = *o.enable_thinking;
  if (o.reasoning_effort) f["reasoning_effort"] = *o.reasoning_effort;
  if (!o.template_args.empty()) {
    nlohmann::json a = nlohmann::json::object();
    for (const auto& [k, v] : o.template_args) a[k] = nlohmann::json::parse(v.dump());
    f["template_args"] = a;
  }
  if (t && t->uses_strftime_now()) {
    std::tm tm{};
    const std::time_t now = o.now;
    localtime_r(&now, &tm);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    f["strftime_now"] = buf;
  }
  return f;
}

// ---- the template -------------------------------------------------------------------------------------------

ChatTemplate::ChatTemplate(std::string source, std::string origin) : source_(std::move(source)), origin_(std::move(origin)) {
  DFLASH_CHECK(!source_.empty(), origin_, ": the chat template is empty");
  sha256_ = sha256_hex(source_);
  try {
    tmpl_ = std::make_shared<const jinja::Template>(source_);
  } catch (const jinja::TemplateError& e) {
    DFLASH_FAIL(origin_, ": chat template: ", e.what());
  }
}

ChatTemplate ChatTemplate::load(const Tokenizer& tok, const std::string& path, const std::string& name) {
  if (!path.empty() && path != "auto") {
    DFLASH_CHECK(file_exists(path), "--chat-template ", path, ": no such file");
    const std::string text = read_file(path);
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
      ojson j;
      try {
        j = ojson::parse(text);
      } catch (const ojson::exception& e) {
        DFLASH_FAIL(path, ": invalid JSON: ", e.what());
      }
      auto ct = j.is_object() ? j.find("chat_template") : j.end();
      DFLASH_CHECK(j.is_object() && ct != j.end(), path, ": no \"chat_template\" field");
      if (ct->is_string()) return ChatTemplate(ct->get<std::string>(), path);
      DFLASH_CHECK(ct->is_array(), path, ": chat_template: expected a string or a list of {\"name\", \"template\"}");
      std::string found, first;
      for (const auto& e : *ct) {
        DFLASH_CHECK(e.is_object() && e.contains("template") && e["template"].is_string(), path,
                     ": chat_template: expected a list of {\"name\", \"template\"}");
        const std::string n = e.value("name", std::string());
        if (first.empty()) first = e["template"].get<std::string>();
        if (n == (name.empty() ? "default" : name)) found = e["template"].get<std::string>();
      }
      DFLASH_CHECK(!found.empty() || name.empty(), path, ": no chat template named \"", name, "\"");
      return ChatTemplate(found.empty() ? first : found, path + (name.empty() ? "" : "#" + name));
    }
    return ChatTemplate(text, path);
  }
  const auto& list = tok.chat_templates();
  DFLASH_CHECK(!list.empty(), "the tokenizer has no chat template (", tok.chat_template_origin(),
               "); pass --chat-template FILE.jinja, or use --format raw");
  if (!name.empty()) {
    for (const auto& [n, src] : list)
      if (n == name) return ChatTemplate(src, tok.chat_template_origin() + "#" + name);
    std::string names;
    for (const auto& [n, src] : list) names += (names.empty() ? "" : ", ") + n;
    DFLASH_FAIL(tok.chat_template_origin(), ": no chat template named \"", name, "\" (it has: ", names, ")");
  }
  return ChatTemplate(tok.chat_template(), tok.chat_template_origin());
}

const char* ChatTemplate::mask_rule() const { return tmpl_->has_generation() ? "generation" : "prefixes"; }

bool ChatTemplate::uses_strftime_now() const { return source_.find("strftime_now") != std::string::npos; }

nlohmann::json ChatTemplate::to_json() const {
  return {{"sha256", sha256_}, {"origin", origin_}, {"mask_rule", mask_rule()}};
}

ChatTemplate::Rendered ChatTemplate::render_full(std::span<const ChatMessage> messages, const ChatOptions& o,
                                                 const ojson& special) const {
  jinja::List ms;
  ms.reserve(messages.size());
  for (const ChatMessage& m : messages) ms.push_back(message_value(m));
  return render_values(ms, o, special);
}

ChatTemplate::Rendered ChatTemplate::render_values(const jinja::List& messages, const ChatOptions& o,
                                                   const ojson& special) const {
  jinja::Dict vars;
  vars.items.emplace_back("messages", jinja::Value(messages));
  vars.items.emplace_back("tools", jinja::from_json(o.tools));
  vars.items.emplace_back("documents", jinja::Value::none());
  vars.items.emplace_back("add_generation_prompt", jinja::Value(o.add_generation_prompt));
  if (o.enable_thinking) vars.items.emplace_back("enable_thinking", jinja::Value(*o.enable_thinking));
  if (o.reasoning_effort) vars.items.emplace_back("reasoning_effort", jinja::Value(*o.reasoning_effort));
  if (special.is_object())
    for (auto it = special.begin(); it != special.end(); ++it) vars.set(it.key(), jinja::from_json(it.value()));
  for (const auto& [k, v] : o.template_args) vars.set(k, jinja::from_json(v));
  jinja::RenderOptions ro;
  ro.now = o.now;
  try {
    jinja::Rendered r = tmpl_->render(vars, ro);
    return {std::move(r.text), std::move(r.generation)};
  } catch (const jinja::TemplateError& e) {
    if (e.raised()) throw BadRow("template_refused", cat("the chat template refused the conversation: ", e.what()));
    throw BadRow("template_error", cat(origin_, ": ", e.what()));
  }
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const ChatOptions& o, const ojson& special) const {
  return render_full(messages, o, special).text;
}

// ---- the supervised spans (chat_template.h, "Supervised text") ------------------------------------------------

AddedTokens::AddedTokens(std::vector<std::string> tokens) : sorted_(std::move(tokens)) {
  std::erase_if(sorted_, [](const std::string& t) { return t.empty(); });
  std::sort(sorted_.begin(), sorted_.end());
  sorted_.erase(std::unique(sorted_.begin(), sorted_.end()), sorted_.end());
  for (const std::string& t : sorted_) {
    max_len_ = std::max(max_len_, t.size());
    first_[static_cast<unsigned char>(t[0])] = true;
  }
}

bool AddedTokens::has(std::string_view t) const { return std::binary_search(sorted_.begin(), sorted_.end(), t); }

size_t AddedTokens::straddling(std::string_view text, size_t at) const {
  if (at == 0 || at >= text.size()) return std::string::npos;
  for (size_t a = at > max_len_ ? at - max_len_ + 1 : 0; a < at; ++a) {
    if (!first_[static_cast<unsigned char>(text[a])]) continue;
    for (size_t len = at - a + 1; len <= max_len_ && a + len <= text.size(); ++len)
      if (has(text.substr(a, len))) return a;
  }
  return std::string::npos;
}

std::string_view AddedTokens::leading(std::string_view s) const {
  if (s.empty() || !first_[static_cast<unsigned char>(s[0])]) return {};
  for (size_t len = std::min(max_len_, s.size()); len > 0; --len)
    if (has(s.substr(0, len))) return s.substr(0, len);
  return {};
}

bool AddedTokens::ends_with_one(std::string_view s) const {
  for (size_t len = 1; len <= std::min(max_len_, s.size()); ++len)
    if (has(s.substr(s.size() - len))) return true;
  return false;
}

namespace {

// The "prefixes" rule (chat_template.h): each assistant turn's span in R, from renderings of the conversation's
// prefixes and of a stand-in turn.
class TurnLocator {
 public:
  TurnLocator(const ChatTemplate& t, std::span<const ChatMessage> ms, const jinja::List& values, const ChatOptions& o,
              const ojson& special, const AddedTokens& added, const std::string& R)
      : t_(t), ms_(ms), values_(values), special_(special), added_(added), R_(R), gen_(o), plain_(o) {
    gen_.add_generation_prompt = true;
    plain_.add_generation_prompt = false;
  }

  // The span [s, e) of assistant turn i (empty when the turn renders nothing of its own). Throws BadRow
  // "template_mask" when its end cannot be located.
  std::pair<size_t, size_t> span(size_t i) {
    alone_.reset();
    const size_t s = start(i);
    size_t e = end(i, s);
    // whitespace after the turn's last added token is the separator before the next turn
    const std::string_view body = std::string_view(R_).substr(s, e > s ? e - s : 0);
    const std::string stripped = py_strip(body, std::nullopt, false, true);
    if (stripped.size() < body.size() && added_.ends_with_one(stripped)) e = s + stripped.size();
    return {s, e};
  }

 private:
  const ChatTemplate& t_;
  std::span<const ChatMessage> ms_;
  const jinja::List& values_;
  const ojson& special_;
  const AddedTokens& added_;
  const std::string& R_;
  ChatOptions gen_, plain_;
  // The stand-in turn rendered as the last message after messages[:i]: its text and where its sentinel content
  // begins (npos: the template refuses it, or writes no content).
  std::optional<std::pair<std::string, size_t>> alone_;

  jinja::List prefix(size_t n) const {
    return jinja::List(values_.begin(), values_.begin() + static_cast<long>(n));
  }
  std::string render(const jinja::List& m, const ChatOptions& o) const { return t_.render_values(m, o, special_).text; }
  static jinja::Value stand_in() { return message_value({"assistant", kSentinel, std::nullopt, {}}); }

  const std::pair<std::string, size_t>& alone(size_t i) {
    if (!alone_) {
      jinja::List m = prefix(i);
      m.push_back(stand_in());
      try {
        std::string a = render(m, plain_);
        const size_t q = a.find(kSentinel);
        alone_.emplace(std::move(a), q);
      } catch (const BadRow&) {
        alone_.emplace(std::string(), std::string::npos);  // the template refuses the stand-in
      }
    }
    return *alone_;
  }

  // Where R departs from the prompt served for turn i. When it departs inside the history before the turn (the
  // template renders earlier messages otherwise once later ones follow, e.g. a system prompt written into the last
  // user message), the turn starts where the stand-in turn rendered last has its content, if R agrees with that
  // rendering up to there.
  size_t start(size_t i) {
    const std::string P = render(prefix(i), gen_);
    size_t s = aligned_prefix(P, R_, added_);
    if (s < P.size() && s < aligned_prefix(render(prefix(i), plain_), P, added_)) {
      const auto& [a, q] = alone(i);
      if (q != std::string::npos && q > s && common_prefix(a, R_) >= q) s = q;
    }
    return s;
  }

  // Where turn i's output ends in R: where L = render(messages[:i+1]) ends when R begins with L; else by the
  // stand-in turn; else where R departs from L.
  size_t end(size_t i, size_t s) {
    const std::string L = i + 1 == ms_.size() ? R_ : render(prefix(i + 1), plain_);
    if (L.size() > s && starts_with(R_, L)) return L.size();
    const char* why = nullptr;
    size_t e = end_by_stand_in(i, s, &why);
    if (e != std::string::npos) return e;
    e = aligned_prefix(L, R_, added_);
    if (e <= s) {
      throw BadRow("template_mask", cat("assistant turn ", i, ": ", why, " (", t_.origin(),
                                        "); a template with {% generation %} blocks marks it exactly"));
    }
    return e;
  }

  // The stand-in turn alone (A) and followed by the next message (W): N = render(messages[:i+2]) ends with W's
  // text after the sentinel, so the content ends that far before N's end; the closing text is the aligned common
  // prefix of what follows the sentinel in A, in W and the content in R. npos, with *why, when the stand-in shows
  // nothing.
  size_t end_by_stand_in(size_t i, size_t s, const char** why) {
    *why = "the turn's output cannot be found";
    if (i + 1 >= ms_.size()) return std::string::npos;
    const auto& [a, q] = alone(i);
    if (q == std::string::npos) return std::string::npos;
    jinja::List m = prefix(i);
    m.push_back(stand_in());
    m.push_back(values_[i + 1]);
    std::string w;
    try {
      w = render(m, plain_);
    } catch (const BadRow&) {
      return std::string::npos;
    }
    const size_t p = w.find(kSentinel);
    if (p == std::string::npos) return std::string::npos;
    *why = "the turn's end cannot be found";
    const std::string N = render(prefix(i + 2), plain_);
    const std::string_view tail = std::string_view(w).substr(p + std::strlen(kSentinel));
    if (N.size() < tail.size() || N.compare(N.size() - tail.size(), tail.size(), tail) != 0) return std::string::npos;
    size_t e = N.size() - tail.size();
    if (e < s || common_prefix(N, R_) < e) return std::string::npos;
    const std::string_view closing = std::string_view(a).substr(q + std::strlen(kSentinel));
    const size_t c = std::min(aligned_prefix(closing, tail, added_),
                              aligned_prefix(closing, std::string_view(R_).substr(e), added_));
    if (c > 0) {
      e += c;
    } else if (!added_.leading(closing).empty()) {
      e += added_.leading(tail).size();  // the closing token differs when later turns follow
    }
    return e;
  }
};

}  // namespace

RenderedChat render_chat(const ChatTemplate& t, std::span<const ChatMessage> ms, const ChatOptions& o,
                         const ojson& special, const AddedTokens& added) {
  RenderedChat out;
  jinja::List values;  // every message converted once; prefixes share them
  values.reserve(ms.size());
  for (const ChatMessage& m : ms) values.push_back(message_value(m));
  ChatTemplate::Rendered full = t.render_values(values, o, special);
  out.text = std::move(full.text);
  const std::string& R = out.text;
  std::vector<std::pair<size_t, size_t>> spans;
  if (std::strcmp(t.mask_rule(), "generation") == 0) {
    spans = std::move(full.generation);
  } else if (!o.add_generation_prompt) {
    TurnLocator locate(t, ms, values, o, special, added, R);
    for (size_t i = 0; i < ms.size(); ++i) {
      if (ms[i].role != "assistant") continue;
      const auto [s, e] = locate.span(i);
      if (e > s) spans.emplace_back(s, e);
    }
  }
  size_t pos = 0;
  for (const auto& [b, e] : spans) {
    if (b < pos || e > R.size()) continue;  // overlapping or out of range: keep the first
    if (b > pos) out.segments.push_back({pos, b, false});
    out.segments.push_back({b, e, true});
    pos = e;
  }
  if (pos < R.size()) out.segments.push_back({pos, R.size(), false});
  return out;
}

// ---- the encoder -------------------------------------------------------------------------------------------

ChatEncoder::ChatEncoder(std::shared_ptr<const Tokenizer> tokenizer, ChatTemplate tmpl)
    : tok_(std::move(tokenizer)), tmpl_(std::move(tmpl)) {
  DFLASH_CHECK(tok_ != nullptr, "ChatEncoder: no tokenizer");
  special_ = ojson::object();
  for (const auto& [k, v] : tok_->special_tokens()) special_[k] = v;
  added_ = AddedTokens(tok_->added_tokens());
}

std::string_view ChatEncoder::token_bytes(int32_t id) const { return tok_->token_bytes(id); }

RenderedChat ChatEncoder::render(std::span<const ChatMessage> messages, const ChatOptions& opts) const {
  return render_chat(tmpl_, messages, opts, special_, added_);
}

ChatEncoding ChatEncoder::encode(std::span<const ChatMessage> messages, const ChatOptions& opts) const {
  return encode_rendered(render(messages, opts));
}

namespace {

// Token start offsets of `ids` in `text`, or nullopt when the token bytes do not reproduce the text (a leading
// space that a SentencePiece normalizer prepends to a piece is allowed). *bad_at: where they first differ.
std::optional<std::vector<size_t>> token_starts(const ChatEncoder& enc, const std::vector<int32_t>& ids,
                                                std::string_view text, size_t* bad_at) {
  std::vector<size_t> starts(ids.size());
  size_t pos = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string_view tb = enc.token_bytes(ids[i]);
    starts[i] = pos;
    auto match = [&](std::string_view b) {
      return !b.empty() && pos + b.size() <= text.size() && std::memcmp(text.data() + pos, b.data(), b.size()) == 0;
    };
    std::string raw;
    if (match(tb)) {
      pos += tb.size();
    } else if (raw = enc.tokenizer().id_to_token(ids[i]); raw != tb && match(raw)) {
      pos += raw.size();  // an added token matched as written in the text (normalized=false, e.g. Gemma's "▁▁")
    } else if (tb.size() > 1 && tb[0] == ' ' && (pos >= text.size() || text[pos] != ' ') && match(tb.substr(1))) {
      pos += tb.size() - 1;
    } else if (tb == " " && (pos >= text.size() || text[pos] != ' ')) {
      // a prepended space that is a token of its own
    } else {
      *bad_at = pos;
      return std::nullopt;
    }
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

}  // namespace

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
  throw BadRow("tokenization_mismatch", cat("the tokens do not reproduce the rendered text at byte ", bad_at,
                                            " (near ", snippet(r.text, bad_at), ")"));
}

}  // namespace dflash
