"""Train the policy from a clone: ``python experiments/pretrain.py ARGS`` = ``shardgym train ARGS``.

The training itself lives in agent/train.py (packaged, so ``shardgym train`` works from any
install). The shipped policy was made with a 32-minute run; to replace it, train into a run folder
and copy its policy.msgpack and card.json into agent/pretrained/ yourself:

    python experiments/pretrain.py --minutes 20 --out runs/pretrain
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")

if __name__ == "__main__":
    from shardgym.cli import main
    sys.exit(main(["train", *sys.argv[1:]]))
