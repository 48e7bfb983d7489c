// io/jinja/parser.cpp — see parser.h. A recursive-descent parser following jinja2/parser.py's methods
// (parse_condexpr, parse_or, ..., parse_unary, parse_primary, parse_postfix, parse_filter_expr).
#include "io/jinja/parser.h"

#include <cstdlib>

#include "io/jinja/builtins.h"
#include "io/jinja/lexer.h"

namespace dflash::jinja {

namespace {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    Body b = parse_body({});
    if (cur().type != T::End) fail(cur().line, cat("unexpected '", cur().text, "'"));
    check_names(b, false);
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  [[noreturn]] static void fail(int line, const std::string& msg) {
    throw TemplateError(cat("template line ", line, ": ", msg));
  }
  bool is_op(const char* o) const { return cur().type == T::Op && cur().text == o; }
  bool is_name(const char* n) const { return cur().type == T::Name && cur().text == n; }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(cur().line, cat("expected '", o, "', got ", describe(cur())));
    next();
  }
  void expect_name(const char* n) {
    if (!is_name(n)) fail(cur().line, cat("expected '", n, "', got ", describe(cur())));
    next();
  }
  std::string expect_identifier() {
    if (cur().type != T::Name) fail(cur().line, cat("expected a name, got ", describe(cur())));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != T::BlockEnd) fail(cur().line, cat("expected the end of the statement block, got ", describe(cur())));
    next();
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case T::End: return "the end of the template";
      case T::BlockEnd: return "'%}'";
      case T::VarEnd: return "'}}'";
      case T::String: return "a string";
      default: return "'" + t.text + "'";
    }
  }

  // ---- statements --------------------------------------------------------------------------------------------

  // Parses until a block whose first name is one of `ends` (left unconsumed, positioned on that name).
  Body parse_body(std::initializer_list<const char*> ends) {
    Body body;
    for (;;) {
      const Token& tk = cur();
      if (tk.type == T::End) {
        if (ends.size() > 0) fail(tk.line, cat("missing '{% ", *(ends.end() - 1), " %}' (the template ended)"));
        return body;
      }
      if (tk.type == T::Text) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::Text;
        n->line = tk.line;
        n->text = tk.text;
        body.push_back(std::move(n));
        next();
      } else if (tk.type == T::VarBegin) {
        next();
        auto n = std::make_unique<Node>();
        n->k = Node::K::Output;
        n->line = tk.line;
        n->expr = parse_tuple_expr();
        if (cur().type != T::VarEnd) fail(cur().line, cat("expected '}}', got ", describe(cur())));
        next();
        body.push_back(std::move(n));
      } else if (tk.type == T::BlockBegin) {
        const Token& kw = peek();
        for (const char* e : ends) {
          if (kw.type == T::Name && kw.text == e) {
            next();
            return body;
          }
        }
        next();
        body.push_back(parse_statement());
      } else {
        fail(tk.line, cat("unexpected ", describe(tk)));
      }
    }
  }

  NodeP parse_statement() {
    const Token& kw = cur();
    if (kw.type != T::Name) fail(kw.line, cat("expected a statement name, got ", describe(kw)));
    const std::string name = kw.text;
    const int line = kw.line;
    next();
    auto n = std::make_unique<Node>();
    n->line = line;
    if (name == "if") {
      n->k = Node::K::If;
      ExprP c = parse_tuple_expr();
      expect_block_end();
      for (;;) {
        Body b = parse_body({"elif", "else", "endif"});
        n->branches.emplace_back(std::move(c), std::move(b));
        const std::string e = next().text;
        if (e == "elif") {
          c = parse_tuple_expr();
          expect_block_end();
          continue;
        }
        if (e == "else") {
          expect_block_end();
          n->else_body = parse_body({"endif"});
          next();
        }
        expect_block_end();
        return n;
      }
    }
    if (name == "for") {
      n->k = Node::K::For;
      parse_targets(n->targets);
      expect_name("in");
      n->expr = parse_tuple_expr(/*no_condexpr=*/true);
      if (is_name("if")) {
        next();
        n->cond = parse_expression();
      }
      if (is_name("recursive")) fail(line, "recursive for loops are not supported");
      expect_block_end();
      n->body = parse_body({"else", "endfor"});
      if (next().text == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"});
        next();
      }
      expect_block_end();
      return n;
    }
    if (name == "set") {
      const std::string first = expect_identifier();
      if (is_op(".")) {
        next();
        n->k = Node::K::Set;
        n->targets = {first};
        n->name = expect_identifier();
        expect_op("=");
        n->expr = parse_tuple_expr();
        expect_block_end();
        return n;
      }
      n->targets = {first};
      while (is_op(",")) {
        next();
        n->targets.push_back(expect_identifier());
      }
      if (is_op("=")) {
        next();
        n->k = Node::K::Set;
        n->expr = parse_tuple_expr();
        expect_block_end();
        return n;
      }
      if (n->targets.size() != 1) fail(line, "a block set ({% set x %}...{% endset %}) takes one name");
      n->k = Node::K::SetBlock;
      if (is_op("|")) n->cond = parse_filters(nullptr);
      expect_block_end();
      n->body = parse_body({"endset"});
      next();
      expect_block_end();
      return n;
    }
    if (name == "macro") {
      n->k = Node::K::Macro;
      n->name = expect_identifier();
      expect_op("(");
      while (!is_op(")")) {
        if (!n->params.empty()) expect_op(",");
        if (is_op(")")) break;
        n->params.push_back(expect_identifier());
        if (is_op("=")) {
          next();
          n->defaults.push_back(parse_expression());
        } else {
          n->defaults.push_back(nullptr);
        }
      }
      next();
      expect_block_end();
      n->body = parse_body({"endmacro"});
      next();
      if (cur().type == T::Name) next();  // {% endmacro name %}
      expect_block_end();
      return n;
    }
    if (name == "break" || name == "continue") {
      n->k = name == "break" ? Node::K::Break : Node::K::Continue;
      expect_block_end();
      return n;
    }
    if (name == "generation") {
      n->k = Node::K::Generation;
      expect_block_end();
      n->body = parse_body({"endgeneration"});
      next();
      expect_block_end();
      return n;
    }
    if (name == "filter") {
      n->k = Node::K::FilterBlock;
      n->cond = parse_filters(nullptr, /*start_inline=*/true);
      expect_block_end();
      n->body = parse_body({"endfilter"});
      next();
      expect_block_end();
      return n;
    }
    fail(line, cat("the statement '{% ", name, " %}' is not supported (supported: if, for, set, macro, break, "
                   "continue, filter, generation)"));
  }

  // Jinja2 checks filter and test names when it compiles a template, except inside an `if` statement or a
  // conditional expression (its "soft" frames, which a for body, a macro, a block set, a filter block or a
  // {% generation %} block ends): there the name is looked up when the filter runs. An unknown name fails here
  // outside those, and where the template reaches it otherwise (apply_filter / apply_test).
  static void check_names(const Body& body, bool soft) {
    for (const NodeP& n : body) {
      switch (n->k) {
        case Node::K::If:
          for (const auto& [c, b] : n->branches) {
            check_names(*c, true);
            check_names(b, true);
          }
          check_names(n->else_body, true);
          break;
        case Node::K::For:
          check_names(*n->expr, soft);
          if (n->cond) check_names(*n->cond, false);
          check_names(n->body, false);
          check_names(n->else_body, false);
          break;
        case Node::K::Macro:
          for (const ExprP& d : n->defaults)
            if (d) check_names(*d, false);
          check_names(n->body, false);
          break;
        case Node::K::SetBlock:
        case Node::K::FilterBlock:
          check_names(n->body, false);
          if (n->cond) check_names(*n->cond, false);
          break;
        case Node::K::Generation: check_names(n->body, false); break;
        case Node::K::Output:
        case Node::K::Set: check_names(*n->expr, soft); break;
        default: break;
      }
    }
  }
  static void check_names(const Expr& e, bool soft) {
    if (e.k == Expr::K::Cond) soft = true;
    if (!soft && e.k == Expr::K::Filter && !filter_supported(e.name)) {
      fail(e.line, jinja2_has_filter(e.name) ? cat("the filter '", e.name, "' is not supported")
                                            : cat("no filter named '", e.name, "'"));
    }
    if (!soft && e.k == Expr::K::Test && !test_supported(e.name)) {
      fail(e.line, jinja2_has_test(e.name) ? cat("the test '", e.name, "' is not supported")
                                          : cat("no test named '", e.name, "'"));
    }
    for (const ExprP& k : e.kids)
      if (k) check_names(*k, soft);
    for (const auto& kv : e.kwargs) check_names(*kv.second, soft);
  }

  void parse_targets(std::vector<std::string>& out) {
    const bool paren = is_op("(");
    if (paren) next();
    out.push_back(expect_identifier());
    while (is_op(",")) {
      next();
      if (paren && is_op(")")) break;
      out.push_back(expect_identifier());
    }
    if (paren) expect_op(")");
  }

  // ---- expressions -------------------------------------------------------------------------------------------

  static ExprP make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    e->where = cat("template line ", line);
    return e;
  }

  // An expression, or an unparenthesised tuple "a, b" (as in {{ a, b }} or {% set x = 1, 2 %}).
  ExprP parse_tuple_expr(bool no_condexpr = false) {
    const int line = cur().line;
    ExprP first = no_condexpr ? parse_or() : parse_expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::K::Tuple, line);
    t->kids.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().type == T::BlockEnd || cur().type == T::VarEnd || is_name("in") || is_name("if")) break;
      t->kids.push_back(no_condexpr ? parse_or() : parse_expression());
    }
    return t;
  }

  ExprP parse_expression() {
    ExprP e = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      auto c = make(Expr::K::Cond, line);
      ExprP cond = parse_or();
      ExprP other;
      if (is_name("else")) {
        next();
        other = parse_expression();
      }
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprP binary(Expr::K k, const std::string& op, ExprP a, ExprP b, int line) {
    auto e = make(k, line);
    e->name = op;
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      e = binary(Expr::K::Or, "or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      e = binary(Expr::K::And, "and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      auto e = make(Expr::K::Unary, line);
      e->name = "not";
      e->kids.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    for (;;) {
      const int line = cur().line;
      std::string op;
      if (cur().type == T::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
                                  cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == T::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        return e;
      }
      e = binary(Expr::K::Binary, op, std::move(e), parse_math1(), line);
    }
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(Expr::K::Binary, t.text, std::move(e), parse_concat(), t.line);
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary(Expr::K::Binary, "~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(Expr::K::Binary, t.text, std::move(e), parse_pow(), t.line);
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      e = binary(Expr::K::Binary, "**", std::move(e), parse_unary(true), line);
    }
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(Expr::K::Unary, t.line);
      e->name = t.text;
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprP parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == T::Name) {
      next();
      auto e = make(Expr::K::Literal, line);
      if (t.text == "true" || t.text == "True") {
        e->lit = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->lit = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->lit = Value::none();
      } else {
        e->k = Expr::K::Name;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == T::String) {
      std::string s;
      while (cur().type == T::String) s += next().text;  // adjacent literals concatenate
      auto e = make(Expr::K::Literal, line);
      e->lit = Value(std::move(s));
      return e;
    }
    if (t.type == T::Int || t.type == T::Float) {
      next();
      auto e = make(Expr::K::Literal, line);
      if (t.type == T::Int) {
        e->lit = Value(static_cast<int64_t>(std::strtoll(t.text.c_str(), nullptr, 10)));
      } else {
        e->lit = Value(std::strtod(t.text.c_str(), nullptr));
      }
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return make(Expr::K::Tuple, line);
      }
      ExprP e = parse_expression();
      if (is_op(",")) {
        auto tup = make(Expr::K::Tuple, line);
        tup->kids.push_back(std::move(e));
        while (is_op(",")) {
          next();
          if (is_op(")")) break;
          tup->kids.push_back(parse_expression());
        }
        e = std::move(tup);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(Expr::K::List, line);
      while (!is_op("]")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("]")) break;
        e->kids.push_back(parse_expression());
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(Expr::K::Dict, line);
      while (!is_op("}")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("}")) break;
        e->kids.push_back(parse_expression());
        expect_op(":");
        e->kids.push_back(parse_expression());
      }
      next();
      return e;
    }
    fail(line, cat("unexpected ", describe(t), " in an expression"));
  }

  ExprP parse_postfix(ExprP e) {
    for (;;) {
      const int line = cur().line;
      if (is_op(".")) {
        next();
        auto a = make(Expr::K::Attr, line);
        if (cur().type == T::Int) {  // x.0 is x[0]
          a->k = Expr::K::Item;
          auto idx = make(Expr::K::Literal, line);
          idx->lit = Value(static_cast<int64_t>(std::strtoll(next().text.c_str(), nullptr, 10)));
          a->kids.push_back(std::move(e));
          a->kids.push_back(std::move(idx));
        } else {
          a->name = expect_identifier();
          a->kids.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        auto c = make(Expr::K::Call, line);
        c->kids.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprP parse_subscript(ExprP obj, int line) {
    ExprP parts[3];
    int n = 0;
    bool slice = false;
    for (;;) {
      if (is_op("]")) break;
      if (is_op(":")) {
        slice = true;
        next();
        if (++n > 2) fail(line, "a slice takes at most three parts");
        continue;
      }
      if (parts[n]) fail(line, "expected ':' or ']' in a subscript");
      parts[n] = parse_expression();
    }
    next();
    auto e = make(slice ? Expr::K::Slice : Expr::K::Item, line);
    e->kids.push_back(std::move(obj));
    if (slice) {
      for (auto& p : parts) e->kids.push_back(std::move(p));
    } else {
      if (!parts[0]) fail(line, "empty subscript");
      e->kids.push_back(std::move(parts[0]));
    }
    return e;
  }

  void parse_call_args(Expr& c) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur().line, "*args / **kwargs in a call are not supported");
      if (cur().type == T::Name && peek().type == T::Op && peek().text == "=") {
        std::string k = next().text;
        next();
        c.kwargs.emplace_back(std::move(k), parse_expression());
      } else {
        if (!c.kwargs.empty()) fail(cur().line, "a positional argument follows a keyword argument");
        c.kids.push_back(parse_expression());
      }
    }
    next();
  }

  // operand | f | g(args) ... (operand may be null: the filters of a block set or a filter block; start_inline:
  // the first filter has no '|', as in {% filter f | g %})
  ExprP parse_filters(ExprP operand, bool start_inline = false) {
    while (start_inline || is_op("|")) {
      if (!start_inline) next();
      start_inline = false;
      const int line = cur().line;
      std::string name = expect_identifier();
      while (is_op(".")) {  // dotted filter names
        next();
        name += "." + expect_identifier();
      }
      auto f = make(Expr::K::Filter, line);
      f->name = name;
      f->where = cat("template line ", line, ": filter '", name, "'");
      f->kids.push_back(std::move(operand));
      if (is_op("(")) parse_call_args(*f);
      operand = std::move(f);
    }
    return operand;
  }

  ExprP parse_filter_expr(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = make(Expr::K::Test, line);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        t->name = expect_identifier();
        t->where = cat("template line ", line, ": test '", t->name, "'");
        t->kids.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == T::Name || cur().type == T::String || cur().type == T::Int ||
                    cur().type == T::Float || is_op("(") || is_op("[") || is_op("{")) &&
                   !(cur().type == T::Name && (cur().text == "else" || cur().text == "or" || cur().text == "and" ||
                                               cur().text == "if" || cur().text == "in" || cur().text == "is"))) {
          ExprP arg = parse_primary();
          t->kids.push_back(parse_postfix(std::move(arg)));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        auto c = make(Expr::K::Call, cur().line);
        c->kids.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(tokenize(source)).parse_all(); }

}  // namespace dflash::jinja
