"""griffe extension (mkdocs.yml): the reStructuredText in simlib's docstrings, as Markdown.

simlib's docstrings are Google style with a few Sphinx habits that Markdown would print
literally: cross-reference roles (``:func:`solve```, ``:class:`~simlib.EventRecord```)
become inline code (the last component for ``~`` names, as Sphinx shows them);
``:math:`...``` becomes ``$...$`` and a ``.. math::`` directive (on one line, or with an
indented block under it) a ``$$...$$`` display (arithmatex); a section headed ``Example:`` or
``Example::`` becomes griffe's ``Examples:`` section, so that its ``>>>`` lines render as
code instead of nested quotes; the ``::`` that introduces a literal block becomes ``:``.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|obj|exc|const):`(~?)([^`]+)`")
MATH = re.compile(r":math:`([^`]+)`")
EXAMPLE = re.compile(r"^(\s*)Example::?[ \t]*$", re.M)
LITERAL = re.compile(r"(\S)::[ \t]*$", re.M)  # reST's "text::" before a literal block


def _math_blocks(text: str) -> str:
    """``.. math:: x`` and ``.. math::`` + an indented block, as ``$$`` displays."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)\.\. math::\s*(.*)$", lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, body = m.group(1), [m.group(2)] if m.group(2).strip() else []
        i += 1
        while i < len(lines) and (not lines[i].strip()
                                  or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            body.append(lines[i].strip())
            i += 1
        while body and not body[-1]:
            body.pop()
        out += [f"{indent}$$", *(f"{indent}{b}" for b in body if b), f"{indent}$$", ""]
    return "\n".join(out)


def _code(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            text = ROLE.sub(_code, obj.docstring.value)
            text = MATH.sub(lambda m: f"${m.group(1)}$", text)
            if ".. math::" in text:
                text = _math_blocks(text)
            text = EXAMPLE.sub(r"\1Examples:", text)
            obj.docstring.value = LITERAL.sub(r"\1:", text)
