"""Which browser and tab a request comes from, and which sessions a browser owns."""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Optional

# A browser tab's Gradio session hash is chosen by the client and travels in request
# bodies, so on its own it proves nothing. Each browser also gets a random HttpOnly
# cookie (set by app.web.server.launch's middleware); a session name is built from both, so a
# client that learns or guesses another tab's session hash still lands in a session
# of its own, and a result file is served only to the browser whose session made it.

BROWSER_COOKIE = "kiln_browser"
_COOKIE_RE = re.compile(r"[A-Za-z0-9_-]{32,64}")
_SESSION_NAME_RE = re.compile(r"web-([0-9a-f]{16}|anon)-[0-9a-f]{16}")


def new_browser_token() -> str:
    return secrets.token_urlsafe(32)


def browser_id(token: Optional[str]) -> Optional[str]:
    """16 hex digits naming the browser that holds cookie ``token``; None for no/bad cookie."""
    if not token or not _COOKIE_RE.fullmatch(token):
        return None
    return hashlib.sha256(b"kiln-browser:" + token.encode()).hexdigest()[:16]


def session_name(browser_token: Optional[str], tab: Optional[str]) -> str:
    """'web-<browser>-<tab>': the job store folder and history key of one browser tab.
    Clients without the cookie (API scripts) get 'web-anon-<tab>' and can never
    download a result (see ``session_owned_by``)."""
    tab_id = hashlib.sha256(b"kiln-tab:" + (tab or "").encode()).hexdigest()[:16]
    return f"web-{browser_id(browser_token) or 'anon'}-{tab_id}"


def session_owned_by(session: Optional[str], browser_token: Optional[str]) -> bool:
    """True when ``session`` was made by the browser holding cookie ``browser_token``."""
    bid = browser_id(browser_token)
    m = _SESSION_NAME_RE.fullmatch(session or "")
    return bool(bid and m and m.group(1) == bid)



def browser_of(session: Optional[str]) -> Optional[str]:
    """The browser id in a session name 'web-<browser>-<tab>'; None for cookie-less
    ('web-anon-…') and other sessions, which share nothing with any other tab."""
    m = _SESSION_NAME_RE.fullmatch(session or "")
    return m.group(1) if m and m.group(1) != "anon" else None


def same_browser(session: Optional[str], other: Optional[str]) -> bool:
    """True when two session names are tabs of one browser (or the same session): what a
    tab may see of another's jobs and results."""
    if not session or not other:
        return False
    if session == other:
        return True
    bid = browser_of(session)
    return bid is not None and bid == browser_of(other)
