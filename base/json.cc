#include "base/json.h"

#include <locale.h>  // newlocale, strtod_l (POSIX)

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace mammoth::json {

namespace {

// Objects up to this size are searched linearly: cheaper than a hash map per small object.
constexpr size_t kIndexThreshold = 8;

// A short, single-line rendering of a value for error messages; containers are summarised
// rather than serialised, so a type error on a large document stays cheap.
std::string preview(const Value& v) {
  if (v.is_array()) return "(array of " + std::to_string(v.size()) + " elements)";
  if (v.is_object()) return "(object with " + std::to_string(v.size()) + " members)";
  std::string s = dump(v);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

}  // namespace

const char* type_name(Type t) {
  switch (t) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "bool";
    case Type::kNumber:
      return "number";
    case Type::kString:
      return "string";
    case Type::kArray:
      return "array";
    case Type::kObject:
      return "object";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Value

Value Value::array() {
  Value v;
  v.type_ = Type::kArray;
  return v;
}

Value Value::object() {
  Value v;
  v.type_ = Type::kObject;
  return v;
}

Value::Value(const Value& other)
    : type_(other.type_),
      bool_(other.bool_),
      is_int_(other.is_int_),
      int_(other.int_),
      double_(other.double_),
      string_(other.string_),
      key_(other.key_),
      items_(other.items_) {
  if (other.index_)
    index_ = std::make_unique<std::unordered_map<std::string, size_t>>(*other.index_);
}

Value& Value::operator=(const Value& other) {
  if (this != &other) {
    Value copy(other);
    *this = std::move(copy);
  }
  return *this;
}

void Value::type_error(const char* expected) const {
  std::ostringstream where;
  if (!key_.empty()) where << " at \"" << key_ << "\"";
  MAMMOTH_THROW() << "[json] expected " << expected << where.str() << ", got " << type_name(type_)
                  << " " << preview(*this);
}

void Value::require(Type t, const char* what) const {
  if (type_ != t) type_error(what);
}

bool Value::as_bool() const {
  require(Type::kBool, "bool");
  return bool_;
}

int64_t Value::as_int() const {
  if (type_ != Type::kNumber) type_error("integer");
  if (is_int_) return int_;
  // 2^63 is exactly representable; anything >= it does not fit.
  if (double_ == std::trunc(double_) && double_ >= -9223372036854775808.0 &&
      double_ < 9223372036854775808.0) {
    return static_cast<int64_t>(double_);
  }
  type_error("integer");
}

double Value::as_double() const {
  require(Type::kNumber, "number");
  return double_;
}

const std::string& Value::as_string() const {
  require(Type::kString, "string");
  return string_;
}

const Value* Value::find(std::string_view key) const {
  require(Type::kObject, "object");
  if (index_) {
    auto it = index_->find(std::string(key));
    return it == index_->end() ? nullptr : &items_[it->second];
  }
  for (const Value& member : items_) {
    if (member.key_ == key) return &member;
  }
  return nullptr;
}

Value* Value::find(std::string_view key) {
  return const_cast<Value*>(static_cast<const Value*>(this)->find(key));
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) {
    std::ostringstream keys;
    size_t shown = 0;
    for (const Value& member : items_) {
      if (shown == 10) {
        keys << ", ...";
        break;
      }
      keys << (shown++ ? ", " : "") << '"' << member.key_ << '"';
    }
    std::string where = key_.empty() ? "" : " in \"" + key_ + "\"";
    MAMMOTH_THROW() << "[json] missing key \"" << key << "\"" << where
                    << " (keys present: " << (items_.empty() ? "none" : keys.str()) << ")";
  }
  return *v;
}

Value& Value::at(std::string_view key) {
  return const_cast<Value&>(static_cast<const Value*>(this)->at(key));
}

size_t Value::size() const {
  if (type_ != Type::kArray && type_ != Type::kObject) type_error("array or object");
  return items_.size();
}

const Value& Value::operator[](size_t i) const {
  if (type_ != Type::kArray && type_ != Type::kObject) type_error("array or object");
  MAMMOTH_CHECK(i < items_.size())
      << "[json] index " << i << " out of range for " << type_name(type_)
      << (key_.empty() ? "" : " \"" + key_ + "\"") << " of size " << items_.size();
  return items_[i];
}

Value& Value::operator[](size_t i) {
  return const_cast<Value&>(static_cast<const Value&>(*this)[i]);
}

const Value* Value::begin() const {
  if (type_ != Type::kArray && type_ != Type::kObject) type_error("array or object");
  return items_.data();
}

const Value* Value::end() const { return begin() + items_.size(); }

void Value::build_index() {
  index_ = std::make_unique<std::unordered_map<std::string, size_t>>();
  index_->reserve(items_.size() * 2);
  for (size_t i = 0; i < items_.size(); ++i) index_->emplace(items_[i].key_, i);
}

Value& Value::set(std::string key, Value value) {
  require(Type::kObject, "object");
  if (Value* existing = find(key)) {
    value.key_ = std::move(key);
    *existing = std::move(value);
    return *this;
  }
  value.key_ = std::move(key);
  items_.push_back(std::move(value));
  if (index_) {
    index_->emplace(items_.back().key_, items_.size() - 1);
  } else if (items_.size() > kIndexThreshold) {
    build_index();
  }
  return *this;
}

Value& Value::push_back(Value value) {
  require(Type::kArray, "array");
  value.key_.clear();
  items_.push_back(std::move(value));
  return *this;
}

// ---------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  Parser(std::string_view text, std::string_view what) : text_(text), what_(what) {}

  Value parse_document() {
    skip_whitespace();
    Value v = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view problem) const { fail_at(pos_, problem); }

  [[noreturn]] void fail_at(size_t pos, std::string_view problem) const {
    // Line and column are 1-based; the column counts bytes, like compilers do.
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    MAMMOTH_THROW() << "[json] " << what_ << ":" << line << ":" << column << ": " << problem;
  }

  std::string describe_current() const {
    if (pos_ >= text_.size()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    char buf[32];
    if (c >= 0x20 && c < 0x7f) {
      std::snprintf(buf, sizeof(buf), "'%c'", c);
    } else {
      std::snprintf(buf, sizeof(buf), "byte 0x%02x", c);
    }
    return buf;
  }

  void skip_whitespace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool consume_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Value parse_value(int depth) {
    if (pos_ >= text_.size()) fail("unexpected end of input, expected a value");
    switch (text_[pos_]) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return Value(parse_string());
      case 't':
        if (consume_literal("true")) return Value(true);
        break;
      case 'f':
        if (consume_literal("false")) return Value(false);
        break;
      case 'n':
        if (consume_literal("null")) return Value();
        break;
      default:
        if (text_[pos_] == '-' || (text_[pos_] >= '0' && text_[pos_] <= '9')) {
          return parse_number();
        }
    }
    fail("expected a value, got " + describe_current());
  }

  void check_depth(int depth) {
    if (depth > kMaxDepth) {
      fail("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    }
  }

  Value parse_object(int depth) {
    check_depth(depth);
    Value obj = Value::object();
    ++pos_;  // '{'
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return obj;
    }
    while (true) {
      skip_whitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        fail("expected a string key, got " + describe_current());
      }
      const size_t key_pos = pos_;
      std::string key = parse_string();
      if (obj.find(key) != nullptr) fail_at(key_pos, "duplicate key \"" + key + "\"");
      skip_whitespace();
      if (pos_ >= text_.size() || text_[pos_] != ':') {
        fail("expected ':' after key, got " + describe_current());
      }
      ++pos_;
      skip_whitespace();
      Value member = parse_value(depth);
      member.key_ = std::move(key);
      obj.items_.push_back(std::move(member));
      if (obj.index_) {
        obj.index_->emplace(obj.items_.back().key_, obj.items_.size() - 1);
      } else if (obj.items_.size() > kIndexThreshold) {
        obj.build_index();
      }
      skip_whitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return obj;
      }
      fail("expected ',' or '}' after object member, got " + describe_current());
    }
  }

  Value parse_array(int depth) {
    check_depth(depth);
    Value arr = Value::array();
    ++pos_;  // '['
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return arr;
    }
    while (true) {
      skip_whitespace();
      arr.items_.push_back(parse_value(depth));
      skip_whitespace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return arr;
      }
      fail("expected ',' or ']' after array element, got " + describe_current());
    }
  }

  Value parse_number() {
    const size_t start = pos_;
    auto digit = [&] { return pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; };
    if (text_[pos_] == '-') ++pos_;
    if (!digit()) fail("expected a digit in number");
    if (text_[pos_] == '0') {
      ++pos_;
      if (digit()) fail_at(start, "leading zeros are not allowed in numbers");
    } else {
      while (digit()) ++pos_;
    }
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (!digit()) fail("expected a digit after the decimal point");
      while (digit()) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digit()) fail("expected a digit in the exponent");
      while (digit()) ++pos_;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      int64_t i = 0;
      auto [ptr, ec] = std::from_chars(first, last, i);
      if (ec == std::errc() && ptr == last) return Value(i);
      // Too large for int64: fall through and keep it as a double.
    }
    double d = 0;
    auto [ptr, ec] = std::from_chars(first, last, d);
    if (ec == std::errc::result_out_of_range) {
      // from_chars reports underflow and overflow alike; strtod_l in the C locale tells them
      // apart (underflow gives 0 or a subnormal, overflow infinity).
      static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", nullptr);
      d = strtod_l(std::string(first, last).c_str(), nullptr, c_locale);
      if (std::isinf(d)) fail_at(start, "number out of range: " + std::string(first, last));
    } else if (ec != std::errc() || ptr != last) {
      fail_at(start, "invalid number " + std::string(first, last));
    }
    return Value(d);
  }

  unsigned parse_hex4() {
    if (text_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned code = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text_[pos_];
      code <<= 4;
      if (c >= '0' && c <= '9') {
        code |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        code |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        code |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail("invalid hex digit in \\u escape: " + describe_current());
      }
      ++pos_;
    }
    return code;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  // Copies one UTF-8 encoded character starting at pos_, rejecting overlong forms, surrogates
  // and code points above U+10FFFF.
  void copy_utf8_char(std::string& out) {
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++pos_;
      return;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      fail("invalid UTF-8 " + describe_current());
    }
    if (text_.size() - pos_ < len) fail("truncated UTF-8 sequence");
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(text_[pos_ + k]);
      if ((cc & 0xc0) != 0x80) fail("invalid UTF-8 sequence");
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      fail("invalid UTF-8 sequence");
    }
    out.append(text_.data() + pos_, len);
    pos_ += len;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        fail("control character " + describe_current() + " in string (must be escaped)");
      }
      if (c != '\\') {
        copy_utf8_char(out);
        continue;
      }
      const size_t escape_pos = pos_;
      ++pos_;
      if (pos_ >= text_.size()) fail("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) fail_at(escape_pos, "unpaired low surrogate");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (text_.substr(pos_, 2) != "\\u") fail_at(escape_pos, "unpaired high surrogate");
            pos_ += 2;
            const uint32_t low = parse_hex4();
            if (low < 0xdc00 || low > 0xdfff) fail_at(escape_pos, "unpaired high surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail("invalid escape \\" + describe_current());
      }
    }
  }

  std::string_view text_;
  std::string_view what_;
  size_t pos_ = 0;
};

Value parse(std::string_view text, std::string_view what) {
  return Parser(text, what).parse_document();
}

Value parse_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MAMMOTH_CHECK(in) << "[json] cannot open " << path << ": " << std::strerror(errno);
  std::ostringstream buf;
  buf << in.rdbuf();
  MAMMOTH_CHECK(!in.bad()) << "[json] error reading " << path;
  return parse(buf.str(), path);
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

void dump_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
}

void dump_double(std::string& out, double d) {
  MAMMOTH_CHECK(std::isfinite(d)) << "[json] cannot write " << d << ": JSON has no NaN/infinity";
  // std::to_chars without a precision gives the shortest text that reads back exactly.
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  MAMMOTH_CHECK(ec == std::errc()) << "[json] cannot format " << d;
  std::string_view text(buf, static_cast<size_t>(ptr - buf));
  out += text;
  // Keep doubles recognisable as doubles when read back (1.0 rather than 1).
  if (text.find_first_of(".eE") == std::string_view::npos) out += ".0";
}

void newline(std::string& out, int indent, int level) {
  if (indent < 0) return;
  out += '\n';
  out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

void dump_value(std::string& out, const Value& v, int indent, int level) {
  switch (v.type()) {
    case Type::kNull:
      out += "null";
      return;
    case Type::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Type::kNumber:
      if (v.is_int()) {
        out += std::to_string(v.as_int());
      } else {
        dump_double(out, v.as_double());
      }
      return;
    case Type::kString:
      dump_string(out, v.as_string());
      return;
    case Type::kArray:
    case Type::kObject: {
      const bool is_object = v.is_object();
      out += is_object ? '{' : '[';
      if (v.size() == 0) {
        out += is_object ? '}' : ']';
        return;
      }
      bool first = true;
      for (const Value& item : v) {
        if (!first) out += ',';
        first = false;
        newline(out, indent, level + 1);
        if (is_object) {
          dump_string(out, item.key());
          out += indent < 0 ? ":" : ": ";
        }
        dump_value(out, item, indent, level + 1);
      }
      newline(out, indent, level);
      out += is_object ? '}' : ']';
      return;
    }
  }
}

}  // namespace

std::string dump(const Value& v, int indent) {
  std::string out;
  dump_value(out, v, indent, 0);
  return out;
}

}  // namespace mammoth::json
