"""Text from outside (the cluster, a request) made safe for a terminal, a table row or a log line."""

from __future__ import annotations

from collections.abc import Callable


def _python(char: str) -> str:
    return repr(char)[1:-1]  # repr escapes exactly the characters str.isprintable() refuses: \n, \x1b, \u2028


def _json(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:  # JSON writes a character beyond the BMP as its UTF-16 surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def printable(text: str, escape: Callable[[str], str] = _python) -> str:
    """`text` with every character that is not printable (C0 and C1 controls, DEL, line and paragraph separators,
    format characters such as bidi overrides, unassigned code points) written as an escape, so that it cannot
    start a line, move the cursor or recolour a terminal. A space is printable; a tab or a newline is not."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else escape(c) for c in text)


def json_printable(text: str) -> str:
    """A JSON document (json.dumps with ensure_ascii=False) with the characters JSON leaves raw but that end a line
    or drive a terminal elsewhere (C1 controls, DEL, U+2028, U+2029...) written as \\u escapes: the same document.
    Such characters only occur inside JSON strings, where the escape means the same character."""
    return printable(text, _json)
