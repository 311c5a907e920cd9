"""The README stays a newcomer's page, and no page of the docs links to a file that is not there.

Fast: reads Markdown files only.
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 150

# [text](target) and ![alt](target); the target ends at the first space (a title may follow)
# or the closing parenthesis. Links inside code (`...` or fenced blocks) are not links.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def links(text: str) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    return LINK.findall(text) + REFERENCE.findall(text)


def is_relative(target: str) -> bool:
    return not (re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "//")))


def test_readme_is_at_most_150_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, at most {MAX_README_LINES}: move the details to docs/")


def test_every_relative_link_points_to_a_file_that_exists() -> None:
    missing = []
    for page in markdown_files():
        for target in links(page.read_text(encoding="utf-8")):
            if not is_relative(target):
                continue
            path = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if not path:
                continue
            base = ROOT if path.startswith("/") else page.parent
            if not (base / path.lstrip("/")).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def test_the_readme_links_every_page_of_the_docs() -> None:
    """A page no one can reach from the README is a page no newcomer reads."""
    linked = {Path(t.split("#", 1)[0]).name for t in links(README.read_text(encoding="utf-8"))
              if is_relative(t) and t.startswith("docs/")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), f"docs pages the README does not link: {sorted(pages - linked)}"


def test_the_readme_states_the_test_command_ci_runs() -> None:
    """.ci/run runs exactly the README's test command."""
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^\./run\.sh test\b", readme, re.MULTILINE), "the README must state `./run.sh test`"
    assert re.search(r"^\./run\.sh test\b", ci, re.MULTILINE), ".ci/run must call `./run.sh test`"


def test_link_finder_sees_links_and_skips_code() -> None:
    text = ("See [the CLI](docs/cli.md) and ![a shot](docs/images/x.png \"title\").\n"
            "`[not](a-link.md)`\n```\n[nor](this.md)\n```\n[ref]: docs/api.md\n"
            "[web](https://example.org) [here](#anchor)\n")
    found = links(text)
    assert found == ["docs/cli.md", "docs/images/x.png", "https://example.org", "#anchor", "docs/api.md"]
    assert [t for t in found if is_relative(t)] == ["docs/cli.md", "docs/images/x.png", "docs/api.md"]
