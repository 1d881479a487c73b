"""Continuous batching on one engine thread, over the paged KV pools (page_pool.py).

A sequence is admitted when the pools can give it the pages of its whole prompt (beyond what the prefix cache already
holds for it: prefix_cache.py, what the prompts admitted before it still need and what the running answers' next tokens
take) and the window pages of its first chunk, the tenant furthest behind its fair share first (fair_share.py: a tenant
below its share of a full batch takes a slot from the one most above its own), in arrival order within a tenant; it
starts from the longest prefix of its prompt that pages already hold in its namespace, by reference, and before each
piece of its prompt takes those that other prompts on its prefix named meanwhile (`_join`). Each step runs
every decoding sequence's next token and one chunk of the prompt of the prefilling sequence whose tenant is furthest
behind (of that tenant's, the one with the least left to fill: a short turn of a conversation whose prefix the cache
holds is not held behind another prompt's whole fill, and a long prompt is overtaken for at most about its own length),
together (with CUDA graphs: the chunk first, then the decode rows as the graph of their bucket); the chunk runs a piece
of a set time a step (chunk_budget.py), and a prompt of a worse service tier than an answer in its first FIRST_TOKENS
(the Harmony header and its first text) waits for those steps, as does a worse tier's answer's next token, so that a
better tier's answer begins without a worse tier's pieces, or rows, in its steps (on a CPU each row costs its logits
over the whole vocabulary); within a tier, a prompt gives way likewise to the beginning answer of a tenant running fewer
sequences, for at most a tenth of the engine's time (chunk_budget.GiveWay), and to one of its own tenant or of one
running as many, for at most another tenth (a conversation's short turn, its prompt held by the prefix cache, then
begins at decode speed beside a new conversation's long prompt). Only a prompt's last piece has its logits computed; the
step's next tokens are chosen together, by the SampleTokens kernels on the runtime's device where they are loaded. When
a running sequence needs a page and none is left, the latest admitted sequence of the tenant furthest ahead of its share
is preempted: its pages go back (the prefix cache keeps naming the full ones) and it waits at the head of its tenant's
queue to be run again from what it had written, its answer continuing where it stopped. A finished or cancelled sequence
gives its pages back at once."""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import structlog

from backends.base import TIER_RANK, Chunk, EngineStats, GenerateRequest, ServerLoad, TenantQueue, TokenLogprob
from backends.page_names import LazyChain
from harmony.tokens import FIRST_SPECIAL

from .chunk_budget import ChunkPieces, GiveWay
from .fair_share import FairShare
from .grammar import TokenGuide
from .page_events import PageEvents
from .page_pool import SCRATCH, KvPools, PageTable
from .prefix_cache import Block, PrefixCache, Tail, Written
from .runtime import DecoderRuntime, StepRows
from .sampler import RowSpec, sampling_rows

log = structlog.get_logger("backends.engine")
QUEUES_EVERY_S = 0.25  # how often the tenants' queue figures are published for the metrics

Emit = Callable[[Chunk | BaseException | None], None]  # a token (and its logprob), a failure, or None at the end

FIRST_TOKENS = 4  # an answer's first: `<|channel|>analysis<|message|>` and its first text token


@dataclass(eq=False)
class Sequence:
    request: GenerateRequest
    emit: Emit
    rng: np.random.Generator
    namespace: bytes = b""  # the prefix cache's: only pages written in the same namespace are reused
    reused: int = 0  # prompt tokens taken from the prefix cache (set before the first token is emitted)
    placed: bool = False  # admitted once (a preempted sequence is admitted again)
    # filling its prompt: the prefix cache's findable_added when it was first admitted or last ran a piece (_join)
    joinable: int | None = None
    placed_ns: int = 0  # when it was first admitted (time.time_ns), for its trace
    admitted: int = 0  # admission order: the latest is preempted first
    fill: list[int] = field(default_factory=list)  # tokens to run before decoding: the prompt, or all it wrote
    resumed: bool = False  # run again after a preemption: its next token is chosen already
    # fill tokens run for other prompts of its tenant and tier while its own waited to fill (see `precedence`)
    overtaken: int = 0
    expected_reuse: int = 0  # waiting: its fill tokens the prefix cache held when it was queued (an estimate)
    fill_names: LazyChain | None = None  # its fill's page names as the prefix cache's lookups read them (`_lookup`)
    table: PageTable = field(default_factory=PageTable)
    written: Written = field(default_factory=Written)
    decoding: bool = False  # the fill is all in; each step feeds `token`
    generated: int = 0
    token: int = 0  # the last sampled token, fed at the next decode step
    guide: TokenGuide | None = None  # the output constraint's grammar, when the request has one
    counts: dict[int, int] = field(default_factory=dict)  # text tokens generated so far (for the penalties)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: int = 0  # arrival order within the fair share's queues
    queued_ns: int = field(default_factory=time.time_ns)  # when it was submitted (its wait ends at admission)

    @property
    def tenant(self) -> str:
        return self.request.tenant

    @property
    def weight(self) -> float:
        return self.request.weight

    @property
    def rank(self) -> int:
        return TIER_RANK[self.request.tier]

    @property
    def position(self) -> int:
        """Positions whose KV is written."""
        return len(self.written.tokens)

    @property
    def precedence(self) -> int:
        """Its place among its tenant's prompts filling, lowest first: the fill tokens it has left, less those run
        for the others while it waited. A short prompt goes before a long one (its first token waits for no long
        prompt's whole fill), and a long one is overtaken for at most about its own length."""
        return len(self.fill) - self.position - self.overtaken

    @property
    def beginning(self) -> bool:
        """Its answer is in its first FIRST_TOKENS (the Harmony header and its first text)."""
        return self.generated < FIRST_TOKENS


class Batcher:
    def __init__(
        self,
        runtime: DecoderRuntime,
        pools: KvPools,
        max_batch: int,
        prefill_chunk: int = 512,
        prefix_budget: int = 0,
        page_events: PageEvents | None = None,
        piece_s: float = 0.0,
        thread: bool = True,
    ) -> None:
        """`max_batch`: sequences running at once; `prefix_budget`: tokens of pages no sequence holds that the
        prefix cache may keep (0: no reuse); `page_events`: where the prefix cache reports the pages it names;
        `piece_s`: the time of the prompt piece a step runs beside the decode rows (chunk_budget.py); `thread`: False
        runs no engine thread, the caller runs each iteration (`serve_once`: a schedule replayed step by step)."""
        self.runtime = runtime
        self.pools = pools
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self._pieces = ChunkPieces(piece_s)
        self._give_way = GiveWay()  # for answers of lighter tenants beginning
        self._give_way_alike = GiveWay()  # for those of the prompt's own tenant, or of one running as many
        self.prefix = PrefixCache(pools, prefix_budget, events=page_events)
        self._prefix_stats = self.prefix.stats()
        self._pool_stats = (pools.full.stats(), pools.window.stats())
        self._incoming: queue.Queue[Sequence | None] = queue.Queue()
        self._waiting = FairShare()  # taken from the queue, or preempted: by tenant
        self._closed = False  # close() was called and everything in flight failed
        self._failure: BaseException | None = None  # the engine thread stopped on an error (_loop)
        self._running: list[Sequence] = []  # in admission order
        self._order = itertools.count()
        self._kv_tokens = 0  # positions written by running sequences, as of the last step
        # prompt tokens running and waiting sequences have left to run, and how many have some, as of the last step
        self._filling = (0, 0)
        self._submitted = (0, 0)  # prompt tokens submitted and not yet taken by the engine thread, and their prompts
        self._submitted_lock = threading.Lock()
        self._decode_steps = 0
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._preemptions = 0
        self._admitted: dict[tuple[str, str], tuple[int, float]] = {}  # (tenant, tier) → (admitted, waited s)
        self._queues: dict[tuple[str, str], TenantQueue] = {}  # as of the last publication
        self._queues_at = 0.0
        self.host_costs = runtime.costs.copy()  # as of the last iteration that ran a step (host_costs.py)
        self._thread = threading.Thread(target=self._loop, name="gpt-oss-engine", daemon=True)
        if thread:
            self._thread.start()

    @property
    def active(self) -> int:
        return len(self._running)

    def stats(self) -> EngineStats:
        """Read from other threads: each figure is one the engine thread last wrote."""
        prefix = self._prefix_stats
        full, window = self._pool_stats
        load = self.load()
        return EngineStats(
            running=load.running,
            waiting=load.waiting,
            max_batch=self.max_batch,
            kv_tokens=self._kv_tokens,
            kv_capacity_tokens=full.pages * self.pools.page_size,
            decode_steps=self._decode_steps,
            prefill_tokens=self._prefill_tokens,
            decode_tokens=self._decode_tokens,
            prefix_lookup_tokens=prefix.lookup_tokens,
            prefix_hit_tokens=prefix.hit_tokens,
            prefix_blocks=prefix.blocks,
            prefix_evicted_blocks=prefix.evicted_blocks,
            kv_pages={"full": full, "window": window},
            preemptions=self._preemptions,
            queues=self._queues,
        )

    def load(self) -> ServerLoad:
        """Sequences running and waiting (submitted, not yet running), the prompt tokens they have left to run (a
        waiting one's less what the prefix cache held of it when it was queued; one not yet taken by the engine
        thread counts whole) and how many have some left; read from other threads."""
        filling, prompts = self._filling
        submitted, arrivals = self._submitted
        return ServerLoad(len(self._running), arrivals + len(self._waiting), filling + submitted, prompts + arrivals)

    @property
    def failure(self) -> BaseException | None:
        """Why the engine thread stopped on its own, if it did."""
        return self._failure

    def submit(self, sequence: Sequence) -> None:
        with self._submitted_lock:
            tokens, prompts = self._submitted
            self._submitted = (tokens + len(sequence.request.prompt), prompts + 1)
        self._incoming.put(sequence)
        if self._failure is not None:  # no thread takes it any more
            self._fail_incoming()

    def close(self) -> None:
        self._incoming.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        try:
            self._serve()
        except Exception:  # a bug must not leave requests waiting on a thread that is gone
            log.exception("engine_loop_failed")
            self._failure = RuntimeError("the engine stopped on an internal error")
            # the bookkeeping is not trusted any more: each request is told, no page is given back
            for sequence in [*self._running, *self._waiting]:
                sequence.emit(self._failure)
            self._fail_incoming()

    def _fail_incoming(self) -> None:
        """Fail what was submitted and not yet taken (called by whichever thread finds the engine stopped)."""
        while True:
            try:
                arrival = self._incoming.get_nowait()
            except queue.Empty:
                return
            if arrival is not None:
                arrival.emit(self._failure)

    def _serve(self) -> None:
        try:
            self._pieces.calibrate(self._probe, self.runtime.max_positions // 2)
            log.info("engine_prompt_pieces", fit=self._pieces.fit, piece_s=self._pieces.piece_s)
        except Exception:
            log.exception("engine_prompt_pieces_uncalibrated")  # chunks then run whole
        while self.serve_once():
            pass

    def serve_once(self) -> bool:
        """One iteration: admit what can run (waiting for work while idle), run a step; False once closed."""
        idle = not self._running and not self._waiting
        began = time.perf_counter()
        if not self._admit():
            return False
        self._count_filling()  # the arrivals just taken: no longer counted as submitted
        if idle:  # admission waited for work: the iteration's host time starts with it
            began = time.perf_counter()
        for sequence in [s for s in self._running if s.cancelled.is_set()]:
            self._release(sequence)
        stepped = bool(self._running)
        if stepped:
            self._step()
        self._kv_tokens = sum(sequence.position for sequence in self._running)
        self._count_filling()
        self._prefix_stats = self.prefix.stats()
        self._pool_stats = (self.pools.full.stats(), self.pools.window.stats())
        if stepped:
            costs = self.runtime.costs
            costs.loops += 1
            costs.loop_s += time.perf_counter() - began
            self.host_costs = costs.copy()  # for other threads: whole iterations only
        if not self._running or time.monotonic() - self._queues_at > QUEUES_EVERY_S:
            self._publish_queues()
        return True

    def _count_filling(self) -> None:
        """The prompt tokens left to run (a waiting sequence's less what the cache held when it was queued), and
        the sequences with some left."""
        left = [len(s.fill) - s.position for s in self._running if not s.decoding]
        left += [len(s.fill) - s.expected_reuse for s in self._waiting]
        left = [tokens for tokens in left if tokens > 0]
        self._filling = (sum(left), len(left))

    def _expect(self, sequence: Sequence) -> None:
        """Queued: what of its fill the prefix cache holds now (reused when it is placed, unless evicted first)."""
        sequence.fill_names = self.prefix.page_names(sequence.namespace, sequence.fill)  # a new fill: named anew
        sequence.expected_reuse = self._lookup(sequence)[2]

    def _lookup(self, sequence: Sequence) -> tuple[list[Block], Tail | None, int]:
        """The prefix cache's lookup of the sequence's fill, its page names hashed once for all its lookups."""
        return self.prefix.lookup(sequence.namespace, sequence.fill, sequence.fill_names)

    def _probe(self, tokens: int, start: int) -> None:
        """A run of `tokens` prompt tokens from `start` into the scratch page, no logits (ChunkPieces.calibrate)."""
        start = max(0, min(start, self.runtime.max_positions - tokens))
        pages = -(-(start + tokens) // self.pools.page_size)
        step = StepRows()
        step.add([0] * tokens, start, PageTable([SCRATCH] * pages, [SCRATCH] * pages), logits=False)
        self.runtime.run(step)

    def _publish_queues(self) -> None:
        """Each tenant's and tier's sequences, for the engine's metrics (read by other threads: a new dict)."""
        counts: dict[tuple[str, str], list[int]] = {}
        weights: dict[str, float] = {}
        for index, sequences in enumerate((self._running, self._waiting)):
            for sequence in sequences:
                counts.setdefault((sequence.tenant, sequence.request.tier), [0, 0])[index] += 1
                weights[sequence.tenant] = sequence.weight
        for key in self._admitted:
            counts.setdefault(key, [0, 0])
        self._queues = {
            key: TenantQueue(running, waiting, *self._admitted.get(key, (0, 0.0)), weights.get(key[0], 1.0))
            for key, (running, waiting) in counts.items()
        }
        self._queues_at = time.monotonic()

    # admission

    def _take_arrivals(self) -> bool:
        """Queue what has arrived (waiting for something while the engine is idle); False once closed."""
        while not self._closed:
            idle = not self._running and not self._waiting
            try:
                arrival = self._incoming.get(block=idle)
            except queue.Empty:
                return True
            if arrival is None:
                self._closed = True
                self._fail_all(RuntimeError("the engine stopped"))
                break
            with self._submitted_lock:
                tokens, prompts = self._submitted
                self._submitted = (tokens - len(arrival.request.prompt), prompts - 1)
            arrival.fill = list(arrival.request.prompt)
            self._expect(arrival)
            self._waiting.push(arrival, self._running)
        return False

    def _admit(self) -> bool:
        """Admit waiting sequences, the tenant furthest behind its share first, while pages and batch room last
        (blocking while idle); False once closed."""
        if not self._take_arrivals():
            return False
        while (sequence := self._waiting.head()) is not None:
            if sequence.cancelled.is_set():
                self._waiting.pop(sequence)
                continue
            if len(self._running) >= self.max_batch:
                claim = self._waiting.claim(self._running, self.max_batch)
                if claim is None:
                    return True
                sequence, victim = claim
                if sequence.cancelled.is_set():
                    self._waiting.pop(sequence)
                    continue
                self._preempt(victim)  # a tenant above its share of the batch makes room for one below
            if not self._place(sequence):
                if self._running:
                    return True  # pages come back as the running sequences finish
                self._waiting.pop(sequence)  # empty pools cannot hold it: it would wait forever
                self._finish(sequence, RuntimeError("the prompt needs more KV pages than the engine's pools hold"))
                continue
            self._waiting.pop(sequence)
        return True

    def _place(self, sequence: Sequence) -> bool:
        """Hold the pages of the longest kept prefix of the sequence's fill and start it after them, if the pools
        can also give it its whole fill's pages; False (nothing held) if they cannot yet."""
        fill, pools = sequence.fill, self.pools
        blocks, tail, reused = self._lookup(sequence)
        kept = len(blocks) * pools.page_size
        probe = PageTable(
            [block.full for block in blocks],
            [block.window if index >= pools.first_window_page(reused) else 0 for index, block in enumerate(blocks)],
        )
        full, _ = pools.needed(probe, kept, len(fill))
        _, window = pools.needed(probe, reused, min(len(fill), reused + self.prefill_chunk))
        taken_full, taken_window = self._cached_of(blocks, reused)
        promised = sum(  # the rest of the fills already admitted
            pools.needed(s.table, s.position, len(s.fill))[0] for s in self._running if not s.decoding
        )
        # and the pages the running answers' next tokens take: placed in them, a sequence would be preempted for
        # them at once and placed again from the pages the cache kept, and two sequences could trade places so at
        # every step, neither writing a token
        next_full, next_window = self._next_pages()
        if not pools.fits((full + taken_full + promised + next_full, window + taken_window + next_window)):
            return False
        self._hold(sequence, blocks, tail, reused)
        if not sequence.placed:
            sequence.placed, sequence.reused, sequence.placed_ns = True, reused, time.time_ns()
            sequence.joinable = self.prefix.findable_added
            self.prefix.count(len(fill), reused)
            key = (sequence.tenant, sequence.request.tier)
            admitted, waited = self._admitted.get(key, (0, 0.0))
            self._admitted[key] = (admitted + 1, waited + (sequence.placed_ns - sequence.queued_ns) / 1e9)
        sequence.admitted = next(self._order)
        sequence.decoding = False
        self._running.append(sequence)
        return True

    def _next_pages(self) -> tuple[int, int]:
        """(full, window) pages the decoding sequences' next tokens need."""
        needs = [self.pools.needed(s.table, s.position, s.position + 1) for s in self._running if s.decoding]
        return sum(full for full, _ in needs), sum(window for _, window in needs)

    def _hold(self, sequence: Sequence, blocks: list[Block], tail: Tail | None, reused: int) -> None:
        """Hold the kept prefix's pages (and a copy of the tail's shared positions) for the sequence."""
        self.prefix.take(blocks, reused, sequence.table, sequence.written, sequence.fill)
        if tail is not None:  # one new page pair after the kept ones (no window page before the first one read)
            table = sequence.table
            table.full.append(self.pools.full.allocate())
            table.window.append(self.pools.window.allocate())
            copied = reused - len(blocks) * self.pools.page_size
            self.runtime.copy_page("full", tail.full, table.full[-1], copied)
            self.runtime.copy_page("window", tail.window, table.window[-1], copied)
            sequence.written.tokens.extend(tail.tokens[:copied])

    def _cached_of(self, blocks: list[Block], reused: int) -> tuple[int, int]:
        """(full, window) pages of `blocks` that a sequence starting at `reused` holds and that are cached now: held,
        they stop being available."""
        pools = self.pools
        first = pools.first_window_page(reused)
        full = sum(pools.full.cached(block.full) for block in blocks)
        return full, sum(pools.window.cached(block.window) for block in blocks[first:])

    def _join(self, sequence: Sequence) -> None:
        """A prompt about to run its next piece takes the pages of its prefix named since it was admitted or ran its
        last piece: prompts that arrive together sharing a new prefix (a tenant's users on a new system prompt)
        prefill it once, the earliest admitted first, the others from its pages; and a prompt overtaken halfway by
        another on the same prefix (a better tier's, or one with less left to fill) goes on from where that one
        got, not from where it stopped (a prefix sent ahead to warm this server, overtaken by a request on it).
        What it held so far is a prefix of what it now takes, so its fill needs fewer pages; it joins only if the
        pools can give what the join takes now."""
        added_since = self.prefix.findable_added != sequence.joinable
        sequence.joinable = None
        if not added_since:  # nothing made findable since: a lookup would find what it holds
            return
        names, page = sequence.fill_names, sequence.position // self.pools.page_size
        if sequence.position > sequence.reused and names is not None and not self.prefix.holds_page(names, page):
            return  # halfway through its fill, it gains only where another named the page its next piece writes:
            # a lookup would walk every page it holds, at each step in which an answer filled a page
        blocks, tail, reused = self._lookup(sequence)
        gained = reused - sequence.position
        if gained <= 0:
            return
        full, window = self._cached_of(blocks, reused)
        copy = int(tail is not None)  # the tail's copy takes a new page pair
        if not self.pools.fits((full + copy, window + copy)):  # what it gives back first is not counted
            return
        self._give_back(sequence)
        sequence.written = Written()
        self._hold(sequence, blocks, tail, reused)
        sequence.reused += gained
        self.prefix.count(0, gained)

    def _make_room(self, sequence: Sequence, needs: tuple[int, int]) -> bool:
        """Preempt sequences until `needs` fit, the latest admitted of the tenant furthest ahead of its share
        first; False if `sequence` itself was, or (alone, the pools cannot hold it) it failed."""
        while not self.pools.fits(needs):
            victim = self._waiting.victim(self._running)
            if victim is sequence and len(self._running) == 1:  # alone, it would be preempted and placed forever
                self._finish(sequence, RuntimeError("the sequence needs more KV pages than the engine's pools hold"))
                return False
            self._preempt(victim)
            if victim is sequence:
                return False
        return True

    def _preempt(self, sequence: Sequence) -> None:
        """Give the sequence's pages back and queue it first, to run again from what it wrote."""
        self._preemptions += 1
        log.info("engine_preempted", written=sequence.position, generated=sequence.generated)
        sequence.resumed = sequence.generated > 0
        sequence.joinable = None
        if sequence.decoding:  # it runs again what it wrote; a fill cut short is run again whole
            sequence.fill = list(sequence.written.tokens)
        self._give_back(sequence)
        sequence.written = Written()
        self._expect(sequence)
        self._running.remove(sequence)
        self._waiting.push(sequence, self._running, again=True)

    # steps

    def _step(self) -> None:
        pools = self.pools
        decoding: list[Sequence] = []
        runnable = [s for s in self._running if s.decoding]
        beginning = min((s.rank for s in runnable if s.beginning), default=None)
        for sequence in runnable:
            if sequence not in self._running:  # preempted to make room for an earlier one
                continue
            if beginning is not None and sequence.rank > beginning:
                continue  # a worse tier's answer waits while a better tier's begins: those steps run without its row
            position = sequence.position
            if not self._make_room(sequence, pools.needed(sequence.table, position, position + 1)):
                continue
            pools.extend(sequence.table, position, position + 1)
            decoding.append(sequence)
        decoding = [s for s in decoding if s in self._running]  # a later row's room may have preempted an earlier
        filling = self._waiting.first([s for s in self._running if not s.decoding])  # the tenant furthest behind
        if filling is not None and any(s.rank < filling.rank and s.beginning for s in decoding):
            filling = None  # a worse tier's prompt waits while a better tier's answer begins
        bank = self._give_way_bank(filling, decoding) if filling is not None else None
        held = bank is not None and bank.open()
        if held:
            filling = None
        if filling is not None and filling.joinable is not None:
            self._join(filling)
        started = time.perf_counter() if held else 0.0
        piece: list[int] = []
        if filling is not None:
            start = filling.position
            end = min(len(filling.fill), start + self.prefill_chunk)
            limit = self.runtime.chunk_limit(end)
            end = end if limit is None else min(end, start + limit)
            piece = self._pieces.first(filling.fill[start:end], start)
            needs = pools.needed(filling.table, start, start + len(piece))
            if pools.fits(needs) or (not decoding and self._make_room(filling, needs)):
                pools.extend(filling.table, start, start + len(piece))
            else:
                piece = []
        # a prompt's last piece runs alone first: its first token waits for no decode row; and with CUDA graphs, the
        # decode rows run padded as the graph of their bucket, the piece always alone
        last = bool(piece) and filling is not None and filling.position + len(piece) == len(filling.fill)
        if last and not filling.resumed:  # its answer begins with this piece: a worse tier's rows wait from here
            decoding = [s for s in decoding if s.rank <= filling.rank]
        if piece and decoding and (last or self.runtime.buckets):
            self._run([], filling, piece)
            self._run(decoding, None, [])
        elif decoding or piece:
            self._run(decoding, filling if piece else None, piece)
        if piece and filling is not None and not filling.decoding and not filling.generated:
            filling.joinable = self.prefix.findable_added  # its own pages named: what others name from here
        if held and bank is not None:
            bank.spend(time.perf_counter() - started)

    def _give_way_bank(self, filling: Sequence, decoding: list[Sequence]) -> GiveWay | None:
        """The bank the prompt filling would wait from this step for an answer beginning of its tier (None: no such
        answer): a lighter tenant's (running fewer sequences than the prompt's) draws from the lighter tenants' bank,
        one of its own tenant or of one running as many from the other, so that a tenant's own answers beginning
        never spend what a lighter tenant's need, unless the prompt ends with its next piece; a heavier tenant's
        answer waits for no prompt of a lighter one."""
        beginning = {s.tenant for s in decoding if s.beginning and s.rank == filling.rank}
        if not beginning:
            return None
        counts = collections.Counter(s.tenant for s in self._running)
        own = counts[filling.tenant]
        if any(counts[tenant] < own for tenant in beginning):
            return self._give_way
        if any(counts[tenant] == own for tenant in beginning) and not self._ends_in_a_piece(filling):
            return self._give_way_alike
        return None

    def _ends_in_a_piece(self, filling: Sequence) -> bool:
        """Whether the prompt's fill ends with its next piece: its own answer then begins right after, and an
        alike answer beginning waits for that piece alone (three requests on one prompt start together)."""
        start = filling.position
        return (
            len(self._pieces.first(filling.fill[start : start + self.prefill_chunk], start))
            >= len(filling.fill) - start
        )

    def _run(self, decoding: list[Sequence], filling: Sequence | None, chunk: list[int]) -> None:
        step = StepRows()
        for sequence in decoding:
            step.add([sequence.token], sequence.position, sequence.table)
        if chunk:
            assert filling is not None
            last = filling.position + len(chunk) == len(filling.fill) and not filling.resumed
            step.add(chunk, filling.position, filling.table, logits=last)  # a next token is chosen after the last
        try:
            self.runtime.run(step)
        except Exception as exc:
            log.exception("engine_step_failed")
            for sequence in [*decoding, *([filling] if chunk else [])]:
                self.prefix.forget(sequence.table)
                self._finish(sequence, exc)
            return
        if decoding:
            self._decode_steps += 1
            self._decode_tokens += len(decoding)
        for sequence in decoding:
            self._written(sequence, [sequence.token])
            self._waiting.charge(sequence, 1)
        sampled = list(decoding)
        if chunk:
            assert filling is not None
            self._written(filling, chunk)
            self._waiting.charge(filling, len(chunk))
            for other in self._running:  # the tenant's other prompts waited for this piece
                peer = (other.tenant, other.rank) == (filling.tenant, filling.rank)
                if peer and not other.decoding and other is not filling:
                    other.overtaken += len(chunk)
            self._prefill_tokens += len(chunk)
            if filling.position == len(filling.fill):
                filling.decoding = True
                if not filling.resumed:
                    sampled.append(filling)
                filling.resumed = False
        if sampled:
            self._sample(sampled, {id(s): index for index, s in enumerate([*decoding, *([filling] if chunk else [])])})

    def _written(self, sequence: Sequence, tokens: list[int]) -> None:
        """`tokens` are in the sequence's pages: name the full ones, give back the window pages left behind."""
        self.prefix.extend(sequence.namespace, sequence.table, sequence.written, tokens)
        self.pools.trim(sequence.table, sequence.position, self.prefix.named_window)

    def _sample(self, sequences: list[Sequence], rows: dict[int, int]) -> None:
        """Choose each sequence's next token from its logits row, all in one call, and take them."""
        specs = [
            RowSpec(
                rows[id(s)],
                s.request.sampling,
                s.rng,
                None if s.guide is None else s.guide.allowed(),
                s.counts,
                s.request.top_logprobs,
            )
            for s in sequences
        ]
        try:
            sampled = self.runtime.sample(sampling_rows(specs, self.runtime.config.vocab_size))
        except Exception as exc:
            log.exception("engine_sampling_failed")
            for sequence in sequences:
                self._finish(sequence, exc)
            return
        for index, sequence in enumerate(sequences):
            self._take(sequence, int(sampled.tokens[index]), sampled.entry(index, sequence.request.top_logprobs))

    def _take(self, sequence: Sequence, token: int, logprob: TokenLogprob | None) -> None:
        request = sequence.request
        if token < 0:
            self._finish(sequence, RuntimeError("the output constraint allows no token here"))
            return
        if sequence.guide is not None:
            try:
                sequence.guide.accept(token)
            except RuntimeError as exc:
                self._finish(sequence, exc)
                return
        sequence.token = token
        sequence.generated += 1
        sampling = request.sampling
        if token < FIRST_SPECIAL and (sampling.presence_penalty or sampling.frequency_penalty):
            sequence.counts[token] = sequence.counts.get(token, 0) + 1  # counted only where it is used
        sequence.emit(Chunk([token], logprobs=None if logprob is None else [logprob]))
        done = (
            token in request.stop_ids
            or sequence.generated >= request.max_new_tokens
            or sequence.position + 1 >= self.runtime.max_positions
        )
        if done:
            self._finish(sequence, None)

    def _finish(self, sequence: Sequence, failure: BaseException | None) -> None:
        sequence.emit(failure)
        self._release(sequence)

    def _release(self, sequence: Sequence) -> None:
        if sequence in self._running:
            self._running.remove(sequence)
            self.prefix.keep_tail(sequence.namespace, sequence.table, sequence.written)
            self._give_back(sequence)
            self.prefix.fit_budget()

    def _give_back(self, sequence: Sequence) -> None:
        self.pools.release(sequence.table, self.prefix.named_full, self.prefix.named_window)

    def _fail_all(self, failure: BaseException) -> None:
        for sequence in [*self._running, *self._waiting]:
            self._finish(sequence, failure)
        self._waiting.clear()
