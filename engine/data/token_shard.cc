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
  MAMMOTH_CHECK(header[0] == kShardMagic || header[0] == kShardMagicU32)
      << "[token_shard] '" << path << "' is not an llm.c token shard: magic " << header[0]
      << ", expected " << kShardMagic << " (uint16 ids) or " << kShardMagicU32 << " (uint32 ids)";
  if (header[0] == kShardMagicU32) {
    MAMMOTH_CHECK(header[1] == kShardVersionU32)
        << "[token_shard] '" << path << "' has magic " << kShardMagicU32 << " and version "
        << header[1] << ", expected " << kShardVersionU32 << " (uint32 ids)";
    s.token_bytes_ = 4;
  } else {
    MAMMOTH_CHECK(header[1] == kShardVersion || header[1] == 2)
        << "[token_shard] '" << path << "' has version " << header[1] << ", expected "
        << kShardVersion << " (uint16 ids) or 2 (uint32 ids)";
    s.token_bytes_ = header[1] == kShardVersion ? 2 : 4;
  }
  MAMMOTH_CHECK(header[2] >= 0) << "[token_shard] '" << path << "' has a negative token count "
                                << header[2];
  const size_t expected =
      kShardHeaderBytes + static_cast<size_t>(header[2]) * static_cast<size_t>(s.token_bytes_);
  MAMMOTH_CHECK(bytes == expected)
      << "[token_shard] '" << path << "': the header says " << header[2] << " tokens of "
      << s.token_bytes_ << " bytes (" << expected << " bytes) but the file has " << bytes
      << " bytes" << (bytes < expected ? " (truncated)" : " (trailing bytes)");
  s.size_ = header[2];
  const uint8_t* tokens = s.file_.data() + kShardHeaderBytes;
  if (s.token_bytes_ == 2) {
    s.tokens16_ = reinterpret_cast<const uint16_t*>(tokens);
  } else {
    s.tokens32_ = reinterpret_cast<const uint32_t*>(tokens);
  }
  return s;
}

const uint16_t* TokenShard::data() const {
  MAMMOTH_CHECK(token_bytes_ == 2)
      << "[token_shard] '" << path() << "' holds uint32 ids; read them with at() or TokenDataset";
  return tokens16_;
}

namespace {

void write_shard(const std::string& path, const void* tokens, int64_t count, bool wide) {
  MAMMOTH_CHECK(count >= 0 && count <= INT32_MAX)
      << "[write_token_shard] '" << path << "': " << count
      << " tokens do not fit the header's int32 count; split into more shards";
  int32_t header[kShardHeaderInts] = {};
  header[0] = wide ? kShardMagicU32 : kShardMagic;
  header[1] = wide ? kShardVersionU32 : kShardVersion;
  header[2] = static_cast<int32_t>(count);
  AtomicFileWriter w(path, "write_token_shard");
  w.write(header, sizeof(header));
  w.write(tokens, static_cast<size_t>(count) * (wide ? sizeof(uint32_t) : sizeof(uint16_t)));
  w.commit();
}

}  // namespace

void write_token_shard(const std::string& path, const uint16_t* tokens, int64_t count) {
  write_shard(path, tokens, count, false);
}

void write_token_shard_u32(const std::string& path, const uint32_t* tokens, int64_t count) {
  write_shard(path, tokens, count, true);
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, bool wide) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    MAMMOTH_CHECK(tokens[i] >= 0) << "[write_token_shard] '" << path << "': token " << tokens[i]
                                  << " at position " << i << " is negative";
    wide = wide || tokens[i] > 0xFFFF;
  }
  if (wide) {
    const std::vector<uint32_t> ids(tokens.begin(), tokens.end());
    write_token_shard_u32(path, ids.data(), static_cast<int64_t>(ids.size()));
  } else {
    const std::vector<uint16_t> ids(tokens.begin(), tokens.end());
    write_token_shard(path, ids.data(), static_cast<int64_t>(ids.size()));
  }
}

std::string megatron_prefix(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return path.size() > n && path.compare(path.size() - n, n, suffix) == 0;
  };
  if (ends_with(".idx") || ends_with(".bin")) {
    const std::string prefix = path.substr(0, path.size() - 4);
    if (fs::is_regular_file(prefix + ".idx", ec)) return prefix;
  }
  if (!fs::is_regular_file(path, ec) && fs::is_regular_file(path + ".idx", ec)) return path;
  return "";
}

std::vector<std::string> expand_shard_paths(const std::string& spec) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  std::error_code ec;
  if (!fs::exists(spec, ec) && !megatron_prefix(spec).empty()) {
    paths.push_back(spec);
  } else if (fs::is_directory(spec, ec)) {
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
    const std::string prefix = megatron_prefix(p);
    std::vector<int64_t> ends;
    if (prefix.empty()) {
      d.shards_.push_back(TokenShard::open(p));
      d.indexed_.push_back(nullptr);
      total += d.shards_.back().size();
    } else {
      auto m = std::make_shared<IndexedDataset>(IndexedDataset::open(prefix));
      ends.reserve(static_cast<size_t>(m->num_sequences()));
      int64_t end = 0;
      for (int64_t i = 0; i < m->num_sequences(); ++i) ends.push_back(end += m->sequence_length(i));
      d.shards_.emplace_back();
      d.indexed_.push_back(std::move(m));
      total += end;
    }
    d.sequence_ends_.push_back(std::move(ends));
    d.offsets_.push_back(total);
  }
  return d;
}

int TokenDataset::shard_of(int64_t i) const {
  return static_cast<int>(std::upper_bound(offsets_.begin(), offsets_.end(), i) - offsets_.begin());
}

void TokenDataset::read_part(int k, int64_t local, int64_t count, int32_t* out) const {
  if (const IndexedDataset* m = indexed_[k].get()) {
    const std::vector<int64_t>& ends = sequence_ends_[k];
    int64_t seq = std::upper_bound(ends.begin(), ends.end(), local) - ends.begin();
    while (count > 0) {
      const int64_t start = seq == 0 ? 0 : ends[seq - 1];
      const int64_t n = std::min(count, ends[seq] - local);
      m->read(seq, local - start, n, out);
      for (int64_t i = 0; i < n; ++i) {
        MAMMOTH_CHECK(out[i] >= 0) << "[token_dataset] Megatron dataset: element " << local + i
                                   << " is " << out[i] << ", not a token id";
      }
      out += n;
      local += n;
      count -= n;
      ++seq;
    }
    return;
  }
  const TokenShard& s = shards_[k];
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t id = s.at(local + i);
    MAMMOTH_CHECK(id <= static_cast<uint32_t>(INT32_MAX))
        << "[token_dataset] '" << s.path() << "': token " << id << " at position " << local + i
        << " is too large for a token id";
    out[i] = static_cast<int32_t>(id);
  }
}

uint32_t TokenDataset::at(int64_t i) const {
  MAMMOTH_CHECK(i >= 0 && i < size())
      << "[token_dataset] position " << i << " is outside [0, " << size() << ")";
  const int k = shard_of(i);
  const int64_t base = k == 0 ? 0 : offsets_[k - 1];
  if (!indexed_[k]) return shards_[k].at(i - base);
  int32_t v = 0;
  read_part(k, i - base, 1, &v);
  return static_cast<uint32_t>(v);
}

void TokenDataset::read(int64_t start, int64_t count, int32_t* out) const {
  MAMMOTH_CHECK(start >= 0 && count >= 0 && start + count <= size())
      << "[token_dataset] read of " << count << " tokens at " << start << " is outside [0, "
      << size() << ")";
  int k = shard_of(start);
  while (count > 0) {
    const int64_t base = k == 0 ? 0 : offsets_[k - 1];
    const int64_t n = std::min(count, offsets_[k] - start);
    read_part(k, start - base, n, out);
    out += n;
    start += n;
    count -= n;
    ++k;
  }
}

}  // namespace mammoth::data
