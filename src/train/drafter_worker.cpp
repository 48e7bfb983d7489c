// train/drafter_worker.cpp — DrafterWorker: the per-replica step loop.
#include "train/drafter_worker.h"

#include <algorithm>
#include <chrono>

#include "model/draft_batch.h"

namespace dflash {

DrafterWorker::DrafterWorker(int local_rank, int global_rank, std::string name, std::unique_ptr<Context> ctx,
                             const DrafterConfig& dc, uint64_t seed, double init_std, Tensor embed, Tensor lm_head,
                             int shards)
    : local_rank_(local_rank),
      global_rank_(global_rank),
      name_(std::move(name)),
      ctx_(std::move(ctx)),
      drafter_(*ctx_, dc, seed, init_std),
      embed_(std::move(embed)),
      lm_head_(std::move(lm_head)) {
  if (shards > 1) {
    shard_ = make_optim_shard(*ctx_, drafter_.params(), shards, global_rank_);
  } else {
    drafter_.params().flatten_grads(*ctx_);
    drafter_.params().init_moments(*ctx_);
  }
}

void DrafterWorker::warm_up(double dpace_alpha) {
  const DrafterConfig& dc = drafter_.config();
  const int64_t S = 2 * dc.block_size + 2, B = dc.block_size;
  std::vector<int32_t> ids(static_cast<size_t>(S));
  std::vector<uint8_t> mask(static_cast<size_t>(S), 1);
  for (int64_t i = 0; i < S; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i % std::max<int64_t>(1, dc.vocab_size));
  const std::vector<int32_t> anchors = {0, static_cast<int32_t>(B)};
  DraftBatch b = make_draft_batch(ids, mask, anchors, 2, B, dc.mask_token_id, 7.0, dpace_alpha);
  Tensor feats = ctx_->zeros(ctx_->compute_dtype(), {S, dc.nf() * dc.hidden_size});
  DraftInputs in = upload_draft_batch(*ctx_, b, feats);
  drafter_.forward_backward(*ctx_, in, embed_, lm_head_, 0.f, 0.f, true, false);
  drafter_.params().zero_grad(*ctx_);
  (void)global_grad_sq(*ctx_, drafter_.params());
  ctx_->synchronize();
}

void DrafterWorker::run(const DrafterRun& r, PlanBook& plans, FeatureQueue& queue, GradReducer& grads,
                        HostGroup& stats_group, const std::function<void(DrafterWorker&, const StepReport&)>& report) {
  using clock_t = std::chrono::steady_clock;
  const int64_t B = drafter_.config().block_size;
  const bool soft = r.kl_weight > 0;
  int64_t ticket = 0;
  int64_t n_updates = r.updates;
  updates = n_updates;
  params_step = r.first_step;
  shard_step = r.first_step;
  ParamSet& ps = drafter_.params();
  // [loss, ce, kl, sel, covered, correct per slot (B), count per slot (B), grad_sq, stop, total]
  constexpr size_t kSlots = 5;
  std::vector<double> red(kSlots + 2 * static_cast<size_t>(B) + 3);
  const size_t kGradSq = red.size() - 3, kStop = red.size() - 2, kTotal = red.size() - 1;
  auto collective = [&](auto&& body) {  // time spent in a collective counts as waiting
    const auto t0 = clock_t::now();
    clock.waiting_on = kWaitCollective;
    body();
    clock.waiting_on = kWaitNone;
    clock.add_wait(clock_t::now() - t0);
  };
  // Sharded: the all-gather of the updated masters is deferred to the start of the next step (or done before a
  // checkpoint), so that, as replicated, no collective lies between a step's optimizer update and its report.
  bool gather_pending = false;
  auto gather_masters = [&] {
    collective([&] { grads.all_gather(local_rank_, *ctx_, ps.flat_master(), shard_->layout.shard); });
    ps.sync_compute(*ctx_);
    ctx_->synchronize();
    gather_pending = false;
  };
  int64_t total = r.total_steps;
  for (int64_t step = r.first_step; step < std::min(r.end_step, total); ++step) {
    if (r.fault) r.fault->maybe_throw("drafter", local_rank_, step);
    if (gather_pending) gather_masters();  // the previous update's shards, before this step's forward
    auto plan = plans.get(step);
    StepReport rep;
    rep.step = step;
    rep.plan = plan;
    rep.lr = lr_at(r.optim, step, total);
    std::fill(red.begin(), red.end(), 0.0);
    const float grad_scale = plan->empty() ? 0.f : static_cast<float>(1.0 / plan->sum_w);
    for (int si : plan->by_drafter[static_cast<size_t>(global_rank_)]) {
      const SeqPlan& sq = plan->seqs[static_cast<size_t>(si)];
      FeaturePacket& p = queue.take(ticket, clock);
      DFLASH_CHECK(p.plan.get() == plan.get() || (p.plan->step == step && p.seq == si), name_, ": packet ", ticket,
                   " is step ", p.plan->step, " sequence ", p.seq, ", expected step ", step, " sequence ", si);
      const auto t0 = clock_t::now();
      ctx_->wait(*p.ready);
      DraftInputs in = upload_draft_batch(*ctx_, sq.batch, p.features.slice(0, sq.batch.S),
                                          soft ? p.final_hidden.slice(0, sq.batch.S) : Tensor{});
      DraftStepStats st = drafter_.forward_backward(*ctx_, in, embed_, lm_head_, r.kl_weight, grad_scale, true,
                                                    r.recompute, r.selector_alpha);
      ctx_->record(*p.free);
      queue.release(ticket++);
      red[0] += st.loss_sum;
      red[1] += st.ce_sum;
      red[2] += st.kl_sum;
      red[3] += st.sel_sum;
      for (uint8_t c : st.covered) red[4] += c;
      for (size_t k = 0; k < st.correct.size(); ++k) {
        const size_t slot = static_cast<size_t>(sq.batch.slots[k]);
        red[kSlots + slot] += st.correct[k];
        red[kSlots + static_cast<size_t>(B) + slot] += 1;
      }
      clock.add_busy(clock_t::now() - t0);
    }
    double grad_sq = 0;
    if (!plan->empty()) {  // the same decision on every drafter: sum_w is global
      collective([&] {
        if (shard_) {  // the own shard's summed gradient and its part of the norm (summed below with the stats)
          grads.reduce_scatter(local_rank_, *ctx_, ps.flat_grad(), shard_->layout.shard);
          red[kGradSq] = shard_grad_sq(*ctx_, ps, *shard_);
        } else {
          grads.all_reduce(local_rank_, *ctx_, ps.flat_grad());
          grad_sq = global_grad_sq(*ctx_, ps);
        }
      });
    }
    red[kStop] = r.stop && r.stop->load() ? 1.0 : 0.0;
    red[kTotal] = r.proposed_total ? static_cast<double>(r.proposed_total->exchange(0)) : 0.0;
    collective([&] { stats_group.all_reduce(local_rank_, std::span<double>(red)); });
    if (shard_) grad_sq = red[kGradSq];
    rep.stats.loss_sum = red[0];
    rep.stats.ce_sum = red[1];
    rep.stats.kl_sum = red[2];
    rep.stats.sel_sum = red[3];
    rep.stats.covered = red[4];
    rep.stats.correct.assign(red.begin() + kSlots, red.begin() + kSlots + B);
    rep.stats.count.assign(red.begin() + kSlots + B, red.begin() + kSlots + 2 * B);
    rep.stats.stop = red[kStop] > 0 || (r.stop_after > 0 && step + 1 >= r.stop_after);
    if (red[kTotal] > 0) total = std::clamp<int64_t>(static_cast<int64_t>(red[kTotal]), step + 1, r.end_step);
    rep.total_steps = total;  // in force from the next step on
    rep.checkpoint = (r.checkpoint_every > 0 && (step + 1) % r.checkpoint_every == 0) || rep.stats.stop ||
                     step + 1 >= total;
    // The last collective of the step is behind us (sharded: except at checkpoint steps, where the all-gathers
    // follow): from here to the report nothing waits on another worker, so a drafter that applied this step's
    // update always reports it (a fault elsewhere cannot split the two).
    if (!plan->empty()) {
      const auto t0 = clock_t::now();
      in_optimizer = true;
      StepResult res = shard_ ? optimizer_step_shard(*ctx_, ps, *shard_, r.optim, rep.lr, n_updates + 1, grad_sq)
                              : optimizer_step(*ctx_, ps, r.optim, rep.lr, n_updates + 1, grad_sq);
      ctx_->synchronize();
      in_optimizer = false;
      ++n_updates;
      clock.add_busy(clock_t::now() - t0);
      rep.updated = true;
      rep.grad_norm = res.grad_norm;
      rep.clip = res.clip_scale;
    }
    if (shard_) {
      shard_step = step + 1;
      gather_pending = gather_pending || !plan->empty();
      if (rep.checkpoint) {  // the whole state on every drafter (masters) and on the reporter (moments, host)
        if (gather_pending) gather_masters();
        collective([&] {  // the moments of every shard, through the flat gradient buffer (zero, spent)
          for (int k = 0; k < 2; ++k) {
            const Tensor& own = k == 0 ? shard_->m : shard_->v;
            ctx_->copy(ps.flat_grad().slice(shard_->begin(), shard_->end()), own);
            grads.all_gather(local_rank_, *ctx_, ps.flat_grad(), shard_->layout.shard);
            if (report) (k == 0 ? rep.moments.m : rep.moments.v) = ctx_->to_host(ps.flat_grad(), false);
          }
          ctx_->zero(ps.flat_grad());
          ctx_->synchronize();
        });
      }
    }
    updates = n_updates;
    params_step = step + 1;
    rep.updates = n_updates;
    if (report) report(*this, rep);
    if (rep.stats.stop) break;
  }
  if (gather_pending) gather_masters();  // (every run ends with a checkpoint step: kept for safety)
}

}  // namespace dflash
