// io/tokenizer/json_reader.h — reading tokenizer.json: a SAX reader that keeps the document as JSON except
// model.vocab and model.merges (hundreds of thousands of entries), which it streams into flat vectors, and the
// helpers that name the file and the field in every error.
// defines: tok::json, tok::field, tok::opt_bool, tok::type_of, tok::TokenizerJsonReader
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dflash::tok {

using json = nlohmann::json;

// JSON helpers naming the file and the field in errors: a required field, an optional boolean, an object's "type".
const json& field(const json& j, const char* key, const std::string& where);
bool opt_bool(const json& j, const char* key, bool dflt, const std::string& where);
std::string type_of(const json& j, const std::string& where);

// Reads tokenizer.json as a DOM except model.vocab and model.merges (hundreds of thousands of entries), which are
// streamed into flat vectors: several times faster than building them as JSON nodes.
class TokenizerJsonReader : public nlohmann::json_sax<json> {
 public:
  json root;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool have_vocab = false, have_merges = false;
  std::string error;

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override { return mode_ == kVocab ? vocab_id(v) : value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    return mode_ == kVocab ? vocab_id(v > INT64_MAX ? -1 : static_cast<int64_t>(v)) : value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override {
    return mode_ == kVocab ? vocab_id(-1) : value(json(v));
  }
  bool string(string_t& s) override {
    if (mode_ == kVocab) return vocab_id(-1);
    if (mode_ == kMerges) {
      if (merge_depth_ == 1) {
        parts_.push_back(std::move(s));
        return true;
      }
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return fail(cat("model.merges[", merges.size(), "]: expected \"left right\", got \"", s, "\""));
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      return true;
    }
    return value(json(std::move(s)));
  }
  bool binary(binary_t&) override { return fail("unexpected binary value"); }
  bool start_object(std::size_t) override {
    if (mode_ == kVocab) return vocab_id(-1);
    if (mode_ == kMerges)
      return fail(cat("model.merges[", merges.size(), "]: expected \"left right\" or [left, right]"));
    if (in_model() && key_ == "vocab") {
      mode_ = kVocab;
      have_vocab = true;
      return true;
    }
    open(json::object());
    return true;
  }
  bool key(string_t& k) override {
    if (mode_ == kVocab) {
      vocab_key_ = std::move(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool end_object() override {
    if (mode_ == kVocab) {
      mode_ = kDom;
    } else {
      close();
    }
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == kVocab) return vocab_id(-1);
    if (mode_ == kMerges) {
      if (merge_depth_ != 0) return fail(cat("model.merges[", merges.size(), "]: nested array"));
      merge_depth_ = 1;
      parts_.clear();
      return true;
    }
    if (in_model() && key_ == "merges") {
      mode_ = kMerges;
      have_merges = true;
      return true;
    }
    open(json::array());
    return true;
  }
  bool end_array() override {
    if (mode_ == kMerges) {
      if (merge_depth_ == 0) {
        mode_ = kDom;
        return true;
      }
      merge_depth_ = 0;
      if (parts_.size() != 2) return fail(cat("model.merges[", merges.size(), "]: expected [left, right]"));
      merges.emplace_back(std::move(parts_[0]), std::move(parts_[1]));
      return true;
    }
    close();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(e.what());
  }

 private:
  enum Mode { kDom, kVocab, kMerges } mode_ = kDom;
  std::vector<json*> stack_;       // open containers (pointers stay valid: a container only grows when closed)
  std::vector<std::string> path_;  // the key each open container sits under ("" for the root / array items)
  std::string key_, vocab_key_;
  std::vector<std::string> parts_;
  int merge_depth_ = 0;

  bool in_model() const { return stack_.size() == 2 && path_[1] == "model" && stack_[1]->is_object(); }
  bool fail(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  bool vocab_id(int64_t v) {
    if (v < 0 || v >= INT32_MAX)
      return fail(cat("model.vocab[\"", vocab_key_, "\"]: expected a non-negative integer id"));
    vocab.emplace_back(std::move(vocab_key_), v);
    return true;
  }
  json* add(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json* top = stack_.back();
    if (top->is_array()) {
      top->push_back(std::move(v));
      return &top->back();
    }
    json& slot = (*top)[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json&& v) {
    if (mode_ == kMerges)
      return fail(cat("model.merges[", merges.size(), "]: expected \"left right\" or [left, right]"));
    add(std::move(v));
    return true;
  }
  void open(json&& v) {
    std::string under = (!stack_.empty() && stack_.back()->is_object()) ? key_ : std::string();
    stack_.push_back(add(std::move(v)));
    path_.push_back(std::move(under));
  }
  void close() {
    stack_.pop_back();
    path_.pop_back();
  }
};

}  // namespace dflash::tok
