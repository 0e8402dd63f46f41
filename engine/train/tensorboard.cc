#include "engine/train/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "base/crc32c.h"
#include "base/error.h"

namespace mammoth::engine::train {
namespace {

// Protobuf wire types.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}

template <typename T>
void put_le(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86 and ARM Linux are little-endian, like the format
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event fields 1 (wall_time) and 2 (step).
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, kFixed64);
  put_le(e, wall_time);
  if (step != 0) {  // proto3 omits defaults
    put_tag(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));  // int64: two's complement as varint
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_tag(v, 2, kFixed32);
    put_le(v, value);
    put_bytes(summary, 1, v);
  }
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string encode_file_version_event(double wall_time, const std::string& version) {
  std::string e = event_header(wall_time, 0);
  put_bytes(e, 3, version);
  return e;
}

std::string frame_tfrecord(const std::string& data) {
  std::string r;
  std::string len;
  put_le(len, static_cast<uint64_t>(data.size()));
  r += len;
  put_le(r, crc32c_masked(crc32c(len.data(), len.size())));
  r += data;
  put_le(r, crc32c_masked(crc32c(data.data(), data.size())));
  return r;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MAMMOTH_CHECK(!ec) << "[tensorboard] cannot create --tensorboard directory " << dir << ": "
                     << ec.message();
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  host[sizeof(host) - 1] = 0;
  // TensorBoard finds event files by the "tfevents" in their name and orders them by it.
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
          "." + host + "." + std::to_string(::getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  MAMMOTH_CHECK(file_ != nullptr) << "[tensorboard] cannot create " << path_ << ": "
                                  << std::strerror(errno);
  write_record(encode_file_version_event(now_seconds(), "brain.Event:2"));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, float>>& scalars) {
  write_record(encode_scalar_event(now_seconds(), step, scalars));
}

void TensorBoardWriter::write_record(const std::string& data) {
  const std::string r = frame_tfrecord(data);
  MAMMOTH_CHECK(std::fwrite(r.data(), 1, r.size(), file_) == r.size())
      << "[tensorboard] writing " << path_ << " failed (disk full?): " << std::strerror(errno);
}

void TensorBoardWriter::flush() {
  MAMMOTH_CHECK(std::fflush(file_) == 0)
      << "[tensorboard] writing " << path_ << " failed: " << std::strerror(errno);
}

}  // namespace mammoth::engine::train
