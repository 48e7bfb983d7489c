// io/tokenizer/tiktoken_model.h — a tiktoken tokenizer directory, as Moonshot's Kimi models ship it (Kimi-K2,
// K2-Thinking, K2.5, Kimi-Linear: no tokenizer.json), read into the pieces a tokenizer.json gives:
//  - tiktoken.model: one token a line, "<base64 of the token's bytes> <rank>" (tiktoken's load_tiktoken_bpe; blank
//    lines skipped); the ranks must be 0 .. n-1, each once, and are the ids; the 256 single bytes must be there.
//    The model is byte-level BPE by ranks (bpe_model.h, BpeModel::from_ranks).
//  - tokenization_kimi.py (the TikTokenTokenizer class the repository's auto_map names; read, never run):
//      pat_str               the split regex: `pat_str = "|".join([r"""...""", ...])` or `pat_str = r"..."`, in
//                            the syntax of Rust's regex crate (tiktoken's), translated for PCRE2 by
//                            rust_regex_to_pcre2;
//      num_reserved_special_tokens = N, and range(num_base_tokens, num_base_tokens +
//                            self.num_reserved_special_tokens [+ K]): the special ids are n .. n+N+K-1;
//                            id i is tokenizer_config.json's added_tokens_decoder[i] where given, else
//                            "<|reserved_token_{i}|>" (special).
//    Without the file, or when one of these is not found in it, loading fails naming the file and the item.
//  - tokenizer_config.json "added_tokens_decoder": {"<id>": {"content", "special", "lstrip", "rstrip",
//    "single_word", "normalized"}} for the special ids (an id outside them is an error naming the entry).
// Kimi's encode() runs tiktoken on the text between added tokens cut first into pieces of at most 400,000
// characters and then wherever a run of whitespace or of non-whitespace (Python str.isspace) would pass 25,000
// characters (its _split_whitespaces_or_nonwhitespaces): kimi_chunks.
// defines: tok::TiktokenModel, tok::rust_regex_to_pcre2, tok::python_isspace, tok::kimi_chunks
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/added_vocabulary.h"
#include "io/tokenizer/json_reader.h"
#include "io/tokenizer/util.h"

namespace dflash::tok {

struct TiktokenModel {
  std::vector<std::string> tokens;  // token i's bytes (rank i)
  std::string pat_str;              // as tokenization_kimi.py writes it (Rust regex syntax)
  std::string pattern;              // pat_str for PCRE2
  std::vector<AddedToken> specials; // ids tokens.size() .. + count - 1, in order
  std::string hash;                 // SHA-256 of tiktoken.model's bytes, pat_str and the special tokens

  // Reads `dir`/tiktoken.model and `dir`/tokenization_kimi.py; `config` is `dir`/tokenizer_config.json's object
  // (null: none). Throws Error naming the file and the line or field for anything it cannot read.
  static TiktokenModel load(const std::string& dir, const json& config);
  // The pre_tokenizer and decoder sections a tokenizer.json would have for it: Sequence [Split(pattern,
  // Isolated), ByteLevel(add_prefix_space=false, use_regex=false)] and ByteLevel.
  json pre_tokenizer_json() const;
  static json decoder_json();
};

// tiktoken's regex (Rust regex crate syntax) as PCRE2 (UTF + UCP) matches it:
//  - \p{Name} with a script name (Han) is Script=Name in Rust, Script_Extensions=Name in PCRE2 >= 10.40 (which
//    puts U+3001 、 and U+3002 。 in Han): written \p{sc:Name}; \p{Script=Name} / \p{sc=Name} -> \p{sc:Name},
//    \p{Script_Extensions=Name} / \p{scx=Name} -> \p{scx:Name}; general categories (L, Lu, N, ...) unchanged;
//  - class intersection [A&&B&&...] (B a class such as [^\p{Han}]) -> (?:(?=B)...[A]); a nested class in a union
//    ([a[bc]]) is inlined; `--`, `~~` and a negated intersection are errors;
//  - everything else is the same in both (\s is rewritten to White_Space later, as for every pre-tokenizer regex).
// Throws Error naming `where` for what it cannot translate.
std::string rust_regex_to_pcre2(std::string_view re, const std::string& where);

// Python's str.isspace for one code point: Unicode White_Space plus U+001C..U+001F.
bool python_isspace(int32_t cp);

// Kimi's chunking of a text before tiktoken sees it (see the top of this file): calls emit(piece) for each piece,
// in order. Characters are code points; a byte that is not valid UTF-8 counts as one non-space character.
template <class F>
void kimi_chunks(std::string_view s, F&& emit) {
  constexpr size_t kMaxChars = 400000, kMaxRun = 25000;
  size_t i = 0;
  while (i < s.size()) {
    // One 400,000-character slice [i, end), cut in runs of at most 25,000.
    size_t pos = i, chars = 0, run = 0, start = i;
    bool space = false;
    while (pos < s.size() && chars < kMaxChars) {
      size_t next = pos;
      const bool sp = python_isspace(decode_utf8(s, next));
      if (chars == 0) space = sp;
      if (sp != space) {
        run = 1;
        space = sp;
      } else if (++run > kMaxRun) {
        emit(s.substr(start, pos - start));
        start = pos;
        run = 1;
      }
      pos = next;
      ++chars;
    }
    emit(s.substr(start, pos - start));
    i = pos;
  }
}

}  // namespace dflash::tok
