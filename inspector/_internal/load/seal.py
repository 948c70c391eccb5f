"""Run code that must only compute: no prompt, no network, no process, no write outside a
private temp folder; and the one way a checkpoint folder's own code is imported.

The seal makes the acts themselves impossible (process-wide switches, and an audit hook for
the sealed thread) rather than listing the config keys that lead to them, because which keys
lead there changes from one transformers release to the next. What it refuses and what it
does not cover: SECURITY.md, 1b; how: docs/architecture.md, "load/".
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import itertools
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from inspector._internal.common.text import short_repr

__all__ = ["REFUSED_EVENT", "Refused", "Seal", "import_from_folder", "sealed"]

REFUSED_EVENT = "inspector._internal.load.seal.refused"


class Refused(PermissionError):
    """Something a sealed build may not do (a prompt, the network, a process, a write)."""


@dataclass
class Seal:
    """One sealed section: its private folder (removed when it ends) and what was refused."""

    folder: str
    refused: list[str] = field(default_factory=list)
    # `sys.pycache_prefix` (resolved) when the seal began: code in it may change the
    # attribute, not what the seal lets through.
    pycache_root: str | None = None

    def refuse(self, what: str) -> NoReturn:
        if len(self.refused) < _KEPT:
            self.refused.append(what)
        # Observable by any audit hook (a test, a monitor): `REFUSED_EVENT`, (what,).
        sys.audit(REFUSED_EVENT, what)
        raise Refused(f"not allowed while a model is built from an untrusted config: {what}")

    def needed(self, exc: BaseException | None) -> str | None:
        """What a failed build needed that the seal withholds: the first refusal, or the
        Hub (an offline error anywhere in `exc`'s chain); None when it failed otherwise."""
        if self.refused:
            return self.refused[0]
        seen = 0
        while exc is not None and seen < 32:
            if type(exc).__name__ in _OFFLINE_ERRORS:
                # The URL it wanted, not the library's advice (to leave offline mode).
                text = " ".join(str(exc).split())
                url = re.search(r"https?://[^\s'\"]+", text)
                what = url.group(0).rstrip(":.,") if url else text
                return f"files from the Hugging Face Hub ({short_repr(what, limit=160)})"
            exc = exc.__cause__ or exc.__context__
            seen += 1
        return None


_KEPT = 5
# huggingface_hub's errors for a request made offline or a file not in the (private) cache.
_OFFLINE_ERRORS = frozenset({"OfflineModeIsEnabled", "LocalEntryNotFoundError"})


@contextlib.contextmanager
def sealed() -> Iterator[Seal]:
    """Seal this thread (see the module docstring) for the duration of the block. Sealed
    sections run one at a time (they switch process-wide state); one nested in another
    is the same section."""
    current = _local.seal
    if current is not None:
        yield current
        return
    with _LOCK, contextlib.ExitStack() as stack:
        _install_hook()
        folder = os.path.realpath(tempfile.mkdtemp(prefix="ckpt-inspect-sealed-"))
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        prefix = sys.pycache_prefix
        seal = Seal(folder, pycache_root=os.path.realpath(prefix) if prefix else None)
        stack.callback(_forget, folder, list(sys.path), dict(sys.modules))
        for target, name, value in _switches(seal):
            _switch(stack, target, name, value)
        _local.seal = seal
        stack.callback(setattr, _local, "seal", None)
        yield seal


# -- process-wide switches --------------------------------------------------------------------


def _switch(stack: contextlib.ExitStack, target: Any, name: str, value: Any) -> None:
    """Set `target.name` (or `os.environ[name]` when target is os.environ) until the stack
    closes."""
    if target is os.environ:
        old = os.environ.get(name)
        os.environ[name] = value
        stack.callback(_restore_env, name, old)
        return
    old = getattr(target, name)
    setattr(target, name, value)
    stack.callback(setattr, target, name, old)


def _restore_env(name: str, old: str | None) -> None:
    if old is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = old


def _switches(seal: Seal) -> list[tuple[Any, str, Any]]:
    """(object, attribute, value while sealed): the terminal, the Hub, the caches."""

    def no_input(prompt: object = "", /) -> str:
        first = str(prompt).strip().splitlines()
        seal.refuse(f"an answer from the terminal ({short_repr(first[-1] if first else '')})")

    private = seal.folder
    out: list[tuple[Any, str, Any]] = [
        (builtins, "input", no_input),
        (sys, "stdin", _NoStdin(seal)),
    ]
    # Read at call time by code that looks at the environment, not at the constants below.
    for name, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("HF_HOME", os.path.join(private, "hf")),
        ("HF_HUB_CACHE", os.path.join(private, "hf", "hub")),
        ("HF_MODULES_CACHE", os.path.join(private, "hf", "modules")),
        ("TORCH_HOME", os.path.join(private, "torch")),
    ):
        out.append((os.environ, name, value))
    hub = _module("huggingface_hub.constants")
    if hub is not None:
        out.append((hub, "HF_HUB_OFFLINE", True))
        for name, sub in (("HF_HUB_CACHE", "hub"), ("HF_ASSETS_CACHE", "assets")):
            if hasattr(hub, name):
                out.append((hub, name, os.path.join(private, "hf", sub)))
        if hasattr(hub, "HF_XET_CACHE"):
            out.append((hub, "HF_XET_CACHE", os.path.join(private, "hf", "xet")))
    dynamic = _module("transformers.dynamic_module_utils")
    if dynamic is not None:
        out.append((dynamic, "TIME_OUT_REMOTE_CODE", 0))
        out.append((dynamic, "HF_MODULES_CACHE", os.path.join(private, "hf", "modules")))
    return [(t, n, v) for t, n, v in out if t is os.environ or hasattr(t, n)]


def _module(name: str) -> types.ModuleType | None:
    """An installed library module (imported now if it is not yet), or None."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _forget(
    folder: str, path_before: list[str], modules_before: dict[str, types.ModuleType]
) -> None:
    """Undo what code in the seal left behind that points into the private folder: entries
    it added to `sys.path` (transformers' modules cache adds itself) and modules imported
    from there, so a later import in this process never looks in a removed folder. Only a
    module that was not in `sys.modules` before the seal can come from the folder, new then:
    the others are not looked at (with torch and transformers, thousands of `__file__`
    look-ups, some through a lazy module's `__getattr__`: ~4 ms a verdict)."""
    sys.path[:] = [p for p in sys.path if p in path_before or not _inside(folder, p)]
    for name, module in list(sys.modules.items()):
        if modules_before.get(name) is module:
            continue
        origin = getattr(module, "__file__", None)
        if isinstance(origin, str) and _inside(folder, origin):
            del sys.modules[name]


class _NoStdin(io.TextIOBase):
    """`sys.stdin` while sealed: every read is refused, there is no descriptor to read."""

    def __init__(self, seal: Seal) -> None:
        super().__init__()
        self._seal = seal

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no terminal while a model is built")

    def read(self, size: int | None = -1, /) -> str:
        self._seal.refuse("an answer from the terminal (sys.stdin)")

    def readline(self, size: int | None = -1, /) -> str:  # type: ignore[override]
        self._seal.refuse("an answer from the terminal (sys.stdin)")


# -- the audit hook (the sealed thread only) ---------------------------------------------------


class _Local(threading.local):
    seal: Seal | None = None


_local = _Local()
_LOCK = threading.RLock()
_hooked = False


def _install_hook() -> None:
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True


def _audit(event: str, args: tuple[Any, ...]) -> None:
    seal = _local.seal
    if seal is None:
        return
    rule = _RULES.get(event)
    if rule is not None:
        rule(seal, event, args)


def _network(seal: Seal, event: str, args: tuple[Any, ...]) -> None:
    if event.startswith("socket."):
        # (socket, address) for connect, bind, sendto; (host, port, ...) for lookups.
        target = args[1] if event in _SOCKET_CALLS else args[:2]
    else:
        target = args[0] if args else ""
    seal.refuse(f"the network ({event} {short_repr(str(target), limit=120)})")


def _process(seal: Seal, event: str, args: tuple[Any, ...]) -> None:
    seal.refuse(f"starting a process ({event} {short_repr(str(args[:2]), limit=120)})")


def _terminal(seal: Seal, event: str, args: tuple[Any, ...]) -> None:
    seal.refuse(f"an answer from the terminal ({short_repr(str(args[0]) if args else '')})")


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _open(seal: Seal, event: str, args: tuple[Any, ...]) -> None:
    path, mode, flags = (*args, None, None, None)[:3]
    writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & _WRITE_FLAGS
    )
    # importlib creates its temp file anew (O_EXCL: never through a link, never over a file).
    fresh = isinstance(flags, int) and flags & _FRESH == _FRESH
    if writes and not _writable(seal, path, "temp" if fresh else None) and not _library_setup():
        seal.refuse(f"writing {short_repr(_text(path), limit=160)} ({event})")


def _writes(
    positions: Sequence[int], bytecode: str | None = None
) -> Callable[[Seal, str, tuple[Any, ...]], None]:
    """The rule for an act changing the paths at `positions`; `bytecode` is the one kind of
    importlib's bytecode writes (`_bytecode`) the act may make."""

    def rule(seal: Seal, event: str, args: tuple[Any, ...]) -> None:
        for i in positions:
            if i < len(args) and not _writable(seal, args[i], bytecode) and not _library_setup():
                seal.refuse(f"changing {short_repr(_text(args[i]), limit=160)} ({event})")

    return rule


def _database(seal: Seal, event: str, args: tuple[Any, ...]) -> None:
    """sqlite3.connect: SQLite opens (and creates) the file itself, past the `open` event;
    an in-memory database writes nothing."""
    database = args[0] if args else None
    text = _text(database)
    if text in ("", ":memory:") or text.startswith("file::memory:"):
        return
    if not _writable(seal, database, None) and not _library_setup():
        seal.refuse(f"changing {short_repr(text, limit=160)} ({event})")


def _rename(seal: Seal, event: str, args: tuple[Any, ...]) -> None:
    """os.rename / os.replace: importlib renames its temp file onto the `.pyc` beside it,
    and nothing else onto a `.pyc` (a link made in the private folder, another file)."""
    src, dst = (*args, None, None)[:2]
    temp = _writable(seal, src, "temp")
    if not temp and not _library_setup():
        seal.refuse(f"changing {short_repr(_text(src), limit=160)} ({event})")
    paired = temp and not _writable(seal, src, None)
    if (
        not _writable(seal, dst, None)
        and not (paired and _is_temp_of(_text(src), _text(dst)) and _writable(seal, dst, "pyc"))
        and not _library_setup()
    ):
        seal.refuse(f"changing {short_repr(_text(dst), limit=160)} ({event})")


def _is_temp_of(src: str, dst: str) -> bool:
    """`src` is importlib's temp name for `dst`: `<dst>.<id>`."""
    return src.startswith(dst + ".") and src[len(dst) + 1 :].isdigit()


def _library_setup() -> bool:
    """True when the innermost module-level code on the stack is an installed library's,
    being imported: its own set-up (torch creates its compile cache folder when
    `torch._dynamo` is first imported) is not the config's doing, and refusing it would
    leave the library half-imported for the rest of the process. The checkpoint folder's
    own files, and module-level code not run by an import (a script, a notebook cell), are
    not exempt."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(512):
        if frame is None:
            return False
        if frame.f_code.co_name == "<module>":
            file, caller = frame.f_code.co_filename, frame.f_back
            return (
                caller is not None
                and caller.f_code.co_filename.startswith("<frozen importlib")
                and os.path.isabs(file)
                and file.endswith(".py")
                and not any(_inside(root, file) for root in _FINDER.roots.values())
            )
        frame = frame.f_back
    return False


def _text(path: object) -> str:
    try:
        return os.fsdecode(path)  # type: ignore[arg-type]
    except TypeError:
        return str(path)


def _writable(seal: Seal, path: object, bytecode: str | None) -> bool:
    """The private folder, /dev/null, an open descriptor, and, when `bytecode` names the
    kind of write the act is, Python's bytecode cache as importlib writes it (`_bytecode`).
    Never a relative path: it may be relative to a folder descriptor (`dir_fd`) that the
    event does not carry (`os.open`'s), not to the working folder."""
    if path is None or isinstance(path, int):
        return True
    try:
        text = os.fsdecode(path)  # type: ignore[arg-type]
        full = os.path.realpath(text)
    except (TypeError, ValueError):
        return False
    if not os.path.isabs(text):
        return False
    if full == os.devnull or _inside(seal.folder, full):
        return True
    return bytecode is not None and _bytecode(seal, full) == bytecode


# What importlib writes for the source `/a/b/m.py` (`SourceFileLoader.set_data`): the folder
# `/a/b/__pycache__` (os.mkdir), the temp file `/a/b/__pycache__/m.<tag>[.opt-N].pyc.<id>`
# (os.open with O_EXCL), renamed onto the `.pyc` (os.replace) or removed when that fails
# (os.remove). Under `sys.pycache_prefix` the same names, with `<prefix>/a/b` for
# `/a/b/__pycache__` and each of its folders made one by one.
_PYC = re.compile(
    rf"([^.]+)\.{re.escape(sys.implementation.cache_tag or '-')}(?:\.opt-\d+)?\.pyc(\.\d+)?"
)
_FRESH = os.O_CREAT | os.O_EXCL


def _bytecode(seal: Seal, full: str) -> str | None:
    """What importlib would write at the resolved path `full`: "folder" (a cache folder of an
    existing source folder), "temp" (the temp file of the bytecode of an existing `.py`
    file), "pyc" (that bytecode), or None (nothing importlib writes). The seal lets each
    through for the one act importlib makes on it, no other (a link, a mode change)."""
    root = seal.pycache_root
    if root is not None and _inside(root, full):
        mirrored = full[len(root) :] or os.sep  # the source's own path
        if os.path.isdir(mirrored):
            return "folder"
        source_folder, name = os.path.split(mirrored)
    else:
        folder, name = os.path.split(full)
        if name == "__pycache__":
            return "folder" if os.path.isdir(folder) else None
        if os.path.basename(folder) != "__pycache__":
            return None
        source_folder = os.path.dirname(folder)
    found = _PYC.fullmatch(name)
    if found is None or not os.path.isfile(os.path.join(source_folder, found[1] + ".py")):
        return None
    return "temp" if found[2] else "pyc"


def _inside(folder: str, path: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


_SOCKET_CALLS = frozenset({"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"})
_RULES: dict[str, Callable[[Seal, str, tuple[Any, ...]], None]] = {
    **dict.fromkeys(
        (
            *_SOCKET_CALLS,
            "socket.getaddrinfo",
            "socket.gethostbyname",
            "socket.gethostbyname_ex",
            "socket.gethostbyaddr",
            "socket.getnameinfo",
            "urllib.Request",
            "http.client.connect",
            "ftplib.connect",
            "smtplib.connect",
            "imaplib.open",
            "poplib.connect",
            "nntplib.connect",
            "webbrowser.open",
        ),
        _network,
    ),
    **dict.fromkeys(
        (
            "subprocess.Popen",
            "os.system",
            "os.exec",
            "os.posix_spawn",
            "os.spawn",
            "os.fork",
            "os.forkpty",
            "os.startfile",
            "pty.spawn",
        ),
        _process,
    ),
    "builtins.input": _terminal,
    "open": _open,
    **dict.fromkeys(
        (
            "os.rmdir",
            "os.truncate",
            "os.chmod",
            "os.chown",
            "os.utime",
            "os.chflags",
            "os.lchflags",
            "os.setxattr",
            "os.removexattr",
            "shutil.rmtree",
            "shutil.chown",
            "shutil.make_archive",
        ),
        _writes((0,)),
    ),
    **dict.fromkeys(
        (
            "os.link",
            "os.symlink",
            "shutil.copyfile",
            "shutil.copymode",
            "shutil.copystat",
            "shutil.copytree",
            "shutil.unpack_archive",
        ),
        _writes((1,)),
    ),
    "os.mkdir": _writes((0,), "folder"),
    "os.remove": _writes((0,), "temp"),
    "os.rename": _rename,
    "sqlite3.connect": _database,
    "shutil.move": _writes((0, 1)),
}


# -- a checkpoint folder's own code -------------------------------------------------------------


def import_from_folder(folder: str, module: str) -> types.ModuleType:
    """Module `module` (dotted, relative to `folder`) of the checkpoint folder, imported
    from there alone (see the module docstring) as part of a new package, so relative
    imports between the folder's files work and nothing clashes with an earlier import.
    Raises ImportError when the file is not a regular file in the folder."""
    root = os.path.realpath(folder)
    package = f"_ckpt_inspect_code_{next(_PACKAGES)}"
    spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    spec.submodule_search_locations = []
    holder = importlib.util.module_from_spec(spec)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    _FINDER.roots[package] = root
    sys.modules[package] = holder
    return importlib.import_module(f"{package}.{module}")


_PACKAGES = itertools.count(1)


class _SourceOnly(importlib.machinery.SourceFileLoader):
    """Compiles the `.py` file on every import: never reads bytecode the folder ships,
    never writes any."""

    def get_code(self, fullname: str) -> types.CodeType:
        source = self.get_data(self.path)
        return compile(source, self.path, "exec", dont_inherit=True)


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Resolves the modules of the packages `import_from_folder` made, inside their folder
    only: `a.b` is `<folder>/a/b.py` or `<folder>/a/b/__init__.py`, a regular file reached
    through no link."""

    def __init__(self) -> None:
        self.roots: dict[str, str] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, rest = fullname.partition(".")
        root = self.roots.get(package)
        if root is None or not rest:
            return None
        parts = rest.split(".")
        candidates = (([*parts[:-1], f"{parts[-1]}.py"], False), ([*parts, "__init__.py"], True))
        for relative, is_package in candidates:
            if _plain_file(root, relative):
                file = os.path.join(root, *relative)
                return importlib.util.spec_from_file_location(
                    fullname,
                    file,
                    loader=_SourceOnly(fullname, file),
                    submodule_search_locations=[] if is_package else None,
                )
        return None


def _plain_file(root: str, parts: list[str]) -> bool:
    """`root/parts...` is a regular file and no component below `root` is a link."""
    path = root
    for i, part in enumerate(parts):
        if not part or part in (".", "..") or os.sep in part:
            return False
        path = os.path.join(path, part)
        try:
            info = os.lstat(path)
        except OSError:
            return False
        last = i == len(parts) - 1
        if stat.S_ISLNK(info.st_mode) or not (
            stat.S_ISREG(info.st_mode) if last else stat.S_ISDIR(info.st_mode)
        ):
            return False
    return True


_FINDER = _FolderFinder()
