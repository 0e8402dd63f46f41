#include "engine/train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "base/crc32c.h"
#include "base/error.h"
#include "engine/io/tensor_io.h"

namespace mammoth::engine::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFiles[] = {"model.safetensors", "optimizer.safetensors", "state.json"};

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  MAMMOTH_CHECK(fd >= 0) << "[checkpoint] cannot open " << path
                         << " to sync: " << std::strerror(errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MAMMOTH_CHECK(rc == 0) << "[checkpoint] fsync of " << path << " failed: " << std::strerror(err);
}

void write_file_synced(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    MAMMOTH_CHECK(out.good()) << "[checkpoint] cannot create " << path << ": "
                              << std::strerror(errno);
    out << text;
    out.flush();
    MAMMOTH_CHECK(out.good()) << "[checkpoint] writing " << path
                              << " failed (disk full?): " << std::strerror(errno);
  }
  fsync_path(path, false);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MAMMOTH_CHECK(in.good()) << "[checkpoint] cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// CRC-32C of every tensor's bytes in a safetensors file, so that a corrupt file can be narrowed
// to the tensors it damaged (the file's own CRC only says that something changed).
json::Value tensor_crcs(const std::string& path) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(path);
  json::Value crcs = json::Value::object();
  for (const io::TensorView& v : f.tensors()) {
    crcs.set(v.name, json::Value(static_cast<int64_t>(crc32c(v.data, v.nbytes))));
  }
  return crcs;
}

bool is_safetensors(const std::string& file) {
  const std::string ext = ".safetensors";
  return file.size() > ext.size() && file.compare(file.size() - ext.size(), ext.size(), ext) == 0;
}

// manifest.json: size and CRC-32C of each file. `known` gives them for files whose writer
// already computed them (shards); the others are read here.
void write_manifest(const std::string& tmp_dir, int64_t step, const std::vector<std::string>& files,
                    const std::map<std::string, json::Value>& known) {
  json::Value manifest = json::Value::object();
  manifest.set("step", json::Value(step));
  json::Value entries = json::Value::object();
  for (const std::string& f : files) {
    auto it = known.find(f);
    if (it != known.end()) {
      entries.set(f, it->second);
      continue;
    }
    const std::string p = tmp_dir + "/" + f;
    json::Value entry = json::Value::object();
    entry.set("bytes", json::Value(static_cast<int64_t>(fs::file_size(p))));
    entry.set("crc32c", json::Value(static_cast<int64_t>(crc32c_file(p))));
    if (is_safetensors(f)) entry.set("tensor_crc32c", tensor_crcs(p));
    entries.set(f, entry);
  }
  manifest.set("files", entries);
  write_file_synced(tmp_dir + "/manifest.json", json::dump(manifest, 2) + "\n");
  fsync_path(tmp_dir, true);
}

// Moves a complete temporary checkpoint into place, points `latest` at it, removes temporary
// directories of dead writers and prunes beyond keep_last.
std::string finish_checkpoint(const std::string& save_dir, const std::string& name,
                              const std::string& tmp_dir, int keep_last) {
  std::error_code ec;
  const std::string final_dir = save_dir + "/" + name;
  // A run killed mid-write leaves its ".step_N.tmp.PID" behind; remove those whose process is
  // gone (a live PID may be another writer sharing the directory). Before `latest` moves, so a
  // reader that sees the new checkpoint never sees those leftovers.
  for (const auto& entry : fs::directory_iterator(save_dir, ec)) {
    const std::string n = entry.path().filename().string();
    const size_t at = n.rfind(".tmp.");
    if (n.rfind(".step_", 0) != 0 || at == std::string::npos) continue;
    const long pid = std::strtol(n.c_str() + at + 5, nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      fs::remove_all(entry.path(), ec);
    }
  }
  try {
    // Replace an existing checkpoint of the same step only after the new one is complete.
    if (fs::exists(final_dir)) {
      const std::string old = final_dir + ".old." + std::to_string(::getpid());
      fs::rename(final_dir, old);
      fs::rename(tmp_dir, final_dir);
      fs::remove_all(old);
    } else {
      fs::rename(tmp_dir, final_dir);
    }
    fsync_path(save_dir, true);
    write_file_synced(save_dir + "/latest.tmp", name + "\n");
    fs::rename(save_dir + "/latest.tmp", save_dir + "/latest");
    fsync_path(save_dir, true);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  // Prune the oldest complete checkpoints beyond keep_last (never the one just written).
  if (keep_last > 0) {
    std::vector<std::string> steps;
    for (const auto& entry : fs::directory_iterator(save_dir)) {
      const std::string n = entry.path().filename().string();
      if (entry.is_directory() && n.rfind("step_", 0) == 0 && n.find('.') == std::string::npos) {
        steps.push_back(n);
      }
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + keep_last < steps.size(); ++i) {
      if (steps[i] != name) fs::remove_all(save_dir + "/" + steps[i], ec);
    }
  }
  return final_dir;
}

std::string shard_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "shard_%05d.safetensors", rank);
  return buf;
}

// "<tensor>@<offset>" -> (tensor, offset); throws naming the file for anything else.
std::pair<std::string, int64_t> parse_piece_key(const std::string& key, const std::string& file) {
  const size_t at = key.rfind('@');
  char* end = nullptr;
  const long long off = at == std::string::npos ? -1 : std::strtoll(key.c_str() + at + 1, &end, 10);
  MAMMOTH_CHECK(at != std::string::npos && at > 0 && off >= 0 && end != nullptr && *end == '\0' &&
                end != key.c_str() + at + 1)
      << "[checkpoint] " << file << ": tensor '" << key
      << "' is not named <tensor>@<offset> as a shard's pieces are";
  return {key.substr(0, at), off};
}

}  // namespace

std::string save_checkpoint(const std::string& save_dir, int64_t step, const CheckpointContents& c,
                            int keep_last) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  MAMMOTH_CHECK(!ec) << "[checkpoint] cannot create --save-dir " << save_dir << ": "
                     << ec.message();
  const std::string name = step_name(step);
  const std::string tmp_dir = save_dir + "/." + name + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  MAMMOTH_CHECK(!ec) << "[checkpoint] cannot create " << tmp_dir << ": " << ec.message();
  try {
    io::save_tensors(tmp_dir + "/model.safetensors", *c.model, {{"format", "pt"}});
    io::save_tensors(tmp_dir + "/optimizer.safetensors", *c.optimizer);
    write_file_synced(tmp_dir + "/state.json", json::dump(c.state, 2) + "\n");
    write_manifest(tmp_dir, step, {std::begin(kFiles), std::end(kFiles)}, {});
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  return finish_checkpoint(save_dir, name, tmp_dir, keep_last);
}

std::optional<std::string> latest_checkpoint(const std::string& save_dir) {
  const std::string pointer = save_dir + "/latest";
  if (!fs::exists(pointer)) return std::nullopt;
  std::string name = read_file(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  MAMMOTH_CHECK(!name.empty() && name.find('/') == std::string::npos)
      << "[checkpoint] " << pointer << " is malformed: '" << name << "'";
  const std::string dir = save_dir + "/" + name;
  MAMMOTH_CHECK(fs::is_directory(dir)) << "[checkpoint] " << pointer << " names " << name
                                       << ", which does not exist in " << save_dir;
  return dir;
}

namespace {

// Which tensors of a file whose CRC-32C differs from the manifest's were damaged: those whose
// bytes no longer match their own CRC-32C ("<tensor>@<offset>" in a shard names the piece).
std::string damaged_tensors(const std::string& path, const json::Value& entry) {
  const json::Value* expected = entry.find("tensor_crc32c");
  if (expected == nullptr) return " (this checkpoint predates per-tensor CRCs)";
  std::string header_error;
  try {
    const io::SafetensorsFile f = io::SafetensorsFile::open(path);
    std::string names;
    for (const io::TensorView& v : f.tensors()) {
      const json::Value* want = expected->find(v.name);
      const int64_t crc = crc32c(v.data, v.nbytes);
      if (want != nullptr && want->as_int() == crc) continue;
      names += names.empty() ? "" : ", ";
      // A shard's piece "<tensor>@<offset>" is named as the tensor and its range.
      const size_t at = v.name.rfind('@');
      if (at != std::string::npos && path.find("/shard_") != std::string::npos) {
        const auto [tensor, offset] = parse_piece_key(v.name, path);
        const int64_t n = static_cast<int64_t>(v.nbytes / dtype_size(v.dtype));
        names += "'" + tensor + "' elements [" + std::to_string(offset) + ", " +
                 std::to_string(offset + n) + ")";
      } else {
        names += "'" + v.name + "'";
      }
    }
    if (!names.empty()) return "; damaged tensor(s): " + names;
    return "; every tensor's bytes match their CRC-32C, so the damage is in the header's padding";
  } catch (const Error& e) {
    header_error = e.message();
  }
  return "; its safetensors header is damaged: " + header_error;
}

}  // namespace

std::vector<std::string> checkpoint_problems(const std::string& dir) {
  std::vector<std::string> problems;
  const std::string mpath = dir + "/manifest.json";
  if (!fs::exists(mpath)) {
    return {"[checkpoint] " + mpath + " is missing: not a complete checkpoint"};
  }
  const json::Value manifest = json::parse(read_file(mpath), mpath);
  const json::Value& files = manifest.at("files");
  MAMMOTH_CHECK(files.is_object()) << "[checkpoint] " << mpath << ": 'files' is not an object";
  // The files either form needs (the shards are checked against index.json when loading).
  const bool sharded = files.contains("index.json");
  const std::vector<std::string> needed =
      sharded ? std::vector<std::string>{"index.json", "state.json"}
              : std::vector<std::string>{std::begin(kFiles), std::end(kFiles)};
  for (const std::string& f : needed) {
    if (!files.contains(f)) problems.push_back("[checkpoint] " + mpath + " does not list " + f);
  }
  for (const json::Value& entry : files) {
    const std::string& f = entry.key();
    if (f.empty() || f.find('/') != std::string::npos || f[0] == '.') {
      problems.push_back("[checkpoint] " + mpath + " lists a file outside the checkpoint: '" + f +
                         "'");
      continue;
    }
    const std::string p = dir + "/" + f;
    // The names come from the manifest: the throwing overloads would turn one the filesystem
    // refuses (longer than NAME_MAX, say) into a std::filesystem::filesystem_error.
    std::error_code ec;
    const bool present = fs::exists(p, ec);
    if (ec || !present) {
      problems.push_back("[checkpoint] " + p +
                         (ec ? " cannot be read: " + ec.message() : std::string(" is missing")));
      continue;
    }
    const int64_t bytes = static_cast<int64_t>(fs::file_size(p, ec));
    if (ec) {
      problems.push_back("[checkpoint] " + p + " cannot be read: " + ec.message());
      continue;
    }
    const int64_t want_bytes = entry.at("bytes").as_int();
    if (bytes != want_bytes) {
      problems.push_back("[checkpoint] " + p + " has " + std::to_string(bytes) +
                         " bytes, the manifest says " + std::to_string(want_bytes) +
                         " (truncated or replaced)");
      continue;
    }
    const int64_t crc = crc32c_file(p);
    const int64_t want_crc = entry.at("crc32c").as_int();
    if (crc != want_crc) {
      problems.push_back("[checkpoint] " + p + " is corrupt: CRC-32C " + std::to_string(crc) +
                         " differs from the manifest's " + std::to_string(want_crc) +
                         (is_safetensors(f) ? damaged_tensors(p, entry) : std::string()));
    }
  }
  return problems;
}

void verify_checkpoint(const std::string& dir) {
  const std::vector<std::string> problems = checkpoint_problems(dir);
  MAMMOTH_CHECK(problems.empty()) << problems.front();
}

}  // namespace mammoth::engine::train

namespace mammoth::engine::train {
namespace {

std::string pointer_path(const std::string& save_dir, int64_t step) {
  return save_dir + "/." + step_name(step) + ".saving";
}

// Every single-process tensor's pieces, from a checkpoint of either form.
struct PieceSource {
  const io::TensorView* view;
  int64_t offset;
};
struct PieceTable {
  std::vector<io::SafetensorsFile> files;
  std::map<std::string, std::vector<PieceSource>> pieces;
  std::map<std::string, std::pair<DType, std::vector<int64_t>>> tensors;  // dtype, full shape
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Checks that the pieces of every tensor cover it exactly once; throws naming the first gap or
// overlap and the checkpoint.
void check_coverage(const PieceTable& t, const std::string& what) {
  for (const auto& [name, src] : t.pieces) {
    MAMMOTH_CHECK(t.tensors.count(name))
        << "[checkpoint] " << what << " holds pieces of '" << name << "', which the index lacks";
  }
  for (const auto& [name, info] : t.tensors) {
    auto it = t.pieces.find(name);
    MAMMOTH_CHECK(it != t.pieces.end())
        << "[checkpoint] " << what << ": no shard holds '" << name << "'";
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const PieceSource& p : it->second) {
      MAMMOTH_CHECK(p.view->dtype == info.first)
          << "[checkpoint] " << what << ": a piece of '" << name << "' is "
          << dtype_name(p.view->dtype) << ", the index says " << dtype_name(info.first);
      ranges.emplace_back(p.offset, p.offset + numel_of(p.view->shape));
    }
    std::sort(ranges.begin(), ranges.end());
    int64_t at = 0;
    for (const auto& [lo, hi] : ranges) {
      MAMMOTH_CHECK(lo == at) << "[checkpoint] " << what << ": the pieces of '" << name << "' "
                              << (lo < at ? "overlap" : "leave a gap") << " at element "
                              << std::min(lo, at);
      at = hi;
    }
    MAMMOTH_CHECK(at == numel_of(info.second))
        << "[checkpoint] " << what << ": the pieces of '" << name << "' cover " << at << " of "
        << numel_of(info.second) << " elements";
  }
}

void index_shards(PieceTable& t) {
  for (const io::SafetensorsFile& f : t.files) {
    for (const io::TensorView& v : f.tensors()) {
      auto [name, offset] = parse_piece_key(v.name, f.path());
      MAMMOTH_CHECK(v.shape.size() == 1)
          << "[checkpoint] " << f.path() << ": piece '" << v.name << "' is not 1-D";
      // Coverage adds the piece's size to its offset: that sum must not wrap.
      MAMMOTH_CHECK(offset <= std::numeric_limits<int64_t>::max() - v.shape[0])
          << "[checkpoint] " << f.path() << ": piece '" << v.name
          << "' ends past the largest element index";
      t.pieces[name].push_back({&v, offset});
    }
  }
}

PieceTable read_pieces(const std::string& dir) {
  PieceTable t;
  const std::string ipath = dir + "/index.json";
  if (fs::exists(ipath)) {
    const json::Value index = json::parse(read_file(ipath), ipath);
    for (const json::Value& e : index.at("tensors")) {
      std::vector<int64_t> shape;
      for (const json::Value& d : e.at("shape")) shape.push_back(d.as_int());
      const DType dtype = dtype_from_name(e.at("dtype").as_string());
      // Sizes are multiplied (coverage, allocation) later: refuse what would wrap int64 there.
      uint64_t bytes = 0;
      MAMMOTH_CHECK(io::tensor_bytes(shape, dtype, &bytes) &&
                    bytes <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          << "[checkpoint] " << ipath << ": tensor '" << e.key() << "' has shape "
          << shape_str(shape) << ", which has a negative size or more bytes than int64 holds";
      t.tensors[e.key()] = {dtype, shape};
    }
    t.files.reserve(index.at("shards").size());
    std::set<std::string> shard_files;
    for (const json::Value& f : index.at("shards")) {
      const std::string& name = f.as_string();
      // A shard is a file of this checkpoint, each read once (its pieces would count twice).
      MAMMOTH_CHECK(!name.empty() && name.find('/') == std::string::npos && name[0] != '.')
          << "[checkpoint] " << ipath << " lists a shard outside the checkpoint: '" << name << "'";
      MAMMOTH_CHECK(shard_files.insert(name).second)
          << "[checkpoint] " << ipath << " lists the shard '" << name << "' twice";
      t.files.push_back(io::SafetensorsFile::open(dir + "/" + name));
    }
    index_shards(t);
    check_coverage(t, dir);
    return t;
  }
  // The single-process form: whole tensors, offset 0.
  t.files.reserve(2);
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    t.files.push_back(io::SafetensorsFile::open(dir + "/" + f));
  }
  for (const io::SafetensorsFile& f : t.files) {
    for (const io::TensorView& v : f.tensors()) {
      t.pieces[v.name].push_back({&v, 0});
      t.tensors[v.name] = {v.dtype, v.shape};
    }
  }
  return t;
}

}  // namespace

std::string begin_sharded_checkpoint(const std::string& save_dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  MAMMOTH_CHECK(!ec) << "[checkpoint] cannot create --save-dir " << save_dir << ": "
                     << ec.message();
  const std::string tmp_name = "." + step_name(step) + ".tmp." + std::to_string(::getpid());
  const std::string tmp_dir = save_dir + "/" + tmp_name;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  MAMMOTH_CHECK(!ec) << "[checkpoint] cannot create " << tmp_dir << ": " << ec.message();
  write_file_synced(pointer_path(save_dir, step), tmp_name + "\n");
  return tmp_dir;
}

std::string sharded_checkpoint_tmp(const std::string& save_dir, int64_t step) {
  std::string name = read_file(pointer_path(save_dir, step));
  while (!name.empty() && name.back() == '\n') name.pop_back();
  MAMMOTH_CHECK(name.rfind(".step_", 0) == 0 && name.find('/') == std::string::npos)
      << "[checkpoint] " << pointer_path(save_dir, step) << " is malformed: '" << name << "'";
  return save_dir + "/" + name;
}

void write_checkpoint_shard(const std::string& tmp_dir, int rank,
                            const std::vector<CheckpointPiece>& pieces) {
  nn::NamedTensors flat;
  for (const CheckpointPiece& p : pieces) {
    MAMMOTH_CHECK(p.data.defined() && p.data.is_contiguous() && p.offset >= 0)
        << "[checkpoint] piece of '" << p.name << "' at " << p.offset
        << " must be a defined contiguous tensor at a non-negative offset";
    flat.emplace_back(p.name + "@" + std::to_string(p.offset), p.data.reshape({-1}));
  }
  const std::string file = shard_name(rank);
  const std::string path = tmp_dir + "/" + file;
  io::save_tensors(path, flat, {{"format", "mammoth-checkpoint-shard"}});
  json::Value entry = json::Value::object();
  entry.set("bytes", json::Value(static_cast<int64_t>(fs::file_size(path))));
  entry.set("crc32c", json::Value(static_cast<int64_t>(crc32c_file(path))));
  entry.set("tensor_crc32c", tensor_crcs(path));
  write_file_synced(path + ".crc.json", json::dump(entry) + "\n");
}

std::string commit_sharded_checkpoint(const std::string& save_dir, int64_t step,
                                      const std::string& tmp_dir, const ShardedLayout& layout,
                                      const json::Value& state, int keep_last) {
  std::error_code ec;
  try {
    json::Value index = json::Value::object();
    index.set("format", json::Value("mammoth-sharded-checkpoint-1"));
    index.set("layout", layout.layout);
    json::Value tensors = json::Value::object();
    PieceTable table;
    for (const auto& [name, t] : layout.tensors) {
      json::Value e = json::Value::object();
      e.set("dtype", json::Value(dtype_name(t.dtype())));
      json::Value shape = json::Value::array();
      for (int64_t d : t.shape()) shape.push_back(json::Value(d));
      e.set("shape", shape);
      tensors.set(name, e);
      table.tensors[name] = {t.dtype(), t.shape()};
    }
    index.set("tensors", tensors);
    json::Value shards = json::Value::array();
    std::vector<std::string> files = {"index.json", "state.json"};
    std::map<std::string, json::Value> known;
    table.files.reserve(static_cast<size_t>(layout.world));
    for (int r = 0; r < layout.world; ++r) {
      const std::string f = shard_name(r);
      const std::string crc_path = tmp_dir + "/" + f + ".crc.json";
      MAMMOTH_CHECK(fs::exists(crc_path))
          << "[checkpoint] rank " << r << " did not write its shard " << f << " into " << tmp_dir;
      known[f] = json::parse(read_file(crc_path), crc_path);
      fs::remove(crc_path, ec);
      shards.push_back(json::Value(f));
      files.push_back(f);
      table.files.push_back(io::SafetensorsFile::open(tmp_dir + "/" + f));
    }
    index_shards(table);
    check_coverage(table, tmp_dir);  // a layout bug must not produce a checkpoint
    index.set("shards", shards);
    write_file_synced(tmp_dir + "/index.json", json::dump(index, 2) + "\n");
    write_file_synced(tmp_dir + "/state.json", json::dump(state, 2) + "\n");
    write_manifest(tmp_dir, step, files, known);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    fs::remove(pointer_path(save_dir, step), ec);
    throw;
  }
  fs::remove(pointer_path(save_dir, step), ec);
  return finish_checkpoint(save_dir, step_name(step), tmp_dir, keep_last);
}

json::Value load_checkpoint_pieces(const std::string& dir, const std::vector<CheckpointPiece>& into,
                                   bool whole) {
  verify_checkpoint(dir);
  const std::string spath = dir + "/state.json";
  json::Value state = json::parse(read_file(spath), spath);
  MAMMOTH_CHECK(state.is_object()) << "[checkpoint] " << spath << " is not a JSON object";
  const PieceTable table = read_pieces(dir);
  // Check every request before changing anything.
  for (const CheckpointPiece& p : into) {
    auto it = table.tensors.find(p.name);
    MAMMOTH_CHECK(it != table.tensors.end())
        << "[checkpoint] " << dir << " has no tensor '" << p.name << "'";
    const auto& [dtype, shape] = it->second;
    MAMMOTH_CHECK(p.data.defined() && p.data.is_contiguous() &&
                  p.data.device().type == DeviceType::kCPU)
        << "[checkpoint] the destination of '" << p.name << "' must be a contiguous CPU tensor";
    MAMMOTH_CHECK(p.data.dtype() == dtype)
        << "[checkpoint] '" << p.name << "' is " << dtype_name(dtype) << " in " << dir
        << ", the model's is " << dtype_name(p.data.dtype());
    const int64_t full = numel_of(shape), n = p.data.numel();
    MAMMOTH_CHECK(p.offset >= 0 && p.offset + n <= full)
        << "[checkpoint] '" << p.name << "' has " << full << " elements in " << dir << " (shape "
        << shape_str(shape) << "); elements [" << p.offset << ", " << p.offset + n
        << ") were asked for";
    // A whole tensor asked for in a shape must have the checkpoint's (1-D is a flat range).
    MAMMOTH_CHECK(n != full || p.data.dim() == 1 || p.data.shape() == shape)
        << "[checkpoint] '" << p.name << "' is " << shape_str(shape) << " in " << dir
        << ", the model's is " << shape_str(p.data.shape());
  }
  if (whole) {
    std::set<std::string> asked;
    for (const CheckpointPiece& p : into) asked.insert(p.name);
    for (const auto& [name, info] : table.tensors) {
      MAMMOTH_CHECK(asked.count(name))
          << "[checkpoint] " << dir << " holds '" << name << "', which the model does not have";
    }
  }
  for (const CheckpointPiece& p : into) {
    const int64_t lo = p.offset, hi = p.offset + p.data.numel();
    const size_t es = dtype_size(p.data.dtype());
    char* dst = static_cast<char*>(p.data.raw_data());
    for (const PieceSource& src : table.pieces.at(p.name)) {
      const int64_t s_lo = src.offset, s_hi = src.offset + numel_of(src.view->shape);
      const int64_t a = std::max(lo, s_lo), b = std::min(hi, s_hi);
      if (a >= b) continue;
      std::memcpy(dst + static_cast<size_t>(a - lo) * es,
                  src.view->data + static_cast<size_t>(a - s_lo) * es,
                  static_cast<size_t>(b - a) * es);
    }
  }
  return state;
}

CheckpointInfo inspect_checkpoint(const std::string& dir) {
  CheckpointInfo info;
  info.dir = dir;
  const std::string mpath = dir + "/manifest.json";
  MAMMOTH_CHECK(fs::exists(mpath))
      << "[checkpoint] " << mpath << " is missing: not a complete checkpoint";
  info.files = json::parse(read_file(mpath), mpath).at("files");
  const std::string spath = dir + "/state.json";
  info.state = json::parse(read_file(spath), spath);
  MAMMOTH_CHECK(info.state.is_object()) << "[checkpoint] " << spath << " is not a JSON object";
  info.step = info.state.at("step").as_int();
  info.layout = json::Value::object();
  const std::string ipath = dir + "/index.json";
  info.sharded = fs::exists(ipath);
  if (info.sharded) {
    const json::Value index = json::parse(read_file(ipath), ipath);
    info.format = index.at("format").as_string();
    if (const json::Value* l = index.find("layout")) info.layout = *l;
  } else {
    info.format = "mammoth-checkpoint (single file)";
  }
  const PieceTable table = read_pieces(dir);
  std::map<const uint8_t*, std::string> file_of;  // a piece's file, by where its bytes lie
  for (const io::SafetensorsFile& f : table.files) {
    for (const io::TensorView& v : f.tensors()) {
      file_of[v.data] = fs::path(f.path()).filename().string();
    }
  }
  for (const auto& [name, dtype_shape] : table.tensors) {
    CheckpointTensorInfo t;
    t.name = name;
    t.dtype = dtype_shape.first;
    t.shape = dtype_shape.second;
    t.bytes = numel_of(t.shape) * static_cast<int64_t>(dtype_size(t.dtype));
    std::set<std::string> files;
    for (const PieceSource& src : table.pieces.at(name)) {
      ++t.pieces;
      files.insert(file_of[src.view->data]);
    }
    t.files.assign(files.begin(), files.end());
    info.tensors.push_back(std::move(t));
  }
  return info;
}

nn::NamedTensors load_whole_checkpoint(const std::string& dir, json::Value* state) {
  const CheckpointInfo info = inspect_checkpoint(dir);
  nn::NamedTensors whole;
  std::vector<CheckpointPiece> into;
  for (const CheckpointTensorInfo& t : info.tensors) {
    whole.emplace_back(t.name, Tensor::empty(t.shape, t.dtype));
    into.push_back({t.name, 0, whole.back().second});
  }
  const json::Value s = load_checkpoint_pieces(dir, into, /*whole=*/true);
  if (state != nullptr) *state = s;
  return whole;
}

bool is_optimizer_state(const std::string& name, const std::set<std::string>& names) {
  // Parameters are leaves of the module tree, so no parameter's name is another tensor's name
  // plus ".<suffix>"; optimizer state is exactly "<param>.<suffix>".
  const size_t dot = name.rfind('.');
  return dot != std::string::npos && names.count(name.substr(0, dot)) > 0;
}

SaveDirLock::SaveDirLock(const std::string& save_dir) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  MAMMOTH_CHECK(!ec) << "[train] cannot create --save-dir " << save_dir << ": " << ec.message();
  const std::string path = save_dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  MAMMOTH_CHECK(fd_ >= 0) << "[train] cannot open " << path << ": " << std::strerror(errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[512] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    MAMMOTH_CHECK(err != EWOULDBLOCK)
        << "[train] --save-dir " << save_dir << " is in use by another job ("
        << (who.empty() ? "holder unknown" : who)
        << "): two jobs writing one checkpoint directory would overwrite each other's steps. "
           "Wait for it to end, or give this job another --save-dir";
    MAMMOTH_THROW() << "[train] cannot lock " << path << ": " << std::strerror(err);
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char when[64] = {};
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when;
  // Best effort: the lock itself is the flock; the text only names the holder.
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    std::fprintf(stderr, "[train] warning: cannot write %s: %s\n", path.c_str(),
                 std::strerror(errno));
  }
}

SaveDirLock::~SaveDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace mammoth::engine::train
