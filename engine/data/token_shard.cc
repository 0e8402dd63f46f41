#include "engine/data/token_shard.h"

#include <glob.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>

#include "base/error.h"

namespace mammoth::data {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and read in place");

TokenShard TokenShard::open(const std::string& path) {
  TokenShard s;
  s.file_ = MappedFile::open(path, "token_shard");
  const size_t bytes = s.file_.size();
  MAMMOTH_CHECK(bytes >= kShardHeaderBytes)
      << "[token_shard] '" << path << "' is truncated: " << bytes << " bytes, less than the "
      << kShardHeaderBytes << "-byte header";
  int32_t header[3];
  std::memcpy(header, s.file_.data(), sizeof(header));
  MAMMOTH_CHECK(header[0] == kShardMagic)
      << "[token_shard] '" << path << "' is not an llm.c token shard: magic " << header[0]
      << ", expected " << kShardMagic;
  MAMMOTH_CHECK(header[1] == kShardVersion)
      << "[token_shard] '" << path << "' has version " << header[1] << ", expected "
      << kShardVersion << " (uint16 tokens)";
  MAMMOTH_CHECK(header[2] >= 0) << "[token_shard] '" << path << "' has a negative token count "
                                << header[2];
  const size_t expected = kShardHeaderBytes + static_cast<size_t>(header[2]) * sizeof(uint16_t);
  MAMMOTH_CHECK(bytes == expected)
      << "[token_shard] '" << path << "': the header says " << header[2] << " tokens (" << expected
      << " bytes) but the file has " << bytes << " bytes"
      << (bytes < expected ? " (truncated)" : " (trailing bytes)");
  s.size_ = header[2];
  s.tokens_ = reinterpret_cast<const uint16_t*>(s.file_.data() + kShardHeaderBytes);
  return s;
}

void write_token_shard(const std::string& path, const uint16_t* tokens, int64_t count) {
  MAMMOTH_CHECK(count >= 0 && count <= INT32_MAX)
      << "[write_token_shard] '" << path << "': " << count
      << " tokens do not fit the header's int32 count; split into more shards";
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(count);
  AtomicFileWriter w(path, "write_token_shard");
  w.write(header, sizeof(header));
  w.write(tokens, static_cast<size_t>(count) * sizeof(uint16_t));
  w.commit();
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    MAMMOTH_CHECK(tokens[i] >= 0 && tokens[i] <= 0xFFFF)
        << "[write_token_shard] '" << path << "': token " << tokens[i] << " at position " << i
        << " does not fit uint16 (vocabularies above 65536 need another format)";
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  write_token_shard(path, narrow.data(), static_cast<int64_t>(narrow.size()));
}

std::vector<std::string> expand_shard_paths(const std::string& spec) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    for (const auto& entry : fs::directory_iterator(spec, ec)) {
      if (entry.is_regular_file() && entry.path().extension() == ".bin") {
        paths.push_back(entry.path().string());
      }
    }
    MAMMOTH_CHECK(!ec) << "[token_dataset] cannot list directory '" << spec
                       << "': " << ec.message();
    MAMMOTH_CHECK(!paths.empty()) << "[token_dataset] directory '" << spec
                                  << "' has no *.bin token shards";
  } else if (fs::is_regular_file(spec, ec)) {
    paths.push_back(spec);
  } else {
    glob_t g{};
    const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
    }
    ::globfree(&g);
    MAMMOTH_CHECK(!paths.empty()) << "[token_dataset] no token shard matches '" << spec
                                  << "' (expected a .bin file, a directory or a glob pattern)";
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

TokenDataset TokenDataset::open(const std::string& spec) { return open(expand_shard_paths(spec)); }

TokenDataset TokenDataset::open(const std::vector<std::string>& paths) {
  MAMMOTH_CHECK(!paths.empty()) << "[token_dataset] no shard paths given";
  TokenDataset d;
  int64_t total = 0;
  for (const std::string& p : paths) {
    d.shards_.push_back(TokenShard::open(p));
    total += d.shards_.back().size();
    d.offsets_.push_back(total);
  }
  return d;
}

int TokenDataset::shard_of(int64_t i) const {
  return static_cast<int>(std::upper_bound(offsets_.begin(), offsets_.end(), i) - offsets_.begin());
}

uint16_t TokenDataset::at(int64_t i) const {
  MAMMOTH_CHECK(i >= 0 && i < size())
      << "[token_dataset] position " << i << " is outside [0, " << size() << ")";
  const int k = shard_of(i);
  const int64_t base = k == 0 ? 0 : offsets_[k - 1];
  return shards_[k].data()[i - base];
}

template <typename T>
void TokenDataset::read_impl(int64_t start, int64_t count, T* out) const {
  MAMMOTH_CHECK(start >= 0 && count >= 0 && start + count <= size())
      << "[token_dataset] read of " << count << " tokens at " << start << " is outside [0, "
      << size() << ")";
  int k = shard_of(start);
  while (count > 0) {
    const int64_t base = k == 0 ? 0 : offsets_[k - 1];
    const int64_t n = std::min(count, offsets_[k] - start);
    const uint16_t* src = shards_[k].data() + (start - base);
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(src[i]);
    out += n;
    start += n;
    count -= n;
    ++k;
  }
}

void TokenDataset::read(int64_t start, int64_t count, int32_t* out) const {
  read_impl(start, count, out);
}
void TokenDataset::read(int64_t start, int64_t count, uint16_t* out) const {
  read_impl(start, count, out);
}

}  // namespace mammoth::data
