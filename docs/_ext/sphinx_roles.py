"""A griffe extension for the API reference: Sphinx roles in docstrings become code spans.

agentrl's docstrings are Google style, but name other objects with Sphinx roles
(``:class:`TaskFields```, ``:meth:`~agentrl.env.ToolEnv.reset```), which Markdown would show
as written. This turns each into a code span of the name (the last part only after ``~``).
Used by ``mkdocs.yml`` (mkdocstrings' ``extensions`` option); excluded from the site itself.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:meth|func|class|attr|mod|data|exc|obj|const|ref|term):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    name = match[2].strip()
    if match[1]:
        name = name.rsplit(".", 1)[-1]
    return f"`{name}`"


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_plain, obj.docstring.value)
