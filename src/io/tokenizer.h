// io/tokenizer.h — Hugging Face tokenizer.json: BPE, byte-level (GPT-2, Llama-3, Qwen, DeepSeek-V3, gpt-oss)
// or SentencePiece-style with byte fallback (Llama-2, Mistral, Gemma), with added / special tokens, encode and
// decode, and what tokenizer_config.json says (special tokens, chat templates). Token ids equal those of the
// Hugging Face `tokenizers` library (checked against the transformers.js port in tests/oracle). Like that
// library, each section of tokenizer.json is its own piece (io/tokenizer/): added_vocabulary, normalizer,
// pre_tokenizer, bpe_model, decoder; a new kind is one more case in one piece. A tiktoken directory (Kimi-K2 / K2.5:
// tiktoken.model + tokenization_kimi.py + tokenizer_config.json, no tokenizer.json; io/tokenizer/tiktoken_model.h)
// is read into the same pieces; its ids equal those of Kimi's TikTokenTokenizer (tiktoken).
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
#include <utility>
#include <vector>

namespace dflash {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding tokenizer.json (and optionally
  // tokenizer_config.json, from which the chat template, bos/eos/pad/mask tokens are read); a directory with no
  // tokenizer.json but a tiktoken.model (or that file itself) is a tiktoken tokenizer (tiktoken_model.h).
  // Throws Error naming the file and field for anything it cannot parse or does not support.
  static std::shared_ptr<const Tokenizer> load(const std::string& path);
  // Whether directory `dir` holds a tokenizer load() reads: tokenizer.json, or tiktoken.model.
  static bool found_in(const std::string& dir);
  // The file a tokenizer was read from: tokenizer.json, or tiktoken.model.
  const std::string& source() const;

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
  // Chat templates: tokenizer_config.json "chat_template" (a string: one entry named ""; a list of {"name",
  // "template"}: each), else chat_template.jinja (one entry named ""). chat_template() is the "default" one (else
  // the first), "" if none; chat_template_origin() names the file it came from (or where it was looked for).
  const std::string& chat_template() const;
  const std::vector<std::pair<std::string, std::string>>& chat_templates() const;
  const std::string& chat_template_origin() const;
  // tokenizer_config.json's special tokens that are set, as (name, content): bos_token, eos_token, unk_token,
  // pad_token, sep_token, cls_token, mask_token — the variables Hugging Face passes to a chat template.
  const std::vector<std::pair<std::string, std::string>>& special_tokens() const;
  // The contents of every added token (tokenizer.json "added_tokens"; tiktoken: the special ids' tokens).
  const std::vector<std::string>& added_tokens() const;
  // The exact bytes token `id` stands for in the normalized text, before the decoder's sequence-level steps
  // (Strip): byte-level tokens' bytes, SentencePiece pieces with "▁" as " " and <0xXX> as the byte; special
  // added tokens: their content. "" for an unknown id.
  std::string_view token_bytes(int32_t id) const;
  // SHA-256 of the tokenizer.json bytes (tiktoken: TiktokenModel::hash) (recorded in data manifests and exports).
  const std::string& hash() const;

  ~Tokenizer();
  struct Impl;

 private:
  Tokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
