// JSON values, a strict parser and a writer, for configs, tokenizer files, checkpoint indexes,
// safetensors headers and metrics lines.
//
// Reading:
//   json::Value cfg = json::parse(text, "config.json");
//   int64_t n_layer = cfg.at("n_layer").as_int();      // Error names "n_layer" if missing or
//   if (const json::Value* v = cfg.find("dropout")) ... // not an integer
//   for (const json::Value& member : cfg) use(member.key(), member);
//
// Writing:
//   json::Value v = json::Value::object();
//   v.set("step", 10).set("loss", 2.5).set("shape", json::Value::array().push_back(3));
//   std::string line = json::dump(v);  // {"step":10,"loss":2.5,"shape":[3]}
//
// The parser accepts exactly RFC 8259 JSON in UTF-8: no comments, no trailing commas, no NaN,
// no lone surrogates, no invalid UTF-8. Duplicate object keys are rejected rather than silently
// resolved, because a config or safetensors header with two values for one name is ambiguous.
// Nesting deeper than kMaxDepth is rejected so hostile input cannot overflow the stack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace mammoth::json {

enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

// "null", "bool", "number", "string", "array", "object".
const char* type_name(Type t);

inline constexpr int kMaxDepth = 512;

class Value {
 public:
  Value() = default;
  Value(std::nullptr_t) {}  // NOLINT: implicit so that set("x", nullptr) reads naturally
  Value(bool b) : type_(Type::kBool), bool_(b) {}        // NOLINT
  Value(double d) : type_(Type::kNumber), double_(d) {}  // NOLINT
  Value(float f) : Value(static_cast<double>(f)) {}      // NOLINT
  // Any integer type except bool. Unsigned values above INT64_MAX are kept as doubles.
  template <typename T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) Value(T i)
      : type_(Type::kNumber) {  // NOLINT
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(int64_t)) {
      if (i > static_cast<T>(INT64_MAX)) {
        double_ = static_cast<double>(i);
        return;
      }
    }
    is_int_ = true;
    int_ = static_cast<int64_t>(i);
    double_ = static_cast<double>(i);
  }
  Value(std::string s) : type_(Type::kString), string_(std::move(s)) {}  // NOLINT
  Value(std::string_view s) : Value(std::string(s)) {}                   // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                        // NOLINT

  static Value array();
  static Value object();

  Value(const Value& other);
  Value& operator=(const Value& other);
  Value(Value&&) noexcept = default;
  Value& operator=(Value&&) noexcept = default;
  ~Value() = default;

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  // A number written without fraction or exponent that fits in int64 (or built from an integer).
  bool is_int() const { return type_ == Type::kNumber && is_int_; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Typed accessors; a wrong type throws Error naming this value's key, the expected and the
  // actual type.
  bool as_bool() const;
  // Exact for integers; also accepts a double with an integral value in int64 range (1e3).
  int64_t as_int() const;
  double as_double() const;
  const std::string& as_string() const;

  // Objects: the member named `key`; throws when missing (naming the key and the keys present).
  const Value& at(std::string_view key) const;
  Value& at(std::string_view key);
  // Objects: the member named `key`, or nullptr. Throws when this is not an object.
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  bool contains(std::string_view key) const { return find(key) != nullptr; }

  // Arrays and objects: the number of elements / members, and the i-th one (objects keep
  // insertion order). Out of range throws.
  size_t size() const;
  bool empty() const { return size() == 0; }
  const Value& operator[](size_t i) const;
  Value& operator[](size_t i);
  const Value* begin() const;
  const Value* end() const;

  // The member name of this value in the object it was parsed into or set() on; empty for
  // array elements and top-level values. Used by iteration and by error messages.
  const std::string& key() const { return key_; }

  // Builders. set() adds a member or replaces the existing one with that key, keeping its
  // position; push_back() appends to an array. Both return *this for chaining.
  Value& set(std::string key, Value value);
  Value& push_back(Value value);

 private:
  friend class Parser;
  [[noreturn]] void type_error(const char* expected) const;
  void require(Type t, const char* what) const;
  void build_index();

  Type type_ = Type::kNull;
  bool bool_ = false;
  bool is_int_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::string key_;
  std::vector<Value> items_;  // array elements or object members (each member carries key_)
  // Key -> position in items_, built only for large objects; small ones are searched linearly.
  std::unique_ptr<std::unordered_map<std::string, size_t>> index_;
};

// Parses one JSON document (surrounding whitespace allowed). Errors read
// "[json] <what>:<line>:<column>: <problem>".
Value parse(std::string_view text, std::string_view what = "json");
// Reads and parses a file; errors name the path.
Value parse_file(const std::string& path);

// Serialises `v`. indent < 0: compact, one line. indent >= 0: one element per line, nested
// levels indented by `indent` spaces. Doubles are written with the fewest digits that read back
// to the same value (and keep a ".0" so they stay doubles); NaN and infinity throw.
std::string dump(const Value& v, int indent = -1);

}  // namespace mammoth::json
