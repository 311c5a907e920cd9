"""Text for the person at the browser: the error they can act on, and messages scrubbed of
server paths (where the server keeps its files is nobody's business at the browser)."""

from __future__ import annotations

import html
import re


class UIError(Exception):
    """A problem the person at the browser caused or can fix; the message says how."""


# An absolute path (two or more segments) in a message: where the server keeps its files is
# nobody's business at the browser. Stops at characters that end a path in prose and quotes.
_ABS_PATH_RE = re.compile(r"(?<![\w.~:/-])/(?:[^\s/'\"`:;,()<>|]+/)+([^\s/'\"`:;,()<>|]*)")


def public_text(text: str) -> str:
    """``text`` with every absolute path cut to its last part (``/srv/kiln/var/x/log`` ->
    ``log``): for any message a browser is shown."""
    return _ABS_PATH_RE.sub(lambda m: m.group(1) or "…", text or "")


def md_text(text: str) -> str:
    """Plain text safe inside Markdown: HTML escaped, Markdown's emphasis/code marks backslashed."""
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", html.escape(text))

