"""Shortening a quoted text for a verdict paragraph (an exception, a cascade cause, Ray's
own words) without breaking the sentence around it.

:func:`clip` cuts at a phrase boundary ('; ', ', ', ': ', '. ') or else a word boundary,
never inside a word, marks the cut with '…', and leaves no bracket or quote it opened
unclosed: it cuts back to before an unclosed opening bracket or quotation when that
loses less than half the text, else closes it after the '…'. A text within the limit is returned unchanged.
"""

from __future__ import annotations

from typing import List

#: opening -> closing bracket
PAIRS = {"(": ")", "[": "]", "{": "}"}
#: phrase separators preferred as a cut point (the separator is dropped)
PHRASE = ("; ", ", ", ": ", ". ", " - ")
#: quote characters that open a quotation when they start a word
QUOTES = ("'", '"', "`")
ELLIPSIS = "…"


def _unclosed(s: str) -> List[int]:
    """Positions of the brackets and word-initial quotes of ``s`` left open, outermost first."""
    stack: List[int] = []
    for i, ch in enumerate(s):
        if ch in PAIRS:
            stack.append(i)
        elif ch in PAIRS.values():
            if stack and PAIRS.get(s[stack[-1]]) == ch:
                stack.pop()
        elif ch in QUOTES:
            if stack and s[stack[-1]] == ch:
                stack.pop()  # closes the quotation opened last
            elif i == 0 or not s[i - 1].isalnum():
                stack.append(i)  # opens one (an apostrophe inside a word does not)
    return stack


def _cut(text: str, n: int) -> str:
    """``text`` cut to at most ``n`` characters at a phrase, else a word boundary."""
    head = text[: n + 1]
    best = max((head.rfind(sep) for sep in PHRASE), default=-1)
    if best >= n // 2:
        return head[:best]
    sp = head.rfind(" ")
    return head[:sp] if sp > 0 else text[:n]


def clip(text: str, n: int) -> str:
    """``text`` shortened to about ``n`` characters (module docstring); '' for None."""
    text = " ".join(str(text or "").split())
    if len(text) <= n:
        return text
    s = _cut(text, max(n - 1, 1)).rstrip(" ,;:-")
    open_at = _unclosed(s)
    late = [i for i in open_at if i >= len(s) // 2]
    if late:
        s = s[: late[0]].rstrip(" ,;:-")  # drop the unfinished parenthesis or quotation
        open_at = _unclosed(s)
    closers = "".join(PAIRS.get(s[i], s[i]) for i in reversed(open_at))
    return s + ELLIPSIS + closers
