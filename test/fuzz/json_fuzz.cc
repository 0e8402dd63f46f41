// libFuzzer target: the JSON parser (configs, tokenizer files, checkpoint index.json /
// manifest.json / state.json, safetensors headers). Whatever parses must survive a dump and
// re-parse unchanged (compact and indented), and the typed accessors may only throw Error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"
#include "base/json.h"
#include "test/fuzz/fuzz_util.h"

namespace json = mammoth::json;

namespace {

// Calls the accessors of each value's type (and as_int on every number, which may refuse a
// fraction with Error); one wrong-type call per value checks that refusals are Errors too.
void walk(const json::Value& v) {
  try {
    switch (v.type()) {
      case json::Type::kNull:
        (void)v.as_bool();
        mammoth::fuzz::invariant_failed("json: null read as bool");
      case json::Type::kBool:
        (void)v.as_bool();
        break;
      case json::Type::kNumber:
        (void)v.as_double();
        (void)v.as_int();
        break;
      case json::Type::kString:
        (void)v.as_string();
        (void)v.size();
        mammoth::fuzz::invariant_failed("json: string has a size");
      case json::Type::kArray:
      case json::Type::kObject:
        if (!v.empty()) (void)v[v.size() - 1];
        (void)v.as_string();
        mammoth::fuzz::invariant_failed("json: container read as string");
    }
  } catch (const mammoth::Error&) {
  }
  if (v.is_array() || v.is_object()) {
    for (const json::Value& item : v) {
      if (v.is_object() && v.find(item.key()) != &item) {
        mammoth::fuzz::invariant_failed("json: find(key) does not return the member");
      }
      walk(item);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);  // exact-size heap copy
  json::Value v;
  try {
    v = json::parse(std::string_view(text), "fuzz.json");
  } catch (const mammoth::Error&) {
    return 0;
  }
  walk(v);
  std::string compact, pretty;
  try {
    compact = json::dump(v);
    pretty = json::dump(v, 2);
  } catch (const mammoth::Error&) {
    mammoth::fuzz::invariant_failed("json: a parsed value cannot be dumped");
  }
  try {
    if (json::dump(json::parse(compact, "compact")) != compact ||
        json::dump(json::parse(pretty, "pretty")) != compact) {
      mammoth::fuzz::invariant_failed("json: dump -> parse -> dump changed the value");
    }
  } catch (const mammoth::Error&) {
    mammoth::fuzz::invariant_failed("json: the dump of a parsed value does not parse");
  }
  json::Value copy = v;  // the copy constructor rebuilds the key index of large objects
  if (json::dump(copy) != compact) mammoth::fuzz::invariant_failed("json: copy differs");
  return 0;
}
