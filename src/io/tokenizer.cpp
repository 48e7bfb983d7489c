// io/tokenizer.cpp — the Tokenizer: tokenizer.json's pieces (io/tokenizer/*) put together as Hugging Face's
// tokenizers library runs them, and tokenizer_config.json.
// encode: added tokens with normalized=false are split out of the raw text; each gap is normalized, then split on
// the normalized=true added tokens; each remaining piece is pre-tokenized into words; each word goes through the
// BPE model. The post-processor is ignored: encode() never adds BOS/EOS (the chat template or the caller does).
// decode: each token's bytes (decoder.h), joined, then the decoder's sequence-level steps and valid UTF-8.
// A tiktoken directory (tokenizer/tiktoken_model.h) gives the same pieces: its special tokens as added tokens, its
// pat_str as a Split pre-tokenizer, its ranks as the BPE model, a ByteLevel decoder; Kimi's chunking of long runs
// (kimi_chunks) applies to the text between added tokens, as Kimi's _tokenize sees it.
#include "io/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "io/tokenizer/added_vocabulary.h"
#include "io/tokenizer/bpe_model.h"
#include "io/tokenizer/decoder.h"
#include "io/tokenizer/json_reader.h"
#include "io/tokenizer/normalizer.h"
#include "io/tokenizer/pre_tokenizer.h"
#include "io/tokenizer/tiktoken_model.h"

namespace dflash {

using tok::json;

struct Tokenizer::Impl {
  std::string json_path, hash;  // json_path: tokenizer.json, or tiktoken.model
  uint64_t instance = 0;
  bool kimi_chunks = false;     // a tiktoken directory: Kimi's chunking before the pre-tokenizer

  tok::AddedVocabulary added;
  tok::Normalizer normalizer;
  tok::PreTokenizer pre;
  tok::BpeModel model;
  tok::Decoder decoder;

  std::vector<std::string> id_token;  // token text as in tokenizer.json ("" = no such id)
  std::vector<std::string> id_bytes;  // decoder.h token_bytes (special added tokens: their content)
  std::vector<uint8_t> id_flags;      // kExists | kAdded | kSpecial
  static constexpr uint8_t kExists = 1, kAdded = 2, kSpecial = 4;
  tok::StrMap added_of;               // added token content -> id
  std::vector<std::string> added_contents;

  // tokenizer_config.json / chat_template.jinja
  std::optional<int32_t> bos, eos, pad, mask;
  std::vector<std::pair<std::string, std::string>> special;
  std::vector<std::pair<std::string, std::string>> chat_templates;
  std::string chat_template, chat_template_origin;

  void encode_normalized(std::string_view s, std::vector<int32_t>& out, tok::ThreadState& ts, tok::WordCache& cache,
                         bool parse_special) const;
  void build_id_tables(const std::vector<std::pair<std::string, int64_t>>& vocab, const std::string& where);
  void load_tokenizer_json(const std::string& json_path);
  void load_tiktoken(const std::string& dir, const json& config);
  void load_config(const std::string& dir, const json& config, const Tokenizer& self);
};

void Tokenizer::Impl::encode_normalized(std::string_view s, std::vector<int32_t>& out, tok::ThreadState& ts,
                                        tok::WordCache& cache, bool parse_special) const {
  auto words = [&](std::string_view piece) {
    pre.split(piece, ts, [&](std::string_view word) { model.encode_word(word, out, ts, cache); });
  };
  auto plain = [&](std::string_view piece) {
    if (kimi_chunks) {
      tok::kimi_chunks(piece, words);
    } else {
      words(piece);
    }
  };
  std::string normalized;
  if (!normalizer.empty()) {
    normalized = normalizer.apply(s);
    s = normalized;
  }
  added.split(s, added.norm_matcher, parse_special, ts, plain, [&](int32_t id) { out.push_back(id); });
}

// ---- public API ------------------------------------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& im = *impl_;
  tok::ThreadState& ts = tok::thread_state();
  tok::WordCache& cache = ts.cache_for(im.instance);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  im.added.split(
      text, im.added.raw_matcher, parse_special, ts,
      [&](std::string_view gap) { im.encode_normalized(gap, out, ts, cache, parse_special); },
      [&](int32_t id) { out.push_back(id); });
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= im.id_flags.size()) continue;  // unknown ids are skipped, as in HF
    uint8_t f = im.id_flags[static_cast<size_t>(id)];
    if (!(f & Impl::kExists) || (skip_special && (f & Impl::kSpecial))) continue;
    bytes += im.id_bytes[static_cast<size_t>(id)];
  }
  return im.decoder.finish(std::move(bytes));
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_of.find(token); it != impl_->added_of.end()) return it->second;
  if (int32_t id = impl_->model.vocab.find(token); id >= 0) return id;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_token.size()) return "";
  return impl_->id_token[static_cast<size_t>(id)];
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size()) return {};
  return impl_->id_bytes[static_cast<size_t>(id)];
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_token.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_flags.size() &&
         (impl_->id_flags[static_cast<size_t>(id)] & Impl::kSpecial);
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }
std::optional<int32_t> Tokenizer::mask_id() const { return impl_->mask; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::vector<std::pair<std::string, std::string>>& Tokenizer::chat_templates() const {
  return impl_->chat_templates;
}
const std::string& Tokenizer::chat_template_origin() const { return impl_->chat_template_origin; }
const std::vector<std::pair<std::string, std::string>>& Tokenizer::special_tokens() const { return impl_->special; }
const std::vector<std::string>& Tokenizer::added_tokens() const { return impl_->added_contents; }
const std::string& Tokenizer::hash() const { return impl_->hash; }

// ---- loading ---------------------------------------------------------------------------------------------------

// id -> token text, bytes and flags, from the model's vocabulary and the added tokens.
void Tokenizer::Impl::build_id_tables(const std::vector<std::pair<std::string, int64_t>>& vocab,
                                      const std::string& W) {
  int64_t max_id = -1;
  for (const auto& [text, id] : vocab) max_id = std::max<int64_t>(max_id, id);
  for (const tok::AddedToken& t : added.tokens) max_id = std::max<int64_t>(max_id, t.id);
  DFLASH_CHECK(max_id >= 0, W, ": model.vocab: empty vocabulary");
  const size_t nid = static_cast<size_t>(max_id) + 1;
  id_token.assign(nid, std::string());
  id_bytes.assign(nid, std::string());
  id_flags.assign(nid, 0);
  for (const auto& [text, id64] : vocab) {
    const size_t u = static_cast<size_t>(id64);
    DFLASH_CHECK(id_flags[u] == 0, W, ": model.vocab: id ", id64, " is given to \"", id_token[u], "\" and to \"", text,
                 "\"");
    id_token[u] = text;
    id_flags[u] = kExists;
    id_bytes[u] = decoder.token_bytes(text);
  }
  for (const tok::AddedToken& t : added.tokens) {
    const size_t u = static_cast<size_t>(t.id);
    id_token[u] = t.content;
    id_flags[u] = static_cast<uint8_t>(kExists | kAdded | (t.special ? kSpecial : 0));
    // as HF decodes them: the decoder's per-token steps on the content (Gemma's "▁▁" is two spaces); special
    // tokens as written
    id_bytes[u] = t.special ? t.content : decoder.token_bytes(t.content);
    added_of[t.content] = t.id;
    added_contents.push_back(t.content);
  }
}

// tokenizer_config.json (optional): special tokens and chat templates; else chat_template.jinja.
// tokenizer_config.json of `dir`: its object, or null when there is none.
json read_config(const std::string& dir) {
  const std::string cfg_path = path_join(dir, "tokenizer_config.json");
  if (!file_exists(cfg_path)) return nullptr;
  json c;
  try {
    c = json::parse(read_file(cfg_path));
  } catch (const json::exception& e) {
    DFLASH_FAIL(cfg_path, ": invalid JSON: ", e.what());
  }
  DFLASH_CHECK(c.is_object(), cfg_path, ": expected a JSON object");
  return c;
}

void Tokenizer::Impl::load_config(const std::string& dir, const json& c, const Tokenizer& self) {
  const std::string cfg_path = path_join(dir, "tokenizer_config.json");
  chat_template_origin = cfg_path;
  if (!c.is_null()) {
    auto token_text = [&](const char* key) -> std::string {
      auto it = c.find(key);
      if (it == c.end() || it->is_null()) return "";
      if (it->is_string()) return it->get<std::string>();
      if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        return (*it)["content"].get<std::string>();
      DFLASH_FAIL(cfg_path, ": ", key, ": expected a token string or {\"content\": ...}, got ", it->dump());
    };
    auto token_id = [&](const char* key) -> std::optional<int32_t> {
      const std::string s = token_text(key);
      if (s.empty()) return std::nullopt;
      auto id = self.token_to_id(s);
      DFLASH_CHECK(id.has_value(), cfg_path, ": ", key, ": token \"", s, "\" is not in ", json_path);
      return id;
    };
    bos = token_id("bos_token");
    eos = token_id("eos_token");
    pad = token_id("pad_token");
    mask = token_id("mask_token");
    for (const char* k : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
      std::string s = token_text(k);
      if (!s.empty()) special.emplace_back(k, std::move(s));
    }
    if (auto ct = c.find("chat_template"); ct != c.end() && !ct->is_null()) {
      if (ct->is_string()) {
        chat_templates.emplace_back("", ct->get<std::string>());
      } else if (ct->is_array()) {
        for (const json& e : *ct) {
          DFLASH_CHECK(e.is_object() && e.contains("template") && e["template"].is_string(), cfg_path,
                       ": chat_template: expected a list of {\"name\", \"template\"}");
          chat_templates.emplace_back(e.value("name", std::string()), e["template"].get<std::string>());
        }
      } else {
        DFLASH_FAIL(cfg_path, ": chat_template: expected a string or a list of templates");
      }
    }
  }
  if (chat_templates.empty()) {
    const std::string jinja = path_join(dir, "chat_template.jinja");
    if (file_exists(jinja)) {
      chat_templates.emplace_back("", read_file(jinja));
      chat_template_origin = jinja;
    }
  }
  for (const auto& [name, src] : chat_templates) {  // the "default" one, else the first
    if (chat_template.empty() || name == "default") chat_template = src;
  }
  if (!mask) {
    for (const char* name : {"<|MASK|>", "<mask>"}) {
      if (auto it = added_of.find(name); it != added_of.end()) {
        mask = it->second;
        break;
      }
    }
  }
}

void Tokenizer::Impl::load_tokenizer_json(const std::string& W) {
  tok::TokenizerJsonReader rd;
  {
    std::string bytes = read_file(W);
    hash = sha256_hex(bytes);
    bool ok = false;
    try {
      ok = json::sax_parse(bytes, &rd);
    } catch (const json::exception& e) {
      DFLASH_FAIL(W, ": invalid JSON: ", e.what());
    }
    DFLASH_CHECK(ok, W, ": ", rd.error.empty() ? std::string("invalid JSON") : rd.error);
  }
  const json& j = rd.root;
  DFLASH_CHECK(j.is_object(), W, ": expected a JSON object at the top level");
  auto section = [&](const char* k) -> const json& {
    static const json kNull;
    auto it = j.find(k);
    return it == j.end() ? kNull : *it;
  };
  added = tok::AddedVocabulary::load(j, W);
  normalizer = tok::Normalizer::load(section("normalizer"), W + ": normalizer");
  pre = tok::PreTokenizer::load(section("pre_tokenizer"), W + ": pre_tokenizer");
  model = tok::BpeModel::load(tok::field(j, "model", W), rd, pre.byte_level(), W);
  decoder = tok::Decoder::load(section("decoder"), W + ": decoder");
  added.build_matchers(normalizer, W);
  build_id_tables(rd.vocab, W);
}

void Tokenizer::Impl::load_tiktoken(const std::string& dir, const json& config) {
  tok::TiktokenModel tm = tok::TiktokenModel::load(dir, config);
  const std::string& W = json_path;
  hash = tm.hash;
  kimi_chunks = true;
  added.tokens = std::move(tm.specials);
  pre = tok::PreTokenizer::load(tm.pre_tokenizer_json(), W + ": pat_str");
  model = tok::BpeModel::from_ranks(tm.tokens, W);
  decoder = tok::Decoder::load(tok::TiktokenModel::decoder_json(), W);
  added.build_matchers(normalizer, W);
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(tm.tokens.size());
  const tok::ByteAlphabet& abc = tok::byte_alphabet();
  for (size_t i = 0; i < tm.tokens.size(); ++i) {
    std::string text;
    for (unsigned char c : tm.tokens[i]) text += abc.encode_byte(c);
    vocab.emplace_back(std::move(text), static_cast<int64_t>(i));
  }
  build_id_tables(vocab, W);
}

bool Tokenizer::found_in(const std::string& dir) {
  return file_exists(path_join(dir, "tokenizer.json")) || file_exists(path_join(dir, "tiktoken.model"));
}

const std::string& Tokenizer::source() const { return impl_->json_path; }

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string json_path = path, dir;
  bool tiktoken = false;
  if (dir_exists(path)) {
    dir = path;
    json_path = path_join(path, "tokenizer.json");
    if (!file_exists(json_path) && file_exists(path_join(path, "tiktoken.model"))) {
      json_path = path_join(path, "tiktoken.model");
      tiktoken = true;
    }
    DFLASH_CHECK(file_exists(json_path), path, ": no tokenizer.json (or tiktoken.model) in this directory");
  } else {
    DFLASH_CHECK(file_exists(path), path, ": no such tokenizer.json / tiktoken.model file or directory");
    dir = fs::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
    tiktoken = fs::path(path).filename() == "tiktoken.model";
  }
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  Impl& im = *t->impl_;
  im.json_path = json_path;
  im.instance = tok::next_instance_id();
  const json config = read_config(dir);
  if (tiktoken) {
    im.load_tiktoken(dir, config);
  } else {
    im.load_tokenizer_json(json_path);
  }
  im.load_config(dir, config, *t);
  return t;
}

}  // namespace dflash
