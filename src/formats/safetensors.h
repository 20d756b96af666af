// safetensors: read (mmap, zero-copy), write (atomic), and sharded checkpoints with an index.
//
// File layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} with
// offsets relative to the data section, plus an optional "__metadata__" object of strings.
//
// Everything in a header is validated when the file is opened (dtype names, shapes, byte sizes,
// bounds, overlaps, duplicate names), so a file that opens can be read without further checks
// and a bad file is reported as one line naming the file, the tensor and the file byte offset.
//
// Tensors returned by get() view the file mapping directly and keep it alive: they stay valid
// after the SafetensorsFile / ShardedCheckpoint that produced them is gone. The mapping is
// copy-on-write, so writing into such a tensor changes this process's copy, never the file.
// A file truncated by another process while mapped still faults (SIGBUS): mmap cannot help that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex {

// Headers larger than this are rejected as corrupt before any allocation (same bound as the
// reference Rust implementation).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorInfo {
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;        // data_offsets as in the header: relative to the data section
  uint64_t end = 0;
  uint64_t file_offset = 0;  // absolute file byte of the first element (for direct I/O loaders)

  uint64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // kNotFound: no such file; kIoError: the OS refused to open / map it; kCorruptData: the bytes
  // are not a valid safetensors file.
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in header order.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // A zero-copy host tensor over the mapping (contiguous; its data pointer has the alignment of
  // the file offset, which the format does not guarantee).
  Result<Tensor> get(const std::string& name) const;
  Result<TensorInfo> info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole mapped file.
  std::span<const std::byte> bytes() const;

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;  // the mmap'd file; shared with every tensor from get()
  uint64_t file_bytes_ = 0;
  std::vector<std::string> names_;
  std::vector<TensorInfo> infos_;  // parallel to names_
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes host tensors (any dtype; strided views are written contiguous) in the given order, with
// the header padded by spaces so that the data section starts 8-byte aligned. The file appears
// atomically: bytes go to `path.tmp-<pid>`, which is fsync'd and renamed over `path`, and removed
// when anything fails.
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Writes `contents` to `path` with the same temp + fsync + rename discipline (index files,
// configs, manifests).
Status write_file_atomically(const std::string& path, const std::string& contents);

// One checkpoint spread over one or more safetensors files.
class ShardedCheckpoint {
 public:
  // `path` is one of:
  //   - a .safetensors file;
  //   - an index JSON ({"weight_map": {tensor: shard file}}) whose shard names are relative to
  //     the index's folder: every shard must exist, hold each tensor mapped to it and no tensor
  //     that the index maps elsewhere or does not list;
  //   - a directory holding exactly one *.safetensors.index.json (used), or else exactly one
  //     *.safetensors file. Several candidates are an error that lists them.
  static Result<ShardedCheckpoint> open(const std::string& path);

  // The file that was opened: the index, or the single safetensors file.
  const std::string& path() const { return path_; }
  // Names in shard order (shards sorted by file name), header order within a shard.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return shard_of_.count(name) != 0; }
  Result<Tensor> get(const std::string& name) const;
  Result<TensorInfo> info(const std::string& name) const;
  // The first shard's __metadata__ (empty when there are no shards).
  const std::map<std::string, std::string>& metadata() const;
  // The path of the shard that holds `name`.
  Result<std::string> source_of(const std::string& name) const;
  const std::vector<SafetensorsFile>& shards() const { return shards_; }

 private:
  Result<size_t> shard_index(const std::string& name) const;

  std::string path_;
  std::vector<SafetensorsFile> shards_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, size_t> shard_of_;
};

// Splits `tensors` (in order) into shards of at most `max_shard_bytes` of tensor data (a tensor
// larger than that gets a shard of its own) and writes `<dir>/<basename>-0000i-of-0000N.safetensors`
// plus `<dir>/<basename>.safetensors.index.json` with {"metadata": {"total_size": bytes},
// "weight_map": {...}}. `dir` is created if missing; `metadata` goes into every shard. Each file
// is written atomically and the index last, after removing any previous index of that name, so
// an interrupted write never leaves an index that names missing or stale shards.
Status write_sharded(const std::string& dir,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes,
                     const std::string& basename = "model");

}  // namespace vortex
