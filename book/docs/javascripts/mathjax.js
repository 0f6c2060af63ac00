// MathJax configuration for pymdownx.arithmatex (generic mode).
//
// The book builds offline. This file configures MathJax; mkdocs.yml loads MathJax itself
// after it (from a CDN, so formulas render when the reader is online). Without it,
// formulas stay readable as their TeX source, e.g. \(\operatorname{softmax}(x)_i\).
window.MathJax = {
  tex: {
    inline: [["\\(", "\\)"]],
    display: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
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
      mj.startup.output.clearCache();
      mj.typesetClear();
      mj.texReset();
      mj.typesetPromise();
    }
  });
}
