// io/tokenizer.cpp — a Hugging Face tokenizer.json of the byte-level BPE family (GPT-2, Llama-3, Qwen2/Qwen3):
// added-token splitting, NFC normalizer, Split-regex / ByteLevel pre-tokenizers, BPE model, ByteLevel decoder.
// Behavior follows the Hugging Face `tokenizers` library (Rust), read from its documentation and source:
//  - added tokens (AddedVocabulary): leftmost-longest match over the raw text for tokens with normalized=false,
//    then over each normalized gap for tokens with normalized=true; lstrip / rstrip take the adjacent Unicode
//    whitespace into the token, single_word needs a non-word character (or the text edge) on both sides;
//    without parse_special the *special* ones are not split out (HF `encode_special_tokens`), the others are.
//  - pre-tokenizer Split(Regex, behavior Isolated, invert false): every match and every gap is a piece;
//    ByteLevel(add_prefix_space, use_regex): optional leading space per piece, optional GPT-2 regex split.
//    The regexes run on PCRE2 (UTF + UCP + JIT); `\s` / `\S` are rewritten to the Unicode White_Space set that
//    Oniguruma (used by HF) matches, since PCRE2's UCP `\s` leaves out U+0085.
//  - BPE: lowest-rank merge first, leftmost on ties; `ignore_merges` takes a piece that is a whole vocab entry
//    as is. Words are worked on as raw bytes (byte b starts as the id of the GPT-2 byte-to-unicode char of b).
//  - decoder ByteLevel: per token, its chars mapped back to bytes (a token with a char outside the alphabet
//    gives its own UTF-8 bytes); the result is made valid UTF-8 as Rust's String::from_utf8_lossy does.
//  - post-processor: ignored — encode() never adds BOS/EOS (Llama-3's TemplateProcessing BOS is the caller's).
// Speed: a per-thread (thread_local) direct-mapped cache of piece -> ids per tokenizer instance, a flat pair
// hash map for merge ranks, a linear-scan merge loop for short pieces and a priority queue for long ones.
#include "io/tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include <pcre2.h>

#include "core/error.h"
#include "core/fs.h"
#include "io/unicode_nfc.h"

namespace dflash {
namespace {

using json = nlohmann::json;

// ---- small helpers -------------------------------------------------------------------------------------------

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StrMap = std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>>;

// Fast 64-bit hash of a short byte string (for the word cache).
inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 32;
  return h * 0x9E3779B97F4A7C15ull;
}

// Strict UTF-8 decode of one code point at s[i]; -1 (and i advanced by one) for an invalid byte.
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

// The code point that ends just before byte offset `end` (-1 if none / invalid).
int32_t last_cp_before(std::string_view s, size_t end) {
  if (end == 0) return -1;
  size_t b = end - 1;
  while (b > 0 && end - b < 4 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  size_t i = b;
  int32_t cp = decode_utf8(s, i);
  return i == end ? cp : -1;
}

// Unicode White_Space (Rust char::is_whitespace).
bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Valid UTF-8 from arbitrary bytes: each maximal invalid subpart becomes U+FFFD (Rust from_utf8_lossy / WHATWG).
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

// GPT-2 byte-to-unicode alphabet: printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in order.
struct ByteAlphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};
  ByteAlphabet() {
    to_byte.fill(-1);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = keep ? b : 256 + extra++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
  // The raw bytes a byte-level token stands for; false when it has a char outside the alphabet.
  bool decode(std::string_view tok, std::string& out) const {
    out.clear();
    for (size_t i = 0; i < tok.size();) {
      int32_t cp = decode_utf8(tok, i);
      if (cp < 0 || cp >= static_cast<int32_t>(to_byte.size()) || to_byte[static_cast<size_t>(cp)] < 0) return false;
      out.push_back(static_cast<char>(to_byte[static_cast<size_t>(cp)]));
    }
    return true;
  }
  std::string encode_byte(unsigned char b) const {
    uint32_t cp = to_cp[b];
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return s;
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

// Merge table: (left id, right id) -> (rank, merged id), open addressing on a 64-bit key.
class PairMap {
 public:
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, id = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }
  void put(int32_t a, int32_t b, int32_t rank, int32_t id) {  // a later duplicate overwrites (HF, JS)
    uint64_t k = key(a, b);
    for (size_t i = index(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == k) {
        slots_[i] = Slot{k, rank, id};
        return;
      }
    }
  }
  const Slot* find(int32_t a, int32_t b) const {
    uint64_t k = key(a, b);
    for (size_t i = index(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s;
      if (s.key == kEmpty) return nullptr;
    }
  }

 private:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t index(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 24) & mask_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// String -> id, open addressing; keys live in one arena string (no per-key allocation).
class FlatStrMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    count_ = 0;
  }
  void put(std::string_view k, int32_t v) {  // overwrites an existing key
    if (slots_.empty() || (count_ + 1) * 2 > slots_.size()) grow();
    uint64_t h = hash_bytes(k.data(), k.size());
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.val < 0) {
        s = Slot{static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(k.size()), v,
                 static_cast<uint32_t>(h >> 32)};
        arena_.append(k);
        ++count_;
        return;
      }
      if (s.h == static_cast<uint32_t>(h >> 32) && key(s) == k) {
        s.val = v;
        return;
      }
    }
  }
  int32_t find(std::string_view k) const {  // -1 when absent
    if (slots_.empty()) return -1;
    uint64_t h = hash_bytes(k.data(), k.size());
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.val < 0) return -1;
      if (s.h == static_cast<uint32_t>(h >> 32) && key(s) == k) return s.val;
    }
  }
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint32_t off = 0, len = 0;
    int32_t val = -1;
    uint32_t h = 0;
  };
  std::string_view key(const Slot& s) const { return std::string_view(arena_).substr(s.off, s.len); }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    size_t cap = old.empty() ? 16 : old.size() * 2;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.val < 0) continue;
      uint64_t h = hash_bytes(arena_.data() + s.off, s.len);
      size_t i = h & mask_;
      while (slots_[i].val >= 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::string arena_;
  std::vector<Slot> slots_;
  size_t mask_ = 0, count_ = 0;
};

// Per-thread scratch: PCRE2 match data + JIT stack, the word caches (one per tokenizer instance, a few slots).
struct WordCache {
  static constexpr size_t kEntries = 8192;  // direct mapped
  static constexpr size_t kMaxWord = 40;    // longer pieces are not cached
  static constexpr size_t kMaxIds = 10;
  struct Entry {
    uint64_t hash = 0;
    uint8_t len = 0;  // 0 = empty
    uint8_t nids = 0;
    char word[kMaxWord];
    int32_t ids[kMaxIds];
  };
  std::vector<Entry> entries{kEntries};
};

struct ThreadState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jstack = nullptr;
  struct Slot {
    uint64_t owner = 0;
    std::unique_ptr<WordCache> cache;
  };
  std::array<Slot, 4> slots;
  size_t next_slot = 0;
  // scratch for long-word BPE
  struct Sym {
    int32_t id, prev, next, len;
  };
  std::vector<Sym> syms;

  ThreadState() {
    md = pcre2_match_data_create(16, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    jstack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (mctx && jstack) pcre2_jit_stack_assign(mctx, nullptr, jstack);
    DFLASH_CHECK(md && mctx && jstack, "tokenizer: out of memory allocating PCRE2 match data");
  }
  ~ThreadState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(jstack);
  }
  WordCache& cache_for(uint64_t owner) {
    for (Slot& s : slots)
      if (s.owner == owner) return *s.cache;
    Slot& s = slots[next_slot++ % slots.size()];
    s.owner = owner;
    if (!s.cache) {
      s.cache = std::make_unique<WordCache>();
    } else {
      for (auto& e : s.cache->entries) e.len = 0;
    }
    return *s.cache;
  }
};

ThreadState& thread_state() {
  thread_local ThreadState ts;
  return ts;
}

std::atomic<uint64_t> g_next_instance{1};  // unique id per loaded tokenizer (keys the per-thread caches)

// ---- regex ---------------------------------------------------------------------------------------------------

// Rewrites \s and \S outside character classes (and \s inside them) to the White_Space set, which is what
// Oniguruma's \s matches; PCRE2 with UCP matches \p{Z} and \t\n\v\f\r only (no U+0085).
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

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    std::string p = onig_whitespace(pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      DFLASH_FAIL(where, ": cannot compile regex \"", pattern, "\" at offset ", off, ": ",
                  reinterpret_cast<const char*>(msg));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // First match at or after `from`: [ms, me). False when there is none.
  bool find(std::string_view s, size_t from, ThreadState& ts, size_t& ms, size_t& me) const {
    static const char kEmpty = 0;
    auto subj = reinterpret_cast<PCRE2_SPTR>(s.empty() ? &kEmpty : s.data());
    int rc = jit_ ? pcre2_jit_match(code_, subj, s.size(), from, 0, ts.md, ts.mctx)
                  : pcre2_match(code_, subj, s.size(), from, 0, ts.md, ts.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      DFLASH_FAIL("tokenizer: pre-tokenizer regex match failed: ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.md);
    ms = ov[0];
    me = ov[1];
    return true;
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

const char* const kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ---- added tokens ----------------------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A byte trie over added-token contents: leftmost-longest matching.
class Matcher {
 public:
  bool empty() const { return count_ == 0; }
  void add(std::string_view s, int32_t tok) {
    if (s.empty()) return;
    int32_t n = 0;
    for (unsigned char c : s) {
      int32_t next = -1;
      for (auto& [k, v] : nodes_[static_cast<size_t>(n)].kids)
        if (k == c) next = v;
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(n)].kids.emplace_back(c, next);
        nodes_.emplace_back();
      }
      n = next;
    }
    if (nodes_[static_cast<size_t>(n)].tok < 0) ++count_;
    nodes_[static_cast<size_t>(n)].tok = tok;  // a later duplicate content wins
    unsigned char f = static_cast<unsigned char>(s[0]);
    if (!first_[f]) ++nfirst_;
    first_[f] = true;
    only_first_ = nfirst_ == 1 ? f : -1;
  }
  // Leftmost-longest match starting at or after `from`.
  bool find(std::string_view text, size_t from, size_t& start, size_t& end, int32_t& tok) const {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    for (size_t i = from; i < n; ++i) {
      if (only_first_ >= 0) {
        const void* q = std::memchr(p + i, only_first_, n - i);
        if (!q) return false;
        i = static_cast<size_t>(static_cast<const unsigned char*>(q) - p);
      } else if (!first_[p[i]]) {
        continue;
      }
      int32_t node = 0, best = -1;
      size_t best_end = 0;
      for (size_t j = i; j < n; ++j) {
        int32_t next = -1;
        for (auto& [k, v] : nodes_[static_cast<size_t>(node)].kids)
          if (k == p[j]) {
            next = v;
            break;
          }
        if (next < 0) break;
        node = next;
        if (nodes_[static_cast<size_t>(node)].tok >= 0) {
          best = nodes_[static_cast<size_t>(node)].tok;
          best_end = j + 1;
        }
      }
      if (best >= 0) {
        start = i;
        end = best_end;
        tok = best;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    int32_t tok = -1;
    std::vector<std::pair<unsigned char, int32_t>> kids;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
  int nfirst_ = 0, only_first_ = -1;
  size_t count_ = 0;
};

// ---- pre-tokenizer steps -----------------------------------------------------------------------------------------

struct PreStep {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  std::unique_ptr<Regex> re;  // Split pattern, or the GPT-2 regex of ByteLevel(use_regex=true)
  bool add_prefix_space = false;
};

// JSON helpers naming the file and the field in errors.
const json& field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  DFLASH_CHECK(it != j.end(), where, ": missing field \"", key, "\"");
  return *it;
}
bool opt_bool(const json& j, const char* key, bool dflt, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  DFLASH_CHECK(it->is_boolean(), where, ".", key, ": expected true/false, got ", it->dump());
  return it->get<bool>();
}
std::string type_of(const json& j, const std::string& where) {
  DFLASH_CHECK(j.is_object(), where, ": expected an object, got ", j.dump().substr(0, 200));
  auto it = j.find("type");
  DFLASH_CHECK(it != j.end() && it->is_string(), where, ": missing string field \"type\"");
  return it->get<std::string>();
}

// Reads tokenizer.json as a DOM except model.vocab and model.merges (hundreds of thousands of entries), which are
// streamed into flat vectors: several times faster than building them as JSON nodes.
class TokenizerJsonReader : public nlohmann::json_sax<json> {
 public:
  json root;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool have_vocab = false, have_merges = false;
  std::string error;

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override { return mode_ == kVocab ? vocab_id(v) : value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    return mode_ == kVocab ? vocab_id(v > INT64_MAX ? -1 : static_cast<int64_t>(v)) : value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override {
    return mode_ == kVocab ? vocab_id(-1) : value(json(v));
  }
  bool string(string_t& s) override {
    if (mode_ == kVocab) return vocab_id(-1);
    if (mode_ == kMerges) {
      if (merge_depth_ == 1) {
        parts_.push_back(std::move(s));
        return true;
      }
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return fail(cat("model.merges[", merges.size(), "]: expected \"left right\", got \"", s, "\""));
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      return true;
    }
    return value(json(std::move(s)));
  }
  bool binary(binary_t&) override { return fail("unexpected binary value"); }
  bool start_object(std::size_t) override {
    if (mode_ == kVocab) return vocab_id(-1);
    if (mode_ == kMerges)
      return fail(cat("model.merges[", merges.size(), "]: expected \"left right\" or [left, right]"));
    if (in_model() && key_ == "vocab") {
      mode_ = kVocab;
      have_vocab = true;
      return true;
    }
    open(json::object());
    return true;
  }
  bool key(string_t& k) override {
    if (mode_ == kVocab) {
      vocab_key_ = std::move(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool end_object() override {
    if (mode_ == kVocab) {
      mode_ = kDom;
    } else {
      close();
    }
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == kVocab) return vocab_id(-1);
    if (mode_ == kMerges) {
      if (merge_depth_ != 0) return fail(cat("model.merges[", merges.size(), "]: nested array"));
      merge_depth_ = 1;
      parts_.clear();
      return true;
    }
    if (in_model() && key_ == "merges") {
      mode_ = kMerges;
      have_merges = true;
      return true;
    }
    open(json::array());
    return true;
  }
  bool end_array() override {
    if (mode_ == kMerges) {
      if (merge_depth_ == 0) {
        mode_ = kDom;
        return true;
      }
      merge_depth_ = 0;
      if (parts_.size() != 2) return fail(cat("model.merges[", merges.size(), "]: expected [left, right]"));
      merges.emplace_back(std::move(parts_[0]), std::move(parts_[1]));
      return true;
    }
    close();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(e.what());
  }

 private:
  enum Mode { kDom, kVocab, kMerges } mode_ = kDom;
  std::vector<json*> stack_;       // open containers (pointers stay valid: a container only grows when closed)
  std::vector<std::string> path_;  // the key each open container sits under ("" for the root / array items)
  std::string key_, vocab_key_;
  std::vector<std::string> parts_;
  int merge_depth_ = 0;

  bool in_model() const { return stack_.size() == 2 && path_[1] == "model" && stack_[1]->is_object(); }
  bool fail(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  bool vocab_id(int64_t v) {
    if (v < 0 || v >= INT32_MAX)
      return fail(cat("model.vocab[\"", vocab_key_, "\"]: expected a non-negative integer id"));
    vocab.emplace_back(std::move(vocab_key_), v);
    return true;
  }
  json* add(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json* top = stack_.back();
    if (top->is_array()) {
      top->push_back(std::move(v));
      return &top->back();
    }
    json& slot = (*top)[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json&& v) {
    if (mode_ == kMerges)
      return fail(cat("model.merges[", merges.size(), "]: expected \"left right\" or [left, right]"));
    add(std::move(v));
    return true;
  }
  void open(json&& v) {
    std::string under = (!stack_.empty() && stack_.back()->is_object()) ? key_ : std::string();
    stack_.push_back(add(std::move(v)));
    path_.push_back(std::move(under));
  }
  void close() {
    stack_.pop_back();
    path_.pop_back();
  }
};

}  // namespace

// ---- the tokenizer ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string json_path, hash, chat_template;
  uint64_t instance = 0;

  std::vector<std::string> id_token;  // token text as in tokenizer.json ("" = no such id)
  std::vector<std::string> id_bytes;  // what the ByteLevel decoder makes of the token
  std::vector<uint8_t> id_flags;      // kExists | kAdded | kSpecial
  static constexpr uint8_t kExists = 1, kAdded = 2, kSpecial = 4;
  FlatStrMap vocab;      // model vocab, token text -> id
  StrMap added_of;       // added token content -> id
  FlatStrMap raw_vocab;  // raw bytes -> id (only with ignore_merges)
  std::array<int32_t, 256> byte_id{};
  PairMap merges;
  bool ignore_merges = false;

  bool nfc = false;
  std::vector<PreStep> steps;

  std::vector<AddedToken> added;
  Matcher raw_matcher, norm_matcher;  // normalized=false tokens on raw text; normalized=true on normalized gaps
  std::unique_ptr<Regex> word_start, word_end;  // for single_word tokens

  std::optional<int32_t> bos, eos, pad, mask;

  // ---- encode ----
  void bpe(std::string_view w, std::vector<int32_t>& out, ThreadState& ts, WordCache& cache) const;
  void bpe_long(std::string_view w, std::vector<int32_t>& out, ThreadState& ts) const;
  template <class F>
  void pretokenize(size_t step, std::string_view s, ThreadState& ts, F&& emit) const;
  void encode_normalized(std::string_view s, std::vector<int32_t>& out, ThreadState& ts, WordCache& cache,
                         bool parse_special) const;
  template <class F, class G>
  void split_added(std::string_view text, const Matcher& m, bool parse_special, ThreadState& ts, F&& on_text,
                   G&& on_token) const;
};

void Tokenizer::Impl::bpe(std::string_view w, std::vector<int32_t>& out, ThreadState& ts, WordCache& cache) const {
  const size_t n = w.size();
  if (n == 0) return;
  if (n == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(w[0])]);
    return;
  }
  WordCache::Entry* slot = nullptr;
  uint64_t h = 0;
  if (n <= WordCache::kMaxWord) {
    h = hash_bytes(w.data(), n);
    slot = &cache.entries[h & (WordCache::kEntries - 1)];
    if (slot->len == n && slot->hash == h && std::memcmp(slot->word, w.data(), n) == 0) {
      out.insert(out.end(), slot->ids, slot->ids + slot->nids);
      return;
    }
  }
  const size_t out0 = out.size();
  int32_t whole = ignore_merges ? raw_vocab.find(w) : -1;
  if (whole >= 0) {
    out.push_back(whole);
  } else if (n <= 48) {
    // Short word: ids + the rank of each adjacent pair; repeatedly merge the first lowest-rank pair.
    int32_t ids[48], ranks[48], merged[48];
    size_t m = n;
    auto look = [&](size_t i) {
      const PairMap::Slot* s = merges.find(ids[i], ids[i + 1]);
      ranks[i] = s ? s->rank : INT32_MAX;
      merged[i] = s ? s->id : -1;
    };
    for (size_t i = 0; i < n; ++i) ids[i] = byte_id[static_cast<unsigned char>(w[i])];
    for (size_t i = 0; i + 1 < n; ++i) look(i);
    while (m > 1) {
      size_t best = 0;
      int32_t br = ranks[0];
      for (size_t i = 1; i + 1 < m; ++i)
        if (ranks[i] < br) {
          br = ranks[i];
          best = i;
        }
      if (br == INT32_MAX) break;
      ids[best] = merged[best];
      const size_t tail = m - best - 2;  // elements after best+1
      std::memmove(ids + best + 1, ids + best + 2, tail * sizeof(int32_t));
      std::memmove(ranks + best + 1, ranks + best + 2, (tail > 0 ? tail - 1 : 0) * sizeof(int32_t));
      std::memmove(merged + best + 1, merged + best + 2, (tail > 0 ? tail - 1 : 0) * sizeof(int32_t));
      --m;
      if (best + 1 < m) look(best);
      if (best > 0) look(best - 1);
    }
    out.insert(out.end(), ids, ids + m);
  } else {
    bpe_long(w, out, ts);
  }
  const size_t k = out.size() - out0;
  if (slot && k <= WordCache::kMaxIds) {
    slot->hash = h;
    slot->len = static_cast<uint8_t>(n);
    slot->nids = static_cast<uint8_t>(k);
    std::memcpy(slot->word, w.data(), n);
    std::memcpy(slot->ids, out.data() + out0, k * sizeof(int32_t));
  }
}

// Long word: linked list of symbols and a min-heap of candidate merges (rank, position), as in HF word.rs.
// A popped candidate is used only if both symbols are still there and still merge to the same id.
void Tokenizer::Impl::bpe_long(std::string_view w, std::vector<int32_t>& out, ThreadState& ts) const {
  const int32_t n = static_cast<int32_t>(w.size());
  auto& sy = ts.syms;
  sy.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    sy[static_cast<size_t>(i)] = {byte_id[static_cast<unsigned char>(w[static_cast<size_t>(i)])], i - 1,
                                  i + 1 < n ? i + 1 : -1, 1};
  struct Cand {
    int32_t rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Cand> storage;
  storage.reserve(static_cast<size_t>(n));
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q(std::greater<Cand>{}, std::move(storage));
  auto push = [&](int32_t pos) {
    const auto& a = sy[static_cast<size_t>(pos)];
    if (a.next < 0) return;
    if (const PairMap::Slot* s = merges.find(a.id, sy[static_cast<size_t>(a.next)].id)) q.push({s->rank, pos, s->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!q.empty()) {
    Cand c = q.top();
    q.pop();
    auto& a = sy[static_cast<size_t>(c.pos)];
    if (a.len == 0 || a.next < 0) continue;
    auto& b = sy[static_cast<size_t>(a.next)];
    const PairMap::Slot* s = merges.find(a.id, b.id);
    if (!s || s->id != c.id) continue;
    a.id = c.id;
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) sy[static_cast<size_t>(a.next)].prev = c.pos;
    if (a.prev >= 0) push(a.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sy[static_cast<size_t>(i)].next) out.push_back(sy[static_cast<size_t>(i)].id);
}

template <class F>
void Tokenizer::Impl::pretokenize(size_t step, std::string_view s, ThreadState& ts, F&& emit) const {
  if (step == steps.size()) {
    emit(s);
    return;
  }
  const PreStep& st = steps[step];
  std::string prefixed;
  if (st.kind == PreStep::kByteLevel) {
    if (st.add_prefix_space && (s.empty() || s[0] != ' ')) {
      prefixed.reserve(s.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(s);
      s = prefixed;
    }
    if (!st.re) {
      pretokenize(step + 1, s, ts, emit);
      return;
    }
  }
  // Isolated split: every match and every gap between matches is a piece.
  size_t prev = 0, pos = 0, ms = 0, me = 0;
  while (pos <= s.size() && st.re->find(s, pos, ts, ms, me)) {
    if (me == ms) {  // empty match: not a piece; search again one character further
      size_t i = ms;
      if (i >= s.size()) break;
      decode_utf8(s, i);
      pos = i;
      continue;
    }
    if (ms > prev) pretokenize(step + 1, s.substr(prev, ms - prev), ts, emit);
    pretokenize(step + 1, s.substr(ms, me - ms), ts, emit);
    prev = pos = me;
  }
  if (prev < s.size()) pretokenize(step + 1, s.substr(prev), ts, emit);
}

template <class F, class G>
void Tokenizer::Impl::split_added(std::string_view text, const Matcher& m, bool parse_special, ThreadState& ts,
                                  F&& on_text, G&& on_token) const {
  if (m.empty()) {
    if (!text.empty()) on_text(text);
    return;
  }
  size_t emitted = 0, pos = 0, start = 0, end = 0;
  int32_t ti = 0;
  while (pos < text.size() && m.find(text, pos, start, end, ti)) {
    const AddedToken& t = added[static_cast<size_t>(ti)];
    pos = end;
    if (t.special && !parse_special) continue;
    if (t.single_word) {
      size_t a = 0, b = 0;
      bool word_before = start > 0 && word_end->find(text.substr(0, start), 0, ts, a, b);
      bool word_after = end < text.size() && word_start->find(text.substr(end), 0, ts, a, b);
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      while (start > emitted) {
        int32_t cp = last_cp_before(text, start);
        if (!is_white_space(cp)) break;
        size_t b = start - 1;
        while ((static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        start = std::max(b, emitted);
      }
    }
    if (t.rstrip) {
      while (end < text.size()) {
        size_t i = end;
        if (!is_white_space(decode_utf8(text, i))) break;
        end = i;
      }
      pos = end;
    }
    if (start > emitted) on_text(text.substr(emitted, start - emitted));
    on_token(t.id);
    emitted = end;
  }
  if (emitted < text.size()) on_text(text.substr(emitted));
}

void Tokenizer::Impl::encode_normalized(std::string_view s, std::vector<int32_t>& out, ThreadState& ts,
                                        WordCache& cache, bool parse_special) const {
  auto plain = [&](std::string_view piece) {
    pretokenize(0, piece, ts, [&](std::string_view word) { bpe(word, out, ts, cache); });
  };
  std::string normalized;
  if (nfc) {
    normalized = dflash::nfc(s);
    s = normalized;
  }
  split_added(s, norm_matcher, parse_special, ts, plain, [&](int32_t id) { out.push_back(id); });
}

// ---- public API ------------------------------------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& im = *impl_;
  ThreadState& ts = thread_state();
  WordCache& cache = ts.cache_for(im.instance);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  im.split_added(
      text, im.raw_matcher, parse_special, ts,
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
  return utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_of.find(token); it != impl_->added_of.end()) return it->second;
  if (int32_t id = impl_->vocab.find(token); id >= 0) return id;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_token.size()) return "";
  return impl_->id_token[static_cast<size_t>(id)];
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
const std::string& Tokenizer::hash() const { return impl_->hash; }

// ---- loading ---------------------------------------------------------------------------------------------------

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string json_path = path, dir;
  if (dir_exists(path)) {
    json_path = path_join(path, "tokenizer.json");
    dir = path;
    DFLASH_CHECK(file_exists(json_path), path, ": no tokenizer.json in this directory");
  } else {
    DFLASH_CHECK(file_exists(path), path, ": no such tokenizer.json file or directory");
    dir = fs::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
  }
  std::shared_ptr<Tokenizer> tok(new Tokenizer());
  Impl& im = *tok->impl_;
  im.json_path = json_path;
  im.instance = g_next_instance.fetch_add(1);
  const std::string& W = json_path;

  TokenizerJsonReader rd;
  {
    std::string bytes = read_file(json_path);
    im.hash = sha256_hex(bytes);
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
  const ByteAlphabet& abc = byte_alphabet();

  // -- model
  const json& model = field(j, "model", W);
  const std::string MW = W + ": model";
  DFLASH_CHECK(model.is_object(), MW, ": expected an object");
  if (auto t = model.find("type"); t != model.end()) {
    DFLASH_CHECK(t->is_string() && t->get<std::string>() == "BPE", MW, ".type: only \"BPE\" models are supported, got ",
                 t->dump());
  }
  DFLASH_CHECK(!opt_bool(model, "byte_fallback", false, MW), MW, ".byte_fallback: true is not supported");
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    DFLASH_CHECK(d->is_number() && d->get<double>() == 0.0, MW, ".dropout: BPE dropout is not supported");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(k);
    DFLASH_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()), MW, ".", k,
                 ": only empty / null is supported, got ", it->dump());
  }
  im.ignore_merges = opt_bool(model, "ignore_merges", false, MW);
  DFLASH_CHECK(rd.have_vocab, MW, ": missing field \"vocab\" (an object of token -> id)");
  const auto& vocab = rd.vocab;
  int64_t max_id = -1;
  im.vocab.reserve(vocab.size());
  for (const auto& [text, id] : vocab) {
    im.vocab.put(text, static_cast<int32_t>(id));
    max_id = std::max<int64_t>(max_id, id);
  }
  DFLASH_CHECK(im.vocab.size() == vocab.size(), MW, ".vocab: duplicate tokens");
  std::vector<AddedToken> added;
  if (auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
    DFLASH_CHECK(at->is_array(), W, ": added_tokens: expected an array");
    for (size_t i = 0; i < at->size(); ++i) {
      const json& a = (*at)[i];
      std::string AW = cat(W, ": added_tokens[", i, "]");
      DFLASH_CHECK(a.is_object(), AW, ": expected an object");
      AddedToken t;
      const json& c = field(a, "content", AW);
      const json& id = field(a, "id", AW);
      DFLASH_CHECK(c.is_string() && !c.get<std::string>().empty(), AW, ".content: expected a non-empty string");
      DFLASH_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX, AW,
                   ".id: expected a non-negative integer");
      t.content = c.get<std::string>();
      t.id = id.get<int32_t>();
      t.special = opt_bool(a, "special", false, AW);
      t.lstrip = opt_bool(a, "lstrip", false, AW);
      t.rstrip = opt_bool(a, "rstrip", false, AW);
      t.single_word = opt_bool(a, "single_word", false, AW);
      t.normalized = opt_bool(a, "normalized", !t.special, AW);
      max_id = std::max<int64_t>(max_id, t.id);
      added.push_back(std::move(t));
    }
  }
  DFLASH_CHECK(max_id >= 0, MW, ".vocab: empty vocabulary");
  const size_t nid = static_cast<size_t>(max_id) + 1;
  im.id_token.assign(nid, std::string());
  im.id_bytes.assign(nid, std::string());
  im.id_flags.assign(nid, 0);
  std::string raw;
  auto set_id = [&](int32_t id, const std::string& text, uint8_t flags) {
    const size_t u = static_cast<size_t>(id);
    im.id_token[u] = text;
    im.id_flags[u] = static_cast<uint8_t>(Impl::kExists | flags);
    im.id_bytes[u] = abc.decode(text, raw) ? raw : text;
  };
  for (const auto& [text, id64] : vocab) {
    const int32_t id = static_cast<int32_t>(id64);
    DFLASH_CHECK(im.id_flags[static_cast<size_t>(id)] == 0, MW, ".vocab: id ", id, " is given to \"",
                 im.id_token[static_cast<size_t>(id)], "\" and to \"", text, "\"");
    set_id(id, text, 0);
    if (im.ignore_merges && abc.decode(text, raw)) im.raw_vocab.put(raw, id);
  }
  for (size_t b = 0; b < 256; ++b) {
    std::string ch = abc.encode_byte(static_cast<unsigned char>(b));
    int32_t id = im.vocab.find(ch);
    DFLASH_CHECK(id >= 0, MW, ".vocab: the byte-level token for byte ", b, " (\"", ch,
                 "\") is missing: not a byte-level BPE vocabulary");
    im.byte_id[b] = id;
  }
  DFLASH_CHECK(rd.have_merges, MW, ": missing field \"merges\" (an array)");
  const auto& merges = rd.merges;
  im.merges.reserve(merges.size());
  std::string ab;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& a = merges[i].first;
    const std::string& b = merges[i].second;
    ab.assign(a);
    ab.append(b);
    int32_t ia = im.vocab.find(a), ib = im.vocab.find(b), ic = im.vocab.find(ab);
    DFLASH_CHECK(ia >= 0 && ib >= 0, MW, ".merges[", i, "]: \"", a, "\" or \"", b, "\" is not in the vocabulary");
    DFLASH_CHECK(ic >= 0, MW, ".merges[", i, "]: the merged token \"", ab, "\" is not in the vocabulary");
    im.merges.put(ia, ib, static_cast<int32_t>(i), ic);
  }

  // -- added tokens
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    set_id(t.id, t.content, static_cast<uint8_t>(Impl::kAdded | (t.special ? Impl::kSpecial : 0)));
    im.added_of[t.content] = t.id;
  }
  im.added = std::move(added);

  // -- normalizer
  if (auto nj = j.find("normalizer"); nj != j.end() && !nj->is_null()) {
    const std::string NW = W + ": normalizer";
    std::string type = type_of(*nj, NW);
    std::vector<const json*> parts;
    if (type == "Sequence") {
      const json& seq = field(*nj, "normalizers", NW);
      DFLASH_CHECK(seq.is_array(), NW, ".normalizers: expected an array");
      for (const json& p : seq) parts.push_back(&p);
    } else {
      parts.push_back(&*nj);
    }
    for (const json* p : parts) {
      std::string t = type_of(*p, NW);
      DFLASH_CHECK(t == "NFC", NW, ": normalizer type \"", t, "\" is not supported (only NFC or none)");
      im.nfc = true;
    }
  }
  for (size_t i = 0; i < im.added.size(); ++i) {
    const AddedToken& t = im.added[i];
    if (!t.normalized) {
      im.raw_matcher.add(t.content, static_cast<int32_t>(i));
    } else {
      im.norm_matcher.add(im.nfc ? dflash::nfc(t.content) : t.content, static_cast<int32_t>(i));
    }
    if (t.single_word && !im.word_start) {
      im.word_start = std::make_unique<Regex>("^\\w", W);
      im.word_end = std::make_unique<Regex>("\\w$", W);
    }
  }

  // -- pre-tokenizer
  {
    const std::string PW = W + ": pre_tokenizer";
    auto pj = j.find("pre_tokenizer");
    DFLASH_CHECK(pj != j.end() && !pj->is_null(), PW, ": missing; a byte-level BPE needs a ByteLevel pre-tokenizer");
    std::vector<const json*> parts;
    if (type_of(*pj, PW) == "Sequence") {
      const json& seq = field(*pj, "pretokenizers", PW);
      DFLASH_CHECK(seq.is_array(), PW, ".pretokenizers: expected an array");
      for (const json& p : seq) parts.push_back(&p);
    } else {
      parts.push_back(&*pj);
    }
    bool have_byte_level = false;
    for (size_t i = 0; i < parts.size(); ++i) {
      const json& p = *parts[i];
      std::string PIW = cat(PW, "[", i, "]");
      std::string t = type_of(p, PIW);
      PreStep st;
      if (t == "Split") {
        DFLASH_CHECK(!have_byte_level, PIW, ": a Split after ByteLevel is not supported");
        const json& pat = field(p, "pattern", PIW);
        DFLASH_CHECK(pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string(), PIW,
                     ".pattern: only {\"Regex\": ...} patterns are supported, got ", pat.dump());
        std::string behavior = p.value("behavior", std::string("Isolated"));
        DFLASH_CHECK(behavior == "Isolated", PIW, ".behavior: only \"Isolated\" is supported, got \"", behavior, "\"");
        DFLASH_CHECK(!opt_bool(p, "invert", false, PIW), PIW, ".invert: true is not supported");
        st.kind = PreStep::kSplit;
        st.re = std::make_unique<Regex>(pat["Regex"].get<std::string>(), PIW);
      } else if (t == "ByteLevel") {
        DFLASH_CHECK(!have_byte_level, PIW, ": two ByteLevel pre-tokenizers");
        have_byte_level = true;
        st.kind = PreStep::kByteLevel;
        st.add_prefix_space = opt_bool(p, "add_prefix_space", true, PIW);
        if (opt_bool(p, "use_regex", true, PIW)) st.re = std::make_unique<Regex>(kGpt2Pattern, PIW);
      } else {
        DFLASH_FAIL(PIW, ": pre-tokenizer type \"", t, "\" is not supported (Split, ByteLevel, Sequence)");
      }
      im.steps.push_back(std::move(st));
    }
    DFLASH_CHECK(have_byte_level, PW, ": no ByteLevel pre-tokenizer; only byte-level BPE is supported");
  }

  // -- decoder
  {
    auto dj = j.find("decoder");
    DFLASH_CHECK(dj != j.end() && !dj->is_null(), W, ": decoder: missing (expected ByteLevel)");
    std::string t = type_of(*dj, W + ": decoder");
    DFLASH_CHECK(t == "ByteLevel", W, ": decoder: type \"", t, "\" is not supported (only ByteLevel)");
  }

  // -- tokenizer_config.json (optional) and chat_template.jinja
  const std::string cfg_path = path_join(dir, "tokenizer_config.json");
  if (file_exists(cfg_path)) {
    json c;
    try {
      c = json::parse(read_file(cfg_path));
    } catch (const json::exception& e) {
      DFLASH_FAIL(cfg_path, ": invalid JSON: ", e.what());
    }
    DFLASH_CHECK(c.is_object(), cfg_path, ": expected a JSON object");
    auto token_field = [&](const char* key) -> std::optional<int32_t> {
      auto it = c.find(key);
      if (it == c.end() || it->is_null()) return std::nullopt;
      std::string s;
      if (it->is_string()) {
        s = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        s = (*it)["content"].get<std::string>();
      } else {
        DFLASH_FAIL(cfg_path, ": ", key, ": expected a token string or {\"content\": ...}, got ", it->dump());
      }
      if (s.empty()) return std::nullopt;
      auto id = tok->token_to_id(s);
      DFLASH_CHECK(id.has_value(), cfg_path, ": ", key, ": token \"", s, "\" is not in ", W);
      return id;
    };
    im.bos = token_field("bos_token");
    im.eos = token_field("eos_token");
    im.pad = token_field("pad_token");
    im.mask = token_field("mask_token");
    if (auto ct = c.find("chat_template"); ct != c.end() && !ct->is_null()) {
      if (ct->is_string()) {
        im.chat_template = ct->get<std::string>();
      } else if (ct->is_array()) {  // [{"name": ..., "template": ...}]: the "default" one, else the first
        for (const json& e : *ct) {
          DFLASH_CHECK(e.is_object() && e.contains("template") && e["template"].is_string(), cfg_path,
                       ": chat_template: expected a list of {\"name\", \"template\"}");
          if (im.chat_template.empty() || e.value("name", std::string()) == "default")
            im.chat_template = e["template"].get<std::string>();
        }
      } else {
        DFLASH_FAIL(cfg_path, ": chat_template: expected a string or a list of templates");
      }
    }
  }
  if (im.chat_template.empty()) {
    const std::string jinja = path_join(dir, "chat_template.jinja");
    if (file_exists(jinja)) im.chat_template = read_file(jinja);
  }
  if (!im.mask) {
    for (const char* name : {"<|MASK|>", "<mask>"}) {
      if (auto it = im.added_of.find(name); it != im.added_of.end()) {
        im.mask = it->second;
        break;
      }
    }
  }
  return tok;
}

}  // namespace dflash
