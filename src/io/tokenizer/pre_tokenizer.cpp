// io/tokenizer/pre_tokenizer.cpp — see pre_tokenizer.h.
#include "io/tokenizer/pre_tokenizer.h"

namespace dflash::tok {

PreTokenizer PreTokenizer::load(const json& pj, const std::string& PW) {
  PreTokenizer p;
  if (pj.is_null()) return p;
  std::vector<const json*> parts;
  if (type_of(pj, PW) == "Sequence") {
    const json& seq = field(pj, "pretokenizers", PW);
    DFLASH_CHECK(seq.is_array(), PW, ".pretokenizers: expected an array");
    for (const json& x : seq) parts.push_back(&x);
  } else {
    parts.push_back(&pj);
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const json& x = *parts[i];
    const std::string SW = cat(PW, "[", i, "]");
    const std::string t = type_of(x, SW);
    Step st;
    if (t == "Split") {
      DFLASH_CHECK(!p.byte_level_, SW, ": a Split after ByteLevel is not supported");
      const json& pat = field(x, "pattern", SW);
      std::string re;
      if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
        re = pat["Regex"].get<std::string>();
      } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
        const std::string lit = pat["String"].get<std::string>();
        DFLASH_CHECK(!lit.empty() && lit.find("\\E") == std::string::npos, SW, ".pattern: unsupported string ",
                     pat.dump());
        re = "\\Q" + lit + "\\E";
      } else {
        DFLASH_FAIL(SW, ".pattern: expected {\"Regex\": ...} or {\"String\": ...}, got ", pat.dump());
      }
      const std::string behavior = x.value("behavior", std::string("Isolated"));
      if (behavior == "Isolated") {
        st.behavior = Step::kIsolated;
      } else if (behavior == "Removed") {
        st.behavior = Step::kRemoved;
      } else if (behavior == "MergedWithPrevious") {
        st.behavior = Step::kMergedWithPrevious;
      } else if (behavior == "MergedWithNext") {
        st.behavior = Step::kMergedWithNext;
      } else {
        DFLASH_FAIL(SW, ".behavior: \"", behavior, "\" is not supported (Isolated, Removed, MergedWithPrevious, "
                    "MergedWithNext)");
      }
      DFLASH_CHECK(!opt_bool(x, "invert", false, SW), SW, ".invert: true is not supported");
      st.kind = Step::kSplit;
      st.re = std::make_unique<Regex>(re, SW);
    } else if (t == "ByteLevel") {
      DFLASH_CHECK(!p.byte_level_, SW, ": two ByteLevel pre-tokenizers");
      p.byte_level_ = true;
      st.kind = Step::kByteLevel;
      st.add_prefix_space = opt_bool(x, "add_prefix_space", true, SW);
      if (opt_bool(x, "use_regex", true, SW)) st.re = std::make_unique<Regex>(kGpt2Pattern, SW);
    } else {
      DFLASH_FAIL(SW, ": pre-tokenizer type \"", t, "\" is not supported (Split, ByteLevel, Sequence)");
    }
    p.steps_.push_back(std::move(st));
  }
  return p;
}

}  // namespace dflash::tok
