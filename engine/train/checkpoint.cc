#include "engine/train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
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

}  // namespace

std::string save_checkpoint(const std::string& save_dir, int64_t step, const CheckpointContents& c,
                            int keep_last) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  MAMMOTH_CHECK(!ec) << "[checkpoint] cannot create --save-dir " << save_dir << ": "
                     << ec.message();
  const std::string name = step_name(step);
  const std::string final_dir = save_dir + "/" + name;
  const std::string tmp_dir = save_dir + "/." + name + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  MAMMOTH_CHECK(!ec) << "[checkpoint] cannot create " << tmp_dir << ": " << ec.message();
  try {
    io::save_tensors(tmp_dir + "/model.safetensors", *c.model, {{"format", "pt"}});
    io::save_tensors(tmp_dir + "/optimizer.safetensors", *c.optimizer);
    write_file_synced(tmp_dir + "/state.json", json::dump(c.state, 2) + "\n");
    json::Value manifest = json::Value::object();
    manifest.set("step", json::Value(step));
    json::Value files = json::Value::object();
    for (const char* f : kFiles) {
      const std::string p = tmp_dir + "/" + f;
      json::Value entry = json::Value::object();
      entry.set("bytes", json::Value(static_cast<int64_t>(fs::file_size(p))));
      entry.set("crc32c", json::Value(static_cast<int64_t>(crc32c_file(p))));
      files.set(f, entry);
    }
    manifest.set("files", files);
    write_file_synced(tmp_dir + "/manifest.json", json::dump(manifest, 2) + "\n");
    fsync_path(tmp_dir, true);
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
  // A run killed mid-write leaves its ".step_N.tmp.PID" behind; remove those whose process is
  // gone (a live PID may be another writer sharing the directory).
  for (const auto& entry : fs::directory_iterator(save_dir, ec)) {
    const std::string n = entry.path().filename().string();
    const size_t at = n.rfind(".tmp.");
    if (n.rfind(".step_", 0) != 0 || at == std::string::npos) continue;
    const long pid = std::strtol(n.c_str() + at + 5, nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      fs::remove_all(entry.path(), ec);
    }
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

void verify_checkpoint(const std::string& dir) {
  const std::string mpath = dir + "/manifest.json";
  MAMMOTH_CHECK(fs::exists(mpath))
      << "[checkpoint] " << mpath << " is missing: not a complete checkpoint";
  const json::Value manifest = json::parse(read_file(mpath), mpath);
  const json::Value& files = manifest.at("files");
  for (const char* f : kFiles) {
    const std::string p = dir + "/" + f;
    const json::Value* entry = files.find(f);
    MAMMOTH_CHECK(entry != nullptr) << "[checkpoint] " << mpath << " does not list " << f;
    MAMMOTH_CHECK(fs::exists(p)) << "[checkpoint] " << p << " is missing";
    const int64_t bytes = static_cast<int64_t>(fs::file_size(p));
    MAMMOTH_CHECK(bytes == entry->at("bytes").as_int())
        << "[checkpoint] " << p << " has " << bytes << " bytes, the manifest says "
        << entry->at("bytes").as_int() << " (truncated or replaced)";
    const int64_t crc = crc32c_file(p);
    MAMMOTH_CHECK(crc == entry->at("crc32c").as_int())
        << "[checkpoint] " << p << " is corrupt: CRC-32C " << crc << " differs from the manifest's "
        << entry->at("crc32c").as_int();
  }
}

json::Value load_checkpoint(const std::string& dir, const nn::NamedTensors& model,
                            const nn::NamedTensors& optimizer) {
  verify_checkpoint(dir);
  const std::string spath = dir + "/state.json";
  json::Value state = json::parse(read_file(spath), spath);
  MAMMOTH_CHECK(state.is_object()) << "[checkpoint] " << spath << " is not a JSON object";
  io::load_tensors(model, io::SafetensorsFile::open(dir + "/model.safetensors"));
  io::load_tensors(optimizer, io::SafetensorsFile::open(dir + "/optimizer.safetensors"));
  return state;
}

}  // namespace mammoth::engine::train
