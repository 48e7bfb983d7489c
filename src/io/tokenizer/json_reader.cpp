// io/tokenizer/json_reader.cpp — see json_reader.h.
#include "io/tokenizer/json_reader.h"

namespace dflash::tok {

const json& field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  DFLASH_CHECK(it != j.end(), where, ": missing field \"", key, "\"");
  return *it;
}
bool opt_bool(const json& j, const char* key, bool dflt, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  DFLASH_CHECK(it->is_boolean(), where, ".", key, ": expected true/false, got ", it->dump());
  return it->get<bool>();
}
std::string type_of(const json& j, const std::string& where) {
  DFLASH_CHECK(j.is_object(), where, ": expected an object, got ", j.dump().substr(0, 200));
  auto it = j.find("type");
  DFLASH_CHECK(it != j.end() && it->is_string(), where, ": missing string field \"type\"");
  return it->get<std::string>();
}

}  // namespace dflash::tok
