// io/tokenizer/added_vocabulary.cpp — see added_vocabulary.h.
#include "io/tokenizer/added_vocabulary.h"

#include <climits>

#include "io/tokenizer/normalizer.h"

namespace dflash::tok {

AddedVocabulary AddedVocabulary::load(const json& j, const std::string& W) {
  AddedVocabulary av;
  auto at = j.find("added_tokens");
  if (at == j.end() || at->is_null()) return av;
  DFLASH_CHECK(at->is_array(), W, ": added_tokens: expected an array");
  for (size_t i = 0; i < at->size(); ++i) {
    const json& a = (*at)[i];
    const std::string AW = cat(W, ": added_tokens[", i, "]");
    DFLASH_CHECK(a.is_object(), AW, ": expected an object");
    AddedToken t;
    const json& c = field(a, "content", AW);
    const json& id = field(a, "id", AW);
    DFLASH_CHECK(c.is_string() && !c.get<std::string>().empty(), AW, ".content: expected a non-empty string");
    DFLASH_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX, AW,
                 ".id: expected a non-negative integer");
    t.content = c.get<std::string>();
    t.id = id.get<int32_t>();
    t.special = opt_bool(a, "special", false, AW);
    t.lstrip = opt_bool(a, "lstrip", false, AW);
    t.rstrip = opt_bool(a, "rstrip", false, AW);
    t.single_word = opt_bool(a, "single_word", false, AW);
    t.normalized = opt_bool(a, "normalized", !t.special, AW);
    av.tokens.push_back(std::move(t));
  }
  return av;
}

void AddedVocabulary::build_matchers(const Normalizer& norm, const std::string& W) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const AddedToken& t = tokens[i];
    if (!t.normalized) {
      raw_matcher.add(t.content, static_cast<int32_t>(i));
    } else {
      norm_matcher.add(norm.apply(t.content), static_cast<int32_t>(i));
    }
    if (t.single_word && !word_start) {
      word_start = std::make_unique<Regex>("^\\w", W);
      word_end = std::make_unique<Regex>("\\w$", W);
    }
  }
}

}  // namespace dflash::tok
