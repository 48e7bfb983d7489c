// io/json_fields.h — typed access to the fields of one JSON object (a config.json or an object inside it), with
// errors that name the file and the field; a struct's JSON mapping written once for both directions.
// defines: JsonFields, fields_to_json, fields_from_json
#pragma once
#include <cstdint>
#include <string>
#include <utility>
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

// A struct's to_json and from_json from one list of its fields: `fields(obj, f)` calls f(key, member, required) for
// every member (obj is const when writing). Reading starts from a default-constructed T, so an optional key that is
// absent keeps the struct's default; a required one that is absent throws nlohmann's out_of_range.
template <class T, class Fields>
void fields_to_json(nlohmann::json& j, const T& v, Fields&& fields) {
  j = nlohmann::json::object();
  fields(v, [&j](const char* key, const auto& member, bool) { j[key] = member; });
}
template <class T, class Fields>
void fields_from_json(const nlohmann::json& j, T& v, Fields&& fields) {
  T out;
  fields(out, [&j](const char* key, auto& member, bool required) {
    if (required || j.contains(key)) j.at(key).get_to(member);
  });
  v = std::move(out);
}

}  // namespace dflash
