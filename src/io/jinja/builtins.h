// io/jinja/builtins.h — Jinja2's built-in filters and tests, Python's str / dict methods, attribute and item
// access, and the operators, as chat templates use them (Jinja2 3.1, in Hugging Face's sandboxed environment:
// its `tojson` with ensure_ascii=False, no autoescaping, lists and dicts immutable; markupsafe 3 for Markup).
// defines: jinja::filter_supported, jinja::test_supported, jinja::jinja2_has_filter, jinja::jinja2_has_test,
//          jinja::apply_filter, jinja::apply_test, jinja::get_attr, jinja::get_item, jinja::slice, jinja::binary_op, jinja::iterate
#pragma once
#include <string>
#include <string_view>

#include "io/jinja/value.h"

namespace dflash::jinja {

bool filter_supported(std::string_view name);
bool test_supported(std::string_view name);
// Whether Jinja2 3.1 has a filter / test of that name (supported here or not): an unknown name is "no filter
// named 'x'", a known one we lack is "not supported".
bool jinja2_has_filter(std::string_view name);
bool jinja2_has_test(std::string_view name);

// `where` ("template line N: filter 'x'") prefixes every TemplateError.
Value apply_filter(const std::string& name, const Value& operand, Args& args);
bool apply_test(const std::string& name, const Value& operand, Args& args);

// obj.name: a method of str / dict / list bound to obj when it has one by that name, else the item. An
// Undefined obj is an error (Jinja2's UndefinedError); a missing attribute is Undefined.
Value get_attr(const Value& obj, const std::string& name, std::string_view where);
// obj[key]: the item when there is one, else the attribute (Jinja2's getitem order); negative list / string
// indices count from the end; missing -> Undefined.
Value get_item(const Value& obj, const Value& key, std::string_view where);
// obj[start:stop:step] for lists and strings (code points); absent parts are Undefined.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, std::string_view where);
// + - * / // % ** ~ == != < > <= >= in notin, with Python's types and errors.
Value binary_op(const std::string& op, const Value& a, const Value& b, std::string_view where);
// The items a for loop or a filter iterates: list items, dict keys, string characters; Undefined: none.
List iterate(const Value& v, std::string_view where);

}  // namespace dflash::jinja
