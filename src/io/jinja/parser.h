// io/jinja/parser.h — tokens -> syntax tree, with Jinja2's grammar and operator precedence (jinja2/parser.py):
// conditional < or < and < not < comparisons and `in` < + - < ~ < * / // % < ** < unary - + < postfix (. [] ())
// and filters / tests. Statements: if / elif / else, for (tuple targets, `if` filter, else), set (names, tuples,
// namespace attributes, blocks), macro, filter blocks, break / continue (loop controls), generation (Hugging Face's
// tag).
// defines: jinja::parse_template
#pragma once
#include <string_view>

#include "io/jinja/ast.h"

namespace dflash::jinja {

// Parses a whole template. Throws TemplateError "template line N: ..." naming the construct for a syntax error,
// an unknown or unsupported statement (include, extends, block, call, raw, do, ...), a filter or test that is
// unknown or not supported where Jinja2 checks names at compile time (outside `if` statements and conditional
// expressions; inside them the error comes when the template reaches the name), or a missing end tag.
Body parse_template(std::string_view source);

}  // namespace dflash::jinja
