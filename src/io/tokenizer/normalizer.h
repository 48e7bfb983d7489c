// io/tokenizer/normalizer.h — the "normalizer" section of tokenizer.json: NFC (Qwen2 / Qwen3), Prepend and
// Replace with a string pattern (the SentencePiece-style normalizers of Llama-2, Mistral, Gemma: Prepend("▁") then
// Replace(" ", "▁")), and Sequence of these. Applied to each piece of text between added tokens, as Hugging Face's
// tokenizers library does (Prepend only to a non-empty piece).
// defines: tok::Normalizer
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/json_reader.h"

namespace dflash::tok {

class Normalizer {
 public:
  // Reads `normalizer` (null: none). Throws Error naming `where` and the step for an unsupported type.
  static Normalizer load(const json& normalizer, const std::string& where);
  std::string apply(std::string_view s) const;
  bool empty() const { return steps_.empty(); }
  bool nfc() const;  // has an NFC step (the chat encoder re-derives offsets on NFC text)

 private:
  struct Step {
    enum Kind { kNfc, kPrepend, kReplace } kind = kNfc;
    std::string a, b;  // Prepend: a; Replace: a -> b
  };
  std::vector<Step> steps_;
};

}  // namespace dflash::tok
