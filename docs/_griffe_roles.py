"""griffe extension (mkdocs.yml): the reStructuredText in simlib's docstrings, as Markdown.

simlib's docstrings are Google style with a few Sphinx habits that Markdown would print
literally: cross-reference roles (``:func:`solve```, ``:class:`~simlib.EventRecord```)
become inline code (the last component for ``~`` names, as Sphinx shows them);
``:math:`...``` becomes ``$...$`` (arithmatex); a section headed ``Example:`` or
``Example::`` becomes griffe's ``Examples:`` section, so that its ``>>>`` lines render as
code instead of nested quotes.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|obj|exc|const):`(~?)([^`]+)`")
MATH = re.compile(r":math:`([^`]+)`")
EXAMPLE = re.compile(r"^(\s*)Example::?[ \t]*$", re.M)


def _code(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            text = ROLE.sub(_code, obj.docstring.value)
            text = MATH.sub(lambda m: f"${m.group(1)}$", text)
            obj.docstring.value = EXAMPLE.sub(r"\1Examples:", text)
