"""Cost-aware training of the factor-graph network (agent/fgnn.py): antithetic evolution strategies
on the cost of the plan it decodes, relative to Lagrangian BP's.

Why not only imitation (agent/fgnn_train.py): its class-merged cross-entropy on ILP labels is not the
decoded plan's cost. The decode keeps the cheapest of up to 12 decodes that fit, so a logit moving
toward the label can leave every decode's plan as it was, or push one over the cap; the session-10
run (results/eval_fgnn_training_s10.json) took 92 Adam steps in 33 min, its loss 4.15 -> 3.96, and
its validation score moved with which of 20 problems fitted (3 or 4 over the cap, counted 3.0).

What this trains instead is the number that is reported: per problem, f = log(cost(plan_θ) /
cost(plan_0)), plan_0 being the untrained network's (Lagrangian BP's, exactly), a plan that breaks the
cap (or none) counting log(``OVER_CAP_RATIO``). No ILP label is needed. Each iteration draws
``pairs`` directions ε over the chosen leaves (``--leaves``: the price MLP's output layer, the
per-round damping, ...), prices θ ± σε on ``batch`` problems (the same ones for every pair) and steps
Adam on the antithetic estimate Σ (f+ − f−) ε / (2σ·pairs). Problems: the training split
(``fgnn_data.train_split``, never a held-out model or cluster) where the cap binds, at most
``--max-nodes``; about one in ``--val-every`` (by name, ``fgnn_val.is_validation``) is never trained
on. Every ``--val-iters`` iterations the validation problems are planned; the best parameters, the
untrained start included (score 1.0 by definition), go to ``best.msgpack``.

``python -m agent.fgnn_es --minutes 60 --out runs/fgnn-es`` (``--resume RUN_DIR`` continues it
bit-identically: the directions are functions of the seed and the iteration); run folder:
state.json, es.msgpack (params + Adam moments), best.msgpack, card.json.

Session 19's 68-min run (``--leaves price_out,damp --sigma 0.1 --pairs 3 --batch 4``; card
results/s19a_es_card.json) found only 16 binding problems of <= 1,000 nodes. 252 of its 437
iterations had a zero gradient (the decode is piecewise constant in θ). Its best validation point
(0.687, one problem of four) is worse than Lagrangian BP on the held-out binding rows (median 1.179 ->
1.409; experiments/raw_decode_bench.py's docstring): not shipped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from agent.checkpoints import load_checkpoint, save_checkpoint
from agent.cliutil import OneLineParser
from agent.fgnn import FGNN, FGConfig, FGInputs
from agent.fgnn_data import FG_TRAIN_MODELS, train_split
from agent.fgnn_val import OVER_CAP_RATIO, StopFlag, is_validation
from agent.runs import Run, git_rev, resumed_args, run_dir, write_json
from costmodel.problem import evaluate

CKPT, BEST = "es.msgpack", "best.msgpack"
LEAVES = {"price_out": ("price", "Dense_2"), "msg_out": ("msg", "Dense_2"), "read_out": ("read", "Dense_2"),
          "damp": ("damp",), "pgate": ("pgate",), "gate": ("gate",), "soft": ("soft",)}


def build_parser(prog: str = "python -m agent.fgnn_es") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description="Train the factor-graph network on its decoded plans' cost (ES).")
    ap.add_argument("--minutes", type=float, default=60.0, help="total wall-time budget, every phase counted")
    ap.add_argument("--iters", type=int, default=None, help="stop after this many iterations in all")
    ap.add_argument("--leaves", default="price_out,damp", help=f"comma list of {sorted(LEAVES)}")
    ap.add_argument("--sigma", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--problems", type=int, default=40, help="at most this many binding-cap problems")
    ap.add_argument("--random-problems", type=int, default=48)
    ap.add_argument("--max-nodes", type=int, default=1000)
    ap.add_argument("--val-every", type=int, default=5)
    ap.add_argument("--val-iters", type=int, default=5, help="iterations between validations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--resume", default=None, metavar="RUN_DIR")
    return ap


class Subspace:
    """The chosen leaves of a params tree as one flat float64 vector (and back)."""

    def __init__(self, params: dict, names):
        self.paths = [LEAVES[n] for n in names]
        self.size = len(self.flat(params))

    @staticmethod
    def _get(tree, path):
        for k in path:
            tree = tree[k]
        return tree

    def flat(self, params) -> np.ndarray:
        return np.concatenate([np.ravel(np.asarray(jax_leaf, np.float64)) for p in self.paths
                               for jax_leaf in _leaves(self._get(params, p))])

    def put(self, params, vec: np.ndarray) -> dict:
        import jax
        out, j = jax.tree.map(lambda x: x, params), 0      # a fresh tree of the same leaves
        for p in self.paths:
            parent = out
            for k in p[:-1]:
                parent[k] = dict(parent[k])
                parent = parent[k]
            sub = parent[p[-1]]
            if isinstance(sub, dict):
                new = {}
                for name in sorted(sub):
                    n = int(np.size(sub[name]))
                    new[name] = np.asarray(vec[j:j + n], np.float32).reshape(np.shape(sub[name]))
                    j += n
                parent[p[-1]] = {**sub, **new}
            else:
                n = int(np.size(sub))
                parent[p[-1]] = np.asarray(vec[j:j + n], np.float32).reshape(np.shape(sub))
                j += n
        return out


def _leaves(x):
    return [x[k] for k in sorted(x)] if isinstance(x, dict) else [x]


class Scorer:
    """log(cost / untrained cost) of the network's raw plan on fixed problems (inputs built once)."""

    def __init__(self, net: FGNN, items: list):
        self.net, self.items = net, []
        for name, p in items:
            inp = FGInputs.of(p)
            c0 = self._cost(p, inp, FGNN.zero_corrections(net.params))
            if np.isfinite(c0) and c0 > 0:
                self.items.append((name, p, inp, c0))

    def _cost(self, p, inp, params) -> float:
        try:
            c = evaluate(p, self.net.plan(p, params=params, inputs=inp))
        except ValueError:
            return np.inf
        return c.total if c.feasible else np.inf

    def f(self, j: int, params) -> float:
        _, p, inp, c0 = self.items[j]
        c = self._cost(p, inp, params)
        return float(np.log(min(c / c0, OVER_CAP_RATIO)))

    def score(self, params) -> dict:
        r = np.exp([self.f(j, params) for j in range(len(self.items))]) if self.items else np.ones(0)
        return {"score": float(np.exp(np.mean(np.log(r)))) if len(r) else 1.0, "better": int((r < 1 - 1e-9).sum()),
                "worse": int((r > 1 + 1e-9).sum()), "max": float(r.max()) if len(r) else 1.0, "n": int(len(r)),
                "ratios": [round(float(v), 6) for v in r]}


def binding_problems(a, deadline: float, log) -> tuple[list, list]:
    """(train items, validation items): (name, Problem) of the training split whose cap binds."""
    split = train_split(a.seed, random=a.random_problems, models=FG_TRAIN_MODELS)
    split = [split[j] for j in np.random.default_rng(a.seed).permutation(len(split))]
    tr, va = [], []
    for name, build in split:
        if len(tr) + len(va) >= a.problems or time.perf_counter() > deadline:
            break
        try:
            p = build()
        except Exception as exc:   # a model that does not trace on a cluster: skipped
            log(f"skip {name}: {type(exc).__name__}")
            continue
        if p.usage_limit is None or p.num_nodes > a.max_nodes:
            continue
        binds = FGInputs.of(p).raw["tbinds"]
        if not np.any(binds):
            continue
        (va if is_validation(name, a.val_every) else tr).append((name, p))
    return tr, va


def _adam(g, m, v, t, lr, b1=0.9, b2=0.999, eps=1e-8):
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    return lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps), m, v


def main(argv=None, prog: str = "python -m agent.fgnn_es") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser(prog).parse_args(argv)
    if a.resume:
        a, saved, state = resumed_args(a, argv, ("minutes", "iters"))
        run = Run(a.resume, saved, float(saved["minutes"]) * 60, state)
    else:
        out = run_dir(a.out, a.force)
        for f in (CKPT, BEST):
            if os.path.exists(os.path.join(out, f)):
                if not a.force:
                    raise ValueError(f"--out {out} already holds {f}; pass --force, --resume {out} or another --out")
                os.remove(os.path.join(out, f))
        args = {k: v for k, v in vars(a).items() if k not in ("resume", "force")}
        args["out"] = out
        run = Run(out, args, float(a.minutes) * 60, {"args": args, "phase": "problems", "used_s": 0.0, "sessions": 0})
        run.save()
    print(f"run folder {run.out} (resume with `python -m agent.fgnn_es --resume {run.out}`)", flush=True)

    def log(msg):
        print(f"[{run.elapsed():7.0f}s] {msg}", flush=True)
    net = FGNN(FGConfig())
    names = [n.strip() for n in str(a.leaves).split(",") if n.strip()]
    sub = Subspace(net.params, names)
    theta = sub.flat(net.params)
    m, v, it = np.zeros(sub.size), np.zeros(sub.size), 0
    ck = run.path(CKPT)
    if os.path.exists(ck):
        st = load_checkpoint(ck)
        theta, it = np.asarray(st["opt_state"]["theta"], np.float64), int(st["update"])
        m, v = np.asarray(st["opt_state"]["m"], np.float64), np.asarray(st["opt_state"]["v"], np.float64)
    tr_items, va_items = binding_problems(a, run.t0 + 0.25 * run.budget_s, log)
    train, val = Scorer(net, tr_items), Scorer(net, va_items)
    log(f"{len(train.items)} training and {len(val.items)} validation problems with a binding cap; "
        f"{sub.size} parameters ({', '.join(names)})")
    best, hist = run.state.get("best") or {"iter": 0, **val.score(net.params)}, list(run.state.get("history", []))
    if not os.path.exists(run.path(BEST)):
        save_checkpoint(run.path(BEST), net.params, net.config.to_dict(), update=0, extra={"validation": best})
    run.save(best=best, phase="train")
    with StopFlag() as flag:
        while (a.iters is None or it < a.iters) and not flag.stop and (a.iters is not None or run.left() > 0):
            t = time.perf_counter()
            rng = np.random.default_rng([a.seed, it])
            idx = rng.choice(len(train.items), min(a.batch, len(train.items)), replace=False)
            eps = rng.standard_normal((a.pairs, sub.size))
            g, fs = np.zeros(sub.size), []
            for e in eps:
                fp = np.mean([train.f(j, sub.put(net.params, theta + a.sigma * e)) for j in idx])
                fm = np.mean([train.f(j, sub.put(net.params, theta - a.sigma * e)) for j in idx])
                g += (fp - fm) / (2 * a.sigma * a.pairs) * e
                fs += [fp, fm]
            step, m, v = _adam(g, m, v, it + 1, a.lr)
            theta, it = theta - step, it + 1
            rec = {"iter": it, "f_mean": float(np.mean(fs)), "f_min": float(np.min(fs)),
                   "grad_norm": float(np.linalg.norm(g)), "theta_norm": float(np.linalg.norm(theta)),
                   "iter_s": time.perf_counter() - t}
            if it % a.val_iters == 0:
                params = sub.put(net.params, theta)
                sc = val.score(params)
                rec.update(val_score=sc["score"], val_better=sc["better"], val_worse=sc["worse"])
                if sc["score"] < best["score"] - 1e-9:
                    best = {"iter": it, **sc}
                    save_checkpoint(run.path(BEST), params, net.config.to_dict(), update=it, extra={"validation": best})
            hist.append(rec)
            save_checkpoint(ck, sub.put(net.params, theta), net.config.to_dict(), update=it,
                            opt_state={"theta": theta, "m": m, "v": v})
            run.save(history=hist, best=best, iter=it)
            log("es " + json.dumps({k: round(x, 4) if isinstance(x, float) else x for k, x in rec.items()}))
    card = {"command": f"{prog} " + " ".join(argv), "git_rev": git_rev(), "wall_s": run.elapsed(), "args": run.args,
            "config": net.config.to_dict(), "leaves": names, "parameters": sub.size, "iterations": it,
            "objective": "antithetic ES on log(raw plan cost / Lagrangian BP's raw plan cost), over the cap = "
                         f"log({OVER_CAP_RATIO})",
            "train_problems": [n for n, *_ in train.items], "validation_problems": [n for n, *_ in val.items],
            "best": best, "shipped": f"{BEST}: lowest validation score (iter 0 = the untrained network)",
            "history": hist}
    write_json(run.path("card.json"), card)
    run.save(phase="interrupted" if flag.stop else "done", history=hist, best=best, iter=it)
    log(f"done: {it} iterations; best validation {best['score']:.4f} at iteration {best['iter']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
