"""Sphinx configuration of torch_replay's documentation.

Build (warnings are errors) and run every code example:

    python -m sphinx -W -b html docs build/docs/html
    python -m sphinx -W -b doctest docs build/docs/doctest
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

project = "torch_replay"
author = "the torch_replay authors"
copyright = "2026, the torch_replay authors"
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
suppress_warnings = ["myst.xref_missing"]  # links into the repository (files, not pages)

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

# Every example in the pages runs (sphinx.ext.doctest); they share this setup.
# Examples run in a fresh temporary directory (files they write land there), with the
# repository on sys.path (``examples.queue_model``). Sphinx runs the setup before and the
# cleanup after each group of examples (sphinx.ext.doctest, ``test_group``): the cleanup
# goes back to the directory the group started in and removes the temporary one.
doctest_global_setup = f"""
import os, sys, tempfile, warnings
sys.path.insert(0, {ROOT!r})
_docs_cwd, _docs_tmp = os.getcwd(), tempfile.mkdtemp(prefix="torch_replay_docs_")
os.chdir(_docs_tmp)
import torch
import torch_replay as tr
"""
doctest_global_cleanup = """
import os, shutil
os.chdir(_docs_cwd)
shutil.rmtree(_docs_tmp, ignore_errors=True)
"""
doctest_default_flags = 0
import doctest as _doctest  # noqa: E402

doctest_default_flags = _doctest.ELLIPSIS | _doctest.NORMALIZE_WHITESPACE
