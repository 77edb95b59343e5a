"""The preservation engines' names have one source, C++ (csrc/core/preservation_engine.cpp).

References: ``_C.engine_names()`` itself, and the package's sources, read with ``ast``: no
module spells the names out again.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch_replay._C as C

from torch_replay import ENGINES
from torch_replay.planner import OPTION_NAMES
from torch_replay.verify.report import REFERENCE_ENGINES

ROOT = Path(__file__).resolve().parents[1]


def test_engine_and_option_names_are_cpps():
    assert ENGINES == tuple(C.engine_names())
    assert ENGINES[0] == "auto"
    assert OPTION_NAMES == ("eager", *ENGINES[1:])
    assert REFERENCE_ENGINES == OPTION_NAMES


def test_no_module_spells_the_engine_names_out():
    names = set(C.engine_names()) - {"auto"}
    copies = []
    for path in sorted((ROOT / "torch_replay").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
                values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if names <= values:
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not copies, f"the engine names are spelled out again at {copies}"
