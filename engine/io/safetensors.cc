#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>
#include <utility>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::io {

bool tensor_bytes(const std::vector<int64_t>& shape, DType dtype, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  return !__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(dtype)), out);
}

namespace {

constexpr char kMetadataKey[] = "__metadata__";

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << ']';
  return s.str();
}

std::string supported_dtypes() {
  std::string s;
  for (DType t : kAllDTypes) s += std::string(s.empty() ? "" : ", ") + dtype_safetensors_name(t);
  return s;
}

// A non-negative integer from the header, with errors naming the file, tensor and field.
uint64_t header_uint(const json::Value& v, const std::string& file, const std::string& tensor,
                     const char* field) {
  MAMMOTH_CHECK(v.is_int() && v.as_int() >= 0)
      << "[safetensors] " << file << ": tensor \"" << tensor << "\": " << field
      << " must hold non-negative integers, got " << json::dump(v);
  return static_cast<uint64_t>(v.as_int());
}

struct Entry {
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MAMMOTH_CHECK(fd >= 0) << "[safetensors] cannot open " << path << ": " << std::strerror(errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    MAMMOTH_THROW() << "[safetensors] cannot stat " << path << ": " << std::strerror(err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    MAMMOTH_THROW() << "[safetensors] " << path << " is not a regular file";
  }
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {  // mmap rejects length 0; parse() reports the short file below
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping stays valid without the descriptor
    MAMMOTH_CHECK(p != MAP_FAILED) << "[safetensors] cannot mmap " << path << " (" << f.size_
                                   << " bytes): " << std::strerror(err);
    f.bytes_ = static_cast<const uint8_t*>(p);
    f.mapped_ = true;
  } else {
    ::close(fd);
  }
  f.parse();  // on error f's destructor unmaps
  return f;
}

SafetensorsFile SafetensorsFile::from_memory(const uint8_t* bytes, size_t size,
                                             const std::string& what) {
  SafetensorsFile f;
  f.path_ = what;
  f.bytes_ = bytes;
  f.size_ = size;
  f.parse();
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    bytes_ = std::exchange(other.bytes_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, false);
    data_offset_ = std::exchange(other.data_offset_, 0);
    tensors_ = std::move(other.tensors_);
    names_ = std::move(other.names_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
    other.tensors_.clear();
    other.names_.clear();
    other.index_.clear();
    other.metadata_.clear();
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() {
  if (mapped_ && bytes_ != nullptr) ::munmap(const_cast<uint8_t*>(bytes_), size_);
  bytes_ = nullptr;
  mapped_ = false;
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
  const TensorView* t = find(name);
  MAMMOTH_CHECK(t != nullptr) << "[safetensors] " << path_ << ": no tensor named \"" << name
                              << "\" (the file has " << tensors_.size() << " tensors)";
  return *t;
}

void SafetensorsFile::parse() {
  const std::string& file = path_;
  MAMMOTH_CHECK(size_ >= 8) << "[safetensors] " << file << ": " << size_
                            << " bytes is too short for the 8-byte header length";
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes_[i];
  MAMMOTH_CHECK(n <= kMaxHeaderBytes) << "[safetensors] " << file << ": header length " << n
                                      << " exceeds the " << kMaxHeaderBytes << "-byte limit";
  MAMMOTH_CHECK(n <= size_ - 8) << "[safetensors] " << file << ": header length " << n
                                << " runs past the end of the " << size_ << "-byte file";
  const std::string_view header_text(reinterpret_cast<const char*>(bytes_ + 8),
                                     static_cast<size_t>(n));
  const json::Value header = json::parse(header_text, file + " (header)");
  MAMMOTH_CHECK(header.is_object())
      << "[safetensors] " << file << ": the header must be a JSON object, got "
      << json::type_name(header.type());

  data_offset_ = 8 + static_cast<size_t>(n);
  const uint8_t* data = bytes_ + data_offset_;
  const uint64_t data_size = size_ - data_offset_;

  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const json::Value& member : header) {
    const std::string& name = member.key();
    if (name == kMetadataKey) {
      if (member.is_null()) continue;  // the reference accepts an explicit null
      MAMMOTH_CHECK(member.is_object())
          << "[safetensors] " << file << ": " << kMetadataKey
          << " must be an object of strings, got " << json::type_name(member.type());
      for (const json::Value& item : member) {
        MAMMOTH_CHECK(item.is_string())
            << "[safetensors] " << file << ": " << kMetadataKey << " value \"" << item.key()
            << "\" must be a string, got " << json::dump(item);
        metadata_[item.key()] = item.as_string();
      }
      continue;
    }
    const std::string where = "[safetensors] " + file + ": tensor \"" + name + "\": ";
    MAMMOTH_CHECK(member.is_object()) << where << "expected an object, got " << json::dump(member);
    const json::Value* dtype = member.find("dtype");
    const json::Value* shape = member.find("shape");
    const json::Value* offsets = member.find("data_offsets");
    MAMMOTH_CHECK(dtype && shape && offsets)
        << where << "needs \"dtype\", \"shape\" and \"data_offsets\", got " << json::dump(member);
    Entry e;
    e.view.name = name;
    MAMMOTH_CHECK(dtype->is_string())
        << where << "dtype must be a string, got " << json::dump(*dtype);
    MAMMOTH_CHECK(dtype_from_safetensors_name(dtype->as_string(), &e.view.dtype))
        << where << "dtype " << dtype->as_string()
        << " is not supported (supported: " << supported_dtypes() << ")";
    MAMMOTH_CHECK(shape->is_array())
        << where << "shape must be an array, got " << json::dump(*shape);
    for (const json::Value& d : *shape) {
      e.view.shape.push_back(static_cast<int64_t>(header_uint(d, file, name, "shape")));
    }
    MAMMOTH_CHECK(offsets->is_array() && offsets->size() == 2)
        << where << "data_offsets must be [begin, end], got " << json::dump(*offsets);
    e.begin = header_uint((*offsets)[0], file, name, "data_offsets");
    e.end = header_uint((*offsets)[1], file, name, "data_offsets");
    uint64_t nbytes = 0;
    MAMMOTH_CHECK(tensor_bytes(e.view.shape, e.view.dtype, &nbytes))
        << where << "shape " << shape_string(e.view.shape) << " overflows the byte count";
    MAMMOTH_CHECK(e.end >= e.begin)
        << where << "data_offsets [" << e.begin << ", " << e.end << "] end before they begin";
    MAMMOTH_CHECK(e.end - e.begin == nbytes)
        << where << "shape " << shape_string(e.view.shape) << " of " << dtype->as_string()
        << " needs " << nbytes << " bytes but data_offsets [" << e.begin << ", " << e.end
        << "] hold " << e.end - e.begin;
    MAMMOTH_CHECK(e.end <= data_size) << where << "data_offsets [" << e.begin << ", " << e.end
                                      << "] run past the " << data_size << "-byte data section";
    e.view.data = data + e.begin;
    e.view.nbytes = static_cast<size_t>(nbytes);
    entries.push_back(std::move(e));
  }

  // File order is offset order; stable so zero-size tensors keep their header order.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Entry& e : entries) {
    MAMMOTH_CHECK(e.begin >= covered)
        << "[safetensors] " << file << ": tensor \"" << e.view.name << "\" at [" << e.begin << ", "
        << e.end << "] overlaps tensor \"" << *previous << "\" which ends at " << covered;
    MAMMOTH_CHECK(e.begin == covered)
        << "[safetensors] " << file << ": " << e.begin - covered << " unused bytes before tensor \""
        << e.view.name << "\" at offset " << e.begin
        << " (tensors must cover the data section without gaps)";
    covered = e.end;
    previous = &e.view.name;
  }
  MAMMOTH_CHECK(covered == data_size) << "[safetensors] " << file << ": the tensors cover "
                                      << covered << " bytes but the data section has " << data_size
                                      << " (" << data_size - covered << " trailing bytes)";

  tensors_.reserve(entries.size());
  names_.reserve(entries.size());
  for (Entry& e : entries) {
    names_.push_back(e.view.name);
    index_.emplace(e.view.name, tensors_.size());
    tensors_.push_back(std::move(e.view));
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// Writes all of [p, p + n), retrying short writes and EINTR.
void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    // Linux writes at most ~2 GiB per call anyway; smaller chunks keep the retry simple.
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      MAMMOTH_THROW() << "[safetensors] writing " << path << " failed: " << std::strerror(errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Closes and removes the temporary file unless release() was called.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  void close_fd() {
    const int fd = fd_;
    fd_ = -1;
    MAMMOTH_CHECK(::close(fd) == 0)
        << "[safetensors] closing " << path_ << " failed: " << std::strerror(errno);
  }
  void committed() { committed_ = true; }

 private:
  std::string path_;
  int fd_;
  bool committed_ = false;
};

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // The header, in the reference writer's layout: metadata first, then tensors in data order.
  json::Value header = json::Value::object();
  if (!metadata.empty()) {
    json::Value meta = json::Value::object();
    for (const auto& [key, value] : metadata) meta.set(key, value);
    header.set(kMetadataKey, std::move(meta));
  }
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    const std::string where = "[safetensors] writing " + path + ": tensor \"" + t.name + "\": ";
    MAMMOTH_CHECK(t.name != kMetadataKey) << where << "the name is reserved for metadata";
    MAMMOTH_CHECK(seen.insert(t.name).second) << where << "duplicate name";
    uint64_t nbytes = 0;
    MAMMOTH_CHECK(tensor_bytes(t.shape, t.dtype, &nbytes))
        << where << "invalid shape " << shape_string(t.shape);
    MAMMOTH_CHECK(nbytes == t.nbytes)
        << where << "shape " << shape_string(t.shape) << " of " << t.dtype << " needs " << nbytes
        << " bytes, got " << t.nbytes;
    MAMMOTH_CHECK(t.data != nullptr || t.nbytes == 0) << where << "null data";
    json::Value shape = json::Value::array();
    for (int64_t d : t.shape) shape.push_back(d);
    json::Value info = json::Value::object();
    info.set("dtype", dtype_safetensors_name(t.dtype));
    info.set("shape", std::move(shape));
    info.set("data_offsets", json::Value::array().push_back(offset).push_back(offset + nbytes));
    header.set(t.name, std::move(info));
    offset += nbytes;
  }
  std::string header_text = json::dump(header);
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  MAMMOTH_CHECK(header_text.size() <= kMaxHeaderBytes)
      << "[safetensors] writing " << path << ": header of " << header_text.size()
      << " bytes exceeds the " << kMaxHeaderBytes << "-byte limit readers accept";

  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(header_text.size() >> (8 * i));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MAMMOTH_CHECK(fd >= 0) << "[safetensors] cannot create " << tmp << ": " << std::strerror(errno);
  TempFile file(tmp, fd);
  write_all(fd, length, sizeof(length), tmp);
  write_all(fd, reinterpret_cast<const uint8_t*>(header_text.data()), header_text.size(), tmp);
  for (const TensorView& t : tensors) write_all(fd, t.data, t.nbytes, tmp);
  MAMMOTH_CHECK(::fsync(fd) == 0) << "[safetensors] fsync " << tmp
                                  << " failed: " << std::strerror(errno);
  file.close_fd();
  MAMMOTH_CHECK(::rename(tmp.c_str(), path.c_str()) == 0)
      << "[safetensors] renaming " << tmp << " to " << path << " failed: " << std::strerror(errno);
  file.committed();
  // Persist the rename itself; failure here is not fatal (the data is already durable).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace mammoth::io
