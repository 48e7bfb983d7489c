// model/split_target.cpp — a target over one or several devices for one caller thread (model/split_target.h).
#include "model/split_target.h"

#include <algorithm>

#include "model/target_stages.h"

namespace dflash {

SplitTarget::SplitTarget(const Target& whole)
    : stages_{std::shared_ptr<const Target>(std::shared_ptr<const Target>(), &whole)} {  // not owned
  DFLASH_CHECK(whole.whole(), "split target: layers [", whole.stage().first, ", ", whole.stage().end,
               ") are a stage, not the whole target; give every stage with its context");
}

SplitTarget::SplitTarget(std::vector<Context*> ctxs, std::vector<std::shared_ptr<const Target>> stages)
    : ctxs_(std::move(ctxs)), stages_(std::move(stages)) {
  DFLASH_CHECK(!stages_.empty() && ctxs_.size() == stages_.size(), "split target: ", stages_.size(), " stages and ",
               ctxs_.size(), " contexts");
  int64_t next = 0;
  for (size_t s = 0; s < stages_.size(); ++s) {
    DFLASH_CHECK(stages_[s] && ctxs_[s], "split target: stage ", s, " has no target or no context");
    const TargetStage st = stages_[s]->stage();
    DFLASH_CHECK(st.first == next, "split target: stage ", s, " holds layers [", st.first, ", ", st.end,
                 "), expected it to start at layer ", next);
    next = st.end;
  }
  DFLASH_CHECK(next == config().num_hidden_layers, "split target: the stages end at layer ", next, " of ",
               config().num_hidden_layers);
  // each stage hands its residual stream to the next
  for (size_t s = 0; s + 1 < ctxs_.size(); ++s)
    if (ctxs_[s] != ctxs_[s + 1]) {
      ctxs_[s]->enable_peer_access(*ctxs_[s + 1]);
      ctxs_[s + 1]->enable_peer_access(*ctxs_[s]);
    }
}

SplitTarget SplitTarget::load(const std::string& dir, std::vector<Context*> ctxs) {
  DFLASH_CHECK(!ctxs.empty(), "split target: no context");
  std::vector<std::shared_ptr<const Target>> stages;
  if (ctxs.size() == 1) {
    stages.push_back(Target::load(dir, *ctxs[0]));
  } else {
    const ModelConfig cfg = load_model_config(dir);
    for (const TargetStage& st : split_target_layers(cfg, static_cast<int>(ctxs.size())))
      stages.push_back(Target::load_stage(dir, *ctxs[stages.size()], st));
  }
  return SplitTarget(std::move(ctxs), std::move(stages));
}

namespace {

// A copy on ctx of t, a tensor of `from`'s device (after from's queued work: the two contexts' streams are not
// ordered otherwise).
Tensor bring(Context& ctx, Context& from, const Tensor& t) {
  if (&from == &ctx || !t.defined()) return t;
  from.synchronize();
  Tensor out = ctx.empty(t.dtype, t.shape);
  ctx.copy(out, t);
  return out;
}

}  // namespace

std::vector<Context*> SplitTarget::layer_contexts(Context& ctx) const {
  std::vector<Context*> lc;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const TargetStage st = stages_[s]->stage();
    lc.insert(lc.end(), static_cast<size_t>(st.end - st.first), ctxs_.empty() ? &ctx : ctxs_[s]);
  }
  return lc;
}

Target::Output SplitTarget::run(Context& ctx, const std::vector<int32_t>& ids_host,
                                const std::vector<int32_t>& pos_host, std::span<const SeqSegment> segs,
                                std::span<const int64_t> layer_ids, int64_t run_end, bool want_final) const {
  const int64_t R = static_cast<int64_t>(ids_host.size());
  Target::Output out;
  Target::StageState state;
  Context* prev = nullptr;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const Target& t = *stages_[s];
    if (s > 0 && t.stage().first >= run_end) break;
    Context& c = ctxs_.empty() ? ctx : *ctxs_[s];
    if (prev && prev != &c) prev->synchronize();  // the state it hands on is complete before c copies it
    const Tensor ids = s == 0 ? c.to_device(cpu_tensor_i32(ids_host, {R})) : Tensor();
    state = t.run_stage(c, ids, c.to_device(cpu_tensor_i32(pos_host, {R})), segs, s == 0 ? nullptr : &state,
                        layer_ids, run_end, want_final, &out.final_hidden, &out.router_topk);
    prev = &c;
  }
  out.features = bring(ctx, *prev, state.features);
  out.final_hidden = bring(ctx, *prev, out.final_hidden);
  return out;
}

Target::Output SplitTarget::forward(Context& ctx, const Tensor& ids, std::span<const int64_t> layer_ids,
                                    bool want_final, KVCache* cache) const {
  if (ctxs_.empty() || (size() == 1 && ctxs_[0] == &ctx))
    return stages_[0]->forward(ctx, ids, layer_ids, want_final, cache);
  const ModelConfig& cfg = config();
  const int64_t last = check_layer_ids(cfg, layer_ids);
  const Tensor h = ids.device == Device::CPU ? ids : ctx.to_host(ids, false);
  const std::vector<int32_t> seq(h.ptr<int32_t>(), h.ptr<int32_t>() + h.numel());
  KVCache* const caches[] = {cache};
  const StackedRows r = stack_rows({&seq, 1}, cache ? std::span<KVCache* const>(caches) : std::span<KVCache* const>(),
                                   cfg.vocab_size, "target");
  // as Target::forward: every layer runs for the final hidden or a cache
  Target::Output out = run(ctx, r.ids, r.pos, r.segs, layer_ids,
                           (want_final || cache) ? cfg.num_hidden_layers : last + 1, want_final);
  if (cache) cache->len += static_cast<int64_t>(seq.size());
  return out;
}

Target::Output SplitTarget::forward_batch(Context& ctx, std::span<const std::vector<int32_t>> ids,
                                          std::span<KVCache* const> caches, std::span<const int64_t> layer_ids,
                                          bool want_final) const {
  if (ctxs_.empty() || (size() == 1 && ctxs_[0] == &ctx))
    return stages_[0]->forward_batch(ctx, ids, caches, layer_ids, want_final);
  DFLASH_CHECK(caches.size() == ids.size(), "target forward_batch: ", ids.size(), " sequences but ", caches.size(),
               " caches");
  check_layer_ids(config(), layer_ids);
  const StackedRows r = stack_rows(ids, caches, config().vocab_size, "target forward_batch");
  Target::Output out = run(ctx, r.ids, r.pos, r.segs, layer_ids, config().num_hidden_layers, want_final);
  for (const SeqSegment& s : r.segs) s.cache->len += s.end - s.begin;
  return out;
}

void SplitTarget::logits(Context& ctx, const Tensor& hidden, const Tensor& out) const {
  Context& c = ctxs_.empty() ? ctx : *ctxs_.back();
  if (&c == &ctx) return stages_.back()->logits(ctx, hidden, out);
  const Tensor h = bring(c, ctx, hidden);
  const Tensor lo = c.empty(out.dtype, out.shape);
  stages_.back()->logits(c, h, lo);
  c.synchronize();
  ctx.copy(out, lo);
}

KVCache SplitTarget::make_cache(Context& ctx, int64_t capacity, bool rollback) const {
  KVCache c = KVCache::create(layer_contexts(ctx), config(), capacity);
  c.keep_rollback = rollback;
  return c;
}

void SplitTarget::truncate(Context& ctx, KVCache& cache, int64_t new_len) const {
  cache.truncate(layer_contexts(ctx), new_len);
}

TargetHead SplitTarget::head(Context& ctx) const {
  Context& first = ctxs_.empty() ? ctx : *ctxs_.front();
  Context& last = ctxs_.empty() ? ctx : *ctxs_.back();
  return {bring(ctx, first, stages_.front()->weights().embed), bring(ctx, last, stages_.back()->weights().lm_head)};
}

}  // namespace dflash
