"""Figures as wide as the dashboard: a hidden helper widget that tells plotly when to re-measure.

A plotly FigureWidget sizes itself when it is first drawn and again on a window `resize` event.
Drawn inside a dashboard tab, it is drawn before the tab has its width, so it stays at plotly's
700 px default. This widget (anywidget: a few lines of JavaScript, no build step) watches the
dashboard's figures with a ResizeObserver and, when one of them changes size (a tab is shown,
the notebook is resized), sends the window `resize` event the figures already listen to. The
tensor grid (a `perspective-viewer` built in a hidden tab) is told its new size the same way.
"""

from __future__ import annotations

import anywidget

from .esm import patient

__all__ = ["Autosize"]

_ESM = """
export default {
  render({ el }) {
    el.style.display = "none";
    const root = el.closest(".ckpt-dashboard") || el.parentElement || document.body;
    let timer = null;
    const poke = () => {
      clearTimeout(timer);
      timer = setTimeout(() => window.dispatchEvent(new Event("resize")), 60);
    };
    const sizes = new ResizeObserver((entries) => {
      for (const entry of entries) {
        // A grid built in a hidden tab draws its rows when told it has a size.
        if (entry.target.notifyResize) entry.target.notifyResize(true);
      }
      poke();
    });
    const sized = ".js-plotly-plot, perspective-viewer";
    const watched = new WeakSet();
    const observe = (item) => {
      if (!watched.has(item)) { watched.add(item); sizes.observe(item); }
    };
    // `node` and what it holds.
    const watch = (node) => {
      if (node.nodeType !== Node.ELEMENT_NODE) return;
      if (node.matches(sized)) observe(node);
      for (const item of node.querySelectorAll(sized)) observe(item);
    };
    // New figures appear when a tab is built; only what a change added is looked at, not
    // the whole dashboard on every change (rows, spinners and texts change many times a
    // second while a tab is built). A figure's own element is a change's target too: plotly
    // marks its element as a plot, then adds the plot's children to it.
    const added = new MutationObserver((records) => {
      for (const record of records) {
        if (record.target.matches(sized)) observe(record.target);
        for (const node of record.addedNodes) watch(node);
      }
    });
    added.observe(root, { childList: true, subtree: true });
    watch(root);
    return () => { sizes.disconnect(); added.disconnect(); clearTimeout(timer); };
  },
};
"""


class Autosize(anywidget.AnyWidget):
    """Put one inside a dashboard's top-level box (it draws nothing)."""

    _esm = patient(_ESM)
