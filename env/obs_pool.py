"""Fresh observations without copying the whole padded observation every step: recycled buffers.

Every call of ``reset``/``step`` must return new memory (gymnasium's ``check_env`` asserts that no
two returned observations share memory, with ``np.shares_memory``, so read-only views of one
buffer fail it), but copying the 2.3 MB of a 2,000-node observation costs ~70 us a step, 4x the
step itself, while a step changes a few rows (the decided node, its neighbours, its edges).

``ObservationPool`` keeps a few buffers (*slots*). The env writes each step's changes into the
*current* slot and hands the caller read-only views of it (built on read-only memoryviews, so
``setflags(write=True)`` is refused; a caller that wants to modify an observation copies it). At
the next step the env switches to a slot the caller has dropped: one whose views no Python object
other than the pool refers to (``sys.getrefcount`` of the views and their bases; a kept
observation dict, a kept array, a view or slice of one, a memoryview or a ``torch.from_numpy``
alias all hold a reference, so a buffer the caller can still read is never rewritten; a reference
cycle only delays reuse). That slot is brought up to date by copying only the rows written since it
was last current (the env reports the node, action and edge rows it writes; the log keeps the last
``max_lag`` steps), in full otherwise. In a loop that keeps only the latest observation this
copies one step's rows (~10 rows of <= 1 KB, ~3 us a step with the bookkeeping on the 2,000-node
problem of experiments/bench_env.py); a caller that keeps the last k observations (a frame stack)
rotates k + 1 slots; one that keeps every observation gets a new slot and a full copy per step,
as ``{k: v.copy()}`` did, and the pool forgets the slots it cannot reuse (it tracks at most
``max_slots``).

Observations are therefore exactly the env's state at the step that returned them, and stay so
while the caller holds them; they differ from plain copies only in being read-only.
"""
from __future__ import annotations

import sys
from collections import deque

import numpy as np

ROW_KEYS = ("node_features", "action_features", "edge_features")   # rows change per step
WHOLE_KEYS = ("current_node", "action_mask")                         # tiny: copied whole (begin(whole=True))


def _refs(handles: tuple) -> int:
    """Total references to ``handles``; never below its value when only the pool holds them."""
    return sum(map(sys.getrefcount, handles))


def layout(template: dict) -> dict:
    """Byte offset of each array in a slot's buffer (64-byte aligned)."""
    offsets, size = {}, 0
    for k, v in template.items():
        offsets[k] = size
        size += -(-v.nbytes // 64) * 64
    offsets[None] = size
    return offsets


class _Slot:
    """One buffer: writable arrays in it (the env's), read-only views of them on a read-only
    memoryview (the caller's), and the total refcount of the views and their bases (numpy makes a
    view of a view refer to the first base that does not own its data) when only the pool holds them."""

    def __init__(self, template: dict, offsets: dict):
        buf = np.empty(offsets[None], np.uint8)
        self.arrays = {k: np.ndarray(v.shape, v.dtype, buffer=buf, offset=offsets[k]) for k, v in template.items()}
        self.bytes = memoryview(buf)   # for row copies
        self.mv = {k: memoryview(a) for k, a in self.arrays.items()}   # the env's scalar writes
        ro = np.frombuffer(memoryview(buf).toreadonly(), np.uint8)
        self.views = {k: ro[offsets[k]:offsets[k] + v.nbytes].view(v.dtype).reshape(v.shape) for k, v in template.items()}
        del ro
        # each view and its chain of bases: a view or slice of a view refers to one of them
        handles: dict[int, object] = {}
        for obj in self.views.values():
            while obj is not None and id(obj) not in handles:
                handles[id(obj)] = obj
                obj = obj.base if isinstance(obj, np.ndarray) else None
        self.handles = tuple(handles.values())
        del handles, obj
        self.idle_refs = _refs(self.handles)
        self.version = -1
        self.reuses = 0
        self.rows = None   # per ROW_KEYS array, a memoryview of each row (built once the slot is reused)

    def idle(self) -> bool:
        return _refs(self.handles) == self.idle_refs

    def row_views(self, geometry: tuple) -> tuple:
        """Row memoryviews: ``rows[a][r][:] = other.rows[a][r]`` copies a row in ~0.07 us against
        ~0.17 us when both slices are made per copy (~8k views, ~1.5 MB for 2,000 nodes)."""
        if self.rows is None:
            b = self.bytes
            self.rows = tuple([b[off + r * rb: off + (r + 1) * rb] for r in range(count)]
                              for _, off, rb, count in geometry)
        return self.rows


class ObservationPool:
    """Recycled observation buffers (see the module docstring). ``begin_episode()`` /
    ``begin()`` return the writable arrays the env updates for the coming reset / step (and
    memoryviews of them, for fast scalar writes);
    ``publish(rows)`` returns the caller's read-only observation, where ``rows`` = the sets of node
    rows, action rows and edge rows the env wrote since ``begin()``."""

    def __init__(self, template: dict, max_slots: int = 8, max_lag: int = 16):
        self.template, self.offsets = template, layout(template)
        # (key, byte offset, row bytes, rows) of the arrays whose rows are copied
        self.geometry = tuple((k, self.offsets[k], template[k].strides[0], len(template[k])) for k in ROW_KEYS)
        self.max_slots = max_slots
        self.slots: list[_Slot] = []   # least recently current first; the last is the current one
        self.log: deque = deque(maxlen=max_lag)   # rows written at each version (the latest last)
        self.version = 0
        self.episode_start = 0        # slots older than this need a full copy
        self.full_copies = self.partial_copies = 0

    def _free_slot(self) -> _Slot:
        slots = self.slots
        n = len(slots)
        # the least lag first: the previous slot (the caller holds the current one), the current, older
        for pos in (n - 2, n - 1, *range(n - 3, -1, -1)) if n > 1 else range(n):
            s = slots[pos]
            if s.idle():
                slots.append(slots.pop(pos))
                return s
        s = _Slot(self.template, self.offsets)
        slots.append(s)
        if len(slots) > self.max_slots:   # the caller keeps its observations: forget the oldest
            slots.pop(0)
        return s

    def begin_episode(self) -> tuple[dict, dict]:
        """A slot for ``reset``, which rewrites every array (nothing is copied into it)."""
        self.log.clear()
        self.episode_start = self.version + 1
        s = self._free_slot()
        return s.arrays, s.mv

    def begin(self, whole: bool = True) -> tuple[dict, dict]:
        """A slot holding the current state, for a step to update. ``whole=False``: the step
        rewrites ``current_node`` and ``action_mask`` entirely, so they are not copied."""
        slots = self.slots
        cur = slots[-1]
        if len(slots) > 1 and slots[-2].idle():   # the usual case: the caller holds the latest observation
            s = slots[-2]
            slots[-2], slots[-1] = cur, s
        else:
            s = self._free_slot()
            if s is cur:
                return s.arrays, s.mv
        lag = self.version - s.version
        if s.version < self.episode_start or lag > len(self.log):
            s.bytes[:] = cur.bytes
            self.full_copies += 1
        else:
            self._catch_up(s, cur, lag)
            if whole:
                for key in WHOLE_KEYS:
                    s.arrays[key][:] = cur.arrays[key]
        return s.arrays, s.mv

    def _catch_up(self, s: _Slot, cur: _Slot, lag: int) -> None:
        """Copy into slot ``s`` the rows written in the last ``lag`` steps, from ``cur``."""
        self.partial_copies += 1
        log = self.log
        if lag == 1:
            changed = log[-1]
        else:
            changed = (set(), set(), set())
            for back in range(1, lag + 1):
                for acc, rows in zip(changed, log[-back]):
                    acc |= rows
        if s.rows is None:
            s.reuses += 1
            if s.reuses > 1:   # in rotation: worth its row views
                s.row_views(self.geometry)
        views = s.rows is not None and cur.rows is not None
        d, a = s.bytes, cur.bytes
        for (key, off, rb, _), rows, d_rows, a_rows in zip(self.geometry, changed, s.rows or ROW_KEYS, cur.rows or ROW_KEYS):
            if len(rows) > 32:   # fancy indexing: ~2 us and up
                idx = np.fromiter(rows, np.int64, len(rows))
                s.arrays[key][idx] = cur.arrays[key][idx]
            elif views:
                for r in rows:
                    d_rows[r][:] = a_rows[r]
            else:
                for r in rows:
                    o = off + r * rb
                    d[o:o + rb] = a[o:o + rb]

    def __getstate__(self):   # slots hold memoryviews: a copy starts without them (see adopt)
        return dict(self.__dict__, slots=[], log=deque(maxlen=self.log.maxlen))

    def adopt(self, arrays: dict) -> tuple[dict, dict]:
        """A pickled or copied pool's first slot: a copy of the env's ``arrays`` as the current state
        (returns its arrays and memoryviews, as ``begin``)."""
        s = self._free_slot()
        for k, a in arrays.items():
            s.arrays[k][...] = a
        self.episode_start = s.version = self.version
        return s.arrays, s.mv

    def publish(self, rows: tuple) -> dict:
        """The caller's observation of the current slot (a new dict of read-only arrays)."""
        self.version += 1
        self.log.append(rows)
        cur = self.slots[-1]
        cur.version = self.version
        return dict(cur.views)
