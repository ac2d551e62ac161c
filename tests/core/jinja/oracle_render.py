#!/usr/bin/python3
"""Renders a chat template with Jinja2 the way Hugging Face transformers does, as the oracle for
tessera's interpreter (tests/core/jinja_test.cpp).

    oracle_render.py (--template FILE | --source TEXT) [--now EPOCH] < context.json

The context (a JSON object, read in order) gives the template's variables. The environment is
transformers' (utils/chat_template_utils.py): ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, loop controls, a {% generation %} tag, raise_exception(msg), strftime_now(fmt) and
tojson as json.dumps(ensure_ascii=False). --now fixes strftime_now's time (UTC) for repeatable output.
Prints the rendered bytes; on a template error prints "ERROR <type>: <message>" to stderr, exit 3.
Exit 4 when jinja2 is missing."""
import argparse
import json
import sys
from datetime import datetime, timezone

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja2 is not installed for " + sys.executable, file=sys.stderr)
    sys.exit(4)


class GenerationTag(Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template")
    ap.add_argument("--source")
    ap.add_argument("--now", type=int)
    args = ap.parse_args()
    if args.template is not None:
        with open(args.template, encoding="utf-8") as f:
            source = f.read()
    else:
        source = args.source
    context = json.loads(sys.stdin.read())

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        if args.now is not None:
            return datetime.fromtimestamp(args.now, timezone.utc).strftime(fmt)
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        out = env.from_string(source).render(**context)
    except Exception as e:  # the test only needs to know that Jinja2 refused, and why
        print("ERROR %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.exit(3)
    sys.stdout.buffer.write(out.encode("utf-8"))


if __name__ == "__main__":
    main()
