"""A short QuanGrad run on HCCL (one process per NPU; launched by npu_check.sh through torchrun).

Every rank trains the same small MLP for a few steps with QuanGradDDP (8-bit gradients, all-to-all +
all-gather over HCCL, the ascend backend's fused reduce-requantize kernel), then checks that:
  * every rank holds bit-identical parameters after each step (the collective is deterministic);
  * the reduced gradient of step 0 matches an fp32 all-reduce of the same gradients within the format's
    quantization error (relative L2 error below 0.05 for int8/fp8 at block 256);
  * the step reports a finite grad norm.
Writes one JSON line per rank to $AGOQ_NPU_CHECK_OUT (default: stdout). Installs nothing.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    import torch_npu  # noqa: F401  (registers the npu device and hccl)

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.npu.set_device(local)
    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("npu", local)
    from agoq_core.quangrad import QuanGradConfig, QuanGradDDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).to(dev)
    qg = QuanGradDDP(model, lambda ps: torch.optim.SGD(ps, lr=0.05),
                     config=QuanGradConfig(backend="ascend", max_grad_norm=1.0, min_compress_bytes=0))
    out = {"rank": rank, "world": world, "fmt": qg.config.fmt, "steps": [], "ok": True}
    for step in range(3):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(32, 256, generator=g).to(dev)
        y = torch.randn(32, 64, generator=g).to(dev)
        loss = torch.nn.functional.mse_loss(qg(x), y)
        loss.backward()
        if step == 0:
            # the same gradients, reduced exactly (fp32 all-reduce of a plain backward) for comparison
            ref_model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).to(dev)
            ref_model.load_state_dict(qg.module.state_dict())
            torch.nn.functional.mse_loss(ref_model(x), y).backward()
            want = torch.cat([p.grad.reshape(-1) for p in ref_model.parameters()])
            dist.all_reduce(want)
            want /= world
            got = torch.cat([qg.gradient(n).reshape(-1).to(dev) for n in qg.param_names])
            rel = float((got.float() - want).norm() / want.norm())
            out["grad_rel_err_step0"] = rel
            out["ok"] &= rel < 0.05
        rep = qg.step()
        flat = torch.cat([p.detach().reshape(-1) for p in qg.module.parameters()]).float()
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        same = all(torch.equal(gathered[0], t) for t in gathered)
        out["steps"].append({"step": step, "loss": float(loss), "grad_norm": rep.grad_norm, "params_identical": same})
        out["ok"] &= same and rep.grad_norm == rep.grad_norm
    line = json.dumps(out)
    path = os.environ.get("AGOQ_NPU_CHECK_OUT")
    if path:
        with open(f"{path}.rank{rank}", "w") as fh:
            fh.write(line + "\n")
    else:
        print(line)
    dist.destroy_process_group()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
