#!/usr/bin/env python3
# tests/oracle/render_chat.py — the chat-template oracle of tests/io/chat_template.cpp: renders chat templates
# with Python's Jinja2 in the environment Hugging Face's apply_chat_template builds (transformers
# utils/chat_template_utils.py: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
# extensions=[AssistantTracker, loopcontrols]), its tojson (ensure_ascii=False), raise_exception, strftime_now),
# and derives the supervised spans by the rule of docs/spec.md 2.6 (written here a second time, from the spec, in
# Python). Needs only Debian's python3-jinja2.
#
# stdin: one JSON object per line
#   {"template": str, "messages": [...], "add_generation_prompt": bool (default false), "tools": [...] | null,
#    "vars": {name: value, ...} (bos_token, enable_thinking, template arguments, ...), "now": epoch seconds
#    (what strftime_now formats; default the current time), "mask": bool (also compute the supervised spans),
#    "added_tokens": [str, ...] (the tokenizer's added tokens, for the span rule's end-of-turn trim)}
# stdout: one line per request: {"text": str, "spans": [[begin, end], ...] (UTF-8 byte offsets; with "mask" and
#   no generation prompt), "generation": bool (the template has {% generation %})}; "mask_error": str in place of
#   "spans" when the template renders the conversation but a turn's output cannot be located; or {"error": str,
#   "raised": bool} when the template does not render it (raised: its raise_exception).
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

SENTINEL = "dflashsentinel7f3a"


class AssistantTracker(Extension):
    """transformers' {% generation %} tag: records the character range each block renders."""

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(activate_tracker=self.activate_tracker)
        self._rendered_blocks = None
        self._generation_indices = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        rv = caller()
        if self._rendered_blocks is not None:
            start = len("".join(self._rendered_blocks))
            self._generation_indices.append((start, start + len(rv)))
        return rv

    def activate_tracker(self, rendered_blocks, generation_indices):
        self._rendered_blocks = rendered_blocks
        self._generation_indices = generation_indices
        return self

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self._rendered_blocks = None
        self._generation_indices = None


class Renderer:
    def __init__(self, source, now):
        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt):
            return (datetime.fromtimestamp(now) if now else datetime.now()).strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[AssistantTracker, loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        self.template = env.from_string(source)
        self.env = env
        self.has_generation = "{% generation" in source or "{%- generation" in source

    def render(self, messages, tools, agp, variables):
        blocks, indices = [], []
        with self.env.activate_tracker(blocks, indices):
            for b in self.template.generate(messages=messages, tools=tools, documents=None,
                                            add_generation_prompt=agp, **variables):
                blocks.append(b)
        return "".join(blocks), indices


def nbytes(s):
    return len(s.encode("utf-8"))


def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class MaskError(ValueError):
    """The template renders the conversation, but an assistant turn's output cannot be located in it."""


def supervised_spans(r, messages, tools, variables, added):
    """docs/spec.md 2.6: the supervised character ranges of the full rendering, per assistant turn."""
    full, gen = r.render(messages, tools, False, variables)
    if r.has_generation:
        return [(a, b) for a, b in gen if b > a]
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        prompt, _ = r.render(messages[:i], tools, True, variables)
        s = lcp(prompt, full)
        last, _ = r.render(messages[: i + 1], tools, False, variables)
        if full.startswith(last) and len(last) > s:
            e = len(last)
        else:
            nxt, _ = r.render(messages[: i + 2], tools, False, variables)
            sent = {"role": "assistant", "content": SENTINEL}
            with_s, _ = r.render(messages[:i] + [sent] + messages[i + 1: i + 2], tools, False, variables)
            alone, _ = r.render(messages[:i] + [sent], tools, False, variables)
            p, q = with_s.find(SENTINEL, s), alone.find(SENTINEL, s)
            if p < 0 or q < 0 or not full.startswith(nxt):
                raise MaskError(f"assistant turn {i}: the template renders it so that its output cannot be found")
            tail = with_s[p + len(SENTINEL):]
            if not nxt.endswith(tail) or len(nxt) - len(tail) < s:
                raise MaskError(f"assistant turn {i}: the turn's end cannot be found")
            e = len(nxt) - len(tail)
            t1 = alone[q + len(SENTINEL):]
            if t1 and tail.startswith(t1):
                e += len(t1)
            else:
                tok_t1 = next((t for t in added if t1.startswith(t)), None)
                tok_tail = next((t for t in sorted(added, key=len, reverse=True) if tail.startswith(t)), None)
                if tok_t1 and tok_tail:
                    e += len(tok_tail)
        # whitespace after the turn's final added token (the separator before the next turn) is not output
        body = full[s:e]
        stripped = body.rstrip()
        if stripped != body and any(stripped.endswith(t) for t in added):
            e = s + len(stripped)
        if e > s:
            spans.append((s, e))
    return spans


def main():
    cache = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            key = (req["template"], req.get("now"))
            if key not in cache:
                cache[key] = Renderer(req["template"], req.get("now"))
            r = cache[key]
            variables = dict(req.get("vars") or {})
            tools = req.get("tools")
            msgs = req["messages"]
            agp = bool(req.get("add_generation_prompt", False))
            out = {"generation": r.has_generation}
            out["text"], _ = r.render(msgs, tools, agp, variables)
            if req.get("mask") and not agp:
                try:
                    spans = supervised_spans(r, msgs, tools, variables, req.get("added_tokens") or [])
                    out["spans"] = [[nbytes(out["text"][:a]), nbytes(out["text"][:b])] for a, b in spans]
                except MaskError as e:
                    out["mask_error"] = str(e)
        except Exception as e:  # noqa: BLE001 (every failure is reported to the test)
            out = {"error": str(e), "raised": isinstance(e, jinja2.exceptions.TemplateError)
                   and not isinstance(e, jinja2.exceptions.TemplateSyntaxError)}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
