#include "engine/data/chat_template.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::data {

namespace {

namespace fs = std::filesystem;

// ---- values --------------------------------------------------------------------------------
// Jinja's values as Python sees them. Lists and dicts are shared (a namespace() is mutated
// through every name that refers to it, as in Python).
struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kString; kUndefined: the name that was looked up (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  bool is_namespace = false;

  static Value undefined(std::string name) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() { return of(Kind::kNone); }
  static Value boolean(bool x) {
    Value v = of(Kind::kBool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = of(Kind::kInt);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = of(Kind::kFloat);
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v = of(Kind::kString);
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List x) {
    Value v = of(Kind::kList);
    v.list = std::make_shared<List>(std::move(x));
    return v;
  }
  static Value make_dict(Dict x) {
    Value v = of(Kind::kDict);
    v.dict = std::make_shared<Dict>(std::move(x));
    return v;
  }
  bool is(Kind k) const { return kind == k; }
  // Python's bool and int are both numbers; bool is an int.
  bool is_intlike() const { return kind == Kind::kInt || kind == Kind::kBool; }
  bool is_number() const { return is_intlike() || kind == Kind::kFloat; }
  int64_t as_int() const { return kind == Kind::kBool ? (b ? 1 : 0) : i; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(as_int()); }
  const Value* member(const std::string& key) const {
    for (const auto& [k, v] : *dict)
      if (k == key) return &v;
    return nullptr;
  }

 private:
  static Value of(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "none";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
  }
  return "?";
}

// Error with the template line: "[chat_template] line N: ...".
struct Fail {
  int line;
  [[noreturn]] void operator()(const std::string& message) const {
    MAMMOTH_THROW() << "[chat_template] line " << line << ": " << message;
  }
};

// ---- UTF-8: Python indexes and measures strings by code point ---------------------------------
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t at = 0; at < s.size();) {
    size_t n = 1;
    const auto c = static_cast<unsigned char>(s[at]);
    if (c >= 0xF0) {
      n = 4;
    } else if (c >= 0xE0) {
      n = 3;
    } else if (c >= 0xC0) {
      n = 2;
    }
    out.push_back(s.substr(at, n));
    at += n;
  }
  return out;
}

bool is_ascii(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// Python's str.isspace for ASCII (space, \t \n \v \f \r and the separators \x1c-\x1f).
bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

std::string strip(const std::string& s, bool left, bool right, const std::string* chars) {
  auto drop = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_space(c); };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Python's repr of a float: shortest round-trip digits, positional for 1e-4 <= |x| < 1e16,
// else d.ddde+XX; always with a '.' or an exponent.
std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, end);  // -d.ddde+XX
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign = sci[0] == '-' ? "-" : "";
  std::string digits;
  for (size_t k = sign.size(); k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + ex;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len)
    return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

// What {{ v }} and ~ print: Python's str().
std::string to_text(const Value& v, const Fail& fail) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return python_float(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kList:
    case Value::Kind::kDict:
      break;
  }
  fail(std::string("printing a ") + kind_name(v) +
       " as text (Python's repr) is not supported; use tojson or join");
}

// transformers' tojson filter: json.dumps(x, ensure_ascii=False) with its default separators.
std::string to_json(const Value& v, const Fail& fail) {
  switch (v.kind) {
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kBool:
      return v.b ? "true" : "false";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      if (std::isnan(v.f)) return "NaN";
      if (std::isinf(v.f)) return v.f < 0 ? "-Infinity" : "Infinity";
      return python_float(v.f);
    case Value::Kind::kString:
      // json::dump escapes strings as json.dumps(ensure_ascii=False) does.
      return json::dump(json::Value(v.s));
    case Value::Kind::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k)
        out += (k ? ", " : "") + to_json((*v.list)[k], fail);
      return out + "]";
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, m] : *v.dict) {
        out += (first ? "" : ", ") + to_json(Value::str(k), fail) + ": " + to_json(m, fail);
        first = false;
      }
      return out + "}";
    }
    case Value::Kind::kUndefined:
      break;
  }
  fail("tojson of undefined '" + v.s + "'");
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
      return !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->empty();
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is(Value::Kind::kFloat) || b.is(Value::Kind::kFloat))
      return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* o = b.member(k);
        if (o == nullptr || !equal(v, *o)) return false;
      }
      return true;
    default:
      return true;  // none == none, undefined == undefined (Jinja's Undefined.__eq__)
  }
}

// <, <=, >, >= on numbers or on strings (UTF-8 bytes order as code points do).
int order(const Value& a, const Value& b, const Fail& fail) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is(Value::Kind::kString) && b.is(Value::Kind::kString)) return a.s.compare(b.s);
  fail(std::string("cannot order ") + kind_name(a) + " and " + kind_name(b));
}

// ---- the template's pieces ---------------------------------------------------------------------
struct Piece {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind;
  std::string text;
  int line;
};

// Splits the source into text, {{ }} and {% %} pieces with Jinja's whitespace rules as
// transformers configures them: trim_blocks (the newline after a block or comment tag is
// dropped), lstrip_blocks (spaces and tabs before a block or comment tag at the start of a
// line are dropped), '-' strips all whitespace on its side, '+' after '{%' keeps the indent,
// a single trailing newline of the template is dropped (keep_trailing_newline off), and
// \r\n / \r read as \n.
std::vector<Piece> split_pieces(std::string src) {
  std::string norm;
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k] == '\r') {
      norm += '\n';
      if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
    } else {
      norm += src[k];
    }
  }
  src = std::move(norm);
  if (!src.empty() && src.back() == '\n') src.pop_back();

  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool strip_leading = false, trim_newline = false, line_starting = true;
  auto count_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) line += src[k] == '\n';
  };
  while (true) {
    size_t at = pos;
    while (true) {
      at = src.find('{', at);
      if (at == std::string::npos || at + 1 >= src.size()) {
        at = std::string::npos;
        break;
      }
      const char c = src[at + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++at;
    }
    std::string text = src.substr(pos, at == std::string::npos ? std::string::npos : at - pos);
    const int text_line = line;
    count_lines(pos, at == std::string::npos ? src.size() : at);
    if (strip_leading) {
      text = strip(text, true, false, nullptr);
    } else if (trim_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    if (at == std::string::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
      break;
    }
    const char kind = src[at + 1];
    size_t body = at + 2;
    const char sign = body < src.size() ? src[body] : '\0';
    if (sign == '-') {
      text = strip(text, false, true, nullptr);
    } else if (sign != '+' && kind != '{') {
      const size_t nl = text.rfind('\n');
      const size_t tail = nl == std::string::npos ? 0 : nl + 1;
      if (tail > 0 || line_starting) {
        bool blank = true;
        for (size_t k = tail; k < text.size(); ++k) blank = blank && is_space(text[k]);
        if (blank) text.erase(tail);
      }
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
    if (sign == '-' || sign == '+') ++body;
    // The closer, skipping string literals inside expressions and statements.
    const std::string closer = kind == '{' ? "}}" : (kind == '%' ? "%}" : "#}");
    size_t end = std::string::npos;
    if (kind == '#') {
      end = src.find(closer, body);
    } else {
      char quote = 0;
      for (size_t k = body; k + 1 < src.size(); ++k) {
        if (quote) {
          if (src[k] == '\\') {
            ++k;
          } else if (src[k] == quote) {
            quote = 0;
          }
        } else if (src[k] == '\'' || src[k] == '"') {
          quote = src[k];
        } else if (src.compare(k, 2, closer) == 0) {
          end = k;
          break;
        }
      }
    }
    const int tag_line = line;
    if (end == std::string::npos) Fail{tag_line}("unclosed '{" + std::string(1, kind) + "'");
    size_t body_end = end;
    const char end_sign = end > body ? src[end - 1] : '\0';
    if (end_sign == '-' || (end_sign == '+' && kind != '{')) --body_end;
    std::string inner = src.substr(body, body_end > body ? body_end - body : 0);
    count_lines(at, end + 2);
    pos = end + 2;
    strip_leading = end_sign == '-';
    trim_newline = kind != '{' && end_sign != '+';
    // lstrip_blocks applies after a match that ended in a newline (what the next tag sees).
    size_t consumed = pos;
    if (strip_leading) {
      while (consumed < src.size() && is_space(src[consumed])) ++consumed;
    } else if (trim_newline && consumed < src.size() && src[consumed] == '\n') {
      ++consumed;
    }
    line_starting = consumed > pos && src[consumed - 1] == '\n';
    if (kind == '#') continue;
    pieces.push_back(
        {kind == '{' ? Piece::Kind::kOutput : Piece::Kind::kStatement, inner, tag_line});
  }
  return pieces;
}

// ---- expressions ---------------------------------------------------------------------------
struct Token {
  enum class Kind { kName, kInt, kFloat, kString, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

std::vector<Token> lex(const std::string& s, const Fail& fail) {
  std::vector<Token> out;
  size_t k = 0;
  while (k < s.size()) {
    const char c = s[k];
    if (is_space(c)) {
      ++k;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      out.push_back({Token::Kind::kName, s.substr(k, e - k)});
      k = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      bool real = false;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        real = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) fail("number exponents are not supported");
      std::string digits;
      for (size_t d = k; d < e; ++d)
        if (s[d] != '_') digits += s[d];
      Token t{real ? Token::Kind::kFloat : Token::Kind::kInt, digits};
      const char* first = digits.data();
      const char* last = first + digits.size();
      const auto [p, ec] =
          real ? std::from_chars(first, last, t.f) : std::from_chars(first, last, t.i);
      if (ec != std::errc() || p != last) fail("number '" + digits + "' is out of range");
      out.push_back(t);
      k = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t e = k + 1;
      for (; e < s.size() && s[e] != c; ++e) {
        if (s[e] != '\\') {
          v += s[e];
          continue;
        }
        if (++e >= s.size()) break;
        // Python's escapes (Jinja decodes string literals as Python does).
        switch (s[e]) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case '\\':
          case '\'':
          case '"':
            v += s[e];
            break;
          case '\n':
            break;
          default:
            fail(std::string("string escape '\\") + s[e] + "' is not supported");
        }
      }
      if (e >= s.size()) fail("unterminated string literal");
      out.push_back({Token::Kind::kString, v});
      k = e + 1;
    } else {
      static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                         "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                         "]",  "{",  "}",  ".",  ",",  ":",  "|"};
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.compare(k, n, op) == 0) {
          out.push_back({Token::Kind::kOp, op});
          k += n;
          found = true;
          break;
        }
      }
      if (!found) fail(std::string("unexpected character '") + c + "'");
    }
  }
  out.push_back({});
  return out;
}

struct Expr;
using ExprP = std::shared_ptr<const Expr>;
struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kDict,  // args: key0, value0, key1, value1...
    kAttr,  // args[0].name
    kIndex,
    kSlice,  // args: object, start, stop, step (null when omitted)
    kCall,   // args[0]: callee (a name or an attribute), then positional arguments
    kFilter,
    kTest,  // negate for "is not"
    kNeg,
    kNot,
    kBinary,   // op
    kCompare,  // op: == != < <= > >= in "not in"
    kAnd,
    kOr,
    kCond,  // args: value, condition, else value (null: undefined)
  };
  Kind kind;
  std::string name;  // names, attributes, operators, filters, tests
  Value literal;
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negate = false;
  int line = 0;
};

// The parsers recurse once per nesting level (brackets, parentheses, unary operators in an
// expression; if / for statements in a body) and the interpreter once per level of the trees
// they build: a template nested deeper than any real one is refused before either runs out of
// stack.
constexpr int kMaxNesting = 100;

class ExprParser {
 public:
  ExprParser(const std::string& text, int line)
      : fail_{line}, tokens_(lex(text, fail_)), line_(line) {}

  ExprP expression(bool with_condition = true) {
    const Nested nested(*this);
    ExprP e = or_expr();
    if (with_condition && is_name("if")) {
      ++at_;
      ExprP cond = or_expr();
      ExprP other;
      if (is_name("else")) {
        ++at_;
        other = expression();
      }
      e = make(Expr::Kind::kCond, "", {e, cond, other});
    }
    return e;
  }

  bool is_name(const char* n) const {
    return peek().kind == Token::Kind::kName && peek().text == n;
  }
  bool is_op(const char* op) const { return peek().kind == Token::Kind::kOp && peek().text == op; }
  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(at_ + ahead, tokens_.size() - 1)];
  }
  std::string name() {
    if (peek().kind != Token::Kind::kName) fail_("expected a name, got '" + peek().text + "'");
    return tokens_[at_++].text;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail_(std::string("expected '") + op + "', got '" + peek().text + "'");
    ++at_;
  }
  void expect_end(const std::string& what) {
    if (!at_end()) fail_("unexpected '" + peek().text + "' after " + what);
  }
  const Fail& fail() const { return fail_; }

 private:
  ExprP make(Expr::Kind k, std::string name, std::vector<ExprP> args) const {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->name = std::move(name);
    e->args = std::move(args);
    e->line = line_;
    return e;
  }
  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      ++at_;
      e = make(Expr::Kind::kOr, "", {e, and_expr()});
    }
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      ++at_;
      e = make(Expr::Kind::kAnd, "", {e, not_expr()});
    }
    return e;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      ++at_;
      const Nested nested(*this);
      return make(Expr::Kind::kNot, "", {not_expr()});
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = math1();
    while (true) {
      std::string op;
      if (peek().kind == Token::Kind::kOp) {
        for (const char* o : {"==", "!=", "<", "<=", ">", ">="})
          if (peek().text == o) op = o;
      }
      if (!op.empty()) {
        ++at_;
      } else if (is_name("in")) {
        op = "in";
        ++at_;
      } else if (is_name("not") && peek(1).kind == Token::Kind::kName && peek(1).text == "in") {
        op = "not in";
        at_ += 2;
      } else {
        return e;
      }
      e = make(Expr::Kind::kCompare, op, {e, math1()});
    }
  }
  ExprP binary_loop(ExprP (ExprParser::*next)(), std::initializer_list<const char*> ops) {
    ExprP e = (this->*next)();
    while (peek().kind == Token::Kind::kOp) {
      std::string op;
      for (const char* o : ops)
        if (peek().text == o) op = o;
      if (op.empty()) break;
      ++at_;
      e = make(Expr::Kind::kBinary, op, {e, (this->*next)()});
    }
    return e;
  }
  // Jinja's precedence, loosest first: + -, then ~, then * / // %, then **.
  ExprP math1() { return binary_loop(&ExprParser::concat, {"+", "-"}); }
  ExprP concat() { return binary_loop(&ExprParser::math2, {"~"}); }
  ExprP math2() { return binary_loop(&ExprParser::power, {"*", "/", "//", "%"}); }
  ExprP power() { return binary_loop(&ExprParser::unary, {"**"}); }
  ExprP unary() {
    if (is_op("-")) {
      ++at_;
      const Nested nested(*this);
      return filters(make(Expr::Kind::kNeg, "", {unary()}));
    }
    if (is_op("+")) {
      ++at_;
      const Nested nested(*this);
      return unary();
    }
    return filters(postfix(primary()));
  }
  // Filters and tests bind tighter than every operator: a + b | trim is a + (b | trim).
  ExprP filters(ExprP e) {
    while (true) {
      if (is_op("|")) {
        ++at_;
        auto f = std::make_shared<Expr>(*make(Expr::Kind::kFilter, name(), {e}));
        if (is_op("(")) arguments(*f);
        e = postfix(f);
      } else if (is_name("is")) {
        ++at_;
        bool negate = false;
        if (is_name("not")) {
          ++at_;
          negate = true;
        }
        // "is none", "is true" and "is false" name tests, not literals.
        auto t = std::make_shared<Expr>(*make(Expr::Kind::kTest, name(), {e}));
        t->negate = negate;
        if (is_op("(")) {
          arguments(*t);
        } else if (bare_test_argument()) {
          t->args.push_back(postfix(primary()));  // "x is equalto 'a'", "n is divisibleby 3"
        }
        e = t;
      } else {
        return e;
      }
    }
  }
  // Jinja reads one argument without parentheses after a test name when a name (other than
  // else / or / and), a literal, '[' or '{' follows, so "x is defined if c" is an error there.
  bool bare_test_argument() const {
    const Token& t = peek();
    if (t.kind == Token::Kind::kName) return t.text != "else" && t.text != "or" && t.text != "and";
    return t.kind == Token::Kind::kString || t.kind == Token::Kind::kInt ||
           t.kind == Token::Kind::kFloat ||
           (t.kind == Token::Kind::kOp && (t.text == "[" || t.text == "{"));
  }
  void arguments(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::kName && peek(1).kind == Token::Kind::kOp &&
          peek(1).text == "=") {
        std::string key = name();
        ++at_;
        call.kwargs.emplace_back(key, expression());
      } else {
        if (!call.kwargs.empty()) fail_("positional argument after a keyword argument");
        call.args.push_back(expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++at_;
  }
  ExprP postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        ++at_;
        if (peek().kind == Token::Kind::kInt) {
          e = make(Expr::Kind::kIndex, "", {e, literal(Value::integer(tokens_[at_++].i))});
        } else {
          e = make(Expr::Kind::kAttr, name(), {e});
        }
      } else if (is_op("[")) {
        ++at_;
        std::vector<ExprP> parts(3);
        int part = 0;
        bool slice = false;
        while (!is_op("]")) {
          if (is_op(":")) {
            ++at_;
            slice = true;
            if (++part > 2) fail_("too many ':' in a slice");
          } else {
            if (parts[part]) fail_("expected ']' or ':', got '" + peek().text + "'");
            parts[part] = expression();
          }
        }
        ++at_;
        if (slice) {
          e = make(Expr::Kind::kSlice, "", {e, parts[0], parts[1], parts[2]});
        } else {
          if (!parts[0]) fail_("empty subscript []");
          e = make(Expr::Kind::kIndex, "", {e, parts[0]});
        }
      } else if (is_op("(")) {
        auto call = std::make_shared<Expr>(*make(Expr::Kind::kCall, "", {e}));
        arguments(*call);
        e = call;
      } else {
        return e;
      }
    }
  }
  ExprP literal(Value v) const {
    auto e = std::make_shared<Expr>(*make(Expr::Kind::kLiteral, "", {}));
    e->literal = std::move(v);
    return e;
  }
  ExprP primary() {
    const Token t = peek();
    switch (t.kind) {
      case Token::Kind::kInt:
        ++at_;
        return literal(Value::integer(t.i));
      case Token::Kind::kFloat:
        ++at_;
        return literal(Value::real(t.f));
      case Token::Kind::kString: {
        ++at_;
        std::string s = t.text;
        // Adjacent literals concatenate, as in Python.
        while (peek().kind == Token::Kind::kString) s += tokens_[at_++].text;
        return literal(Value::str(s));
      }
      case Token::Kind::kName:
        ++at_;
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return literal(Value::none());
        return make(Expr::Kind::kName, t.text, {});
      case Token::Kind::kOp:
        if (t.text == "(") {
          ++at_;
          ExprP e = expression();
          if (is_op(",")) fail_("tuples are not supported");
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ++at_;
          std::vector<ExprP> items;
          while (!is_op("]")) {
            items.push_back(expression());
            if (!is_op("]")) expect_op(",");
          }
          ++at_;
          return make(Expr::Kind::kList, "", items);
        }
        if (t.text == "{") {
          ++at_;
          std::vector<ExprP> items;
          while (!is_op("}")) {
            items.push_back(expression());
            expect_op(":");
            items.push_back(expression());
            if (!is_op("}")) expect_op(",");
          }
          ++at_;
          return make(Expr::Kind::kDict, "", items);
        }
        break;
      case Token::Kind::kEnd:
        fail_("unexpected end of expression");
    }
    fail_("unexpected '" + t.text + "'");
  }

  Fail fail_;
  struct Nested {
    explicit Nested(ExprParser& p) : p(p) {
      if (++p.depth_ > kMaxNesting)
        p.fail_("expression nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Nested() { --p.depth_; }
    ExprParser& p;
  };
  int depth_ = 0;
  std::vector<Token> tokens_;
  size_t at_ = 0;
  int line_;
};

// ---- statements ----------------------------------------------------------------------------
struct Node;
using Body = std::vector<Node>;
struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet };
  Kind kind;
  int line = 0;
  std::string text;                          // kText; kSet: the name
  std::string attr;                          // kSet: ns.attr
  ExprP expr;                                // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprP, Body>> arms;  // kIf: (condition, body)...
  Body body, else_body;                      // kFor (and kIf's else)
  std::vector<std::string> targets;          // kFor
  ExprP filter;                              // kFor ... if cond
};

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body parse() {
    std::string end;
    Body b = block({}, &end);
    return b;
  }

 private:
  // Parses pieces until a statement whose keyword is in `stops` (left in *stop with the parser
  // positioned on it), or the end of the template when stops is empty.
  Body block(const std::vector<std::string>& stops, std::string* stop) {
    Body out;
    while (at_ < pieces_.size()) {
      const Piece& p = pieces_[at_];
      if (p.kind == Piece::Kind::kText) {
        out.push_back({.kind = Node::Kind::kText, .line = p.line, .text = p.text});
        ++at_;
        continue;
      }
      if (p.kind == Piece::Kind::kOutput) {
        ExprParser e(p.text, p.line);
        Node n{.kind = Node::Kind::kOutput, .line = p.line, .expr = e.expression()};
        e.expect_end("the expression");
        out.push_back(std::move(n));
        ++at_;
        continue;
      }
      ExprParser e(p.text, p.line);
      const std::string keyword = e.at_end() ? "" : e.peek().text;
      for (const std::string& s : stops) {
        if (keyword == s) {
          *stop = keyword;
          return out;
        }
      }
      ++at_;
      e.name();
      if (keyword == "if") {
        out.push_back(if_node(e, p.line));
      } else if (keyword == "for") {
        out.push_back(for_node(e, p.line));
      } else if (keyword == "set") {
        Node n{.kind = Node::Kind::kSet, .line = p.line};
        n.text = e.name();
        if (e.is_op(".")) {
          e.expect_op(".");
          n.attr = e.name();
        }
        if (e.is_op(",")) e.fail()("'{% set a, b = ... %}' (tuple unpacking) is not supported");
        if (!e.is_op("="))
          e.fail()("block '{% set " + n.text + " %}...{% endset %}' is not supported");
        e.expect_op("=");
        n.expr = e.expression();
        e.expect_end("the value of set");
        out.push_back(std::move(n));
      } else if (keyword.empty()) {
        e.fail()("empty statement '{% %}'");
      } else {
        Fail{p.line}("'{% " + keyword + " %}' " +
                     (stops.empty() ? std::string("is not supported")
                                    : "is not supported here (expected " + join(stops) + ")"));
      }
    }
    if (!stops.empty()) {
      Fail{pieces_.empty() ? 1 : pieces_.back().line}("missing '{% " + stops.back() + " %}'");
    }
    return out;
  }

  static std::string join(const std::vector<std::string>& words) {
    std::string s;
    for (const std::string& w : words) s += (s.empty() ? "" : " / ") + w;
    return s;
  }

  // The statement at at_ (a stop keyword); returns its expression parser past the keyword.
  ExprParser take() {
    const Piece& p = pieces_[at_++];
    ExprParser e(p.text, p.line);
    e.name();
    return e;
  }

  // Counts the if / for statements open around the one being parsed.
  struct Nested {
    Nested(TemplateParser& p, int line) : p(p) {
      if (++p.depth_ > kMaxNesting) {
        Fail{line}("statements nested deeper than " + std::to_string(kMaxNesting) + " levels");
      }
    }
    ~Nested() { --p.depth_; }
    TemplateParser& p;
  };

  Node if_node(ExprParser& e, int line) {
    const Nested nested(*this, line);
    Node n{.kind = Node::Kind::kIf, .line = line};
    ExprP cond = e.expression();
    e.expect_end("the if condition");
    std::string stop;
    while (true) {
      Body b = block({"elif", "else", "endif"}, &stop);
      n.arms.emplace_back(cond, std::move(b));
      ExprParser s = take();
      if (stop == "elif") {
        cond = s.expression();
        s.expect_end("the elif condition");
        continue;
      }
      s.expect_end(stop);
      if (stop == "else") {
        n.else_body = block({"endif"}, &stop);
        take().expect_end("endif");
      }
      return n;
    }
  }

  Node for_node(ExprParser& e, int line) {
    const Nested nested(*this, line);
    Node n{.kind = Node::Kind::kFor, .line = line};
    n.targets.push_back(e.name());
    while (e.is_op(",")) {
      e.expect_op(",");
      n.targets.push_back(e.name());
    }
    if (!e.is_name("in")) e.fail()("expected 'in' in the for statement");
    e.name();
    n.expr = e.expression(false);
    if (e.is_name("if")) {
      e.name();
      n.filter = e.expression(false);
    }
    if (e.is_name("recursive")) e.fail()("recursive for loops are not supported");
    e.expect_end("the for statement");
    std::string stop;
    n.body = block({"else", "endfor"}, &stop);
    take().expect_end(stop);
    if (stop == "else") {
      n.else_body = block({"endfor"}, &stop);
      take().expect_end("endfor");
    }
    return n;
  }

  std::vector<Piece> pieces_;
  size_t at_ = 0;
  int depth_ = 0;
};

}  // namespace

struct ChatTemplate::Program {
  Body body;
};

namespace {

// ---- evaluation ----------------------------------------------------------------------------
// Rendering is bounded by ChatTemplateLimits. A range() is also bounded by itself, so that
// its element count fits the work counter before it is charged.
constexpr int64_t kMaxItems = int64_t{1} << 20;
// Work units: one per node, expression or element copied, 16 per loop iteration (the loop's
// scope and `loop` dict are some twenty allocations) and one per KiB of string an expression
// yields; a unit is ~0.9 us under AddressSanitizer on a loaded 2-core machine. The default 2^19
// units is ~0.5 s there and under 0.1 s in a release build; a 4000-turn chat of 1 KiB turns
// through Llama 3's template takes a third of it (test/engine/data/chat_template_test.cc), 11900
// turns all.

// "16 MiB" for whole MiB, else "N bytes".
std::string bytes_text(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return std::to_string(n >> 20) + " MiB";
  return std::to_string(n) + " bytes";
}

class Renderer {
 public:
  Renderer(std::map<std::string, Value> globals, ChatTemplateLimits limits) : limits_(limits) {
    scopes_.push_back(std::move(globals));
  }

  void run(const Body& body, std::string& out) {
    for (const Node& n : body) {
      const Fail fail{n.line};
      charge(1, fail);
      switch (n.kind) {
        case Node::Kind::kText:
          out += n.text;
          if (out.size() > limits_.text)
            fail("the rendered text exceeds " + bytes_text(limits_.text));
          break;
        case Node::Kind::kOutput:
          out += to_text(eval(*n.expr), fail);
          if (out.size() > limits_.text)
            fail("the rendered text exceeds " + bytes_text(limits_.text));
          break;
        case Node::Kind::kIf: {
          const Body* chosen = &n.else_body;
          for (const auto& [cond, b] : n.arms) {
            if (truthy(eval(*cond))) {
              chosen = &b;
              break;
            }
          }
          run(*chosen, out);
          break;
        }
        case Node::Kind::kFor:
          run_for(n, out);
          break;
        case Node::Kind::kSet: {
          Value v = eval(*n.expr);
          if (n.attr.empty()) {
            scopes_.back()[n.text] = std::move(v);
            break;
          }
          Value ns = lookup(n.text);
          if (!ns.is(Value::Kind::kDict) || !ns.is_namespace)
            fail("'{% set " + n.text + "." + n.attr + " %}' needs a namespace(), got " +
                 kind_name(ns));
          // Values share their lists and dicts, so a namespace stored inside itself would own
          // itself and never be freed.
          if (holds(v, ns.dict.get()))
            fail("'{% set " + n.text + "." + n.attr +
                 " %}' would store the namespace inside "
                 "itself");
          bool found = false;
          for (auto& [k, m] : *ns.dict) {
            if (k == n.attr) {
              m = v;
              found = true;
            }
          }
          if (!found) ns.dict->emplace_back(n.attr, std::move(v));
          break;
        }
      }
    }
  }

 private:
  // Whether `v` is, or holds somewhere in its lists and dicts, the dict `target`.
  static bool holds(const Value& v, const Dict* target) {
    if (v.is(Value::Kind::kDict)) {
      if (v.dict.get() == target) return true;
      for (const auto& [k, m] : *v.dict)
        if (holds(m, target)) return true;
    } else if (v.is(Value::Kind::kList)) {
      for (const Value& e : *v.list)
        if (holds(e, target)) return true;
    }
    return false;
  }

  Value lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto it = s->find(name);
      if (it != s->end()) return it->second;
    }
    return Value::undefined(name);
  }

  void charge(int64_t units, const Fail& fail) {
    work_ += units;
    if (work_ > limits_.work)
      fail("rendering takes more than " + std::to_string(limits_.work) +
           " steps (does a loop never end?)");
  }

  List items_of(const Value& v, const Fail& fail) {
    switch (v.kind) {
      case Value::Kind::kList:
        charge(static_cast<int64_t>(v.list->size()), fail);
        return *v.list;
      case Value::Kind::kDict: {
        List keys;
        for (const auto& [k, m] : *v.dict) keys.push_back(Value::str(k));
        return keys;
      }
      case Value::Kind::kString: {
        charge(static_cast<int64_t>(v.s.size()), fail);
        List chars;
        for (std::string& c : code_points(v.s)) chars.push_back(Value::str(std::move(c)));
        return chars;
      }
      case Value::Kind::kUndefined:
        return {};  // Jinja's Undefined iterates as empty
      default:
        fail(std::string("cannot iterate over a ") + kind_name(v));
    }
  }

  void run_for(const Node& n, std::string& out) {
    const Fail fail{n.line};
    List all = items_of(eval(*n.expr), fail);
    // "for x in xs if cond": the filter runs first, so loop.index counts kept items only.
    List items;
    for (Value& item : all) {
      if (n.filter) {
        scopes_.emplace_back();
        bind(n, item, fail);
        const bool keep = truthy(eval(*n.filter));
        scopes_.pop_back();
        if (!keep) continue;
      }
      items.push_back(std::move(item));
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      charge(16, fail);
      scopes_.emplace_back();
      bind(n, items[k], fail);
      Dict loop = {{"index0", Value::integer(k)},
                   {"index", Value::integer(k + 1)},
                   {"revindex0", Value::integer(len - k - 1)},
                   {"revindex", Value::integer(len - k)},
                   {"first", Value::boolean(k == 0)},
                   {"last", Value::boolean(k == len - 1)},
                   {"length", Value::integer(len)},
                   {"previtem", k > 0 ? items[k - 1] : Value::undefined("loop.previtem")},
                   {"nextitem", k + 1 < len ? items[k + 1] : Value::undefined("loop.nextitem")}};
      scopes_.back()["loop"] = Value::make_dict(std::move(loop));
      run(n.body, out);
      scopes_.pop_back();
    }
    if (len == 0) run(n.else_body, out);
  }

  void bind(const Node& n, const Value& item, const Fail& fail) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    if (!item.is(Value::Kind::kList) || item.list->size() != n.targets.size())
      fail("cannot unpack a " + std::string(kind_name(item)) + " into " +
           std::to_string(n.targets.size()) + " loop variables");
    for (size_t t = 0; t < n.targets.size(); ++t) scopes_.back()[n.targets[t]] = (*item.list)[t];
  }

  // Python's sequence index: negative counts from the end; out of range is undefined (Jinja).
  Value index(const Value& obj, const Value& key, const Fail& fail) {
    if (obj.is(Value::Kind::kUndefined)) fail("'" + obj.s + "' is undefined");
    if (obj.is(Value::Kind::kDict)) {
      if (!key.is(Value::Kind::kString))
        fail(std::string("dict keys are strings here, got a ") + kind_name(key));
      const Value* m = obj.member(key.s);
      return m ? *m : Value::undefined(key.s);
    }
    if (obj.is(Value::Kind::kList) || obj.is(Value::Kind::kString)) {
      if (!key.is_intlike())
        fail(std::string("a ") + kind_name(obj) + " index must be an integer, got a " +
             kind_name(key));
      // A list is indexed in place; a string is split into code points (charged per byte).
      List chars;
      const List& seq = obj.is(Value::Kind::kList) ? *obj.list : (chars = items_of(obj, fail));
      int64_t k = key.as_int();
      const int64_t n = static_cast<int64_t>(seq.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined("[" + std::to_string(key.as_int()) + "]");
      return seq[k];
    }
    if (obj.is(Value::Kind::kNone)) return Value::undefined("none[...]");
    fail(std::string("cannot index a ") + kind_name(obj));
  }

  Value slice(const Expr& e, const Fail& fail) {
    const Value obj = eval(*e.args[0]);
    if (!obj.is(Value::Kind::kList) && !obj.is(Value::Kind::kString))
      fail(std::string("cannot slice a ") + kind_name(obj));
    List seq = items_of(obj, fail);
    const int64_t n = static_cast<int64_t>(seq.size());
    auto arg = [&](size_t a, bool* given) -> int64_t {
      *given = false;
      if (!e.args[a]) return 0;
      const Value v = eval(*e.args[a]);
      if (v.is(Value::Kind::kNone)) return 0;
      if (!v.is_intlike()) fail(std::string("slice bounds must be integers, got ") + kind_name(v));
      *given = true;
      return v.as_int();
    };
    bool has_start, has_stop, has_step;
    int64_t start = arg(1, &has_start), stop = arg(2, &has_stop), step = arg(3, &has_step);
    if (!has_step) step = 1;
    if (step == 0) fail("slice step cannot be zero");
    // Python's slice.indices.
    auto clamp = [&](int64_t v, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    start = clamp(start, has_start, step > 0 ? 0 : n - 1);
    stop = clamp(stop, has_stop, step > 0 ? n : -1);
    List picked;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) picked.push_back(seq[k]);
    if (obj.is(Value::Kind::kList)) return Value::make_list(std::move(picked));
    std::string s;
    for (const Value& c : picked) s += c.s;
    return Value::str(s);
  }

  Value attribute(const Value& obj, const std::string& name, const Fail& fail) {
    if (obj.is(Value::Kind::kUndefined))
      fail("'" + obj.s + "' is undefined (reading ." + name + ")");
    if (obj.is(Value::Kind::kDict)) {
      const Value* m = obj.member(name);
      return m ? *m : Value::undefined(name);
    }
    return Value::undefined(name);
  }

  Value arithmetic(const std::string& op, const Value& a, const Value& b, const Fail& fail) {
    if (op == "~") {
      std::string s = to_text(a, fail) + to_text(b, fail);
      if (s.size() > limits_.text) fail("a string would exceed " + bytes_text(limits_.text));
      return Value::str(std::move(s));
    }
    if (op == "+") {
      if (a.is(Value::Kind::kString) && b.is(Value::Kind::kString)) {
        if (a.s.size() + b.s.size() > limits_.text)
          fail("a string would exceed " + bytes_text(limits_.text));
        return Value::str(a.s + b.s);
      }
      if (a.is(Value::Kind::kList) && b.is(Value::Kind::kList)) {
        charge(static_cast<int64_t>(a.list->size() + b.list->size()), fail);
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(l));
      }
    }
    if (op == "*" && a.is(Value::Kind::kString) && b.is_intlike()) {
      const int64_t times = b.as_int();
      if (times > 0 && a.s.size() > limits_.text / static_cast<size_t>(times))
        fail("a string would exceed " + bytes_text(limits_.text));
      std::string s;
      if (times <= 0 || a.s.empty()) return Value::str(s);  // '' * 10**12: no loop to run
      for (int64_t k = 0; k < times; ++k) s += a.s;
      return Value::str(s);
    }
    if (!a.is_number() || !b.is_number()) {
      for (const Value* v : {&a, &b})
        if (v->is(Value::Kind::kUndefined)) fail("'" + v->s + "' is undefined (in '" + op + "')");
      fail(std::string("unsupported operands for '") + op + "': " + kind_name(a) + " and " +
           kind_name(b));
    }
    const bool ints = a.is_intlike() && b.is_intlike();
    const int64_t x = a.as_int(), y = b.as_int();
    const double p = a.as_double(), q = b.as_double();
    if ((op == "/" || op == "//" || op == "%") && q == 0) fail("division by zero");
    int64_t r = 0;
    if (ints && (op == "+" || op == "-" || op == "*")) {
      const bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                            : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                        : __builtin_mul_overflow(x, y, &r);
      if (overflow) fail("integer overflow in '" + op + "'");
      return Value::integer(r);
    }
    if (ints && (op == "//" || op == "%") && x == INT64_MIN && y == -1)
      fail("integer overflow in '" + op + "'");
    if (op == "+") return Value::real(p + q);
    if (op == "-") return Value::real(p - q);
    if (op == "*") return Value::real(p * q);
    if (op == "/") return Value::real(p / q);
    if (op == "//") {
      if (ints) return Value::integer(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));
      return Value::real(std::floor(p / q));
    }
    if (op == "%") {
      if (ints) {
        const int64_t m = x % y;  // x == INT64_MIN, y == -1 was refused above
        return Value::integer(m != 0 && ((m < 0) != (y < 0)) ? m + y : m);
      }
      return Value::real(p - q * std::floor(p / q));
    }
    if (ints && y >= 0) {
      // Square and multiply: 63 steps at most, each checked.
      int64_t power = 1, base = x;
      for (int64_t e = y; e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(power, base, &power))
          fail("integer overflow in '**'");
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow in '**'");
      }
      return Value::integer(power);
    }
    return Value::real(std::pow(p, q));
  }

  bool contains(const Value& needle, const Value& hay, const Fail& fail) {
    if (hay.is(Value::Kind::kString)) {
      if (!needle.is(Value::Kind::kString))
        fail(std::string("'in <string>' needs a string, got a ") + kind_name(needle));
      return hay.s.find(needle.s) != std::string::npos;
    }
    if (hay.is(Value::Kind::kDict)) return needle.is(Value::Kind::kString) && hay.member(needle.s);
    if (hay.is(Value::Kind::kList)) {
      for (const Value& v : *hay.list)
        if (equal(v, needle)) return true;
      return false;
    }
    if (hay.is(Value::Kind::kUndefined)) return false;
    fail(std::string("'in' needs a string, list or dict, got a ") + kind_name(hay));
  }

  std::vector<Value> positional(const Expr& e, size_t from) {
    std::vector<Value> out;
    for (size_t a = from; a < e.args.size(); ++a) out.push_back(eval(*e.args[a]));
    return out;
  }

  static void arity(const std::string& what, const std::vector<Value>& args, size_t lo, size_t hi,
                    const Fail& fail) {
    if (args.size() < lo || args.size() > hi)
      fail(what + " takes " +
           (lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi)) +
           " arguments, got " + std::to_string(args.size()));
  }
  static const std::string& string_arg(const std::string& what, const Value& v, const Fail& fail) {
    if (!v.is(Value::Kind::kString))
      fail(what + " needs a string argument, got a " + std::string(kind_name(v)));
    return v.s;
  }
  static std::string ascii_case(const std::string& what, std::string s, int mode,
                                const Fail& fail) {
    // mode 0 lower, 1 upper, 2 capitalize, 3 title. Python's are Unicode-aware; ours is not,
    // so text with non-ASCII characters is refused rather than cased differently.
    if (!is_ascii(s)) fail(what + " of non-ASCII text is not supported");
    bool word_start = true;
    for (size_t k = 0; k < s.size(); ++k) {
      const unsigned char c = static_cast<unsigned char>(s[k]);
      bool up = mode == 1 || (mode == 2 && k == 0) || (mode == 3 && word_start);
      s[k] = static_cast<char>(up ? std::toupper(c) : std::tolower(c));
      word_start = !std::isalpha(c);
    }
    return s;
  }

  Value method(const Value& obj, const std::string& name, const std::vector<Value>& args,
               const Fail& fail) {
    const std::string what = std::string(kind_name(obj)) + "." + name + "()";
    if (obj.is(Value::Kind::kString)) {
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        arity(what, args, 0, 1, fail);
        const std::string* chars = args.empty() || args[0].is(Value::Kind::kNone)
                                       ? nullptr
                                       : &string_arg(what, args[0], fail);
        return Value::str(strip(obj.s, name != "rstrip", name != "lstrip", chars));
      }
      if (name == "startswith" || name == "endswith") {
        arity(what, args, 1, 1, fail);
        const std::string& x = string_arg(what, args[0], fail);
        const bool r =
            x.size() <= obj.s.size() &&
            obj.s.compare(name == "startswith" ? 0 : obj.s.size() - x.size(), x.size(), x) == 0;
        return Value::boolean(r);
      }
      if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
        arity(what, args, 0, 0, fail);
        const int mode = name == "lower" ? 0 : name == "upper" ? 1 : name == "capitalize" ? 2 : 3;
        return Value::str(ascii_case(what, obj.s, mode, fail));
      }
      if (name == "replace") {
        arity(what, args, 2, 2, fail);
        return Value::str(replace_all(obj.s, string_arg(what, args[0], fail),
                                      string_arg(what, args[1], fail), fail));
      }
      if (name == "split") {
        arity(what, args, 0, 1, fail);
        List parts;
        if (args.empty() || args[0].is(Value::Kind::kNone)) {
          std::istringstream in(obj.s);  // Python's split(): runs of whitespace
          for (std::string w; in >> w;) parts.push_back(Value::str(w));
        } else {
          const std::string& sep = string_arg(what, args[0], fail);
          if (sep.empty()) fail("empty separator in split()");
          size_t from = 0;
          for (size_t at; (at = obj.s.find(sep, from)) != std::string::npos; from = at + sep.size())
            parts.push_back(Value::str(obj.s.substr(from, at - from)));
          parts.push_back(Value::str(obj.s.substr(from)));
        }
        return Value::make_list(std::move(parts));
      }
    } else if (obj.is(Value::Kind::kDict)) {
      if (name == "items" || name == "keys" || name == "values") {
        arity(what, args, 0, 0, fail);
        List out;
        for (const auto& [k, v] : *obj.dict) {
          if (name == "items") {
            out.push_back(Value::make_list({Value::str(k), v}));
          } else {
            out.push_back(name == "keys" ? Value::str(k) : v);
          }
        }
        return Value::make_list(std::move(out));
      }
      if (name == "get") {
        arity(what, args, 1, 2, fail);
        const Value* m = obj.member(string_arg(what, args[0], fail));
        return m ? *m : (args.size() > 1 ? args[1] : Value::none());
      }
    } else if (obj.is(Value::Kind::kUndefined)) {
      fail("'" + obj.s + "' is undefined (calling ." + name + "())");
    }
    fail("method " + what + " is not supported");
  }

  static std::string replace_all(const std::string& s, const std::string& from,
                                 const std::string& to, const Fail& fail) {
    if (from.empty()) fail("replace() of the empty string is not supported");
    std::string out;
    size_t at = 0;
    for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size())
      out += s.substr(at, hit - at) + to;
    return out + s.substr(at);
  }

  Value call(const Expr& e, const Fail& fail) {
    const Expr& callee = *e.args[0];
    std::vector<Value> args = positional(e, 1);
    if (callee.kind == Expr::Kind::kAttr) {
      if (!e.kwargs.empty()) fail("keyword arguments to ." + callee.name + "() are not supported");
      return method(eval(*callee.args[0]), callee.name, args, fail);
    }
    if (callee.kind != Expr::Kind::kName) fail("only functions and methods can be called");
    const std::string& fn = callee.name;
    if (fn == "namespace") {
      if (!args.empty()) fail("namespace() takes keyword arguments only");
      Dict d;
      for (const auto& [k, v] : e.kwargs) d.emplace_back(k, eval(*v));
      Value ns = Value::make_dict(std::move(d));
      ns.is_namespace = true;
      return ns;
    }
    if (!e.kwargs.empty()) fail("keyword arguments to " + fn + "() are not supported");
    if (fn == "raise_exception") {
      arity(fn + "()", args, 1, 1, fail);
      MAMMOTH_THROW() << "[chat_template] template raised: " << to_text(args[0], fail);
    }
    if (fn == "range") {
      arity(fn + "()", args, 1, 3, fail);
      for (const Value& a : args)
        if (!a.is_intlike()) fail("range() needs integers");
      int64_t lo = 0, hi = args[0].as_int(), step = 1;
      if (args.size() >= 2) lo = args[0].as_int(), hi = args[1].as_int();
      if (args.size() == 3) step = args[2].as_int();
      if (step == 0) fail("range() step cannot be zero");
      const __int128 span = step > 0 ? __int128{hi} - lo : __int128{lo} - hi;
      const __int128 count = span <= 0 ? 0
                                       : (span + (step > 0 ? step : -__int128{step}) - 1) /
                                             (step > 0 ? step : -__int128{step});
      if (count > kMaxItems) fail("range() of more than 2^20 elements");
      charge(static_cast<int64_t>(count), fail);
      List out;
      for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) out.push_back(Value::integer(k));
      return Value::make_list(std::move(out));
    }
    fail("function '" + fn + "' is not supported (namespace, range, raise_exception)");
  }

  Value filter(const Expr& e, const Fail& fail) {
    const std::string& f = e.name;
    Value in = eval(*e.args[0]);
    std::vector<Value> args = positional(e, 1);
    const std::string what = "filter '" + f + "'";
    static const char* const kFilters[] = {
        "default", "d",          "trim",  "length",  "count",   "tojson", "upper",
        "lower",   "capitalize", "title", "first",   "last",    "join",   "string",
        "int",     "float",      "list",  "replace", "reverse", "items",  "safe"};
    if (std::find(std::begin(kFilters), std::end(kFilters), f) == std::end(kFilters))
      fail(what + " is not supported");
    if (f == "default" || f == "d") {
      bool boolean = false;
      for (const auto& [k, v] : e.kwargs) {
        if (k != "boolean") fail(what + ": keyword '" + k + "' is not supported");
        boolean = truthy(eval(*v));
      }
      arity(what, args, 0, 2, fail);
      if (args.size() == 2) boolean = truthy(args[1]);
      const bool use = in.is(Value::Kind::kUndefined) || (boolean && !truthy(in));
      return use ? (args.empty() ? Value::str("") : args[0]) : in;
    }
    if (!e.kwargs.empty()) fail(what + ": keyword arguments are not supported");
    if (f == "trim") {
      arity(what, args, 0, 1, fail);
      const std::string* chars = args.empty() ? nullptr : &string_arg(what, args[0], fail);
      return Value::str(strip(to_text(in, fail), true, true, chars));
    }
    if (f == "length" || f == "count") {
      arity(what, args, 0, 0, fail);
      if (in.is(Value::Kind::kDict)) return Value::integer(static_cast<int64_t>(in.dict->size()));
      if (!in.is(Value::Kind::kList) && !in.is(Value::Kind::kString) &&
          !in.is(Value::Kind::kUndefined))
        fail(what + " of a " + kind_name(in));
      return Value::integer(static_cast<int64_t>(items_of(in, fail).size()));
    }
    if (f == "tojson") {
      arity(what, args, 0, 0, fail);
      return Value::str(to_json(in, fail));
    }
    if (f == "upper" || f == "lower" || f == "capitalize" || f == "title") {
      arity(what, args, 0, 0, fail);
      const int mode = f == "lower" ? 0 : f == "upper" ? 1 : f == "capitalize" ? 2 : 3;
      return Value::str(ascii_case(what, to_text(in, fail), mode, fail));
    }
    if (f == "first" || f == "last") {
      arity(what, args, 0, 0, fail);
      List seq = items_of(in, fail);
      if (seq.empty()) return Value::undefined(f);
      return f == "first" ? seq.front() : seq.back();
    }
    if (f == "join") {
      arity(what, args, 0, 1, fail);
      const std::string sep = args.empty() ? "" : to_text(args[0], fail);
      std::string out;
      List seq = items_of(in, fail);
      for (size_t k = 0; k < seq.size(); ++k) out += (k ? sep : "") + to_text(seq[k], fail);
      return Value::str(out);
    }
    if (f == "string") {
      arity(what, args, 0, 0, fail);
      return Value::str(to_text(in, fail));
    }
    if (f == "int" || f == "float") {
      arity(what, args, 0, 0, fail);
      double x = 0;
      if (in.is_number()) {
        x = in.as_double();
      } else if (in.is(Value::Kind::kString)) {
        // Jinja's int/float filters give 0 for text that is not a number.
        const std::string t = strip(in.s, true, true, nullptr);
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), x);
        if (ec != std::errc() || p != t.data() + t.size()) x = 0;
      }
      if (f == "float") return Value::real(x);
      return in.is_intlike() ? Value::integer(in.as_int())
                             : Value::integer(static_cast<int64_t>(std::trunc(x)));
    }
    if (f == "list") {
      arity(what, args, 0, 0, fail);
      return Value::make_list(items_of(in, fail));
    }
    if (f == "replace") {
      arity(what, args, 2, 2, fail);
      return Value::str(
          replace_all(to_text(in, fail), to_text(args[0], fail), to_text(args[1], fail), fail));
    }
    if (f == "reverse") {
      arity(what, args, 0, 0, fail);
      List seq = items_of(in, fail);
      std::reverse(seq.begin(), seq.end());
      if (!in.is(Value::Kind::kString)) return Value::make_list(std::move(seq));
      std::string s;
      for (const Value& c : seq) s += c.s;
      return Value::str(s);
    }
    if (f == "items") {
      arity(what, args, 0, 0, fail);
      if (in.is(Value::Kind::kUndefined)) return Value::make_list({});
      if (!in.is(Value::Kind::kDict)) fail(what + " of a " + kind_name(in));
      return method(in, "items", {}, fail);
    }
    if (f == "safe") {
      arity(what, args, 0, 0, fail);
      return in;
    }
    fail(what + " is not supported");
  }

  Value test(const Expr& e, const Fail& fail) {
    const std::string& t = e.name;
    const Value v = eval(*e.args[0]);
    std::vector<Value> args = positional(e, 1);
    if (!e.kwargs.empty()) fail("test '" + t + "': keyword arguments are not supported");
    using K = Value::Kind;
    bool r = false;
    const size_t want =
        (t == "divisibleby" || t == "eq" || t == "equalto" || t == "ne" || t == "sameas") ? 1 : 0;
    arity("test '" + t + "'", args, want, want, fail);
    if (t == "defined") {
      r = !v.is(K::kUndefined);
    } else if (t == "undefined") {
      r = v.is(K::kUndefined);
    } else if (t == "none") {
      r = v.is(K::kNone);
    } else if (t == "string") {
      r = v.is(K::kString);
    } else if (t == "number") {
      r = v.is_number();
    } else if (t == "integer") {
      r = v.is(K::kInt);
    } else if (t == "float") {
      r = v.is(K::kFloat);
    } else if (t == "boolean") {
      r = v.is(K::kBool);
    } else if (t == "true" || t == "false") {
      r = v.is(K::kBool) && v.b == (t == "true");
    } else if (t == "mapping") {
      r = v.is(K::kDict);
    } else if (t == "sequence" || t == "iterable") {
      r = v.is(K::kList) || v.is(K::kString) || v.is(K::kDict);
    } else if (t == "even" || t == "odd") {
      if (!v.is_intlike()) fail("test '" + t + "' of a " + kind_name(v));
      r = (v.as_int() % 2 == 0) == (t == "even");
    } else if (t == "divisibleby") {
      if (!v.is_intlike() || !args[0].is_intlike() || args[0].as_int() == 0)
        fail("test 'divisibleby' needs integers (and a non-zero divisor)");
      r = v.as_int() % args[0].as_int() == 0;
    } else if (t == "eq" || t == "equalto" || t == "sameas") {
      if (t == "sameas" && !(v.is(K::kNone) || v.is(K::kBool)))
        fail("test 'sameas' is supported for none, true and false only");
      r = t == "sameas" ? v.kind == args[0].kind && (!v.is(K::kBool) || v.b == args[0].b)
                        : equal(v, args[0]);
    } else if (t == "ne") {
      r = !equal(v, args[0]);
    } else {
      fail("test '" + t + "' is not supported");
    }
    return Value::boolean(r != e.negate);
  }

  Value eval(const Expr& e) {
    Value v = evaluate(e);
    if (v.is(Value::Kind::kString))
      charge(1 + static_cast<int64_t>(v.s.size() >> 10), Fail{e.line});
    else
      charge(1, Fail{e.line});
    return v;
  }

  Value evaluate(const Expr& e) {
    const Fail fail{e.line};
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList: {
        List l;
        for (const ExprP& a : e.args) l.push_back(eval(*a));
        return Value::make_list(std::move(l));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t k = 0; k < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (!key.is(Value::Kind::kString))
            fail(std::string("dict keys must be strings here, got a ") + kind_name(key));
          bool replaced = false;
          for (auto& [name, v] : d) {
            if (name == key.s) {
              v = eval(*e.args[k + 1]);
              replaced = true;
            }
          }
          if (!replaced) d.emplace_back(key.s, eval(*e.args[k + 1]));
        }
        return Value::make_dict(std::move(d));
      }
      case Expr::Kind::kAttr:
        return attribute(eval(*e.args[0]), e.name, fail);
      case Expr::Kind::kIndex:
        return index(eval(*e.args[0]), eval(*e.args[1]), fail);
      case Expr::Kind::kSlice:
        return slice(e, fail);
      case Expr::Kind::kCall:
        return call(e, fail);
      case Expr::Kind::kFilter:
        return filter(e, fail);
      case Expr::Kind::kTest:
        return test(e, fail);
      case Expr::Kind::kNeg: {
        Value v = eval(*e.args[0]);
        if (v.is(Value::Kind::kFloat)) return Value::real(-v.f);
        if (v.is_intlike()) {
          if (v.as_int() == INT64_MIN) fail("integer overflow in unary '-'");
          return Value::integer(-v.as_int());
        }
        fail(std::string("unary '-' of a ") + kind_name(v));
      }
      case Expr::Kind::kNot:
        return Value::boolean(!truthy(eval(*e.args[0])));
      case Expr::Kind::kBinary:
        return arithmetic(e.name, eval(*e.args[0]), eval(*e.args[1]), fail);
      case Expr::Kind::kCompare: {
        const Value a = eval(*e.args[0]), b = eval(*e.args[1]);
        const std::string& op = e.name;
        if (op == "==") return Value::boolean(equal(a, b));
        if (op == "!=") return Value::boolean(!equal(a, b));
        if (op == "in") return Value::boolean(contains(a, b, fail));
        if (op == "not in") return Value::boolean(!contains(a, b, fail));
        const int c = order(a, b, fail);
        if (op == "<") return Value::boolean(c < 0);
        if (op == "<=") return Value::boolean(c <= 0);
        if (op == ">") return Value::boolean(c > 0);
        return Value::boolean(c >= 0);
      }
      // and / or return an operand, as in Python.
      case Expr::Kind::kAnd: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::Kind::kCond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("else");
    }
    fail("unknown expression");
  }

  std::vector<std::map<std::string, Value>> scopes_;
  const ChatTemplateLimits limits_;
  int64_t work_ = 0;
};

// A token in tokenizer_config.json: a string, or an AddedToken object's "content".
std::string token_text(const json::Value& config, const char* key, const std::string& where) {
  const json::Value* v = config.find(key);
  if (v == nullptr || v->is_null()) return "";
  if (v->is_object()) v = v->find("content");
  MAMMOTH_CHECK(v != nullptr && v->is_string()) << "[chat_template] " << where << ": " << key
                                                << " is neither a string nor {\"content\": ...}";
  return v->as_string();
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MAMMOTH_CHECK(in) << "[chat_template] cannot read " << p.string();
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, SpecialTokens tokens)
    : source_(source), tokens_(std::move(tokens)) {
  auto program = std::make_shared<Program>();
  program->body = TemplateParser(split_pieces(source)).parse();
  program_ = std::move(program);
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  const std::string where = config_path.string();
  json::Value config = json::Value::object();
  if (fs::exists(config_path)) config = json::parse_file(where);
  SpecialTokens tokens{
      token_text(config, "bos_token", where), token_text(config, "eos_token", where),
      token_text(config, "unk_token", where), token_text(config, "pad_token", where)};
  const json::Value* t = config.find("chat_template");
  if (t != nullptr && t->is_string()) return ChatTemplate(t->as_string(), tokens);
  if (t != nullptr && t->is_array()) {
    // transformers picks the template named "default" when none is asked for.
    for (const json::Value& named : *t) {
      MAMMOTH_CHECK(named.is_object() && named.find("name") && named.find("template"))
          << "[chat_template] " << where << ": chat_template list entries need name and template";
      if (named.at("name").as_string() == "default")
        return ChatTemplate(named.at("template").as_string(), tokens);
    }
    MAMMOTH_THROW() << "[chat_template] " << where
                    << ": chat_template is a list without a template named 'default'";
  }
  MAMMOTH_CHECK(t == nullptr || t->is_null())
      << "[chat_template] " << where << ": chat_template must be a string or a list";
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  MAMMOTH_CHECK(fs::exists(jinja)) << "[chat_template] '" << dir
                                   << "' has no chat template (tokenizer_config.json's "
                                      "\"chat_template\" or chat_template.jinja)";
  return ChatTemplate(read_text(jinja), tokens);
}

bool ChatTemplate::in_model_dir(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(fs::path(dir) / "chat_template.jinja")) return true;
  if (!fs::exists(config_path)) return false;
  const json::Value config = json::parse_file(config_path.string());
  const json::Value* t = config.find("chat_template");
  return t != nullptr && !t->is_null();
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, ChatTemplateLimits limits) const {
  List list;
  for (const ChatMessage& m : messages)
    list.push_back(
        Value::make_dict({{"role", Value::str(m.role)}, {"content", Value::str(m.content)}}));
  std::map<std::string, Value> globals = {
      {"messages", Value::make_list(std::move(list))},
      {"add_generation_prompt", Value::boolean(add_generation_prompt)},
      {"tools", Value::none()},
      {"documents", Value::none()},
  };
  // transformers passes the special tokens that are set (an unset one is undefined).
  const std::pair<const char*, const std::string*> specials[] = {{"bos_token", &tokens_.bos},
                                                                 {"eos_token", &tokens_.eos},
                                                                 {"unk_token", &tokens_.unk},
                                                                 {"pad_token", &tokens_.pad}};
  for (const auto& [name, text] : specials)
    if (!text->empty()) globals[name] = Value::str(*text);
  std::string out;
  Renderer(std::move(globals), limits).run(program_->body, out);
  return out;
}

}  // namespace mammoth::data
