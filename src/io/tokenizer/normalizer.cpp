// io/tokenizer/normalizer.cpp — see normalizer.h.
#include "io/tokenizer/normalizer.h"

#include "io/tokenizer/util.h"
#include "io/unicode_nfc.h"

namespace dflash::tok {

Normalizer Normalizer::load(const json& nj, const std::string& NW) {
  Normalizer n;
  if (nj.is_null()) return n;
  std::vector<const json*> parts;
  if (type_of(nj, NW) == "Sequence") {
    const json& seq = field(nj, "normalizers", NW);
    DFLASH_CHECK(seq.is_array(), NW, ".normalizers: expected an array");
    for (const json& p : seq) parts.push_back(&p);
  } else {
    parts.push_back(&nj);
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const json& p = *parts[i];
    const std::string SW = parts.size() > 1 || &p != &nj ? cat(NW, "[", i, "]") : NW;
    const std::string t = type_of(p, SW);
    Step st;
    if (t == "NFC") {
      st.kind = Step::kNfc;
    } else if (t == "Prepend") {
      const json& v = field(p, "prepend", SW);
      DFLASH_CHECK(v.is_string(), SW, ".prepend: expected a string");
      st.kind = Step::kPrepend;
      st.a = v.get<std::string>();
    } else if (t == "Replace") {
      const json& pat = field(p, "pattern", SW);
      DFLASH_CHECK(pat.is_object() && pat.contains("String") && pat["String"].is_string(), SW,
                   ".pattern: only {\"String\": ...} patterns are supported, got ", pat.dump());
      const json& c = field(p, "content", SW);
      DFLASH_CHECK(c.is_string(), SW, ".content: expected a string");
      st.kind = Step::kReplace;
      st.a = pat["String"].get<std::string>();
      st.b = c.get<std::string>();
      DFLASH_CHECK(!st.a.empty(), SW, ".pattern: an empty string");
    } else {
      DFLASH_FAIL(SW, ": normalizer type \"", t, "\" is not supported (NFC, Prepend, Replace, Sequence)");
    }
    n.steps_.push_back(std::move(st));
  }
  return n;
}

bool Normalizer::nfc() const {
  for (const Step& s : steps_)
    if (s.kind == Step::kNfc) return true;
  return false;
}

std::string Normalizer::apply(std::string_view in) const {
  std::string s(in);
  for (const Step& st : steps_) {
    switch (st.kind) {
      case Step::kNfc: s = dflash::nfc(s); break;
      case Step::kPrepend:
        if (!s.empty()) s.insert(0, st.a);
        break;
      case Step::kReplace: s = tok::replace_all(s, st.a, st.b); break;
    }
  }
  return s;
}

}  // namespace dflash::tok
