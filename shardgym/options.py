"""The face's fixed vocabulary, importable without jax (the CLI's parser needs it):
the methods ``shardgym.solve`` dispatches, the objectives, and ``shardgym run``'s numerics bound."""

METHODS = ("ilp", "policy", "dp", "megatron", "fsdp", "replicated")
OBJECTIVES = ("time", "memory", "redundancy")
# `shardgym run`'s numerics bound on max_rel_err (per-leaf L2 after one AdamW step, see runtime/numerics.py).
# Correct plans differ from the unsharded step only by the order of sharded sums: up to 2.1e-4
# measured for a plain MLP plan (1e-4 failed it); a plan XLA miscomputes is off by O(1) or inf
# (Megatron on a 3x2 mesh, gpt tiny: inf). 1e-3 sits between, 5x over the worst correct case.
DEFAULT_RTOL = 1e-3
