"""shardgym's runtime: a Plan run (or compiled only) for real with jax.jit and NamedSharding.

``runtime.core`` builds the constrained program, runs it, checks numerics against the unsharded
step and holds XLA's compiled memory and collectives against the prediction; ``runtime.hlo`` parses
the compiled HLO; ``runtime.dist_fft`` and ``runtime.dist_gather`` are the shard_map
implementations XLA lacks; ``runtime.reshard_probe`` measures resharding by probe compiles;
``runtime.xla_log`` catches XLA's C++ log lines.
"""
