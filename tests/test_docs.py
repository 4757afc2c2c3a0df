"""The repository explains itself: every reference to the theory document names a section that exists,
and nothing cites a file that is not in the repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THEORY = ROOT / "docs" / "theory.md"
SOURCES = [p for d in ("grpo_theory", "llm", "runkit", "benchmarks", "figures", "tests") for p in (ROOT / d).rglob("*.py")]
DOCS = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
#: "docs/theory.md, §3", "docs/theory.md §3", "docs/theory.md, §1-§6", "§2, §5, §6" after a theory.md mention.
REFERENCE = re.compile(r"docs/theory\.md,?\s*((?:§\d+(?:\.\d+)?(?:\s*(?:-|,|and)\s*)?)+)")


def sections() -> set[str]:
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.", THEORY.read_text(), flags=re.M))


def references(text: str) -> list[str]:
    found = []
    for group in REFERENCE.findall(text):
        nums = re.findall(r"§(\d+(?:\.\d+)?)", group)
        found += nums
        for a, b in re.findall(r"§(\d+)\s*-\s*§(\d+)", group):
            found += [str(n) for n in range(int(a), int(b) + 1)]
    return found


def test_every_theory_reference_resolves():
    have = sections()
    assert {"1", "3", "6", "8"} <= have
    missing, n = [], 0
    for path in SOURCES + DOCS:
        for num in references(path.read_text()):
            n += 1
            if num not in have:
                missing.append(f"{path.relative_to(ROOT)}: §{num}")
    assert n >= 15, "docstrings should cite the theory document"
    assert not missing, missing


def test_reference_parser_sees_ranges_and_lists():
    assert references("see docs/theory.md, §1-§3 and docs/theory.md §8") == ["1", "3", "1", "2", "3", "8"]


def test_no_reference_to_files_outside_the_repository():
    for path in SOURCES + DOCS:
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        assert "PAPER.md" not in text and "DESIGN.md" not in text and "../shared" not in text, path
