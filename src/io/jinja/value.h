// io/jinja/value.h — the values a Jinja template computes with, with Python's semantics (Jinja2 runs on Python:
// truthiness, equality, str() and repr(), json.dumps), and their conversion from and to JSON.
// defines: jinja::Value, jinja::List, jinja::Dict, jinja::Function, jinja::Args, jinja::TemplateError,
//          jinja::require_hashable, jinja::py_equal, jinja::py_less, jinja::py_str, jinja::py_repr, jinja::py_float_repr, jinja::JsonFormat,
//          jinja::to_json_text, jinja::from_json, jinja::py_isspace, jinja::py_strip, jinja::utf8_codepoints
//
// Kinds: Undefined (a name or key that is not there; carries the name for error messages), None, Bool, Int
// (int64), Float (double), String (UTF-8 bytes; length, indexing and slicing count code points as Python does;
// also markupsafe's Markup, the `safe` / `escape` filters' result), List (also Python tuples, and the generators
// and iterators that Jinja2's map / select / unique / items / reverse filters return), Dict (insertion-ordered;
// keys are Python's hashable values: str, int, float, bool, None, tuples; a `namespace()` is a Dict whose
// attributes may be assigned), Function (filters' and methods' bound callables, macros, globals such as range).
// Lists and dicts are shared by reference, as in Python.
//
// A Markup string concatenated with `+` escapes the other operand (&, <, >, ", ') and stays Markup, as in
// Python even without autoescaping; `~` and output write its text as it is. A generator is true even when empty,
// has no len(), is not subscriptable nor JSON-serializable, and is consumed by iterating it (a second loop over
// it sees nothing), as in Python.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dflash::jinja {

// An error while rendering a template: a construct it does not support, a type error, or the template's own
// raise_exception(). what() names the template line. `raised` is true for raise_exception (the template refuses
// the input: a bad row, not a bad template).
class TemplateError : public Error {
 public:
  TemplateError(const std::string& msg, bool raised = false) : Error(msg), raised_(raised) {}
  bool raised() const { return raised_; }

 private:
  bool raised_;
};

class Value;
using List = std::vector<Value>;
struct Dict;
struct Args;
class Interpreter;
using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Function };

  Value() = default;  // Undefined
  static Value undefined(std::string name = {}) {
    Value v;
    if (!name.empty()) v.s_ = std::make_shared<const std::string>(std::move(name));
    return v;
  }
  static Value none() { return Value(Kind::None); }
  Value(bool b) : kind_(Kind::Bool), i_(b ? 1 : 0) {}
  Value(int v) : kind_(Kind::Int), i_(v) {}
  Value(int64_t v) : kind_(Kind::Int), i_(v) {}
  Value(size_t v) : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {}
  Value(double v) : kind_(Kind::Float), f_(v) {}
  Value(std::string s) : kind_(Kind::String), s_(std::make_shared<const std::string>(std::move(s))) {}
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(List l) : kind_(Kind::List), l_(std::make_shared<List>(std::move(l))) {}
  Value(std::shared_ptr<Dict> d) : kind_(Kind::Dict), d_(std::move(d)) {}
  static Value function(std::string name, Function f);
  static Value tuple(List l) {  // a Python tuple: a List that prints as (a, b) and never equals a list
    Value v(std::move(l));
    v.tuple_ = true;
    return v;
  }
  bool is_tuple() const { return tuple_; }
  static Value markup(std::string s) {  // markupsafe.Markup(s): a str whose `+` escapes the other operand
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  bool is_markup() const { return markup_; }
  static Value generator(List l) {  // a Python generator or iterator over `l` (see the header comment)
    Value v(std::move(l));
    v.generator_ = true;
    return v;
  }
  bool is_generator() const { return generator_; }
  // The items a generator has left, which it no longer has afterwards (every holder of it shares this state).
  List consume() const;
  // Python's next(generator): its next item, taken from it; Undefined when it has none left.
  Value next_item() const;

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_function() const { return kind_ == Kind::Function; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return kind_ == Kind::Float ? static_cast<int64_t>(f_) : i_; }
  double as_float() const { return kind_ == Kind::Float ? f_ : static_cast<double>(i_); }
  const std::string& str() const { return s_ ? *s_ : empty_string(); }  // String; Undefined: the missing name
  const List& list() const { return *l_; }
  List& list_mut() { return *l_; }
  const Dict& dict() const { return *d_; }
  Dict& dict_mut() { return *d_; }
  const std::shared_ptr<Dict>& dict_ptr() const { return d_; }
  const Function& fn() const { return *fn_; }
  const std::string& fn_name() const { return str(); }

  bool truthy() const;              // Python bool()
  // Undefined: what is missing, in words ("'x' is undefined", "dict object has no attribute 'y'").
  std::string undefined_message() const;
  std::string type_name() const;    // Python's type name: "str", "int", "list", "dict", "NoneType", ...

 private:
  explicit Value(Kind k) : kind_(k) {}
  static const std::string& empty_string();
  Kind kind_ = Kind::Undefined;
  bool tuple_ = false, markup_ = false, generator_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;  // shared: reading a variable or an item copies no text
  std::shared_ptr<List> l_;
  std::shared_ptr<Dict> d_;
  std::shared_ptr<Function> fn_;
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // (key, value) in insertion order
  bool is_namespace = false;  // namespace(): attributes may be assigned with {% set ns.x = ... %}
  const Value* find(std::string_view k) const;  // the value of the str key k
  const Value* find_key(const Value& k) const;  // Python's d[k]: the key equal to k (1, 1.0 and True are one key)
  void set(const std::string& k, Value v);
  void set_key(const Value& k, Value v);
};

// Python's hash(): TemplateError "unhashable type: 'list'" for a value that cannot be a dict key.
void require_hashable(const Value& k, std::string_view where);

// Arguments of a call: positional then keyword, as written.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // "template line N: filter 'x'" for error messages: a view of the expression's text in the syntax tree, so that a
  // call formats nothing unless it fails
  std::string_view where;
  // The argument at position i or named `name`; `dflt` when neither is given.
  Value get(size_t i, std::string_view name, Value dflt = Value()) const;
  // Throws TemplateError when more than n positional or an unknown keyword argument is passed.
  void expect(size_t n, std::initializer_list<std::string_view> names) const;
};

bool py_equal(const Value& a, const Value& b);  // Python ==
// Python <, for numbers, strings (code point order = UTF-8 byte order) and lists; TemplateError otherwise.
bool py_less(const Value& a, const Value& b, std::string_view where);
std::string py_str(const Value& v);   // Python str(); Undefined -> ""
std::string py_repr(const Value& v);  // Python repr()
std::string py_float_repr(double d);  // repr(float): shortest round trip, "1.0", "1e+16", "inf", "nan"

struct JsonFormat {
  int indent = -1;  // < 0: one line
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;  // non-ASCII code points as \uXXXX (surrogate pairs above U+FFFF)
};
// json.dumps(v, ...) as Python writes it: dict keys that are int, float, bool or None become strings, as json
// does. TemplateError for what json.dumps refuses (Undefined, functions, generators, tuple keys).
std::string to_json_text(const Value& v, const JsonFormat& f, std::string_view where);
Value from_json(const nlohmann::ordered_json& j);

// Python's str.isspace() for one code point, and str.strip / lstrip / rstrip on UTF-8 text: chars == nullopt
// strips Python's whitespace, else the code points of *chars.
bool py_isspace(uint32_t c);
std::string py_strip(std::string_view s, const std::optional<std::string_view>& chars, bool left = true,
                     bool right = true);

// UTF-8 -> code point byte offsets: offsets[i] is where code point i starts; offsets.back() == s.size().
std::vector<size_t> utf8_codepoints(std::string_view s);

}  // namespace dflash::jinja
