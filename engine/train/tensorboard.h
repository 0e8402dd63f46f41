// TensorBoard event files written without TensorFlow: `mammoth train --tensorboard DIR`.
//
// A file DIR/events.out.tfevents.<seconds>.<host>.<pid> holds TFRecord records, each
//   uint64 length | uint32 masked CRC-32C of the length bytes | data | uint32 masked CRC-32C of
//   data
// (little-endian; mask = ((crc >> 15) | (crc << 17)) + 0xa282ead8). Every record's data is a
// tensorflow.Event protobuf, encoded here by hand in the protobuf wire format:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2", which TensorBoard expects; the others
// carry scalars. `tensorboard --logdir DIR` then shows them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace mammoth::engine::train {

// Encodes one Event record's protobuf bytes (exposed for tests).
std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<std::pair<std::string, float>>& scalars);
std::string encode_file_version_event(double wall_time, const std::string& version);
// Frames `data` as one TFRecord.
std::string frame_tfrecord(const std::string& data);

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it (a new file per run, as TensorBoard's
  // writers do, so a resumed run appends a file rather than rewriting one).
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Writes one event holding these scalars at `step`, stamped with the current time.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  void add_scalar(int64_t step, const std::string& tag, float value) {
    add_scalars(step, {{tag, value}});
  }
  // Pushes written records to the OS so a running TensorBoard sees them.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mammoth::engine::train
