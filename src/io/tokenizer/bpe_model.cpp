// io/tokenizer/bpe_model.cpp — see bpe_model.h.
#include "io/tokenizer/bpe_model.h"

#include <climits>
#include <cstdio>
#include <queue>

namespace dflash::tok {

BpeModel BpeModel::load(const json& model, const TokenizerJsonReader& rd, bool byte_level, const std::string& W) {
  const std::string MW = W + ": model";
  DFLASH_CHECK(model.is_object(), MW, ": expected an object");
  if (auto t = model.find("type"); t != model.end()) {
    DFLASH_CHECK(t->is_string() && t->get<std::string>() == "BPE", MW, ".type: only \"BPE\" models are supported, got ",
                 t->dump());
  }
  BpeModel m;
  m.byte_level_ = byte_level;
  m.byte_fallback_ = opt_bool(model, "byte_fallback", false, MW);
  m.fuse_unk_ = opt_bool(model, "fuse_unk", false, MW);
  m.ignore_merges_ = opt_bool(model, "ignore_merges", false, MW);
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    DFLASH_CHECK(d->is_number() && d->get<double>() == 0.0, MW, ".dropout: BPE dropout is not supported");
  }
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(k);
    DFLASH_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()), MW, ".", k,
                 ": only empty / null is supported, got ", it->dump());
  }
  DFLASH_CHECK(rd.have_vocab, MW, ": missing field \"vocab\" (an object of token -> id)");
  m.vocab.reserve(rd.vocab.size());
  for (const auto& [text, id] : rd.vocab) m.vocab.put(text, static_cast<int32_t>(id));
  DFLASH_CHECK(m.vocab.size() == rd.vocab.size(), MW, ".vocab: duplicate tokens");
  if (auto u = model.find("unk_token"); u != model.end() && !u->is_null()) {
    DFLASH_CHECK(u->is_string(), MW, ".unk_token: expected a string");
    m.unk_ = m.vocab.find(u->get<std::string>());
    DFLASH_CHECK(m.unk_ >= 0, MW, ".unk_token: \"", u->get<std::string>(), "\" is not in the vocabulary");
  }
  const ByteAlphabet& abc = byte_alphabet();
  std::string raw;
  m.byte_id_.fill(-1);
  if (byte_level) {
    DFLASH_CHECK(!m.byte_fallback_, MW, ".byte_fallback: true with a ByteLevel pre-tokenizer is not supported");
    for (size_t b = 0; b < 256; ++b) {
      const std::string ch = abc.encode_byte(static_cast<unsigned char>(b));
      m.byte_id_[b] = m.vocab.find(ch);
      DFLASH_CHECK(m.byte_id_[b] >= 0, MW, ".vocab: the byte-level token for byte ", b, " (\"", ch,
                   "\") is missing: not a byte-level BPE vocabulary");
    }
    if (m.ignore_merges_) {
      for (const auto& [text, id] : rd.vocab)
        if (abc.decode(text, raw)) m.raw_vocab_.put(raw, static_cast<int32_t>(id));
    }
  } else if (m.byte_fallback_) {
    for (size_t b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned>(b));
      m.byte_id_[b] = m.vocab.find(name);
      DFLASH_CHECK(m.byte_id_[b] >= 0, MW, ".vocab: byte_fallback needs the byte token \"", name,
                   "\", which is missing");
    }
  }
  DFLASH_CHECK(rd.have_merges, MW, ": missing field \"merges\" (an array)");
  m.merges_.reserve(rd.merges.size());
  std::string ab;
  for (size_t i = 0; i < rd.merges.size(); ++i) {
    const std::string& a = rd.merges[i].first;
    const std::string& b = rd.merges[i].second;
    ab.assign(a);
    ab.append(b);
    const int32_t ia = m.vocab.find(a), ib = m.vocab.find(b), ic = m.vocab.find(ab);
    DFLASH_CHECK(ia >= 0 && ib >= 0, MW, ".merges[", i, "]: \"", a, "\" or \"", b, "\" is not in the vocabulary");
    DFLASH_CHECK(ic >= 0, MW, ".merges[", i, "]: the merged token \"", ab, "\" is not in the vocabulary");
    m.merges_.put(ia, ib, static_cast<int32_t>(i), ic);
  }
  return m;
}

BpeModel BpeModel::from_ranks(const std::vector<std::string>& tokens, const std::string& W) {
  BpeModel m;
  m.byte_level_ = true;
  m.ignore_merges_ = true;
  const ByteAlphabet& abc = byte_alphabet();
  m.vocab.reserve(tokens.size());
  m.raw_vocab_.reserve(tokens.size());
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    text.clear();
    for (unsigned char c : tokens[i]) text += abc.encode_byte(c);
    m.vocab.put(text, static_cast<int32_t>(i));
    m.raw_vocab_.put(tokens[i], static_cast<int32_t>(i));
  }
  m.byte_id_.fill(-1);
  for (size_t b = 0; b < 256; ++b) {
    m.byte_id_[b] = m.raw_vocab_.find(std::string(1, static_cast<char>(b)));
    DFLASH_CHECK(m.byte_id_[b] >= 0, W, ": no token for the single byte ", b,
                 " (a byte-level BPE vocabulary has all 256)");
  }
  // Two passes: count the splits, then fill the table at its final size.
  std::vector<std::pair<int32_t, int32_t>> splits;
  std::vector<int32_t> merged;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string_view t = tokens[i];
    for (size_t k = 1; k < t.size(); ++k) {
      const int32_t a = m.raw_vocab_.find(t.substr(0, k)), b = m.raw_vocab_.find(t.substr(k));
      if (a < 0 || b < 0) continue;
      splits.emplace_back(a, b);
      merged.push_back(static_cast<int32_t>(i));
    }
  }
  m.merges_.reserve(splits.size());
  for (size_t j = 0; j < splits.size(); ++j) m.merges_.put(splits[j].first, splits[j].second, merged[j], merged[j]);
  return m;
}

void BpeModel::initial_symbols(std::string_view w, std::vector<int32_t>& ids) const {
  ids.clear();
  if (byte_level_) {
    for (unsigned char c : w) ids.push_back(byte_id_[c]);
    return;
  }
  bool last_unk = false;
  for (size_t i = 0; i < w.size();) {
    const size_t at = i;
    decode_utf8(w, i);
    const std::string_view ch = w.substr(at, i - at);
    const int32_t id = vocab.find(ch);
    if (id >= 0) {
      ids.push_back(id);
      last_unk = false;
    } else if (byte_fallback_) {
      for (unsigned char c : ch) ids.push_back(byte_id_[c]);
      last_unk = false;
    } else {
      DFLASH_CHECK(unk_ >= 0, "tokenizer: the character \"", std::string(ch),
                   "\" is not in the vocabulary and the model has neither byte_fallback nor an unk_token");
      if (!(fuse_unk_ && last_unk)) ids.push_back(unk_);
      last_unk = true;
    }
  }
}

void BpeModel::encode_word(std::string_view w, std::vector<int32_t>& out, ThreadState& ts, WordCache& cache) const {
  const size_t n = w.size();
  if (n == 0) return;
  if (n == 1 && byte_level_) {
    out.push_back(byte_id_[static_cast<unsigned char>(w[0])]);
    return;
  }
  WordCache::Entry* slot = nullptr;
  uint64_t h = 0;
  if (n <= WordCache::kMaxWord) {
    h = hash_bytes(w.data(), n);
    slot = &cache.entries[h & (WordCache::kEntries - 1)];
    if (slot->len == n && slot->hash == h && std::memcmp(slot->word, w.data(), n) == 0) {
      out.insert(out.end(), slot->ids, slot->ids + slot->nids);
      return;
    }
  }
  const size_t out0 = out.size();
  const int32_t whole = !ignore_merges_ ? -1 : byte_level_ ? raw_vocab_.find(w) : vocab.find(w);
  std::vector<int32_t>& init = ts.init;
  if (whole < 0) initial_symbols(w, init);
  const size_t ns = init.size();
  if (whole >= 0) {
    out.push_back(whole);
  } else if (ns <= 48) {
    // Short word: ids + the rank of each adjacent pair; repeatedly merge the first lowest-rank pair.
    int32_t ids[48], ranks[48], merged[48];
    size_t m = ns;
    auto look = [&](size_t i) {
      const PairMap::Slot* s = merges_.find(ids[i], ids[i + 1]);
      ranks[i] = s ? s->rank : INT32_MAX;
      merged[i] = s ? s->id : -1;
    };
    for (size_t i = 0; i < ns; ++i) ids[i] = init[i];
    for (size_t i = 0; i + 1 < ns; ++i) look(i);
    while (m > 1) {
      size_t best = 0;
      int32_t br = ranks[0];
      for (size_t i = 1; i + 1 < m; ++i)
        if (ranks[i] < br) {
          br = ranks[i];
          best = i;
        }
      if (br == INT32_MAX) break;
      ids[best] = merged[best];
      const size_t tail = m - best - 2;  // elements after best+1
      std::memmove(ids + best + 1, ids + best + 2, tail * sizeof(int32_t));
      std::memmove(ranks + best + 1, ranks + best + 2, (tail > 0 ? tail - 1 : 0) * sizeof(int32_t));
      std::memmove(merged + best + 1, merged + best + 2, (tail > 0 ? tail - 1 : 0) * sizeof(int32_t));
      --m;
      if (best + 1 < m) look(best);
      if (best > 0) look(best - 1);
    }
    out.insert(out.end(), ids, ids + m);
  } else {
    merge_long(init, out, ts);
  }
  const size_t k = out.size() - out0;
  if (slot && k <= WordCache::kMaxIds) {
    slot->hash = h;
    slot->len = static_cast<uint8_t>(n);
    slot->nids = static_cast<uint8_t>(k);
    std::memcpy(slot->word, w.data(), n);
    std::memcpy(slot->ids, out.data() + out0, k * sizeof(int32_t));
  }
}

// Long word: linked list of symbols and a min-heap of candidate merges (rank, position), as in HF word.rs.
// A popped candidate is used only if both symbols are still there and still merge to the same id.
void BpeModel::merge_long(const std::vector<int32_t>& init, std::vector<int32_t>& out, ThreadState& ts) const {
  const int32_t n = static_cast<int32_t>(init.size());
  auto& sy = ts.syms;
  sy.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) sy[static_cast<size_t>(i)] = {init[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1, 1};
  struct Cand {
    int32_t rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Cand> storage;
  storage.reserve(static_cast<size_t>(n));
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q(std::greater<Cand>{}, std::move(storage));
  auto push = [&](int32_t pos) {
    const auto& a = sy[static_cast<size_t>(pos)];
    if (a.next < 0) return;
    if (const PairMap::Slot* s = merges_.find(a.id, sy[static_cast<size_t>(a.next)].id)) q.push({s->rank, pos, s->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!q.empty()) {
    Cand c = q.top();
    q.pop();
    auto& a = sy[static_cast<size_t>(c.pos)];
    if (a.len == 0 || a.next < 0) continue;
    auto& b = sy[static_cast<size_t>(a.next)];
    const PairMap::Slot* s = merges_.find(a.id, b.id);
    if (!s || s->id != c.id) continue;
    a.id = c.id;
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) sy[static_cast<size_t>(a.next)].prev = c.pos;
    if (a.prev >= 0) push(a.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sy[static_cast<size_t>(i)].next) out.push_back(sy[static_cast<size_t>(i)].id);
}

}  // namespace dflash::tok
