// io/chat_template.h — a conversation rendered by the model's own chat template (its Jinja source, run by our
// engine io/jinja exactly as Hugging Face's apply_chat_template renders it), tokenized once, with the assistant
// loss mask of docs/spec.md 2.6.
// defines: BadRow, ChatMessage, parse_messages, validate_conversation, ChatTemplate, ChatOptions, RenderedChat,
//          AddedTokens, render_chat, ChatEncoding, ChatEncoder, ChatTemplateChoice, chat_flags, message_value,
//          py_strip
//
// Where the template comes from (ChatTemplate::load): a file given with --chat-template PATH (a .jinja file, or a
// tokenizer_config.json / JSON file with "chat_template"), else the tokenizer directory's tokenizer_config.json
// "chat_template" (a string, or a list of {"name", "template"}: the one named by --chat-template-name, else
// "default", else the first), else its chat_template.jinja.
//
// Variables the template sees (ChatOptions::variables): messages; tools (the row's "tools", else None);
// documents (None); add_generation_prompt; enable_thinking and reasoning_effort only when given (otherwise undefined,
// as apply_chat_template leaves a variable its caller does not pass); the tokenizer's special
// tokens bos_token, eos_token, unk_token, pad_token, sep_token, cls_token, mask_token (those it defines);
// every --template-arg key=value (value read as JSON when it parses, else as a string; it overrides the above).
// strftime_now formats ChatOptions::now (the start of the run; recorded when the template calls it).
//
// Supervised text (spec 2.6; ChatTemplate::mask_rule() names which applies):
//   "generation": the template has {% generation %} blocks: exactly the text they render (HF's
//                 return_assistant_tokens_mask).
//   "prefixes":   per assistant turn i, with R the whole conversation rendered. Texts are compared by their
//                 aligned common prefix: the longest common prefix, shortened so that it ends inside no added token
//                 of either text (a generation prompt ending "<think>\n\n</think>\n\n" and a turn starting
//                 "<tool_call>" share "<", not a token).
//                 start: where R departs from the prompt the model is served for this turn,
//                        P = render(messages[:i], add_generation_prompt=true): s = aligned common prefix of P and R;
//                        when R departs from P inside the history before P's generation prompt (the template
//                        renders earlier messages otherwise once later ones follow), where a stand-in turn (a
//                        sentinel content) rendered as the last message, A, has its content, if R agrees with A up
//                        to there;
//                 end:   L = render(messages[:i+1]); when R begins with L, e = |L| (the turn renders the same
//                        whether or not later turns follow); else the template renders the turn, or the text after
//                        it, differently once later messages follow (it drops the turn's reasoning, ends it with
//                        another token, or writes an end-of-sequence text only after the last message): the stand-in
//                        turn is rendered alone, A, and followed by the next message, W; with
//                        N = render(messages[:i+2]), which ends with W's text after the sentinel, the turn's content
//                        ends at e = |N| - |W after the sentinel| (N and R agree up to there); the turn's closing
//                        text is the aligned common prefix of what follows the sentinel in A and in W and of what
//                        follows the content in R (when A's and W's differ from their first character and both
//                        begin with an added token, W's token: the last turn ends with another token than the
//                        earlier ones), and stays with the turn; where the
//                        stand-in shows nothing (the next message renders otherwise after it, or the template
//                        refuses it), the turn ends at the aligned common prefix of L and R;
//                 then whitespace after the turn's last added token (the separator the template writes between
//                 turns, e.g. "\n" after <|im_end|>) is not supervised.
//   So each assistant turn is trained on what the model generates after its served prompt: its reasoning as the
//   template renders it in R (dropped for earlier turns by templates that drop it: not trained), its content, its
//   tool calls and its end-of-turn token; never the role header, the generation prompt, system / user / tool text.
//   With enable_thinking=true (or undefined) and no reasoning, Qwen3-style templates render an empty think block
//   after the prompt: it is supervised (it is what follows the served prompt); with enable_thinking=false it is
//   part of the prompt.
// Token rule: the rendered text is tokenized as ONE string (token-identical to HF with add_special_tokens=False);
// token k is supervised iff its first byte lies in a supervised span. Token byte offsets come from each token's
// bytes (Tokenizer::token_bytes) matched against the text, allowing the normalizer's NFC and the space a
// SentencePiece normalizer prepends; tokens that do not reproduce the text are a BadRow("tokenization_mismatch").
//
// Thread safety: ChatTemplate and ChatEncoder are immutable after construction; their methods are const and may
// run on many threads.
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/jinja/value.h"

namespace dflash {

class Tokenizer;
namespace jinja {
class Template;
}

// A row that cannot become a training sample. reason() is a short stable key used for per-reason counts
// (e.g. "empty_messages", "unknown_role", "assistant_first", "not_alternating", "system_only", "no_assistant",
// "empty_content", "bad_message", "template_refused", "template_error", "template_mask",
// "tokenization_mismatch"); what() says what is wrong in words.
class BadRow : public Error {
 public:
  BadRow(std::string reason, const std::string& message) : Error(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

struct ChatMessage {
  std::string role;  // "system" | "developer" | "user" | "assistant" | "tool"
  std::string content;
  std::optional<std::string> reasoning_content;  // the "reasoning_content" field when present and not null
  // The message as given (every key, in order: tool_calls, name, thinking, ...); what the template sees. When
  // null, the template sees {"role", "content"[, "reasoning_content"]} from the fields above.
  nlohmann::ordered_json source;
  bool has_tool_calls() const;
};

// OpenAI-style messages: a JSON array of objects with "role" and "content" (a string; null for an assistant turn
// with tool calls), optional "reasoning_content" (string or null), "tool_calls" and any other keys, which are kept
// for the template. Throws BadRow: "bad_message" (not an array, a message that is not an object, role / content
// missing or of the wrong type), "unknown_role" (not system, developer, user, assistant, tool).
std::vector<ChatMessage> parse_messages(const nlohmann::ordered_json& messages);

// The structure a training conversation must have: [system | developer] user, then assistant and user turns in
// alternation, where an assistant turn with tool calls may be followed by tool messages and then the assistant
// again. Throws BadRow, checked in this order: "empty_messages", "unknown_role", "system_only", "not_alternating"
// (a system message after the first position, two user or two assistant turns in a row, a tool message not after
// an assistant tool call or another tool message), "assistant_first", "no_assistant", "empty_content" (a user turn
// that is empty or whitespace, an assistant turn with neither content, reasoning nor tool calls). With
// allow_no_assistant (prompts for generation) "no_assistant" is not an error.
void validate_conversation(std::span<const ChatMessage> messages, bool allow_no_assistant = false);

struct ChatOptions {
  bool add_generation_prompt = false;  // append the assistant header (generation prompts)
  std::optional<bool> enable_thinking;  // passed as `enable_thinking` when set (--thinking / --no-thinking)
  std::optional<std::string> reasoning_effort;  // passed as `reasoning_effort` when set (gpt-oss: low/medium/high)
  // --template-arg key=value pairs, values already parsed (JSON when the text parses, else a string).
  std::vector<std::pair<std::string, nlohmann::ordered_json>> template_args;
  nlohmann::ordered_json tools;  // the `tools` variable (null: None)
  std::time_t now = 0;           // what strftime_now formats (0: the time of the call)
};

// What a command line chooses about templates (prepare, generate, tokenize share it): which template, and the
// variables. `now` 0: the time the options are turned into ChatOptions.
struct ChatTemplateChoice {
  std::string chat_template = "auto";      // auto (the tokenizer's own), or a .jinja file / a JSON file with
                                           // "chat_template" (a tokenizer_config.json)
  std::string chat_template_name;          // which of a list of named templates ("": "default", else the first)
  std::optional<bool> enable_thinking;     // --thinking / --no-thinking; unset: the template sees it undefined
  std::string reasoning_effort;            // "" = not passed
  std::vector<std::string> template_args;  // "key=value" (value: JSON if it parses, else a string)
  std::time_t now = 0;
  // The variables. Throws Error for a template argument that is not key=value or names a variable the engine
  // sets itself (messages, tools, documents, add_generation_prompt).
  ChatOptions options() const;
};

// The template variables of `o` as the manifest and the export record them ("flags"): add_generation_prompt,
// enable_thinking and reasoning_effort (when set), template_args (when any), strftime_now (the date string
// "%Y-%m-%d %H:%M:%S" of o.now, when the template calls strftime_now).
nlohmann::json chat_flags(const ChatOptions& o, const class ChatTemplate* tmpl);

class ChatTemplate {
 public:
  // The template's source and where it came from (recorded). Throws Error naming `origin` and the template line
  // for a syntax error or an unsupported construct.
  ChatTemplate(std::string source, std::string origin);
  // Finds the template for a tokenizer (see the header comment). `path` "" or "auto": the tokenizer's own;
  // `name` picks one of a named list. Throws Error when there is none (the message says where it looked).
  static ChatTemplate load(const Tokenizer& tok, const std::string& path, const std::string& name = "");

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }
  const std::string& sha256() const { return sha256_; }
  const char* mask_rule() const;        // "generation" | "prefixes"
  bool uses_strftime_now() const;
  // Renders `messages` with the variables of `opts` and `special` (the tokenizer's special tokens). Throws BadRow
  // "template_refused" (the template's raise_exception) or "template_error" (a runtime error, with its line).
  std::string render(std::span<const ChatMessage> messages, const ChatOptions& opts,
                     const nlohmann::ordered_json& special = {}) const;
  // {"sha256", "origin", "mask_rule"} for manifests and exports.
  nlohmann::json to_json() const;

  // render() with the byte ranges the template's {% generation %} blocks produced (empty without them).
  struct Rendered {
    std::string text;
    std::vector<std::pair<size_t, size_t>> generation;
  };
  Rendered render_full(std::span<const ChatMessage> messages, const ChatOptions& opts,
                       const nlohmann::ordered_json& special) const;
  // The same, with the messages already as template values (message_value): render_chat renders many prefixes
  // of one conversation and converts its messages once.
  Rendered render_values(const jinja::List& messages, const ChatOptions& opts,
                         const nlohmann::ordered_json& special) const;

 private:
  std::string source_, origin_, sha256_;
  std::shared_ptr<const jinja::Template> tmpl_;
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

// A tokenizer's added tokens, indexed for the span rule: which of them occur around a position of a text.
class AddedTokens {
 public:
  AddedTokens() = default;
  explicit AddedTokens(std::vector<std::string> tokens);
  // Where the added token that `text` holds across position `at` starts (one that begins before `at` and ends
  // after it; the earliest such), or npos.
  size_t straddling(std::string_view text, size_t at) const;
  std::string_view leading(std::string_view s) const;  // the longest added token `s` begins with ("" when none)
  bool ends_with_one(std::string_view s) const;        // whether `s` ends with an added token

 private:
  std::vector<std::string> sorted_;  // sorted, for binary search of a text's prefixes
  size_t max_len_ = 0;
  bool first_[256] = {};             // bytes some token begins with
  bool has(std::string_view t) const;
};

// Renders `messages` and marks the supervised spans (the rule above; none with add_generation_prompt). `special`:
// the special-token variables; `added`: the tokenizer's added tokens (alignment, closing token, end-of-turn trim).
// Throws BadRow as ChatTemplate::render, and "template_mask" when a turn's output cannot be located.
RenderedChat render_chat(const ChatTemplate& tmpl, std::span<const ChatMessage> messages, const ChatOptions& opts,
                         const nlohmann::ordered_json& special = {}, const AddedTokens& added = {});

struct ChatEncoding {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  // same length as ids, values 0/1
};

class ChatEncoder {
 public:
  ChatEncoder(std::shared_ptr<const Tokenizer> tokenizer, ChatTemplate tmpl);
  // render_chat + tokenize the whole text once + mask by token start offsets. Throws BadRow as above.
  ChatEncoding encode(std::span<const ChatMessage> messages, const ChatOptions& opts) const;
  RenderedChat render(std::span<const ChatMessage> messages, const ChatOptions& opts) const;
  ChatEncoding encode_rendered(const RenderedChat& rendered) const;
  const ChatTemplate& chat_template() const { return tmpl_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  // The tokenizer's special-token variables ({"bos_token": ..., ...}), as the template sees them.
  const nlohmann::ordered_json& special_tokens() const { return special_; }
  // The exact bytes of token `id` in the normalized text ("" for an id outside the vocabulary).
  std::string_view token_bytes(int32_t id) const;

 private:
  std::shared_ptr<const Tokenizer> tok_;
  ChatTemplate tmpl_;
  nlohmann::ordered_json special_;
  AddedTokens added_;
};

// A message as the template sees it: its source object (every key, in order), or {"role", "content"
// [, "reasoning_content"]} from the fields.
jinja::Value message_value(const ChatMessage& m);

// Python str.strip / lstrip / rstrip on UTF-8 text (io/jinja/value.h).
using jinja::py_strip;

}  // namespace dflash
