"""A large anywidget module evaluated once per page, however many widgets use it.

anywidget evaluates a widget's module once per widget and gives a model 2 s to load it, so
a page of plotly figures and Perspective grids froze for seconds and widgets stayed empty.
Here `shared_module(...)` is a stub that loads at once and imports the real module (sent in
the widget's state) once per page, and `patient(esm)` makes anywidget's 2 s count only the
time the page could run. The measurements and the mechanism: docs/architecture.md,
"widgets/".
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
