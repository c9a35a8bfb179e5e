"""What Postgres text and jsonb cannot hold, checked in one place for client, events and read API."""

from __future__ import annotations


def unstorable(text: str) -> str | None:
    """Why Postgres cannot store `text` (a NUL, or a lone surrogate that is not UTF-8), or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate"
    return None
