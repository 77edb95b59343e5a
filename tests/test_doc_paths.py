"""Every path the docs and the code Notes name exists, and every Note cited is defined.

Docs pages (README.md, docs/*.md) and Note blocks (``// Note [X]`` / ``# Note [X]``
in csrc/, torch_replay/, inductor_pass/) point readers at files and modules; when a
file moves the pointer goes stale silently. These tests read the text only (no torch).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("csrc", "torch_replay", "inductor_pass")
CODE_SUFFIXES = {".py", ".h", ".cpp", ".cu", ".cuh"}

# A repository path: a/b.ext (also {h,cpp} alternatives), not a URL.
_PATH = re.compile(
    r"(?<![\w./:-])((?:[\w.-]+/)+[\w.*-]*?)(\{[\w,]+\}|\.(?:py|h|cpp|md|sh|json|toml|txt))(?![\w/])"
)
_MODULE = re.compile(r"python -m\s+([A-Za-z_][\w.]*)")
_NOTE_REF = re.compile(r"Note \[([^\]\n]+)\]")
_NOTE_DEF = re.compile(r"^\s*(?://|#|\*)?\s*Note \[([^\]\n]+)\]\s*$", re.M)
# Also defining: "// Note [X]: text" opening a comment, and a docstring's heading line
# "Predicted vs measured peak (Note [X]):".
_NOTE_DEF_INLINE = re.compile(
    r"^\s*(?://|#)\s*Note \[([^\]\n]+)\]:|\(Note \[([^\]\n]+)\]\):\s*$", re.M
)


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code() -> list[Path]:
    out = []
    for d in CODE_DIRS:
        out += [p for p in sorted((ROOT / d).rglob("*")) if p.suffix in CODE_SUFFIXES]
    return out


def _note_blocks(path: Path) -> list[str]:
    """The text of each Note block in a source file: its header line and the comment
    lines that follow it (up to the first line that is not a comment, or a blank one
    inside a docstring)."""
    lines = path.read_text(errors="replace").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if not _NOTE_DEF.match(line):
            continue
        cpp = line.lstrip().startswith("//")
        hashed = line.lstrip().startswith("#")
        block = [line]
        for nxt in lines[i + 1 :]:
            s = nxt.strip()
            if cpp and not s.startswith("//"):
                break
            if hashed and not s.startswith("#"):
                break
            if not (cpp or hashed) and (not s or s.startswith(('"""', "'''"))):
                break  # a Note in a docstring ends at its paragraph
            block.append(nxt)
        blocks.append("\n".join(block))
    return blocks


# A layout list or a Note may name a file relative to its package ("stages/profile.py").
_PACKAGES = ("torch_replay", "inductor_pass", "csrc", "benchmarks")


def _exists(path: str, base: Path) -> bool:
    """The path from the repository root, relative to the page that names it, or to a
    package root, or a glob; `csrc/aten/op_observer.{h,cpp}` means both."""
    alts = re.match(r"(.*)\{([\w,]+)\}$", path)
    if alts:
        stem = alts.group(1).rstrip(".")
        return all(_exists(f"{stem}.{ext}", base) for ext in alts.group(2).split(","))
    for root in (ROOT, base, *(ROOT / p for p in _PACKAGES)):
        if "*" in path:
            if list(root.glob(path)):
                return True
        elif (root / path).exists():
            return True
    return False


def _module_exists(mod: str) -> bool:
    rel = Path(*mod.split("."))
    return (ROOT / rel.with_suffix(".py")).exists() or (ROOT / rel / "__init__.py").exists()


def _named_paths(text: str) -> set[str]:
    found = set()
    for m in _PATH.finditer(text):
        path = m.group(1) + m.group(2)
        if path.startswith(("/", "http")) or "://" in path:
            continue
        found.add(path)
    return found


def _sources() -> list[tuple[Path, str]]:
    """(file, text) for every docs page and every Note block."""
    out = [(p, p.read_text()) for p in _docs()]
    for p in _code():
        out += [(p, b) for b in _note_blocks(p)]
    return out


# Paths that are examples or outside the tree by design (written by the user, the
# build, or a command), not pointers into the repository.
_NOT_REPO = re.compile(
    r"^(path/to/|build/|dist/|gpu_bundle/|build-asan/|\.venv/|/tmp/|costs|docs/api/|~|"
    r"torch/|transformers/)"  # torch's and transformers' own files
)


def test_named_paths_exist():
    missing = []
    for path, text in _sources():
        for p in sorted(_named_paths(text)):
            if _NOT_REPO.match(p):
                continue
            if not _exists(p, path.parent):
                missing.append(f"{path.relative_to(ROOT)}: {p}")
    assert not missing, "paths named that do not exist:\n" + "\n".join(missing)


def test_named_modules_exist():
    missing = []
    for path, text in _sources():
        for mod in sorted(set(_MODULE.findall(text))):
            if mod.split(".")[0] not in (
                "torch_replay",
                "inductor_pass",
                "benchmarks",
                "tests",
                "examples",
                "scripts",
            ):
                continue  # torch's or a tool's module (sphinx, build, pytest)
            if mod.split(".")[-1].isupper():
                continue  # a placeholder: python -m benchmarks.NAME
            if not _module_exists(mod):
                missing.append(f"{path.relative_to(ROOT)}: python -m {mod}")
    assert not missing, "modules named that do not exist:\n" + "\n".join(missing)


def _all_text_files() -> list[Path]:
    dirs = (
        "csrc",
        "torch_replay",
        "inductor_pass",
        "benchmarks",
        "tests",
        "scripts",
        "cuda",
        "docs",
        "examples",
    )
    files = [ROOT / "README.md", ROOT / "setup.py", ROOT / "CMakeLists.txt"]
    for d in dirs:
        files += [
            p
            for p in (ROOT / d).rglob("*")
            if p.is_file() and p.suffix in CODE_SUFFIXES | {".md", ".sh", ".txt", ".cu"}
        ]
    this = Path(__file__).resolve()
    return [f for f in files if f.exists() and "results" not in f.parts and f != this]


def test_every_note_cited_is_defined():
    defined, cited = set(), {}
    for f in _all_text_files():
        text = f.read_text(errors="replace")
        defined.update(n.strip() for n in _NOTE_DEF.findall(text))
        for a, b in _NOTE_DEF_INLINE.findall(text):
            defined.add((a or b).strip())
        for n in _NOTE_REF.findall(text):
            cited.setdefault(n.strip(), f.relative_to(ROOT))
    undefined = {n: f for n, f in cited.items() if n not in defined and n != "X"}
    assert not undefined, "Notes cited but defined nowhere:\n" + "\n".join(
        f"{f}: Note [{n}]" for n, f in sorted(undefined.items())
    )


@pytest.mark.parametrize(
    "text, paths",
    [
        (
            "see `csrc/aten/op_observer.{h,cpp}` and tests/test_ops.py.",
            {"csrc/aten/op_observer.{h,cpp}", "tests/test_ops.py"},
        ),
        ("https://github.com/a/b.py is not ours", set()),
    ],
)
def test_path_pattern(text, paths):
    assert _named_paths(text) == paths
    assert all(_exists(p, ROOT) for p in paths)
