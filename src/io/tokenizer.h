// io/tokenizer.h — Hugging Face tokenizer.json: byte-level BPE (GPT-2 byte alphabet) with the pre-tokenizer
// split regex (PCRE2, UTF + JIT), added / special tokens, encode and decode. Token ids equal those of the
// Hugging Face `tokenizers` library (checked against the transformers.js port in tests/oracle).
// defines: Tokenizer
//
// Thread safety: after construction every method is const and safe to call from many threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding tokenizer.json (and optionally
  // tokenizer_config.json, from which the chat template, bos/eos/pad/mask tokens are read).
  // Throws Error naming the file and field for anything it cannot parse or does not support.
  static std::shared_ptr<const Tokenizer> load(const std::string& path);

  // Encodes text. With parse_special, added tokens written in the text (e.g. "<|im_start|>") become their ids;
  // without, the *special* ones are encoded as plain text (HF `split_special_tokens=True`); non-special added
  // tokens such as Qwen3's "<think>" still match. No BOS is added, whatever the post-processor says (callers add
  // it when the template says so). Bytes that are not valid UTF-8 are tokenized as bytes.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Decodes ids to UTF-8 (invalid byte sequences become U+FFFD, as in HF). skip_special drops special tokens.
  // Unknown ids are skipped (as in HF); no clean_up_tokenization_spaces is applied.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;  // vocab or added token
  std::string id_to_token(int32_t id) const;                          // "" for an unknown id
  int64_t vocab_size() const;  // 1 + the largest id (vocab and added tokens)
  bool is_special(int32_t id) const;

  // From tokenizer_config.json where present (else nullopt / empty).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // The drafter's mask token: tokenizer_config "mask_token" if set, else an added token named "<|MASK|>"
  // or "<mask>"; nullopt if none.
  std::optional<int32_t> mask_id() const;
  const std::string& chat_template() const;  // the Jinja source, "" if none
  // SHA-256 of the tokenizer.json bytes (recorded in data manifests and exports).
  const std::string& hash() const;

  ~Tokenizer();
  struct Impl;

 private:
  Tokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
