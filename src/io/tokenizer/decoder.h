// io/tokenizer/decoder.h — the "decoder" section of tokenizer.json: ids -> text. ByteLevel (each character of a
// token mapped back to its byte; a character outside the alphabet gives its own UTF-8 bytes), or the
// SentencePiece-style Sequence [Replace("▁", " "), ByteFallback (<0xXX> -> byte), Fuse, Strip(" ", start, 0)]
// of Llama-2, Mistral and Gemma. Per-token steps make each token's bytes (token_bytes: also what the chat encoder
// matches against the text); the Strip after Fuse acts on the joined text; the result is made valid UTF-8 as
// Rust's String::from_utf8_lossy does.
// defines: tok::Decoder
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/tokenizer/json_reader.h"

namespace dflash::tok {

class Decoder {
 public:
  // Reads `decoder` (null: tokens are their own text). Throws Error naming `where` and the step for an
  // unsupported type or order.
  static Decoder load(const json& decoder, const std::string& where);
  // The bytes of one vocabulary token (not an added token: those are their content).
  std::string token_bytes(std::string_view token) const;
  // The joined token bytes -> the decoded text (Strip, then valid UTF-8).
  std::string finish(std::string bytes) const;

 private:
  bool byte_level_ = false, byte_fallback_ = false;
  std::vector<std::pair<std::string, std::string>> replace_;  // pattern -> content, in order
  std::string strip_content_;
  size_t strip_start_ = 0, strip_stop_ = 0;
};

}  // namespace dflash::tok
