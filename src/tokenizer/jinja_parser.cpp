// Lexer and recursive-descent parser of the Jinja subset. Template preprocessing follows
// @huggingface/jinja (drop one trailing newline, lstrip_blocks, trim_blocks) so both render the
// same text; {%- -%} and {{- -}} strip whitespace as Jinja does.
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_ast.h"

namespace tokenizer::jinja {
namespace {

using common::Result;
using common::Status;

enum class TokKind {
  kText,
  kExprOpen,
  kExprClose,
  kStmtOpen,
  kStmtClose,
  kName,
  kNumber,
  kString,
  kOp,
  kEnd
};

struct Token {
  TokKind kind;
  std::string text;
  int line;
  nlohmann::json number;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  Result<std::vector<Token>> run() {
    while (pos_ < src_.size()) {
      size_t open = src_.find('{', pos_);
      while (open != std::string::npos && open + 1 < src_.size() && src_[open + 1] != '{' &&
             src_[open + 1] != '%' && src_[open + 1] != '#') {
        open = src_.find('{', open + 1);
      }
      if (open == std::string::npos || open + 1 >= src_.size()) {
        add_text(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      add_text(src_.substr(pos_, open - pos_));
      pos_ = open;
      const char kind = src_[open + 1];
      pos_ += 2;
      const bool strip_before = pos_ < src_.size() && src_[pos_] == '-';
      if (strip_before || (pos_ < src_.size() && src_[pos_] == '+')) ++pos_;
      if (strip_before) strip_last_text();
      if (kind == '#') {
        size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) return error("unterminated comment");
        count_lines(pos_, end);
        strip_next_ = end > pos_ && src_[end - 1] == '-';
        pos_ = end + 2;
        continue;
      }
      tokens_.push_back({kind == '{' ? TokKind::kExprOpen : TokKind::kStmtOpen, "", line_, {}});
      CP_RETURN_IF_ERROR(lex_tag(kind == '{' ? "}}" : "%}"));
    }
    tokens_.push_back({TokKind::kEnd, "", line_, {}});
    return std::move(tokens_);
  }

 private:
  Status error(const std::string& what) const {
    return common::invalid_argument("chat template syntax error at line " + std::to_string(line_) +
                                    ": " + what);
  }
  void count_lines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }
  void add_text(std::string text) {
    const int start_line = line_;
    for (char c : text) line_ += c == '\n';
    if (strip_next_) {
      size_t i = 0;
      while (i < text.size() && is_space(text[i])) ++i;
      text.erase(0, i);
      strip_next_ = false;
    }
    if (!text.empty()) tokens_.push_back({TokKind::kText, std::move(text), start_line, {}});
  }
  void strip_last_text() {
    if (tokens_.empty() || tokens_.back().kind != TokKind::kText) return;
    std::string& t = tokens_.back().text;
    while (!t.empty() && is_space(t.back())) t.pop_back();
    if (t.empty()) tokens_.pop_back();
  }

  Status lex_tag(const std::string& close) {
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) line_ += src_[pos_++] == '\n';
      if (pos_ >= src_.size()) return error("unterminated tag, expected '" + close + "'");
      if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
        strip_next_ = true;
        pos_ += 3;
        break;
      }
      if (src_.compare(pos_, 2, close) == 0) {
        pos_ += 2;
        break;
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = pos_;
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        tokens_.push_back({TokKind::kName, src_.substr(b, pos_ - b), line_, {}});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t b = pos_;
        while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
        bool is_float = false;
        if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
          is_float = true;
          ++pos_;
          while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
        }
        const std::string num = src_.substr(b, pos_ - b);
        Token t{TokKind::kNumber, num, line_, {}};
        // strtod / from_chars, not std::stod / stoll: a literal out of range (the template may
        // come with a request) is a syntax error, not an exception.
        if (is_float) {
          errno = 0;
          const double x = std::strtod(num.c_str(), nullptr);
          if (errno == ERANGE) return error("number " + num + " is out of range");
          t.number = x;
        } else {
          int64_t x = 0;
          const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), x);
          if (ec != std::errc()) return error("integer " + num + " is out of range");
          t.number = x;
        }
        tokens_.push_back(std::move(t));
      } else if (c == '\'' || c == '"') {
        std::string s;
        ++pos_;
        while (pos_ < src_.size() && src_[pos_] != c) {
          char ch = src_[pos_++];
          if (ch == '\\' && pos_ < src_.size()) {
            const char e = src_[pos_++];
            switch (e) {
              case 'n':
                s += '\n';
                break;
              case 't':
                s += '\t';
                break;
              case 'r':
                s += '\r';
                break;
              case 'b':
                s += '\b';
                break;
              case 'f':
                s += '\f';
                break;
              case 'v':
                s += '\v';
                break;
              case '\\':
                s += '\\';
                break;
              case '\'':
                s += '\'';
                break;
              case '"':
                s += '"';
                break;
              default:
                s += '\\';
                s += e;
            }
          } else {
            line_ += ch == '\n';
            s += ch;
          }
        }
        if (pos_ >= src_.size()) return error("unterminated string literal");
        ++pos_;
        tokens_.push_back({TokKind::kString, std::move(s), line_, {}});
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[",
                                     "]",  "{",  "}",  ".",  ",",  ":",  "|", "~", "+",
                                     "-",  "*",  "/",  "%",  "<",  ">",  "="};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::char_traits<char>::length(op);
          if (src_.compare(pos_, n, op) == 0) {
            tokens_.push_back({TokKind::kOp, op, line_, {}});
            pos_ += n;
            found = true;
            break;
          }
        }
        if (!found) return error(std::string("unexpected character '") + c + "'");
      }
    }
    tokens_.push_back({close == "}}" ? TokKind::kExprClose : TokKind::kStmtClose, "", line_, {}});
    return {};
  }

  const std::string& src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool strip_next_ = false;
  std::vector<Token> tokens_;
};

// The tree's nesting is bounded: parsing, rendering and freeing it all recurse over it, and a
// template may come with a request (--trust-request-chat-template) or an unknown checkpoint.
// Each recursive descent and each node wrapped around another counts one level.
constexpr int kMaxNesting = 200;

// Levels entered by one parser function, given back when it returns.
class Nesting {
 public:
  explicit Nesting(int* depth) : depth_(depth) {}
  ~Nesting() { *depth_ -= entered_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;
  bool enter() {
    ++entered_;
    return ++*depth_ <= kMaxNesting;
  }

 private:
  int* depth_;
  int entered_ = 0;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Result<std::unique_ptr<Node>> parse_template() {
    auto root = std::make_unique<Node>(NodeKind::kBlock, 1);
    std::string stop;
    CP_RETURN_IF_ERROR(parse_body(root.get(), {}, &stop));
    if (!stop.empty()) return error("unexpected '{% " + stop + " %}'");
    return root;
  }

 private:
  using NodePtr = std::unique_ptr<Node>;

  const Token& peek(int ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  Status error(const std::string& what) const {
    return common::invalid_argument("chat template syntax error at line " +
                                    std::to_string(peek().line) + ": " + what);
  }
  bool is_op(const char* op, int ahead = 0) const {
    return peek(ahead).kind == TokKind::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, int ahead = 0) const {
    return peek(ahead).kind == TokKind::kName && peek(ahead).text == name;
  }
  Status expect_op(const char* op) {
    if (!is_op(op)) return error(std::string("expected '") + op + "'");
    ++i_;
    return {};
  }
  Status expect_close() {
    if (peek().kind != TokKind::kStmtClose) return error("expected '%}'");
    ++i_;
    return {};
  }
  Status too_deep() const {
    return error("nesting deeper than " + std::to_string(kMaxNesting) + " levels");
  }

  // Parses statements until one of `stops` ({% name %}), whose name goes to *stop.
  Status parse_body(Node* block, const std::vector<std::string>& stops, std::string* stop) {
    Nesting nesting(&depth_);
    if (!nesting.enter()) return too_deep();
    while (true) {
      const Token& tok = peek();
      if (tok.kind == TokKind::kEnd) {
        if (!stops.empty())
          return error("unexpected end of template, expected '{% " + stops.back() + " %}'");
        return {};
      }
      if (tok.kind == TokKind::kText) {
        auto n = std::make_unique<Node>(NodeKind::kText, tok.line);
        n->text = tok.text;
        block->children.push_back(std::move(n));
        ++i_;
      } else if (tok.kind == TokKind::kExprOpen) {
        ++i_;
        auto n = std::make_unique<Node>(NodeKind::kOutput, tok.line);
        CP_ASSIGN_OR_RETURN(auto e, expression());
        n->children.push_back(std::move(e));
        if (peek().kind != TokKind::kExprClose) return error("expected '}}'");
        ++i_;
        block->children.push_back(std::move(n));
      } else if (tok.kind == TokKind::kStmtOpen) {
        ++i_;
        if (peek().kind != TokKind::kName) return error("expected a statement name");
        const std::string name = peek().text;
        for (const auto& s : stops) {
          if (s == name) {
            ++i_;
            *stop = name;
            return {};
          }
        }
        ++i_;
        if (name == "if") {
          CP_ASSIGN_OR_RETURN(auto n, parse_if());
          block->children.push_back(std::move(n));
        } else if (name == "for") {
          CP_ASSIGN_OR_RETURN(auto n, parse_for());
          block->children.push_back(std::move(n));
        } else if (name == "set") {
          CP_ASSIGN_OR_RETURN(auto n, parse_set());
          block->children.push_back(std::move(n));
        } else if (stops.empty() &&
                   (name == "endif" || name == "endfor" || name == "else" || name == "elif")) {
          return error("unexpected '{% " + name + " %}'");
        } else if (!stops.empty() &&
                   (name == "endif" || name == "endfor" || name == "else" || name == "elif")) {
          return error("unexpected '{% " + name + " %}', expected '{% " + stops.back() + " %}'");
        } else {
          return error("unsupported tag '" + name + "'");
        }
      } else {
        return error("unexpected token");
      }
    }
  }

  Result<NodePtr> parse_if() {
    auto n = std::make_unique<Node>(NodeKind::kIf, peek().line);
    while (true) {
      CP_ASSIGN_OR_RETURN(auto cond, expression());
      CP_RETURN_IF_ERROR(expect_close());
      auto body = std::make_unique<Node>(NodeKind::kBlock, peek().line);
      std::string stop;
      CP_RETURN_IF_ERROR(parse_body(body.get(), {"elif", "else", "endif"}, &stop));
      n->children.push_back(std::move(cond));
      n->children.push_back(std::move(body));
      if (stop == "elif") continue;
      if (stop == "else") {
        CP_RETURN_IF_ERROR(expect_close());
        auto else_body = std::make_unique<Node>(NodeKind::kBlock, peek().line);
        CP_RETURN_IF_ERROR(parse_body(else_body.get(), {"endif"}, &stop));
        n->children.push_back(std::move(else_body));
        n->has_else = true;
      }
      CP_RETURN_IF_ERROR(expect_close());
      return n;
    }
  }

  Result<NodePtr> parse_for() {
    auto n = std::make_unique<Node>(NodeKind::kFor, peek().line);
    do {
      if (peek().kind != TokKind::kName || peek().text == "in")
        return error("expected a loop variable");
      n->names.push_back(peek().text);
      ++i_;
    } while (is_op(",") && ++i_);
    if (!is_name("in")) return error("expected 'in'");
    ++i_;
    CP_ASSIGN_OR_RETURN(auto iterable, or_expr());
    n->children.push_back(std::move(iterable));
    NodePtr filter;
    if (is_name("if")) {
      ++i_;
      CP_ASSIGN_OR_RETURN(filter, expression());
    }
    CP_RETURN_IF_ERROR(expect_close());
    auto body = std::make_unique<Node>(NodeKind::kBlock, peek().line);
    std::string stop;
    CP_RETURN_IF_ERROR(parse_body(body.get(), {"else", "endfor"}, &stop));
    n->children.push_back(std::move(body));
    n->children.push_back(std::move(filter));
    if (stop == "else") {
      CP_RETURN_IF_ERROR(expect_close());
      auto else_body = std::make_unique<Node>(NodeKind::kBlock, peek().line);
      CP_RETURN_IF_ERROR(parse_body(else_body.get(), {"endfor"}, &stop));
      n->children.push_back(std::move(else_body));
      n->has_else = true;
    }
    CP_RETURN_IF_ERROR(expect_close());
    return n;
  }

  Result<NodePtr> parse_set() {
    auto n = std::make_unique<Node>(NodeKind::kSet, peek().line);
    if (peek().kind != TokKind::kName) return error("expected a variable name after 'set'");
    n->names.push_back(peek().text);
    ++i_;
    if (is_op(".")) {
      ++i_;
      if (peek().kind != TokKind::kName) return error("expected an attribute name");
      n->names.push_back(peek().text);
      ++i_;
    }
    if (!is_op("=")) return error("expected '=' in set (block set is not supported)");
    ++i_;
    CP_ASSIGN_OR_RETURN(auto value, expression());
    n->children.push_back(std::move(value));
    CP_RETURN_IF_ERROR(expect_close());
    return n;
  }

  // expression := or_expr ['if' or_expr ['else' expression]]
  Result<NodePtr> expression() {
    Nesting nesting(&depth_);
    if (!nesting.enter()) return too_deep();
    CP_ASSIGN_OR_RETURN(auto value, or_expr());
    if (!is_name("if")) return value;
    const int line = peek().line;
    ++i_;
    CP_ASSIGN_OR_RETURN(auto cond, or_expr());
    NodePtr otherwise;
    if (is_name("else")) {
      ++i_;
      CP_ASSIGN_OR_RETURN(otherwise, expression());
    }
    auto n = std::make_unique<Node>(NodeKind::kTernary, line);
    n->children.push_back(std::move(value));
    n->children.push_back(std::move(cond));
    n->children.push_back(std::move(otherwise));
    return n;
  }

  NodePtr binary(const std::string& op, NodePtr a, NodePtr b, int line) {
    auto n = std::make_unique<Node>(NodeKind::kBinary, line);
    n->text = op;
    n->children.push_back(std::move(a));
    n->children.push_back(std::move(b));
    return n;
  }

  Result<NodePtr> or_expr() {
    Nesting nesting(&depth_);
    CP_ASSIGN_OR_RETURN(auto left, and_expr());
    while (is_name("or")) {
      const int line = peek().line;
      ++i_;
      CP_ASSIGN_OR_RETURN(auto right, and_expr());
      if (!nesting.enter()) return too_deep();
      left = binary("or", std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<NodePtr> and_expr() {
    Nesting nesting(&depth_);
    CP_ASSIGN_OR_RETURN(auto left, not_expr());
    while (is_name("and")) {
      const int line = peek().line;
      ++i_;
      CP_ASSIGN_OR_RETURN(auto right, not_expr());
      if (!nesting.enter()) return too_deep();
      left = binary("and", std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<NodePtr> not_expr() {
    Nesting nesting(&depth_);
    if (is_name("not")) {
      if (!nesting.enter()) return too_deep();
      auto n = std::make_unique<Node>(NodeKind::kUnary, peek().line);
      ++i_;
      n->text = "not";
      CP_ASSIGN_OR_RETURN(auto operand, not_expr());
      n->children.push_back(std::move(operand));
      return n;
    }
    return compare();
  }

  Result<NodePtr> compare() {
    Nesting nesting(&depth_);
    CP_ASSIGN_OR_RETURN(auto left, additive());
    while (true) {
      const int line = peek().line;
      std::string op;
      if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=")) {
        op = peek().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        i_ += 2;
      } else {
        return left;
      }
      CP_ASSIGN_OR_RETURN(auto right, additive());
      if (!nesting.enter()) return too_deep();
      left = binary(op, std::move(left), std::move(right), line);
    }
  }

  Result<NodePtr> additive() {
    Nesting nesting(&depth_);
    CP_ASSIGN_OR_RETURN(auto left, multiplicative());
    while (is_op("+") || is_op("-") || is_op("~")) {
      const std::string op = peek().text;
      const int line = peek().line;
      ++i_;
      CP_ASSIGN_OR_RETURN(auto right, multiplicative());
      if (!nesting.enter()) return too_deep();
      left = binary(op, std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<NodePtr> multiplicative() {
    Nesting nesting(&depth_);
    CP_ASSIGN_OR_RETURN(auto left, unary());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = peek().text;
      const int line = peek().line;
      ++i_;
      CP_ASSIGN_OR_RETURN(auto right, unary());
      if (!nesting.enter()) return too_deep();
      left = binary(op, std::move(left), std::move(right), line);
    }
    return left;
  }

  Result<NodePtr> unary() {
    Nesting nesting(&depth_);
    if (is_op("-") || is_op("+")) {
      if (!nesting.enter()) return too_deep();
      auto n = std::make_unique<Node>(NodeKind::kUnary, peek().line);
      n->text = peek().text;
      ++i_;
      CP_ASSIGN_OR_RETURN(auto operand, unary());
      n->children.push_back(std::move(operand));
      return n;
    }
    return filtered();
  }

  // postfix ('|' filter | 'is' ['not'] test)*
  Result<NodePtr> filtered() {
    Nesting nesting(&depth_);
    CP_ASSIGN_OR_RETURN(auto operand, postfix());
    while (true) {
      if ((is_op("|") || is_name("is")) && !nesting.enter()) return too_deep();
      if (is_op("|")) {
        ++i_;
        if (peek().kind != TokKind::kName) return error("expected a filter name after '|'");
        auto n = std::make_unique<Node>(NodeKind::kFilter, peek().line);
        n->text = peek().text;
        ++i_;
        n->children.push_back(std::move(operand));
        if (is_op("(")) CP_RETURN_IF_ERROR(call_args(n.get()));
        operand = std::move(n);
      } else if (is_name("is")) {
        ++i_;
        auto n = std::make_unique<Node>(NodeKind::kTest, peek().line);
        if (is_name("not")) {
          n->negated = true;
          ++i_;
        }
        if (peek().kind != TokKind::kName) return error("expected a test name after 'is'");
        n->text = peek().text;
        ++i_;
        n->children.push_back(std::move(operand));
        if (is_op("(")) {
          CP_RETURN_IF_ERROR(call_args(n.get()));
        } else if (peek().kind == TokKind::kString || peek().kind == TokKind::kNumber) {
          CP_ASSIGN_OR_RETURN(auto arg, primary());
          n->children.push_back(std::move(arg));
        }
        operand = std::move(n);
      } else {
        return operand;
      }
    }
  }

  // '(' args ')' appended to n->children (kwargs last, named in kwarg_names).
  Status call_args(Node* n) {
    CP_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (peek().kind == TokKind::kName && is_op("=", 1)) {
        n->kwarg_names.push_back(peek().text);
        i_ += 2;
      } else if (!n->kwarg_names.empty()) {
        return error("positional argument after keyword argument");
      }
      CP_ASSIGN_OR_RETURN(auto arg, expression());
      n->children.push_back(std::move(arg));
      if (!is_op(",")) break;
      ++i_;
    }
    return expect_op(")");
  }

  Result<NodePtr> postfix() {
    Nesting nesting(&depth_);
    CP_ASSIGN_OR_RETURN(auto node, primary());
    while (true) {
      const int line = peek().line;
      if ((is_op(".") || is_op("[") || is_op("(")) && !nesting.enter()) return too_deep();
      if (is_op(".")) {
        ++i_;
        if (peek().kind != TokKind::kName && peek().kind != TokKind::kNumber)
          return error("expected an attribute name after '.'");
        auto n = std::make_unique<Node>(NodeKind::kGetAttr, line);
        n->text = peek().text;
        ++i_;
        n->children.push_back(std::move(node));
        node = std::move(n);
      } else if (is_op("[")) {
        ++i_;
        NodePtr parts[3];
        int colons = 0;
        while (true) {
          if (is_op(":")) {
            if (++colons > 2) return error("too many ':' in slice");
            ++i_;
            continue;
          }
          if (is_op("]")) break;
          CP_ASSIGN_OR_RETURN(parts[colons], expression());
        }
        ++i_;
        if (colons == 0) {
          if (!parts[0]) return error("empty subscript");
          auto n = std::make_unique<Node>(NodeKind::kGetItem, line);
          n->children.push_back(std::move(node));
          n->children.push_back(std::move(parts[0]));
          node = std::move(n);
        } else {
          auto n = std::make_unique<Node>(NodeKind::kSlice, line);
          n->children.push_back(std::move(node));
          for (auto& p : parts) n->children.push_back(std::move(p));
          node = std::move(n);
        }
      } else if (is_op("(")) {
        auto n = std::make_unique<Node>(NodeKind::kCall, line);
        n->children.push_back(std::move(node));
        CP_RETURN_IF_ERROR(call_args(n.get()));
        node = std::move(n);
      } else {
        return node;
      }
    }
  }

  Result<NodePtr> primary() {
    const Token& tok = peek();
    const int line = tok.line;
    if (tok.kind == TokKind::kString) {
      auto n = std::make_unique<Node>(NodeKind::kLiteral, line);
      std::string s = tok.text;
      ++i_;
      while (peek().kind == TokKind::kString) s += peek().text, ++i_;  // adjacent literals join
      n->value = s;
      return n;
    }
    if (tok.kind == TokKind::kNumber) {
      auto n = std::make_unique<Node>(NodeKind::kLiteral, line);
      n->value = tok.number;
      ++i_;
      return n;
    }
    if (tok.kind == TokKind::kName) {
      ++i_;
      auto n = std::make_unique<Node>(NodeKind::kLiteral, line);
      if (tok.text == "true" || tok.text == "True") {
        n->value = true;
      } else if (tok.text == "false" || tok.text == "False") {
        n->value = false;
      } else if (tok.text == "none" || tok.text == "None") {
        n->value = nullptr;
      } else {
        n->kind = NodeKind::kName;
        n->text = tok.text;
      }
      return n;
    }
    if (is_op("(")) {
      ++i_;
      CP_ASSIGN_OR_RETURN(auto inner, expression());
      if (is_op(",")) {  // tuple: treated as a list
        auto list = std::make_unique<Node>(NodeKind::kList, line);
        list->children.push_back(std::move(inner));
        while (is_op(",")) {
          ++i_;
          if (is_op(")")) break;
          CP_ASSIGN_OR_RETURN(auto item, expression());
          list->children.push_back(std::move(item));
        }
        inner = std::move(list);
      }
      CP_RETURN_IF_ERROR(expect_op(")"));
      return inner;
    }
    if (is_op("[")) {
      ++i_;
      auto n = std::make_unique<Node>(NodeKind::kList, line);
      while (!is_op("]")) {
        CP_ASSIGN_OR_RETURN(auto item, expression());
        n->children.push_back(std::move(item));
        if (!is_op(",")) break;
        ++i_;
      }
      CP_RETURN_IF_ERROR(expect_op("]"));
      return n;
    }
    if (is_op("{")) {
      ++i_;
      auto n = std::make_unique<Node>(NodeKind::kDict, line);
      while (!is_op("}")) {
        CP_ASSIGN_OR_RETURN(auto key, expression());
        CP_RETURN_IF_ERROR(expect_op(":"));
        CP_ASSIGN_OR_RETURN(auto value, expression());
        n->children.push_back(std::move(key));
        n->children.push_back(std::move(value));
        if (!is_op(",")) break;
        ++i_;
      }
      CP_RETURN_IF_ERROR(expect_op("}"));
      return n;
    }
    if (tok.kind == TokKind::kExprClose || tok.kind == TokKind::kStmtClose)
      return error("expected an expression");
    return error("unexpected '" + tok.text + "'");
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;  // levels of nesting entered (Nesting)
};

}  // namespace

Template::~Template() = default;

// One pass per rule, in the order @huggingface/jinja applies its two regular expressions
// (std::regex, which this used, recursed once per character and overflowed the stack on a long
// run of spaces).
std::string strip_block_whitespace(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  auto opens_block = [&](size_t i) {
    return i + 1 < s.size() && s[i] == '{' &&
           (s[i + 1] == '%' || s[i + 1] == '#' || s[i + 1] == '-');
  };
  // lstrip_blocks: from where a line starts, past spaces and tabs, when a block opens there.
  auto past_indent = [&](size_t line) {
    size_t i = line;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    return opens_block(i) ? i : line;
  };
  std::string lstripped;
  lstripped.reserve(s.size());
  for (size_t i = past_indent(0); i < s.size();) {
    lstripped += s[i];
    i = s[i] == '\n' ? past_indent(i + 1) : i + 1;
  }
  // trim_blocks: a newline right after a block closes.
  std::string out;
  out.reserve(lstripped.size());
  for (size_t i = 0; i < lstripped.size(); ++i) {
    const bool after_close =
        i >= 2 && lstripped[i - 1] == '}' &&
        (lstripped[i - 2] == '%' || lstripped[i - 2] == '#' || lstripped[i - 2] == '-');
    if (lstripped[i] == '\n' && after_close) continue;
    out += lstripped[i];
  }
  return out;
}

Result<std::unique_ptr<Template>> Template::parse(const std::string& source) {
  const std::string src = strip_block_whitespace(source);
  Lexer lexer(src);
  CP_ASSIGN_OR_RETURN(auto tokens, lexer.run());
  Parser parser(std::move(tokens));
  CP_ASSIGN_OR_RETURN(auto root, parser.parse_template());
  std::unique_ptr<Template> t(new Template());
  t->root_ = std::move(root);
  return t;
}

}  // namespace tokenizer::jinja
