// cli/cmd_capture.cpp — `dflash capture`: the target's hidden states (and optionally logits and the experts each
// token chose) for given token ids, in Hugging Face's output_hidden_states indexing, to compare with a serving engine
// or transformers when training and serving disagree.
//
//   dflash capture --target DIR --input ids.jsonl --out features.safetensors [--layers all|i,j,...] [--logits]
//                  [--router] [--device cpu|cuda[:N]] [--overwrite]
//
// Input rows (JSON Lines): {"input_ids": [...], "position_ids": [...]} (position_ids optional: 0, 1, ... by default).
// Output (one safetensors file, F32, written atomically), for row r:
//   row_{r}.hidden_{i}  [T, H]  i = 0 .. L as HF's output_hidden_states[i]: i = 0 the embedding output, i = 1 .. L-1
//                               the residual stream after decoder layer i - 1 (= dflash's target layer id i - 1,
//                               spec h_after_layer), i = L the final-norm output (HF normalises the last one);
//   row_{r}.logits      [T, V]  with --logits;
//   row_{r}.router_{l}  [T, k]  I32 with --router, per MoE layer l: the experts chosen, in the router's order;
//   row_{r}.input_ids   [T]     I32.
// __metadata__ records the target directory, the device, the indexing and the row count.
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/output_dir.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "model/target.h"

namespace dflash::cli {

namespace {

struct CaptureCli {
  std::string target, input, out, device = "cpu", layers = "all";
  bool logits = false, router = false, overwrite = false;
};

// "all" or a list of HF hidden-state indices in [0, L].
std::vector<int64_t> parse_layers(const std::string& s, int64_t L) {
  std::vector<int64_t> v;
  if (s == "all") {
    for (int64_t i = 0; i <= L; ++i) v.push_back(i);
    return v;
  }
  size_t p = 0;
  while (p <= s.size()) {
    const size_t q = std::min(s.find(',', p), s.size());
    const std::string item = s.substr(p, q - p);
    size_t used = 0;
    int64_t i = -1;
    try {
      i = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DFLASH_CHECK(used == item.size() && !item.empty() && i >= 0 && i <= L, "capture --layers: '", item,
                 "' is not a hidden-state index in [0, ", L, "] (0 = embedding output, i = after layer i - 1, ", L,
                 " = final-norm output)");
    v.push_back(i);
    p = q + 1;
  }
  return v;
}

std::vector<int32_t> int_list(const nlohmann::json& j, const char* key, const std::string& where) {
  DFLASH_CHECK(j.is_array(), where, ": ", key, " must be a list of integers");
  std::vector<int32_t> v;
  for (const auto& x : j) {
    DFLASH_CHECK(x.is_number_integer(), where, ": ", key, " holds ", x.dump(), ", not an integer");
    v.push_back(x.get<int32_t>());
  }
  return v;
}

void run(const CaptureCli& c) {
  claim_output_file(c.out, false, c.overwrite, OutputOf::Capture);
  auto ctx = make_context(c.device);
  log_info("capture: loading the target from ", c.target, " on ", ctx->describe());
  auto target = Target::load(c.target, *ctx);
  const ModelConfig& cfg = target->config();
  const int64_t L = cfg.num_hidden_layers, H = cfg.hidden_size, V = cfg.vocab_size;
  const std::vector<int64_t> want = parse_layers(c.layers, L);
  std::vector<int64_t> all(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) all[static_cast<size_t>(l)] = l;

  std::vector<std::pair<std::string, Tensor>> tensors;
  LineReader lines(c.input);
  LineReader::Line line;
  int64_t rows = 0;
  double bytes = 0;
  while (lines.next(&line)) {
    if (line.text.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = cat(c.input, ":", line.number);
    const nlohmann::json j = parse_json_line(line.text, c.input, line.number);
    DFLASH_CHECK(j.is_object() && j.contains("input_ids"), where, ": expected {\"input_ids\": [...]}");
    const std::vector<int32_t> ids = int_list(j["input_ids"], "input_ids", where);
    DFLASH_CHECK(!ids.empty(), where, ": input_ids is empty");
    for (int32_t id : ids) DFLASH_CHECK(id >= 0 && id < V, where, ": token id ", id, " outside [0, ", V, ")");
    std::vector<int32_t> pos;
    if (j.contains("position_ids") && !j["position_ids"].is_null()) {
      pos = int_list(j["position_ids"], "position_ids", where);
      DFLASH_CHECK(pos.size() == ids.size(), where, ": ", pos.size(), " position_ids for ", ids.size(), " input_ids");
    } else {
      for (size_t t = 0; t < ids.size(); ++t) pos.push_back(static_cast<int32_t>(t));
    }
    const int64_t T = static_cast<int64_t>(ids.size());
    const Tensor idt = cpu_tensor_i32(ids, {T});
    Target::Output o = target->forward_at(*ctx, idt, pos, all, true);
    const Tensor feats = ctx->to_host(o.features);  // [T, L H] F32
    const std::string p = cat("row_", rows, ".");
    for (int64_t i : want) {
      Tensor h = cpu_empty(DType::F32, {T, H});
      if (i == 0) {  // the embedding output
        Tensor e = ctx->empty(ctx->compute_dtype(), {T, H});
        target->embed(*ctx, ctx->to_device(idt), e);
        h = ctx->to_host(e);
      } else if (i == L) {
        h = ctx->to_host(o.final_hidden);
      } else {
        for (int64_t t = 0; t < T; ++t)
          std::copy_n(feats.ptr<float>() + t * L * H + (i - 1) * H, H, h.ptr<float>() + t * H);
      }
      tensors.emplace_back(cat(p, "hidden_", i), h);
      bytes += 4.0 * T * H;
    }
    if (c.logits) {
      Tensor lg = ctx->empty(ctx->compute_dtype(), {T, V});
      target->logits(*ctx, o.final_hidden, lg);
      tensors.emplace_back(p + "logits", ctx->to_host(lg));
      bytes += 4.0 * T * V;
    }
    if (c.router)
      for (int64_t l = 0; l < L; ++l)
        if (o.router_topk[static_cast<size_t>(l)].defined())
          tensors.emplace_back(cat(p, "router_", l), ctx->to_host(o.router_topk[static_cast<size_t>(l)]));
    tensors.emplace_back(p + "input_ids", idt);
    ++rows;
    if (bytes > 8e9) log_warn("capture: ", bytes / 1e9, " GB held for the output so far (every tensor is F32)");
  }
  DFLASH_CHECK(rows > 0, c.input, ": no rows");
  std::map<std::string, std::string> md = {
      {"target", c.target}, {"device", ctx->describe()}, {"rows", std::to_string(rows)},
      {"indexing", "hidden_i = Hugging Face output_hidden_states[i]: 0 = embedding output, i = residual stream after "
                   "decoder layer i-1 (dflash target layer id i-1), L = final-norm output"},
      {"num_hidden_layers", std::to_string(L)}};
  write_safetensors(c.out, tensors, md);
  std::printf("capture: %lld rows, %zu tensors (%.1f MB) -> %s\n", static_cast<long long>(rows), tensors.size(),
              bytes / 1e6, c.out.c_str());
}

}  // namespace

void register_capture(CLI::App& app) {
  auto* sub = app.add_subcommand("capture", "write the target's hidden states (HF output_hidden_states indexing), "
                                            "logits and expert choices for given token ids, to compare with a "
                                            "serving engine or transformers");
  auto c = std::make_shared<CaptureCli>();
  sub->add_option("--target", c->target, "target model directory (config.json, *.safetensors)")->required();
  sub->add_option("--input", c->input, "JSON Lines rows {\"input_ids\": [...], \"position_ids\": [...]} "
                  "(position_ids optional)")
      ->required();
  sub->add_option("--out", c->out, "output .safetensors (an existing non-empty file needs --overwrite)")->required();
  sub->add_option("--layers", c->layers, "'all' or hidden-state indices i,j,... in [0, L] (0 = embedding output, "
                  "i = after decoder layer i-1, L = final-norm output)")
      ->capture_default_str();
  sub->add_flag("--logits", c->logits, "also write the logits [T, V] of every row");
  sub->add_flag("--router", c->router, "also write the experts each token chose in every MoE layer");
  sub->add_option("--device", c->device, "cpu | cuda | cuda:N")->capture_default_str();
  sub->add_flag("--overwrite", c->overwrite, "replace an existing output file");
  sub->callback([c] { run(*c); });
}

}  // namespace dflash::cli
