"""Book build: MathJax 3 copied into the site from a PyPI package, so formulas typeset offline.

An mkdocs hook (`hooks:` in mkdocs.yml). The dev extra installs `django-static-mathjax`, which
carries MathJax 3.2.2's `es5/` build compiled from MathJax's sources: the same 106 files as the
npm package `mathjax@3.2.2`, 13 of them minified slightly differently (self-assignments such
as `(r=r,…)` left out). `make setup` installs it; the build never touches the network. This
hook adds to the site MathJax's entry file (`ENTRY`) and the components it may load later (the
accessibility menu's explorer and speech rules, TeX extensions), under `javascripts/mathjax/`,
where mkdocs.yml's `extra_javascript` loads it after `javascripts/mathjax.js`, its configuration.
"""

from importlib import metadata
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

DISTRIBUTION = "django-static-mathjax"
VERSION = "3.2.2"  # MathJax's version; the package's own is this with one more number (3.2.2.1)
# TeX in, SVG out: no web fonts to load (they would need a server or a permissive file:// policy),
# and every TeX extension is inside this one file.
ENTRY = "tex-svg-full.js"
DEST = "javascripts/mathjax"


def es5_dir() -> Path:
    """MathJax's `es5/` directory inside the installed package, checked for `VERSION`."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise PluginError(f"{DISTRIBUTION} is not installed: the book's mathematics needs it "
                          "(make setup installs it with the dev extra: pip install -e '.[dev]')") from None
    if not dist.version.startswith(VERSION + "."):
        raise PluginError(f"{DISTRIBUTION} {dist.version} is installed; the book needs MathJax {VERSION} "
                          f"({DISTRIBUTION}=={VERSION}.*, as pyproject.toml's dev extra pins it)")
    es5 = Path(dist.locate_file("mathjax/static/mathjax/es5"))
    if not (es5 / ENTRY).is_file():
        raise PluginError(f"{es5 / ENTRY} is missing: reinstall {DISTRIBUTION}")
    return es5


def on_files(files: Files, config) -> Files:
    """Add MathJax to the site: `ENTRY` and every component directory, not the other bundles."""
    es5 = es5_dir()
    for path in sorted(es5.rglob("*")):
        if path.is_file() and (path.parent != es5 or path.name == ENTRY):
            files.append(File.generated(config, f"{DEST}/{path.relative_to(es5).as_posix()}",
                                        abs_src_path=str(path)))
    return files
