// io/prepare.cpp — see prepare.h.
#include "io/prepare.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/sha256.h"
#include "core/thread_pool.h"
#include "io/dataset.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"

namespace dflash {

using nlohmann::json;

namespace {

bool has_supervised_pair(const std::vector<uint8_t>& m) {
  for (size_t a = 0; a + 1 < m.size(); ++a) {
    if (m[a] && m[a + 1]) return true;
  }
  return false;
}

std::string fmt_count(double v) {
  char buf[32];
  if (v >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  } else if (v >= 1e4) {
    std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  }
  return buf;
}

}  // namespace

// ---- RowConverter ------------------------------------------------------------------------------------------

RowConverter::RowConverter(std::shared_ptr<const Tokenizer> tokenizer, const PrepareOptions& o)
    : tok_(std::move(tokenizer)), max_length_(o.max_length), format_requested_(o.format) {
  DFLASH_CHECK(tok_ != nullptr, "prepare: no tokenizer");
  DFLASH_CHECK(o.format == "auto" || o.format == "chat" || o.format == "raw", "--format: \"", o.format,
               "\" is not one of auto, chat, raw");
  DFLASH_CHECK(o.max_length >= 2, "--max-length ", o.max_length, ": must be at least 2");
  chat_opts_ = o.options();
  chat_opts_.add_generation_prompt = false;
  bos_ = tok_->bos_id();
  eos_ = tok_->eos_id();
  const bool have_template = !tok_->chat_templates().empty() || (o.chat_template != "auto" && !o.chat_template.empty());
  if (have_template) {
    try {
      chat_ = std::make_unique<ChatEncoder>(tok_, ChatTemplate::load(*tok_, o.chat_template, o.chat_template_name));
    } catch (const Error& e) {
      // An unusable template only matters when rows will need it; with --format raw, messages rows are skipped.
      if (o.format != "raw") throw;
      log_warn("no chat template: ", e.what());
    }
  }
  if (o.format == "chat") {
    DFLASH_CHECK(chat_ != nullptr, "--format chat: the tokenizer has no chat template (tokenizer_config.json "
                 "\"chat_template\" or chat_template.jinja); pass --chat-template FILE.jinja");
  }
  chat_pairs_ = o.format == "chat" || (o.format == "auto" && chat_ != nullptr);
  if (!chat_pairs_) {
    DFLASH_CHECK(eos_.has_value(), "--format raw needs an end-of-sequence token, and the tokenizer defines none "
                 "(tokenizer_config.json \"eos_token\")");
  }
}

PreparedRow RowConverter::finish(PreparedRow r) const {
  if (static_cast<int64_t>(r.ids.size()) > max_length_) {
    r.ids.resize(static_cast<size_t>(max_length_));
    r.loss_mask.resize(static_cast<size_t>(max_length_));
    r.truncated = true;
  }
  if (!has_supervised_pair(r.loss_mask)) {
    if (r.truncated) {
      throw BadRow("too_long", cat("no supervised token pair left after the cut to --max-length ", max_length_));
    }
    throw BadRow("no_supervised_pair", "no two consecutive supervised tokens (nothing to train on)");
  }
  return r;
}

PreparedRow RowConverter::convert(std::string_view line, int64_t line_number) const {
  if (py_strip(line, std::nullopt).empty()) throw BadRow("empty_line", "blank line");
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(line);
  } catch (const nlohmann::ordered_json::parse_error& e) {
    throw BadRow("invalid_json", cat("invalid JSON: ", json_row_error(e, line_number)));
  }
  if (!j.is_object()) throw BadRow("not_object", cat("the row is a JSON ", j.type_name(), ", not an object"));
  PreparedRow r;
  if (j.contains("input_ids")) {
    const auto& ids = j["input_ids"];
    auto lm = j.find("loss_mask");
    if (!ids.is_array() || ids.empty()) throw BadRow("bad_pretokenized", "\"input_ids\" is not a non-empty array");
    if (lm == j.end() || !lm->is_array()) throw BadRow("bad_pretokenized", "\"loss_mask\" is missing or not an array");
    if (lm->size() != ids.size()) {
      throw BadRow("bad_pretokenized", cat("\"input_ids\" has ", ids.size(), " entries, \"loss_mask\" ", lm->size()));
    }
    const int64_t vocab = tok_->vocab_size();
    r.ids.reserve(ids.size());
    r.loss_mask.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto& v = ids[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
        throw BadRow("bad_pretokenized", cat("input_ids[", i, "] = ", v.dump(), " is not a token id in [0, ", vocab,
                                             ")"));
      }
      const auto& m = (*lm)[i];
      int mv = -1;
      if (m.is_boolean()) mv = m.get<bool>() ? 1 : 0;
      if (m.is_number_integer() && (m.get<int64_t>() == 0 || m.get<int64_t>() == 1)) mv = static_cast<int>(m.get<int64_t>());
      if (mv < 0) throw BadRow("bad_pretokenized", cat("loss_mask[", i, "] = ", m.dump(), " is not 0 or 1"));
      r.ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
      r.loss_mask.push_back(static_cast<uint8_t>(mv));
    }
    r.shape = "input_ids";
    return finish(std::move(r));
  }
  const bool conversations = !j.contains("messages") && j.contains("conversations");
  if (j.contains("messages") || conversations) {
    std::vector<ChatMessage> ms = conversations
                                      ? parse_messages(conversations_to_messages(std::move(j["conversations"])))
                                      : parse_messages(j["messages"]);
    validate_conversation(ms);
    if (!chat_) throw BadRow("no_chat_template", "a conversation row, and no chat template is available");
    ChatEncoding e;
    if (auto tools = j.find("tools"); tools != j.end() && !tools->is_null()) {
      if (!tools->is_array()) throw BadRow("bad_message", "\"tools\" is not an array");
      ChatOptions with_tools = chat_opts_;
      with_tools.tools = *tools;
      e = chat_->encode(ms, with_tools);
    } else {
      e = chat_->encode(ms, chat_opts_);
    }
    r.ids = std::move(e.ids);
    r.loss_mask = std::move(e.loss_mask);
    r.shape = conversations ? "conversations" : "messages";
    return finish(std::move(r));
  }
  if (j.contains("prompt") || j.contains("completion")) {
    r.shape = "prompt_completion";
    auto p = j.find("prompt"), c = j.find("completion");
    if (p == j.end() || c == j.end() || !p->is_string() || !c->is_string()) {
      throw BadRow("bad_pair", "\"prompt\" and \"completion\" must both be strings");
    }
    const std::string prompt = p->get<std::string>(), completion = c->get<std::string>();
    if (chat_pairs_) {
      std::vector<ChatMessage> ms = {{"user", prompt, std::nullopt, {}}, {"assistant", completion, std::nullopt, {}}};
      validate_conversation(ms);
      ChatEncoding e = chat_->encode(ms, chat_opts_);
      r.ids = std::move(e.ids);
      r.loss_mask = std::move(e.loss_mask);
      return finish(std::move(r));
    }
    if (py_strip(completion, std::nullopt).empty()) throw BadRow("empty_content", "the completion is empty");
    if (j.contains("prompt_ids") && j.contains("completion_ids")) {
      // exact ids as `dflash generate --write-ids` wrote them (the prompt's bos included): re-encoding the text
      // could tokenize the target's own output differently, and the data must be the target's tokens
      auto ids_of = [&](const char* key) {
        const auto& a = j[key];
        if (!a.is_array()) throw BadRow("bad_pair", cat("\"", key, "\" is not an array"));
        std::vector<int32_t> v;
        for (const auto& x : a) {
          if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok_->vocab_size())
            throw BadRow("bad_pair", cat("\"", key, "\" holds ", x.dump(), ", not a token id"));
          v.push_back(static_cast<int32_t>(x.get<int64_t>()));
        }
        return v;
      };
      // the prompt ids are the encoder's (generate encoded the prompt text); the completion ids decode to the text
      std::vector<int32_t> a = ids_of("prompt_ids"), b = ids_of("completion_ids");
      std::vector<int32_t> want = tok_->encode(prompt, true);
      if (bos_) want.insert(want.begin(), *bos_);
      if (a != want) throw BadRow("ids_text_mismatch", "\"prompt_ids\" is not the encoding of \"prompt\"");
      if (tok_->decode(b) != completion)
        throw BadRow("ids_text_mismatch", "\"completion_ids\" does not decode to \"completion\"");
      r.ids = a;
      r.loss_mask.assign(a.size(), 0);
      r.ids.insert(r.ids.end(), b.begin(), b.end());
      r.loss_mask.insert(r.loss_mask.end(), b.size(), 1);
      r.ids.push_back(*eos_);
      r.loss_mask.push_back(1);
      return finish(std::move(r));
    }
    if (bos_) {
      r.ids.push_back(*bos_);
      r.loss_mask.push_back(0);
    }
    std::vector<int32_t> a = tok_->encode(prompt, true);
    std::vector<int32_t> b = tok_->encode(completion, true);
    r.ids.insert(r.ids.end(), a.begin(), a.end());
    r.loss_mask.insert(r.loss_mask.end(), a.size(), 0);
    r.ids.insert(r.ids.end(), b.begin(), b.end());
    r.loss_mask.insert(r.loss_mask.end(), b.size(), 1);
    r.ids.push_back(*eos_);
    r.loss_mask.push_back(1);
    return finish(std::move(r));
  }
  throw BadRow("unrecognized_row", "the row has none of \"messages\", \"conversations\", \"prompt\"/\"completion\", "
                                   "\"input_ids\"");
}

nlohmann::ordered_json conversations_to_messages(nlohmann::ordered_json conv) {
  if (!conv.is_array()) throw BadRow("bad_message", "\"conversations\" is not an array");
  for (size_t i = 0; i < conv.size(); ++i) {
    auto& m = conv[i];
    if (!m.is_object()) throw BadRow("bad_message", cat("conversations[", i, "] is not an object"));
    const bool sharegpt = m.contains("from");
    const char* role_key = sharegpt ? "from" : "role";
    const char* text_key = sharegpt ? "value" : "content";
    auto r = m.find(role_key);
    if (r == m.end() || !r->is_string()) {
      throw BadRow("bad_message", cat("conversations[", i, "]: neither \"from\" nor \"role\" is a string"));
    }
    const std::string name = r->get<std::string>();
    const char* role = name == "human" || name == "user"                         ? "user"
                       : name == "gpt" || name == "assistant" || name == "model" ? "assistant"
                       : name == "system"                                        ? "system"
                                                                                 : nullptr;
    if (role == nullptr) {
      throw BadRow("unknown_role", cat("conversations[", i, "]: role \"", name, "\" is not one of human/user, ",
                                       "gpt/assistant/model, system"));
    }
    auto t = m.find(text_key);
    if (t == m.end() || !t->is_string()) {
      throw BadRow("bad_message", cat("conversations[", i, "] (", name, "): \"", text_key,
                                      "\" is missing or not a string"));
    }
    nlohmann::ordered_json text = std::move(*t);
    m.erase("from");
    m.erase("value");
    m["role"] = role;
    m["content"] = std::move(text);
  }
  return conv;
}

json RowConverter::describe() const {
  json t = {{"sha256", tok_->hash()}, {"vocab_size", tok_->vocab_size()}};
  t["bos_id"] = bos_ ? json(*bos_) : json(nullptr);
  t["eos_id"] = eos_ ? json(*eos_) : json(nullptr);
  json d;
  d["tokenizer"] = t;
  d["chat_template"] = chat_ ? chat_->chat_template().to_json() : json(nullptr);
  d["flags"] = chat_flags(chat_opts_, chat_ ? &chat_->chat_template() : nullptr);
  d["flags"]["format"] = format_requested_;
  d["flags"]["pairs"] = chat_pairs_ ? "chat" : "raw";
  d["max_length"] = max_length_;
  return d;
}

// ---- run_prepare -------------------------------------------------------------------------------------------

int64_t PrepareSummary::skipped_total() const {
  int64_t n = 0;
  for (const auto& [k, v] : skipped) n += v;
  return n;
}

std::string PrepareSummary::to_string() const {
  std::ostringstream os;
  os << "prepare: " << rows_read << " rows read, " << samples << " samples written to " << out << "\n";
  os << "  tokens " << tokens << ", supervised " << supervised_tokens;
  if (tokens > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " (%.1f%%)", 100.0 * static_cast<double>(supervised_tokens) / tokens);
    os << buf;
  }
  os << ", truncated samples " << truncated << "\n";
  os << "  skipped " << skipped_total() << " rows";
  for (const auto& [k, v] : skipped) os << "\n    " << k << ": " << v;
  char buf[64];
  std::snprintf(buf, sizeof buf, "\n  %.1f s", seconds);
  os << buf;
  return os.str();
}

PrepareSummary run_prepare(const PrepareOptions& o) {
  DFLASH_CHECK(!o.inputs.empty(), "prepare: no --input files");
  DFLASH_CHECK(!o.out.empty(), "prepare: no --out directory");
  for (const auto& in : o.inputs) DFLASH_CHECK(file_exists(in), in, ": no such input file");
  PrepareSummary sum;
  sum.out = o.out;
  DatasetWriter writer(o.out, o.overwrite, o.shard_tokens);  // first: an existing <out> fails before any work
  auto tok = Tokenizer::load(o.tokenizer);
  RowConverter conv(tok, o);
  ThreadPool pool(o.threads);
  const int64_t batch = o.batch_rows > 0 ? o.batch_rows : 512 * static_cast<int64_t>(pool.size());

  std::unique_ptr<Progress> progress;
  if (o.progress) progress = std::make_unique<Progress>("prepare", 0, "rows");
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes_read = 0;
  json inputs = json::array();

  struct Result {
    PreparedRow row;
    std::string reason, message;
  };
  std::vector<std::string> lines;
  std::vector<int64_t> numbers, indices;
  std::vector<Result> results;
  for (const std::string& path : o.inputs) {
    uint64_t file_bytes = 0;
    const std::string sha = sha256_file(path, &file_bytes);
    RowReader reader(path);
    int64_t file_rows = 0;
    std::map<std::string, int64_t> shapes;  // samples written per row kind
    bool more = true;
    while (more) {
      lines.clear();
      numbers.clear();
      indices.clear();
      RowReader::Row l;
      while (static_cast<int64_t>(lines.size()) < batch && (more = reader.next(&l))) {
        lines.emplace_back(l.text);
        numbers.push_back(l.line);
        indices.push_back(l.index);
        bytes_read += l.text.size() + 1;
      }
      if (lines.empty()) break;
      results.assign(lines.size(), Result{});
      pool.parallel_for(static_cast<int64_t>(lines.size()), 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          try {
            if (indices[i] >= 0 && lines[i].empty()) {
              throw BadRow("invalid_json", "an empty array element (a stray ',')");
            }
            // JSON Lines: a syntax error is placed as "column C of line L"; an array element keeps its own position
            results[i].row = conv.convert(lines[i], indices[i] >= 0 ? 0 : numbers[i]);
          } catch (const BadRow& br) {
            results[i].reason = br.reason();
            results[i].message = br.what();
          } catch (const Error& err) {
            results[i].reason = "error";
            results[i].message = err.what();
          }
        }
      });
      for (size_t i = 0; i < results.size(); ++i) {
        Result& r = results[i];
        ++sum.rows_read;
        ++file_rows;
        if (!r.reason.empty()) {
          int64_t& n = sum.skipped[r.reason];
          if (n < o.log_skipped_per_reason) {
            if (indices[i] >= 0) {
              log_warn(path, "[", indices[i], "] (line ", numbers[i], "): skipped (", r.reason, "): ", r.message);
            } else {
              log_warn(path, ":", numbers[i], ": skipped (", r.reason, "): ", r.message);
            }
            sum.skipped_rows.push_back({path, numbers[i], indices[i], r.reason, r.message});
          }
          ++n;
          continue;
        }
        writer.add(r.row.ids, r.row.loss_mask);
        ++shapes[r.row.shape];
        ++sum.samples;
        sum.truncated += r.row.truncated ? 1 : 0;
      }
      if (progress) {
        const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        char buf[160];
        std::snprintf(buf, sizeof buf, "%.1f MB/s | %lld samples | %lld skipped | %s tokens",
                      el > 0 ? static_cast<double>(bytes_read) / 1e6 / el : 0.0,
                      static_cast<long long>(sum.samples), static_cast<long long>(sum.skipped_total()),
                      fmt_count(static_cast<double>(writer.tokens())).c_str());
        progress->update(sum.rows_read, buf);
      }
    }
    json by_shape = json::object();
    for (const auto& [k, v] : shapes) by_shape[k] = v;
    inputs.push_back({{"path", path},
                      {"sha256", sha},
                      {"bytes", file_bytes},
                      {"rows", file_rows},
                      {"format", data_format_name(reader.info().format)},
                      {"gzip", reader.info().gzip},
                      {"samples_by_shape", by_shape}});
  }
  sum.tokens = writer.tokens();
  sum.supervised_tokens = writer.supervised_tokens();
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (progress) progress->finish();
  if (sum.samples == 0) {
    DFLASH_FAIL("prepare: no row survived, nothing written to ", o.out, "\n", sum.to_string());
  }
  json meta = conv.describe();
  meta["created_by"] = "dflash prepare";
  meta["tokenizer"]["path"] = o.tokenizer;
  meta["inputs"] = inputs;
  json skipped = json::object();
  for (const auto& [k, v] : sum.skipped) skipped[k] = v;
  meta["counts"] = {{"rows_read", sum.rows_read},
                    {"truncated", sum.truncated},
                    {"skipped", skipped},
                    {"skipped_total", sum.skipped_total()}};
  writer.commit(meta);
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace dflash
