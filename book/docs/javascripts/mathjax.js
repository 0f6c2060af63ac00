// MathJax configuration for pymdownx.arithmatex (generic mode).
//
// mkdocs.yml loads MathJax itself after this file, from the site (javascripts/mathjax/, put
// there by book/offline_math.py), so formulas typeset with no network. Output is SVG: no web
// fonts to fetch, which also works for a book opened straight from disk (file://).
window.MathJax = {
  tex: {
    inline: [["\\(", "\\)"]],
    display: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  svg: {
    fontCache: "global",
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};

// mkdocs-material swaps pages without reloading when instant navigation is on;
// typeset each new page, but only if MathJax is actually present.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    const mj = window.MathJax;
    if (mj && typeof mj.typesetPromise === "function") {
      if (typeof mj.startup.output.clearCache === "function") mj.startup.output.clearCache();  // CHTML only
      mj.typesetClear();
      mj.texReset();
      mj.typesetPromise();
    }
  });
}
