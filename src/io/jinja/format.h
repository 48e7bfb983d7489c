// io/jinja/format.h — Python's str.format as Jinja2's sandbox runs it: '{}', '{0}', '{name}', fields with
// .attribute and [key] accessors (read as the template reads them: an attribute falls back to the item),
// conversions !s / !r / !a, and the format-spec mini-language [[fill]align][sign][#][0][width][,|_][.precision][type]
// for str, int, bool and float values, with nested '{}' fields inside a spec.
// defines: jinja::py_format, jinja::py_format_value
#pragma once
#include <string>
#include <string_view>

#include "io/jinja/value.h"

namespace dflash::jinja {

// fmt.format(*a.pos, **a.kw). Throws TemplateError (prefixed with a.where) where Python raises: a missing
// positional or keyword argument, mixing '{}' with '{0}', an unknown conversion, a spec the value's type refuses.
std::string py_format(std::string_view fmt, const Args& a);

// format(v, spec): the mini-language for one value (the same errors).
std::string py_format_value(const Value& v, std::string_view spec, std::string_view where);

}  // namespace dflash::jinja
