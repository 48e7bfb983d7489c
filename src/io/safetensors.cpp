// io/safetensors.cpp — safetensors reader (mmap, validated header), WeightStore, crash-safe writer.
#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dflash {

namespace {

using ojson = nlohmann::ordered_json;

constexpr uint64_t kMaxHeader = 100'000'000;  // the limit of the reference implementation

// Safetensors dtype names this project does not load (so the error can say "unsupported", not "unknown").
bool is_other_safetensors_dtype(const std::string& s) {
  static const char* kOther[] = {"I8", "I16", "U16", "U32", "U64", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
                                 "F6_E3M2", "C64"};
  for (const char* o : kOther)
    if (s == o) return true;
  return false;
}

// Parses one tensor entry of the header. `where` is "<path>: tensor '<name>'" for messages.
TensorInfo parse_entry(const std::string& name, const ojson& e, const std::string& where) {
  DFLASH_CHECK(e.is_object(), where, ": entry: expected an object with dtype, shape, data_offsets, got ",
               e.type_name());
  TensorInfo t;
  t.name = name;

  auto dt = e.find("dtype");
  DFLASH_CHECK(dt != e.end(), where, ": dtype: missing");
  DFLASH_CHECK(dt->is_string(), where, ": dtype: expected a string, got ", dt->dump());
  const std::string ds = dt->get<std::string>();
  if (!dtype_from_name(ds, &t.dtype)) {
    DFLASH_CHECK(!is_other_safetensors_dtype(ds), where, ": dtype: unsupported dtype '", ds, "'");
    DFLASH_FAIL(where, ": dtype: unknown dtype '", ds, "'");
  }

  auto sh = e.find("shape");
  DFLASH_CHECK(sh != e.end(), where, ": shape: missing");
  DFLASH_CHECK(sh->is_array(), where, ": shape: expected an array of non-negative integers, got ", sh->dump());
  uint64_t numel = 1;
  bool numel_overflow = false;
  for (const auto& d : *sh) {
    DFLASH_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), where,
                 ": shape: entries must be non-negative integers, got ", sh->dump());
    const uint64_t v = d.get<uint64_t>();
    t.shape.push_back(static_cast<int64_t>(v));
    numel_overflow |= __builtin_mul_overflow(numel, v, &numel);
  }

  auto off = e.find("data_offsets");
  DFLASH_CHECK(off != e.end(), where, ": data_offsets: missing");
  DFLASH_CHECK(off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() && (*off)[1].is_number_unsigned(),
               where, ": data_offsets: expected two non-negative integers [begin, end], got ", off->dump());
  const uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
  DFLASH_CHECK(b <= en, where, ": data_offsets: begin ", b, " > end ", en);
  uint64_t bytes = 0;
  DFLASH_CHECK(!numel_overflow && !__builtin_mul_overflow(numel, dtype_size(t.dtype), &bytes), where,
               ": shape: ", sh->dump(), " is too large");
  DFLASH_CHECK(en - b == bytes, where, ": data_offsets: byte range [", b, ", ", en, ") holds ", en - b,
               " bytes but dtype ", ds, " shape ", shape_str(t.shape), " needs ", bytes);
  t.begin = static_cast<size_t>(b);
  t.end = static_cast<size_t>(en);
  return t;
}

}  // namespace

// ---- SafetensorsFile ----------------------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->map_ = MappedFile::open(path);
  const uint8_t* p = f->map_->data();
  const size_t size = f->map_->size();
  DFLASH_CHECK(size >= 8, path, ": header length: file is ", size, " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  DFLASH_CHECK(n <= size - 8, path, ": header length: ", n, " bytes runs past the end of the file (", size, " bytes)");
  DFLASH_CHECK(n <= kMaxHeader, path, ": header length: ", n, " bytes exceeds the limit of ", kMaxHeader);
  f->data_start_ = 8 + static_cast<size_t>(n);
  const size_t data_size = size - f->data_start_;

  // Parse the header, noting duplicate top-level keys (nlohmann keeps only the last one).
  std::set<std::string> seen;
  std::string duplicate;
  ojson::parser_callback_t cb = [&](int depth, ojson::parse_event_t ev, ojson& parsed) {
    if (ev == ojson::parse_event_t::key && depth == 1) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  ojson h;
  try {
    h = ojson::parse(p + 8, p + 8 + n, cb);
  } catch (const ojson::exception& e) {
    DFLASH_FAIL(path, ": header: invalid JSON: ", e.what());
  }
  DFLASH_CHECK(h.is_object(), path, ": header: expected a JSON object, got ", h.type_name());
  DFLASH_CHECK(duplicate.empty(), path, ": tensor '", duplicate, "': duplicate name in the header");

  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      const ojson& m = it.value();
      if (m.is_null()) continue;
      DFLASH_CHECK(m.is_object(), path, ": __metadata__: expected an object of strings, got ", m.type_name());
      for (auto mi = m.begin(); mi != m.end(); ++mi) {
        DFLASH_CHECK(mi.value().is_string(), path, ": __metadata__: value of '", mi.key(), "' is not a string");
        f->metadata_[mi.key()] = mi.value().get<std::string>();
      }
      continue;
    }
    const std::string where = cat(path, ": tensor '", it.key(), "'");
    TensorInfo t = parse_entry(it.key(), it.value(), where);
    DFLASH_CHECK(t.end <= data_size, where, ": data_offsets: byte range [", t.begin, ", ", t.end,
                 ") runs past the end of the data section (", data_size, " bytes)");
    f->index_[t.name] = f->infos_.size();
    f->infos_.push_back(std::move(t));
  }

  // Overlap check over the non-empty ranges, sorted by start.
  std::vector<const TensorInfo*> order;
  for (const auto& t : f->infos_)
    if (t.end > t.begin) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo *a = order[i - 1], *b = order[i];
    DFLASH_CHECK(b->begin >= a->end, path, ": tensor '", b->name, "': data_offsets: byte range [", b->begin, ", ",
                 b->end, ") overlaps tensor '", a->name, "' [", a->begin, ", ", a->end, ")");
  }
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &infos_[it->second];
}

Tensor SafetensorsFile::view(const std::string& name) const {
  const TensorInfo* t = find(name);
  DFLASH_CHECK(t != nullptr, path(), ": tensor '", name, "' not found");
  Tensor out;
  out.dtype = t->dtype;
  out.device = Device::CPU;
  out.shape = t->shape;
  const size_t off = data_start_ + t->begin;
  if (off % dtype_size(t->dtype) != 0) {
    // A misaligned range (legal in the format, never written by us): copy instead of handing out a bad pointer.
    Tensor c = cpu_empty(t->dtype, t->shape);
    if (t->end > t->begin) std::memcpy(c.data, map_->data() + off, t->end - t->begin);
    return c;
  }
  out.data = const_cast<uint8_t*>(map_->data() + off);  // read-only mapping: do not write through it
  out.owner = std::shared_ptr<void>(map_, out.data);
  return out;
}

// ---- WeightStore ----------------------------------------------------------------------------------------

WeightStore WeightStore::open(const std::string& dir_or_file) {
  WeightStore ws;
  ws.source_ = dir_or_file;
  auto add_file = [&](const std::string& file) {
    auto f = SafetensorsFile::open(file);
    for (const auto& t : f->tensors()) {
      auto [it, fresh] = ws.where_.emplace(t.name, ws.files_.size());
      DFLASH_CHECK(fresh, dir_or_file, ": tensor '", t.name, "' is in both ", ws.files_[it->second]->path(), " and ",
                   file);
    }
    ws.files_.push_back(std::move(f));
  };

  if (file_exists(dir_or_file)) {
    add_file(dir_or_file);
    return ws;
  }
  DFLASH_CHECK(dir_exists(dir_or_file), dir_or_file, ": no such file or directory");
  const std::string index_path = path_join(dir_or_file, "model.safetensors.index.json");
  const std::string single = path_join(dir_or_file, "model.safetensors");
  if (file_exists(index_path)) {
    nlohmann::json idx;
    try {
      idx = nlohmann::json::parse(read_file(index_path));
    } catch (const nlohmann::json::exception& e) {
      DFLASH_FAIL(index_path, ": invalid JSON: ", e.what());
    }
    DFLASH_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(), index_path,
                 ": weight_map: missing or not an object");
    std::map<std::string, size_t> shard_of;  // shard file name -> index into files_
    for (const auto& [tensor, shard] : idx["weight_map"].items()) {
      DFLASH_CHECK(shard.is_string(), index_path, ": weight_map: shard of tensor '", tensor, "' is not a string");
      const std::string sname = shard.get<std::string>();
      auto it = shard_of.find(sname);
      if (it == shard_of.end()) {
        const std::string sp = path_join(dir_or_file, sname);
        DFLASH_CHECK(file_exists(sp), index_path, ": weight_map: shard '", sname, "' (of tensor '", tensor,
                     "') does not exist");
        it = shard_of.emplace(sname, ws.files_.size()).first;
        ws.files_.push_back(SafetensorsFile::open(sp));
      }
      DFLASH_CHECK(ws.files_[it->second]->find(tensor) != nullptr, index_path, ": weight_map: tensor '", tensor,
                   "' is not in its shard ", ws.files_[it->second]->path());
      ws.where_[tensor] = it->second;
    }
    return ws;
  }
  if (file_exists(single)) {
    add_file(single);
    return ws;
  }
  // Any other *.safetensors files in the directory, in name order.
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(dir_or_file))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") found.push_back(e.path().string());
  DFLASH_CHECK(!found.empty(), dir_or_file, ": no model.safetensors, model.safetensors.index.json or *.safetensors");
  std::sort(found.begin(), found.end());
  for (const auto& f : found) add_file(f);
  return ws;
}

bool WeightStore::has(const std::string& name) const { return where_.count(name) != 0; }

const TensorInfo& WeightStore::info(const std::string& name) const {
  auto it = where_.find(name);
  DFLASH_CHECK(it != where_.end(), source_, ": tensor '", name, "' not found");
  return *files_[it->second]->find(name);
}

Tensor WeightStore::view(const std::string& name) const {
  auto it = where_.find(name);
  DFLASH_CHECK(it != where_.end(), source_, ": tensor '", name, "' not found");
  return files_[it->second]->view(name);
}

Tensor WeightStore::f32(const std::string& name, const Shape& expect) const {
  Tensor v = view(name);
  DFLASH_CHECK(expect.empty() || v.shape == expect, source_, ": tensor '", name, "': shape ", shape_str(v.shape),
               ", expected ", shape_str(expect));
  Tensor out = cpu_empty(DType::F32, v.shape);
  const size_t n = static_cast<size_t>(v.numel());
  float* d = static_cast<float*>(out.data);
  switch (v.dtype) {
    case DType::F32:
      if (n) std::memcpy(d, v.data, n * 4);
      break;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(v.data);
      for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
      break;
    }
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(v.data);
      for (size_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
      break;
    }
    case DType::F64: {
      const auto* s = static_cast<const double*>(v.data);
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
      break;
    }
    case DType::F8E4M3:
      DFLASH_FAIL(source_, ": tensor '", name, "' is F8_E4M3: an FP8 weight is read with its scale (model/target/"
                  "weights.h), not alone");
    default:
      DFLASH_FAIL(source_, ": tensor '", name, "': dtype ", dtype_name(v.dtype), " is not a float type");
  }
  return out;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

// ---- writer --------------------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  ojson h = ojson::object();
  if (!metadata.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  // Tensors are laid out back to back in the given order: the reference reader rejects gaps between ranges.
  // The data section starts 8-byte aligned, so offsets stay 8-byte aligned while tensor sizes are multiples of 8.
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    DFLASH_CHECK(!name.empty() && name != "__metadata__", path, ": invalid tensor name '", name, "'");
    DFLASH_CHECK(!h.contains(name), path, ": tensor '", name, "' given twice");
    DFLASH_CHECK(t.device == Device::CPU, path, ": tensor '", name, "' is on ", device_name(t.device),
                 ", not the host");
    for (int64_t d : t.shape) DFLASH_CHECK(d >= 0, path, ": tensor '", name, "': negative dim in ", shape_str(t.shape));
    DFLASH_CHECK(t.nbytes() == 0 || t.data != nullptr, path, ": tensor '", name, "' has no data");
    ojson e = ojson::object();
    e["dtype"] = dtype_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {off, off + t.nbytes()};
    h[name] = std::move(e);
    off += t.nbytes();
  }
  std::string hs;
  try {
    hs = h.dump();
  } catch (const ojson::exception& e) {
    DFLASH_FAIL(path, ": header: cannot encode (tensor names and metadata must be UTF-8): ", e.what());
  }
  while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(hs.size()) >> (8 * i));

  AtomicFile f(path);
  f.write(len, 8);
  f.write(hs);
  for (const auto& [name, t] : tensors)
    if (t.nbytes()) f.write(t.data, t.nbytes());
  f.commit();
}

}  // namespace dflash
