// io/prepare.h — data files of chat rows -> a tokenized, loss-masked data directory (spec 2.6). The library core
// of `dflash prepare`; the demo pipeline calls run_prepare directly.
// defines: PrepareOptions, SkippedRow, PrepareSummary, RowConverter, PreparedRow, conversations_to_messages,
//          run_prepare
//
// Input files (layout detected per file, io/jsonl.h detect_data_file; plain or gzip; any mix in one run):
//   JSON Lines (one row per line), or a .json / .json.gz file holding one JSON array of rows (read element by
//   element, never whole).
// Rows (each file may mix them):
//   {"messages": [{"role", "content", "reasoning_content"?, "tool_calls"?, ...}, ...], "tools"?: [...]}
//        the model's chat template (the row's "tools" become the template's `tools`) + assistant loss mask
//   {"conversations": [{"from", "value"}, ...]}                      ShareGPT; or [{"role", "content"}, ...] as
//        SpecForge writes it. Roles human/user -> user, gpt/assistant/model -> assistant, system -> system
//        (conversations_to_messages), then exactly as a messages row ("messages" wins in a row with both)
//   {"prompt": "...", "completion": "..."}                            --format chat: user prompt + assistant
//        completion through the template; --format raw: [bos] tokens(prompt) + tokens(completion) + eos, mask 1 on
//        completion + eos (bos only when the tokenizer defines one, as HF's add_special_tokens does); in raw
//        form, rows that also carry "prompt_ids" and "completion_ids" (dflash generate --write-ids) use those exact
//        ids (checked to decode to the text, else skipped as "ids_text_mismatch")
//   {"input_ids": [...], "loss_mask": [...]}                          taken as is (validated)
// Every sample is cut to max_length tokens. A row is skipped, with its file, line number (and, in a JSON array,
// its element index) and a reason key, when it is not valid JSON ("invalid_json"; also an empty array slot),
// not an object ("not_object"), none of the four kinds ("unrecognized_row"), a blank line ("empty_line"), a
// conversation breaking the rules of validate_conversation (chat_template.h: "empty_messages", "unknown_role",
// "system_only", "not_alternating", "assistant_first", "no_assistant", "empty_content", "bad_message"; the
// template's own refusal "template_refused" (raise_exception), "template_error" (a runtime error of the template,
// with its line), "template_mask" (a turn whose output cannot be located), ...), a
// bad pair ("bad_pair") or pre-tokenized row ("bad_pretokenized"), or when the sample has no supervised pair (a
// position a with mask[a] = mask[a+1] = 1; spec 2.1): "too_long" if the cut removed it, else
// "no_supervised_pair". Nothing is dropped silently: every skip is counted per reason (summary and manifest) and
// the first few per reason are logged. A file that cannot be read to its end (truncated gzip or JSON array, a
// .json file that is not an array) is an error, not a skip.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/chat_template.h"

namespace dflash {

class Tokenizer;

struct PrepareOptions : ChatTemplateChoice {  // the template and its variables: chat_template.h
  std::string tokenizer;            // tokenizer.json or a directory holding it (+ tokenizer_config.json)
  std::vector<std::string> inputs;  // JSON Lines or .json array files, plain or gzip
  std::string out;                  // the data directory to create
  int64_t max_length = 3072;        // tokens per sample after the cut (>= 2)
  int threads = 0;                  // tokenization threads; <= 0: all cores. Output bytes do not depend on it.
  std::string format = "auto";      // auto | chat | raw (how prompt/completion rows are turned into tokens);
                                    // auto = chat when a chat template is available, else raw
  bool overwrite = false;
  int log_skipped_per_reason = 5;   // skipped rows logged (and kept in the summary) per reason
  bool progress = true;             // progress lines on stderr
  int64_t shard_tokens = int64_t{1} << 28;
  int64_t batch_rows = 0;           // rows per parallel batch; <= 0: 512 per thread
};

struct SkippedRow {
  std::string file;
  int64_t line = 0;    // 1-based (JSON array: the line on which the element starts)
  int64_t index = -1;  // JSON array: the element's 0-based index; JSON Lines: -1
  std::string reason;
  std::string message;
};

struct PrepareSummary {
  std::string out;
  int64_t rows_read = 0, samples = 0, tokens = 0, supervised_tokens = 0, truncated = 0;
  std::map<std::string, int64_t> skipped;  // reason -> count
  std::vector<SkippedRow> skipped_rows;    // the first log_skipped_per_reason of each reason, in input order
  double seconds = 0;
  int64_t skipped_total() const;
  std::string to_string() const;  // the multi-line summary printed by the CLI
};

struct PreparedRow {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;
  bool truncated = false;
  const char* shape = "";  // the row's kind: "messages" | "conversations" | "prompt_completion" | "input_ids"
};

// Turns rows into samples. Immutable after construction; convert() is thread safe.
class RowConverter {
 public:
  // Resolves the format and the chat template (Error when --format chat has no template, or the template does not
  // parse or uses a construct the engine lacks and --format is not raw).
  RowConverter(std::shared_ptr<const Tokenizer> tokenizer, const PrepareOptions& opts);
  // One row's JSON text (a line, or an element of a JSON array) -> sample. Throws BadRow for a row to skip.
  // line_number (1-based, 0 = unknown) places a JSON syntax error in the file: "invalid JSON: parse error at column
  // 90 of line 3: ..." (jsonl.h json_row_error).
  PreparedRow convert(std::string_view line, int64_t line_number = 0) const;
  // True when prompt/completion rows go through the chat template.
  bool chat_pairs() const { return chat_pairs_; }
  const ChatEncoder* chat() const { return chat_.get(); }
  // {"tokenizer": {...}, "chat_template": {"sha256", "origin", "mask_rule"} | null, "flags": {"format", "pairs",
  // + chat_flags (every template variable)}, "max_length": n} for the manifest.
  nlohmann::json describe() const;

 private:
  PreparedRow finish(PreparedRow r) const;
  std::shared_ptr<const Tokenizer> tok_;
  std::unique_ptr<ChatEncoder> chat_;
  ChatOptions chat_opts_;
  bool chat_pairs_ = false;
  int64_t max_length_ = 0;
  std::string format_requested_;
  std::optional<int32_t> bos_, eos_;
};

// The "conversations" of a ShareGPT or SpecForge row -> the same conversation as a "messages" array, which then
// goes through parse_messages. Each turn is {"from", "value"} (ShareGPT; used when "from" is present) or
// {"role", "content"}; role names map human/user -> "user", gpt/assistant/model -> "assistant", system -> "system".
// Other keys of a turn are kept (e.g. "reasoning_content"). Throws BadRow: "bad_message" (not an array, a turn
// that is not an object or has no string role / text), "unknown_role" (naming the turn's index and role).
nlohmann::ordered_json conversations_to_messages(nlohmann::ordered_json conversations);

// Runs the whole preparation: reads every input in order, converts rows on opts.threads threads, writes the data
// directory atomically (DatasetWriter) and returns the summary. The manifest's "inputs" entries record each
// file's "format" ("jsonl" | "json_array"), "gzip" and "samples_by_shape" (samples written per row kind). Throws
// Error (and leaves no output, and an earlier data set in <out> as it was) when an input cannot be read (see
// detect_data_file, JsonArrayReader), <out> holds a data set and overwrite is not set, <out> holds anything else
// (core/output_dir.h), or no row survives (the message lists the skip reasons).
PrepareSummary run_prepare(const PrepareOptions& opts);

}  // namespace dflash
