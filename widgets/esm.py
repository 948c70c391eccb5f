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

import anywidget
import ipywidgets as w
import traitlets

__all__ = [
    "HOLDER_TRAIT",
    "ModuleHolder",
    "ModulePreload",
    "holder_trait",
    "module_holder",
    "module_key",
    "patient",
    "shared_module",
]

# The trait of a widget that names the holder of its real module.
HOLDER_TRAIT = "_module_holder"
# The longest a preload waits for the page to be idle (ms): a page busy that long is busy
# with more than what it shows now.
_IDLE_MS = 3000

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


# How a page gets a shared module: the holder the widget's trait names, then the module
# evaluated once per page (kept in `window[key]`), shared by `_STUB` and `_PRELOAD`.
_LOAD = """
const PREFIX = "IPY_MODEL_";
// The keys of the modules evaluated on this page.
const loaded = (globalThis.__ckptLoaded ??= new Set());
// The real module's holder, the one the widget names in its trait `trait`.
const holding = async (model, trait) => {
  const ref = model.get(trait);
  if (typeof ref !== "string" || !ref.startsWith(PREFIX))
    throw new Error(`no module holder in ${trait}: ${JSON.stringify(ref)}`);
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
const load = (key, model, trait) =>
  (window[key] ??= holding(model, trait)
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
    .then((module) => {
      loaded.add(key);
      return module;
    })
    .catch((error) => {
      delete window[key];  // the next widget of the kind tries again
      throw error;
    }));
"""

_STUB = (
    _LOAD
    + """
const key = %(key)s;
const kind = %(kind)s;
const after = %(after)s;
// Each kind's renders under way on the page (a grid's ends once its rows are drawn).
const rendering = (globalThis.__ckptRendering ??= {});
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
  if (!loaded.has(key)) {
    // The module is not evaluated yet (by the first widget of its kind on the page, or
    // being preloaded: `_PRELOAD`): say so, and let the page paint that before the
    // module's evaluation takes the main thread.
    waiting = Object.assign(document.createElement("div"), {
      className: "ckpt-module-loading",
      textContent: %(waiting)s,
    });
    waiting.style.cssText = "padding:12px;color:#555;font-style:italic";
    el.appendChild(waiting);
    if (!window[key]) await settle(after);
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  }
  const shared = await load(key, model, %(trait)s);
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
)


def shared_module(source: str, *, name: str, waiting: str, after: Sequence[str] = ()) -> str:
    """The `_esm` of a widget whose real module is `source`, held by the holder its
    `holder_trait(source, ...)` names (see the module docstring); `name` keys it on the page
    together with the module's hash, `waiting` is the text shown while the first widget of
    the kind waits for it. The first widget of the kind imports the module once the renders
    of the kinds named `after` under way on the page have drawn (up to 5 s)."""
    return patient(
        _STUB
        % {
            "key": json.dumps(module_key(source, name=name)),
            "kind": json.dumps(name),
            "after": json.dumps(list(after)),
            "trait": json.dumps(HOLDER_TRAIT),
            "waiting": json.dumps(waiting),
        }
    )


def module_key(source: str, *, name: str) -> str:
    """Where a page keeps the module `source` once imported: `name` and the module's hash."""
    return f"__ckpt_{name}_{_digest(source)}"


_PRELOAD = (
    _LOAD
    + """
// Waits for a moment the page has nothing to do (at most `ms`), after its next paint.
const idle = (ms) =>
  new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0))).then(
    () =>
      new Promise((resolve) =>
        typeof requestIdleCallback === "function"
          ? requestIdleCallback(() => resolve(), { timeout: ms })
          : setTimeout(resolve, 100),
      ),
  );
const preload = async (model) => {
  const key = model.get("key");
  if (!key || !model.get(%(trait)s)) return;
  // After what the page shows now has painted and while nothing else runs: the module's
  // evaluation is long tasks a click waits behind.
  await idle(%(idle_ms)d);
  if (window[key]) return;  // a widget of the kind loads it, or an earlier preload did
  const shared = await load(key, model, %(trait)s);
  // What the module starts as it is evaluated (Perspective's WebAssembly) runs in tasks of
  // its own; nothing to wait for here.
  void shared;
};
export default {
  render({ model, el }) {
    el.style.display = "none";
    const start = () => preload(model).catch((error) => console.warn("preload:", error));
    model.on("change:key", start);
    start();
    return () => model.off("change:key", start);
  },
};
"""
)


class ModulePreload(anywidget.AnyWidget):
    """Evaluates a shared module on the page ahead of the first widget of its kind, when the
    page is next idle after `start` (put one, hidden, in a displayed layout). Its module then
    crosses to the page once (its holder is the widgets')."""

    _esm = patient(_PRELOAD % {"trait": json.dumps("holder"), "idle_ms": _IDLE_MS})
    key = traitlets.Unicode("").tag(sync=True)
    # The holder of the module, set by `start` (until then the page has nothing to load).
    holder = traitlets.Instance(ModuleHolder, allow_none=True).tag(
        sync=True, **w.widget_serialization
    )

    def start(self, source: str, *, name: str, css: str = "") -> None:
        """Preload `source` (and its style sheet `css`) as `shared_module(source, name=name,
        ...)` loads it; once per page, however often it is called."""
        key = module_key(source, name=name)
        if self.key == key:
            return
        with self.hold_sync():
            self.holder = module_holder(source, css)
            self.key = key
