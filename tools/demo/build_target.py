#!/usr/bin/env python3
"""Builds the project's demo target (run on the GPU machine): corpus -> tokenizer -> prompts -> pretraining.

    python3 tools/demo/build_target.py [--out assets/demo] [--budget 360] [--deadline EPOCH_SECONDS]

Outputs (assets/demo/):
  corpus.json                 which Python files were used (per split: count, bytes, sha256 of the sorted
                              "relpath<TAB>size" lines), filters, skip counts, token counts
  prompts_train.jsonl.gz      4000 rows {"prompt": ...} cut from train-split files
  prompts_eval.jsonl.gz       300 rows from held-out files
  target/                     Hugging Face Qwen3ForCausalLM (config.json, model.safetensors bf16,
                              generation_config.json) + tokenizer.json + tokenizer_config.json + TRAINING.md

Stages write their files as soon as they are done, so a failure late in training keeps the tokenizer and
the prompts. The training stops at --budget seconds of wall clock (or earlier, to end before --deadline);
the cosine schedule is planned from the step rate measured after a short warm-up.
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import math
import os
import random
import re
import sys
import sysconfig
import time
import traceback

T_START = time.time()

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SKIP_DIRS = {"__pycache__", "test", "tests", "testing", "idle_test", "site-packages", "dist-packages", ".git"}
DEF_RE = re.compile(r"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+[A-Za-z_]\w*")


def log(msg: str) -> None:
    print(f"[{time.time() - T_START:7.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------------------


def path_key(rel: str) -> int:
    return int(hashlib.sha1(rel.encode("utf-8")).hexdigest(), 16)


def is_heldout(rel: str) -> bool:
    """Split rule: sha1(relative path) % 20 == 0 -> held-out (5%)."""
    return path_key(rel) % 20 == 0


def list_sha256(items: list[tuple[str, int]]) -> str:
    """sha256 of the sorted lines "relpath\\tsize\\n" (UTF-8)."""
    h = hashlib.sha256()
    for rel, size in sorted(items):
        h.update(f"{rel}\t{size}\n".encode("utf-8"))
    return h.hexdigest()


def collect_corpus(max_bytes: int, max_file_bytes: int) -> dict:
    """Walks the stdlib and site-packages (sysconfig), keeps *.py files of 1..max_file_bytes bytes outside
    test folders, valid UTF-8, without the special-token strings and NUL bytes; selects files in sha1(path)
    order (a fixed pseudo-random order) until max_bytes; returns texts per split sorted by path."""
    paths = sysconfig.get_paths()
    roots = []
    for name, key in (("stdlib", "stdlib"), ("site-packages", "purelib")):
        p = paths.get(key)
        if p and os.path.isdir(p) and all(os.path.realpath(p) != os.path.realpath(r) for _, r in roots):
            roots.append((name, p))
    skipped = {"too_large": 0, "empty": 0, "not_utf8": 0, "special_token_text": 0, "nul_byte": 0,
               "over_corpus_cap": 0, "symlink": 0}
    eligible = []  # (key, rel, abspath, size)
    for name, root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith((".dist-info",
                                                                                                ".egg-info")))
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                full = os.path.join(dirpath, fn)
                if os.path.islink(full):
                    skipped["symlink"] += 1
                    continue
                try:
                    size = os.path.getsize(full)
                except OSError:
                    continue
                if size == 0:
                    skipped["empty"] += 1
                    continue
                if size > max_file_bytes:
                    skipped["too_large"] += 1
                    continue
                rel = name + "/" + os.path.relpath(full, root).replace(os.sep, "/")
                eligible.append((path_key(rel), rel, full, size))
    eligible.sort()
    n_eligible = len(eligible)
    bytes_eligible = sum(e[3] for e in eligible)
    chosen = {"train": [], "heldout": []}
    total = 0
    for key, rel, full, size in eligible:
        if total >= max_bytes:
            skipped["over_corpus_cap"] += 1
            continue
        try:
            with open(full, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8")
        except (UnicodeDecodeError, OSError):
            skipped["not_utf8"] += 1
            continue
        if "\x00" in text:
            skipped["nul_byte"] += 1
            continue
        if any(s in text for s in SPECIALS):
            skipped["special_token_text"] += 1
            continue
        chosen["heldout" if key % 20 == 0 else "train"].append((rel, len(raw), text))
        total += len(raw)
    for k in chosen:
        chosen[k].sort()
    return {"roots": roots, "splits": chosen, "skipped": skipped, "eligible_files": n_eligible,
            "eligible_bytes": bytes_eligible}


# ----------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------


def added_token(content: str):
    from tokenizers import AddedToken

    try:
        return AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    except TypeError:
        return AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False)


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE like Qwen2's: NFC normalizer, Split(Qwen2 regex, isolated) + ByteLevel(no prefix space,
    no regex), ByteLevel decoder. Trained to vocab_size - 4 regular tokens; the 4 special tokens are added
    after them (ids vocab_size-4 .. vocab_size-1, never produced from corpus text)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_special_tokens([added_token(s) for s in SPECIALS])
    # Same ByteLevel flags as Qwen2's tokenizer.json (they only affect offsets, but readers may look at them).
    j = json.loads(tok.to_str())
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    j["decoder"] = dict(bl)
    j["post_processor"] = dict(bl)
    for pt in j["pre_tokenizer"]["pretokenizers"]:
        if pt.get("type") == "ByteLevel":
            pt.update(bl)
    return Tokenizer.from_str(json.dumps(j))


def tokenizer_config(tok, max_len: int) -> dict:
    dec = {}
    for s in SPECIALS:
        dec[str(tok.token_to_id(s))] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": True}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": dec,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "mask_token": "<|MASK|>",
        "model_max_length": max_len,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def encode_all(tok, texts: list[str], chunk: int = 4096):
    """Encodes texts in parallel (tokenizers' batch encode uses all cores); returns a list of int32 arrays."""
    import numpy as np

    enc = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    out = []
    for i in range(0, len(texts), chunk):
        for e in enc(texts[i:i + chunk], add_special_tokens=False):
            out.append(np.asarray(e.ids, dtype=np.int32))
    return out


def concat_docs(arrs, eot: int):
    """Documents joined as doc0 <eot> doc1 <eot> ... <eot>."""
    import numpy as np

    parts = []
    sep = np.array([eot], dtype=np.int32)
    for a in arrs:
        parts.append(a)
        parts.append(sep)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


# ----------------------------------------------------------------------------------------------------------
# Prompts
# ----------------------------------------------------------------------------------------------------------


def prompt_candidates(text: str) -> list[int]:
    """Line indices of top-level or nested `def` / `async def` / `class` lines."""
    return [i for i, line in enumerate(text.split("\n")) if DEF_RE.match(line)]


def cut_prompt(lines: list[str], i: int, n_before: int, n_body: int) -> str:
    """Up to n_before lines before line i, then lines i .. i+n_body-1 (the signature and maybe the docstring
    start); no trailing newline (the completion starts with the newline and the next line's indentation)."""
    start = max(0, i - n_before)
    end = min(len(lines), i + n_body)
    while start < i and not lines[start].strip():  # no leading blank lines
        start += 1
    return "\n".join(lines[start:end]).rstrip()


def make_prompts(files: list[tuple], tok, n: int, seed: int, max_tokens: int) -> list[str]:
    """Deterministic: files in a seeded shuffled order, one prompt per file per pass (more passes if the
    split has too few files); context 0..20 lines, body 1..3 lines; trimmed from the top to <= max_tokens."""
    rng = random.Random(seed)
    order = list(range(len(files)))
    rng.shuffle(order)
    prompts, seen = [], set()
    for _pass in range(4):
        for fi in order:
            if len(prompts) >= n:
                return prompts
            rel, _size, text = files[fi]
            lines = text.split("\n")
            cands = prompt_candidates(text)
            if not cands:
                continue
            i = rng.choice(cands)
            if (fi, i) in seen:
                continue
            seen.add((fi, i))
            n_before = rng.randint(0, 20)
            n_body = rng.randint(1, 3)
            while True:
                p = cut_prompt(lines, i, n_before, n_body)
                if len(tok.encode(p, add_special_tokens=False).ids) <= max_tokens or n_before == 0:
                    break
                n_before = max(0, n_before - 4)
            if not p.strip() or len(tok.encode(p, add_special_tokens=False).ids) > max_tokens:
                continue
            prompts.append(p)
    return prompts


def write_jsonl_gz(path: str, rows: list[dict]) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as g:
        for r in rows:
            g.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))
    with open(path, "wb") as f:
        f.write(buf.getvalue())


# ----------------------------------------------------------------------------------------------------------
# Model and training
# ----------------------------------------------------------------------------------------------------------


def make_model_config(vocab: int, eot: int):
    import transformers

    kw = dict(vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
              rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, hidden_act="silu",
              bos_token_id=None, eos_token_id=eot, pad_token_id=eot, initializer_range=0.02)
    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        try:
            return transformers.Qwen3Config(**kw, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        except TypeError as e:
            log(f"note: Qwen3Config(rope_parameters=...) refused ({e}); using rope_theta")
    return transformers.Qwen3Config(**kw, rope_theta=10000.0, rope_scaling=None)


def lr_at(step: int, total: int, warmup: int, peak: float, floor_frac: float = 0.1) -> float:
    """Linear warmup to peak over `warmup` steps, then cosine to floor_frac*peak at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def eval_loss(model, tokens, n_seqs: int, seq_len: int, batch: int) -> float:
    """Mean next-token loss on n_seqs windows at evenly spaced fixed offsets (deterministic), bf16 autocast."""
    import torch
    import torch.nn.functional as F

    n_avail = tokens.numel() - seq_len - 1
    if n_avail <= 0:
        return float("nan")
    n_seqs = max(1, min(n_seqs, n_avail // seq_len))
    # integer arithmetic: a float32 linspace rounds offsets of a 1e8-token array past the end
    starts = ((torch.arange(n_seqs, dtype=torch.int64) * n_avail) // max(1, n_seqs - 1)).to(tokens.device)
    was_training = model.training
    model.eval()
    tot, cnt = 0.0, 0
    ar = torch.arange(seq_len + 1, device=tokens.device)
    with torch.no_grad():
        for i in range(0, n_seqs, batch):
            idx = starts[i:i + batch, None] + ar[None]
            chunk = tokens[idx].long()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1),
                                   reduction="sum")
            tot += float(loss)
            cnt += chunk[:, 1:].numel()
    if was_training:
        model.train()
    return tot / max(1, cnt)


def train(model, train_tok, args, train_budget: float) -> dict:
    """Pretraining loop: random windows of seq_len+1 tokens, bf16 autocast, AdamW (betas 0.9/0.95, wd 0.1 on
    matrices), grad clip 1.0, warmup + cosine planned from the measured step rate so it ends at the budget."""
    import torch
    import torch.nn.functional as F

    dev = train_tok.device
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
        fused = True
    except Exception:  # noqa: BLE001
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
        fused = False
    fwd = model
    compiled = False
    if args.compile:
        try:
            fwd = torch.compile(model)
            compiled = True
        except Exception as e:  # noqa: BLE001
            log(f"torch.compile unavailable ({e!r}); eager")
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    T, Bsz, V = args.seq_len, args.batch, model.config.vocab_size
    ar = torch.arange(T + 1, device=dev)
    n_start = train_tok.numel() - T - 1

    def step_fn(step, lr):
        nonlocal fwd, compiled
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, n_start, (Bsz,), device=dev, generator=gen)
        chunk = train_tok[starts[:, None] + ar[None]].long()
        x, y = chunk[:, :-1], chunk[:, 1:]
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = fwd(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
            loss.backward()
        except Exception as e:  # noqa: BLE001
            if not compiled:
                raise
            log(f"compiled step failed ({e!r}); falling back to eager")
            opt.zero_grad(set_to_none=True)
            fwd, compiled = model, False
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = fwd(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
            loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach(), gn.detach()

    model.train()
    t0 = time.time()
    hard_end = t0 + train_budget
    warmup_guess = 100
    total = 10 ** 9
    warmup = warmup_guess
    m0, m1 = 5, 25  # rate measured over steps [m0, m1)
    t_m0 = None
    step = 0
    hist = []
    ema = None
    last_log = t0
    while True:
        if step >= total or time.time() >= hard_end:
            break
        if step == m0:
            torch.cuda.synchronize()
            t_m0 = time.time()
        if step == m1:
            torch.cuda.synchronize()
            rate = (m1 - m0) / max(1e-6, time.time() - t_m0)
            left = hard_end - time.time()
            total = m1 + max(1, int(left * rate * 0.97))
            warmup = min(warmup_guess, max(m1, total // 10))
            log(f"measured {rate:.2f} steps/s ({rate * Bsz * T / 1e6:.2f} M tok/s); planned {total} steps, "
                f"warmup {warmup}")
        lr = lr_at(step, total if step >= m1 else 10 ** 9, warmup, args.lr)
        loss, gn = step_fn(step, lr)
        step += 1
        if step % 25 == 0 or step == total:
            lv = float(loss)
            if not math.isfinite(lv):
                raise RuntimeError(f"non-finite loss at step {step}")
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            if time.time() - last_log > 20 or step == total:
                last_log = time.time()
                hist.append((step, round(lv, 4)))
                log(f"step {step}/{total if total < 10 ** 9 else '?'} loss {lv:.4f} (ema {ema:.4f}) "
                    f"gnorm {float(gn):.3f} lr {lr:.2e}")
    torch.cuda.synchronize()
    wall = time.time() - t0
    return {"steps": step, "planned_steps": total if total < 10 ** 9 else step, "warmup_steps": warmup,
            "wall_s": wall, "tokens_seen": step * Bsz * T, "loss_ema": ema, "history": hist,
            "fused_adamw": fused, "compiled": compiled}


# ----------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="assets/demo")
    ap.add_argument("--budget", type=float, default=360.0, help="training wall-clock seconds")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="epoch seconds by which the whole script must end (training is shortened to fit)")
    ap.add_argument("--post-reserve", type=float, default=40.0, help="seconds kept for eval/save after training")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-corpus-mb", type=float, default=400.0)
    ap.add_argument("--max-file-kb", type=float, default=200.0)
    ap.add_argument("--tok-sample-mb", type=float, default=30.0)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--compile", action="store_true", help="try torch.compile (falls back to eager on error)")
    ap.add_argument("--eval-seqs", type=int, default=256)
    ap.add_argument("--n-train-prompts", type=int, default=4000)
    ap.add_argument("--n-eval-prompts", type=int, default=300)
    ap.add_argument("--prompt-max-tokens", type=int, default=200)
    args = ap.parse_args()

    out = args.out
    tdir = os.path.join(out, "target")
    os.makedirs(tdir, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    # ---- corpus
    corpus = collect_corpus(int(args.max_corpus_mb * 1e6), int(args.max_file_kb * 1024))
    sp = corpus["splits"]
    log(f"corpus: eligible {corpus['eligible_files']} files / {corpus['eligible_bytes'] / 1e6:.1f} MB; "
        f"train {len(sp['train'])} files {sum(x[1] for x in sp['train']) / 1e6:.1f} MB, "
        f"held-out {len(sp['heldout'])} files {sum(x[1] for x in sp['heldout']) / 1e6:.1f} MB; "
        f"skipped {corpus['skipped']}")
    if len(sp["train"]) < 100 or len(sp["heldout"]) < 10:
        raise SystemExit("corpus too small: is this the GPU machine's python with site-packages?")
    corpus_json = {
        "description": "Python source files of the machine that built the demo target (stdlib + site-packages)",
        "python": sys.version.split()[0],
        "roots": {n: p for n, p in corpus["roots"]},
        "filters": {"extension": ".py", "max_file_bytes": int(args.max_file_kb * 1024),
                    "skip_dirs": sorted(SKIP_DIRS), "skip": "*.dist-info, *.egg-info, symlinks, empty, "
                    "not UTF-8, NUL bytes, files containing a special-token string " + ", ".join(SPECIALS),
                    "selection": f"files in sha1(relpath) order until {args.max_corpus_mb} MB",
                    "split": "sha1(relpath) % 20 == 0 -> heldout, else train"},
        "eligible_files": corpus["eligible_files"], "eligible_bytes": corpus["eligible_bytes"],
        "skipped": corpus["skipped"],
        "list_hash": "sha256 of the sorted lines 'relpath<TAB>size<LF>' (UTF-8), relpath = root name + '/' + path",
        "splits": {k: {"files": len(v), "bytes": sum(x[1] for x in v),
                       "sha256": list_sha256([(x[0], x[1]) for x in v])} for k, v in sp.items()},
    }
    with open(os.path.join(out, "corpus.json"), "w") as f:
        json.dump(corpus_json, f, indent=2)

    # ---- tokenizer
    t = time.time()
    sample, nbytes = [], 0
    for rel, size, text in sorted(sp["train"], key=lambda x: path_key(x[0])):
        if nbytes >= args.tok_sample_mb * 1e6:
            break
        sample.append(text)
        nbytes += size
    tok = train_tokenizer(sample, args.vocab)
    V = tok.get_vocab_size(with_added_tokens=True)
    ids_sp = {s: tok.token_to_id(s) for s in SPECIALS}
    log(f"tokenizer: {V} tokens (trained on {len(sample)} files, {nbytes / 1e6:.1f} MB) specials {ids_sp} "
        f"in {time.time() - t:.1f}s")
    if V > args.vocab:
        raise SystemExit(f"tokenizer has {V} tokens > model vocab {args.vocab}")
    eot, mask_id = ids_sp["<|endoftext|>"], ids_sp["<|MASK|>"]
    tok.save(os.path.join(tdir, "tokenizer.json"))
    with open(os.path.join(tdir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tok, 2048), f, indent=2)
    probe = "def f(x):\n    return x  # ünïcode\n\n\nclass A:\n\tpass\n"
    assert tok.decode(tok.encode(probe, add_special_tokens=False).ids) == probe, "tokenizer round trip"
    assert tok.encode("<|MASK|>", add_special_tokens=False).ids == [mask_id]

    # ---- prompts (before training: they need only files and tokenizer)
    t = time.time()
    pt = make_prompts(sp["train"], tok, args.n_train_prompts, args.seed + 1, args.prompt_max_tokens)
    pe = make_prompts(sp["heldout"], tok, args.n_eval_prompts, args.seed + 2, args.prompt_max_tokens)
    write_jsonl_gz(os.path.join(out, "prompts_train.jsonl.gz"), [{"prompt": p} for p in pt])
    write_jsonl_gz(os.path.join(out, "prompts_eval.jsonl.gz"), [{"prompt": p} for p in pe])
    plen = [len(tok.encode(p, add_special_tokens=False).ids) for p in pt[:500]]
    log(f"prompts: train {len(pt)} eval {len(pe)} (mean {sum(plen) / max(1, len(plen)):.0f} tokens, "
        f"max {max(plen) if plen else 0}) in {time.time() - t:.1f}s")
    if len(pt) < args.n_train_prompts or len(pe) < args.n_eval_prompts:
        log(f"WARNING: fewer prompts than asked ({len(pt)}/{args.n_train_prompts}, {len(pe)}/{args.n_eval_prompts})")

    # ---- tokenize the corpus
    import numpy as np
    import torch

    t = time.time()
    tr_ids = concat_docs(encode_all(tok, [x[2] for x in sp["train"]]), eot)
    ho_ids = concat_docs(encode_all(tok, [x[2] for x in sp["heldout"]]), eot)
    n_tr_bytes = sum(x[1] for x in sp["train"])
    log(f"tokenized: train {tr_ids.size / 1e6:.1f} M tokens ({n_tr_bytes / max(1, tr_ids.size):.2f} bytes/token), "
        f"held-out {ho_ids.size / 1e6:.2f} M tokens in {time.time() - t:.1f}s")
    assert not (tr_ids == mask_id).any() and not (ho_ids == mask_id).any(), "<|MASK|> found in the corpus"
    corpus_json["tokens"] = {"train": int(tr_ids.size), "heldout": int(ho_ids.size),
                             "separator": "<|endoftext|> after every file"}
    with open(os.path.join(out, "corpus.json"), "w") as f:
        json.dump(corpus_json, f, indent=2)
    del sample

    # ---- model
    import transformers

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cfg = make_model_config(args.vocab, eot)
    torch.manual_seed(args.seed)
    model = transformers.Qwen3ForCausalLM(cfg)
    try:
        model.set_attn_implementation("sdpa")
    except Exception as e:  # noqa: BLE001
        log(f"note: set_attn_implementation('sdpa') failed ({e!r}); using {getattr(cfg, '_attn_implementation', '?')}")
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    log(f"model: Qwen3 {n_params / 1e6:.2f} M params, tied={tied}, attn={getattr(model.config, '_attn_implementation', '?')}")
    train_tok = torch.from_numpy(tr_ids).to(dev)
    ho_tok = torch.from_numpy(ho_ids).to(dev)

    train_budget = args.budget
    if args.deadline > 0:
        train_budget = min(train_budget, args.deadline - time.time() - args.post_reserve)
    train_budget = max(10.0, train_budget)
    log(f"training for {train_budget:.0f}s (budget {args.budget:.0f}s)")
    res = train(model, train_tok, args, train_budget)
    log(f"trained {res['steps']} steps, {res['tokens_seen'] / 1e6:.1f} M tokens in {res['wall_s']:.1f}s")

    # ---- save in Hugging Face format, bf16 (first, so nothing after can lose the trained weights)
    model = model.to(torch.bfloat16)
    model.eval()
    model.config.use_cache = True
    try:
        gc = model.generation_config
        gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = None, eot, eot
        gc.do_sample = False
    except Exception as e:  # noqa: BLE001
        log(f"note: generation_config not set ({e!r})")
    if int(transformers.__version__.split(".")[0]) >= 5:  # v5 removed safe_serialization (always safetensors)
        model.save_pretrained(tdir)
    else:
        model.save_pretrained(tdir, safe_serialization=True)
    with open(os.path.join(tdir, "config.json")) as f:
        cj = json.load(f)
    log(f"saved {sorted(os.listdir(tdir))}; config dtype={cj.get('dtype', cj.get('torch_dtype'))} "
        f"rope={cj.get('rope_parameters', cj.get('rope_theta'))}")
    info = dict(args=args, corpus=corpus, corpus_json=corpus_json, tr_tokens=int(tr_ids.size),
                ho_tokens=int(ho_ids.size), tok_sample_bytes=nbytes, V=V, ids_sp=ids_sp, n_params=n_params,
                res=res, train_budget=train_budget, tr_loss=None, ho_loss=None, notes=[])
    write_training_md(os.path.join(tdir, "TRAINING.md"), info)

    # ---- evaluation of the saved (bf16) weights
    t = time.time()
    try:
        info["ho_loss"] = eval_loss(model, ho_tok, args.eval_seqs, args.seq_len, 64)
        info["tr_loss"] = eval_loss(model, train_tok, args.eval_seqs, args.seq_len, 64)
        log(f"eval (bf16 weights as saved): train {info['tr_loss']:.4f} held-out {info['ho_loss']:.4f} "
            f"in {time.time() - t:.1f}s")
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        info["notes"].append(f"eval failed: {e!r}")

    # ---- verification (not fatal): reload, tokenizer through transformers, a greedy sample
    notes = info["notes"]
    m2 = None
    try:
        try:
            m2 = transformers.Qwen3ForCausalLM.from_pretrained(tdir, dtype=torch.bfloat16).to(dev).eval()
        except TypeError:
            m2 = transformers.Qwen3ForCausalLM.from_pretrained(tdir, torch_dtype=torch.bfloat16).to(dev).eval()
        l2 = eval_loss(m2, ho_tok, 64, args.seq_len, 64)
        l1 = eval_loss(model, ho_tok, 64, args.seq_len, 64)
        notes.append(f"reloaded model held-out loss {l2:.4f} vs in-memory {l1:.4f}"
                     + (" WARNING: differs" if abs(l2 - l1) > 1e-3 else ""))
    except Exception as e:  # noqa: BLE001
        notes.append(f"reload check failed: {e!r}")
    samples = []
    try:
        hf_tok = transformers.AutoTokenizer.from_pretrained(tdir)
        mism = sum(hf_tok(p, add_special_tokens=False)["input_ids"] != tok.encode(p, add_special_tokens=False).ids
                   for p in pe[:50])
        notes.append(f"AutoTokenizer ({type(hf_tok).__name__}) vs tokenizers on 50 eval prompts: {mism} mismatches")
    except Exception as e:  # noqa: BLE001
        notes.append(f"AutoTokenizer check failed: {e!r}")
    try:
        mm = m2 if m2 is not None else model
        for p in pe[:3]:
            ids = torch.tensor([tok.encode(p, add_special_tokens=False).ids], device=dev)
            with torch.no_grad():
                g = mm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=48,
                                do_sample=False, eos_token_id=eot, pad_token_id=eot)
            samples.append((p, tok.decode(g[0, ids.shape[1]:].tolist())))
    except Exception as e:  # noqa: BLE001
        notes.append(f"generate check failed: {e!r}")
    for n in notes:
        log(n)
    for p, c in samples:
        log("SAMPLE prompt tail: " + repr(p[-120:]) + "\n        completion: " + repr(c[:200]))
    write_training_md(os.path.join(tdir, "TRAINING.md"), info)

    size = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(out) for fn in fns)
    fmt = lambda x: "nan" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"SUMMARY demo: steps {res['steps']} tokens {res['tokens_seen'] / 1e6:.0f}M train_loss "
          f"{fmt(info['tr_loss'])} heldout_loss {fmt(info['ho_loss'])} prompts {len(pt)}/{len(pe)} "
          f"size {size / 1e6:.1f} MB total {time.time() - T_START:.0f}s")
    return 0


def write_training_md(path: str, info: dict) -> None:
    """assets/demo/target/TRAINING.md: corpus stats, hyperparameters, steps, tokens, wall time, losses, date,
    device. Written right after saving (losses pending) and again at the end."""
    import tokenizers
    import torch
    import transformers

    a, res, sps = info["args"], info["res"], info["corpus_json"]["splits"]
    f4 = lambda x: "(pending)" if x is None else f"{x:.4f}"  # noqa: E731
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    roots = ", ".join(n for n, _ in info["corpus"]["roots"])
    specials = ", ".join(f"`{k}` = {v}" for k, v in info["ids_sp"].items())
    md = f"""# Demo target: training record

Written by `tools/demo/build_target.py` on {date}; device {torch.cuda.get_device_name(0)}; torch
{torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}.

## Corpus
Python source files of that machine's {roots}: `*.py` up to {a.max_file_kb:.0f} KB, test folders skipped,
valid UTF-8 only, files containing a special-token string skipped; files taken in sha1(path) order up to
{a.max_corpus_mb:.0f} MB; split by sha1(relative path) % 20 (0 -> held-out). Details and list hashes:
`../corpus.json`.

| split | files | bytes | tokens |
|---|---|---|---|
| train | {sps['train']['files']} | {sps['train']['bytes']} | {info['tr_tokens']} |
| held-out | {sps['heldout']['files']} | {sps['heldout']['bytes']} | {info['ho_tokens']} |

## Tokenizer
Byte-level BPE trained with `tokenizers` on {info['tok_sample_bytes'] / 1e6:.1f} MB of the train split: NFC,
Qwen2 split regex + ByteLevel, {info['V']} tokens. Special tokens: {specials}. `<|MASK|>` is the drafter's
mask token: a reserved embedding row that never occurs in the corpus.

## Model
Qwen3ForCausalLM: hidden 256, 8 layers, 4 heads / 2 kv heads, head_dim 64, intermediate 768, vocab
{a.vocab}, tied embeddings, rope_theta 10000, max_position_embeddings 2048, rms_norm_eps 1e-6;
{info['n_params']} parameters; saved in bfloat16.

## Training
Seed {a.seed}; {res['steps']} steps (planned {res['planned_steps']}, warmup {res['warmup_steps']}) of
{a.batch} x {a.seq_len} tokens = {res['tokens_seen']} tokens seen; wall {res['wall_s']:.1f} s (budget
{info['train_budget']:.0f} s). AdamW lr {a.lr} (linear warmup, cosine to 10%), betas (0.9, 0.95), eps 1e-8,
weight decay {a.wd} on matrices, grad clip 1.0, bf16 autocast, fp32 master weights, fused AdamW
{res['fused_adamw']}, torch.compile {res['compiled']}. Windows sampled uniformly from the concatenated
train tokens (files separated by `<|endoftext|>`).

## Results (next-token loss, nats/token)
| | loss |
|---|---|
| train, last steps (EMA, fp32 weights) | {f4(res['loss_ema'])} |
| train, {a.eval_seqs} fixed windows (bf16 weights as saved) | {f4(info['tr_loss'])} |
| held-out, {a.eval_seqs} fixed windows (bf16 weights as saved) | {f4(info['ho_loss'])} |

Loss history (step, loss): {res['history']}

Checks: {'; '.join(info['notes']) or '(none run yet)'}
"""
    with open(path, "w") as f:
        f.write(md)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        print("SUMMARY demo: FAILED (see log)")
        sys.exit(1)
