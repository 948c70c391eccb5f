"""The one restricted unpickler every pickle reader uses (the common state excepted: torch's
own, `pickles.common_state`): a global resolves to what its table holds for it
(`pickles.allowed`, made for this read), anything else is refused before it is resolved;
nothing is imported and nothing the stream names runs.

`unpickle` audits the stream first (`pickles.audit`) unless the caller runs it in the
bounded child (`pickles.sandbox`), and turns whatever the unpickler raises on untrusted
bytes into one of the refusals of `pickles.errors`.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Mapping
from typing import Any

from inspector._internal.common.text import short_repr
from inspector._internal.formats.pickles.allowed import Reader, stand_ins
from inspector._internal.formats.pickles.audit import check_pickle
from inspector._internal.formats.pickles.errors import (
    PickleBombError,
    PickleFormatError,
    RefusedGlobalError,
)

__all__ = ["RestrictedUnpickler", "unpickle"]

Refusal = Callable[[str, str], Exception]


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves globals from `table` only, refusing any other with `refusal(module, name)`;
    persistent ids go to `persistent` (refused without one, as `pickle.Unpickler` does)."""

    def __init__(
        self,
        data: bytes,
        table: Mapping[tuple[str, str], Any],
        *,
        refusal: Refusal,
        persistent: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(io.BytesIO(data))
        self._table = table
        self._refusal = refusal
        if persistent is not None:
            # The C unpickler reads this attribute when it meets a persistent id; left
            # unset, it refuses one.
            self.persistent_load = persistent  # type: ignore[method-assign]

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._table[(module, name)]
        except (KeyError, TypeError):
            raise self._refusal(str(module), str(name)) from None


def unpickle(
    data: bytes,
    reader: Reader,
    *,
    audited: bool = True,
    persistent: Callable[[Any], Any] | None = None,
) -> Any:
    """`data` (exactly one pickle) unpickled into `reader`'s stand-ins.

    Audited first unless `audited` is False (only in the bounded child). Raises
    `HostilePickleError` (code-running names, a changed global), `PickleBombError`,
    `RefusedGlobalError` (a name outside the reader's rows; its `reasons` may say otherwise)
    and `PickleFormatError` (not readable, or content a stand-in refuses: a clause)."""
    if audited:
        try:
            check_pickle(data)
        except PickleFormatError as exc:
            raise PickleFormatError(f"is not a readable pickle ({exc})") from None
    unpickler = RestrictedUnpickler(
        data, stand_ins(reader), refusal=reader.refused, persistent=persistent
    )
    try:
        return unpickler.load()
    # A stand-in refusing a change (HostilePickleError) is hostile whoever noticed it first.
    except (PickleFormatError, PickleBombError, RefusedGlobalError):
        raise
    # Untrusted bytes can make the unpickler raise almost anything (EOFError, KeyError on a
    # bad memo index, TypeError from a stand-in called wrongly, MemoryError...): all of them
    # mean "not readable", never a crash of the scan.
    except Exception as exc:
        raise PickleFormatError(
            f"is not a readable pickle ({type(exc).__name__}: {short_repr(str(exc))})"
        ) from None
