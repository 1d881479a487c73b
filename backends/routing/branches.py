"""Where the prompts routed from a replica part ways: which of a prompt's leading pages other prompts took too.

A conversation's turns each extend the one before, so the pages of its history are followed, in what was routed,
by one next page. A prefix many sessions share (a tenant's long system prompt, an agent's instructions) is followed
by as many next pages as sessions started from it. The router asks how deep a prompt's shared part goes: a request
whose server holds no more of it than that part is a new session on a shared prefix, which may spread over the
servers (router.py), where a conversation's own history keeps it on its server.

Page names are those of backends/page_names.py in the tenant's namespace, so one tenant's prompts never branch off
another's. Bounded: the pages least recently routed are forgotten past `capacity`, and any unused for `ttl_s`.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass


@dataclass(slots=True)
class _Next:
    page: bytes | None  # the first next page routed after this one (None: a prompt ended here)
    parted: bool  # some prompt went on from here to another page
    used: float


class Branches:
    def __init__(self, capacity: int, ttl_s: float) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._next: collections.OrderedDict[bytes, _Next] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._next)

    def note(self, names: list[bytes]) -> None:
        """A prompt routed: each of its pages and the page after it."""
        now = time.monotonic()
        oldest = now - self.ttl_s
        for index, name in enumerate(names):
            following = names[index + 1] if index + 1 < len(names) else None
            known = self._next.get(name)
            if known is None or known.used < oldest:
                self._next[name] = _Next(following, False, now)
            else:
                if following is not None:
                    if known.page is None:
                        known.page = following
                    elif known.page != following:
                        known.parted = True
                known.used = now
            self._next.move_to_end(name)
        while len(self._next) > self.capacity:
            self._next.popitem(last=False)

    def shared_pages(self, names: list[bytes]) -> int:
        """How many leading pages of the prompt `names` end where other prompts routed from here went on to a page
        other than its next one (0: none): the depth of the deepest such parting along the pages known."""
        oldest = time.monotonic() - self.ttl_s
        depth = 0
        for index, name in enumerate(names[:-1]):
            known = self._next.get(name)
            if known is None or known.used < oldest:
                break
            following = names[index + 1]
            if known.parted or (known.page is not None and known.page != following):
                depth = index + 1
        return depth
