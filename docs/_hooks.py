"""mkdocs hooks (mkdocs.yml ``hooks:``): pages that include files from outside docs/.

A line ``<!-- include: PATH -->`` (or ``<!-- include: PATH shift=N -->``) in a page is
replaced by the file at PATH (relative to the repository root) without its title line,
its other headings moved N levels down (default 0), and its image links pointing at
copies of the images that the site gets; ``<!-- benchmark-results -->`` is replaced by
the tables that ``docs/_tables.py`` renders from ``benchmarks/results/*.json``. So the
validation report, the benchmarks README and their numbers appear on the site exactly
as the scripts wrote them, never copied by hand.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r"^<!-- include: (\S+)(?: shift=(\d))? -->$", re.M)
IMAGE = re.compile(r"(!\[[^\]]*\]\()([^)\s]+)(\))")


def _demote(text: str, shift: int) -> str:
    """The text without its title (a first-line ``# ...``), every other ATX heading
    ``shift`` levels down; fenced code left alone."""
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    out, fence = [], None
    for line in lines:
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is None and re.match(r"#{1,6} ", line):
            line = "#" * shift + line
        out.append(line)
    return "\n".join(out)


def _image_dir(included: str) -> str:
    """Where a page's copies of the images of ``included`` go (relative to docs/)."""
    return "generated/" + included.replace("/", "_").replace(".md", "")


def on_files(files, config):
    """Add the images of every included file to the site, next to the including page."""
    docs = Path(config["docs_dir"])
    for page in docs.glob("*.md"):
        for included, _ in INCLUDE.findall(page.read_text()):
            source = ROOT / included
            for _, target, _ in IMAGE.findall(source.read_text()):
                if "://" in target:
                    continue
                image = (source.parent / target).resolve()
                uri = f"{_image_dir(included)}/{target}"
                files.append(File.generated(config, uri, abs_src_path=str(image)))
    return files


def on_page_markdown(markdown, page, config, files):
    def include(match: re.Match) -> str:
        included = match.group(1)
        text = (ROOT / included).read_text()
        text = IMAGE.sub(lambda m: m.group(1) + (m.group(2) if "://" in m.group(2) else
                                                 f"{_image_dir(included)}/{m.group(2)}")
                         + m.group(3), text)
        return _demote(text, int(match.group(2) or 0))

    markdown = INCLUDE.sub(include, markdown)
    if "<!-- benchmark-results -->" in markdown:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        try:
            import _tables
        finally:
            sys.path.pop(0)
        markdown = markdown.replace("<!-- benchmark-results -->", _tables.results_markdown())
    return markdown
