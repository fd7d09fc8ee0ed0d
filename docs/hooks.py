"""MkDocs hooks: the site is the repository's markdown as it is.

- The README is the site's home page, and the committed run folders (results/ at the top of the
  repository) join the site under results/, so every link from a page to a run's report or plot
  is checked by the strict build.
- Links are written as they work in the repository (a page in docs/pages/ links a run as
  `../../results/...`, the README a page as `docs/pages/...`); on the site the pages sit at the
  top, beside results/, so those prefixes are rewritten as each page is read.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
#: What a run folder shows on the site: its pages, plots and env.json (not the raw CSVs).
KINDS = {".md", ".png", ".json"}
#: Per page of the site (its source path), the repository's link prefixes and the site's.
REWRITES = {
    "README.md": [("](docs/pages/", "](")],
    "results/README.md": [("](../docs/pages/", "](../")],
}
PAGE_REWRITES = [("](../../results/", "](results/")]


def _file(path: Path, config) -> File:
    return File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"],
                config["use_directory_urls"])


def on_files(files: Files, config) -> Files:
    files.append(_file(ROOT / "README.md", config))
    for path in sorted((ROOT / "results").rglob("*")):
        if path.is_file() and path.suffix in KINDS:
            files.append(_file(path, config))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    src = page.file.src_uri
    rewrites = REWRITES.get(src) or (PAGE_REWRITES if not src.startswith("results/") else [])
    for repo, site in rewrites:
        markdown = markdown.replace(repo, site)
    return markdown
