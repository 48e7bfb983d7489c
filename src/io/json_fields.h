// io/json_fields.h — typed access to the fields of one JSON object (a config.json or an object inside it), with
// errors that name the file and the field.
// defines: JsonFields
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dflash {

// A null value counts as absent (as transformers treats it). Every error names `src` (the file) and
// `prefix` + key (e.g. "rope_scaling.factor").
struct JsonFields {
  const nlohmann::json& j;
  const std::string& src;
  std::string prefix;  // "rope_scaling." for nested objects, for messages

  const nlohmann::json* get(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  // An integer, or a float with an integral value (4096.0).
  int64_t to_int(const nlohmann::json& v, const char* key) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d > -9e15 && d < 9e15 && d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
    }
    DFLASH_FAIL(src, ": ", prefix, key, ": expected an integer, got ", v.dump());
  }
  int64_t req_int(const char* key) const {
    const nlohmann::json* v = get(key);
    DFLASH_CHECK(v != nullptr, src, " missing ", prefix, key);
    return to_int(*v, key);
  }
  int64_t opt_int(const char* key, int64_t def) const {
    const nlohmann::json* v = get(key);
    return v ? to_int(*v, key) : def;
  }
  double req_num(const char* key) const {
    const nlohmann::json* v = get(key);
    DFLASH_CHECK(v != nullptr, src, " missing ", prefix, key);
    DFLASH_CHECK(v->is_number(), src, ": ", prefix, key, ": expected a number, got ", v->dump());
    return v->get<double>();
  }
  double opt_num(const char* key, double def) const { return get(key) ? req_num(key) : def; }
  bool opt_bool(const char* key, bool def) const {
    const nlohmann::json* v = get(key);
    if (!v) return def;
    DFLASH_CHECK(v->is_boolean(), src, ": ", prefix, key, ": expected true or false, got ", v->dump());
    return v->get<bool>();
  }
  std::string opt_str(const char* key, const std::string& def) const {
    const nlohmann::json* v = get(key);
    if (!v) return def;
    DFLASH_CHECK(v->is_string(), src, ": ", prefix, key, ": expected a string, got ", v->dump());
    return v->get<std::string>();
  }
  // A list of integers (absent: empty).
  std::vector<int64_t> opt_int_list(const char* key) const {
    const nlohmann::json* v = get(key);
    std::vector<int64_t> out;
    if (!v) return out;
    DFLASH_CHECK(v->is_array(), src, ": ", prefix, key, ": expected a list of integers, got ", v->dump());
    for (const auto& e : *v) out.push_back(to_int(e, key));
    return out;
  }
};

}  // namespace dflash
