#!/usr/bin/env python3
"""tools/ref_tiktoken.py — a plain-Python reference of Kimi's tiktoken tokenizer (TikTokenTokenizer of
tokenization_kimi.py over tiktoken), independent of dflash's C++ (src/io/tokenizer/tiktoken_model.*), for the
expected ids of tests/io/tokenizer.cpp (TokenizerTiktoken.*). Needs only Python 3 and the `regex` module (whose
VERSION1 syntax has the class intersection `&&` of Kimi's pat_str, and whose \\p{Han} is Script=Han and \\s is
White_Space, as in Rust's regex crate that tiktoken runs).

What it implements, each as the upstream code does:
  load_tiktoken_bpe     tiktoken.model lines "<base64 token> <rank>"
  pat_str, special ids  read by Python from the fixture's stand-ins of tokenization_kimi.py (Kimi-K2's pattern, Han
                        left out of the letter runs by `&&[^\\p{Han}]`, and 256 + 2 special ids; Kimi-K2.5's
                        pattern, which leaves Han in, and 256): added_tokens_decoder's content where given, else
                        "<|reserved_token_{i}|>"
  encode                Kimi's: 400,000-character slices, cut where a run of str.isspace / non-space characters
                        passes 25,000; then tiktoken: special tokens found leftmost (allowed_special="all"), the
                        text between them split by pat_str, a piece that is a token is that token, else
                        _byte_pair_merge (lowest-ranked adjacent concatenation first, leftmost on ties)
  decode                the tokens' bytes joined, as UTF-8 with U+FFFD for invalid bytes

Commands:
  train OUT_DIR         writes the test fixture's tiktoken.model: the 256 bytes, then byte-pair merges learned on
                        the fixture's texts WITHOUT the pre-tokenizer split (so tokens cross the places pat_str
                        splits, and a wrong split shows in the ids), then tokenizer_config.json
  expect DIR            reads DIR/tiktoken.model, DIR/tokenizer_config.json and the stand-ins, and prints, as JSON, the ids of every
                        text of TEXTS under each variant (tests/data/tiktoken/expected.json; a long text is
                        {"repeat": unit, "times": n, "then": tail}, a run of 4 or more equal ids [id, count])
"""
import base64
import heapq
import importlib.util
import json
import os
import sys

import regex

# The fixture's variants: a name (the key in expected.json) and the stand-in of its tokenization_kimi.py, whose
# TikTokenTokenizer class gives pat_str and the special ids (special_ids), read here by Python itself.
VARIANTS = [("kimi-k2", "tokenization_kimi_k2.py"), ("kimi-k2.5", "tokenization_kimi_k25.py")]

# The fixture's added_tokens_decoder (offsets from the number of ranks): Kimi-K2's layout, with its flags.
SPECIALS = [(0, "[BOS]", True), (1, "[EOS]", True), (2, "<|im_end|>", True), (3, "<|im_user|>", True),
            (4, "<|im_assistant|>", True), (9, "<|im_system|>", True), (11, "<|tool_calls_section_begin|>", False),
            (13, "<|tool_call_begin|>", False), (17, "<|im_middle|>", True), (254, "[UNK]", True),
            (255, "[PAD]", True)]

TEXTS = [
    "Hello, how are you?",
    "你好，世界！混合English文本。",
    "你好。、世界",
    "abc汉字def", "汉字abc", "ABC汉DEF", "Abc汉def", "A汉a", "mix汉字andASCII",
    "々〇〻 日々", "こんにちは世界", "안녕하세요 세계", "Здравствуй, мир", "γειά σου κόσμε", "مرحبا بالعالم",
    "don't we're I'll it's can't", "I'LL WE'RE DON'T", "THE'S the'S", "Straße'S x'ſ", "'s 's",
    "20260910 tokens 1234567 42", "١٢٣٤٥ ٦ ½¾ ⅣⅤ", "3.14159, -42, 1e10",
    "  spaced\ttabs\nand newlines  ", "a   b", "\n\n\n", " \n ", "x  \n  y", "line1\r\nline2\r\n\r\n",
    "end   ", "   ", "\t\t\tx", "a\u00a0b\u3000c\u2028d", "a\x1cb\x1d c", "a\u0085b",
    "cafe\u0301 e\u0301\u0327 A\u0301b", "\u0301\u0301x",
    "emoji 🙂🙃 👩\u200d💻 🇺🇸", "zero\u200dwidth\u200cjoiners\ufeff",
    "!Hello ?? ... --- ***", "a.b,c;d:e!f?g", "(x) [y] {z} <w>", "path/to/file.py:12",
    "def f(x):\n    return x ** 2  # sq\n",
    "[BOS]Hello[EOS]", "<|im_user|>Hi<|im_end|><|im_assistant|>Yo<|im_end|>",
    "<|tool_calls_section_begin|><|tool_call_begin|>f:0", "x<|reserved_token_300|>y", "<|reserved_token_999|>",
    "<|im_end", "[PAD][UNK]",
    ("a", 25002, "b"),
    ("汉", 25003, ""),
    (" ", 25001, "z"),
]


def text_of(t):  # TEXTS entries: a string, or (unit, times, tail) for the long runs
    return t if isinstance(t, str) else t[0] * t[1] + t[2]


def json_text(t):
    return t if isinstance(t, str) else {"repeat": t[0], "times": t[1], "then": t[2]}


def json_ids(ids):  # a run of 4 or more equal ids as [id, count]
    out, i = [], 0
    while i < len(ids):
        j = i
        while j < len(ids) and ids[j] == ids[i]:
            j += 1
        out.extend([[ids[i], j - i]] if j - i >= 4 else ids[i:j])
        i = j
    return out


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def byte_pair_merge(ranks, piece):
    """tiktoken's _byte_pair_merge: repeatedly merge the adjacent pair whose concatenation has the lowest rank,
    the leftmost of equal ones. A heap of (rank, start) over a linked list of parts, stale entries skipped, so that
    25,000-byte pieces take seconds, not hours; the merge order is that of the plain loop."""
    n = len(piece)
    if n == 1:
        return [ranks[piece]]
    end = list(range(1, n + 1))   # part starting at i ends at end[i]
    prev = list(range(-1, n - 1))
    alive = [True] * n
    heap = []

    def push(i):
        j = end[i]
        if j < n:
            r = ranks.get(piece[i:end[j]])
            if r is not None:
                heapq.heappush(heap, (r, i, end[j]))

    for i in range(n - 1):
        push(i)
    while heap:
        r, i, stop = heapq.heappop(heap)
        if not alive[i] or end[i] >= n or end[end[i]] != stop:
            continue  # stale: part i or its right neighbour changed since
        j = end[i]
        alive[j] = False
        end[i] = stop
        if stop < n:
            prev[stop] = i
        if prev[i] >= 0:
            push(prev[i])
        push(i)
    out, i = [], 0
    while i < n:
        out.append(ranks[piece[i:end[i]]])
        i = end[i]
    return out


def load_variant(path):
    """pat_str and the special-id rule of a tokenization_kimi.py stand-in (a file of this repository)."""
    spec = importlib.util.spec_from_file_location("kimi_standin", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.TikTokenTokenizer


def specials_of(cls, ranks, config):
    mapping = {int(k): v["content"] for k, v in config.get("added_tokens_decoder", {}).items()}
    return cls().special_ids(len(ranks), mapping)


def split_runs(s, max_len=25000):  # Kimi's _split_whitespaces_or_nonwhitespaces
    cur_len, cur_space, start = 0, s[0].isspace() if s else False, 0
    for i in range(len(s)):
        sp = s[i].isspace()
        if cur_space ^ sp:
            cur_len, cur_space = 1, sp
        else:
            cur_len += 1
            if cur_len > max_len:
                yield s[start:i]
                start, cur_len = i, 1
    yield s[start:]


def tiktoken_encode(ranks, pat, specials, text):
    out = []
    special_re = regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)))
    pos = 0
    while True:
        m = special_re.search(text, pos)
        end = m.start() if m else len(text)
        for piece in pat.findall(text[pos:end]):
            b = piece.encode("utf-8")
            out.extend([ranks[b]] if b in ranks else byte_pair_merge(ranks, b))
        if not m:
            return out
        out.append(specials[m.group()])
        pos = m.end()


def kimi_encode(ranks, pat, specials, text):
    out = []
    for i in range(0, len(text), 400_000):
        for sub in split_runs(text[i:i + 400_000]):
            out.extend(tiktoken_encode(ranks, pat, specials, sub))
    return out


def decode(ranks, specials, ids):
    inv = {v: k for k, v in ranks.items()}
    inv.update({v: k.encode("utf-8") for k, v in specials.items()})
    return b"".join(inv[i] for i in ids).decode("utf-8", errors="replace")


def train(out_dir, merges=700):
    """Byte-pair merges over the fixture's texts taken whole (no split), most frequent pair first."""
    corpus = [t for t in TEXTS if isinstance(t, str)] + ["aa" * 8, "ab", "汉汉汉汉", "  ", "    "]
    words = [list(bytes([c]) for c in t.encode("utf-8")) for t in corpus]
    words = [[bytes(b) for b in w] for w in words]
    vocab = [bytes([b]) for b in range(256)]
    known = set(vocab)
    while len(vocab) < 256 + merges:
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        cands = [(c, p) for p, c in counts.items() if p[0] + p[1] not in known]
        if not cands:
            break
        _, (a, b) = max(cands, key=lambda x: (x[0], -len(x[1][0] + x[1][1]), x[1]))
        t = a + b
        vocab.append(t)
        known.add(t)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [t]
                i += 1
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
        for r, t in enumerate(vocab):
            f.write(f"{base64.b64encode(t).decode()} {r}\n")
    n = len(vocab)
    cfg = {"added_tokens_decoder": {str(n + off): {"content": c, "lstrip": False, "normalized": False,
                                                   "rstrip": False, "single_word": False, "special": sp}
                                    for off, c, sp in SPECIALS},
           "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
           "tokenizer_class": "TikTokenTokenizer"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def expect(d):
    ranks = load_ranks(os.path.join(d, "tiktoken.model"))
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        config = json.load(f)
    out = {"texts": [json_text(t) for t in TEXTS], "ids": {}}
    for name, py in VARIANTS:
        cls = load_variant(os.path.join(d, py))
        specials = specials_of(cls, ranks, config)
        p = regex.compile(cls.pat_str, regex.V1)
        ids = [kimi_encode(ranks, p, specials, text_of(t)) for t in TEXTS]
        for t, i in zip(TEXTS, ids):
            assert decode(ranks, specials, i) == text_of(t), text_of(t)[:40]
        out["ids"][name] = [json_ids(i) for i in ids]
    # one text a line
    sys.stdout.write('{"texts": [\n')
    sys.stdout.write(",\n".join(json.dumps(t, ensure_ascii=True) for t in out["texts"]))
    sys.stdout.write('],\n"ids": {')
    for k, (name, ids) in enumerate(out["ids"].items()):
        sys.stdout.write(("," if k else "") + f'\n"{name}": [\n')
        sys.stdout.write(",\n".join(json.dumps(i, separators=(",", ":")) for i in ids))
        sys.stdout.write("]")
    sys.stdout.write("}}\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "train":
        train(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "expect":
        expect(sys.argv[2])
    else:
        sys.exit(__doc__)
