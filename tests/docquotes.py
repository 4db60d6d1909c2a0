"""What a user page quotes of tpushim's printed text, compared with what the code prints.

A quoted block is a page's fenced block of output. In a quote, ``…`` stands for any text,
``XXXX`` for a word of any characters but spaces and ``TIMESTAMP`` for digits; spaces are
compared as runs of spaces. With ``timings``, the numbers a run times (seconds, steps per second,
shares in percent) match any number.
"""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def page(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def blocks(text, section=None, lang=""):
    """The fenced blocks of ``text`` (of its ``## section`` only, when given) whose info string
    is ``lang``, in order."""
    if section is not None:
        text = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [
        m.group(2) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S) if m.group(1) == lang
    ]


def _timed(tokens, i):
    token = tokens[i]
    following = tokens[i + 1] if i + 1 < len(tokens) else ""
    return bool(
        re.fullmatch(r"\d+\.\d+%?|\d+%", token)
        or (re.fullmatch(r"\d+", token) and following in ("s", "s,", "s)"))
    )


def line_pattern(line, timings=False):
    """The regular expression a printed line must match in full to be this quoted line."""
    tokens = line.split()
    parts = []
    for i, token in enumerate(tokens):
        if timings and _timed(tokens, i):
            parts.append(r"[0-9.]+%?")
            continue
        pattern = re.escape(token)
        for placeholder, meaning in (("…", ".*"), ("XXXX", r"\S+"), ("TIMESTAMP", r"\d+")):
            pattern = pattern.replace(re.escape(placeholder), meaning)
        parts.append(pattern)
    return r"\s*" + r"\s+".join(parts) + r"\s*"


def unmatched(quote, printed, timings=False):
    """The lines of ``quote`` that are no line of ``printed`` (empty when the page is true)."""
    lines = printed.splitlines()
    missing = []
    for quoted in quote.strip("\n").splitlines():
        pattern = re.compile(line_pattern(quoted, timings))
        if not any(pattern.fullmatch(line) for line in lines):
            missing.append(quoted)
    return missing


def in_order(quote, printed, timings=False):
    """Whether the lines of ``quote`` are lines of ``printed`` in the same order."""
    lines = iter(printed.splitlines())
    for quoted in quote.strip("\n").splitlines():
        pattern = re.compile(line_pattern(quoted, timings))
        if not any(pattern.fullmatch(line) for line in lines):
            return False
    return True


def words(text):
    """``text`` with its runs of whitespace as single spaces (a sentence a page wraps)."""
    return " ".join(text.split())
