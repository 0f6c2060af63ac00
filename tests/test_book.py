"""The built book as readers meet it: no remote script or stylesheet anywhere, formulas that
typeset from files inside the site (checked in headless Chromium with the network cut), and
benchmark figures that scripts/plot_benchmarks.py redraws byte for byte from the committed JSON.

The book is built once for this module (about 15 s), into a temporary directory."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest

pytestmark = pytest.mark.xdist_group("book")

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
IMG = BOOK / "docs" / "img"
MATH_PAGE = "week1-day1.html"  # softmax, attention: inline and display formulas

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

# A tag that loads a script or a stylesheet; its source or target.
LOADING_TAGS = re.compile(r"<(script|link)\b[^>]*>", re.IGNORECASE)
SOURCE = re.compile(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]+)""", re.IGNORECASE)
STYLESHEET_OR_PRELOAD = re.compile(r"""\brel\s*=\s*["']?[^"'>]*(stylesheet|preload|modulepreload)""", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(BOOK / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def remote_loads(html: str) -> list[str]:
    """The scripts and stylesheets (and preloads) of `html` that come from another host."""
    found = []
    for match in LOADING_TAGS.finditer(html):
        tag = match.group(0)
        if match.group(1).lower() == "link" and not STYLESHEET_OR_PRELOAD.search(tag):
            continue  # canonical links, icons: not loaded as code or style
        source = SOURCE.search(tag)
        if source and (source.group(1).startswith("//") or urlparse(source.group(1)).scheme in ("http", "https")):
            found.append(tag)
    return found


def test_remote_loads_finds_what_it_should():
    html = ('<script src="https://cdn.example/mathjax.js"></script><link rel="stylesheet" href="http://x/y.css">'
            '<link rel="canonical" href="https://example.org/"><script src="javascripts/mathjax.js"></script>'
            '<script src=//cdn.example/a.js></script>')
    assert remote_loads(html) == ['<script src="https://cdn.example/mathjax.js">',
                                  '<link rel="stylesheet" href="http://x/y.css">', "<script src=//cdn.example/a.js>"]


def test_config_loads_nothing_remote():
    config = (BOOK / "mkdocs.yml").read_text()
    for key in ("extra_javascript", "extra_css"):
        block = re.search(rf"^{key}:\n((?:\s+-.*\n)*)", config, re.MULTILINE)
        entries = block.group(1) if block else ""
        assert "://" not in entries, f"mkdocs.yml {key} loads from the network:\n{entries}"


def test_no_page_loads_a_remote_script_or_stylesheet(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20, pages
    offenders = {str(p.relative_to(site)): remote_loads(p.read_text()) for p in pages}
    assert {p: tags for p, tags in offenders.items() if tags} == {}
    for source in sorted((BOOK / "docs").glob("*.md")):  # raw HTML in the chapters
        assert remote_loads(source.read_text()) == [], source
    # Stylesheets that would pull fonts or more CSS from the network.
    remote_css = re.compile(r"""(?:url\(\s*["']?|@import\s+["'])(?:https?:)?//""", re.IGNORECASE)
    assert [p.name for p in site.rglob("*.css") if remote_css.search(p.read_text())] == []


def test_the_math_page_loads_mathjax_from_the_site(site):
    page = site / MATH_PAGE
    html = page.read_text()
    assert html.count('class="arithmatex"') >= 10, "the page lost its formulas"
    scripts = [m.group(1) for tag in re.findall(r"<script\b[^>]*>", html) if (m := SOURCE.search(tag))]
    local = [urlparse(urljoin(page.as_uri(), s)).path for s in scripts]
    assert all(Path(p).is_file() for p in local), [p for p in local if not Path(p).is_file()]
    mathjax = [p for p in local if "/mathjax/" in p]
    assert mathjax, scripts
    assert Path(mathjax[0]).stat().st_size > 1_000_000, "MathJax's bundle is missing or truncated"
    # Components MathJax may load later, relative to its own location, are there too.
    assert (Path(mathjax[0]).parent / "ui" / "menu.js").is_file()


def test_formulas_typeset_in_a_browser_with_the_network_cut(site, tmp_path):
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            pytest.skip(f"{path} is missing: .ci/run installs Debian's browser (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 # No network: every host name fails to resolve, and no proxy could help.
                 "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "--window-size=1000,800",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.get((site / MATH_PAGE).as_uri())
        # Before the bundle runs, window.MathJax is only the configuration of javascripts/mathjax.js.
        WebDriverWait(driver, 20, poll_frequency=0.25).until(
            lambda d: d.execute_script("return !!(window.MathJax && MathJax.startup && MathJax.startup.promise)"),
            message="MathJax did not load from the site")
        driver.set_script_timeout(60)
        finished = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "MathJax.startup.promise.then(() => done(true), e => done(String(e)));")
        assert finished is True, f"MathJax failed: {finished}"
        formulas = driver.execute_script("return document.querySelectorAll('.arithmatex').length")
        typeset = driver.execute_script("return document.querySelectorAll('mjx-container svg').length")
        errors = driver.execute_script("return document.querySelectorAll('mjx-merror, [data-mjx-error]').length")
        raw = driver.execute_script(
            "return [...document.querySelectorAll('.arithmatex')].filter(e => !e.querySelector('mjx-container')).length")
        # From disk, mkdocs-material's search looks for an index script that only its offline
        # plugin writes (search needs a server there); anything else severe is a failure.
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "search_index" not in e["message"]]
    finally:
        driver.quit()
    assert typeset >= formulas > 10
    assert errors == 0 and raw == 0, (errors, raw)
    assert severe == [], severe


def test_every_figure_is_shown_and_has_its_data():
    figures = sorted(IMG.glob("*.svg"))
    assert figures, "no figures under book/docs/img"
    performance = (BOOK / "docs" / "performance.md").read_text()
    for figure in figures:
        assert (IMG / "data" / f"{figure.stem}.json").is_file(), f"{figure.name} has no JSON beside it"
        assert f"img/{figure.name}" in performance, f"the performance appendix does not show {figure.name}"


def test_the_figures_redraw_byte_for_byte(tmp_path):
    matplotlib = pytest.importorskip("matplotlib", reason="scripts/plot_benchmarks.py needs matplotlib (dev extra)")
    spec = importlib.util.spec_from_file_location("plot_benchmarks", ROOT / "scripts" / "plot_benchmarks.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    if matplotlib.__version__ != plot.MATPLOTLIB:
        pytest.skip(f"matplotlib {matplotlib.__version__}: the committed figures were drawn by {plot.MATPLOTLIB}")
    assert plot.main(["--out", str(tmp_path)]) == 0
    drawn = sorted(p.name for p in tmp_path.glob("*.svg"))
    assert drawn == sorted(p.name for p in IMG.glob("*.svg"))
    for name in drawn:
        assert (tmp_path / name).read_bytes() == (IMG / name).read_bytes(), f"{name} differs from its redrawing"
