// io/jinja/template.h — a compiled Jinja template and its renderer: the engine behind chat templates. It covers
// the Jinja2 that Hugging Face's apply_chat_template runs (ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks, the loopcontrols extension, the `{% generation %}` tag, globals raise_exception and strftime_now,
// its `tojson`), with Python's semantics for values (value.h) and Jinja2's for undefined names.
// defines: jinja::RenderOptions, jinja::Rendered, jinja::Template
//
// What is outside the subset fails with a TemplateError naming the template line and the construct: at parse time
// for a statement we do not have, and for a filter or test name where Jinja2 checks names when it compiles (outside
// `if` statements and conditional expressions; inside them, as in Jinja2, when the template reaches the name); at
// render time for methods and types (e.g. "template line 12: str object has no attribute 'format_map'").
// Thread safety: a Template is immutable after construction; render() is const and may run on many threads.
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/jinja/ast.h"
#include "io/jinja/value.h"

namespace dflash::jinja {

struct RenderOptions {
  std::time_t now = 0;  // what strftime_now formats (local time); 0: the time of the call
};

struct Rendered {
  std::string text;
  // Byte ranges [begin, end) of text that `{% generation %}` blocks produced, in order.
  std::vector<std::pair<size_t, size_t>> generation;
};

class Template {
 public:
  // Parses `source`. Throws TemplateError "template line N: ..." for syntax errors and unsupported constructs.
  explicit Template(std::string_view source);
  // Renders with the top-level variables `vars` (messages, add_generation_prompt, bos_token, ...). Throws
  // TemplateError for a runtime error; raise_exception(msg) throws one with raised() true and what() = msg.
  Rendered render(const Dict& vars, const RenderOptions& opts = {}) const;
  bool has_generation() const { return has_generation_; }  // the template has a {% generation %} block

 private:
  Body body_;
  bool has_generation_ = false;
};

}  // namespace dflash::jinja
