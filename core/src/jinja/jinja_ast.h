// Tokens and syntax tree of a Jinja template (internal to the interpreter).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "jinja_value.h"

namespace tessera::jinja {

enum class Tok : uint8_t { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type;
  std::string text;  // data text, name, decoded string literal, operator, number spelling
  int line = 1;
};

// Splits a template into tokens the way Jinja2's lexer does with trim_blocks and lstrip_blocks on:
// comments vanish, `{%-`/`-%}` strip whitespace, a block tag's first newline after it is dropped,
// the spaces before a block tag alone on its line are dropped, the source's last newline is dropped.
std::vector<Token> tokenize(std::string_view source, const std::string& name);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind : uint8_t {
  literal,    // value
  name,       // name
  list,       // items
  tuple,      // items
  dict,       // items: key, value, key, value...
  getattr,    // items[0] . name
  getitem,    // items[0] [ items[1] ]
  slice,      // items[0] [ items[1] : items[2] : items[3] ] (null parts absent)
  call,       // items[0] ( args )
  filter,     // name, items[0] = operand (null in a filter block), args
  test,       // name, items[0] = operand, args; negated
  unary,      // op: "-", "+", "not"; items[0]
  binary,     // op; items[0], items[1] ("and"/"or" short-circuit)
  compare,    // items[0] then ops[k] items[k+1]
  concat,     // items joined with ~
  condexpr,   // items[0] if items[1] else items[2] (may be null)
};

struct Args {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
  ExprPtr star, star_star;  // *args, **kwargs
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter/test name, or the operator
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;
  Args args;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind : uint8_t {
  text,       // text
  output,     // exprs[0]
  if_,        // exprs[0] ? body : else_body (elif becomes a nested if)
  for_,       // targets in exprs[0] [if exprs[1]]: body, else_body
  set,        // targets = exprs[0]; or attr (namespace) set; or block set (body, filter exprs[1])
  macro,      // name(params) body
  call_block, // caller(params) body; exprs[0] is the call
  filter_block,  // exprs[0] is the filter chain applied to body's text
  with,       // targets = exprs, body
  break_,
  continue_,
  scope,      // body rendered in place (generation blocks)
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  std::vector<ExprPtr> exprs;
  std::vector<std::string> targets;
  std::string attr;  // set ns.attr
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro/call parameters and defaults
  std::string name;
};

struct Program {
  std::string name;
  Body body;
};

// Builds the tree; throws RenderFailure-free tessera::Error naming the construct and line.
std::shared_ptr<Program> parse_template(std::string_view source, const std::string& name);

}  // namespace tessera::jinja
