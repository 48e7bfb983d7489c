// io/tokenizer/util.h — what the pieces of the tokenizer share: UTF-8 helpers, hash maps for the vocabulary and
// the merges, the GPT-2 byte alphabet, per-thread scratch (PCRE2 match data, word caches) and the PCRE2 regex
// with Oniguruma's whitespace classes.
// defines: tok::StrHash, tok::StrMap, tok::hash_bytes, tok::decode_utf8, tok::last_cp_before, tok::is_white_space,
//          tok::replace_all, tok::utf8_lossy, tok::ByteAlphabet, tok::byte_alphabet, tok::PairMap, tok::FlatStrMap, tok::WordCache,
//          tok::ThreadState, tok::thread_state, tok::next_instance_id, tok::onig_whitespace, tok::Regex,
//          tok::kGpt2Pattern
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <pcre2.h>

#include "core/error.h"

namespace dflash::tok {

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
int32_t decode_utf8(std::string_view s, size_t& i);

// The code point that ends just before byte offset `end` (-1 if none / invalid).
int32_t last_cp_before(std::string_view s, size_t end);

// Unicode White_Space (Rust char::is_whitespace).
bool is_white_space(int32_t c);

// `s` with every occurrence of `a` (non-empty) replaced by `b`, left to right.
std::string replace_all(std::string_view s, std::string_view a, std::string_view b);

// Valid UTF-8 from arbitrary bytes: each maximal invalid subpart becomes U+FFFD (Rust from_utf8_lossy / WHATWG).
std::string utf8_lossy(std::string_view s);

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

const ByteAlphabet& byte_alphabet();

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
  std::vector<int32_t> init;  // a word's initial symbols

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

ThreadState& thread_state();

// A new id per loaded tokenizer (keys the per-thread word caches).
uint64_t next_instance_id();


// ---- regex ---------------------------------------------------------------------------------------------------

// Rewrites \s and \S outside character classes (and \s inside them) to the White_Space set, which is what
// Oniguruma's \s matches; PCRE2 with UCP matches \p{Z} and \t\n\v\f\r only (no U+0085).
std::string onig_whitespace(const std::string& re);

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

inline const char* const kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";


}  // namespace dflash::tok
