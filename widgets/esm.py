"""A large anywidget module sent once per kernel and evaluated once per page, however many
widgets use it: `shared_module(...)` is a stub that imports, once per page, the real module
held by one `ModuleHolder` widget per module per kernel (`holder_trait(source)`);
`patient(esm)` makes anywidget's 2 s limit on loading a module count only the time the page
could run. Why (pages frozen for seconds, widgets left empty) and the measurements:
docs/architecture.md, "widgets/".
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence

import ipywidgets as w
import traitlets

__all__ = [
    "HOLDER_TRAIT",
    "ModuleHolder",
    "holder_trait",
    "module_holder",
    "patient",
    "shared_module",
]

# The trait of a widget that names the holder of its real module.
HOLDER_TRAIT = "_module_holder"

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


class ModuleHolder(w.Widget):
    """The one model per kernel that holds a large module's text (`source`) and its style
    sheet (`css`) for every widget that uses them (`module_holder`). A plain ipywidgets
    model: no view, nothing to load."""

    source = traitlets.Unicode().tag(sync=True)
    css = traitlets.Unicode().tag(sync=True)


_HOLDERS: dict[str, ModuleHolder] = {}
_HOLDERS_LOCK = threading.Lock()


def _digest(*texts: str) -> str:
    return hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()[:16]


def module_holder(source: str, css: str = "") -> ModuleHolder:
    """The kernel's holder of `source` and `css`, made (and sent to the page) by the first
    call; made again if it was closed (`Widget.close_all()`). A page reload or a second view
    of a dashboard finds the live one in the kernel."""
    digest = _digest(source, css)
    with _HOLDERS_LOCK:
        holder = _HOLDERS.get(digest)
        if holder is None or holder.comm is None:
            holder = _HOLDERS[digest] = ModuleHolder(source=source, css=css)
        return holder


class _HolderTrait(traitlets.Instance[ModuleHolder]):
    """A widget's reference to the holder of `source` and `css`, the kernel's by default."""

    def __init__(self, source: str, css: str) -> None:
        super().__init__(ModuleHolder)
        self.source, self.css = source, css

    def make_dynamic_default(self) -> ModuleHolder:
        return module_holder(self.source, self.css)

    def default_value_repr(self) -> str:
        return "the kernel's ModuleHolder"


def holder_trait(source: str, *, css: str = "") -> traitlets.Instance[ModuleHolder]:
    """The synced trait that names (`IPY_MODEL_<id>`) the holder of the real module `source`
    and its style sheet `css` in the widget's first state (the widget's own `_css` then stays
    empty); its `source` attribute is the module's text."""
    return _HolderTrait(source, css).tag(sync=True, **w.widget_serialization)


_STUB = """
const key = %(key)s;
const kind = %(kind)s;
const after = %(after)s;
// Each kind's renders under way on the page (a grid's ends once its rows are drawn).
const rendering = (globalThis.__ckptRendering ??= {});
const PREFIX = "IPY_MODEL_";
// The real module's holder, the one the widget names.
const holding = async (model) => {
  const ref = model.get(%(trait)s);
  if (typeof ref !== "string" || !ref.startsWith(PREFIX))
    throw new Error(`no module holder in %(trait_name)s: ${JSON.stringify(ref)}`);
  for (let tries = 0; ; tries++) {
    try {
      return await model.widget_manager.get_model(ref.slice(PREFIX.length));
    } catch (error) {
      // A page restoring the kernel's widgets (a reload) may register the holder's model
      // a moment after this widget's: ask again for up to 10 s.
      if (tries >= 40) throw error;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }
};
const load = (model) =>
  (window[key] ??= holding(model)
    .then((holder) => {
      if (holder.get("css")) {
        // Once per page too (anywidget rewrites a widget's `_css` for every widget).
        const style = Object.assign(document.createElement("style"), { id: key });
        style.textContent = holder.get("css");
        document.head.appendChild(style);
      }
      return import(
        URL.createObjectURL(new Blob([holder.get("source")], { type: "text/javascript" }))
      );
    })
    .catch((error) => {
      delete window[key];  // the next widget of the kind tries again
      throw error;
    }));
const settle = async (kinds) => {
  const pending = kinds.flatMap((k) => [...(rendering[k] ?? [])]);
  if (pending.length === 0) return;
  // Their module's evaluation and their first draw come first (a person opened the tab for
  // the rows), for up to 5 s.
  await Promise.race([
    Promise.allSettled(pending),
    new Promise((resolve) => setTimeout(resolve, 5000)),
  ]);
};
const draw = async (context) => {
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
    await settle(after);
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  }
  const shared = await load(model);
  waiting?.remove();
  return await shared.default.render(context);
};
export default {
  render(context) {
    const drawn = draw(context);
    const mine = (rendering[kind] ??= new Set());
    mine.add(drawn);
    drawn.finally(() => mine.delete(drawn)).catch(() => {});
    return drawn;
  },
};
"""


def shared_module(source: str, *, name: str, waiting: str, after: Sequence[str] = ()) -> str:
    """The `_esm` of a widget whose real module is `source`, held by the holder its
    `holder_trait(source, ...)` names (see the module docstring); `name` keys it on the page
    together with the module's hash, `waiting` is the text shown while the first widget of
    the kind waits for it. The first widget of the kind imports the module once the renders
    of the kinds named `after` under way on the page have drawn (up to 5 s)."""
    return patient(
        _STUB
        % {
            "key": json.dumps(f"__ckpt_{name}_{_digest(source)}"),
            "kind": json.dumps(name),
            "after": json.dumps(list(after)),
            "trait": json.dumps(HOLDER_TRAIT),
            "trait_name": HOLDER_TRAIT,
            "waiting": json.dumps(waiting),
        }
    )
