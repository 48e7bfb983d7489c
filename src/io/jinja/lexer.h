// io/jinja/lexer.h — Jinja source -> tokens, with the whitespace rules of Hugging Face's chat-template
// environment: trim_blocks (the first newline after a block or comment tag is removed), lstrip_blocks (spaces and
// tabs before a block or comment tag at the start of a line are removed), `-` / `+` on tags, newlines normalized
// to "\n" and one trailing newline dropped (keep_trailing_newline=False), as Jinja2's lexer does.
// defines: jinja::Token, jinja::tokenize
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace dflash::jinja {

struct Token {
  enum class Type { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Type type = Type::End;
  std::string text;  // Text: the data; Name / Op: the spelling; String: the unescaped value; Int / Float: digits
  int line = 1;
};

// Throws TemplateError "template line N: ..." for an unterminated tag, comment or string, an unexpected character,
// or a `{% raw %}` block (not supported).
std::vector<Token> tokenize(std::string_view source);

}  // namespace dflash::jinja
