// io/jinja/ast.h — the syntax tree of a parsed template: expressions and statements, each with its source line.
// defines: jinja::Expr, jinja::ExprP, jinja::Node, jinja::NodeP, jinja::Body
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/jinja/value.h"

namespace dflash::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    Literal,  // lit
    Name,     // name
    List,     // kids: items
    Tuple,    // kids: items
    Dict,     // kids: key0, value0, key1, value1, ...
    Attr,     // kids[0].name
    Item,     // kids[0][kids[1]]
    Slice,    // kids[0][kids[1]:kids[2]:kids[3]] (absent parts are null)
    Call,     // kids[0](kids[1..], kwargs)
    Filter,   // kids[0] | name(kids[1..], kwargs)
    Test,     // kids[0] is [not] name(kids[1..], kwargs); negated
    Unary,    // name in {"not", "-", "+"}, kids[0]
    Binary,   // kids[0] name kids[1]; name in {+ - * / // % ** ~ == != < > <= >= in notin}
    And,
    Or,
    Cond,     // kids[0] if kids[1] else kids[2] (kids[2] null: Undefined)
  };
  K k = K::Literal;
  int line = 0;
  std::string where;  // "template line N" (filters, tests, calls: with their name), for error messages
  Value lit;
  std::string name;
  bool negated = false;
  std::vector<ExprP> kids;
  std::vector<std::pair<std::string, ExprP>> kwargs;
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
  enum class K {
    Text,        // text
    Output,      // {{ expr }}
    If,          // branches: (cond, body)...; else_body
    For,         // for targets in expr [if cond] body [else else_body]
    Set,         // set targets = expr; or set targets[0].attr = expr (attr non-empty)
    SetBlock,    // {% set targets[0] [| filter] %}body{% endset %}; cond holds the filter (a Filter expr)
    Macro,       // macro name(params = defaults) body
    Break,
    Continue,
    Generation,  // {% generation %}body{% endgeneration %}: the assistant's output (HF's AssistantTracker)
    FilterBlock, // {% filter f | g(args) %}body{% endfilter %}: body's text through the filters; cond holds them
  };
  K k = K::Text;
  int line = 0;
  std::string text;
  std::string name;  // Macro: its name; Set: the attribute for `set ns.attr`
  ExprP expr, cond;  // cond: If/For conditions; SetBlock/FilterBlock: the filter chain (innermost operand null)
  std::vector<std::string> targets;
  std::vector<std::pair<ExprP, Body>> branches;
  Body body, else_body;
  std::vector<std::string> params;
  std::vector<ExprP> defaults;  // per param, null when it has none
};

}  // namespace dflash::jinja
