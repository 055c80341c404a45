"""Comments cite only what a reader of this repository can open.

A comment that says "see §4.4" must name a document in ``docs/`` that has a
section 4.4; requirement codes of a specification that does not ship with
the code ("(C6)", "SPEC G") are not followable and are refused — the reason
belongs in the comment itself.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCES = [*sorted((ROOT / "llmgw").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py")),
           *sorted((ROOT / "tests").rglob("*.py"))]
CODE = r"(?:[CNLGAPMSD]\d{1,2})"
REQUIREMENT = re.compile(rf"\({CODE}(?:[–-]{CODE}?\d*)?(?:,\s*{CODE})*\)|\bSPEC [A-Z]\b")
DOC_REF = re.compile(r"docs/([\w.-]+\.md) §(\d+(?:\.\d+)?)")
BARE_SECTION = re.compile(r"(?<!RFC \d{4} )(?<!RFC 9110 )§\d")


def _headings(doc: Path) -> set[str]:
    found = set()
    for line in doc.read_text().splitlines():
        m = re.match(r"#+ (\d+(?:\.\d+)?)[. ]", line)
        if m:
            found.add(m.group(1))
    return found


def test_no_comment_cites_a_requirement_code() -> None:
    """Reasons are written out, not pointed at with codes the repository does not hold."""
    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
                 for p in SOURCES if p.name != "test_citations.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if REQUIREMENT.search(line)]
    assert offenders == []


def test_every_section_cited_exists_in_docs() -> None:
    """docs/<file> §N names a document in docs/ with a section numbered N."""
    missing = []
    headings: dict[str, set[str]] = {}
    for p in SOURCES:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            for name, section in DOC_REF.findall(line):
                doc = ROOT / "docs" / name
                if not doc.is_file():
                    missing.append(f"{p.relative_to(ROOT)}:{i}: no docs/{name}")
                    continue
                known = headings.setdefault(name, _headings(doc))
                if section not in known:
                    missing.append(f"{p.relative_to(ROOT)}:{i}: docs/{name} has no §{section}")
    assert missing == []


def test_a_bare_section_sign_is_explained_in_its_file() -> None:
    """A file that writes §N alone says which document its sections belong to."""
    unexplained = [str(p.relative_to(ROOT)) for p in SOURCES if p.name != "test_citations.py"
                   and BARE_SECTION.search(p.read_text()) and "docs/" not in p.read_text()]
    assert unexplained == []


def test_the_checks_see_what_they_look_for() -> None:
    """Each pattern matches the kind of citation it is meant to catch."""
    assert REQUIREMENT.search("rebuilt in order (C12)")
    assert REQUIREMENT.search("the gateway (SPEC G)")
    assert not REQUIREMENT.search("a tuple (C, N)")
    assert DOC_REF.findall("see docs/nomad-api.md §4.4") == [("nomad-api.md", "4.4")]
    assert "4.4" in _headings(ROOT / "docs" / "nomad-api.md")
