// io/jinja/template.cpp — see template.h. A tree-walking interpreter: scopes as in Jinja2 (each for-loop
// iteration and each macro call opens one; if does not; `set` writes to the innermost), macros as functions over a capture buffer,
// loop.* as Jinja2's LoopContext, the globals of Hugging Face's chat-template environment.
#include "io/jinja/template.h"

#include "io/jinja/builtins.h"
#include "io/jinja/parser.h"

namespace dflash::jinja {

namespace {

constexpr int kMaxDepth = 256;         // nested macro calls
constexpr int64_t kMaxRange = 100000;  // Jinja2's sandbox limit on range()

struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  Scope* parent = nullptr;

  const Value* find(std::string_view n) const {
    for (const Scope* s = this; s; s = s->parent) {
      for (auto it = s->vars.rbegin(); it != s->vars.rend(); ++it)
        if (it->first == n) return &it->second;
    }
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    for (auto& [k, old] : vars) {
      if (k == n) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(n, std::move(v));
  }
};

bool contains_generation(const Body& b) {
  for (const NodeP& n : b) {
    if (n->k == Node::K::Generation) return true;
    if (contains_generation(n->body) || contains_generation(n->else_body)) return true;
    for (const auto& br : n->branches)
      if (contains_generation(br.second)) return true;
  }
  return false;
}

class Interp {
 public:
  Interp(const RenderOptions& o, std::string* top) : opts_(o), out_(top), top_(top) {}

  enum class Flow { Normal, Break, Continue };

  std::vector<std::pair<size_t, size_t>> generation;
  Scope* root = nullptr;

  Flow exec(const Body& body, Scope& sc) {
    for (const NodeP& n : body) {
      Flow f = exec(*n, sc);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Value eval(const Expr& e, Scope& sc);

 private:
  const RenderOptions& opts_;
  std::string* out_;
  std::string* top_;
  int depth_ = 0;

  [[noreturn]] static void fail(int line, const std::string& msg) {
    throw TemplateError(cat("template line ", line, ": ", msg));
  }

  // Runs `body` with output into a fresh buffer and returns what it wrote.
  std::string capture(const Body& body, Scope& sc) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    try {
      exec(body, sc);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buf;
  }

  Flow exec(const Node& n, Scope& sc);
  Flow exec_for(const Node& n, Scope& sc);
  Value filter_block(const Node& n, Scope& sc);
  Value call_macro(const Node& m, Args& args);
  Args eval_args(const Expr& e, size_t first, Scope& sc);
};

Args Interp::eval_args(const Expr& e, size_t first, Scope& sc) {
  Args a;
  a.where = e.where;
  for (size_t i = first; i < e.kids.size(); ++i) a.pos.push_back(eval(*e.kids[i], sc));
  for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x, sc));
  return a;
}

Value Interp::eval(const Expr& e, Scope& sc) {
  switch (e.k) {
    case Expr::K::Literal: return e.lit;
    case Expr::K::Name: {
      if (const Value* v = sc.find(e.name)) return *v;
      return Value::undefined(e.name);
    }
    case Expr::K::List:
    case Expr::K::Tuple: {
      List l;
      l.reserve(e.kids.size());
      for (const ExprP& k : e.kids) l.push_back(eval(*k, sc));
      return e.k == Expr::K::Tuple ? Value::tuple(std::move(l)) : Value(std::move(l));
    }
    case Expr::K::Dict: {
      auto d = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
        Value k = eval(*e.kids[i], sc);
        require_hashable(k, e.where);
        d->set_key(k, eval(*e.kids[i + 1], sc));
      }
      return Value(std::move(d));
    }
    case Expr::K::Attr: {
      Value obj = eval(*e.kids[0], sc);
      if (obj.is_undefined()) {
        throw TemplateError(cat(e.where, ": ", obj.undefined_message(), " (reading its attribute '", e.name, "')"));
      }
      return get_attr(obj, e.name, e.where);
    }
    case Expr::K::Item: return get_item(eval(*e.kids[0], sc), eval(*e.kids[1], sc), e.where);
    case Expr::K::Slice: {
      auto part = [&](size_t i) { return e.kids[i] ? eval(*e.kids[i], sc) : Value(); };
      return slice(eval(*e.kids[0], sc), part(1), part(2), part(3), e.where);
    }
    case Expr::K::Call: {
      Value f = eval(*e.kids[0], sc);
      if (!f.is_function()) {
        if (f.is_undefined()) fail(e.line, cat(f.undefined_message(), " (called)"));
        fail(e.line, cat("'", f.type_name(), "' object is not callable"));
      }
      Args a = eval_args(e, 1, sc);  // errors name the line; the callee is in the template text there
      return f.fn()(a);
    }
    case Expr::K::Filter: {
      Value x = e.kids[0] ? eval(*e.kids[0], sc) : Value();
      Args a = eval_args(e, 1, sc);
      return apply_filter(e.name, x, a);
    }
    case Expr::K::Test: {
      Value x = eval(*e.kids[0], sc);
      Args a = eval_args(e, 1, sc);
      return Value(apply_test(e.name, x, a) != e.negated);
    }
    case Expr::K::Unary: {
      Value x = eval(*e.kids[0], sc);
      if (e.name == "not") return Value(!x.truthy());
      if (!x.is_number()) fail(e.line, cat("bad operand type for unary ", e.name, ": '", x.type_name(), "'"));
      if (e.name == "+") return x.is_bool() ? Value(x.as_int()) : x;
      return x.is_float() ? Value(-x.as_float()) : Value(-x.as_int());
    }
    case Expr::K::Binary: return binary_op(e.name, eval(*e.kids[0], sc), eval(*e.kids[1], sc), e.where);
    case Expr::K::And: {
      Value a = eval(*e.kids[0], sc);
      return a.truthy() ? eval(*e.kids[1], sc) : a;
    }
    case Expr::K::Or: {
      Value a = eval(*e.kids[0], sc);
      return a.truthy() ? a : eval(*e.kids[1], sc);
    }
    case Expr::K::Cond: {
      if (eval(*e.kids[1], sc).truthy()) return eval(*e.kids[0], sc);
      return e.kids[2] ? eval(*e.kids[2], sc) : Value();
    }
  }
  return Value();
}

Interp::Flow Interp::exec(const Node& n, Scope& sc) {
  switch (n.k) {
    case Node::K::Text: out_->append(n.text); return Flow::Normal;
    case Node::K::Output: {
      Value v = eval(*n.expr, sc);
      if (v.is_string()) {
        out_->append(v.str());
      } else {
        out_->append(py_str(v));
      }
      return Flow::Normal;
    }
    case Node::K::If: {
      for (const auto& [c, body] : n.branches)
        if (eval(*c, sc).truthy()) return exec(body, sc);
      return exec(n.else_body, sc);
    }
    case Node::K::For: return exec_for(n, sc);
    case Node::K::Set: {
      Value v = eval(*n.expr, sc);
      if (!n.name.empty()) {  // set ns.attr = v
        const Value* ns = sc.find(n.targets[0]);
        if (!ns || !ns->is_dict() || !ns->dict().is_namespace)
          fail(n.line, cat("cannot assign attribute on a non-namespace object ('", n.targets[0], "')"));
        const_cast<Value*>(ns)->dict_mut().set(n.name, std::move(v));
        return Flow::Normal;
      }
      if (n.targets.size() == 1) {
        sc.set(n.targets[0], std::move(v));
        return Flow::Normal;
      }
      List items = iterate(v, cat("template line ", n.line));
      if (items.size() != n.targets.size())
        fail(n.line, cat("cannot unpack ", items.size(), " values into ", n.targets.size(), " names"));
      for (size_t i = 0; i < items.size(); ++i) sc.set(n.targets[i], items[i]);
      return Flow::Normal;
    }
    case Node::K::SetBlock: {
      Value v = filter_block(n, sc);
      sc.set(n.targets[0], std::move(v));
      return Flow::Normal;
    }
    case Node::K::FilterBlock: {
      const Value v = filter_block(n, sc);
      out_->append(v.is_string() ? v.str() : py_str(v));
      return Flow::Normal;
    }
    case Node::K::Macro: {
      const Node* m = &n;
      sc.set(n.name, Value::function(n.name, [this, m](Args& a) { return call_macro(*m, a); }));
      return Flow::Normal;
    }
    case Node::K::Break: return Flow::Break;
    case Node::K::Continue: return Flow::Continue;
    case Node::K::Generation: {
      if (out_ != top_) fail(n.line, "{% generation %} inside a macro or a block set is not supported");
      const size_t b = out_->size();
      Flow f = exec(n.body, sc);
      generation.emplace_back(b, out_->size());
      return f;
    }
  }
  return Flow::Normal;
}

// A block set's or a filter block's body, rendered in a scope of its own (as Jinja2's inner frame), through the
// block's filter chain, whose innermost operand (null) is the rendered text.
Value Interp::filter_block(const Node& n, Scope& sc) {
  Scope inner;
  inner.parent = &sc;
  Value v(capture(n.body, inner));
  std::vector<const Expr*> chain;
  for (const Expr* f = n.cond.get(); f; f = f->kids[0].get()) chain.push_back(f);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    Args a = eval_args(**it, 1, sc);
    v = apply_filter((*it)->name, v, a);
  }
  return v;
}

Interp::Flow Interp::exec_for(const Node& n, Scope& sc) {
  const std::string where = cat("template line ", n.line);
  List items = iterate(eval(*n.expr, sc), where);
  // Each iteration runs in a fresh scope (as Jinja2: a `set` in the body lasts until the iteration ends).
  auto bind = [&](Scope& it, const Value& item) {
    if (n.targets.size() == 1) {
      it.set(n.targets[0], item);
      return;
    }
    List parts = iterate(item, where);
    if (parts.size() != n.targets.size())
      fail(n.line, cat("cannot unpack ", parts.size(), " values into ", n.targets.size(), " loop variables"));
    for (size_t i = 0; i < parts.size(); ++i) it.set(n.targets[i], parts[i]);
  };
  if (n.cond) {  // {% for x in xs if cond %}: filter first, so loop.length and loop.last count what is kept
    List kept;
    for (const Value& item : items) {
      Scope it;
      it.parent = &sc;
      bind(it, item);
      if (eval(*n.cond, it).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(n.else_body, sc);
  const int64_t len = static_cast<int64_t>(items.size());
  // One `loop` object per loop, its fields updated in place each iteration (building it anew per iteration
  // dominated the cost of short loops).
  static const Value kKeys[] = {Value("index"), Value("index0"), Value("revindex"), Value("revindex0"),
                                 Value("first"), Value("last"),   Value("length"),   Value("depth"),
                                 Value("depth0"), Value("previtem"), Value("nextitem"), Value("cycle")};
  auto index = std::make_shared<int64_t>(0);
  auto loop = std::make_shared<Dict>();
  loop->items.reserve(std::size(kKeys));
  for (const Value& k : kKeys) loop->items.emplace_back(k, Value());
  loop->items[6].second = Value(len);
  loop->items[7].second = Value(int64_t{1});
  loop->items[8].second = Value(int64_t{0});
  loop->items[11].second = Value::function("loop.cycle", [index](Args& a) -> Value {
    if (a.pos.empty()) throw TemplateError(cat(a.where, ": no items for cycling given"));
    return a.pos[static_cast<size_t>(*index) % a.pos.size()];
  });
  const Value loop_value(loop);
  for (int64_t i = 0; i < len; ++i) {
    Scope it;
    it.parent = &sc;
    bind(it, items[static_cast<size_t>(i)]);
    *index = i;
    auto& f = loop->items;
    f[0].second = Value(i + 1);
    f[1].second = Value(i);
    f[2].second = Value(len - i);
    f[3].second = Value(len - i - 1);
    f[4].second = Value(i == 0);
    f[5].second = Value(i == len - 1);
    f[9].second = i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem");
    f[10].second = i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem");
    it.set("loop", loop_value);
    if (exec(n.body, it) == Flow::Break) break;
  }
  return Flow::Normal;
}

Value Interp::call_macro(const Node& m, Args& a) {
  if (depth_ >= kMaxDepth) throw TemplateError(cat(a.where, ": macro calls nested deeper than ", kMaxDepth));
  if (a.pos.size() > m.params.size())
    throw TemplateError(cat(a.where, ": macro '", m.name, "' takes ", m.params.size(), " arguments, got ", a.pos.size()));
  Scope s;
  s.parent = root;
  for (const auto& [k, v] : a.kw) {
    if (std::find(m.params.begin(), m.params.end(), k) == m.params.end())
      throw TemplateError(cat(a.where, ": macro '", m.name, "' has no argument '", k, "'"));
  }
  for (size_t i = 0; i < m.params.size(); ++i) {
    Value v = a.get(i, m.params[i]);
    if (v.is_undefined() && i >= a.pos.size()) {
      bool given = false;
      for (const auto& [k, x] : a.kw) given = given || k == m.params[i];
      if (!given) v = m.defaults[i] ? eval(*m.defaults[i], s) : Value::undefined(m.params[i]);
    }
    s.set(m.params[i], std::move(v));
  }
  ++depth_;
  std::string text;
  try {
    text = capture(m.body, s);
  } catch (...) {
    --depth_;
    throw;
  }
  --depth_;
  return Value(std::move(text));
}

void add_globals(Scope& g, const RenderOptions& o) {
  g.set("range", Value::function("range", [](Args& a) -> Value {
          a.expect(3, {});
          int64_t start = 0, stop = 0, step = 1;
          auto num = [&](size_t i) {
            if (!a.pos[i].is_int() && !a.pos[i].is_bool())
              throw TemplateError(cat(a.where, ": '", a.pos[i].type_name(), "' object cannot be interpreted as an integer"));
            return a.pos[i].as_int();
          };
          if (a.pos.size() == 1) {
            stop = num(0);
          } else if (a.pos.size() >= 2) {
            start = num(0);
            stop = num(1);
            if (a.pos.size() == 3) step = num(2);
          } else {
            throw TemplateError(cat(a.where, ": range expected at least 1 argument, got 0"));
          }
          if (step == 0) throw TemplateError(cat(a.where, ": range() arg 3 must not be zero"));
          List l;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (static_cast<int64_t>(l.size()) >= kMaxRange)
              throw TemplateError(cat(a.where, ": range too big (the sandbox allows ", kMaxRange, " items)"));
            l.emplace_back(i);
          }
          return Value(std::move(l));
        }));
  auto make_dict = [](bool ns) {
    return [ns](Args& a) -> Value {
      auto d = std::make_shared<Dict>();
      d->is_namespace = ns;
      for (const Value& p : a.pos) {
        if (!p.is_dict()) throw TemplateError(cat(a.where, ": positional argument must be a mapping"));
        for (const auto& [k, v] : p.dict().items) d->set_key(k, v);  // dict(mapping) keeps its keys
      }
      for (const auto& [k, v] : a.kw) d->set(k, v);
      return Value(std::move(d));
    };
  };
  g.set("namespace", Value::function("namespace", make_dict(true)));
  g.set("dict", Value::function("dict", make_dict(false)));
  g.set("raise_exception", Value::function("raise_exception", [](Args& a) -> Value {
          throw TemplateError(py_str(a.get(0, "message")), /*raised=*/true);
        }));
  const std::time_t now = o.now;
  g.set("strftime_now", Value::function("strftime_now", [now](Args& a) -> Value {
          a.expect(1, {});
          const std::string fmt = py_str(a.get(0, "format"));
          std::time_t t = now != 0 ? now : std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[256];
          const size_t k = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
          return Value(std::string(buf, k));
        }));
}

}  // namespace

Template::Template(std::string_view source) : body_(parse_template(source)) {
  has_generation_ = contains_generation(body_);
}

Rendered Template::render(const Dict& vars, const RenderOptions& opts) const {
  Rendered r;
  Interp in(opts, &r.text);
  Scope globals;
  add_globals(globals, opts);
  for (const auto& [k, v] : vars.items) globals.set(py_str(k), v);
  Scope top;
  top.parent = &globals;
  in.root = &top;
  if (in.exec(body_, top) != Interp::Flow::Normal) {
    // {% break %} / {% continue %} outside a loop: Jinja2 refuses these at compile time
    throw TemplateError("template: break or continue outside a for loop");
  }
  r.generation = std::move(in.generation);
  return r;
}

}  // namespace dflash::jinja
