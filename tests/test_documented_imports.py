"""Every import path the docs name resolves: ``from torch_replay.X import Y`` lines, and the
dotted names ``torch_replay.X.Y`` / ``tr.X`` / ``tr_hf.X`` they write (README.md, docs/*.md,
examples/). A module moved into a private room must leave its documented spelling working,
or the docs must change with it.

The reference is the installed package itself: each name is imported (the longest prefix
that is a module) and the rest looked up attribute by attribute.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").rglob("*.py")]
)
ALIASES = {
    "tr": "torch_replay",
    "tr_hf": "torch_replay.integrations.transformers",
    "tr_titan": "torch_replay.integrations.torchtitan",
}

_FROM = re.compile(r"^\s*from (torch_replay[\w.]*) import ([\w, ()]+)", re.M)
_IMPORT = re.compile(r"^\s*import (torch_replay[\w.]*)", re.M)
# A dotted name: not inside a longer word or path, not a file (`.py`) or a schema (`/3`).
_DOTTED = re.compile(
    r"(?<![\w./-])((?:torch_replay|tr|tr_hf|tr_titan)(?:\.[A-Za-z_]\w*)+)(?![\w/-]|\.\w)"
)


def documented_names() -> dict[str, set[str]]:
    """Dotted name -> the pages that write it."""
    out: dict[str, set[str]] = {}
    for page in PAGES:
        text = page.read_text()
        rel = str(page.relative_to(ROOT))
        for m in _FROM.finditer(text):
            for item in m.group(2).strip("()").split(","):
                name = item.split(" as ")[0].strip()
                if name:
                    out.setdefault(f"{m.group(1)}.{name}", set()).add(rel)
        for m in _IMPORT.finditer(text):
            out.setdefault(m.group(1), set()).add(rel)
        for m in _DOTTED.finditer(text):
            head, _, rest = m.group(1).partition(".")
            out.setdefault(f"{ALIASES.get(head, head)}.{rest}", set()).add(rel)
    return out


def resolve(dotted: str) -> object:
    """The object ``dotted`` names, or raise what a user would see."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_finder_reads_each_spelling(tmp_path):
    names = documented_names()
    assert "torch_replay.integrations.transformers" in names  # `from ... import transformers`
    assert "torch_replay.config.patch" in names  # `tr.config.patch(...)`
    assert "torch_replay.ENGINES" in names
    with pytest.raises(AttributeError):
        resolve("torch_replay.no_such_name")


NAMES = documented_names()

# Integrations whose library is installed beside .venv, never into it: their names are
# resolved where that library is imported.
ELSEWHERE = {
    "torch_replay.integrations.torchtitan": "tests/test_torchtitan.py resolves it in its "
    "workers (torchtitan is installed in .venv/torchtitan-site, requirements-torchtitan.txt)",
}


@pytest.mark.parametrize("dotted", sorted(NAMES))
def test_documented_name_resolves(dotted):
    for module, where in ELSEWHERE.items():
        if dotted == module or dotted.startswith(module + "."):
            pytest.skip(where)
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{dotted} (named in {sorted(NAMES[dotted])}) does not resolve: {exc!r}")
