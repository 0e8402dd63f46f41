// llm.c's token shard files, and a dataset made of several of them.
//
// A shard is a header of 256 little-endian int32 (header[0] magic, header[1] version,
// header[2] number of tokens, the rest zero) followed by that many token ids:
//   magic 20240520, version 1: uint16 ids (llm.c's GPT-2 shards: dev/data/fineweb.py etc.);
//   magic 20240801, version 7: uint32 ids (llm.c's Llama 3 shards, data_common.py "llama-3").
// write_token_shard writes the first when every id fits 16 bits and the second otherwise, so
// llm.c reads what we write and we read what it writes. Decision: magic 20240520 with version
// 2 is read as uint32 ids too (a form other tools' readers accept), but never written.
//
// A TokenDataset may also take Megatron indexed datasets (indexed_dataset.h): PREFIX, PREFIX.bin
// or PREFIX.idx (any of them naming the pair), read as their sequences back to back.
//
//   TokenDataset data = TokenDataset::open("data/train_*.bin");   // file, directory or glob
//   std::vector<int32_t> window(1025);
//   data.read(start, window.size(), window.data());
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/indexed_dataset.h"
#include "engine/data/mapped_file.h"

namespace mammoth::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;
inline constexpr int32_t kShardVersionU32 = 7;
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
  // 2 (uint16 ids) or 4 (uint32 ids).
  int token_bytes() const { return token_bytes_; }
  // The ids of a uint16 shard; throws for a uint32 one (use at() or TokenDataset::read).
  const uint16_t* data() const;
  uint32_t at(int64_t i) const { return token_bytes_ == 2 ? tokens16_[i] : tokens32_[i]; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  const uint16_t* tokens16_ = nullptr;
  const uint32_t* tokens32_ = nullptr;
  int token_bytes_ = 2;
  int64_t size_ = 0;
};

// Writes a shard (to "<path>.tmp", then renamed). The int32 overload writes uint16 ids when all
// are below 65536 and uint32 ids otherwise (or always, with wide); it throws on a negative id,
// naming its position.
void write_token_shard(const std::string& path, const uint16_t* tokens, int64_t count);
void write_token_shard_u32(const std::string& path, const uint32_t* tokens, int64_t count);
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       bool wide = false);

// Expands a data specification into shard paths: an existing file is itself; a Megatron prefix
// (PREFIX.idx exists) is itself; a directory means its *.bin files; anything else is a glob
// pattern (e.g. "dir/train_*.bin"). Results are sorted by name. Throws when nothing matches.
std::vector<std::string> expand_shard_paths(const std::string& spec);

// The Megatron prefix `path` names (PREFIX with PREFIX.idx beside it, PREFIX.idx, or PREFIX.bin
// with PREFIX.idx beside it), or "" when it names none.
std::string megatron_prefix(const std::string& path);

// Several shards read as one token stream, in the given order.
class TokenDataset {
 public:
  TokenDataset() = default;
  static TokenDataset open(const std::string& spec);
  static TokenDataset open(const std::vector<std::string>& paths);

  // Total tokens over all shards.
  int64_t size() const { return offsets_.empty() ? 0 : offsets_.back(); }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  // Part i as an llm.c shard (empty for a Megatron part).
  const TokenShard& shard(int i) const { return shards_.at(i); }

  // Token at global position i.
  uint32_t at(int64_t i) const;
  // Copies tokens [start, start + count) into out, crossing shard boundaries as needed.
  // Throws when the range is outside [0, size()) or a uint32 id does not fit int32.
  void read(int64_t start, int64_t count, int32_t* out) const;

 private:
  int shard_of(int64_t i) const;

  // Reads `count` tokens of part k from its position `local`.
  void read_part(int k, int64_t local, int64_t count, int32_t* out) const;

  std::vector<TokenShard> shards_;
  // Per part: the Megatron dataset (null for an llm.c shard) and its sequences' end positions.
  std::vector<std::shared_ptr<const IndexedDataset>> indexed_;
  std::vector<std::vector<int64_t>> sequence_ends_;
  std::vector<int64_t> offsets_;  // offsets_[k] = first global position after shard k
};

}  // namespace mammoth::data
