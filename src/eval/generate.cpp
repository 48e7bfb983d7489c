#include "eval/generate.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "core/log.h"
#include "core/output_dir.h"
#include "core/rng.h"
#include "io/chat_template.h"
#include "io/jsonl.h"
#include "io/tokenizer.h"

namespace dflash {

using json = nlohmann::json;

// ---- sampling -------------------------------------------------------------------------------------------------

int32_t sample_token(std::span<const float> z, const SamplingOptions& s, uint64_t row, uint64_t token_index) {
  const int64_t V = static_cast<int64_t>(z.size());
  DFLASH_CHECK(V > 0, "sample_token: empty logits");
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (z[i] > z[best]) best = i;
  if (s.temperature <= 0) return static_cast<int32_t>(best);
  DFLASH_CHECK(s.top_p > 0 && s.top_p <= 1, "top_p ", s.top_p, " outside (0, 1]");
  const double inv_t = 1.0 / s.temperature, zmax = z[best];
  std::vector<double> p(static_cast<size_t>(V));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += (p[i] = std::exp((static_cast<double>(z[i]) - zmax) * inv_t));
  Rng rng(s.seed, RngPurpose::Sampling, row, token_index);
  const double u = rng.uniform_double();
  if (s.top_p >= 1) {
    const double target = u * sum;
    double c = 0;
    for (int64_t i = 0; i < V; ++i) {
      c += p[i];
      if (c > target) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(best);  // rounding at the very end
  }
  // Nucleus. Candidates: every token with p >= thr, lowering thr until they hold top_p of the mass; the nucleus
  // (a prefix of the p-descending order) lies inside them, so sorting the candidates gives the full sort's prefix.
  std::vector<int32_t> cand;
  const double need = s.top_p * sum;
  for (double thr = 1.0 / 64;; thr /= 64) {  // p[best] == 1
    cand.clear();
    double mass = 0;
    for (int64_t i = 0; i < V; ++i)
      if (p[i] >= thr) {
        cand.push_back(static_cast<int32_t>(i));
        mass += p[i];
      }
    if (mass >= need || thr < 1e-300) break;
  }
  std::sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  size_t keep = 0;
  double mass = 0;
  while (keep < cand.size()) {
    mass += p[cand[keep++]];
    if (mass >= need) break;
  }
  const double target = u * mass;
  double c = 0;
  for (size_t i = 0; i < keep; ++i) {
    c += p[cand[i]];
    if (c > target) return cand[i];
  }
  return cand[keep - 1];
}

// ---- batched decoding -----------------------------------------------------------------------------------------

void generate_batched(Context& ctx, const SplitTarget& target, const DecodeOptions& o,
                      const std::function<bool(GenerationRequest*)>& next,
                      const std::function<void(GenerationResult&&)>& on_result,
                      const std::function<void(int64_t)>& on_step) {
  DFLASH_CHECK(o.batch_size >= 1, "batch size ", o.batch_size, " must be >= 1");
  DFLASH_CHECK(o.max_new_tokens >= 1, "max_new_tokens ", o.max_new_tokens, " must be >= 1");
  DFLASH_CHECK(o.sampling.temperature <= 0 || (o.sampling.top_p > 0 && o.sampling.top_p <= 1), "top_p ",
               o.sampling.top_p, " outside (0, 1]");
  const ModelConfig& cfg = target.config();
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  const bool greedy = o.sampling.temperature <= 0;
  struct Seq {
    size_t ordinal = 0;
    GenerationResult res;
    KVCache cache;
    std::vector<int32_t> input;  // tokens of the next forward (the prompt, then the last token)
  };
  std::vector<std::unique_ptr<Seq>> active;
  std::map<size_t, GenerationResult> ready;  // finished, waiting for earlier requests
  size_t admitted = 0, emitted = 0;
  bool source_done = false;
  const std::vector<int64_t> no_layers;
  for (;;) {
    while (!source_done && static_cast<int64_t>(active.size()) < o.batch_size) {
      GenerationRequest r;
      if (!next(&r)) {
        source_done = true;
        break;
      }
      DFLASH_CHECK(!r.prompt.empty(), "generate: row ", r.row, " has an empty prompt");
      auto s = std::make_unique<Seq>();
      s->ordinal = admitted++;
      s->res.row = r.row;
      s->cache = target.make_cache(ctx, static_cast<int64_t>(r.prompt.size()) + o.max_new_tokens);
      s->input = std::move(r.prompt);
      active.push_back(std::move(s));
    }
    if (active.empty()) break;
    const int64_t n = static_cast<int64_t>(active.size());
    std::vector<std::vector<int32_t>> ids;
    std::vector<KVCache*> caches;
    std::vector<int32_t> last_rows;
    int64_t rows = 0;
    for (auto& s : active) {
      ids.push_back(s->input);
      caches.push_back(&s->cache);
      rows += static_cast<int64_t>(s->input.size());
      last_rows.push_back(static_cast<int32_t>(rows - 1));
    }
    Target::Output out = target.forward_batch(ctx, ids, caches, no_layers, true);
    Tensor last = ctx.empty(ctx.compute_dtype(), {n, H});
    ctx.gather_rows(last, out.final_hidden, ctx.to_device(cpu_tensor_i32(last_rows, {n})));
    Tensor logits = ctx.empty(ctx.compute_dtype(), {n, V});
    target.logits(ctx, last, logits);
    std::vector<int32_t> toks(static_cast<size_t>(n));
    if (greedy) {
      Tensor am = ctx.empty(DType::I32, {n});
      ctx.argmax(logits, am);
      Tensor h = ctx.to_host(am, false);
      std::copy(h.ptr<int32_t>(), h.ptr<int32_t>() + n, toks.begin());
    } else {
      Tensor h = ctx.to_host(logits, true);
      const float* lp = h.ptr<float>();
      for (int64_t i = 0; i < n; ++i) {
        const Seq& s = *active[static_cast<size_t>(i)];
        toks[i] = sample_token(std::span<const float>(lp + i * V, static_cast<size_t>(V)), o.sampling, s.res.row,
                               s.res.ids.size());
      }
    }
    std::vector<std::unique_ptr<Seq>> still;
    for (int64_t i = 0; i < n; ++i) {
      auto& s = active[static_cast<size_t>(i)];
      const int32_t t = toks[i];
      bool done = false;
      if (std::find(o.eos_ids.begin(), o.eos_ids.end(), t) != o.eos_ids.end()) {
        s->res.eos = true;
        done = true;
      } else {
        s->res.ids.push_back(t);
      }
      // the stop token counts towards max_new_tokens
      if (static_cast<int64_t>(s->res.ids.size()) + (s->res.eos ? 1 : 0) >= o.max_new_tokens) done = true;
      if (done) {
        ready.emplace(s->ordinal, std::move(s->res));
      } else {
        s->input = {t};
        still.push_back(std::move(s));
      }
    }
    active = std::move(still);
    if (on_step) on_step(n);
    for (auto it = ready.find(emitted); it != ready.end(); it = ready.find(emitted)) {
      on_result(std::move(it->second));
      ready.erase(it);
      ++emitted;
    }
  }
  DFLASH_CHECK(ready.empty() && emitted == admitted, "generate: ", admitted - emitted, " results not delivered");
}

// ---- stop ids -------------------------------------------------------------------------------------------------

std::vector<int32_t> stop_token_ids(const std::string& target_dir, const ModelConfig& cfg, const Tokenizer* tok) {
  std::vector<int32_t> ids;
  if (tok && tok->eos_id()) ids.push_back(*tok->eos_id());
  for (int64_t e : cfg.eos_token_ids) ids.push_back(static_cast<int32_t>(e));
  const std::string gc = path_join(target_dir, "generation_config.json");
  if (file_exists(gc)) {
    json j;
    try {
      j = json::parse(read_file(gc));
    } catch (const json::exception& e) {
      DFLASH_FAIL(gc, ": invalid JSON: ", e.what());
    }
    auto it = j.find("eos_token_id");
    if (it != j.end()) {
      auto add = [&](const json& v) {
        DFLASH_CHECK(v.is_number_integer(), gc, ": eos_token_id entries must be integers, got ", v.dump());
        ids.push_back(v.get<int32_t>());
      };
      if (it->is_array())
        for (const json& v : *it) add(v);
      else if (!it->is_null())
        add(*it);
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// ---- the generate job -----------------------------------------------------------------------------------------

int64_t GenerateSummary::skipped_total() const {
  int64_t n = 0;
  for (const auto& [k, v] : skipped) n += v;
  return n;
}

std::string GenerateSummary::to_string() const {
  std::string s = cat("rows read ", rows_read, ", already in the output ", rows_existing, ", written ", rows_written,
                      " (", eos_stops, " ended on a stop token, ", rows_written - eos_stops, " at max_new_tokens)\n");
  s += cat("generated tokens ", tokens, " in ", seconds, " s");
  if (seconds > 0) s += cat(" (", static_cast<int64_t>(tokens / seconds), " tokens/s)");
  s += "\n";
  if (!skipped.empty()) {
    s += cat("skipped rows ", skipped_total(), ":");
    for (const auto& [k, v] : skipped) s += cat(" ", k, " ", v);
    s += "\n";
  }
  return s;
}

namespace {

// Reads the existing output for a resume: cuts a torn last line away and returns the indices present.
std::set<uint64_t> existing_rows(const std::string& path) {
  std::set<uint64_t> rows;
  if (!file_exists(path)) return rows;
  const std::string bytes = read_file(path);
  const size_t end = bytes.rfind('\n') == std::string::npos ? 0 : bytes.rfind('\n') + 1;
  if (end < bytes.size()) {
    log_warn(path, ": cutting a torn last line (", bytes.size() - end, " bytes) before resuming");
    DFLASH_CHECK(::truncate(path.c_str(), static_cast<off_t>(end)) == 0, path, ": cannot truncate the torn last line");
  }
  size_t pos = 0;
  int64_t line = 0;
  while (pos < end) {
    const size_t nl = bytes.find('\n', pos);
    ++line;
    const std::string_view text(bytes.data() + pos, nl - pos);
    pos = nl + 1;
    if (text.empty()) continue;
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception&) {
      DFLASH_FAIL(path, ":", line, ": not a JSON line; cannot resume this output (pass --overwrite to start again)");
    }
    DFLASH_CHECK(j.is_object() && j.contains("index") && j["index"].is_number_unsigned(), path, ":", line,
                 ": no integer \"index\"; cannot resume this output (pass --overwrite to start again)");
    rows.insert(j["index"].get<uint64_t>());
  }
  return rows;
}

int64_t count_lines(const std::string& path) {
  LineReader r(path);
  LineReader::Line l;
  int64_t n = 0;
  while (r.next(&l)) ++n;
  return n;
}

struct Pending {
  nlohmann::ordered_json row;  // the output row being built (index, prompt or messages), keys in input order
  bool messages = false;
  std::vector<int32_t> prompt_ids;
};

}  // namespace

GenerateSummary run_generate(Context& ctx, const SplitTarget& target, std::shared_ptr<const Tokenizer> tok,
                             const GenerateOptions& o) {
  DFLASH_CHECK(tok != nullptr, "generate: no tokenizer");
  DFLASH_CHECK(o.format == "auto" || o.format == "chat" || o.format == "raw", "--format: \"", o.format,
               "\" is not one of auto, chat, raw");
  DFLASH_CHECK(!o.out.empty() && !o.prompts.empty(), "generate: --prompts and --out are required");
  const Claim claim = claim_output_file(o.out, o.resume, o.overwrite, OutputOf::Generate);  // nothing touched yet
  // Ids past the embedding are accepted only as special tokens (Kimi-K2's tokenizer has 2 reserved ones there),
  // and then refused in a prompt.
  const int64_t embedding_rows = target.config().vocab_size;
  for (int64_t id = embedding_rows; id < tok->vocab_size(); ++id)
    DFLASH_CHECK(tok->is_special(static_cast<int32_t>(id)), "generate: the tokenizer has ", tok->vocab_size(),
                 " ids, the target's embedding ", embedding_rows, " rows (id ", id, " is not a special token)");
  std::unique_ptr<ChatEncoder> chat;
  const std::optional<int32_t> bos = tok->bos_id();
  if (!tok->chat_templates().empty() || (o.chat_template != "auto" && !o.chat_template.empty())) {
    try {
      chat = std::make_unique<ChatEncoder>(tok, ChatTemplate::load(*tok, o.chat_template, o.chat_template_name));
    } catch (const Error& e) {
      if (o.format != "raw") throw;
      log_warn("no chat template: ", e.what());
    }
  }
  DFLASH_CHECK(o.format != "chat" || chat, "--format chat: the tokenizer has no chat template; pass --chat-template");
  const bool chat_prompts = o.format == "chat" || (o.format == "auto" && chat);
  ChatOptions copts = o.options();
  copts.add_generation_prompt = true;
  log_info("generate: prompts as ",
           chat_prompts ? cat("chat (template ", chat->chat_template().origin(), ", sha256 ",
                              chat->chat_template().sha256(), ", variables ",
                              chat_flags(copts, &chat->chat_template()).dump(), ")")
                        : std::string("raw"),
           " text; stop ids ", json(o.decode.eos_ids).dump(), "; ",
           o.decode.sampling.temperature > 0 ? cat("temperature ", o.decode.sampling.temperature, ", top-p ",
                                                   o.decode.sampling.top_p, ", seed ", o.decode.sampling.seed)
                                             : std::string("greedy"));

  GenerateSummary sum;
  std::set<uint64_t> done;
  if (claim == Claim::Resume) {
    done = existing_rows(o.out);
    if (!done.empty()) log_info("generate: resuming ", o.out, ": ", done.size(), " rows already written");
  }
  const int64_t total_lines = count_lines(o.prompts);
  FILE* f = std::fopen(o.out.c_str(), claim == Claim::Resume ? "ab" : "wb");
  DFLASH_CHECK(f != nullptr, o.out, ": cannot open for writing");
  std::unique_ptr<FILE, int (*)(FILE*)> file(f, &std::fclose);

  LineReader reader(o.prompts);
  std::deque<Pending> pending;  // rows admitted, in request order (results come back in the same order)
  std::map<std::string, int64_t> logged;
  auto skip = [&](int64_t line, const std::string& reason, const std::string& msg) {
    ++sum.skipped[reason];
    if (logged[reason]++ < 5) log_warn(o.prompts, ":", line, ": skipped (", reason, "): ", msg);
  };
  std::optional<Progress> bar;
  if (o.progress) bar.emplace("generate", total_lines - static_cast<int64_t>(done.size()), "rows");
  const auto t0 = std::chrono::steady_clock::now();
  auto update_bar = [&] {
    if (!bar) return;
    const double el = bar->elapsed_s();
    bar->update(sum.rows_written + sum.skipped_total(), cat(sum.tokens, " tokens, ", static_cast<int64_t>(el > 0 ? sum.tokens / el : 0),
                                    " tokens/s"));
  };

  auto next = [&](GenerationRequest* req) -> bool {
    LineReader::Line l;
    while (reader.next(&l)) {
      ++sum.rows_read;
      const uint64_t index = static_cast<uint64_t>(l.number - 1);
      if (done.count(index)) {
        ++sum.rows_existing;
        continue;
      }
      if (py_strip(l.text, std::nullopt).empty()) {
        skip(l.number, "empty_line", "blank line");
        continue;
      }
      nlohmann::ordered_json j;  // key order matters to templates (tool schemas, arguments)
      try {
        j = nlohmann::ordered_json::parse(l.text);
      } catch (const json::exception& e) {
        skip(l.number, "invalid_json", cat("invalid JSON: ", json_row_error(e, l.number)));
        continue;
      }
      if (!j.is_object()) {
        skip(l.number, "not_object", cat("the row is a JSON ", j.type_name()));
        continue;
      }
      Pending p;
      p.row = nlohmann::ordered_json::object();
      p.row["index"] = index;
      try {
        if (j.contains("messages")) {
          std::vector<ChatMessage> ms = parse_messages(j["messages"]);
          validate_conversation(ms, true);
          if (ms.back().role != "user") throw BadRow("last_not_user", "the last message is not the user's");
          if (!chat) throw BadRow("no_chat_template", "a messages row, and no chat template is available");
          ChatOptions row_opts = copts;
          if (auto tools = j.find("tools"); tools != j.end() && tools->is_array()) row_opts.tools = *tools;
          p.prompt_ids = chat->encode(ms, row_opts).ids;
          p.messages = true;
          p.row["messages"] = j["messages"];
          if (row_opts.tools.is_array()) p.row["tools"] = row_opts.tools;
        } else if (j.contains("prompt")) {
          if (!j["prompt"].is_string()) throw BadRow("bad_prompt", "\"prompt\" is not a string");
          const std::string prompt = j["prompt"].get<std::string>();
          if (chat_prompts) {
            std::vector<ChatMessage> ms = {{"user", prompt, std::nullopt, {}}};
            validate_conversation(ms, true);
            p.prompt_ids = chat->encode(ms, copts).ids;
          } else {
            if (bos) p.prompt_ids.push_back(*bos);
            std::vector<int32_t> a = tok->encode(prompt, true);
            p.prompt_ids.insert(p.prompt_ids.end(), a.begin(), a.end());
          }
          p.row["prompt"] = prompt;
        } else {
          throw BadRow("unrecognized_row", "the row has neither \"prompt\" nor \"messages\"");
        }
      } catch (const BadRow& e) {
        skip(l.number, e.reason(), e.what());
        continue;
      }
      if (p.prompt_ids.empty()) {
        skip(l.number, "empty_prompt", "the prompt has no token");
        continue;
      }
      if (auto big = std::find_if(p.prompt_ids.begin(), p.prompt_ids.end(),
                                  [&](int32_t id) { return id >= embedding_rows; });
          big != p.prompt_ids.end()) {
        skip(l.number, "token_outside_embedding",
             cat("the prompt has token ", *big, " (\"", tok->id_to_token(*big), "\"), past the target's ",
                 embedding_rows, "-row embedding"));
        continue;
      }
      req->row = index;
      req->prompt = p.prompt_ids;
      pending.push_back(std::move(p));
      return true;
    }
    return false;
  };

  auto on_result = [&](GenerationResult&& r) {
    DFLASH_CHECK(!pending.empty() && pending.front().row["index"].get<uint64_t>() == r.row,
                 "generate: result for row ", r.row, " out of order");
    Pending p = std::move(pending.front());
    pending.pop_front();
    const std::string completion = tok->decode(r.ids, false);
    auto& row = p.row;
    if (p.messages) {
      row["messages"].push_back({{"role", "assistant"}, {"content", completion}});
    } else {
      row["completion"] = completion;
    }
    row["finish_reason"] = r.eos ? "eos" : "length";
    if (o.write_ids) {
      row["prompt_ids"] = p.prompt_ids;
      row["completion_ids"] = r.ids;
    }
    const std::string line = row.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    DFLASH_CHECK(std::fwrite(line.data(), 1, line.size(), file.get()) == line.size() && std::fflush(file.get()) == 0,
                 o.out, ": write error");
    ++sum.rows_written;
    if (r.eos) ++sum.eos_stops;
    update_bar();
  };
  auto on_step = [&](int64_t tokens) {
    sum.tokens += tokens;
    update_bar();
  };
  generate_batched(ctx, target, o.decode, next, on_result, on_step);
  DFLASH_CHECK(std::fflush(file.get()) == 0 && ::fsync(fileno(file.get())) == 0, o.out, ": cannot flush to disk");
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (bar) bar->finish(cat(sum.tokens, " tokens"));
  return sum;
}

}  // namespace dflash
