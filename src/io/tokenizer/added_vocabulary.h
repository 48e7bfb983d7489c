// io/tokenizer/added_vocabulary.h — the "added_tokens" section of tokenizer.json (Hugging Face's
// AddedVocabulary): tokens matched in the text before the model sees it, leftmost-longest over the raw text for
// tokens with normalized=false, then over each normalized gap for tokens with normalized=true; lstrip / rstrip take
// the adjacent Unicode whitespace into the token, single_word needs a non-word character (or the text edge) on both
// sides; without parse_special the *special* ones are not split out (HF `encode_special_tokens`), the others are.
// defines: tok::AddedToken, tok::Matcher, tok::AddedVocabulary
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/tokenizer/json_reader.h"
#include "io/tokenizer/util.h"

namespace dflash::tok {

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

class Normalizer;

struct AddedVocabulary {
  std::vector<AddedToken> tokens;
  Matcher raw_matcher, norm_matcher;  // normalized=false tokens on raw text; normalized=true on normalized gaps
  std::unique_ptr<Regex> word_start, word_end;  // for single_word tokens

  // Reads tokenizer.json "added_tokens" (absent or null: none). `where` names the file. Throws Error naming
  // added_tokens[i] and the field for a bad entry.
  static AddedVocabulary load(const json& root, const std::string& where);
  // Builds the matchers once the normalizer is known (normalized=true contents are matched in normalized form).
  void build_matchers(const Normalizer& norm, const std::string& where);

  // Splits `text` on the tokens of matcher `m`: on_text(gap) for the text between them, on_token(id) for each.
  template <class F, class G>
  void split(std::string_view text, const Matcher& m, bool parse_special, ThreadState& ts, F&& on_text,
             G&& on_token) const;
};

template <class F, class G>
void AddedVocabulary::split(std::string_view text, const Matcher& m, bool parse_special, ThreadState& ts, F&& on_text,
                            G&& on_token) const {
  if (m.empty()) {
    if (!text.empty()) on_text(text);
    return;
  }
  size_t emitted = 0, pos = 0, start = 0, end = 0;
  int32_t ti = 0;
  while (pos < text.size() && m.find(text, pos, start, end, ti)) {
    const AddedToken& t = tokens[static_cast<size_t>(ti)];
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

}  // namespace dflash::tok
