"""``/runbooks``: the runbooks shipped in the package, as one HTML page.

Alerts link to ``/runbooks#<alert name in lower case>``; the ids follow GitHub's, so the same
anchors work on the Markdown file in the repository. The renderer knows the little Markdown the
runbooks use (headings, paragraphs, lists, fenced blocks, code spans, emphasis, links) and
escapes everything else: what is not understood is shown as text, never as markup.
"""

from __future__ import annotations

import functools
import html
import importlib.resources
import re

_HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")
_ITEM = re.compile(r"\s{0,3}([-*+]|\d{1,9}[.)])\s+(.*)")
_FENCE = re.compile(r"\s{0,3}(```+|~~~+)\s*([\w+-]*)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_EMPHASIS = re.compile(r"\*(?!\s)(.+?)(?<!\s)\*")
# Absolute http(s) and mailto, or relative (no scheme: no ':' before the first '/', '?' or '#').
_SAFE_URL = re.compile(r"(https?://|mailto:|[^:/?#]*(?:[/?#]|$))", re.IGNORECASE)

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:60em;line-height:1.45}
code{background:#f3f3f3;padding:0 .2em} pre{background:#f3f3f3;padding:.6em;overflow-x:auto}
h2{margin-top:1.6em;border-bottom:1px solid #ddd} a{color:#1f5fa8}
"""


def slug(text: str, seen: dict[str, int]) -> str:
    """GitHub's heading id: lower case, punctuation dropped, spaces to '-'; repeats get -1, -2."""
    base = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    count = seen.get(base, 0)
    seen[base] = count + 1
    return base if count == 0 else f"{base}-{count}"


def _heading_text(markdown: str) -> str:
    """What GitHub builds the id from: the heading as displayed, without markup."""
    text = _LINK.sub(r"\1", markdown)
    return re.sub(r"[`*]", "", text)


def _inline(text: str) -> str:
    """Code spans verbatim; elsewhere links and emphasis; everything escaped."""
    out, position = [], 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_markup(text[position : match.start()]))
        out.append(f"<code>{html.escape(match.group(2).strip())}</code>")
        position = match.end()
    out.append(_markup(text[position:]))
    return "".join(out)


def _markup(text: str) -> str:
    def link(match: re.Match[str]) -> str:
        label, url = match.group(1), html.unescape(match.group(2))
        if not _SAFE_URL.match(url):  # javascript:, data: and other schemes stay text
            return label
        return f'<a href="{html.escape(url, quote=True)}">{label}</a>'

    escaped = html.escape(text, quote=True)
    escaped = _LINK.sub(link, escaped)
    escaped = _STRONG.sub(r"<strong>\1</strong>", escaped)
    return _EMPHASIS.sub(r"<em>\1</em>", escaped)


def to_html(markdown: str) -> str:
    """The HTML of ``markdown``'s blocks."""
    out: list[str] = []
    paragraph: list[str] = []
    items: list[str] = []
    list_tag = ""
    seen: dict[str, int] = {}

    def flush() -> None:
        nonlocal list_tag
        if paragraph:
            out.append(f"<p>{_inline(' '.join(paragraph))}</p>")
            paragraph.clear()
        if items:
            body = "".join(f"<li>{_inline(item)}</li>" for item in items)
            out.append(f"<{list_tag}>{body}</{list_tag}>")
            items.clear()
            list_tag = ""

    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        fence = _FENCE.match(line)
        if fence:
            flush()
            marker, code = fence.group(1), []
            while index < len(lines) and not lines[index].strip().startswith(marker):
                code.append(lines[index])
                index += 1
            index += 1  # the closing fence (or the end of the file)
            language = f' class="language-{fence.group(2)}"' if fence.group(2) else ""
            out.append(f"<pre><code{language}>{html.escape(chr(10).join(code))}</code></pre>")
            continue
        heading = _HEADING.fullmatch(line)
        if heading:
            flush()
            level, text = len(heading.group(1)), heading.group(2)
            anchor = html.escape(slug(_heading_text(text), seen), quote=True)
            out.append(f'<h{level} id="{anchor}">{_inline(text)}</h{level}>')
            continue
        if not line.strip():
            flush()
            continue
        item = _ITEM.fullmatch(line)
        if item:
            tag = "ol" if item.group(1)[0].isdigit() else "ul"
            if paragraph or (items and tag != list_tag):
                flush()
            list_tag = tag
            items.append(item.group(2))
        elif items and line.startswith(" "):
            items[-1] += " " + line.strip()  # an item's continuation line
        else:
            if items:
                flush()
            paragraph.append(line.strip())
    flush()
    return "\n".join(out)


def page(markdown: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>checkpoint-exporter runbooks</title>
<style>{STYLE}</style></head>
<body><p><a href="/">checkpoint-exporter</a></p>
{to_html(markdown)}
</body></html>
"""


@functools.cache
def shipped_page() -> str | None:
    """The page for the runbooks in the package; None where the package ships none."""
    try:
        source = importlib.resources.files("checkpoint_exporter") / "runbooks.md"
        return page(source.read_text(encoding="utf-8"))
    except (FileNotFoundError, OSError):
        return None
