"""Memory accounting from live tensors, checked on modules whose saved tensors we know by hand."""
from __future__ import annotations

import torch

from agoq_core.laaq import SavedBytesMeter
from agoq_core.train.memory import format_bytes, grad_bytes, optimizer_state_bytes, storage_bytes


def test_meter_sees_what_autograd_saves_without_parameters():
    # agoq train measures every arm's activations with LAAQ's meter; on a plain module it all lands in "other"
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40, bias=False)
    x = torch.randn(3, 7, 24, requires_grad=False)
    with SavedBytesMeter(lin) as meter:
        y = torch.relu(lin(x))       # linear saves x (and its weight, excluded); relu saves its output
    # x: 3*7*24 fp32, relu output: 3*7*40 fp32
    assert meter.result().total == 4 * (3 * 7 * 24 + 3 * 7 * 40)
    y.sum().backward()


def test_meter_counts_a_storage_once_and_only_while_alive():
    a = torch.nn.Linear(16, 16, bias=False)
    b = torch.nn.Linear(16, 16, bias=False)
    model = torch.nn.Sequential(a, b)
    x = torch.randn(5, 16, requires_grad=True)
    with SavedBytesMeter(model) as meter:
        h = a(x)                     # saves x
        y = b(h) + b(h)              # saves h twice (one storage)
        z = torch.sin(a(x))          # saves its input (new) and x (seen); freed below with its graph
    assert meter.result().total == 5 * 16 * 4 * 3
    del z
    assert meter.result().total == 5 * 16 * 4 * 2
    y.sum().backward()


def test_storage_bytes_counts_views_as_their_whole_storage():
    base = torch.zeros(100, dtype=torch.float32)
    assert storage_bytes([base[:10], base[50:], base]) == 400
    assert storage_bytes([base[:10]], exclude=[base]) == 0


def test_grad_and_optimizer_bytes():
    m = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))
    n = sum(p.numel() for p in m.parameters())
    assert grad_bytes(m.parameters()) == 0
    m(torch.randn(4, 10)).sum().backward()
    assert grad_bytes(m.parameters()) == 4 * n
    extra = torch.zeros(7, dtype=torch.uint8)
    assert grad_bytes(m.parameters(), [extra]) == 4 * n + 7
    opt = torch.optim.AdamW(m.parameters())
    assert optimizer_state_bytes(opt) == 0
    opt.step()
    # exp_avg + exp_avg_sq (fp32) per parameter, plus a 0-d fp32 step counter per parameter tensor
    assert optimizer_state_bytes(opt) == 2 * 4 * n + 4 * len(list(m.parameters()))


def test_format_bytes():
    assert format_bytes(None) == "n/a"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_bytes(1.5 * 2**30) == "1.50 GiB"

