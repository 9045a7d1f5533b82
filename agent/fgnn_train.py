"""Train the factor-graph network (agent/fgnn.py): imitation of cached ILP optima, then DAgger.
``shardgym train --model fgnn ARGS`` calls ``main`` (the same run folder, clock, budget alarm and
atomic checkpoints as the GNN policy's trainer in agent/train.py: agent/runs.py).

1. **Labels** (``agent.fgnn_data``): the training split (zoo models x sizes x preset and random
   clusters x cap fractions, plus random graphs) with ILP plans, cached on disk: computed once.
   At most ``--label-fraction`` of the budget; problems still unlabelled then are left out.
2. **Imitation**: per problem, cross-entropy of the network's per-node logits against the ILP
   plan, where every strategy interchangeable with the label (``same_class``) counts as it.
   Problems are pruned first (``solvers.local.prune``), as the planner does.
3. **DAgger** every ``--dagger-every`` epochs: the network's raw plan of each of ``--dagger-problems``
   training problems is cut at ``--dagger-cuts`` fractions of its nodes; the prefix is fixed
   (``fgnn_data.restrict``) and the rest labelled by an ILP completion (``--dagger-ilp-seconds``);
   the conditioned problems join the data.
4. **Validation** (agent/fgnn_val.py): about one in ``--val-every`` labelled problems (a hash of
   the name) is never trained on; after every epoch, and at step 0, the raw plans of those problems
   are priced against their labels (geometric mean ratio) and the best parameters so far are
   written to ``best.msgpack``: what ships. Step 0 is the untrained network, which is exactly
   Lagrangian BP's plan (``--base lagrangian``, the default; plain BP with ``--base plain``, or
   Lagrangian BP's plan through the hint with ``--base plain --warm``), so the shipped checkpoint is
   never worse on validation than that.
Multi-rollout REINFORCE is not implemented (see the card's ``phases``).

Run folder: ``state.json`` (config, epoch, seconds used, the labelled problems' names, the best
validation score), ``fgnn.msgpack`` (training state after every epoch, or at the step where it
was stopped: params, optimizer state, epoch, step, that epoch's losses), ``best.msgpack``,
``card.json``. SIGINT / SIGTERM and the ``--minutes`` budget stop it between two steps with a
clean save (``fgnn_val.StopFlag``; an ILP label or DAgger completion under way finishes first).
Resuming (``--resume``) continues bit-identically, from an epoch boundary or mid-epoch: the
epoch's batches and the DAgger rollouts are functions of the seed, the epoch and the
checkpointed params, and the resumed run rebuilds exactly the problems its first session
labelled (from the label cache).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from agent.checkpoints import load_checkpoint, save_checkpoint
from agent.cliutil import OneLineParser
from agent.fgnn import FGNN, FGConfig, FGInputs
from agent.fgnn_data import FG_TRAIN_MODELS, ilp_label, restrict, same_class, train_split
from agent.fgnn_pack import bucket_sizes, epoch_batches, pack
from agent.fgnn_val import OVER_CAP_RATIO, StopFlag, Validator, is_validation
from agent.runs import Run, git_rev, resumed_args, run_dir, write_json
from costmodel.problem import evaluate
from solvers.local import LocalCosts, Pruning

CKPT = "fgnn.msgpack"      # the training state (resumable)
BEST = "best.msgpack"      # the parameters with the best validation score: what ships


def build_parser(prog: str = "shardgym train --model fgnn") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description="Train the factor-graph network on ILP optima, with DAgger.")
    ap.add_argument("--model", choices=("fgnn",), default="fgnn")
    ap.add_argument("--minutes", type=float, default=60.0, help="total wall-time budget, every phase counted")
    ap.add_argument("--epochs", type=int, default=None, help="stop after this many epochs in all")
    ap.add_argument("--label-fraction", type=float, default=0.4, help="most of the budget for ILP labels")
    ap.add_argument("--ilp-seconds", type=float, default=20.0)
    ap.add_argument("--random-problems", type=int, default=48)
    ap.add_argument("--random-nodes", default="20,300", help="node-count range LO,HI of the random problems")
    ap.add_argument("--workloads", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--max-entries", type=int, default=1 << 20,
                    help="problems whose padded edge-cost entries exceed this are left out (memory: ~1 GB a million)")
    ap.add_argument("--rounds", type=int, default=60, help="message-passing rounds (60: the bp_lagrangian baseline's)")
    ap.add_argument("--base", choices=("lagrangian", "plain"), default="lagrangian",
                    help="what the untrained network is: Lagrangian BP (bounded corrections) or plain BP (agent.fgnn)")
    ap.add_argument("--batch-entries", type=int, default=1 << 19,
                    help="edge-cost entries per packed batch (at least the largest problem's)")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--warm", action=argparse.BooleanOptionalAction, default=False,
                    help="with --base plain: the inputs carry Lagrangian BP's plan as a hint (agent.fgnn.warm_hint)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dagger-every", type=int, default=2, help="epochs between DAgger rounds (0: none)")
    ap.add_argument("--dagger-problems", type=int, default=16)
    ap.add_argument("--dagger-cuts", default="0.25,0.5,0.75")
    ap.add_argument("--dagger-ilp-seconds", type=float, default=5.0)
    ap.add_argument("--val-every", type=int, default=6,
                    help="about one in this many labelled problems is held out for validation (0: none)")
    ap.add_argument("--max-nodes", type=int, default=2000, help="larger problems are left out before labelling")
    ap.add_argument("--out", default=None)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--resume", default=None, metavar="RUN_DIR")
    ap.add_argument("--no-progress", action="store_true")
    return ap


class Sample:
    """One training problem: its network inputs (the pruned problem, not pruned again) and the
    targets (``cls``: 1 on the label's class, ``w``: 1 on nodes with a real choice), unpadded in
    ``raw`` for ``fgnn.pack``."""

    def __init__(self, name, problem, plan, label_cost, warm: bool = False):
        pr = Pruning(LocalCosts(problem))
        x2 = pr.from_orig(plan)
        if x2 is None:
            raise ValueError("label uses a pruned strategy")
        self.name, self.orig, self.label_cost, self.warm = name, problem, float(label_cost), warm
        self.pruned = pr.problem        # what the inputs and targets index
        inputs = FGInputs.of(pr.problem, pruned=False, coarse=True, warm=warm)
        g = inputs.mp.g
        cls = same_class(pr.problem, x2)
        choice = np.bincount(g.node_of, weights=cls, minlength=g.n) < g.k   # some strategy is another class
        self.raw = {**inputs.raw, "cls": cls.astype(np.float64), "w": choice.astype(np.float64)}
        self.bucket = bucket_sizes(inputs.raw["_sizes"], coarse=True)

    def arrays(self):
        return pack([self.raw], self.bucket)


def make_loss(net: FGNN):
    def loss_fn(params, A):
        return imitation_nll(net.logits(params, A), A)
    return loss_fn


def imitation_nll(lg, A):
    """The class-merged cross-entropy of per-strategy logits ``lg`` against ``A``'s targets (``cls``:
    1 on the label's class, ``w``: the nodes counted), averaged over those nodes."""
    npad = A["lo"].shape[0]
    valid = A["smask"] > 0
    neg = jnp.float32(-1e30)
    l_all = jnp.where(valid, lg, neg)
    l_cls = jnp.where(valid & (A["cls"] > 0), lg, neg)
    m = jax.ops.segment_max(l_all, A["node_of"], npad)
    m = jnp.where(m > -1e29, m, 0.0)
    lse = jnp.log(jax.ops.segment_sum(jnp.exp(l_all - m[A["node_of"]]), A["node_of"], npad) + 1e-30) + m
    lsc = jnp.log(jax.ops.segment_sum(jnp.exp(l_cls - m[A["node_of"]]), A["node_of"], npad) + 1e-30) + m
    nll = (lse - lsc) * A["w"]
    return nll.sum() / jnp.maximum(A["w"].sum(), 1.0)


@functools.lru_cache(maxsize=None)
def _jit_step(hidden: int, lr: float, base: str = "lagrangian"):
    """(optimizer, jitted step, jitted loss) for a width, learning rate and base (compiled once a shape)."""
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))
    loss_fn = make_loss(FGNN(FGConfig(rounds=1, hidden=hidden, base=base)))

    def step(params, opt_state, A):
        loss, grads = jax.value_and_grad(loss_fn)(params, A)
        upd, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, loss
    return opt, jax.jit(step), jax.jit(loss_fn)


class Trainer:
    """Adam on the imitation loss, one problem per step (shapes differ: one compile per bucket)."""

    def __init__(self, config: FGConfig, lr: float = 3e-3, params=None):
        self.net = FGNN(config, params)
        self.opt, self._step, self._loss = _jit_step(config.hidden, float(lr), config.base)
        self.opt_state = self.opt.init(self.net.params)

    def step(self, batch) -> float:
        """One Adam step on a Sample or a packed batch (dict of arrays)."""
        A = batch.arrays() if isinstance(batch, Sample) else batch
        self.net.params, self.opt_state, loss = self._step(self.net.params, self.opt_state, A)
        return float(loss)

    def loss(self, batch) -> float:
        A = batch.arrays() if isinstance(batch, Sample) else batch
        return float(self._loss(self.net.params, A))

    def save(self, path, epoch: int, extra: dict) -> None:
        save_checkpoint(path, self.net.params, self.net.config.to_dict(), opt_state=self.opt_state,
                        update=epoch, extra=extra)

    def restore(self, path) -> tuple[int, int, list]:
        """(epoch, next step within it, that epoch's losses so far) of a checkpoint written by ``save``."""
        st = load_checkpoint(path)
        self.net.params = serialization.from_state_dict(self.net.params, st["params"])
        self.opt_state = serialization.from_state_dict(self.opt_state, st["opt_state"])
        ex = st.get("extra") or {}
        return int(st["update"]), int(ex.get("step", 0)), [float(v) for v in ex.get("losses", [])]


def _conditioned(s: Sample, f: float, x: np.ndarray, ilp_time_limit_s: float) -> list:
    """[the Sample of ``s`` with its first ``f`` of nodes fixed to ``x``, the rest ILP-labelled] (or [])."""
    p2, _, _ = restrict(s.orig, np.arange(int(f * s.orig.num_nodes)), x)
    lab = ilp_label(p2, ilp_time_limit_s)
    if lab is None:
        return []
    try:
        return [Sample(f"{s.name}|dagger{f:g}", p2, lab["plan"], lab["cost"], s.warm)]
    except ValueError:
        return []


def dagger(net: FGNN, samples: list, rng, cuts, ilp_time_limit_s: float, count: int, deadline: float):
    """Conditioned problems: the net's plan, cut at each fraction, the rest labelled by the ILP;
    returns (samples, records [name, fraction, plan] that rebuild them)."""
    out, recs = [], []
    idx = rng.permutation(len(samples))[:count]
    for j in idx.tolist():
        s = samples[j]
        if s.name.count("|") >= 1 or time.perf_counter() > deadline:   # never condition a conditioned one
            continue
        x = np.asarray(net.plan(s.orig), np.int64)
        if evaluate(s.orig, x).total <= s.label_cost * 1.0005:
            continue                       # already the label's cost: nothing to correct
        for f in cuts:
            if time.perf_counter() > deadline:
                break
            new = _conditioned(s, f, x, ilp_time_limit_s)
            out.extend(new)
            if new:
                recs.append([s.name, f, x.tolist()])
    return out, recs


def _labelled(a, deadline: float, log, only=None) -> tuple[list, list]:
    """(samples, rows) of the training split, labelled until ``deadline``; ``only``: exactly these
    names (a resumed run rebuilds the problems its first session labelled, from the label cache)."""
    samples, rows = [], []
    lo, hi = (int(v) for v in str(a.random_nodes).split(","))
    split = train_split(a.seed, random=a.random_problems, models=FG_TRAIN_MODELS if a.workloads else (),
                        nodes=(lo, hi))
    split = [split[j] for j in np.random.default_rng(a.seed).permutation(len(split))]   # diverse when cut short
    if only is not None:
        keep = set(only)
        split = [(n, b) for n, b in split if n in keep]
    for name, build in split:
        if only is None and time.perf_counter() > deadline:
            rows.append({"stopped": f"label budget used after {len(rows)} problems"})
            break
        try:
            p = build()
        except Exception as exc:   # a model that does not trace on a cluster: recorded, skipped
            rows.append({"problem": name, "skipped": f"{type(exc).__name__}: {exc}"[:160]})
            continue
        if p.num_nodes > a.max_nodes:
            rows.append({"problem": name, "nodes": p.num_nodes, "skipped": f"over --max-nodes ({a.max_nodes})"})
            continue
        lab = ilp_label(p, a.ilp_seconds)
        if lab is None:
            rows.append({"problem": name, "skipped": "no ILP plan"})
            continue
        try:
            s = Sample(name, p, lab["plan"], lab["cost"], a.warm)
        except ValueError as exc:
            rows.append({"problem": name, "skipped": str(exc)})
            continue
        if s.bucket["N"] > a.max_entries:
            rows.append({"problem": name, "nodes": p.num_nodes, "skipped": f"over --max-entries ({s.bucket['N']})"})
            continue
        samples.append(s)
        rows.append({"problem": name, "nodes": p.num_nodes, "status": lab["status"], "ilp_s": lab["ilp_s"],
                     "capped": p.usage_limit is not None, "validation": is_validation(name, a.val_every)})
        log(f"label {len(samples)}: {name} n={p.num_nodes} {lab['status']}")
    return samples, rows


def main(argv=None, prog: str = "shardgym train --model fgnn") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser(prog).parse_args(argv)
    if a.resume:
        a, saved, state = resumed_args(a, argv, ("minutes", "epochs", "no_progress"))
        run = Run(a.resume, saved, float(saved["minutes"]) * 60, state)
    else:
        if not a.minutes > 0:
            raise ValueError(f"--minutes must be > 0, got {a.minutes}")
        if a.out and os.path.exists(os.path.join(a.out, CKPT)):
            if not a.force:
                raise ValueError(f"--out {a.out} already holds {CKPT}; pass --force to overwrite, "
                                 f"--resume {a.out} to continue it, or another --out")
            os.remove(os.path.join(a.out, CKPT))
        out = run_dir(a.out, a.force)
        args = {k: v for k, v in vars(a).items() if k not in ("resume", "force")}
        args["out"] = out
        run = Run(out, args, float(a.minutes) * 60, {"args": args, "phase": "labels", "used_s": 0.0, "sessions": 0})
        run.save()
    quiet = a.no_progress

    def log(msg):
        if not quiet:
            print(msg, flush=True)
    print(f"run folder {run.out} (resume with `shardgym train --model fgnn --resume {run.out}`)", flush=True)
    wb = None
    if os.environ.get("WANDB_MODE", "offline") != "disabled":
        try:
            import wandb
            wb = wandb.init(project="shardgym", mode=os.environ.get("WANDB_MODE", "offline"),
                            config={**vars(a), "git_rev": git_rev()}, reinit=True)
        except Exception:   # wandb missing or unusable: training goes on without it
            wb = None
    cfg = FGConfig(rounds=a.rounds, hidden=a.hidden, seed=a.seed, warm=bool(getattr(a, "warm", False)),
                   base=getattr(a, "base", "plain"))
    tr = Trainer(cfg, lr=a.lr)
    ck, best_ck = run.path(CKPT), run.path(BEST)
    epoch, step0, part = tr.restore(ck) if os.path.exists(ck) else (0, 0, [])
    t_lab = time.perf_counter()
    samples, rows = _labelled(a, run.t0 + a.label_fraction * run.budget_s, log, only=run.state.get("labelled"))
    label_s = time.perf_counter() - t_lab
    run.save(labelled=[s.name for s in samples])
    vals = [s for s in samples if is_validation(s.name, a.val_every)]
    base = [s for s in samples if not is_validation(s.name, a.val_every)]
    if not base:
        raise ValueError("no labelled training problem: raise --minutes or --label-fraction")
    validator = Validator([(s.name, s.orig, s.label_cost) for s in vals], cfg.warm)
    extra_samples: list = []
    hist = list(run.state.get("history", []))
    cuts = [float(x) for x in str(a.dagger_cuts).split(",") if x.strip()]
    # DAgger problems of earlier sessions: rebuilt from their recorded prefixes (labels are cached)
    done_d = list(run.state.get("dagger", []))
    by_name = {s.name: s for s in base}
    for name, f, x in done_d:
        extra_samples.extend(_conditioned(by_name[name], f, np.asarray(x, np.int64), a.dagger_ilp_seconds))
    best = run.state.get("best")
    if best is None:        # step 0: the untrained network (BP-exact start) is the first candidate
        best = {"epoch": 0, "step": 0, **validator.score(tr.net)}
        save_checkpoint(best_ck, tr.net.params, cfg.to_dict(), update=0, extra={"validation": best})
        run.save(best=best, step0_validation=best)
        log(f"validation at step 0: {json.dumps({k: v for k, v in best.items() if k != 'ratios'})}")
    interrupted = False
    with StopFlag() as flag:
        def stopping():
            return flag.stop or (a.epochs is None and run.left() <= 0)
        while (a.epochs is None or epoch < a.epochs) and not stopping():
            if step0 == 0 and a.dagger_every and epoch > 0 and epoch % a.dagger_every == 0:
                t = time.perf_counter()
                new, recs = dagger(tr.net, base, np.random.default_rng(a.seed * 1000 + epoch), cuts,
                                   a.dagger_ilp_seconds, a.dagger_problems, run.t0 + run.budget_s)
                extra_samples.extend(new)
                done_d.extend(recs)
                run.save(dagger=done_d)
                log(f"dagger at epoch {epoch}: {len(new)} conditioned problems in {time.perf_counter() - t:.0f}s")
            data = base + extra_samples
            t = time.perf_counter()
            batches = epoch_batches(data, a.batch_entries, np.random.default_rng(a.seed * 7919 + epoch))
            losses = list(part)
            for j in range(step0, len(batches)):
                if stopping():
                    break
                losses.append(tr.step(batches[j]))
            if len(losses) < len(batches):      # stopped between steps: resume at the next one
                tr.save(ck, epoch, {"step": len(losses), "losses": losses})
                run.save(history=hist, epoch=epoch, phase="train", dagger=done_d)
                break
            step0, part = 0, []
            epoch += 1
            rec = {"epoch": epoch, "loss": float(np.mean(losses)), "samples": len(data), "batches": len(batches),
                   "dagger_samples": len(extra_samples), "epoch_s": time.perf_counter() - t}
            v = validator.score(tr.net)
            rec.update(val_score=v["score"], val_median=v["median"], val_max=v["max"], val_over_cap=v["over_cap"],
                       elapsed_s=run.elapsed())
            if v["score"] < best["score"] - 1e-9:
                best = {"epoch": epoch, "step": 0, **v}
                save_checkpoint(best_ck, tr.net.params, cfg.to_dict(), update=epoch, extra={"validation": best})
            hist.append(rec)
            tr.save(ck, epoch, {"history": hist[-1]})
            run.save(history=hist, epoch=epoch, phase="train", dagger=done_d, best=best)
            if wb is not None:
                wb.log(rec, step=epoch)
            log("  fgnn " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}))
        interrupted = flag.stop and flag.signum == signal.SIGINT
    if wb is not None:
        wb.finish()
    if not os.path.exists(ck):
        tr.save(ck, epoch, {})
    statuses = [r.get("status") for r in rows if "status" in r]
    card = {"command": f"{prog} " + " ".join(argv), "git_rev": git_rev(), "wall_s": run.elapsed(),
            "label_s": label_s, "config": cfg.to_dict(), "args": run.args, "epochs": epoch,
            "phases": ["ilp labels", "imitation (class-merged CE)", "dagger"],
            "reinforce": "not implemented",
            "shipped": f"{BEST}: the parameters with the best validation score (epoch {best['epoch']}; "
                       "epoch 0 = the untrained, BP-exact start)",
            "validation": {"every": a.val_every, "problems": [s.name for s in vals],
                           "step0": run.state.get("step0_validation"), "best": best,
                           "metric": f"geometric mean of raw-plan cost / ILP label; over the cap = {OVER_CAP_RATIO}"},
            "data": {"problems": len(base), "validation_problems": len(vals), "dagger_problems": len(extra_samples),
                     "capped": sum(1 for r in rows if r.get("capped")),
                     "nodes_total": int(sum(r.get("nodes", 0) for r in rows)), "rows": rows},
            "teacher": {"optimal": statuses.count("optimal"), "time_limit": statuses.count("time_limit"),
                        "bp_seed": statuses.count("bp_seed"),
                        "other": len(statuses) - sum(statuses.count(k) for k in ("optimal", "time_limit", "bp_seed"))},
            "history": hist}
    write_json(run.path("card.json"), card)
    run.save(phase="interrupted" if flag.stop else "done", history=hist, epoch=epoch)
    if flag.stop:
        print(f"shardgym: stopped (signal {flag.signum}) between steps; saved to {run.out}; resume with "
              f"`shardgym train --model fgnn --resume {run.out}`", file=sys.stderr, flush=True)
        return 130 if interrupted else 0
    print(f"wrote {ck} after {run.elapsed() / 60:.1f} min ({epoch} epochs, {len(base)} problems, "
          f"{len(extra_samples)} DAgger problems); best on validation: {best_ck} (epoch {best['epoch']}, "
          f"score {best['score']:.4f}, step 0 {run.state.get('step0_validation', {}).get('score', float('nan')):.4f})",
          flush=True)
    return 0
