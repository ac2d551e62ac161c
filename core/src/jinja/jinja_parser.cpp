// Jinja2's grammar (jinja2/parser.py): statements, then expressions by precedence, lowest first:
// a if b else c, or, and, not, comparisons (in, not in), + -, ~, * / // %, **, unary - +, then
// postfix . [] () and the filter/test chain | and is.
#include <set>

#include "jinja_ast.h"
#include "tessera/error.h"

namespace tessera::jinja {

namespace {

ExprPtr make(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

StmtPtr make_stmt(StmtKind kind, int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->line = line;
  return s;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string name) : t_(std::move(tokens)), name_(std::move(name)) {}

  Body parse_all() {
    std::string which;
    Body body = parse_body({}, &which);
    return body;
  }

 private:
  const Token& cur() const { return t_[k_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(k_ + n, t_.size() - 1)]; }
  void next() {
    if (k_ + 1 < t_.size()) ++k_;
  }
  bool is_name(const char* s) const { return cur().type == Tok::name && cur().text == s; }
  bool is_op(const char* s) const { return cur().type == Tok::op && cur().text == s; }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::data: return "text";
      case Tok::var_begin: return "'{{'";
      case Tok::var_end: return "end of print statement '}}'";
      case Tok::block_begin: return "'{%'";
      case Tok::block_end: return "end of statement block '%}'";
      case Tok::eof: return "end of template";
      case Tok::string: return "string literal";
      default: return "'" + t.text + "'";
    }
  }

  [[noreturn]] void error(const std::string& what, int line) const {
    throw Error("template '" + name_ + "' line " + std::to_string(line) + ": " + what);
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    error("unexpected " + describe(cur()) + ", expected " + expected, cur().line);
  }

  void expect_op(const char* s) {
    if (!is_op(s)) unexpected(std::string("'") + s + "'");
    next();
  }
  void expect_block_end() {
    if (cur().type != Tok::block_end) unexpected("end of statement block '%}'");
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::name) unexpected("a name");
    std::string n = cur().text;
    next();
    return n;
  }

  // Statements up to a {% tag %} named in `ends`; leaves the stream after that tag's name.
  Body parse_body(const std::set<std::string>& ends, std::string* which) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::eof) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "'" : " or '") + e + "'";
          error("unexpected end of template, expected " + list + " (an unclosed block)", tk.line);
        }
        return body;
      }
      if (tk.type == Tok::data) {
        auto s = make_stmt(StmtKind::text, tk.line);
        s->text = tk.text;
        body.push_back(std::move(s));
        next();
      } else if (tk.type == Tok::var_begin) {
        next();
        auto s = make_stmt(StmtKind::output, tk.line);
        s->exprs.push_back(parse_tuple(true, {}, false));
        if (cur().type != Tok::var_end) unexpected("end of print statement '}}'");
        next();
        body.push_back(std::move(s));
      } else if (tk.type == Tok::block_begin) {
        next();
        if (cur().type == Tok::name && ends.count(cur().text) != 0) {
          *which = cur().text;
          next();
          return body;
        }
        body.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& tk = cur();
    if (tk.type != Tok::name) unexpected("a statement name");
    const std::string tag = tk.text;
    const int line = tk.line;
    next();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "call") return parse_call_block(line);
    if (tag == "filter") return parse_filter_block(line);
    if (tag == "with") return parse_with(line);
    if (tag == "break" || tag == "continue") {
      expect_block_end();
      return make_stmt(tag == "break" ? StmtKind::break_ : StmtKind::continue_, line);
    }
    if (tag == "generation") {  // transformers' {% generation %} marks assistant text; renders as is
      expect_block_end();
      auto s = make_stmt(StmtKind::scope, line);
      std::string which;
      s->body = parse_body({"endgeneration"}, &which);
      expect_block_end();
      return s;
    }
    if (tag == "print") {
      auto s = make_stmt(StmtKind::output, line);
      s->exprs.push_back(parse_tuple(true, {}, false));
      expect_block_end();
      return s;
    }
    static const std::set<std::string> unsupported = {"extends", "block", "include", "import", "from", "autoescape",
                                                      "do", "trans"};
    if (unsupported.count(tag) != 0) error("the {% " + tag + " %} tag is not supported in chat templates", line);
    error("unknown tag '" + tag + "'", line);
  }

  StmtPtr parse_if(int line) {
    auto s = make_stmt(StmtKind::if_, line);
    s->exprs.push_back(parse_tuple(false, {}, false));
    expect_block_end();
    std::string which;
    s->body = parse_body({"elif", "else", "endif"}, &which);
    if (which == "elif") {
      s->else_body.push_back(parse_if(t_[k_ - 1].line));
      return s;  // the nested if consumed the endif
    }
    if (which == "else") {
      expect_block_end();
      s->else_body = parse_body({"endif"}, &which);
    }
    expect_block_end();
    return s;
  }

  // A name or a tuple of names (for targets, set targets).
  std::vector<std::string> parse_targets(const char* end_name) {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) next();
    while (true) {
      names.push_back(expect_name());
      if (!is_op(",")) break;
      next();
      if ((end_name != nullptr && is_name(end_name)) || is_op("=") || is_op(")")) break;
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(int line) {
    auto s = make_stmt(StmtKind::for_, line);
    s->targets = parse_targets("in");
    if (!is_name("in")) unexpected("'in'");
    next();
    s->exprs.push_back(parse_tuple(false, {"recursive"}, false));
    if (is_name("if")) {
      next();
      s->exprs.push_back(parse_expression(true));
    }
    if (is_name("recursive")) error("recursive for loops are not supported", cur().line);
    expect_block_end();
    std::string which;
    s->body = parse_body({"endfor", "else"}, &which);
    if (which == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &which);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    auto s = make_stmt(StmtKind::set, line);
    if (cur().type == Tok::name && peek().type == Tok::op && peek().text == ".") {
      s->targets.push_back(expect_name());
      next();
      s->attr = expect_name();
    } else {
      s->targets = parse_targets(nullptr);
    }
    if (is_op("=")) {
      next();
      s->exprs.push_back(parse_tuple(true, {}, false));
      expect_block_end();
      return s;
    }
    if (!s->attr.empty() || s->targets.size() != 1) unexpected("'='");
    s->exprs.push_back(nullptr);
    if (is_op("|")) s->exprs[0] = parse_filters(nullptr, false);
    expect_block_end();
    std::string which;
    s->body = parse_body({"endset"}, &which);
    s->name = "block";
    expect_block_end();
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string n = expect_name();
      ExprPtr def;
      if (is_op("=")) {
        next();
        def = parse_expression(true);
      }
      s.params.emplace_back(std::move(n), std::move(def));
    }
    next();
  }

  StmtPtr parse_macro(int line) {
    auto s = make_stmt(StmtKind::macro, line);
    s->name = expect_name();
    parse_signature(*s);
    expect_block_end();
    std::string which;
    s->body = parse_body({"endmacro"}, &which);
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = make_stmt(StmtKind::call_block, line);
    if (is_op("(")) parse_signature(*s);
    s->exprs.push_back(parse_expression(true));
    if (s->exprs[0]->kind != ExprKind::call) error("{% call %} expects a macro call", line);
    expect_block_end();
    std::string which;
    s->body = parse_body({"endcall"}, &which);
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = make_stmt(StmtKind::filter_block, line);
    s->exprs.push_back(parse_filters(nullptr, true));
    expect_block_end();
    std::string which;
    s->body = parse_body({"endfilter"}, &which);
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(int line) {
    auto s = make_stmt(StmtKind::with, line);
    while (cur().type != Tok::block_end) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(expect_name());
      expect_op("=");
      s->exprs.push_back(parse_expression(true));
    }
    expect_block_end();
    std::string which;
    s->body = parse_body({"endwith"}, &which);
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  bool tuple_end(const std::set<std::string>& extra) const {
    if (cur().type == Tok::var_end || cur().type == Tok::block_end || cur().type == Tok::eof || is_op(")")) return true;
    return cur().type == Tok::name && extra.count(cur().text) != 0;
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::set<std::string>& extra, bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) unexpected("an expression");
    }
    auto e = make(ExprKind::tuple, line);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (is_name("else")) {
        next();
        other = parse_condexpr();
      }
      auto c = make(ExprKind::condexpr, line);
      c->items.push_back(std::move(e));
      c->items.push_back(std::move(cond));
      c->items.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(ExprKind::binary, line);
    e->name = op;
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      next();
      e = binary("or", std::move(e), parse_and(), line);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      next();
      e = binary("and", std::move(e), parse_not(), line);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto e = make(ExprKind::unary, cur().line);
      next();
      e->name = "not";
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        ops.push_back(cur().text);
        next();
      } else if (is_name("in")) {
        ops.push_back("in");
        next();
      } else if (is_name("not") && peek().type == Tok::name && peek().text == "in") {
        ops.push_back("not in");
        next();
        next();
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(ExprKind::compare, line);
    e->items.push_back(std::move(first));
    for (auto& r : rest) e->items.push_back(std::move(r));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      e = binary(op, std::move(e), parse_concat(), line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(ExprKind::concat, line);
    e->items.push_back(std::move(first));
    while (is_op("~")) {
      next();
      e->items.push_back(parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      e = binary(op, std::move(e), parse_pow(), line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      e = binary("**", std::move(e), parse_unary(true), line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(ExprKind::unary, cur().line);
      e->name = cur().text;
      next();
      e->items.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(ExprKind::literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    const int line = tk.line;
    switch (tk.type) {
      case Tok::name: {
        const std::string n = tk.text;
        next();
        if (n == "true" || n == "True") return literal(Value::boolean(true), line);
        if (n == "false" || n == "False") return literal(Value::boolean(false), line);
        if (n == "none" || n == "None") return literal(Value::none(), line);
        auto e = make(ExprKind::name, line);
        e->name = n;
        return e;
      }
      case Tok::string: {
        std::string s;
        while (cur().type == Tok::string) {
          s += cur().text;
          next();
        }
        return literal(Value::string(std::move(s)), line);
      }
      case Tok::integer: {
        const std::string text = tk.text;
        next();
        try {
          return literal(Value::integer(std::stoll(text)), line);
        } catch (const std::exception&) {
          return literal(Value::floating(std::strtod(text.c_str(), nullptr)), line);
        }
      }
      case Tok::floating: {
        const double v = std::strtod(tk.text.c_str(), nullptr);
        next();
        return literal(Value::floating(v), line);
      }
      case Tok::op:
        if (tk.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          next();
          auto e = make(ExprKind::list, line);
          while (!is_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("]")) break;
            e->items.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        if (tk.text == "{") {
          next();
          auto e = make(ExprKind::dict, line);
          while (!is_op("}")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("}")) break;
            e->items.push_back(parse_expression(true));
            expect_op(":");
            e->items.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        break;
      default: break;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filters(std::move(e), false);
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const int line = cur().line;
    if (is_op(".")) {
      next();
      if (cur().type == Tok::name) {
        auto e = make(ExprKind::getattr, line);
        e->name = cur().text;
        next();
        e->items.push_back(std::move(obj));
        return e;
      }
      if (cur().type == Tok::integer) {
        auto e = make(ExprKind::getitem, line);
        e->items.push_back(std::move(obj));
        e->items.push_back(literal(Value::integer(std::stoll(cur().text)), line));
        next();
        return e;
      }
      unexpected("an attribute name");
    }
    next();  // [
    std::vector<ExprPtr> idx;
    ExprPtr slice_expr;
    while (!is_op("]")) {
      if (!idx.empty()) expect_op(",");
      idx.push_back(parse_subscribed());
    }
    next();
    if (idx.size() == 1 && idx[0]->kind == ExprKind::slice) {
      idx[0]->items[0] = std::move(obj);
      return std::move(idx[0]);
    }
    auto e = make(ExprKind::getitem, line);
    e->items.push_back(std::move(obj));
    if (idx.size() == 1) {
      e->items.push_back(std::move(idx[0]));
    } else {
      auto t = make(ExprKind::tuple, line);
      t->items = std::move(idx);
      e->items.push_back(std::move(t));
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    next();
    auto e = make(ExprKind::slice, line);
    e->items.push_back(nullptr);  // the object, filled in by the caller
    e->items.push_back(std::move(start));
    ExprPtr stop, step;
    if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression(true);
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(",")) step = parse_expression(true);
    }
    e->items.push_back(std::move(stop));
    e->items.push_back(std::move(step));
    return e;
  }

  void parse_call_args(Args& a) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*")) {
        next();
        a.star = parse_expression(true);
      } else if (is_op("**")) {
        next();
        a.star_star = parse_expression(true);
      } else if (cur().type == Tok::name && peek().type == Tok::op && peek().text == "=") {
        std::string n = cur().text;
        next();
        next();
        a.kw.emplace_back(std::move(n), parse_expression(true));
      } else {
        a.pos.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr fn) {
    auto e = make(ExprKind::call, cur().line);
    e->items.push_back(std::move(fn));
    parse_call_args(e->args);
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".")) {
      next();
      n += '.';
      n += expect_name();
    }
    return n;
  }

  // `| name(args) | name ...`; with `inline_first` the first filter has no pipe (filter blocks).
  ExprPtr parse_filters(ExprPtr operand, bool inline_first) {
    bool first = inline_first;
    while (first || is_op("|")) {
      if (!first) next();
      first = false;
      auto e = make(ExprKind::filter, cur().line);
      e->name = dotted_name();
      if (is_op("(")) parse_call_args(e->args);
      e->items.push_back(std::move(operand));
      operand = std::move(e);
    }
    return operand;
  }

  ExprPtr parse_test(ExprPtr operand) {
    auto e = make(ExprKind::test, cur().line);
    next();  // is
    if (is_name("not")) {
      next();
      e->negated = true;
    }
    e->name = dotted_name();
    if (is_op("(")) {
      parse_call_args(e->args);
    } else if ((cur().type == Tok::name || cur().type == Tok::string || cur().type == Tok::integer ||
                cur().type == Tok::floating || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error("tests cannot be chained with 'is'", cur().line);
      e->args.pos.push_back(parse_postfix(parse_primary()));
    }
    e->items.push_back(std::move(operand));
    return e;
  }

  std::vector<Token> t_;
  size_t k_ = 0;
  std::string name_;
};

}  // namespace

std::shared_ptr<Program> parse_template(std::string_view source, const std::string& name) {
  auto p = std::make_shared<Program>();
  p->name = name;
  Parser parser(tokenize(source, name), name);
  p->body = parser.parse_all();
  return p;
}

}  // namespace tessera::jinja
