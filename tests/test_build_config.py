"""The build is described once (build.env) and every knob is in the README's tables.

References: the files themselves, read as text: ``setup.py``, ``CMakeLists.txt`` and the
scripts name no C++ standard, optimisation level or Boost version of their own, and every
environment variable ``setup.py`` reads and every CMake ``option()`` is documented.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILDERS = [
    "setup.py",
    "CMakeLists.txt",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.sh")),
]


def _env() -> dict[str, str]:
    out = {}
    for line in (ROOT / "build.env").read_text().splitlines():
        m = re.match(r"^([A-Z_0-9]+)=\"?([^\"]*)\"?$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_build_env_describes_standards_flags_and_boost():
    env = _env()
    assert env["CXX_STANDARD"] == "17" and env["CXX_STANDARD_TORCH_2_14"] == "20"
    assert env["OPT_LEVEL"].startswith("-O") and re.fullmatch(r"\d+\.\d+", env["BOOST_MIN_VERSION"])


def test_no_builder_names_its_own_standard_flags_or_boost_version():
    own = re.compile(r"c\+\+(1[147]|20|23)\b|CMAKE_CXX_STANDARD \d|-O[0-3s]\b|Boost \d")
    found = []
    for rel in BUILDERS:
        for n, line in enumerate((ROOT / rel).read_text().splitlines(), 1):
            code = line.split("#", 1)[0] if not rel.endswith(".py") else line
            if own.search(code) and "-O0" not in code:  # -O0: TORCH_REPLAY_DEBUG's build
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "build settings outside build.env:\n" + "\n".join(found)


def test_every_knob_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    setup = (ROOT / "setup.py").read_text()
    cmake = (ROOT / "CMakeLists.txt").read_text()
    knobs = set(re.findall(r"os\.environ(?:\.get\(|\[)\"([A-Z_]+)\"", setup))
    knobs |= set(re.findall(r"^option\((\w+)", cmake, flags=re.M))
    assert {"TORCH_REPLAY_SKIP_EXT", "TORCH_REPLAY_TESTS"} <= knobs
    missing = sorted(k for k in knobs if f"`{k}" not in readme)
    assert not missing, f"knobs missing from README.md: {missing}"
