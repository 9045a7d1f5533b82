"""Collectives in compiled HLO text (``compiled.as_text()``): kind, count, bytes per device.

``parse_collectives(text)`` reads every all-reduce, all-gather, reduce-scatter, all-to-all and
collective-permute (synchronous, or the ``-start`` half of an async pair; ``-done`` is skipped) and
returns one :class:`Collective` per instruction, each counted as often as its computation runs
(a while loop with a ``known_trip_count`` multiplies its body's collectives; an unknown trip count
counts once). ``summarize`` aggregates them per kind; ``mesh_axes`` names the mesh axes one runs over
(from its replica group, ``replica_groups``, or its moving ``permute_pairs``).

Per instruction, with n = the replica-group size and all sizes per device (the SPMD program is the
per-device program):

* ``bytes``: the buffer the collective works on on one device: all-reduce operand, all-gather
  result (the gathered tensor), reduce-scatter operand (the unscattered tensor), all-to-all operand,
  collective-permute operand. Tuple-shaped (combined) collectives sum their elements.
* ``wire_bytes``: what one device sends under ring algorithms: all-reduce 2(n-1)/n x bytes,
  all-gather / reduce-scatter / all-to-all (n-1)/n x bytes, collective-permute bytes x the fraction
  of source->target pairs that move (a pair {i,i} moves nothing).

The text format varies: operands may print without shapes (``all-reduce(%fusion.3)``), so shapes
are looked up by instruction name; replica groups print as ``{{0,1},{2,3}}``, as the iota form
``[4,2]<=[2,4]T(1,0)`` ([groups, group size]) or as Shardy's ``mesh['a'=2,'b'=4] {'b'}`` (group size
= the product of the named axes; a sub-axis ``'b':(2)2`` counts its own size, the last number).
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
    "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "token": 0,
}

# `%name = SHAPE opcode(` ; SHAPE is an array shape or a (possibly nested) tuple of them.
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\dm\d\w*)?)\[([\d,\s]*)\]")
_COMP_HEAD = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?\s*->.*\{\s*$")
_CALLS = re.compile(r"\b(?:body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_COMMENT = re.compile(r"/\*.*?\*/")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')


@dataclass(frozen=True)
class Collective:
    """One collective instruction of the compiled program (sizes per device, see module doc)."""

    kind: str
    name: str
    bytes: float
    wire_bytes: float
    group_size: int
    count: int = 1
    computation: str = ""
    op_name: str = ""
    shape: str = ""
    group: tuple = ()
    pairs: tuple = ()

    def to_dict(self) -> dict:
        return asdict(self)


def shape_bytes(shape: str) -> float:
    """Bytes of an HLO shape string, e.g. ``f32[8,16]{1,0}`` -> 512; tuples sum their elements."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"unknown HLO element type {dtype!r} in shape {shape!r}")
        dims = [int(d) for d in dims.replace(" ", "").split(",") if d]
        total += _DTYPE_BYTES[dtype] * float(np.prod(dims, dtype=np.float64))
    return total


def _split_top(s: str) -> list[str]:
    """Split on commas at bracket depth 0."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def _operands_and_attrs(rest: str) -> tuple[str, str]:
    """``rest`` is what follows ``opcode(``: return (operand text, attribute text)."""
    depth = 1
    for i, ch in enumerate(rest):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return rest[:i], rest[i + 1:]
    return rest, ""


def group_size(attrs: str, num_devices: int | None = None) -> int:
    """Replica-group size from an instruction's attribute text (see module doc for the forms)."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", attrs)
    if m:
        sizes = {a: int(n) for a, n in re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))}
        g = 1
        for item in _split_top(m.group(2)):
            item = item.strip()
            if not item:
                continue
            name = re.match(r"'([^']+)'", item)
            sub = re.search(r":\s*\(\d+\)\s*(\d+)", item)
            if sub:
                g *= int(sub.group(1))
            elif name and name.group(1) in sizes:
                g *= sizes[name.group(1)]
            else:
                raise ValueError(f"cannot read the replica group axis {item!r} in {attrs[:200]!r}")
        return g
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]", attrs)
    if m:  # a mesh with no axis list: every device of the mesh
        return int(np.prod([int(n) for n in re.findall(r"=\s*(\d+)", m.group(1))]))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=\{(\{[^}]*\})", attrs)
    if m:
        return len([x for x in m.group(1).strip("{}").split(",") if x.strip()])
    if re.search(r"replica_groups=\{\}", attrs) or "replica_groups" not in attrs:
        if num_devices is None:
            raise ValueError("replica_groups={} means all devices: pass num_devices")
        return int(num_devices)
    raise ValueError(f"cannot read replica_groups in {attrs[:200]!r}")


def _iota_ids(text: str) -> np.ndarray:
    """``[d0,d1,...]T(p0,p1,...)`` (or without ``T(...)``) -> iota(prod d) reshaped to d,
    transposed by p, flattened; a plain list ``0,4,1,5`` -> those ids."""
    m = re.match(r"\s*\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?", text)
    if m is None:
        return np.array([int(x) for x in re.findall(r"\d+", text)], dtype=np.int64)
    dims = [int(x) for x in m.group(1).split(",") if x.strip()]
    ids = np.arange(int(np.prod(dims)), dtype=np.int64).reshape(dims)
    if m.group(2):
        ids = ids.transpose([int(x) for x in m.group(2).split(",") if x.strip()])
    return ids.reshape(-1)


def replica_groups(attrs: str, num_devices: int | None = None) -> np.ndarray:
    """The replica groups of an instruction as an int array [groups, group size] of device ids
    (every form of the module doc; Shardy's ``mesh[...] device_ids=(...) {axes}`` included, with
    sub-axes ``'a':(pre)size`` = the size-``size`` factor of axis a below the major ``pre`` devices).
    ``replica_groups={}`` (or none) is one group of all ``num_devices``."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?\s*(?:\{([^}]*)\})?", attrs)
    if m:
        names = re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))
        sizes = [int(n) for _, n in names]
        ids = (_iota_ids(m.group(2)) if m.group(2) else np.arange(int(np.prod(sizes)), dtype=np.int64))
        picked = []  # (axis index, pre, size)
        for item in _split_top(m.group(3) or ",".join(f"'{a}'" for a, _ in names)):
            item = item.strip()
            if not item:
                continue
            name = re.match(r"'([^']+)'", item)
            ax = [a for a, _ in names].index(name.group(1)) if name else -1
            if ax < 0:
                raise ValueError(f"cannot read the replica group axis {item!r} in {attrs[:200]!r}")
            sub = re.search(r":\s*\((\d+)\)\s*(\d+)", item)
            picked.append((ax, int(sub.group(1)), int(sub.group(2))) if sub else (ax, 1, sizes[ax]))
        factors, where = [], {}
        for ax, n in enumerate(sizes):  # split each axis at the sub-axis boundaries it is used with
            cuts = sorted({1, n} | {c for a, pre, sz in picked if a == ax for c in (pre, pre * sz)})
            for lo, hi in zip(cuts, cuts[1:]):
                where[(ax, lo)] = len(factors)
                factors.append(hi // lo)
        grid = ids.reshape(factors)
        sel = []
        for ax, pre, sz in picked:
            k, acc = where[(ax, pre)], 1
            while acc < sz:
                sel.append(k)
                acc *= factors[k]
                k += 1
        rest = [k for k in range(len(factors)) if k not in sel]
        return grid.transpose(rest + sel).reshape(-1, int(np.prod([factors[k] for k in sel], dtype=np.int64)))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=(\[[\d,\s]*\](?:T\([\d,\s]*\))?)", attrs)
    if m:
        return _iota_ids(m.group(3)).reshape(int(m.group(1)), int(m.group(2)))
    m = re.search(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)+)\}", attrs)
    if m:
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", m.group(1))]
        return np.array(groups, dtype=np.int64)
    if num_devices is None:
        raise ValueError("replica_groups={} means all devices: pass num_devices")
    return np.arange(int(num_devices), dtype=np.int64).reshape(1, -1)


def permute_pairs(attrs: str) -> list[tuple[int, int]]:
    """The (source, target) pairs of a collective-permute that move data (a pair {i,i} does not)."""
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
    pairs = re.findall(r"\{(\d+),(\d+)\}", m.group(0)) if m else []
    return [(int(a), int(b)) for a, b in pairs if a != b]


def _permute_moving_fraction(attrs: str) -> tuple[float, int]:
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
    if not m:
        return 1.0, 2
    pairs = re.findall(r"\{(\d+),(\d+)\}", m.group(0))
    if not pairs:
        return 1.0, 2
    moving = sum(1 for a, b in pairs if a != b)
    return moving / len(pairs), 2


def _computations(text: str):
    """Yield (computation name, is_entry, [instruction lines])."""
    name, entry, lines = None, False, []
    for line in text.splitlines():
        head = _COMP_HEAD.match(line)
        if head and "=" not in line.split("->")[0].split("(")[0]:
            if name is not None:
                yield name, entry, lines
            name, entry, lines = head.group(2), bool(head.group(1)), []
        elif name is not None and line.strip() == "}":
            yield name, entry, lines
            name, entry, lines = None, False, []
        elif name is not None:
            lines.append(line)
    if name is not None:
        yield name, entry, lines


def parse_collectives(text: str, num_devices: int | None = None) -> list[Collective]:
    """Every collective in the HLO module ``text``, with its execution count (see module doc)."""
    comps = list(_computations(text))
    if not comps:  # a bare list of instructions (e.g. a test snippet): one anonymous entry
        comps = [("entry", True, text.splitlines())]
    shapes: dict[str, str] = {}
    parsed: dict[str, list] = {}
    calls: dict[str, list[tuple[str, int]]] = defaultdict(list)
    entry = None
    for cname, is_entry, lines in comps:
        if is_entry:
            entry = cname
        rows = []
        for line in lines:
            m = _INSTR.match(_COMMENT.sub("", line))
            if not m:
                continue
            iname, shape, opcode, rest = m.groups()
            shapes[iname] = shape
            operands, attrs = _operands_and_attrs(rest)
            rows.append((iname, shape, opcode, operands, attrs))
            trip = _TRIP.search(attrs)
            n = int(trip.group(1)) if (opcode == "while" and trip) else 1
            for callee in _CALLS.findall(attrs):
                calls[cname].append((callee, n if opcode == "while" else 1))
            for b in _BRANCHES.findall(attrs):
                for callee in re.findall(r"%?([\w.\-]+)", b):
                    calls[cname].append((callee, 1))
        parsed[cname] = rows
    if entry is None:
        entry = comps[-1][0]
    # multiplicity of each computation: product of trip counts along the call chain from ENTRY
    mult: dict[str, int] = defaultdict(int)
    stack = [(entry, 1)]
    seen_depth = 0
    while stack:
        c, k = stack.pop()
        mult[c] += k
        seen_depth += 1
        if seen_depth > 100000:
            raise ValueError("HLO call graph too deep or cyclic")
        for callee, n in calls.get(c, ()):
            if callee in parsed:
                stack.append((callee, k * n))

    out: list[Collective] = []
    for cname, rows in parsed.items():
        k = mult.get(cname, 0)
        if k == 0:
            continue
        for iname, shape, opcode, operands, attrs in rows:
            kind = opcode[:-6] if opcode.endswith("-start") else opcode
            if kind not in KINDS:
                continue
            op_bytes = 0.0
            for o in _split_top(operands):
                o = o.strip()
                if not o:
                    continue
                if _ARRAY.search(o.split("%")[0] if "%" in o else o):
                    op_bytes += shape_bytes(o.split("%")[0] if "%" in o else o)
                else:
                    ref = o.lstrip("%").split()[0]
                    if ref not in shapes:
                        raise ValueError(f"collective {iname}: operand {ref!r} not defined in the HLO text")
                    op_bytes += shape_bytes(shapes[ref])
            res_bytes = shape_bytes(shape)
            if opcode.endswith("-start") and kind in ("all-gather", "collective-permute"):
                # async start returns (operands..., results...): the results are the second half
                res_bytes = max(res_bytes - op_bytes, 0.0)
            group, pairs = (), ()
            if kind == "collective-permute":
                frac, n = _permute_moving_fraction(attrs)
                b = op_bytes
                wire = b * frac
                pairs = tuple(permute_pairs(attrs))
            else:
                n = group_size(attrs, num_devices)
                if kind == "all-gather":
                    b = res_bytes
                else:
                    b = op_bytes
                factor = 2.0 * (n - 1) / n if kind == "all-reduce" else (n - 1) / n
                wire = b * factor
                if num_devices is not None or "replica_groups={}" not in attrs:
                    group = tuple(int(d) for d in replica_groups(attrs, num_devices)[0])
            meta = re.search(r'op_name="([^"]*)"', attrs)
            out.append(Collective(kind=kind, name=iname, bytes=b * 1.0, wire_bytes=wire,
                                  group_size=int(n), count=k, computation=cname,
                                  op_name=meta.group(1) if meta else "", shape=shape.strip(),
                                  group=group, pairs=pairs))
    return out


def mesh_axes(c: Collective, mesh_shape) -> tuple[int, ...]:
    """The mesh axes (indices) a collective runs over, for devices numbered row-major on a mesh of
    ``mesh_shape``: the axes along which the members of its (first) replica group differ, or, for
    a collective-permute, the axes along which any moving source and target differ."""
    shape = tuple(int(n) for n in mesh_shape)
    if c.kind == "collective-permute":
        ends = [np.unravel_index(list(p), shape) for p in c.pairs]
        return tuple(a for a in range(len(shape)) if any(e[a][0] != e[a][1] for e in ends))
    if not c.group:
        return tuple(a for a in range(len(shape)) if shape[a] > 1)
    coords = np.array(np.unravel_index(list(c.group), shape))
    return tuple(a for a in range(len(shape)) if len(set(coords[a].tolist())) > 1)


def summarize(collectives: list[Collective]) -> list[dict]:
    """Per kind (in KINDS order, only kinds present): count, bytes and wire_bytes (each summed
    over executions), and the group sizes seen."""
    acc: dict[str, dict] = {}
    for c in collectives:
        d = acc.setdefault(c.kind, {"kind": c.kind, "count": 0, "bytes": 0.0, "wire_bytes": 0.0,
                                    "group_sizes": set()})
        d["count"] += c.count
        d["bytes"] += c.bytes * c.count
        d["wire_bytes"] += c.wire_bytes * c.count
        d["group_sizes"].add(c.group_size)
    rows = []
    for k in KINDS:
        if k in acc:
            d = acc[k]
            d["group_sizes"] = sorted(d["group_sizes"])
            rows.append(d)
    return rows
