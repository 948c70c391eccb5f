"""A large anywidget module evaluated once per page, however many widgets use it.

anywidget imports a widget's module from its `_esm` text through a new blob URL for every
widget, so each plotly figure evaluated its own copy of plotly.js with its widget (5 MB) and
each Perspective grid its own Perspective (6 MB, with its WebAssembly). A Chrome trace of the
dashboard at 300,000 tensors showed it: one `v8.evaluateModule` task of 4-8 s per figure on a
busy 2-core machine, the page frozen meanwhile. Worse, anywidget gives a model 2 s to load its
module (`AbortSignal.timeout(2000)`), and every message from the kernel to that model waits
for that load: a model that misses the 2 s never applies a later update (a figure's data sent
after its first state, a grid's new filter) and its widget stays empty.

So such a widget's `_esm` is `shared_module(...)`, a stub of a few lines that loads at once,
and the real module travels in the widget's state (`shared_source(source)`, a trait). When
the widget is first drawn, the stub imports the real module once per page (keyed by the
module's hash, so two versions never mix), shared by every widget of the kind, and waits for
it in `render`, which has no time limit, showing what it waits for meanwhile; then the real
module's `render` draws the view. (Both modules shared here, Perspective's and the figures'
`plot._FRONT`, export an object with a `render` only: no factory, no `initialize`.)

That 2 s is wall time, so it also fails a small module when the page is frozen by another
widget's large one: a grid made while plotly.js evaluates (5.9 s of one task, measured in
JupyterLab on this project's 2-core test machine) misses it, drops the rows the kernel sends
it and leaves "[anywidget] Failed to initialize model." on the page. Every widget module of the
dashboard therefore starts with a prologue (`patient(esm)`): run by the first of them on the
page, it makes anywidget's 2 s count only the time the page could run (a frozen stretch counts
as one 100 ms tick), so a module that is really broken still fails after 2 s of a live page.
It changes only calls of `AbortSignal.timeout(2000)` made from anywidget's own code (its
script's address names it, as JupyterLab and Notebook serve it); other calls, and anywidget
served from elsewhere, keep the browser's timeout.
"""

from __future__ import annotations

import hashlib
import json

import traitlets

__all__ = ["SOURCE_TRAIT", "patient", "shared_module", "shared_source"]

# The trait of a widget that holds its real module's text.
SOURCE_TRAIT = "_shared_source"

_PATIENCE = """
if (!globalThis.__ckptPatientTimeout) {
  globalThis.__ckptPatientTimeout = true;
  const timeout = AbortSignal.timeout.bind(AbortSignal);
  AbortSignal.timeout = (ms) => {
    if (ms !== 2000 || !String(new Error().stack).includes("anywidget")) return timeout(ms);
    const controller = new AbortController();
    let left = ms;
    let last = performance.now();
    const tick = () => {
      const now = performance.now();
      left -= Math.min(now - last, 100);  // a frozen page counts as one tick
      last = now;
      if (left > 0) setTimeout(tick, 50);
      else controller.abort(new DOMException("signal timed out", "TimeoutError"));
    };
    setTimeout(tick, 50);
    return controller.signal;
  };
}
"""


def patient(esm: str) -> str:
    """The widget module `esm` preceded by `_PATIENCE` (see the module docstring)."""
    return _PATIENCE + esm


_STUB = """
const key = %(key)s;
const load = (model) =>
  (window[key] ??= import(
    URL.createObjectURL(new Blob([model.get(%(trait)s)], { type: "text/javascript" }))
  ));
export default {
  async render(context) {
    const { el, model } = context;
    let waiting = null;
    if (!window[key]) {
      // The first widget of its kind on the page: say so, and let the page paint that
      // before the module's evaluation takes the main thread.
      waiting = Object.assign(document.createElement("div"), {
        className: "ckpt-module-loading",
        textContent: %(waiting)s,
      });
      waiting.style.cssText = "padding:12px;color:#555;font-style:italic";
      el.appendChild(waiting);
      await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
    }
    const shared = await load(model);
    waiting?.remove();
    return await shared.default.render(context);
  },
};
"""


def shared_module(source: str, *, name: str, waiting: str) -> str:
    """The `_esm` of a widget whose real module is `source`, held by its `shared_source`
    trait (see the module docstring); `name` keys it on the page together with the module's
    hash, `waiting` is the text shown while the first widget of the kind waits for it."""
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
    return patient(
        _STUB
        % {
            "key": json.dumps(f"__ckpt_{name}_{digest}"),
            "trait": json.dumps(SOURCE_TRAIT),
            "waiting": json.dumps(waiting),
        }
    )


def shared_source(source: str) -> traitlets.Unicode:
    """The synced trait that carries the real module `source` in the widget's first state."""
    return traitlets.Unicode(source).tag(sync=True)
