"""The repository explains itself: every reference to the theory document names a section that exists, every docs
page is reachable from the README, and nothing cites a file that is not in the repository."""

import re
from pathlib import Path

from tests.helpers import ROOT

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


#: ``[text](target)`` with a relative target (no scheme), optionally ``#anchor``.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_slug_matches_githubs_rule():
    assert slug("A real model: `make run-real`") == "a-real-model-make-run-real"
    assert slug("8.2 TV(pi_k, alpha), unbiased") == "82-tvpi_k-alpha-unbiased"


def test_every_relative_link_and_anchor_resolves():
    broken, n = [], 0
    for path in DOCS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            n += 1
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert n >= 30
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(readme)}
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if p.name not in linked]
    assert not unlinked, unlinked


def test_the_readme_stays_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") <= 200
    first_block = re.search(r"```bash\n(.*?)```", readme, flags=re.S).group(1)
    assert [line.split()[:2] for line in first_block.strip().splitlines()] == [["make", "run"], ["make", "test"]]
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].strip() == "make test"


def test_the_options_page_is_the_config():
    from llm.options import documented_fields, markdown

    assert (ROOT / "docs" / "options.md").read_text() == markdown(), "rerun: python -m llm.options > docs/options.md"
    import dataclasses

    from llm.config import GRPOConfig

    documented = [name for _, name, doc in documented_fields() if doc]
    assert documented == [f.name for f in dataclasses.fields(GRPOConfig)], "every field has a docstring"


def test_the_readme_python_example_runs_and_says_what_it_prints(capsys):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, flags=re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert abs(float(lines[1]) - 0.4) < 1e-12  # the comment's "0.4 = J(pi) - J(pi_k)"
