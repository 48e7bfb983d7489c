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


class Added:
    """A tokenizer's added tokens, with the lengths they have (for the lookups below)."""

    def __init__(self, tokens):
        self.tokens = set(t for t in tokens if t)
        self.lengths = sorted(set(len(t) for t in self.tokens))

    def __iter__(self):
        return iter(self.tokens)


def inside_added(text, at, added):
    """Where an added token that `text` holds across position `at` (begun before it, ended after it) starts."""
    if not added.lengths or at == 0 or at >= len(text):
        return None
    for a in range(max(0, at - added.lengths[-1] + 1), at):
        if any(a + n > at and text[a:a + n] in added.tokens for n in added.lengths):
            return a
    return None


def aligned(a, b, added):
    """The aligned common prefix: the longest common prefix of a and b, ending inside no added token of either."""
    n = lcp(a, b)
    while True:
        cut = [x for x in (inside_added(a, n, added), inside_added(b, n, added)) if x is not None]
        if not cut:
            return n
        n = min(cut)


class MaskError(ValueError):
    """The template renders the conversation, but an assistant turn's output cannot be located in it."""


def supervised_spans(r, messages, tools, variables, added):
    """docs/spec.md 2.6: the supervised character ranges of the full rendering, per assistant turn."""
    full, gen = r.render(messages, tools, False, variables)
    if r.has_generation:
        return [(a, b) for a, b in gen if b > a]

    def render(ms, agp=False):
        return r.render(ms, tools, agp, variables)[0]

    def alone(i):
        """The stand-in turn rendered as the last message after messages[:i], and where its content begins."""
        try:
            text = render(messages[:i] + [{"role": "assistant", "content": SENTINEL}])
        except Exception:  # noqa: BLE001 (the template refuses the stand-in, as any failure in C++)
            return "", -1
        return text, text.find(SENTINEL)

    def end_by_stand_in(i, s):
        if i + 1 >= len(messages):
            return None, "the turn's output cannot be found"
        text_alone, at = alone(i)
        if at < 0:
            return None, "the turn's output cannot be found"
        try:
            followed = render(messages[:i] + [{"role": "assistant", "content": SENTINEL}, messages[i + 1]])
        except Exception:  # noqa: BLE001
            return None, "the turn's output cannot be found"
        if SENTINEL not in followed:
            return None, "the turn's output cannot be found"
        upto_next = render(messages[: i + 2])
        after_followed = followed[followed.index(SENTINEL) + len(SENTINEL):]
        after_alone = text_alone[at + len(SENTINEL):]
        if not upto_next.endswith(after_followed):
            return None, "the turn's end cannot be found"
        e = len(upto_next) - len(after_followed)
        if e < s or lcp(upto_next, full) < e:
            return None, "the turn's end cannot be found"
        closing = min(aligned(after_alone, after_followed, added), aligned(after_alone, full[e:], added))
        if closing == 0:
            # another closing token once later turns follow (the last turn's differs)
            lead_alone = [t for t in added if after_alone.startswith(t)]
            lead_followed = [t for t in added if after_followed.startswith(t)]
            if lead_alone and lead_followed:
                closing = max(len(t) for t in lead_followed)
        return e + closing, None

    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        # start: where the rendering departs from the prompt served for the turn; when that is inside the history
        # before the turn, where the stand-in turn rendered last has its content (if the rendering agrees up to it)
        prompt = render(messages[:i], True)
        s = aligned(prompt, full, added)
        if s < len(prompt) and s < aligned(render(messages[:i]), prompt, added):
            text_alone, at = alone(i)
            if at > s and lcp(text_alone, full) >= at:
                s = at
        # end: the turn rendered as the last message, when the rendering begins with it
        last = render(messages[: i + 1])
        if full.startswith(last) and len(last) > s:
            e = len(last)
        else:
            # else a stand-in turn, alone and followed by the next message, locates the content's end and closing;
            # where it cannot, the turn ends where the rendering departs from the turn rendered as the last message
            e, why = end_by_stand_in(i, s)
            if e is None:
                e = aligned(last, full, added)
                if e <= s:
                    raise MaskError(f"assistant turn {i}: {why}")
        # whitespace after the turn's final added token (the separator before the next turn) is not output
        body = full[s:e]
        stripped = body.rstrip()
        if stripped != body and any(stripped.endswith(t) for t in added):
            e = s + len(stripped)
        if e > s:
            spans.append((s, e))
    return spans


def main():
    cache, added_cache = {}, {}
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
                    added = tuple(req.get("added_tokens") or [])
                    if added not in added_cache:
                        added_cache[added] = Added(added)
                    spans = supervised_spans(r, msgs, tools, variables, added_cache[added])
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
