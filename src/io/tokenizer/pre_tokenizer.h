// io/tokenizer/pre_tokenizer.h — the "pre_tokenizer" section of tokenizer.json: Split (a Regex or String pattern;
// behavior Isolated, Removed, MergedWithPrevious or MergedWithNext; invert false), ByteLevel (add_prefix_space,
// use_regex: the GPT-2 regex) and Sequence of these. The regexes run on PCRE2 (UTF + UCP + JIT); `\s` / `\S` are
// rewritten to the Unicode White_Space set that Oniguruma (used by Hugging Face) matches.
// defines: tok::PreTokenizer
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer/json_reader.h"
#include "io/tokenizer/util.h"

namespace dflash::tok {

class PreTokenizer {
 public:
  // Reads `pre_tokenizer` (null: none; the whole normalized piece is one word). Throws Error naming `where` and
  // the step for an unsupported type or option.
  static PreTokenizer load(const json& pre_tokenizer, const std::string& where);
  bool byte_level() const { return byte_level_; }  // has a ByteLevel step: the model works on bytes

  // Calls emit(word) for every word of `s`, in order.
  template <class F>
  void split(std::string_view s, ThreadState& ts, F&& emit) const {
    run(0, s, ts, emit);
  }

 private:
  struct Step {
    enum Kind { kSplit, kByteLevel } kind = kSplit;
    enum Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext } behavior = kIsolated;
    std::unique_ptr<Regex> re;  // Split pattern, or the GPT-2 regex of ByteLevel(use_regex=true)
    bool add_prefix_space = false;
  };
  std::vector<Step> steps_;
  bool byte_level_ = false;

  template <class F>
  void run(size_t step, std::string_view s, ThreadState& ts, F& emit) const;
};

template <class F>
void PreTokenizer::run(size_t step, std::string_view s, ThreadState& ts, F& emit) const {
  if (step == steps_.size()) {
    if (!s.empty()) emit(s);
    return;
  }
  const Step& st = steps_[step];
  std::string prefixed;
  if (st.kind == Step::kByteLevel) {
    if (st.add_prefix_space && (s.empty() || s[0] != ' ')) {
      prefixed.reserve(s.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(s);
      s = prefixed;
    }
    if (!st.re) {
      run(step + 1, s, ts, emit);
      return;
    }
  }
  // Pieces between matches and the matches, joined as the behavior says.
  size_t prev = 0, pos = 0, ms = 0, me = 0;
  while (pos <= s.size() && st.re->find(s, pos, ts, ms, me)) {
    if (me == ms) {  // empty match: not a piece; search again one character further
      size_t i = ms;
      if (i >= s.size()) break;
      decode_utf8(s, i);
      pos = i;
      continue;
    }
    switch (st.behavior) {
      case Step::kIsolated:
        if (ms > prev) run(step + 1, s.substr(prev, ms - prev), ts, emit);
        run(step + 1, s.substr(ms, me - ms), ts, emit);
        prev = me;
        break;
      case Step::kRemoved:
        if (ms > prev) run(step + 1, s.substr(prev, ms - prev), ts, emit);
        prev = me;
        break;
      case Step::kMergedWithPrevious:
        run(step + 1, s.substr(prev, me - prev), ts, emit);
        prev = me;
        break;
      case Step::kMergedWithNext:
        if (ms > prev) run(step + 1, s.substr(prev, ms - prev), ts, emit);
        prev = ms;
        break;
    }
    pos = me;
  }
  if (prev < s.size()) run(step + 1, s.substr(prev), ts, emit);
}

}  // namespace dflash::tok
