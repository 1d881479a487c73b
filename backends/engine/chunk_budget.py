"""A step's prompt tokens: a piece of a set time, so neither a newcomer nor a running sequence's next token waits for
a whole chunk.

A run cannot be interrupted: a request arriving while a 512-token chunk runs would wait for all of it before its own
prompt starts, and every sequence decoding beside it would wait as long for its next token (on this project's CPUs,
tens of milliseconds a token; one tenant's backlog of long prompts then holds every other tenant's answer behind
it). Each step of the batcher runs the decode rows and one piece of about `piece_s` of the prompt filling; the rest
of the prompt runs in the next steps, after the arrivals are admitted. A piece before a prompt's last computes no
logits, so it costs little more than its tokens (on the CPU a logits row of the real vocabulary costs more than a
hundred prompt tokens at small widths).

A run's fixed cost F and its cost a token c (growing with the token's position: attention reads its context) are
measured when the engine starts, by runs of a prompt piece into the scratch page; a piece takes n = (piece_s - F) / c
tokens, but never so few that F is more than a tenth of its time: where a run's fixed cost is large (a CPU reading
every expert's weights at the real width), pieces stay long.

A piece also gives way, for a few steps, to an answer as it begins (GiveWay): those steps then run only decode rows,
so the answer's Harmony header and first text come at decode speed. That waiting is drawn from a bank refilled at a
tenth of the clock's time and holding at most an answer's beginning (a few of the steps that waited, as long as the
last one took: on a CPU at the real width a piece takes several decode steps' time, so the answer would otherwise
wait for several pieces), so prompts lose at most a tenth of the engine's time to each bank, however many answers
begin.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FLOOR_TOKENS = 16  # a piece is never cut below this
OVERHEAD = 0.1  # a piece is never cut so short that a run's fixed cost exceeds this share of it
PROBE_TOKENS = (8, 64)  # the runs' sizes that calibrate measures
PROBE_RUNS = 3  # the fastest of these runs of each kind counts (the first may pay for allocations)
GIVE_WAY_SHARE = 0.1  # of the clock's time, the most that prompt pieces wait for lighter tenants' answers to begin
GIVE_WAY_BANK_S = 0.05  # the least of that waiting banked while nothing waits
GIVE_WAY_STEPS = 4  # the bank holds up to this many waiting steps' time, as long as the last one took (an answer's
# beginning: its Harmony header and first text)


class ChunkPieces:
    def __init__(self, piece_s: float) -> None:
        """`piece_s`: the time a piece should take (0: a chunk runs whole)."""
        self.piece_s = piece_s
        # (a run's fixed seconds, seconds a token at position 0, more seconds a token per position), once calibrated
        self.fit: tuple[float, float, float] | None = None

    def calibrate(self, run: Callable[[int, int], None], far: int) -> None:
        """Time `run(tokens, start)` (a prompt piece from position `start`, no logits) at two sizes from position 0 and
        from `far`: a run's fixed cost, a token's, and what a token's grows by with its position (attention)."""
        if not self.piece_s:
            return
        few, many = PROBE_TOKENS
        near_few, near_many, far_many = (self._fastest(run, tokens, start) for tokens, start in
                                         ((few, 0), (many, 0), (many, far)))  # fmt: skip
        per_token = (near_many - near_few) / (many - few)
        if per_token > 0:
            growth = max(0.0, far_many - near_many) / (many * far) if far else 0.0
            self.fit = (max(0.0, near_few - per_token * few), per_token, growth)

    @staticmethod
    def _fastest(run: Callable[[int, int], None], tokens: int, start: int) -> float:
        times = []
        for _ in range(PROBE_RUNS):
            started = time.perf_counter()
            run(tokens, start)
            times.append(time.perf_counter() - started)
        return min(times)

    def first(self, chunk: list[int], start: int) -> list[int]:
        """The piece of `chunk` (its first token at position `start`) that takes about `piece_s`, never so short that
        the run's fixed cost weighs; the whole chunk where pieces are off or uncalibrated."""
        if self.fit is None or not self.piece_s:
            return chunk
        fixed, per_token, growth = self.fit
        cost = per_token + growth * start
        tokens = int(max(FLOOR_TOKENS, (self.piece_s - fixed) / cost, fixed / (OVERHEAD * cost)))
        return chunk[:tokens]


class GiveWay:
    """The time prompt pieces may still wait for answers beginning: a bank refilled at `share` of the clock's time,
    up to `bank_s` or `steps` of the waiting steps, as long as the last one took, whichever is more; steps run
    without a piece draw their time from it, and with the bank empty the pieces run."""

    def __init__(
        self,
        share: float = GIVE_WAY_SHARE,
        bank_s: float = GIVE_WAY_BANK_S,
        steps: int = GIVE_WAY_STEPS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.share = share
        self.bank_s = bank_s
        self.steps = steps
        self._clock = clock
        self._left = bank_s
        self._step_s = 0.0  # the last waiting step's time
        self._at = clock()

    @property
    def cap_s(self) -> float:
        """The most the bank holds."""
        return max(self.bank_s, self.steps * self._step_s)

    def open(self) -> bool:
        """Whether a piece may wait this step."""
        now = self._clock()
        self._left = min(self.cap_s, self._left + (now - self._at) * self.share)
        self._at = now
        return self._left > 0

    def spend(self, seconds: float) -> None:
        """A step ran without its piece for `seconds`."""
        if not self._step_s:  # the first: the bank was full (nothing had waited), at a cap known only now
            self._left = max(self._left, self.steps * seconds)
        self._left -= seconds
        self._step_s = seconds
