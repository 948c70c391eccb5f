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
    "PREVIEW_TRAIT",
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
# The trait of a widget that holds what its stub shows until the real module has drawn
# (HTML the kernel made, every value escaped), if it has one.
PREVIEW_TRAIT = "_preview"
# The longest a preload waits for the page to be idle (ms): a page busy that long is busy
# with more than what it shows now.
_IDLE_MS = 3000
# The longest a preload waits for the page to rest (ms; see `_PRELOAD`).
_REST_LIMIT_MS = 30_000

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
_PRELOAD_LOCK = threading.Lock()


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
// The real module's holder: `ref` names it ("IPY_MODEL_<id>", from a trait of `model`).
const holding = async (model, ref) => {
  if (typeof ref !== "string" || !ref.startsWith(PREFIX))
    throw new Error(`no module holder: ${JSON.stringify(ref)}`);
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
const load = (key, model, ref) =>
  (window[key] ??= holding(model, ref)
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
  // What the widget shows until its real module has drawn (the kernel's escaped HTML: a
  // grid's first rows), over the element the real module draws into.
  const preview = model.get(%(preview)s);
  let shown = null;
  if (typeof preview === "string" && preview) {
    shown = Object.assign(document.createElement("div"), { className: "ckpt-preview" });
    shown.innerHTML = preview;
    shown.style.cssText = "position:absolute;inset:0;z-index:100;overflow:hidden;background:#fff";
    if (getComputedStyle(el).position === "static") el.style.position = "relative";
    el.appendChild(shown);
  }
  // A filter set meanwhile (a link to one tensor) comes with the rows it lets through.
  const update = () => shown && (shown.innerHTML = model.get(%(preview)s) || "");
  model.on(`change:${%(preview)s}`, update);
  try {
    return await drawReal(context);
  } finally {
    model.off(`change:${%(preview)s}`, update);
    shown?.remove();
  }
};
const drawReal = async (context) => {
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
  const shared = await load(key, model, model.get(%(trait)s));
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
            "preview": json.dumps(PREVIEW_TRAIT),
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
// The renders under way on the page, of every kind (`_STUB` keeps them).
const drawing = () =>
  Object.values(globalThis.__ckptRendering ?? {}).flatMap((renders) => [...renders]);
// When a person last clicked or typed on the page (or a preload ended).
let input = -Infinity;
for (const type of ["pointerdown", "keydown"])
  document.addEventListener(type, () => (input = performance.now()), { capture: true });
// True while an element matching `busy` is shown (a tab being built or drawn).
const shows = (busy) =>
  !!busy && [...document.querySelectorAll(busy)].some((el) => el.offsetParent !== null);
// Until the page is idle, `quiet` ms after the last click, key or preload, with nothing
// `busy` shown and no widget drawing, for at most `limit` ms.
const ready = async (busy, quiet, limit) => {
  const end = performance.now() + limit;
  for (;;) {
    await idle(%(idle_ms)d);
    const now = performance.now();
    if (now >= end) return;
    const pending = drawing();
    if (pending.length > 0)
      await Promise.race([
        Promise.allSettled(pending),
        new Promise((resolve) => setTimeout(resolve, end - now)),
      ]);
    else if (now - input < quiet) await new Promise((r) => setTimeout(r, quiet - now + input));
    else if (shows(busy)) await new Promise((resolve) => setTimeout(resolve, 100));
    else return;
  }
};
let running = null;
const preload = async (model) => {
  // In the order given (the module of the tab a person most likely opens first, first),
  // each once the page rests (`ready`): an evaluation is long tasks (plotly.js's is one of
  // 0.8-1.9 s) that a click would wait behind. A widget drawn meanwhile shares the import.
  for (const [key, ref] of model.get("modules") ?? []) {
    if (window[key]) continue;  // a widget of the kind loads it, or an earlier preload did
    await ready(model.get("busy"), model.get("quiet_ms"), %(limit_ms)d);
    if (window[key]) continue;
    performance.mark(`${key}:preload`);
    // What a module starts as it is evaluated (Perspective's WebAssembly) runs in tasks of
    // its own; the next module waits for the page to rest again.
    await load(key, model, ref);
    performance.mark(`${key}:preloaded`);
    input = performance.now();  // the next one after a rest, as after a click
  }
};
export default {
  render({ model, el }) {
    el.style.display = "none";
    const start = () => {
      // One pass at a time; a pass started after a change covers the modules it added.
      running = (running ?? Promise.resolve())
        .then(() => preload(model))
        .catch((error) => console.warn("preload:", error));
    };
    model.on("change:modules", start);
    start();
    return () => model.off("change:modules", start);
  },
};
"""
)


class ModulePreload(anywidget.AnyWidget):
    """Evaluates shared modules on the page ahead of the first widget of their kind, one at
    a time in the order `start` was called, each when the page is next idle and no widget
    is drawing (put one, hidden, in a displayed layout). A module then crosses to the page
    once (its holder is the widgets')."""

    _esm = patient(_PRELOAD % {"idle_ms": _IDLE_MS, "limit_ms": _REST_LIMIT_MS})
    # A CSS selector of what the page shows while a tab is built or drawn: no module is
    # evaluated while such an element is shown.
    busy = traitlets.Unicode("").tag(sync=True)
    # How long after a click or a key press no module is evaluated (ms): the next click
    # often follows (the tab's rows just drawn, the next tab).
    quiet_ms = traitlets.Int(1500).tag(sync=True)
    # (key, holder) of each module to preload, in order (until `start` the page has none).
    modules = traitlets.List(
        traitlets.Tuple(traitlets.Unicode(), traitlets.Instance(ModuleHolder))
    ).tag(sync=True, **w.widget_serialization)

    def start(self, source: str, *, name: str, css: str = "") -> None:
        """Preload `source` (and its style sheet `css`) as `shared_module(source, name=name,
        ...)` loads it, after the modules started before; once per page, however often it
        is called."""
        key = module_key(source, name=name)
        with _PRELOAD_LOCK:
            if any(known == key for known, _ in self.modules):
                return
            self.modules = [*self.modules, (key, module_holder(source, css))]
