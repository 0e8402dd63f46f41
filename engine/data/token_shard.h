// llm.c's token shard files, and a dataset made of several of them.
//
// A shard is a header of 256 little-endian int32 (header[0] = 20240520 magic, header[1] = 1
// version, header[2] = number of tokens, the rest zero) followed by that many uint16 token ids.
// This is what llm.c's dev/data scripts write (fineweb.py, tinyshakespeare.py), so their shards
// train here unchanged. Token ids must be < 65536 (GPT-2's 50257 fits).
//
//   TokenDataset data = TokenDataset::open("data/train_*.bin");   // file, directory or glob
//   std::vector<int32_t> window(1025);
//   data.read(start, window.size(), window.data());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/mapped_file.h"

namespace mammoth::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// One memory-mapped shard.
class TokenShard {
 public:
  TokenShard() = default;
  // Throws mammoth::Error naming the file on a missing file, bad magic or version, or a size
  // that disagrees with the header's token count (truncated or trailing bytes).
  static TokenShard open(const std::string& path);

  int64_t size() const { return size_; }
  const uint16_t* data() const { return tokens_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  const uint16_t* tokens_ = nullptr;
  int64_t size_ = 0;
};

// Writes a shard (to "<path>.tmp", then renamed). The int32 overload throws on ids outside
// [0, 65535], naming the first offending position.
void write_token_shard(const std::string& path, const uint16_t* tokens, int64_t count);
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens);

// Expands a data specification into shard paths: an existing file is itself; a directory
// means its *.bin files; anything else is a glob pattern (e.g. "dir/train_*.bin"). Results are
// sorted by name. Throws when nothing matches.
std::vector<std::string> expand_shard_paths(const std::string& spec);

// Several shards read as one token stream, in the given order.
class TokenDataset {
 public:
  TokenDataset() = default;
  static TokenDataset open(const std::string& spec);
  static TokenDataset open(const std::vector<std::string>& paths);

  // Total tokens over all shards.
  int64_t size() const { return offsets_.empty() ? 0 : offsets_.back(); }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const TokenShard& shard(int i) const { return shards_.at(i); }

  // Token at global position i.
  uint16_t at(int64_t i) const;
  // Copies tokens [start, start + count) into out, crossing shard boundaries as needed.
  // Throws when the range is outside [0, size()).
  void read(int64_t start, int64_t count, int32_t* out) const;
  void read(int64_t start, int64_t count, uint16_t* out) const;

 private:
  template <typename T>
  void read_impl(int64_t start, int64_t count, T* out) const;
  int shard_of(int64_t i) const;

  std::vector<TokenShard> shards_;
  std::vector<int64_t> offsets_;  // offsets_[k] = first global position after shard k
};

}  // namespace mammoth::data
