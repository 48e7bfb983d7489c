// io/unicode_nfc.h — Unicode Normalization Form C (UAX #15) of UTF-8 text, for the tokenizer's "NFC" normalizer
// (Qwen2/Qwen3 tokenizer.json). Table driven: combining classes, canonical decompositions and primary composites
// generated from the Unicode Character Database by scripts/gen_unicode_nfc.py (unicode_nfc_tables.inc); Hangul
// syllables are composed / decomposed algorithmically.
// defines: nfc, is_nfc_quick, unicode_nfc_version
//
// Bytes that are not valid UTF-8 are passed through unchanged (each one acts as a starter that nothing composes
// with). All functions are pure and thread safe (the lookup tables are immutable after a thread-safe first use).
#pragma once
#include <string>
#include <string_view>

namespace dflash {

// The NFC form of `text`.
std::string nfc(std::string_view text);
// True when the NFC quick check says YES for every character (then nfc(text) == text). False means
// "maybe not": the full algorithm has to run.
bool is_nfc_quick(std::string_view text);
// The Unicode version of the tables, e.g. "14.0.0".
const char* unicode_nfc_version();

}  // namespace dflash
