// libFuzzer target: the safetensors reader (header length, JSON header, tensor table, data
// tiling) over an in-memory image. Every tensor view it returns must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "engine/io/safetensors.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so ASan flags any read past the end.
  std::vector<uint8_t> bytes(data, data + size);
  const uint8_t* base = bytes.data();
  try {
    auto f = mammoth::io::SafetensorsFile::from_memory(base, size, "fuzz.safetensors");
    if (f.data_offset() > size || f.names().size() != f.tensors().size()) {
      mammoth::fuzz::invariant_failed("safetensors: data offset or name table");
    }
    size_t covered = 0;
    for (const auto& t : f.tensors()) {
      if (t.nbytes > 0 && (t.data < base + f.data_offset() || t.data + t.nbytes > base + size)) {
        mammoth::fuzz::invariant_failed("safetensors: tensor view outside the file");
      }
      mammoth::fuzz::touch(t.data, t.nbytes);
      covered += t.nbytes;
      if (f.find(t.name) == nullptr) mammoth::fuzz::invariant_failed("safetensors: find(name)");
    }
    if (covered != size - f.data_offset()) {
      mammoth::fuzz::invariant_failed("safetensors: tensors do not tile the data section");
    }
  } catch (const mammoth::Error&) {
  }
  return 0;
}
