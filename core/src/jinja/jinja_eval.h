// The tree-walking evaluator and the builtins it dispatches to (filters, tests, Python methods).
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "jinja_ast.h"

namespace tessera::jinja {

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;

struct Scope {
  std::unordered_map<std::string, Value> vars;
  ScopePtr parent;
  const Value* lookup(const std::string& name) const;
};

struct EvalOptions {
  std::optional<std::time_t> now;  // strftime_now's time (UTC); unset: the local clock
};

class Evaluator {
 public:
  Evaluator(const Program& program, EvalOptions options) : program_(program), options_(std::move(options)) {}

  // Renders with `context` (a dict) as the template's variables; throws tessera::Error.
  std::string render(const Value& context);

  Value eval(const Expr& e, const ScopePtr& scope);
  Value call(const Value& fn, CallArgs& args);
  Value filter(const std::string& name, const Value& operand, CallArgs& args);
  bool test(const std::string& name, const Value& operand, CallArgs& args);
  // Jinja's environment.getattr (`x.name`) and getitem (`x[key]`).
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);

 private:
  enum class Flow { normal, break_, continue_ };
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_set(const Stmt& s, const ScopePtr& scope);
  Value make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name);
  void eval_args(const Args& a, const ScopePtr& scope, CallArgs& out);
  Value eval_binary(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  Value eval_slice(const Expr& e, const ScopePtr& scope);
  ScopePtr make_globals();

  const Program& program_;
  EvalOptions options_;
  int line_ = 0;  // the line being evaluated, for error messages
  int depth_ = 0;  // macro call depth, bounded
  // Scopes that hold a macro: the macro's closure holds its scope, a reference cycle that render()
  // breaks when it returns (or throws) by clearing these scopes' variables.
  std::vector<ScopePtr> macro_scopes_;
};

// Builtin filters, tests and methods (jinja_filters.cpp, jinja_methods.cpp). Each fails with a
// RenderFailure naming itself when given arguments it cannot take.
Value apply_filter(Evaluator& ev, const std::string& name, const Value& operand, CallArgs& args);
bool apply_test(Evaluator& ev, const std::string& name, const Value& operand, CallArgs& args);
// A bound method of a str, dict or list (`s.strip`, `d.items`...); undefined when there is none.
std::optional<Value> bound_method(const Value& obj, const std::string& name);
// Python's binary + - * / // % ** on values (Markup concatenation included).
Value arithmetic(const std::string& op, const Value& a, const Value& b);
// Attribute path "a.b.0" of an item, as selectattr/map/sort/... take it.
Value attribute_path(Evaluator& ev, const Value& item, const Value& path);
// str % args (printf-style formatting, for the `format` filter and the % operator on strings).
std::string percent_format(const std::string& fmt, const Value& args);
// str.format(*args, **kwargs).
std::string brace_format(const std::string& fmt, const CallArgs& args);

}  // namespace tessera::jinja
