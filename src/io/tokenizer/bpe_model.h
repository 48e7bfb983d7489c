// io/tokenizer/bpe_model.h — the "model" section of tokenizer.json: BPE, in its two forms.
//  - byte-level (GPT-2, Llama-3, Qwen2/Qwen3, DeepSeek-V3, gpt-oss; the pre-tokenizer has a ByteLevel step): a
//    word's initial symbols are its bytes (byte b is the id of the GPT-2 byte-to-unicode character of b);
//  - SentencePiece-style (Llama-2, Mistral, Gemma; no ByteLevel step): the initial symbols are the word's
//    characters; a character that is not in the vocabulary becomes its UTF-8 bytes as the tokens <0xXX> with
//    byte_fallback, else the unk token (consecutive ones fused into one with fuse_unk).
// Then, as Hugging Face's word.rs: the lowest-rank merge first, leftmost on ties; `ignore_merges` takes a word that
// is a whole vocabulary entry as is.
// A tiktoken vocabulary (from_ranks) is the same byte-level model: token i is the byte string of rank i; any two
// adjacent symbols whose concatenation is a token merge, the lowest-ranked concatenation first, leftmost on ties
// (tiktoken's _byte_pair_merge), and a word that is a whole token is that token. As merges: every split (a, b) of
// every token t into two tokens, with rank(t) as the merge's rank (so the splits of one token tie, as in tiktoken). Speed: a per-thread direct-mapped cache of word -> ids, a flat pair hash map
// for merge ranks, a linear-scan merge loop for short words and a priority queue for long ones.
// defines: tok::BpeModel
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/tokenizer/json_reader.h"
#include "io/tokenizer/util.h"

namespace dflash::tok {

class BpeModel {
 public:
  // `model`: the section without "vocab" / "merges", which `reader` streamed. byte_level: the pre-tokenizer has a
  // ByteLevel step. Throws Error naming `where`.model and the field for anything unsupported or inconsistent.
  static BpeModel load(const json& model, const TokenizerJsonReader& reader, bool byte_level, const std::string& where);
  // A tiktoken vocabulary: token_bytes[i] is the byte string of rank (and id) i; all 256 single bytes must be there.
  // The vocabulary's text form is the GPT-2 byte alphabet, as Hugging Face shows such tokens. Throws Error naming
  // `where` for a missing byte.
  static BpeModel from_ranks(const std::vector<std::string>& token_bytes, const std::string& where);
  // Appends the ids of one pre-tokenized word. Throws Error for a character the model cannot encode (no byte
  // fallback and no unk token).
  void encode_word(std::string_view w, std::vector<int32_t>& out, ThreadState& ts, WordCache& cache) const;

  FlatStrMap vocab;  // token text -> id
  bool byte_level() const { return byte_level_; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  bool byte_level_ = true, byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;
  int32_t unk_ = -1;
  FlatStrMap raw_vocab_;              // byte-level with ignore_merges: raw bytes -> id
  std::array<int32_t, 256> byte_id_;  // byte-level: the alphabet's ids; byte fallback: <0xXX> (-1: missing)
  PairMap merges_;

  void initial_symbols(std::string_view w, std::vector<int32_t>& ids) const;
  void merge_long(const std::vector<int32_t>& init, std::vector<int32_t>& out, ThreadState& ts) const;
};

}  // namespace dflash::tok
