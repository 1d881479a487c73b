"""`stop` sequences on the answer text: cut at the first match, holding back what may be the start of one."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self._stops = stops
        self._hold = max((len(stop) for stop in stops), default=1) - 1
        self._buffer = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of the text that can be shown now."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        self._buffer += text
        cuts = [index for index in (self._buffer.find(stop) for stop in self._stops) if index >= 0]
        if cuts:
            shown = self._buffer[: min(cuts)]
            self._buffer = ""
            self.stopped = True
            return shown
        safe = max(len(self._buffer) - self._hold, 0)
        shown, self._buffer = self._buffer[:safe], self._buffer[safe:]
        return shown

    def flush(self) -> str:
        """The held-back tail, once the message has ended without a stop."""
        shown, self._buffer = self._buffer, ""
        return "" if self.stopped else shown
