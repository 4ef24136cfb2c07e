"""``exit_spawned_rank``: a spawned rank that finished its work exits 0 with its output intact, even after
torch's gloo teardown race (torch._dynamo imported + destroy_process_group), which aborts about one exit in
four without it."""
from __future__ import annotations

import subprocess
import sys
import textwrap

RANKS = textwrap.dedent("""
    import os, sys, logging
    import torch.multiprocessing as mp

    def entry(rank, port):
        import torch, torch.distributed as dist, torch._dynamo  # noqa: F401  (the import that keeps the group alive)
        from agoq_core.testing.dist import exit_spawned_rank
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        t = torch.ones(3)
        dist.all_reduce(t)
        dist.destroy_process_group()
        sys.stdout.write(f"rank {rank} sum {t[0]:.0f}")  # no newline: only a flush writes it
        logging.getLogger("x").info("rank %d logged", rank)
        exit_spawned_rank()

    if __name__ == "__main__":
        from agoq_core.testing.dist import free_port
        for _ in range(int(sys.argv[1])):
            mp.start_processes(entry, args=(free_port(),), nprocs=2, start_method="spawn")
            print()
""")


def test_spawned_ranks_exit_cleanly_and_keep_their_output(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    runs = 6
    proc = subprocess.run([sys.executable, str(script), str(runs)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
    for rank in (0, 1):
        assert proc.stdout.count(f"rank {rank} sum 2") == runs
        assert proc.stderr.count(f"rank {rank} logged") == runs
