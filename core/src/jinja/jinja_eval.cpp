// Statements and expressions, evaluated as Jinja2's compiled code would: for loops and macros open a
// scope (each loop iteration a fresh one, so `set` in a loop body does not survive it: hence
// namespace()), if/else does not; macros see their defining scope as it is when they are called.
#include <algorithm>
#include <ctime>

#include "jinja_eval.h"
#include "tessera/error.h"

namespace tessera::jinja {

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

namespace {

void unpack(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
  if (targets.size() == 1) {
    scope.vars[targets[0]] = v;
    return;
  }
  const List items = iterate(v);
  if (items.size() != targets.size()) {
    fail(std::string(items.size() > targets.size() ? "too many" : "not enough") + " values to unpack (expected " +
         std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")");
  }
  for (size_t k = 0; k < targets.size(); ++k) scope.vars[targets[k]] = items[k];
}

int64_t to_index(const Value& v) {
  if (v.is_none() || v.is_undefined()) return 0;
  if (v.kind != Kind::integer && v.kind != Kind::boolean) fail("slice indices must be integers or None");
  return v.as_int();
}

}  // namespace

std::string Evaluator::render(const Value& context) {
  const ScopePtr globals = make_globals();
  auto root = std::make_shared<Scope>();
  root->parent = globals;
  if (context.is_dict()) {
    for (const auto& [k, v] : context.dict->items) root->vars[k.str()] = v;
  }
  std::string out;
  struct BreakCycles {
    std::vector<ScopePtr>& scopes;
    ~BreakCycles() {
      for (const ScopePtr& s : scopes) s->vars.clear();
      scopes.clear();
    }
  } break_cycles{macro_scopes_};
  try {
    exec(program_.body, root, out);
  } catch (const RenderFailure& f) {
    throw Error("template '" + program_.name + "' line " + std::to_string(line_) + ": " + f.message);
  }
  return out;
}

ScopePtr Evaluator::make_globals() {
  auto g = std::make_shared<Scope>();
  g->vars["raise_exception"] = Value::function("raise_exception", [](CallArgs& a) -> Value {
    const Value* m = a.get(0, "message");
    fail("the template raised an exception: " + (m != nullptr ? m->str() : std::string()));
  });
  g->vars["strftime_now"] = Value::function("strftime_now", [this](CallArgs& a) {
    const Value* f = a.get(0, "format");
    if (f == nullptr || !f->is_string()) fail("strftime_now(format) expects a format string");
    std::tm tm{};
    if (options_.now) {
      gmtime_r(&*options_.now, &tm);
    } else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, f->s.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
  g->vars["range"] = Value::function("range", [](CallArgs& a) {
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) {
      stop = a.pos[0].as_int();
    } else if (a.pos.size() >= 2) {
      start = a.pos[0].as_int();
      stop = a.pos[1].as_int();
      if (a.pos.size() >= 3) step = a.pos[2].as_int();
    } else {
      fail("range expected at least 1 argument");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    List out;
    for (int64_t v = start; step > 0 ? v < stop : v > stop; v += step) {
      if (out.size() >= 100000) fail("range too big (more than 100000 items)");
      out.push_back(Value::integer(v));
    }
    return Value::make_list(std::move(out));
  });
  auto fill = [](Value& d, CallArgs& a) {
    for (const Value& p : a.pos) {
      if (p.is_dict()) {
        for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
      } else {
        for (const Value& pair : iterate(p)) {
          const List kv = iterate(pair);
          if (kv.size() != 2) fail("dictionary update sequence element has length " + std::to_string(kv.size()));
          d.dict->set(kv[0], kv[1]);
        }
      }
    }
    for (auto& [k, v] : a.kw) d.dict->set(Value::string(k), v);
  };
  g->vars["dict"] = Value::function("dict", [fill](CallArgs& a) {
    Value d = Value::make_dict();
    fill(d, a);
    return d;
  });
  g->vars["namespace"] = Value::function("namespace", [fill](CallArgs& a) {
    Value d = Value::make_namespace();
    fill(d, a);
    return d;
  });
  return g;
}

Evaluator::Flow Evaluator::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const StmtPtr& sp : body) {
    const Stmt& s = *sp;
    line_ = s.line;
    switch (s.kind) {
      case StmtKind::text: out += s.text; break;
      case StmtKind::output: out += eval(*s.exprs[0], scope).str(); break;
      case StmtKind::if_: {
        const Flow f = exec(eval(*s.exprs[0], scope).truthy() ? s.body : s.else_body, scope, out);
        if (f != Flow::normal) return f;
        break;
      }
      case StmtKind::for_: {
        const Flow f = exec_for(s, scope, out);
        (void)f;
        break;
      }
      case StmtKind::set: exec_set(s, scope); break;
      case StmtKind::macro:
        scope->vars[s.name] = make_macro(s, scope, s.name);
        macro_scopes_.push_back(scope);
        break;
      case StmtKind::call_block: {
        const Expr& call = *s.exprs[0];
        Value fn = eval(*call.items[0], scope);
        CallArgs args;
        eval_args(call.args, scope, args);
        args.kw.emplace_back("caller", make_macro(s, scope, "caller"));
        out += this->call(fn, args).str();
        break;
      }
      case StmtKind::filter_block: {
        std::string text;
        exec(s.body, scope, text);
        // The chain's innermost filter has no operand: it takes the block's text.
        std::vector<const Expr*> chain;
        for (const Expr* e = s.exprs[0].get(); e != nullptr; e = e->items[0].get()) chain.push_back(e);
        Value v = Value::string(std::move(text));
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          CallArgs args;
          eval_args((*it)->args, scope, args);
          line_ = (*it)->line;
          v = filter((*it)->name, v, args);
        }
        out += v.str();
        break;
      }
      case StmtKind::with: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (size_t k = 0; k < s.targets.size(); ++k) inner->vars[s.targets[k]] = eval(*s.exprs[k], scope);
        const Flow f = exec(s.body, inner, out);
        if (f != Flow::normal) return f;
        break;
      }
      case StmtKind::break_: return Flow::break_;
      case StmtKind::continue_: return Flow::continue_;
      case StmtKind::scope: {
        const Flow f = exec(s.body, scope, out);
        if (f != Flow::normal) return f;
        break;
      }
    }
  }
  return Flow::normal;
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  const Value seq = eval(*s.exprs[0], scope);
  if (!seq.is_undefined() && !seq.is_list() && !seq.is_dict() && !seq.is_string()) {
    fail(seq.type_name() + " is not iterable (for loop)");
  }
  List items = iterate(seq);
  if (s.exprs.size() > 1) {  // for x in xs if cond
    List kept;
    for (const Value& item : items) {
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      unpack(s.targets, item, *probe);
      if (eval(*s.exprs[1], probe).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    exec(s.else_body, inner, out);
    return Flow::normal;
  }
  const auto n = static_cast<int64_t>(items.size());
  auto last_changed = std::make_shared<std::optional<List>>();
  for (int64_t k = 0; k < n; ++k) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    unpack(s.targets, items[size_t(k)], *inner);
    Value loop = Value::make_dict();
    Dict& d = *loop.dict;
    auto put = [&](const char* key, Value v) { d.items.emplace_back(Value::string(key), std::move(v)); };
    put("index", Value::integer(k + 1));
    put("index0", Value::integer(k));
    put("revindex", Value::integer(n - k));
    put("revindex0", Value::integer(n - k - 1));
    put("first", Value::boolean(k == 0));
    put("last", Value::boolean(k == n - 1));
    put("length", Value::integer(n));
    put("depth", Value::integer(1));
    put("depth0", Value::integer(0));
    if (k > 0) put("previtem", items[size_t(k - 1)]);
    if (k + 1 < n) put("nextitem", items[size_t(k + 1)]);
    put("cycle", Value::function("loop.cycle", [k](CallArgs& a) {
      if (a.pos.empty()) fail("no items for cycling given");
      return a.pos[size_t(k) % a.pos.size()];
    }));
    put("changed", Value::function("loop.changed", [last_changed](CallArgs& a) {
      if (*last_changed && last_changed->value().size() == a.pos.size() &&
          std::equal(a.pos.begin(), a.pos.end(), last_changed->value().begin(), equals)) {
        return Value::boolean(false);
      }
      *last_changed = a.pos;
      return Value::boolean(true);
    }));
    inner->vars["loop"] = std::move(loop);
    const Flow f = exec(s.body, inner, out);
    if (f == Flow::break_) break;
  }
  return Flow::normal;
}

void Evaluator::exec_set(const Stmt& s, const ScopePtr& scope) {
  Value v;
  if (s.name == "block") {
    std::string text;
    exec(s.body, scope, text);
    v = Value::string(std::move(text));
    if (s.exprs[0] != nullptr) {
      std::vector<const Expr*> chain;
      for (const Expr* e = s.exprs[0].get(); e != nullptr; e = e->items[0].get()) chain.push_back(e);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        CallArgs args;
        eval_args((*it)->args, scope, args);
        v = filter((*it)->name, v, args);
      }
    }
  } else {
    v = eval(*s.exprs[0], scope);
  }
  if (!s.attr.empty()) {
    const Value* ns = scope->lookup(s.targets[0]);
    if (ns == nullptr || !ns->is_namespace()) {
      fail("cannot assign attribute '" + s.attr + "' on '" + s.targets[0] + "': only namespace() objects take attributes");
    }
    ns->dict->set(Value::string(s.attr), std::move(v));
    return;
  }
  unpack(s.targets, v, *scope);
}

Value Evaluator::make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name) {
  const Stmt* stmt = &s;
  return Value::function(name, [this, stmt, scope, name](CallArgs& a) {
    if (depth_ > 500) fail("macro '" + name + "' recursed too deeply");
    const int saved_line = line_;
    auto ms = std::make_shared<Scope>();
    ms->parent = scope;
    List varargs;
    Value kwargs = Value::make_dict();
    size_t k = 0;
    for (; k < stmt->params.size(); ++k) {
      const auto& [pname, def] = stmt->params[k];
      const Value* given = nullptr;
      for (const auto& [kn, kv] : a.kw) {
        if (kn == pname) given = &kv;
      }
      if (given == nullptr && k < a.pos.size()) given = &a.pos[k];
      if (given != nullptr) {
        ms->vars[pname] = *given;
      } else if (def != nullptr) {
        ms->vars[pname] = eval(*def, ms);
      } else {
        ms->vars[pname] = Value::undefined("parameter '" + pname + "' was not provided");
      }
    }
    for (; k < a.pos.size(); ++k) varargs.push_back(a.pos[k]);
    for (const auto& [kn, kv] : a.kw) {
      // A named copy for the lambda: clang before 16 cannot capture a structured binding.
      const std::string& name = kn;
      const bool param = std::any_of(stmt->params.begin(), stmt->params.end(), [&](const auto& p) { return p.first == name; });
      if (kn == "caller") {
        ms->vars["caller"] = kv;
      } else if (!param) {
        kwargs.dict->set(Value::string(kn), kv);
      }
    }
    ms->vars["varargs"] = Value::make_list(std::move(varargs));
    ms->vars["kwargs"] = kwargs;
    std::string out;
    ++depth_;
    try {
      exec(stmt->body, ms, out);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    line_ = saved_line;
    return Value::string(std::move(out));
  });
}

void Evaluator::eval_args(const Args& a, const ScopePtr& scope, CallArgs& out) {
  for (const auto& e : a.pos) out.pos.push_back(eval(*e, scope));
  if (a.star) {
    for (const Value& v : iterate(eval(*a.star, scope))) out.pos.push_back(v);
  }
  for (const auto& [k, e] : a.kw) out.kw.emplace_back(k, eval(*e, scope));
  if (a.star_star) {
    const Value d = eval(*a.star_star, scope);
    if (!d.is_dict()) fail("argument after ** must be a mapping");
    for (const auto& [k, v] : d.dict->items) out.kw.emplace_back(k.str(), v);
  }
}

Value Evaluator::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) fn.fail_undefined();
  if (!fn.is_callable()) fail(fn.type_name() + " is not callable");
  return fn.fn->call(args);
}

Value Evaluator::filter(const std::string& name, const Value& operand, CallArgs& args) {
  return apply_filter(*this, name, operand, args);
}

bool Evaluator::test(const std::string& name, const Value& operand, CallArgs& args) {
  return apply_test(*this, name, operand, args);
}

Value Evaluator::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (!name.empty() && name[0] == '_') return Value::undefined("access to attribute '" + name + "' is unsafe");
  if (obj.is_dict()) {
    if (!obj.dict->is_namespace) {
      if (auto m = bound_method(obj, name)) return *m;
    }
    if (const Value* v = obj.dict->find(std::string_view(name))) return *v;
  } else if (auto m = bound_method(obj, name)) {
    return *m;
  }
  return Value::undefined(obj.type_name() + " has no attribute '" + name + "'");
}

Value Evaluator::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_dict()) {
    if (const Value* v = obj.dict->find(key)) return *v;
  } else if (((obj.is_list() && obj.view == nullptr) || obj.is_string()) &&
             (key.kind == Kind::integer || key.kind == Kind::boolean)) {
    const int64_t n = length(obj);
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (obj.is_list()) return (*obj.list)[size_t(i)];
      if (obj.s.size() == size_t(n)) return Value::string(obj.s.substr(size_t(i), 1));
      std::string c;
      append_utf8(c, decode_utf8(obj.s)[size_t(i)]);
      return Value::string(std::move(c));
    }
    return Value::undefined(obj.type_name() + " has no element " + key.repr());
  }
  if (key.is_string()) return get_attr(obj, key.s);
  return Value::undefined(obj.type_name() + " has no element " + key.repr());
}

Value Evaluator::eval_slice(const Expr& e, const ScopePtr& scope) {
  const Value obj = eval(*e.items[0], scope);
  Value parts[3];
  for (int k = 0; k < 3; ++k) {
    if (e.items[size_t(k) + 1]) parts[k] = eval(*e.items[size_t(k) + 1], scope);
  }
  if (obj.is_undefined()) obj.fail_undefined();
  if ((!obj.is_list() && !obj.is_string()) || obj.view != nullptr) {
    return Value::undefined(obj.type_name() + " cannot be sliced");
  }
  const int64_t step = parts[2].is_none() || parts[2].is_undefined() ? 1 : to_index(parts[2]);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<uint32_t> cps;
  if (obj.is_string()) cps = decode_utf8(obj.s);
  const int64_t n = obj.is_list() ? int64_t(obj.list->size()) : int64_t(cps.size());
  auto bound = [&](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = to_index(v);
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = bound(parts[0], step > 0 ? 0 : n - 1);
  const int64_t stop = bound(parts[1], step > 0 ? n : -1);
  List items;
  std::vector<uint32_t> chars;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.is_list()) {
      items.push_back((*obj.list)[size_t(i)]);
    } else {
      chars.push_back(cps[size_t(i)]);
    }
  }
  if (obj.is_string()) return Value::string(encode_utf8(chars), obj.markup);
  return Value::make_list(std::move(items), obj.tuple);
}

Value Evaluator::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.items[0], scope);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.items[k + 1], scope);
    const std::string& op = e.ops[k];
    bool r = false;
    if (op == "==") {
      r = equals(left, right);
    } else if (op == "!=") {
      r = !equals(left, right);
    } else if (op == "in") {
      r = contains(right, left);
    } else if (op == "not in") {
      r = !contains(right, left);
    } else {
      const int c = compare(left, right);
      r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Evaluator::eval_binary(const Expr& e, const ScopePtr& scope) {
  if (e.name == "and") {
    Value a = eval(*e.items[0], scope);
    return a.truthy() ? eval(*e.items[1], scope) : a;
  }
  if (e.name == "or") {
    Value a = eval(*e.items[0], scope);
    return a.truthy() ? a : eval(*e.items[1], scope);
  }
  const Value a = eval(*e.items[0], scope);
  const Value b = eval(*e.items[1], scope);
  line_ = e.line;
  return arithmetic(e.name, a, b);
}

Value Evaluator::eval(const Expr& e, const ScopePtr& scope) {
  line_ = e.line;
  switch (e.kind) {
    case ExprKind::literal: return e.value;
    case ExprKind::name: {
      if (const Value* v = scope->lookup(e.name)) return *v;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::list:
    case ExprKind::tuple: {
      List items;
      for (const auto& it : e.items) items.push_back(eval(*it, scope));
      return Value::make_list(std::move(items), e.kind == ExprKind::tuple);
    }
    case ExprKind::dict: {
      Value d = Value::make_dict();
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        Value key = eval(*e.items[k], scope);
        d.dict->set(key, eval(*e.items[k + 1], scope));
      }
      return d;
    }
    case ExprKind::getattr: {
      const Value obj = eval(*e.items[0], scope);
      line_ = e.line;
      return get_attr(obj, e.name);
    }
    case ExprKind::getitem: {
      const Value obj = eval(*e.items[0], scope);
      const Value key = eval(*e.items[1], scope);
      line_ = e.line;
      return get_item(obj, key);
    }
    case ExprKind::slice: return eval_slice(e, scope);
    case ExprKind::call: {
      const Value fn = eval(*e.items[0], scope);
      CallArgs args;
      eval_args(e.args, scope, args);
      line_ = e.line;
      return call(fn, args);
    }
    case ExprKind::filter: {
      const Value operand = e.items[0] ? eval(*e.items[0], scope) : Value();
      CallArgs args;
      eval_args(e.args, scope, args);
      line_ = e.line;
      return filter(e.name, operand, args);
    }
    case ExprKind::test: {
      const Value operand = eval(*e.items[0], scope);
      CallArgs args;
      eval_args(e.args, scope, args);
      line_ = e.line;
      return Value::boolean(test(e.name, operand, args) != e.negated);
    }
    case ExprKind::unary: {
      const Value v = eval(*e.items[0], scope);
      if (e.name == "not") return Value::boolean(!v.truthy());
      if (v.is_undefined()) v.fail_undefined();
      if (v.kind == Kind::floating) return Value::floating(e.name == "-" ? -v.f : v.f);
      if (v.kind == Kind::integer || v.kind == Kind::boolean) return Value::integer(e.name == "-" ? -v.as_int() : v.as_int());
      fail("bad operand type for unary " + e.name + ": " + v.type_name());
    }
    case ExprKind::binary: return eval_binary(e, scope);
    case ExprKind::compare: return eval_compare(e, scope);
    case ExprKind::concat: {
      std::string s;
      for (const auto& it : e.items) s += eval(*it, scope).str();
      return Value::string(std::move(s));
    }
    case ExprKind::condexpr: {
      if (eval(*e.items[1], scope).truthy()) return eval(*e.items[0], scope);
      if (e.items[2]) return eval(*e.items[2], scope);
      return Value::undefined("the inline if expression evaluated to false and no else section was defined");
    }
  }
  fail("unknown expression");
}

}  // namespace tessera::jinja
