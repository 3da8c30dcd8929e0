"""Things made on first use, once: a draft model, the target's MTP heads."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Once(Generic[T]):
    """`make()` at the first call, its result at every later one; a failure is raised again at every later call,
    not tried again (a draft that did not load does not cost its load time again, run after run)."""

    def __init__(self, make: Callable[[], T]):
        self._make = make
        self.made: T | None = None
        self._failed: BaseException | None = None

    def __call__(self) -> T:
        if self._failed is not None:
            raise self._failed
        if self.made is None:
            try:
                self.made = self._make()
            except Exception as e:
                self._failed = e
                raise
        return self.made
