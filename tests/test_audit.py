"""torch_replay.audit: every planted hazard is found, and three real architectures (a
hand-written ResNet18 in train mode, a MoCo-style encoder pair with momentum update and a
negative queue, a transformer block with dropout) are reported correctly. Each verdict
"torch.utils.checkpoint is not exact" is cross-checked by running torch's checkpoint on the
segment against eager, so the audit is compared with an independent reference.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tcp

import torch_replay as tr
from benchmarks.lib.models import BasicBlock
from torch_replay.audit import audit, main

from .reference import assert_bitwise

# ----------------------------------------------------------------- planted hazards


class Pure(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class CountsCalls(nn.Module):
    """Mutates a buffer and a parameter-free counter in forward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("ema", torch.zeros(6))

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(0.1 * y.mean(0))
        return y


class ReadsShared(nn.Module):
    """Reads a buffer owned by its parent (not an input)."""

    def __init__(self, shared):
        super().__init__()
        self.shared = [shared]  # not registered here: a captured tensor

    def forward(self, x):
        return torch.sin(x + self.shared[0])  # add saves no operand: eager is fine


class WithGenerators(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x):
        noise = torch.rand(x.shape, generator=self.gen)
        return F.dropout(x * noise, 0.3, training=True)


class TypedAlias(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("stats", torch.zeros(8))

    def forward(self, x):
        self.stats.view(torch.int32)[0] += 1  # counter in the float buffer's bytes
        return x * 2 + self.stats[1]


class ViewAlias(nn.Module):
    def forward(self, x):
        buf = torch.zeros(8)
        buf[1:7] = x[0]
        buf[2:8] = torch.tanh(buf[0:6])  # written through one view, read through another
        return buf.sum() * x


class Overlap(nn.Module):
    def forward(self, x):
        buf = x * 1.0
        buf[0, 1:].copy_(buf[0, :-1])
        return buf


class IntWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("idx", torch.zeros(6, dtype=torch.int32))

    def forward(self, x):
        self.idx.copy_(x[0] * 10)  # a float that requires grad written into ints
        return x * 1.5


class Planted(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("shared", torch.ones(6))
        self.pure = Pure()
        self.counts = CountsCalls()
        self.reads = ReadsShared(self.shared)
        self.gens = WithGenerators()
        self.typed = TypedAlias()
        self.views = ViewAlias()

    def forward(self, x):
        x = self.pure(x)
        x = self.counts(x)
        x = self.reads(x)
        with torch.no_grad():
            self.shared.mul_(1.5)  # written after `reads` read it
        x = self.gens(x)
        x = self.typed(x)
        return self.views(x)


@pytest.fixture(scope="module")
def planted():
    torch.manual_seed(0)
    return audit(Planted(), torch.randn(4, 6, requires_grad=True))


def test_pure_segment_is_exact(planted):
    s = planted["pure"]
    assert s.torch_checkpoint_exact and not s.reasons
    assert s.mutated_in_forward == [] and s.generators == []
    assert s.auto_engine == "guard" and s.retained_bytes == 0
    assert set(s.non_input_reads) == {"pure.lin.weight (parameter)", "pure.lin.bias (parameter)"}


def test_buffers_mutated_in_forward(planted):
    s = planted["counts"]
    assert set(s.mutated_in_forward) == {"counts.calls (buffer)", "counts.ema (buffer)"}
    assert not s.torch_checkpoint_exact
    assert set(s.state) == {"counts.calls (buffer)", "counts.ema (buffer)"}
    # auto journals the old bytes of what the segment writes: both buffers, once.
    assert s.auto_engine == "journal" and s.retained_bytes == 8 + 6 * 4


def test_non_input_read_mutated_later(planted):
    s = planted["reads"]
    assert s.non_input_reads == ["shared (buffer)"]
    assert s.mutated_after_read == ["shared (buffer) (by <outside segments>)"]
    assert s.state == ["shared (buffer)"] and not s.torch_checkpoint_exact


def test_generators(planted):
    s = planted["gens"]
    assert s.generators == ["gens.gen (generator)", "default cpu"]
    assert "gens.gen (generator)" in s.state
    assert not s.torch_checkpoint_exact  # torch does not preserve explicit generators


def test_typed_alias(planted):
    s = planted["typed"]
    assert s.typed_aliases == ["typed.stats (buffer) as float32, int32"]
    assert s.mutated_in_forward == ["typed.stats (buffer)"]


def test_view_alias(planted):
    s = planted["views"]
    assert s.view_aliases == ["float32[8] tensor (made in views)"]
    assert s.torch_checkpoint_exact  # local views: torch is exact


def test_overlapping_write_found_although_eager_raises():
    r = audit(nn.Sequential(Pure(), Overlap()), torch.randn(2, 6, requires_grad=True))
    assert "single memory location" in r.error
    s = r["1"]
    assert s.overlapping_writes == ["aten.copy_.default on float32[2x6] tensor (made in 1)"]
    assert not s.torch_checkpoint_exact and "OverlapError" in s.torch_replay_error
    assert r["0"].torch_checkpoint_exact


def test_integer_write_on_gradient_path():
    m = nn.Sequential(IntWrite(), Pure())
    r = audit(m, torch.randn(3, 6, requires_grad=True))
    s = r["0"]
    assert s.integer_writes_on_grad_path and "0.idx (buffer)" in s.integer_writes_on_grad_path[0]
    assert not s.torch_checkpoint_exact
    assert s.torch_replay_error and "UnsupportedReplayError" in s.torch_replay_error


def test_audit_leaves_the_model_untouched():
    torch.manual_seed(0)
    m = Planted()
    x = torch.randn(4, 6, requires_grad=True)
    m.pure.lin.weight.grad = torch.full_like(m.pure.lin.weight, 0.25)  # a pending .grad
    grad = m.pure.lin.weight.grad
    before = {k: v.clone() for k, v in m.state_dict().items()}
    versions = {k: v._version for k, v in m.state_dict(keep_vars=True).items()}
    rng = torch.get_rng_state()
    gen = m.gens.gen.get_state()
    audit(m, x)
    # Nothing of the observed step or of the probes stays: bytes, .grad, versions, RNG.
    for k, v in m.state_dict(keep_vars=True).items():
        assert torch.equal(v, before[k]) and v._version == versions[k], k
    assert m.pure.lin.weight.grad is grad and torch.equal(grad, torch.full_like(grad, 0.25))
    assert all(p.grad is None for n, p in m.named_parameters() if n != "pure.lin.weight")
    assert x.grad is None
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(m.gens.gen.get_state(), gen)


def test_function_and_json_output():
    w = torch.randn(5, requires_grad=True)
    table = torch.ones(5)

    def fn(x):
        table.add_(1.0)
        return torch.tanh(x * w * table)

    x = torch.randn(5, requires_grad=True)
    r = audit(fn, x)
    s = r["fn"]
    assert "table (captured)" in s.mutated_in_forward  # named by the function's variable
    assert torch.equal(table, torch.ones(5)) and w.grad is None  # left as it was
    # The printed line runs as printed: eager's gradient and one update of the table.
    line = s.code()
    assert line == "tr.checkpoint(fn, x, use_reentrant=False, state=[table])"
    x1 = x.detach().clone().requires_grad_()
    eval(line, {"tr": tr, "fn": fn, "table": table, "x": x1}).sum().backward()
    got = [x1.grad.clone(), w.grad.clone(), table.clone()]
    table.fill_(1.0)
    w.grad = None
    x2 = x.detach().clone().requires_grad_()
    fn(x2).sum().backward()
    assert_bitwise(got, [x2.grad, w.grad, table])
    d = json.loads(r.to_json())
    assert d["segments"][0]["name"] == "fn"
    assert "torch.utils.checkpoint NOT exact" in str(r)


def test_unknown_segment():
    with pytest.raises(ValueError, match="no submodule"):
        audit(Pure(), torch.randn(2, 6), segments=["nope"])


# ------------------------------------------------------------ real architectures


class ResNet18(nn.Module):
    """torchvision's resnet18 layout (torchvision is not installed here), narrow widths."""

    def __init__(self, width=8, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        chans = [width, width * 2, width * 4, width * 8]
        cin = width
        for i, c in enumerate(chans):
            stride = 1 if i == 0 else 2
            setattr(
                self,
                f"layer{i + 1}",
                nn.Sequential(BasicBlock(cin, c, stride), BasicBlock(c, c, 1)),
            )
            cin = c
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def test_resnet18_train_mode_batchnorm():
    torch.manual_seed(0)
    m = ResNet18().train()
    r = audit(m, torch.randn(2, 3, 32, 32))
    print(r)
    s = r["layer1"]
    assert "layer1.0.bn1.running_mean (buffer)" in s.mutated_in_forward
    assert "layer1.0.bn1.num_batches_tracked (buffer)" in s.mutated_in_forward
    assert not s.torch_checkpoint_exact
    assert s.auto_engine == "journal"  # the BN buffers are written: their old bytes
    bn_bytes = sum(b.numel() * b.element_size() for n, b in m.layer1.named_buffers())
    assert s.retained_bytes == bn_bytes
    assert r["fc"].torch_checkpoint_exact and r["fc"].auto_engine == "guard"
    assert r["relu"].torch_checkpoint_exact
    assert r["avgpool"].auto_engine == "none (nothing saved)"
    # Independent check: torch's checkpoint of layer1 updates the running stats twice.
    torch.manual_seed(0)
    a, b = ResNet18().train(), ResNet18().train()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 32, 32)
    h = a.maxpool(a.relu(a.bn1(a.conv1(x))))
    a.layer1(h).sum().backward()
    hb = b.maxpool(b.relu(b.bn1(b.conv1(x))))
    tcp.checkpoint(b.layer1, hb, use_reentrant=False).sum().backward()
    assert not torch.equal(a.layer1[0].bn1.running_mean, b.layer1[0].bn1.running_mean)


class Encoder(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, dim)
        )

    def forward(self, x):
        return F.normalize(self.net(x), dim=1)


class Contrast(nn.Module):
    """InfoNCE logits against a negative queue (a ring buffer)."""

    def __init__(self, dim=16, size=32, t=0.07):
        super().__init__()
        self.t = t
        self.register_buffer("queue", F.normalize(torch.randn(size, dim), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.int64))

    def forward(self, q, k):
        pos = (q * k).sum(1, keepdim=True)
        neg = q @ self.queue.clone().t()  # as MoCo: eager saves the clone, not the queue
        return torch.cat([pos, neg], 1) / self.t

    @torch.no_grad()
    def enqueue(self, k):
        n = k.shape[0]
        p = int(self.ptr)
        self.queue[p : p + n] = k
        self.ptr.fill_((p + n) % self.queue.shape[0])


class MoCo(nn.Module):
    def __init__(self, m=0.99):
        super().__init__()
        self.m = m
        self.encoder_q = Encoder()
        self.encoder_k = Encoder()
        self.encoder_k.load_state_dict(self.encoder_q.state_dict())
        for p in self.encoder_k.parameters():
            p.requires_grad_(False)
        self.contrast = Contrast()

    def forward(self, im_q, im_k):
        q = self.encoder_q(im_q)
        with torch.no_grad():  # momentum update of the key encoder
            for pq, pk in zip(
                self.encoder_q.parameters(), self.encoder_k.parameters(), strict=True
            ):
                pk.mul_(self.m).add_(pq.detach(), alpha=1 - self.m)
            k = self.encoder_k(im_k)
        logits = self.contrast(q, k)
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        loss = F.cross_entropy(logits, labels)
        self.contrast.enqueue(k)
        return loss


def test_moco_momentum_encoder_and_queue():
    torch.manual_seed(0)
    r = audit(MoCo().train(), torch.randn(8, 12), torch.randn(8, 12))
    print(r)
    c = r["contrast"]
    assert c.mutated_after_read == ["contrast.queue (buffer) (by <outside segments>)"]
    assert c.state == ["contrast.queue (buffer)"] and not c.torch_checkpoint_exact
    q = r["encoder_q"]
    assert "encoder_q.net.1.running_mean (buffer)" in q.mutated_in_forward
    # The momentum update reads encoder_q's parameters but writes only encoder_k's.
    assert not any("weight" in n for n in q.mutated_after_read)
    k = r["encoder_k"]
    assert "encoder_k.net.1.running_var (buffer)" in k.mutated_in_forward
    assert not k.needs_grad and "without grad" in k.torch_replay_error  # under no_grad
    assert r.outside and any(n.startswith("encoder_k.net.0.weight") for n in r.outside)
    assert "contrast.queue (buffer)" in r.outside
    # Independent check: torch's checkpoint of contrast is wrong once the queue moves on.
    torch.manual_seed(0)
    m = Contrast()
    q0 = torch.randn(8, 16, requires_grad=True)
    k0 = torch.randn(8, 16)
    eager = torch.autograd.grad(F.cross_entropy(m(q0, k0), torch.zeros(8, dtype=torch.long)), q0)
    y = tcp.checkpoint(m, q0, k0, use_reentrant=False)
    m.enqueue(k0)
    theirs = torch.autograd.grad(F.cross_entropy(y, torch.zeros(8, dtype=torch.long)), q0)
    assert not torch.equal(eager[0], theirs[0])
    m2 = Contrast()
    m2.load_state_dict(m.state_dict())


class Block(nn.Module):
    def __init__(self, d=16, heads=2, p=0.1):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=p, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(p), nn.Linear(4 * d, d), nn.Dropout(p)
        )

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def test_transformer_block_with_dropout():
    torch.manual_seed(0)
    r = audit(Block().train(), torch.randn(2, 5, 16, requires_grad=True))
    print(r)
    for name in ("attn", "mlp"):
        s = r[name]
        assert s.generators == ["default cpu"], name
        assert s.torch_checkpoint_exact, name  # torch preserves the default generator
        assert s.mutated_in_forward == [] and s.auto_engine == "guard"
        assert s.state == ["torch.default_generator (only if preserve_rng_state=False)"]
    assert r["ln1"].generators == [] and r["ln1"].state == []


def test_cli(capsys):
    assert main(["tests.test_audit:_factory", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert {s["name"] for s in out["segments"]} >= {"layer1", "fc"}


def _factory():
    torch.manual_seed(0)
    return ResNet18().train(), (torch.randn(2, 3, 32, 32),)


def test_report_prints_the_verdict():
    torch.manual_seed(0)
    text = str(audit(ResNet18().train(), torch.randn(2, 3, 32, 32)))
    assert "[layer1] Sequential: torch.utils.checkpoint NOT exact" in text
    assert "engine auto -> journal" in text


def test_module_list_children_are_segments():
    class Blocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Linear(6, 6)
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(3))
            self.heads = nn.ModuleDict({"bn": nn.BatchNorm1d(6)})

        def forward(self, x):
            x = self.stem(x)
            for b in self.blocks:
                x = b(x)
            return self.heads["bn"](x)

    torch.manual_seed(0)
    r = audit(Blocks().train(), torch.randn(4, 6, requires_grad=True))
    names = [s.name for s in r.segments]
    assert names == ["stem", "blocks.0", "blocks.1", "blocks.2", "heads.bn"]
    # The batch norm's running statistics are written in its forward: not torch-exact.
    assert not r["heads.bn"].torch_checkpoint_exact
    assert r["blocks.1"].torch_checkpoint_exact
