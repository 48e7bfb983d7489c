// io/chat_template.h — renders a conversation the way the model's own Jinja chat template does (ChatML for
// Qwen2/Qwen2.5/Qwen3 with Qwen3's think-tag rules; Llama-3 / Llama-3.1 headers), tokenizes it once and derives
// the assistant loss mask from byte offsets.
// defines: BadRow, ChatMessage, parse_messages, validate_conversation, ChatTemplate, ChatOptions, RenderedChat,
//          render_chat, ChatEncoding, ChatEncoder, py_strip
//
// Rendering semantics. Output equals the template rendered by Python jinja2 (transformers' apply_chat_template,
// which is what vLLM / SGLang use when they serve the model) and then tokenized by the HF tokenizer with
// add_special_tokens=False. The one place where the npm package @huggingface/jinja 0.5.x (our test oracle)
// differs: it ignores the argument of str.strip/lstrip/rstrip (Qwen3's `.strip('\n')` trims every kind of
// whitespace there). We follow Python; the tests check both agree wherever the package is faithful and check
// the Python behaviour through the oracle's python_strip mode. `trim` uses Python's str.strip() whitespace set.
//
// Loss mask (spec 2.6, case C14). mask = 1 exactly on each assistant turn's output:
//   ChatML:  content and its `<|im_end|>`; 0 on `<|im_start|>assistant\n`, on the "\n" after `<|im_end|>`, on
//            system/user turns and on the generation prompt.
//   Qwen3:   as ChatML; a think block `<think>\n{r}\n</think>\n\n` that the template renders for a turn is
//            assistant output (mask 1, tags included: the model generates them in thinking mode) when r is
//            non-empty, and 0 when empty (`<think>\n\n</think>\n\n`, the tags the template inserts itself).
//   Llama-3: trimmed content and its `<|eot_id|>`; 0 on `<|start_header_id|>assistant<|end_header_id|>\n\n`, on
//            bos, on the system block (including Llama-3.1's "Cutting Knowledge Date" lines) and on user turns.
// Token rule: the rendered text is tokenized as ONE string (token-identical to HF). For byte-level BPE every
// token's bytes are exact, so cumulative byte lengths give each token's span; a token is supervised iff its
// FIRST byte lies inside a supervised span. (A token straddling a boundary therefore belongs to the side where
// it starts; with these templates that only happens for unusual whitespace at the very start of a content.)
// If the tokenizer normalizes the text (Qwen's NFC) the spans are re-derived on the NFC form of each segment;
// if the token bytes still do not reproduce the text, encode() throws BadRow("tokenization_mismatch").
//
// Thread safety: ChatTemplate / ChatEncoder are immutable after construction; encode() is const and may be
// called from many threads.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"

namespace dflash {

class Tokenizer;

// A row that cannot become a training sample. reason() is a short stable key used for per-reason counts
// (e.g. "empty_messages", "unknown_role", "assistant_first", "not_alternating", "system_only", "no_assistant",
// "empty_content", "bad_message", "tokenization_mismatch"); what() says what is wrong in words.
class BadRow : public Error {
 public:
  BadRow(std::string reason, const std::string& message) : Error(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant"
  std::string content;
  // Assistant only: the `reasoning_content` field when present and not null (Qwen3 think block). Without it,
  // Qwen3 takes the reasoning from `<think>...</think>` inside content, exactly as its template does.
  std::optional<std::string> reasoning_content;
};

// OpenAI-style messages: a JSON array of {"role": string, "content": string, "reasoning_content": string|null}.
// Other keys are ignored except "tool_calls" (non-empty: BadRow "unsupported_tool_calls").
// Throws BadRow: "bad_message" (not an array, a message that is not an object, role/content missing or not a
// string), "unknown_role" (a role other than system/user/assistant).
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages);

// The structure a training conversation must have: [system] user assistant (user assistant)* [user].
// Throws BadRow, checked in this order: "empty_messages" (no messages), "unknown_role", "system_only",
// "not_alternating" (a system message after the first position, or two user / two assistant turns in a row),
// "assistant_first" (first non-system turn is the assistant's), "no_assistant", "empty_content" (a user turn
// whose content is empty or whitespace only, or an assistant turn with neither content nor reasoning).
// A system message may be empty. With allow_no_assistant (prompts for eval) "no_assistant" is not an error.
void validate_conversation(std::span<const ChatMessage> messages, bool allow_no_assistant = false);

// Which template, with the details read from its source.
struct ChatTemplate {
  enum class Family { ChatML, Llama3 };
  std::string name;  // "qwen3" | "chatml" | "llama3" | "llama3.1"
  Family family = Family::ChatML;
  bool qwen3_think = false;         // ChatML: Qwen3's think-tag and last-query rules
  std::string default_system;       // ChatML: system text used when the conversation has none ("" = none);
                                    //   Qwen2.5: "You are Qwen, created by Alibaba Cloud. You are a helpful
                                    //   assistant.", Qwen2: "You are a helpful assistant."
  bool llama_system_block = false;  // Llama-3.1: the system block is always rendered, with the date lines
  std::string date_string;          // Llama-3.1: "26 Jul 2024" (the template's own fallback; never today's date)
  std::string bos_token;            // Llama: "<|begin_of_text|>" (rendered where the template writes bos_token)
  std::string source_sha256;        // sha256 of the Jinja source it was made from ("" when none)

  // Detects the template from its Jinja source. Throws Error when the source matches none of the supported
  // families (the message suggests --chat-template).
  static ChatTemplate detect(std::string_view jinja, const std::string& bos_token);
  // name: "auto" (detect) | "qwen3" | "chatml" | "llama3" | "llama3.1". An explicit name picks the family;
  // details (default system text, date string) are still read from `jinja` when it is of that family.
  static ChatTemplate select(const std::string& name, std::string_view jinja, const std::string& bos_token);
  // {"name", "source_sha256", "default_system", "date_string", "bos_token"} for manifests and exports.
  nlohmann::json to_json() const;
};

struct ChatOptions {
  bool enable_thinking = true;         // Qwen3: false makes the generation prompt end in an empty think block
  bool add_generation_prompt = false;  // append the assistant header (eval prompts)
};

// Rendered text as contiguous segments, each supervised or not; the segments cover text exactly.
struct RenderedChat {
  struct Segment {
    size_t begin = 0, end = 0;  // byte range in text
    bool supervised = false;
  };
  std::string text;
  std::vector<Segment> segments;
};

// Renders `messages` (not validated here beyond what rendering needs: roles must be system/user/assistant).
RenderedChat render_chat(const ChatTemplate& tmpl, std::span<const ChatMessage> messages, const ChatOptions& opts);

struct ChatEncoding {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  // same length as ids, values 0/1
};

class ChatEncoder {
 public:
  // Builds a table of every token's bytes (byte-level BPE vocabulary; added tokens are their literal text).
  ChatEncoder(std::shared_ptr<const Tokenizer> tokenizer, ChatTemplate tmpl);
  // render_chat + tokenize the whole text once + mask by token start offsets. Throws BadRow as above.
  ChatEncoding encode(std::span<const ChatMessage> messages, const ChatOptions& opts) const;
  ChatEncoding encode_rendered(const RenderedChat& rendered) const;
  const ChatTemplate& chat_template() const { return tmpl_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  // The exact bytes of token `id` ("" for an id outside the vocabulary).
  std::string_view token_bytes(int32_t id) const;

 private:
  std::shared_ptr<const Tokenizer> tok_;
  ChatTemplate tmpl_;
  std::vector<std::string> bytes_;
};

// Python str.strip / lstrip / rstrip on UTF-8 text. chars == nullopt: Python's whitespace (str.isspace);
// else the code points of *chars.
std::string py_strip(std::string_view s, const std::optional<std::string_view>& chars, bool left = true,
                     bool right = true);

}  // namespace dflash
