// io/safetensors.h — the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
// then the tensor bytes; offsets are relative to the end of the header.
// defines: SafetensorsFile (zero-copy mmap reader), WeightStore (single file or sharded index), write_safetensors
//
// Every malformed input raises dflash::Error naming the file and the field (case C15): header length past the
// end of the file, invalid JSON, unknown dtype string, shape/dtype/byte-range disagreement, ranges that run
// past the end or overlap, missing tensors. No read ever leaves the mapping.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/fs.h"
#include "core/tensor.h"

namespace dflash {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin = 0, end = 0;  // byte range relative to the data section
};

class SafetensorsFile {
 public:
  // Maps the file and validates the whole header. Throws Error("<path>: <field>: <problem>").
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return map_->path(); }
  const std::vector<TensorInfo>& tensors() const { return infos_; }  // in header order
  const TensorInfo* find(const std::string& name) const;            // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A zero-copy host tensor pointing into the mapping (keeps the mapping alive). Throws if absent.
  Tensor view(const std::string& name) const;

 private:
  std::shared_ptr<MappedFile> map_;
  size_t data_start_ = 0;
  std::vector<TensorInfo> infos_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a Hugging Face model directory: `model.safetensors`, or the shards listed in
// `model.safetensors.index.json` ({"weight_map": {tensor: file}}), or a single explicit .safetensors path.
class WeightStore {
 public:
  static WeightStore open(const std::string& dir_or_file);
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws Error naming the tensor and the directory
  Tensor view(const std::string& name) const;             // zero-copy, any stored dtype
  // Converted copy as F32, with its shape checked against `expect` (empty = any). Error names the tensor.
  Tensor f32(const std::string& name, const Shape& expect = {}) const;
  std::vector<std::string> names() const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Writes a safetensors file crash-safely (temp file, fsync, rename; see AtomicFile). Tensors must be on
// the host; they are written in the given order with 8-byte aligned offsets.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dflash
